"""The async client against the real gateway: verbs, async iteration of lists and watches, waits, errors,
and a resumed watch through a relay that drops its connections."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client as NATS

from nodus_gateway.resources import stores_for
from nodus_schema import Job, Sweep
from nodus_sdk import AsyncClient, Config, Event, Invalid, NotFound, WaitTimeout, finished, succeeded
from nodus_sdk.requesting import Retry

DEADLINE_S = 10.0


async def test_every_verb(aclient: AsyncClient, sweep: Callable[..., Sweep], job: Callable[..., Any]) -> None:
    created = await aclient.sweeps.create(sweep("lr"))
    assert created.metadata.uid and (await aclient.sweeps.get("lr")).metadata.uid == created.metadata.uid
    patched = await aclient.sweeps.patch(
        "lr", [{"op": "replace", "path": "/spec/maxParallel", "value": 3}], type="json"
    )
    assert patched.spec.max_parallel == 3
    updated = await aclient.sweeps.update(
        Sweep(metadata=patched.metadata, spec=msgspec.structs.replace(patched.spec, max_parallel=4))
    )
    assert updated.spec.max_parallel == 4
    for i in range(3):
        await aclient.jobs.create(job(f"j{i}", labels={"i": str(i)}))
    j0 = await aclient.jobs.get_status("j0")
    raised = await aclient.jobs.update(
        Job(metadata=j0.metadata, spec=msgspec.structs.replace(j0.spec, backoff_limit=1))
    )
    assert raised.spec.backoff_limit == 1
    async with aclient.jobs.watch(
        field_selector="metadata.name=j0", resource_version=j0.metadata.resource_version
    ) as w:
        event = await anext(aiter(w))
    assert (event.type, event.object.spec.backoff_limit) == ("MODIFIED", 1)
    names = [j.metadata.name async for j in aclient.jobs.list(page_size=2)]
    assert names == ["j0", "j1", "j2"]
    page = await aclient.jobs.list_page(label_selector="i in (1,2)")
    assert [j.metadata.name for j in page.items] == ["j1", "j2"] and page.continue_ is None
    estimated = await aclient.jobs.estimate(job("dry"))
    assert estimated.etag and estimated.object.status.estimate is not None
    assert len(await aclient.jobs.delete_collection(label_selector="i=0")) == 1
    assert isinstance(await aclient.jobs.delete("j1"), Job)
    await aclient.sweeps.delete("lr")
    with pytest.raises(NotFound):
        await aclient.sweeps.get("lr")
    assert (await aclient.account()).kind == "Account"
    assert [line async for line in aclient.jobs.log("j2")] == []


async def test_errors_are_the_same_classes(aclient: AsyncClient) -> None:
    with pytest.raises(Invalid) as err:
        await aclient.jobs.create({"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": "x"}})
    assert err.value.code == 422 and err.value.causes and err.value.request_id


async def test_watch_and_wait(
    aclient: AsyncClient, nc: NATS, unique: str, sweep: Callable[..., Sweep]
) -> None:
    await aclient.sweeps.create(sweep("lr"))
    seen: list[tuple[str, str | None]] = []
    async with aclient.sweeps.watch(timeout=DEADLINE_S) as watch:
        async for event in watch:
            seen.append((event.type, event.object.metadata.name))
            if event.type == "ADDED":
                await aclient.sweeps.patch("lr", {"metadata": {"labels": {"x": "1"}}})
            else:
                break
    assert seen == [("ADDED", "lr"), ("MODIFIED", "lr")]

    waiting = asyncio.ensure_future(
        aclient.wait_for(await aclient.sweeps.get("lr"), succeeded, timeout=DEADLINE_S)
    )
    for phase in ("Running", "Succeeded"):
        await stores_for(nc)["sweeps"].mutate(unique, "lr", _phase(phase))
    done = await asyncio.wait_for(waiting, DEADLINE_S)
    assert done.status.phase == "Succeeded"
    with pytest.raises(WaitTimeout):
        await aclient.sweeps.wait_for("lr", lambda s: s.spec.max_parallel == 99, timeout=0.5)
    assert finished(done)


def _phase(phase: str) -> Callable[[Any], Any]:
    def change(obj: Any) -> Any:
        return msgspec.structs.replace(obj, status=msgspec.structs.replace(obj.status, phase=phase))

    return change


async def test_a_dropped_async_watch_resumes(
    proxy: Any, aclient: AsyncClient, unique: str, sweep: Callable[..., Sweep]
) -> None:
    config = Config(server=proxy.url, token=aclient.config.token, project=unique)
    async with AsyncClient(config, retry=Retry(attempts=50, backoff_s=0.05, max_backoff_s=0.2)) as via_proxy:
        await aclient.sweeps.create(sweep("lr"))
        events: list[Event[Sweep]] = []
        async with via_proxy.sweeps.watch(timeout=DEADLINE_S) as watch:
            async for event in watch:
                events.append(event)
                if len(events) == 1:
                    proxy.down = True
                    proxy.cut()
                    await aclient.sweeps.patch("lr", {"spec": {"maxParallel": 3}})
                    proxy.down = False
                else:
                    break
        assert [(e.type, e.object.spec.max_parallel) for e in events] == [("ADDED", 2), ("MODIFIED", 3)]
        assert watch.state.connections >= 2
