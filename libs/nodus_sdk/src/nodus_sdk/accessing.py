"""What both clients' accessors share: the project an object goes to, and the calls of the project-level
endpoints (account, grants, usage, invoices, a Sweep's results, a Job's log)."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from nodus_schema.billing import Account, CreditGrant, Invoice, UsageList
from nodus_schema.results import SweepResults
from nodus_sdk.requesting import Call, body_of, item_path, project_path, query, text, typed
from nodus_sdk.resources import Calls, Kind, namespace_in

T = TypeVar("T")


class Accessor(Generic[T]):
    """The calls of one kind, with the default project filled in."""

    def __init__(self, kind: Kind[T], project: str) -> None:
        self.kind = kind
        self.calls = Calls(kind)
        self.project = project

    def ns(self, namespace: str | None, obj: Any = None) -> str | None:
        """The project to use: the one given, else the object's own, else the configured project; None
        for cluster-scoped kinds."""
        if not self.kind.namespaced:
            return None
        return namespace or (namespace_in(obj) if obj is not None else None) or self.project


def name_selector(name: str, field_selector: str | None = None) -> str:
    """A field selector for one object by name (and whatever else was asked)."""
    pinned = f"metadata.name={name}"
    return f"{pinned},{field_selector}" if field_selector else pinned


# -- project-level endpoints -------------------------------------------------------------------------------


def account(project: str) -> Call[Account]:
    return Call("GET", project_path(project, "account"), typed(Account))


def grant(
    project: str, amount_usd: str, *, id: str | None = None, revoke: bool = False, note: str = ""
) -> Call[Account]:
    """Grant (or revoke) credits, cluster admin only; the same ``id`` again counts once."""
    body = body_of(CreditGrant(amount_usd=amount_usd, id=id, revoke=revoke, note=note))
    headers = {"Content-Type": "application/json"}
    return Call(
        "POST", project_path(project, "account", "grants"), typed(Account), body=body, headers=headers
    )


def usage(project: str, month: str | None = None) -> Call[UsageList]:
    return Call("GET", project_path(project, "usage"), typed(UsageList), query(month=month))


def usage_csv(project: str, month: str | None = None) -> Call[str]:
    params = query(month=month, format="csv")
    return Call("GET", project_path(project, "usage"), text, params, headers={"Accept": "text/csv"})


def invoice(project: str, month: str) -> Call[Invoice]:
    return Call("GET", project_path(project, "invoices", month), typed(Invoice))


def invoice_csv(project: str, month: str) -> Call[str]:
    path = project_path(project, "invoices", month)
    return Call("GET", path, text, {"format": "csv"}, headers={"Accept": "text/csv"})


def results(project: str, sweep: str) -> Call[SweepResults]:
    return Call("GET", item_path("sweeps", project, sweep, "results"), typed(SweepResults))


def results_csv(project: str, sweep: str) -> Call[str]:
    path = item_path("sweeps", project, sweep, "results")
    return Call("GET", path, text, {"format": "csv"}, headers={"Accept": "text/csv"})


def log(
    project: str,
    job: str,
    *,
    follow: bool,
    index: int | None,
    attempt: int | None,
    tail_lines: int | None,
    since_seconds: int | None,
    timestamps: bool,
) -> Call[str]:
    """A Job's log (``.../jobs/<job>/log``); with ``follow`` the clients stream it as it arrives. The
    clients' ``JobResource.log`` passes every option and holds their defaults."""
    params = query(
        follow=follow or None,
        index=index,
        attempt=attempt,
        tailLines=tail_lines,
        sinceSeconds=since_seconds,
        timestamps=timestamps or None,
    )
    path = item_path("jobs", project, job, "log")
    return Call("GET", path, text, params, headers={"Accept": "text/plain"})
