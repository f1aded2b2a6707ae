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
    minimum_charge_micros,
    price,
    run_cost_micros,
)
from nodus_schema.holds import HOLD_WINDOW_MS, hold_micros, holds_in_turn, minimum_hold_micros
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


def test_the_hold_is_billings_window_at_the_rate_and_never_more_than_is_left() -> None:
    # Ten minutes at 2.99 $/h = 0.4983333… -> 498_334 µ$, whatever the run's duration: the same rule as
    # billing's real hold, so the estimate's holdUSD is the first real hold.
    assert HOLD_WINDOW_MS == 600_000
    assert hold_micros(H100_SXM_US) == charge_for(H100_SXM_US, timedelta(minutes=10)) == 498_334
    assert hold_micros(H100_SXM_US, room=10_000) == 10_000  # a $0.01 cap holds $0.01
    assert hold_micros(H100_SXM_US, room=831) == 831 == minimum_hold_micros(H100_SXM_US)
    assert hold_micros(H100_SXM_US, room=830) == 0  # less than one billing increment: cannot start
    assert hold_micros(H100_SXM_US, room=0) == 0


def test_holds_that_start_together_are_sized_in_turn_to_what_is_left() -> None:
    assert holds_in_turn([125_000, 125_000], 138_500) == [125_000, 13_500]
    assert holds_in_turn([125_000, 125_000], 250_000) == [125_000, 125_000]
    assert holds_in_turn([125_000, 125_000, 125_000], 250_000) == [125_000, 125_000, 0]
    assert holds_in_turn([125_000, 125_000], None) == [125_000, 125_000]
    assert holds_in_turn([125_000, 125_000], 125_100, [209, 209]) == [125_000, 0]  # 100 µ$ < 1 s


def test_price_of_a_job_with_parallel_indexes() -> None:
    money = price([slot(H100_SXM_US, completions=4, parallelism=2)])
    assert money is not None
    assert micros_to_usd(money.cost_p50) == "24.318668"  # 4 × (5.98 + 0.099667)
    assert (money.hold, money.concurrent_hold) == (498_334, 996_668)


def test_price_of_a_gang_counts_every_node() -> None:
    money = price([slot(23_920_000, nodes=2, assembly_timeout="15m0s", assembly_tries=3)])
    assert money is not None
    assert micros_to_usd(money.hold) == "7.973334"  # two members, ten minutes each
    assert money.gang_hold == money.hold
    assert money.least == 2 * minimum_hold_micros(23_920_000)  # one second on each node
    assert micros_to_usd(money.assembly_bound or 0) == "35.88"  # 15m × 2 nodes × 3 tries at 23.92 $/h


def test_a_sweep_holds_its_dearest_cells_at_once() -> None:
    cheap, dear = slot(790_000, "10m", cells=2), slot(H100_SXM_US, "10m", cells=1, first_cell=2)
    money = price([cheap, dear], max_parallel=2)
    assert money is not None
    # cell holds: ten minutes each: L4 0.131667, H100 0.498334; the two dearest are one of each.
    assert micros_to_usd(money.concurrent_hold) == "0.630001"
    assert micros_to_usd(money.hold) == "0.498334"


def test_the_window_is_billings() -> None:
    money = price([slot(H100_SXM_US)], window_ms=60_000)
    assert money is not None and money.hold == charge_for(H100_SXM_US, timedelta(minutes=1))


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


def test_a_cap_below_the_window_runs_with_a_hold_of_the_cap() -> None:
    # The issue's $2 cap on an H100 ($2.99/h): a ceiling, not a deposit. It runs ~40 minutes.
    e = _quote(JobSpec(max_cost_usd="2.00"), [slot(H100_SXM_US)])
    assert e.blocking_reasons == []
    assert (e.hold_usd, e.concurrent_hold_usd) == ("0.498334", "0.498334")
    e = _quote(JobSpec(max_cost_usd="0.01"), [slot(H100_SXM_US)])
    assert e.blocking_reasons == []
    assert (e.hold_usd, e.concurrent_hold_usd) == ("0.01", "0.01")
    assert "MaxCostLimitsHold" in [w.code for w in e.warnings]


def test_only_a_cap_below_one_billing_increment_blocks_with_the_amounts() -> None:
    e = _quote(JobSpec(max_cost_usd="0.0008"), [slot(H100_SXM_US)])
    (reason,) = e.blocking_reasons
    assert reason.code == "MaxCostReached"
    assert "0.0008" in (reason.message or "") and "0.000831" in (reason.message or "")
    assert "0.000831" in (reason.fix or "")
    assert [
        r.code for r in _quote(JobSpec(max_cost_usd="0.00083"), [slot(H100_SXM_US)]).blocking_reasons
    ] == ["MaxCostReached"]
    assert _quote(JobSpec(max_cost_usd="0.000831"), [slot(H100_SXM_US)]).blocking_reasons == []


def test_a_cap_between_hold_and_cost_only_warns() -> None:
    e = _quote(JobSpec(max_cost_usd="7.00"), [slot(H100_SXM_US)])
    assert e.blocking_reasons == []
    assert [w.code for w in e.warnings] == ["MaxCostBelowEstimate", "BalanceNotChecked"]
    assert "may be reached (p90 cost 9.219167)" in (e.warnings[0].message or "")


def test_a_sweep_cap_below_the_concurrent_hold_limits_parallelism() -> None:
    sweep = SweepSpec(max_parallel=3, max_cost_usd="100.00")
    e = _quote(sweep, [slot(H100_SXM_US, cells=3)])
    assert [w.code for w in e.warnings] == ["BalanceNotChecked"]  # 3 × 0.498334 fits under 100
    assert e.concurrent_hold_usd == "1.495002"
    e = _quote(SweepSpec(max_parallel=3, max_cost_usd="1.00"), [slot(H100_SXM_US, cells=3)])
    assert "MaxCostLimitsParallelism" in [w.code for w in e.warnings]
    # The real holds: two full windows, then the 0.003332 left.
    assert (e.hold_usd, e.concurrent_hold_usd) == ("0.498334", "1.00")


def test_a_sweep_capped_at_its_concurrent_hold_funds_every_slot() -> None:
    # The A10G Sweep: maxParallel 2, a cap equal to concurrentHoldUSD starts both slots whole.
    a10g = 1_006_000
    free = _quote(SweepSpec(max_parallel=2), [slot(a10g, "10m", cells=4)])
    assert free.concurrent_hold_usd == micros_to_usd(2 * hold_micros(a10g))
    capped = _quote(
        SweepSpec(max_parallel=2, max_cost_usd=free.concurrent_hold_usd), [slot(a10g, "10m", cells=4)]
    )
    assert (capped.hold_usd, capped.concurrent_hold_usd) == (free.hold_usd, free.concurrent_hold_usd)
    assert capped.blocking_reasons == []
    assert [w.code for w in capped.warnings if w.code and w.code.startswith("MaxCost")] == [
        "MaxCostBelowEstimate"
    ]


def test_a_template_cap_is_checked_per_cell() -> None:
    e = _quote(SweepSpec(), [slot(H100_SXM_US, cells=2, max_cost_usd="0.0005")])
    (reason,) = e.blocking_reasons
    assert reason.code == "MaxCostReached"
    assert (reason.message or "").startswith(
        "spec.template.spec.maxCostUSD 0.0005 is below the minimum charge 0.000831"
    )
    e = _quote(SweepSpec(max_parallel=2), [slot(H100_SXM_US, cells=2, max_cost_usd="0.10")])
    assert e.blocking_reasons == []
    assert (e.hold_usd, e.concurrent_hold_usd) == ("0.10", "0.20")  # each cell's hold is its own cap


def test_a_gang_cap_below_its_assembly_bound_warns() -> None:
    gang = slot(23_920_000, nodes=2, assembly_timeout="15m0s", assembly_tries=3)
    e = _quote(JobSpec(max_cost_usd="200.00"), [gang])  # hold 7.973334 and cost p90 151.49 fit; 35.88 too
    assert [w.code for w in e.warnings] == ["BalanceNotChecked"]
    e = _quote(JobSpec(max_cost_usd="0.01"), [slot(23_920_000, "30m", nodes=2, assembly_timeout="15m0s")])
    # least: one second on each of the two nodes, 2 × 0.006645 = 0.01329 > 0.01: blocked, no cap warnings.
    assert [r.code for r in e.blocking_reasons] == ["MaxCostReached"]
    e = _quote(JobSpec(max_cost_usd="30.00"), [slot(23_920_000, "10m", nodes=2, assembly_timeout="15m0s")])
    # hold: 2 × 10m = 7.973334 fits; the assembly bound 15m × 2 × 3 = 35.88 does not.
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
    assert (e.hold_usd, e.minimum_charge_usd) == ("0.249167", "0.000416")  # ten minutes at 1.495 $/h


def test_money_is_decimal_text_never_a_float() -> None:
    e = _quote(JobSpec(), [slot(H100_SXM_US, completions=3)])
    amounts = [e.hold_usd, e.concurrent_hold_usd, e.minimum_charge_usd]
    amounts += [e.cost_usd.p50, e.cost_usd.p90] if e.cost_usd else []
    assert all(isinstance(a, str) and Decimal(a) == Decimal(a).quantize(Decimal("0.000001")) for a in amounts)


def test_a_slot_the_cap_leaves_less_than_a_second_of_gets_no_hold_in_the_estimate_either() -> None:
    # 2 × 0.498334 + 0.0005 (below the 0.000831 a slot starts with): billing places two holds, not three.
    e = _quote(SweepSpec(max_parallel=3, max_cost_usd="0.997168"), [slot(H100_SXM_US, cells=3)])
    assert e.concurrent_hold_usd == "0.996668"
