"""A Pipeline's one cap over every stage (issue #22): the third level of caps in the book, over a Job's own
and its Sweep's. Each rule, the puts the meter makes from controller ownerReferences, the block's words,
the quote, and by property: whatever is held under a Pipeline never passes its cap, and neither a hold nor
an extension ever passes any level's cap, ``room_for`` being exact over all three."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodus_billing.books import Step
from nodus_billing.holding import (
    Capture,
    Charge,
    ExtendHold,
    Grant,
    Op,
    PlaceHold,
    PutJob,
    PutPipeline,
    PutSweep,
    apply,
    decode,
    encode,
)
from nodus_billing.metering import _block
from nodus_billing.putting import pipeline_ref_of, puts
from nodus_billing.quoting import quote
from nodus_billing.repairing import repair
from nodus_billing.standing import (
    Result,
    State,
    binding_cap,
    caps_over,
    job_held,
    job_spent,
    month_of,
    pipeline_held,
    pipeline_jobs,
    pipeline_spent,
    resumable,
    room_for,
    siblings,
    suspensions,
)
from nodus_kit import errors
from nodus_schema.costs import DurationBand, Estimate
from nodus_schema.estimating import EstimateReply, EstimateRequest, PipelineCap, QuoteRequest, SlotPlan
from nodus_schema.jobs import Job, JobSpec
from nodus_schema.meta import ObjectMeta, OwnerReference
from nodus_schema.pipelines import Pipeline, PipelineSpec
from nodus_schema.sweeps import Sweep, SweepSpec

JAN = 1_767_225_600_000  # 2026-01-01T00:00:00Z
PL = "pl@u1"


def run(state: State, *ops: Op) -> tuple[State, Result]:
    result = Result(op_id="")
    for op in ops:
        state, result, _ = apply(state, op)
    return state, result


def hold(hold_id: str, amount: int, job: str, at: int = JAN) -> PlaceHold:
    return PlaceHold(hold_id=hold_id, job=job, amount_micros=amount, funded_until_ms=at + 60_000, at_ms=at)


def three_levels(
    pipeline_cap: int | None = 100, sweep_cap: int | None = 80, job_cap: int | None = 60
) -> State:
    """A Pipeline with a Job stage ``train`` and a Sweep stage ``grid`` of two cells; plenty of credits."""
    state, result = run(
        State(),
        Grant(grant_id="g", project="p", amount_micros=10_000),
        PutPipeline(name=PL, project="p", generation=1, max_cost_micros=pipeline_cap),
        PutJob(name="train@u2", project="p", generation=1, pipeline=PL, max_cost_micros=job_cap),
        PutSweep(name="grid@u3", project="p", generation=1, pipeline=PL, max_cost_micros=sweep_cap),
        PutJob(name="grid-0@u4", project="p", generation=1, sweep="grid@u3"),
        PutJob(name="grid-1@u5", project="p", generation=1, sweep="grid@u3", max_cost_micros=job_cap),
        PutJob(name="alone@u6", project="p", generation=1),
    )
    assert result.ok
    return state


# -- the book ---------------------------------------------------------------------------------------------


def test_every_stage_and_every_cell_counts_against_the_pipelines_one_cap() -> None:
    state = three_levels()
    assert sorted(pipeline_jobs(state, PL)) == ["grid-0@u4", "grid-1@u5", "train@u2"]
    state, _ = run(state, hold("a", 30, "train@u2"), hold("b", 25, "grid-0@u4"))
    state, _ = run(state, Capture(hold_id="a", amount_micros=20))  # 20 spent, 10 released
    assert (pipeline_spent(state, PL), pipeline_held(state, PL)) == (20, 25)
    # grid-1: its own cap 60, the Sweep's 80 - 25 = 55, the Pipeline's 100 - 45 = 55 (the Sweep's first).
    assert room_for(state, "grid-1@u5", "2026-01") == (55, "MaxCostReached")
    assert [c.kind for c in caps_over(state, "grid-1@u5")] == ["Job", "Sweep", "Pipeline"]
    capped = binding_cap(state, "grid-1@u5", 55)
    assert capped is not None and capped.kind == "Sweep"  # a tie goes to the inner cap, as apply checks it
    state, result = run(state, hold("c", 40, "train@u2"))  # train: its cap leaves 40, the Pipeline 55
    assert result.ok
    # Now the Pipeline leaves 100 - 20 - 25 - 40 = 15: it binds every stage, cells included.
    for job in ("train@u2", "grid-0@u4", "grid-1@u5"):
        room, code = room_for(state, job, "2026-01")
        capped = binding_cap(state, job, room)
        assert (room, code) == (15 if job != "train@u2" else 0, "MaxCostReached")
        assert capped is not None and capped.kind == ("Job" if job == "train@u2" else "Pipeline")
    state, result = run(state, hold("d", 16, "grid-0@u4"))
    assert (result.ok, result.code) == (False, "MaxCostReached")
    assert "pipeline pl@u1 has maxCostUSD $0.0001; $0.000085 is spent or held" in (result.message or "")
    assert (result.fix or "").startswith("raise maxCostUSD of pipeline pl@u1 to at least $0.000101")
    state, result = run(state, hold("d", 15, "grid-0@u4"))
    assert result.ok and pipeline_spent(state, PL) + pipeline_held(state, PL) == 100
    # A Job under no Pipeline is not bound by it.
    assert room_for(state, "alone@u6", "2026-01") == (10_000 - 20 - 25 - 40 - 15, "InsufficientCredits")


def test_an_extension_is_judged_against_the_pipeline_too() -> None:
    state = three_levels(pipeline_cap=50, sweep_cap=None, job_cap=None)
    state, _ = run(state, hold("a", 20, "train@u2"), hold("b", 20, "grid-0@u4"))
    more = ExtendHold(hold_id="a", more_micros=11, funded_until_ms=JAN + 120_000)
    state, result = run(state, more)
    assert (result.ok, result.code) == (False, "MaxCostReached")
    state, result = run(state, msgspec.structs.replace(more, more_micros=10))
    assert result.ok and job_held(state, "train@u2") == 30


def test_raising_the_pipelines_cap_is_a_new_generation_and_a_late_put_never_undoes_it() -> None:
    state = three_levels(pipeline_cap=10, sweep_cap=None, job_cap=None)
    state, _ = run(state, hold("a", 10, "train@u2"))
    assert room_for(state, "grid-0@u4", "2026-01") == (0, "MaxCostReached")
    assert not resumable(state, "grid-0@u4", 1)
    assert [(s.kind, s.name) for s in suspensions(state, 1)] == [
        ("Pipeline", PL),
        ("Job", "grid-0@u4"),
        ("Job", "grid-1@u5"),
        ("Job", "train@u2"),
    ]
    (cell,) = [s for s in suspensions(state, 1) if s.name == "grid-0@u4"]
    assert "of pipeline pl@u1" in cell.message and "raise the maxCostUSD of pipeline pl@u1" in cell.fix
    state, result = run(state, PutPipeline(name=PL, project="p", generation=2, max_cost_micros=30))
    assert result.ok and room_for(state, "grid-0@u4", "2026-01") == (20, "MaxCostReached")
    assert resumable(state, "grid-0@u4", 1)
    state, _ = run(state, PutPipeline(name=PL, project="p", generation=1, max_cost_micros=10))  # late
    assert state.pipelines[PL].max_cost_micros == 30
    state, _ = run(state, PutPipeline(name=PL, project="p", generation=3))  # the cap removed
    assert room_for(state, "grid-0@u4", "2026-01") == (10_000 - 10, "InsufficientCredits")


def test_a_stages_pipeline_must_be_known_and_never_changes() -> None:
    state = three_levels()
    _, result = run(state, PutJob(name="x@u9", project="p", generation=1, pipeline="other@u0"))
    assert (result.code, result.fix) == ("NotFound", "put the Pipeline before its stages")
    _, result = run(state, PutSweep(name="s@u9", project="p", generation=1, pipeline="other@u0"))
    assert result.code == "NotFound"
    _, result = run(state, PutJob(name="x@u9", project="q", generation=1, pipeline=PL))
    assert result.code == "NotFound"  # another project's Pipeline
    _, result = run(state, PutJob(name="x@u9", project="p", generation=1, sweep="grid@u3", pipeline=PL))
    assert result.code == "Invalid"  # a cell is under its Sweep's Pipeline
    _, result = run(state, PutJob(name="train@u2", project="p", generation=2))
    assert (result.code, result.fix) == ("Conflict", "a Job's project, Sweep and Pipeline never change")
    _, result = run(state, PutJob(name="alone@u6", project="p", generation=2, pipeline=PL))
    assert result.code == "Conflict"
    _, result = run(state, PutSweep(name="grid@u3", project="p", generation=2))
    assert (result.code, result.fix) == ("Conflict", "a Sweep's Pipeline never changes")
    _, result = run(state, PutPipeline(name=PL, project="q", generation=2))
    assert result.code == "Conflict"


def test_a_pipeline_cap_beyond_the_books_bound_is_no_cap_and_a_negative_one_is_zero() -> None:
    state, _ = run(three_levels(), PutPipeline(name=PL, project="p", generation=2, max_cost_micros=10**20))
    assert state.pipelines[PL].max_cost_micros is None
    state, _ = run(state, PutPipeline(name=PL, project="p", generation=3, max_cost_micros=-5))
    assert state.pipelines[PL].max_cost_micros == 0
    _, result = run(state, PutPipeline(name=PL, project="p", generation=10**19))
    assert result.code == "Invalid"


def test_a_pipeline_cap_an_older_version_could_not_hold_is_repaired_to_no_cap() -> None:
    poisoned = decode(
        b'{"pipelines":{"pl@u1":{"project":"p","maxCostMicros":100000000000000000000,"generation":1}},'
        b'"jobs":{"j@u2":{"project":"p","pipeline":"pl@u1"}}}'
    )
    state, repairs = repair(poisoned, JAN)
    assert state.pipelines[PL].max_cost_micros is None
    assert [(r.path, r.now) for r in repairs] == [("pipelines.pl@u1.maxCostMicros", None)]


def test_an_old_book_without_pipelines_reads_and_behaves_as_before() -> None:
    # A book as billing wrote it before Pipelines (issue #22): no pipelines, no pipeline fields.
    old = (
        b'{"sweeps":{"s@1":{"project":"p","maxCostMicros":50,"generation":1}},"jobs":{"c@2":{"project":"p",'
        b'"sweep":"s@1","generation":1}},"ledger":{"grant:g":{"id":"grant:g","source":"credits:issued",'
        b'"target":"project:p:available","amountMicros":100}},"balances":{"credits:issued":-100,'
        b'"project:p:available":100}}'
    )
    state = decode(old)
    assert state.pipelines == {} and state.jobs["c@2"].pipeline is None
    assert encode(state) == old, "a book without Pipelines is written as it was"
    assert room_for(state, "c@2", "2026-01") == (50, "MaxCostReached")
    state, result = run(state, hold("h", 50, "c@2"))
    assert result.ok and b"pipeline" not in encode(state)


def test_siblings_are_the_jobs_one_sweeps_or_pipelines_cap_binds_together() -> None:
    state = three_levels()
    assert siblings(state, "train@u2") == ["grid-0@u4", "grid-1@u5"]
    assert siblings(state, "grid-0@u4") == ["train@u2", "grid-1@u5"]
    assert siblings(state, "alone@u6") == []


# -- the property: no level's cap is ever passed ----------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    pipeline_cap: int | None
    sweep_cap: int | None
    job_caps: tuple[int | None, ...]
    credits: int


caps = st.none() | st.integers(min_value=0, max_value=300)
shapes = st.builds(
    Shape,
    pipeline_cap=caps,
    sweep_cap=caps,
    job_caps=st.tuples(caps, caps, caps, caps),
    credits=st.integers(min_value=0, max_value=1_000),
)
JOBS = ("stage-a@1", "stage-b@2", "cell-0@3", "cell-1@4")


def build(shape: Shape) -> State:
    """Two Job stages and a Sweep stage of two cells under one Pipeline, each level capped or not."""
    a, b, c0, c1 = shape.job_caps
    grants = [Grant(grant_id="g", project="p", amount_micros=shape.credits)] if shape.credits else []
    state, _ = run(
        State(),
        *grants,
        PutPipeline(name=PL, project="p", generation=1, max_cost_micros=shape.pipeline_cap),
        PutSweep(name="sw@5", project="p", generation=1, pipeline=PL, max_cost_micros=shape.sweep_cap),
        PutJob(name=JOBS[0], project="p", generation=1, pipeline=PL, max_cost_micros=a),
        PutJob(name=JOBS[1], project="p", generation=1, pipeline=PL, max_cost_micros=b),
        PutJob(name=JOBS[2], project="p", generation=1, sweep="sw@5", max_cost_micros=c0),
        PutJob(name=JOBS[3], project="p", generation=1, sweep="sw@5", max_cost_micros=c1),
    )
    return state


def assert_under_every_cap(state: State) -> None:
    """Spent + held under each level, worked out here from the balances (not by ``caps_over``)."""
    committed = {job: job_spent(state, job) + job_held(state, job) for job in JOBS}
    for job in JOBS:
        cap = state.jobs[job].max_cost_micros
        assert cap is None or committed[job] <= cap, (job, committed[job], cap)
    sweep = state.sweeps["sw@5"].max_cost_micros
    assert sweep is None or committed[JOBS[2]] + committed[JOBS[3]] <= sweep
    pipeline = state.pipelines[PL].max_cost_micros
    assert pipeline is None or sum(committed.values()) <= pipeline
    assert pipeline_spent(state, PL) + pipeline_held(state, PL) == sum(committed.values())


@settings(max_examples=300, deadline=None)
@given(
    shape=shapes,
    steps=st.lists(
        st.tuples(
            st.sampled_from(("hold", "extend", "charge", "capture")),
            st.sampled_from(JOBS),
            st.integers(min_value=0, max_value=3),  # beyond room_for by this much (0: exactly)
            st.integers(min_value=0, max_value=100),
        ),
        max_size=25,
    ),
)
def test_holds_and_extensions_never_pass_any_levels_cap(
    shape: Shape, steps: list[tuple[str, str, int, int]]
) -> None:
    """room_for is exact over the Job's, the Sweep's and the Pipeline's caps and the credits: what it
    leaves always fits, a micro-dollar more never does, and what is held under the Pipeline (its Sweep
    stage's cells included) never passes its cap."""
    state = build(shape)
    for serial, (kind, job, beyond, amount) in enumerate(steps, start=1):
        opened = [h for h, hold_ in state.holds.items() if hold_.status == "Open" and hold_.job == job]
        if kind == "hold" or (kind == "extend" and opened):
            target = opened[0] if kind == "extend" else None
            month, labels = month_of(JAN), None
            if target is not None:
                month, labels = state.holds[target].month, state.holds[target].labels
            room, code = room_for(state, job, month, labels)
            size = room + beyond
            op: Op = (
                hold(f"h{serial}", size, job)
                if target is None
                else ExtendHold(hold_id=target, more_micros=size, funded_until_ms=JAN + 60_000 + serial)
            )
            # apply checks the caps (innermost first) before the credits: a size over a cap is refused at
            # the cap even when the credits leave less (room_for names the least room, here the credits).
            over_a_cap = any(max(c.room, 0) < size for c in caps_over(state, job))
            expected = "MaxCostReached" if over_a_cap else code
            state, result = run(state, op)
            fits = size <= room and (size > 0 or target is not None)
            assert result.ok == fits, (op, room, code, result)
            assert result.ok or result.code == (expected if beyond else "Invalid") or size == 0
        elif kind == "charge" and opened:
            state, _ = run(state, Charge(hold_id=opened[0], tick=str(serial), amount_micros=amount))
        elif kind == "capture" and opened:
            state, _ = run(state, Capture(hold_id=opened[-1], amount_micros=amount // 2))
        assert_under_every_cap(state)
        assert job_spent(state, job) >= 0


# -- the meter's puts: controller ownerReferences only ----------------------------------------------------


def owner(kind: str, name: str, uid: str, controller: bool = True) -> OwnerReference:
    return OwnerReference(api_version="nodus.dev/v1", kind=kind, name=name, uid=uid, controller=controller)


def a_job(name: str, *refs: OwnerReference, gen: int = 1) -> Job:
    meta = ObjectMeta(name=name, namespace="p", uid=f"u-{name}", generation=gen, owner_references=list(refs))
    return Job(metadata=meta, spec=JobSpec(max_cost_usd="0.5"))


def a_pipeline(cap: str | None = "1.25", gen: int = 1) -> Pipeline:
    meta = ObjectMeta(name="pl", namespace="p", uid="u1", generation=gen)
    return Pipeline(metadata=meta, spec=PipelineSpec(max_cost_usd=cap))


def applied(state: State, steps: list[Step]) -> tuple[State, list[Op]]:
    ops: list[Op] = []
    for step in steps:
        op = step(state) if callable(step) else step
        if op is not None:
            state, result, _ = apply(state, op)
            assert result.ok, result
            ops.append(op)
    return state, ops


def test_a_job_stage_goes_under_its_controllers_pipeline() -> None:
    job = a_job("pl-train", owner("Pipeline", "pl", "u1"))
    assert pipeline_ref_of(job, None) == "pl@u1"
    state, ops = applied(State(), puts(job, None, a_pipeline()))
    assert [type(op).__name__ for op in ops] == ["PutPipeline", "PutJob"]
    assert state.pipelines["pl@u1"].max_cost_micros == 1_250_000
    assert state.jobs["pl-train@u-pl-train"].pipeline == "pl@u1"
    # Its cap raised: a new generation is put again (and only then).
    state, ops = applied(state, puts(job, None, a_pipeline("3", gen=2)))
    assert [type(op).__name__ for op in ops] == ["PutPipeline"]
    assert state.pipelines["pl@u1"].max_cost_micros == 3_000_000
    assert applied(state, puts(job, None, a_pipeline("3", gen=2)))[1] == []


def test_a_plain_reference_to_a_pipeline_never_puts_a_job_under_its_cap() -> None:
    job = a_job("sneaky", owner("Pipeline", "pl", "u1", controller=False))
    assert pipeline_ref_of(job, None) is None
    state, _ = applied(State(), puts(job, None, None))
    assert state.jobs["sneaky@u-sneaky"].pipeline is None and state.pipelines == {}
    job = a_job("other", owner("Sweep", "s", "u7", controller=False), owner("Pipeline", "pl", "u1"))
    assert pipeline_ref_of(job, None) == "pl@u1"  # the controller counts, not the first reference


def test_a_cell_is_under_its_sweeps_pipeline_through_its_sweep() -> None:
    sweep = Sweep(
        metadata=ObjectMeta(
            name="pl-grid",
            namespace="p",
            uid="u3",
            generation=1,
            owner_references=[owner("Pipeline", "pl", "u1")],
        ),
        spec=SweepSpec(max_cost_usd="1"),
    )
    cell = a_job("pl-grid-0", owner("Sweep", "pl-grid", "u3"))
    assert pipeline_ref_of(cell, sweep) == "pl@u1"
    assert pipeline_ref_of(cell, None) is None  # its Sweep gone: the book keeps what it knows
    state, ops = applied(State(), puts(cell, sweep, a_pipeline()))
    assert [type(op).__name__ for op in ops] == ["PutPipeline", "PutSweep", "PutJob"]
    assert state.sweeps["pl-grid@u3"].pipeline == "pl@u1"
    assert state.jobs["pl-grid-0@u-pl-grid-0"].pipeline is None  # through its Sweep
    assert pipeline_jobs(state, "pl@u1") == ["pl-grid-0@u-pl-grid-0"]


def test_a_pipeline_gone_before_billing_knew_it_is_left_out_and_one_it_knew_stays() -> None:
    job = a_job("pl-a", owner("Pipeline", "pl", "u1"))
    state, _ = applied(State(), puts(job, None, None))  # deleted: its stages are being deleted too
    assert state.jobs["pl-a@u-pl-a"].pipeline is None
    state, _ = applied(State(), puts(job, None, a_pipeline()))
    later = a_job("pl-b", owner("Pipeline", "pl", "u1"))
    state, _ = applied(state, puts(later, None, None))  # gone now, but in the book: its cap still binds
    assert state.jobs["pl-b@u-pl-b"].pipeline == "pl@u1"


# -- the block's words ------------------------------------------------------------------------------------


def test_the_block_names_the_pipelines_cap_when_it_binds() -> None:
    state = three_levels(pipeline_cap=100_000, sweep_cap=None, job_cap=None)
    state, _ = run(state, Grant(grant_id="g2", project="p", amount_micros=1_000_000))
    state, _ = run(state, hold("a", 99_000, "train@u2"))
    room, code = room_for(state, "grid-0@u4", "2026-01")
    assert (room, code) == (1_000, "MaxCostReached")
    block = _block(state, "grid-0@u4", code, room, 3_600_000, 60_000)
    assert block.message == (
        "$0.001 is left under the spec.maxCostUSD of pipeline pl ($0.10): not enough to keep running"
    )
    assert block.fix == "Raise spec.maxCostUSD of pipeline pl by at least $0.01 to resume it."
    # The Job's own cap, when it binds first, is named instead (as before Pipelines).
    state = three_levels(pipeline_cap=100_000, sweep_cap=None, job_cap=500)
    block = _block(state, "train@u2", "MaxCostReached", 500, 3_600_000, 60_000)
    assert block.fix == "Raise spec.maxCostUSD of job train by at least $0.01 to resume it."


# -- the quote --------------------------------------------------------------------------------------------

H100 = 2_990_000  # µ$/h


def stage_quote(pipeline: PipelineCap | None, state: State | None = None) -> Estimate:
    request = EstimateRequest(namespace="p", kind="Job", job_spec=JobSpec())
    slot = SlotPlan(
        label="job",
        offering="o",
        rate_micros_per_hour=H100,
        run=DurationBand(p50="10m", p90="15m0s"),
        boot=DurationBand(p50="2m0s", p90="5m0s"),
    )
    scheduled = EstimateReply(estimate=Estimate(rate_usd_per_hour="2.99"), slots=[slot])
    return quote(QuoteRequest(request=request, scheduled=scheduled, pipeline=pipeline), state).estimate


def test_a_stages_first_hold_is_quoted_under_what_the_pipelines_cap_leaves() -> None:
    assert stage_quote(None).hold_usd == "0.498334"  # a full window: no Pipeline named
    e = stage_quote(PipelineCap(name="pl", max_cost_usd="0.10"))
    assert (e.hold_usd, e.blocking_reasons) == ("0.10", [])
    assert "MaxCostLimitsHold" in [w.code for w in e.warnings]
    assert "MaxCostBelowEstimate" not in [w.code for w in e.warnings]  # the Pipeline's estimate says it
    # What its stages spent and hold is read from the book by the Pipeline's uid.
    state = three_levels(pipeline_cap=None, sweep_cap=None, job_cap=None)
    state, _ = run(state, Grant(grant_id="g2", project="p", amount_micros=1_000_000))
    state, _ = run(state, hold("a", 60_000, "train@u2"))
    e = stage_quote(PipelineCap(name="pl", uid="u1", max_cost_usd="0.10"), state)
    assert e.hold_usd == "0.04"
    assert "what spec.maxCostUSD of pipeline pl leaves 0.04" in " ".join(w.message or "" for w in e.warnings)
    e = stage_quote(PipelineCap(name="pl", uid="u1", max_cost_usd="0.0605"), state)
    (reason,) = e.blocking_reasons
    assert reason.code == "MaxCostReached"
    assert reason.message == (
        "spec.maxCostUSD of pipeline pl (0.0605, of which 0.06 is spent or held by its stages) leaves "
        "0.0005, below the minimum charge 0.000831 of one index (one billing increment at its rate): not "
        "even one slot could start"
    )
    assert (reason.fix or "").startswith("Raise spec.maxCostUSD of pipeline pl to at least 0.060831;")
    assert stage_quote(PipelineCap(name="pl")).hold_usd == "0.498334"  # no cap: nothing to size


@pytest.mark.parametrize("cap", ["abc", "1e3"])
def test_a_pipeline_cap_that_does_not_parse_is_invalid_with_a_sentence(cap: str) -> None:
    with pytest.raises(errors.Invalid, match=r"spec\.maxCostUSD of pipeline pl"):
        stage_quote(PipelineCap(name="pl", max_cost_usd=cap))
