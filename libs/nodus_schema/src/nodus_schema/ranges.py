"""The documented range of every number, duration, quantity and amount admission lets through.

Every service downstream relies on them: billing keeps amounts as int64 micro-dollars in msgpack books, the
scheduler turns seconds and durations into timers and datetimes, the node agent hands byte and CPU amounts
to the Docker Engine API as int64. So admission (``validating.py``) refuses any value outside its range with
a 422 on the field, and :data:`RANGES` is the table ``docs/errors/Invalid.md`` shows (a test keeps the two in
step). Where the reference states a range, it is the reference's; otherwise counts and seconds are
Kubernetes' int32, durations at most :data:`~nodus_schema.quantities.MAX_DURATION` and amounts at most
:data:`~nodus_schema.quantities.MAX_USD` with at most 6 decimals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from nodus_schema.quantities import MAX_DURATION, MAX_INT32, MAX_USD, format_duration

__all__ = [
    "MAX_BACKOFF_LIMIT",
    "MAX_BYTES",
    "MAX_CPU_MILLIS",
    "MAX_DURATION_TEXT",
    "MAX_INIT_TIMEOUT",
    "MAX_MAX_ATTEMPTS",
    "MAX_PATH_LEN",
    "MAX_SCALEDOWN_WINDOW",
    "MAX_USD_TEXT",
    "RANGES",
    "Range",
]

MAX_BYTES: Final = 2**63 - 1
"""Byte quantities (memory, disk, minMemory, checkpoint sizes): Kubernetes' int64, what Docker takes."""
MAX_CPU_MILLIS: Final = MAX_INT32
"""CPU quantities, in millicores: int32, so every runtime's nano-CPU count fits an int64."""
MAX_PATH_LEN: Final = 4096
"""The longest path a path field takes (Linux' PATH_MAX)."""
MAX_DURATION_TEXT: Final = format_duration(MAX_DURATION)
"""``596523h14m7s``: 2^31 - 1 seconds, about 68 years."""
MAX_USD_TEXT: Final = f"{MAX_USD}"
MAX_BACKOFF_LIMIT: Final = 100
MAX_MAX_ATTEMPTS: Final = 32
MAX_INIT_TIMEOUT: Final = "30m"
MAX_SCALEDOWN_WINDOW: Final = "20m"


@dataclass(frozen=True, slots=True)
class Range:
    """One row of the table: the field (a Job's; ``spec.template.spec.`` in a Sweep), its lowest and
    highest admitted value, and a note."""

    field: str
    low: str
    high: str
    note: str = ""


_I32, _DUR, _USD = str(MAX_INT32), MAX_DURATION_TEXT, MAX_USD_TEXT
_MONEY = "a decimal string, at most 6 decimals"

RANGES: Final[tuple[Range, ...]] = (
    # JobSpec (also spec.template.spec of a Sweep)
    Range("spec.completions", "1", "10000", "the reference"),
    Range("spec.parallelism", "1", "min(completions, 256)", "the reference"),
    Range("spec.backoffLimit", "0", str(MAX_BACKOFF_LIMIT), "the reference"),
    Range("spec.activeDeadlineSeconds", "1", _I32, "folded into timeout"),
    Range("spec.ttlSecondsAfterFinished", "0", _I32, "int32 seconds"),
    Range("spec.timeout", "above 0s", _DUR, ""),
    Range("spec.expectedDuration", "above 0s", _DUR, ""),
    Range("spec.scaledownWindow", "0s", "20m", "the reference"),
    Range("spec.maxCostUSD", "0", _USD, _MONEY),
    Range("spec.initCommand.timeout", "above 0s", MAX_INIT_TIMEOUT, "the reference"),
    Range("spec.sidecars[].startupTimeout", "-", "-", "not available yet: leave it unset"),
    Range("spec.secrets[].version", "1", _I32, ""),
    Range("spec.inputs[].output.index", "0", "9999", "an index of the producing Job"),
    Range("spec.resources.cpu", "1m", f"{MAX_CPU_MILLIS}m", "a quantity"),
    Range("spec.resources.memory", "1", str(MAX_BYTES), "bytes, a quantity (int64)"),
    Range("spec.resources.disk", "1", str(MAX_BYTES), "bytes, a quantity (int64)"),
    Range("spec.resources.nodes", "1", "16", "above 1: a gang (the beta caps it at 8)"),
    Range("spec.resources.gpu.count", "1", "8", "1, 2, 4 or 8"),
    Range("spec.resources.gpu.minMemory", "1", str(MAX_BYTES), "bytes, a quantity (int64)"),
    Range("spec.distributed.nodes", "2", "16", "the reference; the beta caps it at 8"),
    Range("spec.distributed.totalGPUs", "2", "64", "the reference"),
    Range("spec.distributed.gpusPerNode", "1", "8", "1, 2, 4 or 8"),
    Range("spec.distributed.maxAssemblyRetries", "0", "5", "the reference"),
    Range("spec.distributed.startupTimeout", "5m", "60m", "the reference"),
    Range("spec.placement.maxRateUSDPerHour", "0", _USD, _MONEY),
    Range("spec.placement.queueTimeout", "0s", _DUR, "0s waits for ever"),
    Range("spec.recovery.maxAttempts", "1", str(MAX_MAX_ATTEMPTS), "the reference"),
    Range("spec.recovery.minProgressDuration", "0s", _DUR, ""),
    Range("spec.recovery.checkpoint.interval", "1m", "6h", "or auto; the reference"),
    Range("spec.recovery.checkpoint.maxSize", "1", "2Ti", "the reference"),
    Range("spec.recovery.checkpoint.retainAfterFinish", "0s", _DUR, ""),
    Range("spec.outputs[].path", "-", f"{MAX_PATH_LEN} characters", "under /nodus/outputs or /nodus/state"),
    Range("spec.recovery.checkpoint.paths[]", "-", f"{MAX_PATH_LEN} characters", "as outputs[].path"),
    # SweepSpec
    Range("spec.maxParallel", "1", "256", "a Sweep's; the reference"),
    Range("spec.repetitions", "1", "64", "a Sweep's; the reference"),
    Range("spec.maxCostUSD", "0", _USD, f"a Sweep's; {_MONEY}"),
    Range("spec.matrix.gpu", "0 values", "16 values", "a Sweep's; the reference"),
    # Budget, Connection
    Range("spec.monthlyUSD", "0", _USD, f"a Budget's; {_MONEY}"),
    Range("spec.postgres.port", "1", "65535", "a Connection's"),
)
"""The table of docs/errors/Invalid.md, row for row."""
