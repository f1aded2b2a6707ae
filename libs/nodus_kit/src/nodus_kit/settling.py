"""What becomes of a message once its handler is done: the one mapping of a handler's outcome to ack,
nak with a delay, or dead letter and term (ADR-0003). Every consumer of the kit and the services asks it
(messaging.Consumer, the simulated fleet); a controller asks it about a reconcile's error, where "retry"
is a requeue after the delay and "dead" is a drop until the object changes.

=========================================================  =========================================
outcome                                                    verdict
=========================================================  =========================================
returned                                                   ack
:class:`~nodus_kit.errors.TemporaryError`                  retry after the delay it asks for
a retryable :class:`~nodus_kit.errors.NodusError`, or any  retry after ``backoff.delay(attempt)``
other exception
a :class:`~nodus_kit.errors.NodusError` not retryable      dead
(PermanentError, NotFound, Invalid, ...)
a retry on attempt ``max_attempts``                        dead ("gave up after N deliveries")
=========================================================  =========================================
"""

from __future__ import annotations

import enum
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from nats.aio.msg import Msg

from nodus_kit.backingoff import Backoff
from nodus_kit.errors import NodusError, TemporaryError

REDELIVERY: Final = Backoff(base=0.5, cap=30.0)
"""The backoff of a message a handler failed on, by its delivery number."""


class Action(enum.Enum):
    ACK = "ack"
    RETRY = "retry"
    DEAD = "dead"


@dataclass(frozen=True, slots=True)
class Verdict:
    action: Action
    delay: float = 0.0
    """RETRY: seconds before the message (or key) comes again."""
    reason: str = ""
    """RETRY, DEAD: why, for the log and the dead letter's header."""


ACK: Final = Verdict(Action.ACK)


def retry(delay: float, reason: str = "") -> Verdict:
    return Verdict(Action.RETRY, delay, reason)


def dead(reason: str) -> Verdict:
    return Verdict(Action.DEAD, reason=reason)


def of_error(
    error: BaseException,
    attempt: int,
    *,
    max_attempts: int | None = None,
    backoff: Backoff = REDELIVERY,
    rng: random.Random | None = None,
) -> Verdict:
    """The verdict on a handler that raised ``error`` on its ``attempt``-th try (1 on the first);
    ``max_attempts`` None retries for ever (a controller's key)."""
    verdict = _first_verdict(error, attempt, backoff, rng)
    if verdict.action is Action.RETRY and max_attempts is not None and attempt >= max_attempts:
        return dead(f"gave up after {attempt} deliveries: {verdict.reason}")
    return verdict


def _first_verdict(
    error: BaseException, attempt: int, backoff: Backoff, rng: random.Random | None
) -> Verdict:
    if isinstance(error, TemporaryError):
        return retry(error.delay, str(error))
    if isinstance(error, NodusError):
        # The kit's errors say themselves whether a retry can help (NotFound, Invalid cannot).
        if not error.retryable:
            return dead(str(error) or type(error).__name__)
        return retry(backoff.delay(attempt, rng), f"{error.reason}: {error}")
    return retry(backoff.delay(attempt, rng), f"{type(error).__name__}: {error}")


DeadLetter = Callable[[Msg, str], Awaitable[None]]
"""Records a message given up on, with the reason, and terms it."""


async def settle(msg: Msg, verdict: Verdict, dead_letter: DeadLetter) -> None:
    """Answer JetStream for ``msg`` as ``verdict`` says."""
    if verdict.action is Action.ACK:
        await msg.ack()
    elif verdict.action is Action.RETRY:
        await msg.nak(delay=verdict.delay)
    else:
        await dead_letter(msg, verdict.reason)
