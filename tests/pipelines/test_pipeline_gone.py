"""A Pipeline that is gone is not acted on, and a child created while it was being deleted does not outlive
it (ADR-0039). The reconciler runs on the session's nats-server over informers that hold what the test
puts in them (never started), so a pass can be made to work from a view the store no longer matches."""

from __future__ import annotations

import msgspec
import pytest
from nats.aio.client import Client as NATS

from nodus_kit.errors import NotFound
from nodus_kit.informing import Informer
from nodus_kit.storing import ObjectStore
from nodus_schema.jobs import Job
from nodus_schema.meta import ObjectMeta
from nodus_schema.pipelines import Pipeline, PipelineSpec
from nodus_schema.sweeps import Sweep
from nodus_sweeps.pipelining import PipelineReconciler
from nodus_sweeps.staging import PIPELINES, by_pipeline

STAGES = [{"name": "a", "template": {"job": {"image": "busybox", "command": ["true"]}}}]


def _reconciler(nc: NATS) -> PipelineReconciler:
    pipelines = Informer(ObjectStore(nc, "pipelines", Pipeline), name="pipelines")
    jobs = Informer(ObjectStore(nc, "jobs", Job), indexers={PIPELINES: by_pipeline}, name="jobs")
    sweeps = Informer(ObjectStore(nc, "sweeps", Sweep), indexers={PIPELINES: by_pipeline}, name="sweeps")
    for informer in (pipelines, jobs, sweeps):
        informer.synced.set()  # the views are the test's: as listed
    return PipelineReconciler(nc, pipelines, jobs, sweeps)


async def test_a_child_created_after_its_pipeline_was_deleted_is_deleted_at_once(
    nc: NATS, unique: str
) -> None:
    rec = _reconciler(nc)
    store = ObjectStore(nc, "pipelines", Pipeline)
    spec = msgspec.convert({"stages": STAGES}, PipelineSpec)
    stored = await store.create(
        Pipeline(metadata=ObjectMeta(name="p", namespace=unique, generation=1), spec=spec)
    )
    rec.pipelines.apply(stored)  # the view still holds it ...
    await store.delete(unique, "p")  # ... after the gateway deleted it (and cascaded: nothing yet)
    assert await rec.reconcile((unique, "p")) is None
    jobs = ObjectStore(nc, "jobs", Job)
    with pytest.raises(NotFound):
        await jobs.get(unique, "p-a")  # created by the pass, then deleted: it never outlives its Pipeline
    assert rec.jobs.get(unique, "p-a") is None
    # Gone from the view too: a pass reads the store, finds nothing, and does nothing.
    rv = str(int(stored.metadata.resource_version or "0") + 1)
    rec.pipelines.apply(
        msgspec.structs.replace(
            stored, metadata=msgspec.structs.replace(stored.metadata, resource_version=rv)
        ),
        deleted=True,
    )
    assert rec.pipelines.get(unique, "p") is None
    assert await rec.reconcile((unique, "p")) is None
    assert (await jobs.list(unique)).items == []
