"""Every verb of the sync client against the real gateway: Sweeps and Jobs, a cluster-scoped read,
pagination, selectors, the patch kinds, dry runs with estimates, propagation, project endpoints."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client as NATS

from nodus_scheduler.publishing import publish_catalog
from nodus_schema import Job, ObjectMeta, Sweep
from nodus_schema.catalog import Catalog, Offering, Variant
from nodus_sdk import AlreadyExists, Client, Conflict, Estimated, Invalid, MethodNotAllowed, NotFound

run = asyncio.to_thread


async def test_create_get_status_list_and_delete_a_sweep(
    client: Client, unique: str, sweep: Callable[..., Sweep]
) -> None:
    created = await run(client.sweeps.create, sweep("lr"))
    assert isinstance(created, Sweep)
    assert created.metadata.namespace == unique and created.metadata.uid and created.metadata.resource_version
    assert created.spec.max_parallel == 2 and created.spec.matrix.params == {"LR": ["0.1", "0.01"]}
    got = await run(client.sweeps.get, "lr")
    assert got.metadata.uid == created.metadata.uid
    assert (await run(client.sweeps.get_status, "lr")).metadata.uid == created.metadata.uid
    names = [s.metadata.name for s in await run(lambda: list(client.sweeps.list()))]
    assert names == ["lr"]
    deleted = await run(client.sweeps.delete, "lr")
    assert deleted.metadata.name == "lr"
    with pytest.raises(NotFound) as err:
        await run(client.sweeps.get, "lr")
    assert err.value.code == 404 and err.value.reason == "NotFound"


async def test_create_twice_is_already_exists(client: Client, job: Callable[..., dict[str, Any]]) -> None:
    await run(client.jobs.create, job("train"))
    with pytest.raises(AlreadyExists) as err:
        await run(client.jobs.create, job("train"))
    assert err.value.code == 409 and err.value.fix and err.value.request_id


async def test_jobs_take_dicts_and_typed_objects_and_the_namespace_of_the_call(
    client: Client, unique: str, job: Callable[..., dict[str, Any]]
) -> None:
    other = f"{unique}-other"
    typed = await run(lambda: client.jobs.create(job("typed"), namespace=other))
    assert isinstance(typed, Job) and typed.metadata.namespace == other
    again = Job(metadata=ObjectMeta(name="copy", namespace=other), spec=typed.spec)
    copied = await run(client.jobs.create, again)  # the object's own namespace
    assert copied.metadata.namespace == other
    assert [j.metadata.name for j in await run(lambda: list(client.jobs.list(namespace=other)))] == [
        "copy",
        "typed",
    ]
    assert await run(lambda: list(client.jobs.list())) == []  # the client's project has none


async def test_update_is_a_compare_and_set(client: Client, sweep: Callable[..., Sweep]) -> None:
    first = await run(client.sweeps.create, sweep("lr"))
    raised = Sweep(metadata=first.metadata, spec=_with_parallel(first, 3))
    updated = await run(client.sweeps.update, raised)
    assert updated.spec.max_parallel == 3
    assert int(updated.metadata.resource_version or 0) > int(first.metadata.resource_version or 0)
    stale = Sweep(metadata=first.metadata, spec=_with_parallel(first, 4))  # the old resourceVersion
    with pytest.raises(Conflict) as err:
        await run(client.sweeps.update, stale)
    assert err.value.reason == "Conflict" and err.value.fix


def _with_parallel(obj: Sweep, n: int) -> Any:
    return msgspec.structs.replace(obj.spec, max_parallel=n)


@pytest.mark.parametrize("kind", ["merge", "strategic", "json", "apply"])
async def test_every_patch_kind(client: Client, kind: str, sweep: Callable[..., Sweep]) -> None:
    await run(client.sweeps.create, sweep("lr"))
    patch: Any
    if kind == "json":
        patch = [
            {"op": "test", "path": "/spec/maxParallel", "value": 2},
            {"op": "replace", "path": "/spec/maxParallel", "value": 3},
            {"op": "add", "path": "/metadata/labels/patched", "value": kind},
        ]
    else:
        patch = {"spec": {"maxParallel": 3}, "metadata": {"labels": {"patched": kind}}}
    manager = "sdk-test" if kind == "apply" else None
    patched = await run(lambda: client.sweeps.patch("lr", patch, type=kind, field_manager=manager))  # type: ignore[arg-type]
    assert patched.spec.max_parallel == 3
    assert patched.metadata.labels == {"team": "vision", "size": "small", "patched": kind}


async def test_a_json_patch_whose_test_fails_is_invalid(client: Client, sweep: Callable[..., Sweep]) -> None:
    await run(client.sweeps.create, sweep("lr"))
    with pytest.raises(Invalid) as err:
        await run(
            lambda: client.sweeps.patch(
                "lr", [{"op": "test", "path": "/spec/maxParallel", "value": 7}], type="json"
            )
        )
    assert err.value.code == 422 and "could not be applied" in err.value.message


async def test_pages_and_the_auto_paginating_list(client: Client, job: Callable[..., dict[str, Any]]) -> None:
    for i in range(5):
        await run(client.jobs.create, job(f"j{i}"))
    first = await run(lambda: client.jobs.list_page(limit=2))
    assert [j.metadata.name for j in first.items] == ["j0", "j1"]
    assert first.continue_ and first.remaining == 3 and first.resource_version
    second = await run(lambda: client.jobs.list_page(limit=2, continue_=first.continue_))
    assert [j.metadata.name for j in second.items] == ["j2", "j3"]
    everything = await run(lambda: [j.metadata.name for j in client.jobs.list(page_size=2)])
    assert everything == [f"j{i}" for i in range(5)]


async def test_label_and_field_selectors(client: Client, sweep: Callable[..., Sweep]) -> None:
    await run(client.sweeps.create, sweep("small", size="small"))
    await run(client.sweeps.create, sweep("big", size="big"))
    by_label = await run(lambda: [s.metadata.name for s in client.sweeps.list(label_selector="size=big")])
    assert by_label == ["big"]
    by_field = await run(
        lambda: [s.metadata.name for s in client.sweeps.list(field_selector="metadata.name!=big")]
    )
    assert by_field == ["small"]
    both = await run(
        lambda: list(client.sweeps.list(label_selector="team=vision", field_selector="metadata.name=small"))
    )
    assert [s.metadata.name for s in both] == ["small"]


async def test_delete_collection_by_selector(client: Client, job: Callable[..., dict[str, Any]]) -> None:
    for i in range(3):
        await run(client.jobs.create, job(f"keep{i}", labels={"keep": "yes"}))
    for i in range(2):
        await run(client.jobs.create, job(f"drop{i}", labels={"keep": "no"}))
    deleted = await run(lambda: client.jobs.delete_collection(label_selector="keep=no"))
    assert sorted(j.metadata.name or "" for j in deleted) == ["drop0", "drop1"]
    left = await run(lambda: [j.metadata.name for j in client.jobs.list()])
    assert left == ["keep0", "keep1", "keep2"]


async def test_propagation_policy_orphans_or_deletes_owned_jobs(
    client: Client, sweep: Callable[..., Sweep], job: Callable[..., dict[str, Any]]
) -> None:
    for policy, survives in (("Orphan", True), ("Foreground", False)):
        owner = await run(client.sweeps.create, sweep(f"own-{policy.lower()}"))
        ref = {
            "apiVersion": "nodus.dev/v1",
            "kind": "Sweep",
            "name": owner.metadata.name,
            "uid": owner.metadata.uid,
        }
        await run(client.jobs.create, job(f"cell-{policy.lower()}", ownerReferences=[ref]))
        await run(partial(client.sweeps.delete, owner.metadata.name or "", propagation_policy=policy))
        if survives:
            cell = await run(client.jobs.get, f"cell-{policy.lower()}")
            assert cell.metadata.owner_references == []
        else:
            with pytest.raises(NotFound):
                await run(client.jobs.get, f"cell-{policy.lower()}")


async def test_delete_with_a_stale_resource_version_is_a_conflict(
    client: Client, job: Callable[..., dict[str, Any]]
) -> None:
    first = await run(client.jobs.create, job("train"))
    await run(lambda: client.jobs.patch("train", {"spec": {"backoffLimit": 2}}))
    with pytest.raises(Conflict):
        await run(lambda: client.jobs.delete("train", resource_version=first.metadata.resource_version))
    await run(client.jobs.get, "train")  # still there


async def test_a_dry_run_is_the_estimate_and_binds_a_create(
    client: Client, job: Callable[..., dict[str, Any]]
) -> None:
    body = job("train")
    estimated = await run(client.jobs.estimate, body)
    assert isinstance(estimated, Estimated) and estimated.etag
    estimate = estimated.object.status.estimate
    assert estimate is not None and estimate.rate_usd_per_hour and estimate.cost_usd is not None
    with pytest.raises(NotFound):
        await run(client.jobs.get, "train")  # a dry run stores nothing
    created = await run(lambda: client.jobs.create(body, if_match=estimated.etag))
    assert created.status.estimate is not None
    assert created.status.estimate.rate_usd_per_hour == estimate.rate_usd_per_hour


async def test_cluster_scoped_offerings_are_read_only(client: Client, nc: NATS, unique: str) -> None:
    variant = Variant(id="H100-SXM-80G", family="H100", memory="80Gi", interconnect="NVLink")
    offering = Offering(
        id=f"{unique}-x8",
        variant=variant.id,
        gpus_per_node=8,
        region_class="us",
        rate_micros_per_hour=31_920_000,
    )
    await publish_catalog(nc, Catalog(pricebook_version=unique, variants=[variant], offerings=[offering]))
    listed = await run(
        lambda: list(client.offerings.list(label_selector=f"nodus.dev/pricebook-version={unique}"))
    )
    assert [o.metadata.name for o in listed] == [f"{unique}-x8"]
    got = await run(client.offerings.get, f"{unique}-x8")
    assert got.spec.rate_usd_per_hour == "31.92" and got.metadata.namespace is None
    with pytest.raises(MethodNotAllowed) as err:
        await run(client.nodes.watch().__next__)
    assert err.value.code == 405


async def test_sweep_results_and_the_account(client: Client, sweep: Callable[..., Sweep]) -> None:
    await run(client.sweeps.create, sweep("lr"))
    results = await run(client.results, "lr")
    assert results.kind == "SweepResults" and results.cells == []  # no controller here: no cells yet
    assert (await run(client.sweeps.results_csv, "lr")).startswith("index,")
    account = await run(client.account)
    assert account.kind == "Account" and account.status.granted_usd


async def test_log_of_a_job_without_lines(client: Client, job: Callable[..., dict[str, Any]]) -> None:
    await run(client.jobs.create, job("train"))
    assert await run(lambda: list(client.jobs.log("train"))) == []
    with pytest.raises(NotFound):
        await run(lambda: list(client.jobs.log("missing")))
