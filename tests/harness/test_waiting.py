"""``nodus_testing.waiting.eventually``: what it returns, and what its failure says."""

from __future__ import annotations

import asyncio

import pytest

from nodus_testing.waiting import eventually


async def test_the_first_truthy_value_is_returned() -> None:
    calls = 0

    def third() -> int:
        nonlocal calls
        calls += 1
        return calls if calls >= 3 else 0

    assert await eventually(third, deadline_s=5, interval_s=0) == 3


async def test_a_call_the_deadline_cuts_off_keeps_the_last_assertion_that_ended() -> None:
    calls = 0

    async def fails_then_hangs() -> bool:
        nonlocal calls
        calls += 1
        assert calls > 1, "not yet: the first look"
        await asyncio.Event().wait()  # the second look never ends
        return True

    with pytest.raises(AssertionError) as caught:
        await eventually(fails_then_hangs, deadline_s=0.3, interval_s=0, message="it ends")
    said = str(caught.value)
    assert said.startswith("it ends: not true within 0.3s (last assertion: not yet: the first look")
    assert said.endswith("; the last call was cut off by the deadline)")


async def test_a_value_that_never_turns_true_is_shown() -> None:
    with pytest.raises(AssertionError, match=r"last value: \[\]\)$"):
        await eventually(lambda: [], deadline_s=0.1, message="a list")
