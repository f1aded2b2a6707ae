"""The SDK's ``pipelines`` accessor (issue #22) against the real gateway: a manifest loaded as a typed
Pipeline, create, get, list, patch of the shared cap, ``wait_for`` over the watch, and delete; the async
client has the same accessor."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from nats.aio.client import Client as NATS

from nodus_kit.storing import ObjectStore
from nodus_schema.pipelines import Pipeline, PipelineStatus
from nodus_sdk import AsyncClient, Client, NotFound, load_objects, succeeded

run = asyncio.to_thread

PIPELINE_YAML = """\
apiVersion: nodus.dev/v1
kind: Pipeline
metadata: {name: flow}
spec:
  maxCostUSD: "2.00"
  stages:
  - name: prepare
    template:
      job: {image: ghcr.io/acme/prep:1, command: ["true"], resources: {gpu: "L4:1"}}
  - name: train
    dependsOn: [prepare]
    template:
      job: {image: ghcr.io/acme/train:1, command: ["true"], resources: {gpu: "L4:1"}}
"""


async def test_pipelines_every_verb_and_a_wait(client: Client, nc: NATS, unique: str) -> None:
    (manifest,) = load_objects(PIPELINE_YAML)
    assert isinstance(manifest, Pipeline) and [s.name for s in manifest.spec.stages] == ["prepare", "train"]
    created = await run(client.pipelines.create, manifest)
    assert isinstance(created, Pipeline) and created.metadata.namespace == unique and created.metadata.uid
    assert (await run(client.pipelines.get, "flow")).spec.stages[1].depends_on == ["prepare"]
    assert [p.metadata.name for p in await run(lambda: list(client.pipelines.list()))] == ["flow"]
    patched = await run(client.pipelines.patch, "flow", {"spec": {"maxCostUSD": "3.00"}})
    assert patched.spec.max_cost_usd == "3.00"

    waiting = asyncio.create_task(run(client.pipelines.wait_for, "flow", succeeded, timeout=10))
    store = ObjectStore(nc, "pipelines", Pipeline)
    done = PipelineStatus(phase="Succeeded")
    await store.mutate(unique, "flow", lambda p: msgspec.structs.replace(p, status=done))
    assert (await asyncio.wait_for(waiting, 15)).status.phase == "Succeeded"

    assert (await run(client.pipelines.delete, "flow")).metadata.name == "flow"
    with pytest.raises(NotFound):
        await run(client.pipelines.get, "flow")


async def test_the_async_client_has_pipelines_too(aclient: AsyncClient) -> None:
    (manifest,) = load_objects(PIPELINE_YAML)
    created = await aclient.pipelines.create(manifest)
    assert (await aclient.pipelines.get("flow")).metadata.uid == created.metadata.uid
