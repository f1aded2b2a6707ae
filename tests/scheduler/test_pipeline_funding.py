"""A Pipeline's one dollar cap over its stages (issue #22), with the real scheduler and the real billing:
two Job stages running under the Pipeline's ``spec.maxCostUSD`` are both suspended with MaxCostReached when
the shared cap is reached, with the Pipeline named in their message and fix; what they were charged stays
within the cap; and raising the cap (a new generation of the Pipeline) resumes both.

The Pipeline controller is not part of this rig: the test writes the Pipeline into the ``pipelines`` bucket
and its stages' Jobs into ``jobs`` as that controller creates them (``<pipeline>-<stage>``, labelled, with a
controller ownerReference to the Pipeline). A third Job that only *refers* to the Pipeline (a plain
ownerReference, as a user may write one) is not under its cap and runs on.

Billing's resync is set far beyond the test: nothing in it waits for a periodic pass. That a Pipeline's new
generation wakes the Jobs under it (its Job stages and its Sweep stages' cells, found by their controller)
is shown on its own, deterministically, by the second test.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from nodus_billing.books import Books
from nodus_billing.putting import job_ref
from nodus_billing.service import BillingService
from nodus_billing.standing import pipeline_held, pipeline_jobs, pipeline_spent
from nodus_kit import messaging
from nodus_kit.keying import Event
from nodus_kit.storing import ObjectStore
from nodus_schema.billing import HOLD_SUBJECT, HoldReply, HoldRequest
from nodus_schema.defaulting import default_job
from nodus_schema.jobs import Job, JobSpec
from nodus_schema.meta import ObjectMeta, OwnerReference
from nodus_schema.pipelines import PIPELINE_LABEL, STAGE_LABEL, Pipeline, PipelineSpec, Stage, StageTemplate
from nodus_schema.quantities import usd_to_micros
from nodus_schema.sweeps import SWEEP_LABEL, Sweep, SweepSpec
from nodus_testing.waiting import eventually
from tests.scheduler.test_funding import TERMS, book_ok, expected_micros, forever

pytestmark = pytest.mark.timeout(120)

STAGE = {"image": "busybox", "resources": {"gpu": "L4:1"}, "recovery": {"continuity": "Checkpointed"}}


def _owner(pipeline: Pipeline, *, controller: bool) -> OwnerReference:
    meta = pipeline.metadata
    return OwnerReference(
        api_version="nodus.dev/v1",
        kind="Pipeline",
        name=meta.name or "",
        uid=meta.uid or "",
        controller=controller,
    )


async def _stage_job(rig: Any, pipeline: Pipeline, stage: str, *, controller: bool = True) -> Job:
    """A stage's Job as the Pipeline controller creates it: ``<pipeline>-<stage>``, labelled and owned."""
    name = f"{pipeline.metadata.name}-{stage}"
    labels = {PIPELINE_LABEL: pipeline.metadata.name or "", STAGE_LABEL: stage} if controller else {}
    meta = ObjectMeta(
        name=name, namespace="t", labels=labels, owner_references=[_owner(pipeline, controller=controller)]
    )
    return await rig.jobs.create(default_job(Job(metadata=meta, spec=msgspec.convert(STAGE, JobSpec))))


async def test_a_pipeline_cap_suspends_every_running_stage_and_raising_it_resumes_them(
    make_rig: Callable[..., Any],
) -> None:
    async with make_rig(forever, nodes=3, funding=True) as rig:
        await rig.start_billing(NODUS_STARTING_CREDITS_USD="10", NODUS_RESYNC_S="3600", **TERMS)
        pipelines = ObjectStore(rig.nc, "pipelines", Pipeline)
        cap = "0.003"  # about 14 s of one L4 ($0.79/h): a few holds' worth, shared by both stages
        stages = [Stage(name=s, template=StageTemplate(job=msgspec.convert(STAGE, JobSpec))) for s in "ab"]
        pipeline = await pipelines.create(
            Pipeline(
                metadata=ObjectMeta(name="pl", namespace="t", generation=1),
                spec=PipelineSpec(stages=stages, max_cost_usd=cap),
            )
        )
        for stage in "ab":
            await _stage_job(rig, pipeline, stage)
        # A plain reference to the Pipeline, which anyone may write: never under its cap.
        await _stage_job(rig, pipeline, "outsider", controller=False)

        async def both_suspended() -> list[Job]:
            jobs = [await rig.job(f"pl-{s}") for s in "ab"]
            for j in jobs:
                assert (j.status.phase, j.status.reason) == ("Suspended", "MaxCostReached"), j.status
                assert j.status.cost and j.status.cost.held_usd == "0.00", j.status.cost
                message = j.status.message or ""
                assert "the spec.maxCostUSD of pipeline pl ($0.003)" in message, message
                assert "Raise spec.maxCostUSD of pipeline pl by at least $" in message, message
            return jobs

        jobs = await eventually(
            both_suspended, deadline_s=60, message="both stages suspended at the Pipeline's cap"
        )
        spent = {
            j.metadata.name: usd_to_micros((j.status.cost.total_usd if j.status.cost else None) or "0")
            for j in jobs
        }
        assert all(s > 0 for s in spent.values()), f"both stages ran before the cap: {spent}"
        assert sum(spent.values()) <= usd_to_micros(cap), f"spent {spent} µ$ over the Pipeline's cap"
        for j in jobs:
            attempts = await rig.attempts_of(j.metadata.name or "")
            assert spent[j.metadata.name] == sum(expected_micros(a) for a in attempts), "charged exactly"

        state = await book_ok(rig, "t")
        ref = f"pl@{pipeline.metadata.uid}"
        assert sorted(pipeline_jobs(state, ref)) == sorted(
            job_ref(j.metadata.name or "", j.metadata.uid) for j in jobs
        )
        assert pipeline_spent(state, ref) + pipeline_held(state, ref) <= usd_to_micros(cap)
        outsider = await rig.job("pl-outsider")
        assert state.jobs[job_ref("pl-outsider", outsider.metadata.uid)].pipeline is None
        assert outsider.status.phase in ("Running", "Provisioning"), (
            "a plain reference puts no Job under the cap"
        )

        def raise_cap(p: Pipeline) -> Pipeline:
            spec = msgspec.structs.replace(p.spec, max_cost_usd="1.00")
            meta = msgspec.structs.replace(p.metadata, generation=(p.metadata.generation or 1) + 1)
            return msgspec.structs.replace(p, spec=spec, metadata=meta)

        runs_before = {s: len(await rig.attempts_of(f"pl-{s}")) for s in "ab"}
        await pipelines.mutate("t", "pl", raise_cap)

        async def both_running() -> bool:
            for s in "ab":
                job = await rig.job(f"pl-{s}")
                assert job.status.phase in ("Running", "Provisioning"), (s, job.status)
                assert len(await rig.attempts_of(f"pl-{s}")) > runs_before[s], f"stage {s} runs again"
            return True

        await eventually(
            both_running, deadline_s=30, message="raising the Pipeline's cap resumes both stages"
        )
        state = await book_ok(rig, "t")
        assert state.pipelines[ref].max_cost_micros == 1_000_000 and state.pipelines[ref].generation == 2


async def test_a_pipelines_new_cap_wakes_every_job_under_it_and_nothing_else(
    make_rig: Callable[..., Any],
) -> None:
    """The hold endpoint puts a Job stage, a Sweep stage and its cells under the Pipeline (read from the
    store, by controller ownerReferences); a project without credits leaves them blocked, so none is at
    rest. Then a new generation of the Pipeline maps to exactly the Jobs under it; the same generation
    again (a status write of the Pipeline) maps to nothing, and a Job that merely refers to it, never."""
    async with make_rig(funding=True, scheduler=False) as rig:
        billing: BillingService = await rig.start_billing(NODUS_RESYNC_S="3600", **TERMS)  # no credits
        pipelines = ObjectStore(rig.nc, "pipelines", Pipeline)
        pipeline = await pipelines.create(
            Pipeline(
                metadata=ObjectMeta(name="pl", namespace="t", generation=1),
                spec=PipelineSpec(max_cost_usd="5.00"),
            )
        )
        ref = f"pl@{pipeline.metadata.uid}"
        train = await _stage_job(rig, pipeline, "train")
        outsider = await _stage_job(rig, pipeline, "outsider", controller=False)
        grid = await ObjectStore(rig.nc, "sweeps", Sweep).create(
            Sweep(
                metadata=ObjectMeta(
                    name="pl-grid",
                    namespace="t",
                    labels={PIPELINE_LABEL: "pl", STAGE_LABEL: "grid"},
                    owner_references=[_owner(pipeline, controller=True)],
                ),
                spec=msgspec.convert({"template": {"spec": STAGE}, "maxCostUSD": "2.00"}, SweepSpec),
            )
        )
        uid = grid.metadata.uid or ""
        cell_owner = OwnerReference(
            api_version="nodus.dev/v1", kind="Sweep", name="pl-grid", uid=uid, controller=True
        )
        cells = []
        for i in range(2):
            meta = ObjectMeta(
                name=f"pl-grid-{i}",
                namespace="t",
                labels={SWEEP_LABEL: "pl-grid"},
                owner_references=[cell_owner],
            )
            job = Job(metadata=meta, spec=msgspec.convert(STAGE, JobSpec))
            cells.append(await rig.jobs.create(default_job(job)))
        jobs = [train, outsider, *cells]
        for job in jobs:  # as the binder asks before a run: refused for want of credits, and blocked
            ask = HoldRequest(
                namespace="t",
                job=job.metadata.name or "",
                job_uid=job.metadata.uid or "",
                attempt=f"{job.metadata.name}-a1",
                rate_micros_per_hour=790_000,
                window_millis=4_000,
            )
            reply = await messaging.request(rig.nc, HOLD_SUBJECT, ask, HoldReply)
            assert (reply.ok, reply.code) == (False, "InsufficientCredits"), reply

        state = await Books(rig.nc).read("t")
        assert state.pipelines[ref].max_cost_micros == 5_000_000
        assert state.jobs[job_ref("pl-train", train.metadata.uid)].pipeline == ref
        assert state.sweeps[f"pl-grid@{uid}"].pipeline == ref
        under = sorted(job_ref(j.metadata.name or "", j.metadata.uid) for j in (train, *cells))
        assert sorted(pipeline_jobs(state, ref)) == under
        assert state.jobs[job_ref("pl-outsider", outsider.metadata.uid)].pipeline is None

        def seen() -> bool:
            views = billing.views
            assert views.pipelines.get("t", "pl") is not None and views.sweeps.get("t", "pl-grid") is not None
            for job in jobs:
                viewed = views.jobs.get("t", job.metadata.name or "")
                assert viewed is not None and views.blocks(viewed), f"{job.metadata.name} is blocked"
                assert not billing.metering.settled(viewed)
            return True

        await eventually(
            seen, deadline_s=20, message="billing's views hold the Pipeline, its stages, the blocks"
        )
        raised = msgspec.structs.replace(
            pipeline,
            spec=msgspec.structs.replace(pipeline.spec, max_cost_usd="9.00"),
            metadata=msgspec.structs.replace(pipeline.metadata, generation=2),
        )
        keys = billing._stages_of(Event("MODIFIED", raised, 0))
        assert sorted(keys) == [("t", "pl-grid-0"), ("t", "pl-grid-1"), ("t", "pl-train")]
        assert list(billing._stages_of(Event("MODIFIED", raised, 0))) == []  # its status written: nothing
