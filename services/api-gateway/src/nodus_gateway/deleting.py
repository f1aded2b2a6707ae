"""Deletes with Kubernetes' DeleteOptions: preconditions and the propagation policy to owned objects.

An object owns others through their ``metadata.ownerReferences`` (a Sweep owns its cell Jobs; a Pipeline
owns its stages' Jobs and Sweeps, issue #22, and through each Sweep that Sweep's cells). Deleting the owner,
per ``propagationPolicy``:

* Background (the default): the owner goes at once and the owned objects are collected after, by the
  owner's controller (the sweep controller deletes the cells of a Sweep, and the children of a Pipeline,
  that no longer exists), as Kubernetes' garbage collector does;
* Foreground: the owned objects go first, then the owner, all the way down (a Pipeline's Sweep goes after
  its own cells). Kubernetes keeps the owner visible with a deletionTimestamp meanwhile; here the request
  waits instead and returns the deleted owner;
* Orphan: the owned objects stay, without their ownerReference to the owner, so nothing collects them
  (only the owner's own: a Pipeline's orphaned Sweep still owns its cells).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from nodus_gateway.resources import Resource, Stores
from nodus_gateway.responding import ApiError
from nodus_kit import errors as kit
from nodus_schema import CauseType, FieldError, status_for

FOREGROUND: Final = "Foreground"
BACKGROUND: Final = "Background"
ORPHAN: Final = "Orphan"
POLICIES: Final = (FOREGROUND, BACKGROUND, ORPHAN)

DEPENDENTS: Final[dict[str, tuple[str, ...]]] = {"sweeps": ("jobs",), "pipelines": ("jobs", "sweeps")}
"""Which resources may hold objects owned by an object of a resource (by plural). Kubernetes' garbage
collector looks at every resource; a short table keeps a Job's delete from reading other buckets."""
# A delete whose only precondition is a uid retries a lost race this often: the uid still holds.
_UID_TRIES: Final = 3


@dataclass(frozen=True, slots=True)
class DeleteOptions:
    propagation: str = BACKGROUND
    uid: str | None = None
    resource_version: str | None = None


def delete_options(query_policy: str | None, body: Any) -> DeleteOptions:
    """DeleteOptions from the query and the body (kubectl sends a body; curl users send the query)."""
    if body is not None and not isinstance(body, Mapping):
        # A body that is no object is no DeleteOptions: said, not ignored (Kubernetes answers 400 too).
        raise ApiError.of(
            "BadRequest",
            f"a DELETE body must be a DeleteOptions object, not {type(body).__name__}",
            fix='Send {"propagationPolicy": "Background"} (or Foreground, Orphan), or no body at all.',
        )
    opts = body if isinstance(body, Mapping) else {}
    policy = query_policy or opts.get("propagationPolicy")
    if policy is None and opts.get("orphanDependents") is True:
        policy = ORPHAN  # the deprecated form, still sent by old clients
    policy = policy or BACKGROUND
    if policy not in POLICIES:
        supported = ", ".join(f'"{p}"' for p in POLICIES)
        cause = FieldError(
            "propagationPolicy",
            CauseType.NOT_SUPPORTED,
            f'Unsupported value: "{policy}": supported values: {supported}',
        )
        raise ApiError(
            status_for(
                "Invalid",
                f'DeleteOptions.meta.k8s.io "" is invalid: {cause}',
                kind="DeleteOptions",
                group="meta.k8s.io",
                causes=[cause],
                fix="Send propagationPolicy Background (the default), Foreground or Orphan.",
            )
        )
    pre = opts.get("preconditions")
    pre = pre if isinstance(pre, Mapping) else {}
    return DeleteOptions(policy, _str_or_none(pre.get("uid")), _str_or_none(pre.get("resourceVersion")))


async def delete_object(
    res: Resource,
    stores: Stores,
    namespace: str | None,
    name: str,
    options: DeleteOptions,
    *,
    dry_run: bool = False,
) -> Any:
    """Delete one object per ``options``; returns it as last stored. Store errors propagate (the caller
    words them for the resource). A dry run checks the preconditions and deletes nothing."""
    store = stores[res.plural]
    current = await store.get(namespace, name)
    _check_preconditions(res, current, options)
    if dry_run:
        return current
    uid = current.metadata.uid
    if options.propagation == ORPHAN:
        await _orphan(res.plural, stores, namespace, uid)
    elif options.propagation == FOREGROUND:
        await _delete_dependents(res.plural, stores, namespace, uid)
    deleted = await _delete_checked(res, store, current, options)
    if options.propagation == FOREGROUND:
        # Owned objects a controller created while the owner was going: they go too.
        await _delete_dependents(res.plural, stores, namespace, uid)
    return deleted


def _check_preconditions(res: Resource, current: Any, options: DeleteOptions) -> None:
    meta = current.metadata
    if options.uid is not None and options.uid != meta.uid:
        raise _precondition_failed(res, meta.name, "UID", options.uid, meta.uid)
    if options.resource_version is not None and options.resource_version != meta.resource_version:
        raise _precondition_failed(
            res, meta.name, "ResourceVersion", options.resource_version, meta.resource_version
        )


def _precondition_failed(res: Resource, name: str, what: str, wanted: str, actual: str | None) -> ApiError:
    # Kubernetes' wording; the reason is Conflict (409), which clients already retry by re-reading.
    return ApiError.of(
        "Conflict",
        f"Precondition failed: {what} in precondition: {wanted}, {what} in object meta: {actual}",
        name=name,
        kind=res.plural,
        fix="The object changed (or was replaced) since you read it: get it again and decide anew.",
    )


async def _delete_checked(res: Resource, store: Any, current: Any, options: DeleteOptions) -> Any:
    """The delete itself, compare-and-set on what the preconditions were checked against."""
    meta = current.metadata
    if options.uid is None and options.resource_version is None:
        return await store.delete(meta.namespace, meta.name)
    for _ in range(_UID_TRIES):
        try:
            return await store.delete(meta.namespace, meta.name, resource_version=meta.resource_version)
        except kit.Conflict:
            if options.resource_version is not None:
                raise
            current = await store.get(meta.namespace, meta.name)
            _check_preconditions(res, current, options)
            meta = current.metadata
    raise kit.Conflict(f"{res.plural} {meta.namespace}/{meta.name} kept changing; try again")


async def _owned(owner: str, stores: Stores, namespace: str | None, uid: str | None) -> list[tuple[str, Any]]:
    """(plural, object) of every object in ``namespace`` owned by the object ``uid`` (of plural ``owner``)."""
    if not uid:
        return []
    out: list[tuple[str, Any]] = []
    for plural in DEPENDENTS.get(owner, ()):
        page = await stores[plural].list(namespace)
        out += [(plural, o) for o in page.items if any(r.uid == uid for r in o.metadata.owner_references)]
    return out


async def _delete_dependents(owner: str, stores: Stores, namespace: str | None, uid: str | None) -> None:
    """Delete what the object ``uid`` owns, each after what it owns in turn (Foreground all the way down)."""
    for plural, obj in await _owned(owner, stores, namespace, uid):
        await _delete_dependents(plural, stores, namespace, obj.metadata.uid)
        try:
            await stores[plural].delete(namespace, obj.metadata.name)
        except kit.NotFound:
            pass  # gone already: what was wanted


async def _orphan(owner: str, stores: Stores, namespace: str | None, uid: str | None) -> None:
    """Remove the owner's reference from each owned object (their labels stay, as in Kubernetes)."""

    def without_owner(obj: Any) -> Any:
        refs = [r for r in obj.metadata.owner_references if r.uid != uid]
        meta = msgspec.structs.replace(obj.metadata, owner_references=refs)
        return msgspec.structs.replace(obj, metadata=meta)

    for plural, obj in await _owned(owner, stores, namespace, uid):
        try:
            await stores[plural].mutate(namespace, obj.metadata.name, without_owner)
        except kit.NotFound:
            pass


def _str_or_none(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None
