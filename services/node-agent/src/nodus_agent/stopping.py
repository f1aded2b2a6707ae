"""What a StopAttempt does on this node, decided from its :class:`~nodus_schema.messages.StopReason` (never
from text), and how a stop reaches an attempt whose program is not running yet.

* A running program is stopped by its supervisor (:class:`nodus_agent.running.Run`), after the checkpoint
  the stop asks for, taken with the reason :func:`checkpoint_reason` names.
* An attempt still preparing (secrets, inputs, restore) or launching (an image pull) is :class:`Pending`:
  the stop is kept there; the preparation is interrupted (:func:`unless_stopped`) and the attempt reported
  Stopped without running, or, during the launch, the program is stopped as soon as it runs.
* Either way the stop is acknowledged before it is carried out, so it is first kept in the attempt's
  directory (:func:`remember`): an agent killed in between finds it when it settles the attempt after its
  restart, and stops the program it re-adopts (or reports Stopped, not Lost, one that is gone).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Final, TypeVar

import msgspec

from nodus_agent.attemptdir import AttemptDir
from nodus_schema.messages import StopAttempt, StopReason

T = TypeVar("T")

CHECKPOINT_REASONS: Final[Mapping[StopReason, str]] = MappingProxyType(
    {StopReason.MAX_COST_REACHED: "CapReached", StopReason.PREEMPTED: "Preemption"}
)
"""The checkpoint reason (docs/checkpoints.md) of a stop that asks for one; every other stop's is Suspend."""
STOP_FILE: Final = "stop.json"
"""In the attempt's directory: the StopAttempt acknowledged for it (the first one)."""

_stop_decoder = msgspec.json.Decoder(StopAttempt)


def checkpoint_reason(reason: StopReason) -> str:
    return CHECKPOINT_REASONS.get(reason, "Suspend")


def asked_to_stop(msg: StopAttempt) -> str:
    """The Stopped report's message: for people reading it; nothing decides from it."""
    return f"asked to stop ({msg.reason})"


@dataclass
class Pending:
    """An attempt recorded Starting whose program is not running yet (secrets, inputs, restore, launch): a
    stop that arrives meanwhile is kept here and carried out as soon as it can be."""

    stopped: str | None = None
    """The Stopped report's message, once a stop was asked for."""
    asked: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    """The preparation and launch, when they run in the background (an assignment the consumer handled)."""

    def request_stop(self, message: str) -> None:
        if self.stopped is None:  # the first stop wins, as for a running program
            self.stopped = message
            self.asked.set()


async def unless_stopped(pending: Pending, work: Awaitable[T]) -> T | None:
    """``work``'s result, or None once a stop is asked for first (``work`` is then cancelled, and awaited
    so its own cleanup, a staged input removed, is over before the caller reports the attempt)."""
    task = asyncio.ensure_future(work)
    stop = asyncio.ensure_future(pending.asked.wait())
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when the caller is cancelled (shutdown): the work must not outlive it
        stop.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
    if pending.asked.is_set():  # the stop wins over whatever the interrupted work ended with
        if not task.cancelled():
            task.exception()  # retrieved, so asyncio does not log it as lost
        return None
    return task.result()


def remember(adir: AttemptDir, msg: StopAttempt) -> None:
    """Keep the stop in the attempt's directory (write-then-rename, fsynced), unless one is kept already:
    called before the stop is acknowledged, for an attempt whose program may run or be about to."""
    path = adir.root / STOP_FILE
    if path.exists() or not adir.root.is_dir():
        return
    tmp = path.with_suffix(".json.tmp")
    with tmp.open("wb") as f:
        f.write(msgspec.json.encode(msg))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def remembered(adir: AttemptDir) -> StopAttempt | None:
    """The stop kept for the attempt, if any (a torn or unreadable file counts as none)."""
    path: Path = adir.root / STOP_FILE
    try:
        return _stop_decoder.decode(path.read_bytes())
    except (FileNotFoundError, msgspec.DecodeError):
        return None
