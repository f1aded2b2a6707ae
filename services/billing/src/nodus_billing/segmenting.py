"""What one Attempt's run costs, split into billing segments (pure; ADR-0024).

Billing starts when the Attempt is created (its node is allocated to it) and ends when it finished. The
time from billing start to program start is **Boot**, or **Restore** when the run replaces one lost with
its capacity; from program start to the finish it is **Running**. The billed time is rounded up to the
billing increment, with one increment at least (``minimumChargeUSD``), and charged at the rate admitted
with the Attempt (its price book version's). **Teardown** (stop until deletion confirmed) is inside the
agent's finish time and charged as Running: the agent reports the finish only after the container is gone.

**coveredByNodus**: a run that never began because of Nodus (it was lost, or its start failed on the node,
before the program started) is recorded with what it would have cost and charged nothing.
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


def usage_ms(attempt: Attempt, now_ms: int) -> int:
    """Billed-so-far time of a run still going: from billing start until now."""
    created = epoch_ms(attempt.metadata.creation_timestamp) or now_ms
    return max(0, now_ms - created)


def nodus_fault(attempt: Attempt) -> bool:
    st = attempt.status
    return st.phase == "Lost" or (st.reason or "") in NODUS_FAULTS


def usage_of(attempt: Attempt, *, replacement: bool, now_ms: int) -> Usage:
    """The charge of a finished run, by segment: what its hold is captured with."""
    spec, st = attempt.spec, attempt.status
    rate = spec.rate_micros_per_hour
    created = epoch_ms(attempt.metadata.creation_timestamp) or now_ms
    finished = epoch_ms(st.finish_time) or now_ms
    started = epoch_ms(st.start_time)
    wall = max(0, finished - created)
    billed = max(billed_millis_of(wall), billed_millis_of(1))  # one increment at least
    total = charge_micros(rate, billed)
    first = RESTORE if replacement else BOOT
    usage = Usage(
        attempt=attempt.metadata.name or "",
        offering=spec.offering,
        pricebook_version=spec.pricebook_version,
        rate_micros_per_hour=rate,
        billed_millis=billed,
        start_time=attempt.metadata.creation_timestamp,
        finish_time=st.finish_time,
    )
    if started is None and nodus_fault(attempt):
        usage.billed_millis = 0
        usage.covered = {first: total}
        return usage
    boot_ms = max(0, (started if started is not None else finished) - created)
    boot = min(total, charge_micros(rate, boot_ms))
    usage.segments = {first: boot, RUNNING: total - boot}
    return usage


def billed_millis_of(millis: int) -> int:
    """``millis`` rounded up to whole billing increments."""
    return billed_millis(timedelta(milliseconds=millis))


def charged(usage: Usage) -> int:
    return sum(usage.segments.values())
