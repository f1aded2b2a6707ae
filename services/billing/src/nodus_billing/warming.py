"""Billing's side of warm capacity (``spec.scaledownWindow``, issue #21, ADR-0038; the rules are
:mod:`nodus_schema.warmth`'s).

**Who pays**: the Job whose run kept the node warm, at that run's rate, from the run's billing stop
(``warmSinceMs``) to the window's end, as the run's **Teardown** segment (``bySegment.teardownUSD``). The
run's hold stays open while its window is: it is charged by the meter's ticks and extended ahead of use like
a running hold, never past the window's end, and captured (run + window) once the window ended.

**Capped**: the hold is extended only as far as the Job's and its Sweep's caps, the project's Budgets and
its credits allow (``room_for``). When it cannot be extended and its funding is about to run out, billing
ends the window where the funding ends (``warmEndMs``, :func:`end_of_funding`): the window never costs more
than the cap or the balance allows, and the node is free for everyone from then.

Pure but for the one write :func:`write_end` (the Attempt's ``warmEndMs``, by compare-and-set, only when
unset: the scheduler ends windows too).
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from nodus_billing.segmenting import TEARDOWN
from nodus_billing.standing import Hold, Usage
from nodus_kit.errors import NotFound
from nodus_kit.storing import ObjectStore
from nodus_schema.attempts import ATTEMPT_TERMINAL, Attempt
from nodus_schema.ledger import charge_micros
from nodus_schema.warmth import open_at, window_end_ms, window_ms, with_end

WARM_FROM = "warm-from"
"""The billing informer's index of Attempts by the keeper whose window they reused."""


def warm_from(a: Attempt) -> Iterable[str]:
    """An Attempt filed under the keeper it reused (``<namespace>/<keeper>``)."""
    return (f"{a.metadata.namespace or ''}/{a.spec.warm_from}",) if a.spec.warm_from else ()


def keeper_key(a: Attempt) -> str:
    return f"{a.metadata.namespace or ''}/{a.metadata.name or ''}"


def warm_open(attempt: Attempt, reusers: list[Attempt], now_ms: int) -> bool:
    """A finished run whose window is still open: its hold is charged and extended, not captured."""
    return attempt.status.phase in ATTEMPT_TERMINAL and open_at(attempt, now_ms, reusers)


def horizon_ms(attempt: Attempt, reusers: list[Attempt]) -> int | None:
    """How much billed time the keeper's hold may ever need: its run and all of its window (None: no
    window, so no limit beyond the run's)."""
    st = attempt.status
    end = window_end_ms(attempt, reusers)
    if end is None or st.billing_start_ms is None or st.warm_since_ms is None:
        return None
    stop = st.billing_stop_ms if st.billing_stop_ms is not None else st.warm_since_ms
    return max(0, stop - st.billing_start_ms) + max(0, end - st.warm_since_ms)


def with_window(usage: Usage, attempt: Attempt, reusers: list[Attempt], now_ms: int) -> Usage:
    """The run's usage with its window's time added as Teardown (nothing when it kept no window, or when
    Nodus covered the run: a run Nodus lost keeps nothing warm)."""
    ms = window_ms(attempt, now_ms, reusers)
    if ms <= 0 or usage.covered:
        return usage
    amount = charge_micros(attempt.spec.rate_micros_per_hour, ms)
    segments = dict(usage.segments)
    segments[TEARDOWN] = segments.get(TEARDOWN, 0) + amount
    return msgspec.structs.replace(usage, segments=segments, billed_millis=(usage.billed_millis or 0) + ms)


def end_of_funding(
    hold: Hold, attempt: Attempt, reusers: list[Attempt], now_ms: int, tick_ms: int
) -> int | None:
    """When to end an open window its hold can no longer fund: where the funding ends, once that is less
    than a tick away and before the window would end on its own; None while it is funded."""
    end = window_end_ms(attempt, reusers)
    since = attempt.status.warm_since_ms
    if end is None or since is None or hold.funded_until_ms >= end:
        return None
    if hold.funded_until_ms - now_ms > tick_ms:
        return None
    return max(since, min(now_ms, hold.funded_until_ms))


async def write_end(attempts: ObjectStore[Attempt], attempt: Attempt, end_ms: int) -> Attempt | None:
    """Write the keeper's ``warmEndMs`` (only if nobody has): the stored Attempt, None if it is gone."""

    try:
        return await attempts.mutate(
            attempt.metadata.namespace, attempt.metadata.name or "", lambda a: with_end(a, end_ms)
        )
    except NotFound:
        return None
