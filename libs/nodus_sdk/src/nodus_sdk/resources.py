"""The kinds the API serves, and the :class:`~nodus_sdk.requesting.Call` of every verb on them.

Both clients build their calls here, so a verb means the same request whether it is sent sync or async.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Generic, Literal, TypeVar

import httpx
import msgspec

from nodus_schema import Job, ListMeta, ObjectList, Sweep
from nodus_schema.access import Project
from nodus_schema.attempts import Attempt
from nodus_schema.billing import Budget
from nodus_schema.configs import Connection, Secret
from nodus_schema.nodes import Node
from nodus_schema.offerings import Offering
from nodus_schema.pipelines import Pipeline
from nodus_schema.volumes import Volume, Workspace
from nodus_sdk.requesting import Call, body_of, collection_path, decode_body, item_path, query, typed

T = TypeVar("T")

PAGE_SIZE: Final = 500
"""Objects per page of a ``list()`` and of a watch's relist."""
PatchType = Literal["merge", "json", "strategic", "apply"]
PATCH_MEDIA: Final[dict[str, str]] = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    # The gateway serves a strategic merge patch as a merge patch (no patch-merge keys: lists replace).
    "strategic": "application/strategic-merge-patch+json",
    "apply": "application/apply-patch+yaml",
}
PROPAGATION: Final = ("Foreground", "Background", "Orphan")


@dataclass(frozen=True, slots=True)
class Kind(Generic[T]):
    """One resource of the API: its URL name, its kind and its wire type."""

    plural: str
    kind: str
    type: type[T]
    namespaced: bool = True


SWEEPS: Final = Kind("sweeps", "Sweep", Sweep)
JOBS: Final = Kind("jobs", "Job", Job)
ATTEMPTS: Final = Kind("attempts", "Attempt", Attempt)
SECRETS: Final = Kind("secrets", "Secret", Secret)
CONNECTIONS: Final = Kind("connections", "Connection", Connection)
BUDGETS: Final = Kind("budgets", "Budget", Budget)
NODES: Final = Kind("nodes", "Node", Node, namespaced=False)
OFFERINGS: Final = Kind("offerings", "Offering", Offering, namespaced=False)
PROJECTS: Final = Kind("projects", "Project", Project, namespaced=False)
VOLUMES: Final = Kind("volumes", "Volume", Volume)
WORKSPACES: Final = Kind("workspaces", "Workspace", Workspace)
PIPELINES: Final = Kind("pipelines", "Pipeline", Pipeline)
KINDS: Final[tuple[Kind[Any], ...]] = (
    SWEEPS,
    JOBS,
    ATTEMPTS,
    SECRETS,
    CONNECTIONS,
    BUDGETS,
    NODES,
    OFFERINGS,
    PROJECTS,
    VOLUMES,
    WORKSPACES,
    PIPELINES,
)


def kind_of(obj: Any) -> Kind[Any]:
    """The Kind of a typed object (a Sweep, a Job, ...)."""
    for k in KINDS:
        if isinstance(obj, k.type):
            return k
    raise TypeError(f"{type(obj).__name__} is not an object of the Nodus API")


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a list: its objects, the list's resourceVersion (a watch's starting point) and the
    continue token of the next page (None on the last)."""

    items: list[T]
    resource_version: str | None
    continue_: str | None = None
    remaining: int | None = None


@dataclass(frozen=True, slots=True)
class Estimated(Generic[T]):
    """A dry run's answer: the object as it would be stored, with ``status.estimate``, and the ETag that
    binds a later create to this estimate (``create(..., if_match=etag)``)."""

    object: T
    etag: str | None


def _page(kind: type[T]) -> Any:
    def read(resp: httpx.Response) -> Page[T]:
        lst = decode_body(resp.content, ObjectList[kind])  # type: ignore[valid-type]
        meta: ListMeta = lst.metadata
        return Page(list(lst.items), meta.resource_version, meta.continue_ or None, meta.remaining_item_count)

    return read


def _estimated(kind: type[T]) -> Any:
    def read(resp: httpx.Response) -> Estimated[T]:
        return Estimated(decode_body(resp.content, kind), resp.headers.get("etag"))

    return read


def name_of(obj: Any) -> str:
    """``metadata.name`` of a typed object or a plain dict."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else getattr(obj, "metadata", None)
    name = meta.get("name") if isinstance(meta, Mapping) else getattr(meta, "name", None)
    if not name:
        raise ValueError("the object has no metadata.name")
    return str(name)


def namespace_in(obj: Any) -> str | None:
    """``metadata.namespace`` of a typed object or a plain dict, if set."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else getattr(obj, "metadata", None)
    ns = meta.get("namespace") if isinstance(meta, Mapping) else getattr(meta, "namespace", None)
    return str(ns) if ns else None


class Calls(Generic[T]):
    """The calls of one kind: what both clients' resource accessors send."""

    def __init__(self, kind: Kind[T]) -> None:
        self.kind = kind

    def _ns(self, namespace: str | None) -> str | None:
        return namespace if self.kind.namespaced else None

    def get(self, namespace: str | None, name: str) -> Call[T]:
        return Call("GET", item_path(self.kind.plural, self._ns(namespace), name), typed(self.kind.type))

    def get_status(self, namespace: str | None, name: str) -> Call[T]:
        path = item_path(self.kind.plural, self._ns(namespace), name, "status")
        return Call("GET", path, typed(self.kind.type))

    def list_page(
        self,
        namespace: str | None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_: str | None = None,
    ) -> Call[Page[T]]:
        params = query(
            labelSelector=label_selector, fieldSelector=field_selector, limit=limit, **{"continue": continue_}
        )
        path = collection_path(self.kind.plural, self._ns(namespace))
        return Call("GET", path, _page(self.kind.type), params)

    def watch_params(
        self,
        *,
        label_selector: str | None,
        field_selector: str | None,
        resource_version: str | None,
        timeout_seconds: int | None,
    ) -> dict[str, str]:
        return query(
            watch=True,
            allowWatchBookmarks=True,
            labelSelector=label_selector,
            fieldSelector=field_selector,
            resourceVersion=resource_version,
            timeoutSeconds=timeout_seconds,
        )

    def create(
        self,
        namespace: str | None,
        obj: Any,
        *,
        dry_run: bool = False,
        if_match: str | None = None,
        field_validation: str | None = None,
    ) -> Call[T]:
        params = query(dryRun="All" if dry_run else None, fieldValidation=field_validation)
        headers = {"Content-Type": "application/json", **({"If-Match": if_match} if if_match else {})}
        path = collection_path(self.kind.plural, self._ns(namespace))
        return Call("POST", path, typed(self.kind.type), params, body_of(obj), headers)

    def estimate(self, namespace: str | None, obj: Any) -> Call[Estimated[T]]:
        path = collection_path(self.kind.plural, self._ns(namespace))
        headers = {"Content-Type": "application/json"}
        return Call("POST", path, _estimated(self.kind.type), {"dryRun": "All"}, body_of(obj), headers)

    def update(
        self, namespace: str | None, obj: Any, *, dry_run: bool = False, field_validation: str | None = None
    ) -> Call[T]:
        params = query(dryRun="All" if dry_run else None, fieldValidation=field_validation)
        path = item_path(self.kind.plural, self._ns(namespace), name_of(obj))
        headers = {"Content-Type": "application/json"}
        return Call("PUT", path, typed(self.kind.type), params, body_of(obj), headers)

    def patch(
        self,
        namespace: str | None,
        name: str,
        patch: Any,
        *,
        type: PatchType = "merge",
        field_manager: str | None = None,
        force: bool | None = None,
        dry_run: bool = False,
    ) -> Call[T]:
        if type not in PATCH_MEDIA:
            raise ValueError(f"patch type {type!r}: one of {', '.join(PATCH_MEDIA)}")
        if type == "apply" and not field_manager:
            raise ValueError("an apply patch needs field_manager (who applies it)")
        params = query(fieldManager=field_manager, force=force, dryRun="All" if dry_run else None)
        headers = {"Content-Type": PATCH_MEDIA[type]}
        path = item_path(self.kind.plural, self._ns(namespace), name)
        return Call("PATCH", path, typed(self.kind.type), params, body_of(patch), headers)

    def delete(
        self,
        namespace: str | None,
        name: str,
        *,
        propagation_policy: str | None = None,
        dry_run: bool = False,
        resource_version: str | None = None,
    ) -> Call[T]:
        _check_propagation(propagation_policy)
        params = query(propagationPolicy=propagation_policy, dryRun="All" if dry_run else None)
        body = None
        headers: dict[str, str] = {}
        if resource_version is not None:
            # DeleteOptions' precondition: delete only the version read (409 Conflict otherwise).
            opts = {"kind": "DeleteOptions", "preconditions": {"resourceVersion": resource_version}}
            body, headers = msgspec.json.encode(opts), {"Content-Type": "application/json"}
        path = item_path(self.kind.plural, self._ns(namespace), name)
        return Call("DELETE", path, typed(self.kind.type), params, body, headers)

    def delete_collection(
        self,
        namespace: str | None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        propagation_policy: str | None = None,
        dry_run: bool = False,
    ) -> Call[Page[T]]:
        _check_propagation(propagation_policy)
        params = query(
            labelSelector=label_selector,
            fieldSelector=field_selector,
            propagationPolicy=propagation_policy,
            dryRun="All" if dry_run else None,
        )
        path = collection_path(self.kind.plural, self._ns(namespace))
        return Call("DELETE", path, _page(self.kind.type), params)


def _check_propagation(policy: str | None) -> None:
    if policy is not None and policy not in PROPAGATION:
        raise ValueError(f"propagation_policy {policy!r}: one of {', '.join(PROPAGATION)}")
