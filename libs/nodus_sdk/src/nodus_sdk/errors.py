"""Errors as exceptions, each carrying the server's Status (ADR-028): reason, message, causes, fix, docs,
requestId and the HTTP code.

The class follows ``Status.reason``: ``except NotFound`` reads as the API does, and a reason this SDK
does not know yet still lands on a class by its HTTP code (a 409 is a :class:`Conflict`, a 5xx a
:class:`ServerError`). A body that is not a Status (a proxy's HTML page, an empty 502) still gets one,
made up from the HTTP code, so every error has the same shape. Not reaching the server at all is
:class:`Unreachable`, a NodusError too, whose Status says why.
"""

from __future__ import annotations

from typing import Final

import msgspec

from nodus_schema import REASON_BY_HTTP_CODE, Status, StatusCause, get_reason, reason_for_code, status_for

# The reason a bare HTTP code stands for, when something other than the gateway answered (a proxy).
HTTP_REASONS: Final = REASON_BY_HTTP_CODE


class NodusError(Exception):
    """An error of the Nodus API; ``status`` is its metav1.Status (with Nodus' docs, fix and requestId)."""

    def __init__(self, status: Status) -> None:
        super().__init__(status.message or status.reason or "the request failed")
        self.status = status

    @property
    def reason(self) -> str | None:
        return self.status.reason

    @property
    def message(self) -> str:
        return self.status.message or ""

    @property
    def code(self) -> int | None:
        """The HTTP status code."""
        return self.status.code

    @property
    def causes(self) -> list[StatusCause]:
        """For Invalid: one cause per field error, with its path (``spec.maxParallel``)."""
        return self.status.details.causes if self.status.details else []

    @property
    def fix(self) -> str | None:
        return self.status.fix

    @property
    def docs(self) -> str | None:
        return self.status.docs

    @property
    def request_id(self) -> str | None:
        return self.status.request_id

    @property
    def retry_after(self) -> int | None:
        return self.status.details.retry_after_seconds if self.status.details else None

    def __str__(self) -> str:
        text = f"{self.reason}: {self.message}" if self.reason else self.message
        return f"{text} (fix: {self.fix})" if self.fix else text


class BadRequest(NodusError):
    pass


class Unauthorized(NodusError):
    pass


class Forbidden(NodusError):
    pass


class NotFound(NodusError):
    pass


class MethodNotAllowed(NodusError):
    pass


class Conflict(NodusError):
    """The object changed since it was read (also a failed If-Match: PreconditionFailed)."""


class AlreadyExists(Conflict):
    pass


class Gone(NodusError):
    """A resourceVersion or object that is no longer kept (Expired, Gone): list again."""


class Invalid(NodusError):
    pass


class TooManyRequests(NodusError):
    pass


class FundingError(Forbidden):
    """Money stopped it: the project's credits, a Budget, or the object's own cap."""


class InsufficientCredits(FundingError):
    pass


class BudgetExceeded(FundingError):
    pass


class MaxCostReached(FundingError):
    pass


class ServerError(NodusError):
    """The server or a service behind it failed or did not answer (5xx)."""


class Unreachable(ServerError):
    """No answer at all: nothing listens there, the TLS handshake failed, or it timed out."""

    def __init__(self, server: str, detail: str, *, refused: bool, tls: bool = False) -> None:
        super().__init__(
            status_for(
                "ServiceUnavailable",
                f"the Nodus gateway at {server} did not answer: {detail}",
                fix=_unreachable_fix(server, refused=refused, tls=tls),
            )
        )
        self.server, self.detail, self.refused, self.tls = server, detail, refused, tls


class BadCA(NodusError):
    """The CA file to trust cannot be read as PEM certificates."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(
            status_for(
                "BadRequest",
                f"cannot use the CA file {path!r}: {detail}",
                fix="Point ca (NODUS_CA, or the context's ca) at a readable PEM file of CA certificates.",
            )
        )
        self.path, self.detail = path, detail


def _unreachable_fix(server: str, *, refused: bool, tls: bool) -> str:
    if tls:
        return "Trust the CA that signed the gateway's certificate: NODUS_CA, or ca in the config's context."
    if refused:
        return (
            f"Start the gateway at {server} (`make up` starts a local stack), or point NODUS_URL elsewhere."
        )
    return "Check that the gateway is running and reachable, then retry."


_BY_REASON: Final[dict[str, type[NodusError]]] = {
    "BadRequest": BadRequest,
    "Unauthorized": Unauthorized,
    "Forbidden": Forbidden,
    "NotFound": NotFound,
    "MethodNotAllowed": MethodNotAllowed,
    "AlreadyExists": AlreadyExists,
    "Conflict": Conflict,
    "PreconditionFailed": Conflict,
    "Gone": Gone,
    "Expired": Gone,
    "Invalid": Invalid,
    "TooManyRequests": TooManyRequests,
    "InsufficientCredits": InsufficientCredits,
    "BudgetExceeded": BudgetExceeded,
    "MaxCostReached": MaxCostReached,
    "InternalError": ServerError,
    "ServiceUnavailable": ServerError,
    "Timeout": ServerError,
}
_BY_CODE: Final[dict[int, type[NodusError]]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    410: Gone,
    412: Conflict,
    422: Invalid,
    429: TooManyRequests,
}


def error_for(status: Status) -> NodusError:
    """The exception for a Status: by its reason, else by its HTTP code, else the base class."""
    cls = _BY_REASON.get(status.reason or "")
    if cls is None and status.code is not None:
        cls = ServerError if status.code >= 500 else _BY_CODE.get(status.code)
    return (cls or NodusError)(status)


def status_of(code: int, content: bytes, reason_phrase: str = "") -> Status:
    """The Status in an error body, or one made up from the HTTP code when the body is not one."""
    try:
        status: Status | None = msgspec.json.decode(content, type=Status)
    except (msgspec.DecodeError, msgspec.ValidationError):
        status = None
    if status is not None and status.kind == "Status" and status.reason:
        if status.code is None:
            status = msgspec.structs.replace(status, code=code)
        return status
    reason = reason_for_code(code)
    text = content.decode("utf-8", "replace").strip()[:200] or reason_phrase
    made = status_for(reason, f"the server answered {code}: {text}")
    # The code that was really answered, not the reason's usual one (a 502 from a proxy stays a 502).
    return msgspec.structs.replace(made, code=code) if get_reason(reason).http_status != code else made
