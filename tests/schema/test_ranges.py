"""Every number, duration, quantity and amount of a Job, a Sweep and a Budget has a documented range, and
admission refuses what is outside it with a field error, never an exception (ranges.py, checks.py); the
table of docs/errors/Invalid.md is the table in ranges.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec
import pytest

from nodus_schema.billing import Budget, BudgetSpec
from nodus_schema.defaulting import default_job, default_sweep
from nodus_schema.examples import full_job, full_sweep, minimal_job
from nodus_schema.fielding import CauseType, FieldError
from nodus_schema.gpus import GPURequest
from nodus_schema.jobs import Job, JobSpec, Placement, Recovery, Resources, SecretMount
from nodus_schema.meta import ObjectMeta
from nodus_schema.quantities import MAX_INT32
from nodus_schema.ranges import MAX_DURATION_TEXT, RANGES
from nodus_schema.validating import validate_budget, validate_job, validate_sweep

DOC = Path(__file__).resolve().parents[2] / "docs" / "errors" / "Invalid.md"
INV = CauseType.INVALID


def job_with(**spec: Any) -> Job:
    """The minimal Job with these spec fields (wire names), as a body would decode."""
    body = {**msgspec.to_builtins(minimal_job().spec), **spec}
    return Job(metadata=ObjectMeta(name="j", namespace="p"), spec=msgspec.convert(body, JobSpec))


def errors(job: Job) -> list[FieldError]:
    """The errors as sent and after defaulting; both must be the same list of fields."""
    sent, defaulted = validate_job(job), validate_job(default_job(job))
    assert {e.field for e in sent} == {e.field for e in defaulted}
    return sent


def at(errs: list[FieldError], field: str) -> FieldError:
    hits = [e for e in errs if e.field == field]
    assert hits, f"no error at {field}: {[str(e) for e in errs]}"
    return hits[0]


# -- integers: the reference's range where it has one, else int32 -------------------------------------------

INTS = [
    ("ttlSecondsAfterFinished", 0, MAX_INT32),
    ("activeDeadlineSeconds", 1, MAX_INT32),
    ("completions", 1, 10_000),
    ("backoffLimit", 0, 100),
]


@pytest.mark.parametrize(("field", "lo", "hi"), INTS, ids=[i[0] for i in INTS])
def test_integers_are_refused_outside_their_range_and_2_63_is_no_exception(
    field: str, lo: int, hi: int
) -> None:
    assert errors(job_with(**{field: lo})) == []
    assert errors(job_with(**{field: hi})) == []
    for bad in (lo - 1, hi + 1, 2**63, 2**64 - 1):
        error = at(errors(job_with(**{field: bad})), f"spec.{field}")
        assert error.reason == INV and f"must be between {lo} and {hi}" in error.message


def test_nested_integers_have_an_upper_bound_too() -> None:
    job = minimal_job()
    job.spec.secrets = [SecretMount(name="s", version=2**63)]
    job.spec.recovery = Recovery(max_attempts=2**63)
    errs = errors(job)
    assert at(errs, "spec.secrets[0].version").message.endswith(f"must be between 1 and {MAX_INT32}")
    assert at(errs, "spec.recovery.maxAttempts").message.endswith("must be between 1 and 32")


# -- durations: at most MAX_DURATION, and one no timedelta holds is a field error ---------------------------

DURATIONS = ["timeout", "expectedDuration"]
NESTED_DURATIONS = [
    ("placement", "queueTimeout"),
    ("recovery", "minProgressDuration"),
]


@pytest.mark.parametrize("field", DURATIONS)
def test_a_duration_past_max_duration_is_refused_not_an_exception(field: str) -> None:
    assert errors(job_with(**{field: MAX_DURATION_TEXT})) == []
    for bad in ("596523h14m8s", "99999999999999h", "9" * 60 + "h"):
        error = at(errors(job_with(**{field: bad})), f"spec.{field}")
        assert error.reason == INV and "must be at most 596523h14m7s" in error.message


@pytest.mark.parametrize(("part", "field"), NESTED_DURATIONS)
def test_nested_durations_are_bounded(part: str, field: str) -> None:
    assert errors(job_with(**{part: {field: MAX_DURATION_TEXT}})) == []
    error = at(errors(job_with(**{part: {field: "99999999999999h"}})), f"spec.{part}.{field}")
    assert "must be at most 596523h14m7s" in error.message


def test_the_checkpoint_retention_is_bounded() -> None:
    job = job_with(recovery={"checkpoint": {"retainAfterFinish": "99999999999999h"}})
    assert "at most" in at(errors(job), "spec.recovery.checkpoint.retainAfterFinish").message


# -- money: [0, 1e9] USD with at most 6 decimals ------------------------------------------------------------


def test_max_cost_usd_is_at_most_a_billion() -> None:
    assert errors(job_with(maxCostUSD="1000000000")) == []
    assert errors(job_with(maxCostUSD="999999999.999999")) == []
    for bad in ("1000000000.000001", "99999999999999", "1" + "0" * 40):
        error = at(errors(job_with(maxCostUSD=bad)), "spec.maxCostUSD")
        assert error.reason == INV and "must be at most 1000000000" in error.message


def test_the_rate_cap_the_sweep_cap_and_a_budget_are_bounded() -> None:
    job = job_with(placement={"maxRateUSDPerHour": "99999999999999"})
    assert "at most 1000000000" in at(errors(job), "spec.placement.maxRateUSDPerHour").message
    sweep = full_sweep()
    sweep.spec.max_cost_usd = "1000000001"
    assert "spec.maxCostUSD" in {e.field for e in validate_sweep(sweep)}
    budget = Budget(metadata=ObjectMeta(name="b", namespace="p"), spec=BudgetSpec(monthly_usd="1e12"))
    assert [e.field for e in validate_budget(budget)] == ["spec.monthlyUSD"]
    budget.spec.monthly_usd = "99999999999999"
    (error,) = validate_budget(budget)
    assert (error.field, error.reason) == ("spec.monthlyUSD", INV) and "at most 1000000000" in error.message
    budget.spec.monthly_usd = "1000000000"
    assert validate_budget(budget) == []


# -- quantities: bytes in an int64, CPU in int32 millicores --------------------------------------------------


def test_quantities_are_bounded() -> None:
    ok = job_with(resources={"gpu": "H100:1", "memory": str(2**63 - 1), "cpu": "2147483647m"})
    assert errors(ok) == []
    job = minimal_job()
    job.spec.resources = Resources(
        gpu=GPURequest(type=["H100"], min_memory="8Ei"), memory="8Ei", disk="9" * 40, cpu="2147484"
    )
    errs = errors(job)
    for field in ("memory", "disk", "gpu.minMemory"):
        assert "at most 9223372036854775807 bytes" in at(errs, f"spec.resources.{field}").message
    assert "at most 2147483647m" in at(errs, "spec.resources.cpu").message


# -- a Sweep's template is a JobSpec: the same ranges at its own paths ---------------------------------------


def test_a_sweep_template_is_held_to_the_same_ranges() -> None:
    sweep = full_sweep()
    t = sweep.spec.template.spec
    t.ttl_seconds_after_finished = 2**63
    t.timeout = "99999999999999h"
    t.max_cost_usd = "99999999999999"
    t.placement = Placement(queue_timeout="99999999999999h", regions=["us", "eu"])
    for obj in (sweep, default_sweep(sweep)):
        fields = {e.field for e in validate_sweep(obj)}
        assert {
            "spec.template.spec.ttlSecondsAfterFinished",
            "spec.template.spec.timeout",
            "spec.template.spec.maxCostUSD",
            "spec.template.spec.placement.queueTimeout",
        } <= fields


def test_the_full_examples_stay_valid() -> None:
    assert validate_job(full_job()) == []
    assert validate_sweep(full_sweep()) == []


# -- the docs page shows the table --------------------------------------------------------------------------


def _doc_rows() -> dict[str, tuple[str, str]]:
    rows: dict[str, tuple[str, str]] = {}
    for line in DOC.read_text().splitlines():
        m = re.fullmatch(r"\| `([^`]+)` \| (.+?) \| (.+?) \|.*", line.strip())
        if m:
            rows.setdefault(m[1], (m[2].strip("` "), m[3].strip("` ")))
    return rows


def test_the_docs_page_has_every_range_of_the_table() -> None:
    documented = _doc_rows()
    for r in RANGES:
        assert r.field in documented, f"{r.field} is not in docs/errors/Invalid.md"
        assert documented[r.field] == (r.low, r.high), r.field
