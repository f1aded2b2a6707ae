"""The arithmetic of an estimate's money (ADR-031): exact micro-dollars, rounded up as the ledger rounds,
and billing's quote: holds, caps and the warnings it adds to the scheduler's estimate."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from nodus_billing.quoting import quote
from nodus_schema.costs import DurationBand, Estimate, EstimateWarning
from nodus_schema.estimating import (
    EstimateReply,
    EstimateRequest,
    QuoteRequest,
    SlotPlan,
    billed_millis,
    charge_for,
    member_hold_micros,
    minimum_charge_micros,
    price,
    run_cost_micros,
)
from nodus_schema.jobs import JobSpec
from nodus_schema.quantities import micros_to_usd
from nodus_schema.sweeps import SweepSpec

H100_SXM_US = 2_990_000  # µ$/h


def slot(rate: int | None, run: str = "2h", **kw: object) -> SlotPlan:
    p90 = {"2h": "3h0m0s", "30m": "45m0s", "10m": "15m0s"}[run]
    return SlotPlan(
        label="job",
        offering="o",
        rate_micros_per_hour=rate,
        run=DurationBand(p50=run, p90=p90),
        boot=DurationBand(p50="2m0s", p90="5m0s"),
        **kw,  # type: ignore[arg-type]
    )


def test_two_hours_of_an_h100_sxm_is_five_dollars_ninety_eight() -> None:
    assert micros_to_usd(run_cost_micros(H100_SXM_US, timedelta(hours=2), 1)) == "5.98"
    assert micros_to_usd(run_cost_micros(H100_SXM_US, timedelta(hours=3), 1)) == "8.97"


def test_time_is_billed_in_whole_seconds_rounded_up() -> None:
    assert billed_millis(timedelta(milliseconds=1)) == 1000
    assert billed_millis(timedelta(seconds=90)) == 90_000
    assert billed_millis(timedelta(0)) == 0


def test_the_minimum_charge_is_one_second_rounded_up() -> None:
    # 1 s at 2.99 $/h = 0.000830555… $ -> 831 µ$
    assert minimum_charge_micros(H100_SXM_US) == 831


def test_each_allocation_is_rounded_on_its_own() -> None:
    # 2 m at 2.99 $/h = 0.0996666… -> 99_667 µ$ per allocation, three times (not 299_000 rounded once).
    assert run_cost_micros(H100_SXM_US, timedelta(minutes=2), 3) == 299_001


def test_the_hold_is_the_p90_cost_or_an_hour_whichever_is_less() -> None:
    assert member_hold_micros(H100_SXM_US, timedelta(minutes=5), timedelta(minutes=45)) == charge_for(
        H100_SXM_US, timedelta(minutes=50)
    )
    assert member_hold_micros(H100_SXM_US, timedelta(minutes=5), timedelta(hours=3)) == H100_SXM_US


def test_price_of_a_job_with_parallel_indexes() -> None:
    money = price([slot(H100_SXM_US, completions=4, parallelism=2)])
    assert money is not None
    assert micros_to_usd(money.cost_p50) == "24.318668"  # 4 × (5.98 + 0.099667)
    assert (money.hold, money.concurrent_hold) == (2_990_000, 5_980_000)


def test_price_of_a_gang_counts_every_node() -> None:
    money = price([slot(23_920_000, nodes=2, assembly_timeout="15m0s", assembly_tries=3)])
    assert money is not None
    assert micros_to_usd(money.hold) == "47.84"  # two members, an hour each
    assert money.gang_hold == money.hold
    assert micros_to_usd(money.assembly_bound or 0) == "35.88"  # 15m × 2 nodes × 3 tries at 23.92 $/h


def test_a_sweep_holds_its_dearest_cells_at_once() -> None:
    cheap, dear = slot(790_000, "10m", cells=2), slot(H100_SXM_US, "10m", cells=1, first_cell=2)
    money = price([cheap, dear], max_parallel=2)
    assert money is not None
    # cell holds: min(p90 20m, 1h): L4 0.263334, H100 0.996667; the two dearest are one of each.
    assert micros_to_usd(money.concurrent_hold) == "1.260001"
    assert micros_to_usd(money.hold) == "0.996667"


def test_nothing_priceable_has_no_money() -> None:
    assert price([slot(None)]) is None


def _quote(spec: JobSpec | SweepSpec, slots: list[SlotPlan]) -> Estimate:
    kind = "Sweep" if isinstance(spec, SweepSpec) else "Job"
    request = EstimateRequest(
        namespace="p",
        kind=kind,
        job_spec=spec if isinstance(spec, JobSpec) else None,
        sweep_spec=spec if isinstance(spec, SweepSpec) else None,
    )
    scheduled = EstimateReply(estimate=Estimate(rate_usd_per_hour="2.99"), slots=slots)
    return quote(QuoteRequest(request=request, scheduled=scheduled)).estimate


def test_a_cap_below_the_hold_blocks_with_the_amounts() -> None:
    e = _quote(JobSpec(max_cost_usd="2.50"), [slot(H100_SXM_US)])
    (reason,) = e.blocking_reasons
    assert reason.code == "MaxCostReached"
    assert "2.50" in (reason.message or "") and "2.99" in (reason.message or "")


def test_a_cap_between_hold_and_cost_only_warns() -> None:
    e = _quote(JobSpec(max_cost_usd="7.00"), [slot(H100_SXM_US)])
    assert e.blocking_reasons == []
    assert [w.code for w in e.warnings] == ["MaxCostBelowEstimate", "BalanceNotChecked"]
    assert "may be reached (p90 cost 9.219167)" in (e.warnings[0].message or "")


def test_a_sweep_cap_below_the_concurrent_hold_limits_parallelism() -> None:
    sweep = SweepSpec(max_parallel=3, max_cost_usd="100.00")
    e = _quote(sweep, [slot(H100_SXM_US, cells=3)])
    assert [w.code for w in e.warnings] == ["BalanceNotChecked"]  # 3 × 2.99 fits under 100
    e = _quote(SweepSpec(max_parallel=3, max_cost_usd="5.00"), [slot(H100_SXM_US, cells=3)])
    assert "MaxCostLimitsParallelism" in [w.code for w in e.warnings]


def test_a_template_cap_is_checked_per_cell() -> None:
    e = _quote(SweepSpec(), [slot(H100_SXM_US, cells=2, max_cost_usd="1.00")])
    (reason,) = e.blocking_reasons
    assert reason.code == "MaxCostReached"
    assert (reason.message or "").startswith(
        "spec.template.spec.maxCostUSD 1.00 is below the first hold 2.99"
    )


def test_a_gang_cap_below_its_assembly_bound_warns() -> None:
    gang = slot(23_920_000, nodes=2, assembly_timeout="15m0s", assembly_tries=3)
    e = _quote(JobSpec(max_cost_usd="200.00"), [gang])  # hold 47.84 and cost p90 151.49 fit; 35.88 too
    assert [w.code for w in e.warnings] == ["BalanceNotChecked"]
    e = _quote(JobSpec(max_cost_usd="30.00"), [slot(23_920_000, "30m", nodes=2, assembly_timeout="15m0s")])
    # hold: 2 × min(45m + 5m, 1h) = 39.866668 > 30: blocked, so no warnings about the cap.
    assert [r.code for r in e.blocking_reasons] == ["MaxCostReached"]
    e = _quote(JobSpec(max_cost_usd="30.00"), [slot(23_920_000, "10m", nodes=2, assembly_timeout="15m0s")])
    # hold: 2 × (15m + 5m) = 15.946668 fits; the assembly bound 15m × 2 × 3 = 35.88 does not.
    codes = [w.code for w in e.warnings]
    assert "MaxCostBelowAssemblyBound" in codes and codes[-1] == "BalanceNotChecked"
    (note,) = [w for w in e.warnings if w.code == "MaxCostBelowAssemblyBound"]
    assert note.message == (
        "spec.maxCostUSD 30.00 is below the assembly bound 35.88: gangs that keep failing to assemble may "
        "reach it before the Job fails"
    )


def test_the_quote_keeps_the_schedulers_notes_and_prices_an_interruptible_rate() -> None:
    request = EstimateRequest(namespace="p", kind="Job", job_spec=JobSpec())
    scheduled = EstimateReply(
        estimate=Estimate(
            rate_usd_per_hour="1.495",
            warnings=[EstimateWarning(code="InterruptibleSelected", message="reclaimable")],
        ),
        slots=[slot(1_495_000, interruptible=True)],
    )
    e = quote(QuoteRequest(request=request, scheduled=scheduled)).estimate
    assert [w.code for w in e.warnings] == ["InterruptibleSelected", "BalanceNotChecked"]
    assert e.cost_usd is not None and e.cost_usd.p50 == "3.039834"  # 2h (2.99) + 2m (0.049834)
    assert (e.hold_usd, e.minimum_charge_usd) == ("1.495", "0.000416")


def test_money_is_decimal_text_never_a_float() -> None:
    e = _quote(JobSpec(), [slot(H100_SXM_US, completions=3)])
    amounts = [e.hold_usd, e.concurrent_hold_usd, e.minimum_charge_usd]
    amounts += [e.cost_usd.p50, e.cost_usd.p90] if e.cost_usd else []
    assert all(isinstance(a, str) and Decimal(a) == Decimal(a).quantize(Decimal("0.000001")) for a in amounts)
