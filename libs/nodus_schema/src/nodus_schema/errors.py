"""The error body of every API response, and the registry of reason codes (ADR-028).

An error is a Kubernetes metav1.Status (so kubectl and client-go understand it) whose ``reason`` is a
registered Nodus code, plus three top-level extensions those clients ignore: ``docs`` (the code's page),
``fix`` (what to do next) and ``requestId``. For the standard codes the Nodus code *is* the metav1 reason
(NotFound, Conflict, Invalid, ...), so client-go's ``errors.IsNotFound`` and friends keep working; for the
Nodus codes (InsufficientCredits, ...) clients classify by the HTTP code, and :attr:`Reason.k8s_reason`
names the metav1 reason that code implies.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

import msgspec

from nodus_schema.fielding import CauseType, FieldError
from nodus_schema.meta import ListMeta
from nodus_schema.wire import API_GROUP, DOCS_BASE, Wire

__all__ = [
    "REASONS",
    "REASON_BY_HTTP_CODE",
    "Reason",
    "Status",
    "StatusCause",
    "StatusDetails",
    "docs_url",
    "field_errors_of",
    "get_reason",
    "reason_for_code",
    "status_for",
    "status_success",
]


REASON_BY_HTTP_CODE: Final = MappingProxyType(
    {
        400: "BadRequest",
        401: "Unauthorized",
        403: "Forbidden",
        404: "NotFound",
        405: "MethodNotAllowed",
        406: "NotAcceptable",
        409: "Conflict",
        410: "Gone",
        412: "PreconditionFailed",
        413: "RequestEntityTooLarge",
        415: "UnsupportedMediaType",
        422: "Invalid",
        429: "TooManyRequests",
        500: "InternalError",
        502: "ServiceUnavailable",
        503: "ServiceUnavailable",
        504: "Timeout",
    }
)
"""The reason a bare HTTP code stands for, when something answered without a Status: a framework's 404
or 405 in the gateway, a proxy's error page in a client."""


def reason_for_code(code: int) -> str:
    return REASON_BY_HTTP_CODE.get(code, "InternalError" if code >= 500 else "BadRequest")


class StatusCause(Wire):
    """One cause of an error: for Invalid, one field error with its path (``spec.template.spec.image``)."""

    field: str | None = None
    message: str | None = None
    reason: str | None = None
    """A CauseType value such as FieldValueInvalid."""


class StatusDetails(Wire):
    """Details of an error: the object it is about, its causes, and when to retry."""

    causes: list[StatusCause] = msgspec.field(default_factory=list)
    group: str | None = None
    kind: str | None = None
    name: str | None = None
    retry_after_seconds: int | None = None
    uid: str | None = None


class Status(Wire):
    """Status is the error body of every API response: metav1.Status plus docs, fix, requestId (ADR-028)."""

    # default_factory (not default) keeps apiVersion and kind on the wire despite omit_defaults.
    api_version: str = msgspec.field(default_factory=lambda: "v1")
    kind: str = msgspec.field(default_factory=lambda: "Status")
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    code: int | None = None
    """The HTTP status code."""
    details: StatusDetails | None = None
    docs: str | None = None
    """The URL of the code's docs page."""
    fix: str | None = None
    """What to do next, for example a CLI command or the field to change."""
    message: str | None = None
    reason: str | None = None
    """A registered code (REASONS)."""
    request_id: str | None = None
    """Identifies the request in logs and support tickets."""
    status: str | None = None
    """Failure or Success."""


@dataclass(frozen=True, slots=True)
class Reason:
    """A registered reason code: HTTP status, the metav1 reason that status implies, a fix, a summary."""

    code: str
    http_status: int
    k8s_reason: str
    fix: str
    summary: str


def _r(code: str, http_status: int, k8s_reason: str, fix: str, summary: str) -> Reason:
    return Reason(code, http_status, k8s_reason, fix, summary)


_ALL: tuple[Reason, ...] = (
    # Standard Kubernetes reasons: the code is the metav1 reason.
    _r(
        "BadRequest", 400, "BadRequest", "Check the request body and parameters.", "The request is malformed."
    ),
    _r(
        "Unauthorized",
        401,
        "Unauthorized",
        "Log in again with `nodus login`, or check the token you send.",
        "No valid credentials were sent.",
    ),
    _r(
        "Forbidden",
        403,
        "Forbidden",
        "Ask a project admin for access, or use a project you belong to.",
        "The caller may not do this.",
    ),
    _r(
        "NotFound",
        404,
        "NotFound",
        "Check the name and the project (`nodus get <kind>`).",
        "The object or path does not exist.",
    ),
    _r(
        "MethodNotAllowed",
        405,
        "MethodNotAllowed",
        "Use a verb this resource supports (see API discovery).",
        "The verb is not supported on this path.",
    ),
    _r(
        "NotAcceptable",
        406,
        "NotAcceptable",
        "Ask for application/json (or the Table format).",
        "No representation matches the Accept header.",
    ),
    _r(
        "AlreadyExists",
        409,
        "AlreadyExists",
        "Pick another name, or use metadata.generateName.",
        "An object with this name already exists.",
    ),
    _r(
        "Conflict",
        409,
        "Conflict",
        "Get the object again and retry your change on the latest resourceVersion.",
        "The object changed since it was read.",
    ),
    _r(
        "Gone",
        410,
        "Gone",
        "The object or version no longer exists; list again.",
        "The resource is gone.",
    ),
    _r(
        "Expired",
        410,
        "Expired",
        "Restart the watch from a fresh list (its resourceVersion).",
        "The resourceVersion is older than the history kept.",
    ),
    _r(
        "PreconditionFailed",
        412,
        "Conflict",
        "Run the dry-run again and create with its new ETag.",
        "An If-Match precondition (for example a dry-run ETag) no longer holds.",
    ),
    _r(
        "RequestEntityTooLarge",
        413,
        "RequestEntityTooLarge",
        "Send a smaller body: move data into inputs instead of the spec.",
        "The request body is too large.",
    ),
    _r(
        "UnsupportedMediaType",
        415,
        "UnsupportedMediaType",
        "Send Content-Type: application/json (or a supported patch type).",
        "The body's content type is not supported.",
    ),
    _r(
        "Invalid",
        422,
        "Invalid",
        "Fix the fields listed in details.causes and send the object again.",
        "The object failed validation.",
    ),
    _r(
        "TooManyRequests",
        429,
        "TooManyRequests",
        "Wait details.retryAfterSeconds, then retry.",
        "Too many requests; the caller is rate limited.",
    ),
    _r(
        "InternalError",
        500,
        "InternalError",
        "Retry; if it persists, report the requestId.",
        "The server failed unexpectedly.",
    ),
    _r(
        "ServiceUnavailable",
        503,
        "ServiceUnavailable",
        "Retry after details.retryAfterSeconds.",
        "A service Nodus needs is unavailable.",
    ),
    _r(
        "Timeout",
        504,
        "Timeout",
        "Retry; the request may still have taken effect, so get the object first.",
        "The request did not finish in time.",
    ),
    # Nodus reasons: status.reason of Jobs and Sweeps, and errors of creates that cannot proceed.
    _r(
        "CapacityUnavailable",
        503,
        "ServiceUnavailable",
        "Widen placement (more regions, offerings or GPU types), allow interruptible capacity, "
        "or raise placement.queueTimeout.",
        "No capacity matched the request within placement.queueTimeout.",
    ),
    _r(
        "DeadlineExceeded",
        504,
        "Timeout",
        "Raise spec.timeout, or checkpoint so that a resumed run needs less time.",
        "The Job ran past spec.timeout.",
    ),
    _r(
        "BackoffLimitExceeded",
        409,
        "Conflict",
        "Read the failed attempt's logs (`nodus logs <job>`), fix the program, and run it again.",
        "Customer failures (non-zero exits, OOM) exceeded spec.backoffLimit.",
    ),
    _r(
        "MaxCostReached",
        403,
        "Forbidden",
        "Raise spec.maxCostUSD to resume, or let the object stay suspended.",
        "The object's spend reached its maxCostUSD cap; it was suspended.",
    ),
    _r(
        "InsufficientCredits",
        403,
        "Forbidden",
        "Ask an administrator to grant credits (`nodus credits grant AMOUNT -n PROJECT`); suspended work "
        "resumes by itself once the hold fits.",
        "The project's credits not held cannot cover the hold.",
    ),
    _r(
        "BudgetExceeded",
        403,
        "Forbidden",
        "Raise the Budget's spec.monthlyUSD (`kubectl get budgets`) or wait for next month; suspended work "
        "resumes by itself once the hold fits.",
        "A Budget of the project cannot cover the hold this month.",
    ),
    _r(
        "StoppedEarly",
        409,
        "Conflict",
        "Raise spec.maxCostUSD to what the projection says finishing needs, or remove the "
        "nodus.dev/stop-early annotation to spend up to the cap.",
        "The Sweep's stop-early policy started no more cells: finishing would cost more than is left.",
    ),
    _r(
        "CellsFailed",
        409,
        "Conflict",
        "Inspect the failed cells in status.cells and their Jobs' conditions.",
        "One or more cells of the Sweep failed.",
    ),
    _r(
        "CellNameTaken",
        409,
        "Conflict",
        "Delete or rename the Job named in the message (<sweep>-<index>), or rename the Sweep; the cell is "
        "created once its name is free.",
        "A Job the Sweep does not own holds a cell's name, so that cell was not created (never adopted).",
    ),
    # Status reasons that are not errors of a request: they explain a phase (the HTTP mapping is what a
    # request would get if one ever carried them).
    _r(
        "Completed",
        200,
        "",
        "Nothing to do: read the results in status (completedIndexes, wallSeconds, unitsPerSecond, cost).",
        "Every index of the Job succeeded.",
    ),
    _r(
        "CellsSucceeded",
        200,
        "",
        "Nothing to do: compare the cells in status.cells and the best cells in status.best.",
        "Every cell of the Sweep succeeded.",
    ),
    _r(
        "Unschedulable",
        503,
        "ServiceUnavailable",
        'Read status.message ("0/N nodes: ..."): widen placement.regions or the GPU types, '
        "or wait for capacity.",
        "No node can take the Job now; it waits in the queue.",
    ),
    _r(
        "CapacityLost",
        503,
        "ServiceUnavailable",
        "Raise recovery.maxAttempts, or run where capacity is steadier; the lost runs were not charged "
        "to backoffLimit.",
        "An index lost its node more often than recovery.maxAttempts allows.",
    ),
    _r(
        "AssemblyTimeout",
        504,
        "Timeout",
        "Raise spec.distributed.startupTimeout (up to 60m) or maxAssemblyRetries, widen "
        "spec.distributed.network, and read the members' logs for what kept them from starting.",
        "A gang's members did not all start within spec.distributed.startupTimeout, "
        "1 + maxAssemblyRetries times in a row.",
    ),
    _r(
        "NodeLost",
        503,
        "ServiceUnavailable",
        "Nothing: the scheduler starts a new Attempt elsewhere (recovery.maxAttempts bounds how often).",
        "The Attempt's node stopped heartbeating; the run is lost, not failed.",
    ),
    _r(
        "OOMKilled",
        422,
        "Invalid",
        "Raise spec.resources.memory (the container's limit), or make the program use less: smaller "
        "batches, fewer data loader workers; the last lines of its log are in the Attempt's message.",
        "The program was killed at its memory limit; a customer failure, counted against backoffLimit.",
    ),
    _r(
        "Cancelled",
        200,
        "",
        "Nothing: a cancelled object stays cancelled; create a new one to run again.",
        "spec.state is Cancelled and everything that ran has stopped.",
    ),
    _r(
        "Cancelling",
        200,
        "",
        "Wait: running cells are being stopped.",
        "spec.state is Cancelled and running work is being stopped.",
    ),
    _r(
        "Suspended",
        200,
        "",
        "Set spec.state back to Running to resume.",
        "spec.state is Suspended: nothing runs, the place in line is kept.",
    ),
)

REASONS: Final[MappingProxyType[str, Reason]] = MappingProxyType({r.code: r for r in _ALL})
"""Every registered reason code, by code."""


def get_reason(code: str) -> Reason:
    """The registered Reason for ``code``; raises ValueError for an unregistered code."""
    try:
        return REASONS[code]
    except KeyError:
        raise ValueError(f"unregistered reason code {code!r}; register it in nodus_schema.errors") from None


def docs_url(code: str) -> str:
    """The docs page of a reason code: ``{DOCS_BASE}/errors/{code}``."""
    return f"{DOCS_BASE}/errors/{code}"


def status_for(
    reason_code: str,
    message: str,
    *,
    name: str | None = None,
    kind: str | None = None,
    group: str | None = None,
    causes: Iterable[FieldError] = (),
    request_id: str | None = None,
    fix: str | None = None,
    retry_after: int | None = None,
) -> Status:
    """Build the failure Status for a registered reason code.

    ``group`` defaults to ``nodus.dev`` when ``kind`` is given. ``fix`` defaults to the code's registered fix.
    """
    reason = get_reason(reason_code)
    cause_list = [StatusCause(field=c.field, message=c.message, reason=str(c.reason)) for c in causes]
    details: StatusDetails | None = None
    if name is not None or kind is not None or cause_list or retry_after is not None:
        details = StatusDetails(
            causes=cause_list,
            group=group if group is not None else (API_GROUP if kind is not None else None),
            kind=kind,
            name=name,
            retry_after_seconds=retry_after,
        )
    return Status(
        status="Failure",
        message=message,
        reason=reason.code,
        code=reason.http_status,
        details=details,
        docs=docs_url(reason.code),
        fix=fix if fix is not None else reason.fix,
        request_id=request_id,
    )


def status_success(*, name: str | None = None, kind: str | None = None, uid: str | None = None) -> Status:
    """The Success Status a delete returns, as Kubernetes does."""
    details = None
    if name is not None or kind is not None or uid is not None:
        details = StatusDetails(name=name, kind=kind, uid=uid, group=API_GROUP if kind is not None else None)
    return Status(status="Success", code=200, details=details)


def field_errors_of(status: Status) -> list[FieldError]:
    """The field errors a Status carries in details.causes (the inverse of ``status_for(causes=...)``)."""
    if status.details is None:
        return []
    out: list[FieldError] = []
    for c in status.details.causes:
        try:
            cause = CauseType(c.reason) if c.reason is not None else CauseType.INVALID
        except ValueError:
            cause = CauseType.INVALID
        out.append(FieldError(c.field or "", cause, c.message or ""))
    return out
