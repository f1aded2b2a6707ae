"""What one Attempt's run costs, split into billing segments (pure; ADR-0024, issue #18).

**Where billing starts and stops.** From the node's reported start of the run (``billingStartMs``: the
agent began it, before the image pull and inputs) to the node's reported stop (``billingStopMs``: the
program is gone, its outputs committed), both on the node's clock in milliseconds, rounded up to the
billing increment once per allocation, one increment at least (``minimumChargeUSD``). Identical runs are
billed identically: nothing depends on when the control plane stamped an object. A report from an older
agent without these times falls back to the Attempt's creation and finish (whole seconds).

**Segments.** **Boot** from billing's start to the program's launch (``programStartMs``), or **Restore**
when the run replaces one lost with its capacity; **Running** from the launch to billing's stop (the
teardown, stop until the program is gone, is inside it: the agent reports the stop only then).

**coveredByNodus**: a run that never began because of Nodus (it was lost, or its start failed on the node,
before the program started) is recorded with what it would have cost and charged nothing. A run lost
with its node after the program started is charged as Running from the launch to the node's last
heartbeat (``billingStopMs``, written by the scheduler); its Boot (or Restore) and the time from the last
heartbeat to the loss (**Teardown**) are covered.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from nodus_billing.standing import Usage
from nodus_schema.attempts import Attempt
from nodus_schema.estimating import billed_millis
from nodus_schema.ledger import charge_micros
from nodus_schema.meta import parse_time

BOOT: Final = "Boot"
RUNNING: Final = "Running"
RESTORE: Final = "Restore"
TEARDOWN: Final = "Teardown"

NODUS_FAULTS: Final = frozenset({"Lost", "NodeLost", "AgentLost", "LaunchFailed"})
"""Reasons (or phases) of a run that ended because of Nodus or its capacity, not the program."""


def epoch_ms(text: str | None) -> int | None:
    """An RFC 3339 time as epoch milliseconds (None for None)."""
    return None if not text else int(parse_time(text).timestamp() * 1000)


def billing_start_ms(attempt: Attempt, now_ms: int) -> int:
    """Billing's start: the node's reported start of the run, else the Attempt's creation."""
    st = attempt.status
    if st.billing_start_ms is not None:
        return st.billing_start_ms
    return epoch_ms(attempt.metadata.creation_timestamp) or now_ms


def usage_ms(attempt: Attempt, now_ms: int) -> int:
    """Billed-so-far time of a run still going: from billing start until now."""
    return max(0, now_ms - billing_start_ms(attempt, now_ms))


def nodus_fault(attempt: Attempt) -> bool:
    st = attempt.status
    return st.phase == "Lost" or (st.reason or "") in NODUS_FAULTS


def usage_of(attempt: Attempt, *, replacement: bool, now_ms: int) -> Usage:
    """The charge of a finished run, by segment: what its hold is captured with."""
    spec, st = attempt.spec, attempt.status
    rate = spec.rate_micros_per_hour
    start = billing_start_ms(attempt, now_ms)
    finished = epoch_ms(st.finish_time) or now_ms
    # The node's own stop when it reported one (the same clock as the start), else the finish stamp.
    stop = st.billing_stop_ms if st.billing_stop_ms is not None else finished
    # A node that reports its times reports the launch too, or there was none (a start that failed): the
    # scheduler's startTime, which a finish report fills in, is read only for an agent without them.
    program = st.program_start_ms if st.billing_start_ms is not None else epoch_ms(st.start_time)
    first = RESTORE if replacement else BOOT
    usage = Usage(
        attempt=attempt.metadata.name or "",
        offering=spec.offering,
        pricebook_version=spec.pricebook_version,
        rate_micros_per_hour=rate,
        start_time=attempt.metadata.creation_timestamp,
        finish_time=st.finish_time,
    )
    if program is None and nodus_fault(attempt):
        usage.covered = {first: charge_micros(rate, _billed(max(0, stop - start)))}
        return usage
    launched = min(max(program if program is not None else stop, start), max(stop, start))
    if st.phase == "Lost":
        return _lost(usage, first, rate, start, launched, stop, max(finished, stop))
    billed = _billed(max(0, stop - start))
    total = charge_micros(rate, billed)
    # A program that never launched (a checkout that failed, ADR-0036) ran nothing: the whole charge,
    # rounding included, is its start's.
    boot = total if program is None else min(total, charge_micros(rate, launched - start))
    usage.billed_millis = billed
    usage.segments = {first: boot, RUNNING: total - boot}
    return usage


def _lost(usage: Usage, first: str, rate: int, start: int, launched: int, heartbeat: int, lost: int) -> Usage:
    """A run lost with its node after its program started: Running until the node's last heartbeat is
    charged; its Boot (Restore) and the time from the last heartbeat to the loss (Teardown) are Nodus's."""
    running = max(0, heartbeat - launched)
    billed = billed_millis_of(running) if running else 0
    usage.billed_millis = billed
    usage.segments = {RUNNING: charge_micros(rate, billed)} if billed else {}
    covered = {first: charge_micros(rate, launched - start), TEARDOWN: charge_micros(rate, lost - heartbeat)}
    usage.covered = {seg: amount for seg, amount in covered.items() if amount > 0}
    return usage


def _billed(millis: int) -> int:
    """Billed time of one allocation: rounded up to the increment once, one increment at least."""
    return max(billed_millis_of(millis), billed_millis_of(1))


def billed_millis_of(millis: int) -> int:
    """``millis`` rounded up to whole billing increments."""
    return billed_millis(timedelta(milliseconds=millis))


def charged(usage: Usage) -> int:
    return sum(usage.segments.values())
