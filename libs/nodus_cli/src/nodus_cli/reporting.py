"""Errors as people read them: the Status message, each cause as ``  field: message``, the fix, the docs."""

from __future__ import annotations

from nodus_cli.client import Unreachable
from nodus_schema import Status


def status_text(status: Status) -> str:
    details = status.details
    causes = details.causes if details else []
    if status.reason == "Invalid" and details and causes:
        # As kubectl: a short headline, then one line per cause (the message repeats them all in one line).
        what = f'{details.kind} "{details.name}"' if details.name else (details.kind or "object")
        lines = [f"error: the {what} is invalid:"]
    else:
        lines = [f"error: {status.message or status.reason or 'the request failed'}"]
    for c in causes:
        lines.append(f"  {c.field or '<body>'}: {c.message or c.reason or ''}")
    if status.fix:
        lines.append(f"fix: {status.fix}")
    if status.docs:
        lines.append(f"docs: {status.docs}")
    if status.request_id:
        lines.append(f"request id: {status.request_id}")
    return "\n".join(lines)


def unreachable_text(err: Unreachable) -> str:
    if err.refused:
        return (
            f"error: the Nodus gateway is not running at {err.server} (connection refused).\n"
            "fix: start the local stack with `make up` (it writes .nodus/local.env, which nodus reads), "
            "or point nodus at a running gateway with --server or NODUS_URL."
        )
    return (
        f"error: the Nodus gateway at {err.server} did not answer: {err.detail}.\n"
        "fix: check that it is running (`make up` starts the local stack) and reachable, then retry."
    )
