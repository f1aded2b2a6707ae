"""The query parameters of the API's routes, under Kubernetes' (camelCase) names, and what a list or a
write takes from them (FastAPI dependencies: ``ListQ``, ``PageQ``, ``WriteQ``). ``dryRun`` and
``fieldValidation`` are read here for every route that writes, the admin kinds' too.

Each alias is read twice over: by FastAPI (the OpenAPI documents, and the requests it handles) and by the
gateway's direct lane (dispatching.py), which reads only the aliases and dependencies listed in
``QUERIES`` and ``DEPENDENCIES``. A route with a parameter not listed there is still served, by FastAPI's
slower path (tests/gateway/test_dispatching.py says which routes that is: none).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Final

from fastapi import Depends, Query

from nodus_gateway.admitting import FieldValidation, field_validation
from nodus_gateway.responding import ApiError

# Query parameters under Kubernetes' (camelCase) names.
FieldValidationQ = Annotated[str | None, Query(alias="fieldValidation")]
LabelSelectorQ = Annotated[str | None, Query(alias="labelSelector")]
FieldSelectorQ = Annotated[str | None, Query(alias="fieldSelector")]
LimitQ = Annotated[int | None, Query(ge=0)]
ContinueQ = Annotated[str | None, Query(alias="continue")]
WatchQ = Annotated[str | None, Query()]
ResourceVersionQ = Annotated[str | None, Query(alias="resourceVersion")]
TimeoutSecondsQ = Annotated[int | None, Query(alias="timeoutSeconds", ge=0)]
BookmarksQ = Annotated[str | None, Query(alias="allowWatchBookmarks")]
FieldManagerQ = Annotated[str | None, Query(alias="fieldManager")]
ForceQ = Annotated[str | None, Query()]
PropagationQ = Annotated[str | None, Query(alias="propagationPolicy")]
DryRunQ = Annotated[str | None, Query(alias="dryRun")]


@dataclass(frozen=True, slots=True)
class ListQuery:
    """The query of a list or watch, under Kubernetes' parameter names (resourceVersion is a watch's
    starting point; a list always reads the latest state, which every resourceVersion allows)."""

    label_selector: str | None
    field_selector: str | None
    limit: int | None
    continue_: str | None
    watch: str | None
    resource_version: str | None
    timeout_seconds: int | None
    allow_watch_bookmarks: str | None


# async: FastAPI runs a plain-def dependency in its thread pool, a hand-off on every request.
async def _list_query(
    label_selector: LabelSelectorQ = None,
    field_selector: FieldSelectorQ = None,
    limit: LimitQ = None,
    continue_: ContinueQ = None,
    watch: WatchQ = None,
    resource_version: ResourceVersionQ = None,
    timeout_seconds: TimeoutSecondsQ = None,
    allow_watch_bookmarks: BookmarksQ = None,
) -> ListQuery:
    return ListQuery(
        label_selector,
        field_selector,
        limit,
        continue_,
        watch,
        resource_version,
        timeout_seconds,
        allow_watch_bookmarks,
    )


ListQ = Annotated[ListQuery, Depends(_list_query)]


@dataclass(frozen=True, slots=True)
class PageQuery:
    """The query of a list that only pages and selects by labels (the rows clusterrouting.py serves, and
    secrets); ``watch`` is read to be refused."""

    label_selector: str | None
    limit: int | None
    continue_: str | None
    watch: str | None


async def _page_query(
    label_selector: LabelSelectorQ = None,
    limit: LimitQ = None,
    continue_: ContinueQ = None,
    watch: WatchQ = None,
) -> PageQuery:
    return PageQuery(label_selector, limit, continue_, watch)


PageQ = Annotated[PageQuery, Depends(_page_query)]


@dataclass(frozen=True, slots=True)
class WriteOptions:
    """What every write takes from its query: how to treat unknown fields, and whether to store."""

    validation: FieldValidation
    dry_run: bool


def dry_run_of(value: str | None) -> bool:
    """``dryRun=All``: admit (and answer) as for a real write, store nothing. Refused rather than
    ignored when unknown: a client asking for a dry run must never get a real write by mistake."""
    if value is None or value == "":
        return False
    if value == "All":
        return True
    raise ApiError.of(
        "BadRequest",
        f'dryRun "{value}" is not supported: the only value is "All"',
        fix="Send dryRun=All (kubectl --dry-run=server sends it), or leave it out to write.",
    )


async def _write_options(field_validation_: FieldValidationQ = None, dry_run: DryRunQ = None) -> WriteOptions:
    return WriteOptions(field_validation(field_validation_), dry_run_of(dry_run))


WriteQ = Annotated[WriteOptions, Depends(_write_options)]


# The direct lane's parameters (dispatching.Parameters): the aliases above, and each dependency's function.
QUERIES: Final[tuple[Any, ...]] = (
    FieldValidationQ,
    LabelSelectorQ,
    FieldSelectorQ,
    LimitQ,
    ContinueQ,
    WatchQ,
    ResourceVersionQ,
    TimeoutSecondsQ,
    BookmarksQ,
    FieldManagerQ,
    ForceQ,
    PropagationQ,
    DryRunQ,
)
DEPENDENCIES: Final[tuple[tuple[Any, Any], ...]] = (
    (ListQ, _list_query),
    (PageQ, _page_query),
    (WriteQ, _write_options),
)
