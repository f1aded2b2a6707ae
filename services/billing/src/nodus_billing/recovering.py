"""Recovery accounting of a Job (``status.recovery``): the runs it lost with their capacity, what they cost,
the GPU time they had done since their last checkpoint, and what the replacements' Restore cost. Pure: the
meter (metering.py) writes it with ``status.cost``."""

from __future__ import annotations

from nodus_billing.costing import runs_of
from nodus_billing.segmenting import RESTORE, epoch_ms
from nodus_billing.standing import State
from nodus_schema.attempts import Attempt
from nodus_schema.gpus import GPURequest
from nodus_schema.jobs import Job, LostRun, RecoveryStatus, Resources
from nodus_schema.ledger import charge_micros
from nodus_schema.quantities import micros_to_usd

MAX_LOST_RUNS = 100


def recovery_of(job: Job, state: State, attempts: list[Attempt]) -> RecoveryStatus | None:
    """Recovery accounting: each run lost with its capacity, what it cost, and the GPU time it had done
    since its last checkpoint until its node's last heartbeat (paid for, and done again by its
    replacement); what the replacements' Restore cost, and what Nodus covered. None when nothing was lost."""
    mine = runs_of(job, attempts)
    lost = sorted(
        (a for a in mine if a.status.phase == "Lost"),
        key=lambda a: (a.metadata.creation_timestamp or "", a.metadata.name or ""),
    )
    if not lost:
        return None
    gpus = _gpus(job)
    runs: list[LostRun] = []
    total_ms = total_usd = covered = 0
    for a in lost:
        st = a.status
        since = epoch_ms((st.checkpoint.time if st.checkpoint else None) or st.start_time)
        until = st.billing_stop_ms if st.billing_stop_ms is not None else epoch_ms(st.finish_time)
        lost_ms = max(0, until - since) if since is not None and until is not None else 0
        lost_micros = charge_micros(a.spec.rate_micros_per_hour, lost_ms)
        hold = state.holds.get(a.metadata.name or "")
        if hold is not None and hold.usage is not None:
            covered += sum(hold.usage.covered.values())
        total_ms += lost_ms
        total_usd += lost_micros
        runs.append(
            LostRun(
                attempt=a.metadata.name or "",
                index=a.spec.index,
                reason=st.reason,
                cost_usd=micros_to_usd(hold.charged_micros) if hold is not None else None,
                lost_seconds=lost_ms // 1000,
                gpus=gpus,
                lost_usd=micros_to_usd(lost_micros),
                checkpoint_time=st.checkpoint.time if st.checkpoint else None,
            )
        )
    restore = sum(
        h.usage.segments.get(RESTORE, 0)
        for a in mine
        if (h := state.holds.get(a.metadata.name or "")) is not None and h.usage is not None
    )
    return RecoveryStatus(
        lost_runs=len(lost),
        lost_gpu_seconds=total_ms // 1000 * gpus,
        lost_usd=micros_to_usd(total_usd),
        restore_usd=micros_to_usd(restore),
        recovery_usd=micros_to_usd(total_usd + restore),
        covered_usd=micros_to_usd(covered),
        runs=runs[-MAX_LOST_RUNS:],
    )


def _gpus(job: Job) -> int:
    res = job.spec.resources
    gpu = res.gpu if isinstance(res, Resources) else None
    return gpu.count if isinstance(gpu, GPURequest) and gpu.count else 1
