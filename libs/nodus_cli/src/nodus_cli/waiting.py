"""Waiting for a Sweep, Job or Pipeline to finish, with a one-line progress display (``nodus apply
--wait``), and the rule for when following one is over (also ``get sweep NAME -w``'s).

The line shows the phase, cells (indexes, stages) done of all, what was spent so far and the rate now. On a
terminal it is rewritten in place (``\\r`` and erase-line) on stderr; into a pipe or a file each new state
is a line of its own. A Pipeline's stage transitions are lines of their own on stderr too (``stage train:
Running -> Succeeded (job flow-train, 5m00s, $0.33)``). The last state goes to stdout, so that ``nodus apply
--wait > out`` keeps it; when it did not succeed, its message follows on stderr.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

import msgspec

from nodus_cli import exiting, watching
from nodus_cli.client import ApiError
from nodus_cli.kinds import PIPELINE, SWEEP, Kind
from nodus_cli.pipelines import stage_phases, stages_done, transitions
from nodus_cli.reporting import status_text
from nodus_cli.requesting import Requests
from nodus_cli.tables import cells_done, phase_text, usd
from nodus_schema import TERMINAL_PHASES

FINAL_COST_WAIT_S = 10.0
"""After a Sweep or Job ends, how long to wait for its final charges to post before giving up on them."""


class Ending:
    """When following one Sweep (or Job) is over: once it is in a terminal phase and its cost is final, or
    :data:`FINAL_COST_WAIT_S` after the terminal phase without a final cost (the last charges post a moment
    after the last run ends). ``code`` is then 0 for Succeeded, 1 for Failed or Cancelled (or deleted)."""

    def __init__(self, kind: Kind) -> None:
        self.kind = kind
        self.latest: Any = None
        self.settle_until: float | None = None
        self.code: int | None = None
        self.deleted = False

    def remaining(self) -> float | None:
        """Seconds until the final-cost wait runs out; None while the object has not finished."""
        return None if self.settle_until is None else max(0.0, self.settle_until - time.monotonic())

    def update(self, change: watching.Change) -> int | None:
        """The exit code once following is over, else None."""
        if change.type == "DELETED":
            self.deleted = True
            self.code = exiting.FAILED
            return self.code
        if change.type in ("ADDED", "MODIFIED"):
            self.latest = msgspec.convert(change.obj, self.kind.object_type)
        if self.latest is None:
            return None
        status = self.latest.status
        if status.phase not in TERMINAL_PHASES:
            self.settle_until = None
            return None
        if self.settle_until is None:
            self.settle_until = time.monotonic() + FINAL_COST_WAIT_S
        final_cost = bool(status.cost and status.cost.final)
        if final_cost or time.monotonic() >= self.settle_until:
            self.code = exiting.OK if status.phase == "Succeeded" else exiting.FAILED
        return self.code


def progress(kind: Kind, obj: Any) -> str:
    """``sweep.nodus.dev/lr  Running  cells 3/6 done  spent $0.0123  rate $5.98/h``."""
    status = obj.status
    if kind is SWEEP:
        done, total = cells_done(obj)
        count = f"cells {done}/{total} done"
    elif kind is PIPELINE:
        done, total = stages_done(obj)
        count = f"stages {done}/{total} succeeded"
    else:
        count = f"indexes {status.succeeded or 0}/{obj.spec.completions or 1} succeeded"
    cost = status.cost
    parts = [
        kind.ref(obj.metadata.name or ""),
        phase_text(status.phase, status.reason),
        count,
        f"spent {usd(cost.total_usd if cost else None)}" + (" (final)" if cost and cost.final else ""),
    ]
    if cost and cost.rate_usd_per_hour and status.phase not in TERMINAL_PHASES:
        parts.append(f"rate ${cost.rate_usd_per_hour}/h")
    return "  ".join(parts)


class ProgressLine:
    def __init__(self, err: TextIO | None = None) -> None:
        self.err = err or sys.stderr
        self.tty = self.err.isatty()
        self.last = ""

    def show(self, line: str) -> None:
        if line == self.last:
            return
        self.last = line
        self.err.write(f"\r\x1b[K{line}" if self.tty else line + "\n")
        self.err.flush()

    def close(self) -> None:
        if self.tty and self.last:
            self.err.write("\r\x1b[K")
            self.err.flush()
        self.last = ""


class StageLog:
    """A Pipeline's stage transitions as lines of their own, above the progress line."""

    def __init__(self, line: ProgressLine) -> None:
        self.line = line
        self.phases: dict[str, str | None] = {}

    def show(self, pipeline: Any) -> None:
        changed = transitions(self.phases, pipeline)
        self.phases = {**self.phases, **stage_phases(pipeline)}
        if not changed:
            return
        self.line.close()
        self.line.err.write("".join(f"{text}\n" for text in changed))
        self.line.err.flush()


def ended_text(kind: Kind, obj: Any) -> str | None:
    """What stderr says after an object that did not succeed: its phase, reason and message."""
    status = obj.status
    if status.phase == "Succeeded" or not status.message:
        return None
    return f"{kind.ref(obj.metadata.name or '')} {phase_text(status.phase, status.reason)}: {status.message}"


def wait(api: Requests, kind: Kind, namespace: str, name: str, *, start: dict[str, Any] | None = None) -> int:
    """Follow one Sweep, Job or Pipeline until it ends: 0 if it Succeeded, 1 otherwise. Ctrl-C propagates
    (130). ``start``: the object as its create returned it, followed from there (see
    :func:`watching.changes`)."""
    ending = Ending(kind)
    line = ProgressLine()
    stages = StageLog(line) if kind is PIPELINE else None
    try:
        for change in watching.changes(
            api, kind, namespace, name=name, timeout_s=ending.remaining, start=start
        ):
            code = ending.update(change)
            if ending.latest is not None and not ending.deleted:
                if stages is not None:
                    stages.show(ending.latest)
                line.show(progress(kind, ending.latest))
            if code is not None:
                line.close()
                if ending.deleted:
                    print(f"{kind.ref(name)} was deleted before it finished", file=sys.stderr)
                else:
                    print(progress(kind, ending.latest), flush=True)
                    if (why := ended_text(kind, ending.latest)) is not None:
                        print(why, file=sys.stderr, flush=True)
                return code
    except ApiError as e:
        line.close()
        print(status_text(e.status), file=sys.stderr)
        return exiting.FAILED
    finally:
        line.close()
    return exiting.FAILED  # unreachable: changes() never ends by itself
