"""The one mapping of a handler's outcome to ack / nak with a delay / dead letter and term (pure; the
consumer's end-to-end outcomes are in test_messaging.py)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from nodus_kit import errors, settling
from nodus_kit.backingoff import Backoff
from nodus_kit.settling import Action, Verdict

BACKOFF = Backoff(base=0.5, cap=30.0)


def _verdict(error: BaseException, attempt: int = 1, max_attempts: int | None = 8) -> Verdict:
    return settling.of_error(error, attempt, max_attempts=max_attempts, backoff=BACKOFF, rng=random.Random(1))


def test_a_temporary_error_is_retried_after_the_delay_it_asks_for() -> None:
    assert _verdict(errors.TemporaryError("not yet", delay=2.5)) == settling.retry(2.5, "not yet")


@pytest.mark.parametrize("error", [errors.Conflict("lost a race"), RuntimeError("boom")])
def test_a_retryable_error_or_a_crash_is_retried_after_a_jittered_backoff(error: Exception) -> None:
    verdict = _verdict(error, attempt=4)
    assert verdict.action is Action.RETRY and 0.0 <= verdict.delay <= BACKOFF.ceiling(4)
    assert str(error) in verdict.reason and verdict.reason.split(":")[0] in ("Conflict", "RuntimeError")


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (errors.PermanentError("spec is unusable"), "spec is unusable"),
        (errors.NotFound("no such job"), "no such job"),
        (errors.Invalid(), "Invalid"),  # no message: the class names it
    ],
)
def test_an_error_that_no_retry_can_help_is_dead_at_once(error: Exception, reason: str) -> None:
    assert _verdict(error) == settling.dead(reason)


@pytest.mark.parametrize("error", [errors.TemporaryError("not yet"), RuntimeError("boom")])
def test_a_retry_on_the_last_attempt_is_dead(error: Exception) -> None:
    verdict = _verdict(error, attempt=8)
    assert verdict.action is Action.DEAD and verdict.reason.startswith("gave up after 8 deliveries: ")
    assert _verdict(error, attempt=7).action is Action.RETRY


def test_without_a_limit_a_retry_is_never_dead() -> None:
    """A controller's key: requeued for as long as it fails."""
    assert _verdict(RuntimeError("boom"), attempt=10_000, max_attempts=None).action is Action.RETRY


class _Msg:
    """What settle calls on a JetStream message, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    async def ack(self) -> None:
        self.calls.append(("ack", None))

    async def nak(self, delay: float | None = None) -> None:
        self.calls.append(("nak", delay))


@pytest.mark.parametrize(
    ("verdict", "calls"),
    [
        (settling.ACK, [("ack", None)]),
        (settling.retry(1.5), [("nak", 1.5)]),
        (settling.dead("poison"), [("dead", "poison")]),
    ],
)
async def test_settle_answers_jetstream_as_the_verdict_says(verdict: Verdict, calls: list[Any]) -> None:
    msg = _Msg()

    async def dead_letter(m: Any, reason: str) -> None:
        m.calls.append(("dead", reason))

    await settling.settle(msg, verdict, dead_letter)  # type: ignore[arg-type]  # the Msg surface used
    assert msg.calls == calls
