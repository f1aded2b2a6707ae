"""A large Job rests between passes, for a time in proportion to its Attempts; a small one never does."""

from __future__ import annotations

from nodus_scheduler.pacing import MIN_ATTEMPTS, REST_PER_ATTEMPT_S, Pacing


def test_a_job_of_few_attempts_never_rests() -> None:
    pacing = Pacing()
    pacing.passed(("ns", "small"), MIN_ATTEMPTS - 1)
    assert pacing.wait(("ns", "small")) == 0.0


def test_a_large_job_rests_in_proportion_to_its_attempts() -> None:
    pacing = Pacing()
    pacing.passed(("ns", "big"), 1_000)
    wait = pacing.wait(("ns", "big"))
    assert 0 < wait <= 1_000 * REST_PER_ATTEMPT_S
    assert pacing.wait(("ns", "other")) == 0.0  # one Job's rest is its own


def test_a_forgotten_job_rests_no_more() -> None:
    pacing = Pacing()
    pacing.passed(("ns", "big"), 1_000_000)  # 20 s
    pacing.forget(("ns", "big"))
    assert pacing.wait(("ns", "big")) == 0.0
