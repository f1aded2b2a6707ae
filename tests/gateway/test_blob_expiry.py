"""Expiry of unused blobs (ADR-0036, nodus_gateway.blobreaping) against the session's nats-server and
SeaweedFS: a blob nothing refers to goes after the TTL (record and object), one a Job, a Sweep or a Volume
revision names stays, and a use that races the sweep either keeps the blob or is refused, never admitted
with bytes that are about to vanish."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import msgspec
import pytest_asyncio
from nats.aio.client import Client as NATS

from nodus_gateway.app import build_app
from nodus_gateway.blobbing import touch_blob
from nodus_gateway.blobreaping import BlobReaper
from nodus_gateway.resources import BLOBS, Stores, stores_for
from nodus_gateway.storeaccess import StoreAccess
from nodus_schema import Job
from nodus_schema.examples import minimal_job
from nodus_schema.jobs import Source
from nodus_schema.meta import ObjectMeta
from nodus_schema.volumes import blob_key
from nodus_testing.seaweed import SeaweedS3
from tests.gateway.test_blobs import archive, blob_path, client, store_for

ADMIN = "expiry-admin-token-0123456789"
V1 = "/apis/nodus.dev/v1"
LATER = datetime.now(UTC) + timedelta(days=8)


class Fixture(msgspec.Struct):
    http: Any
    stores: Any
    store: Any
    s3: Any
    bucket: str
    ns: str


@pytest_asyncio.fixture
async def gw(nc: NATS, seaweed: SeaweedS3, unique: str) -> AsyncIterator[Fixture]:
    bucket = f"expiry-{secrets.token_hex(4)}"
    store = store_for(seaweed, bucket, 1 << 20)
    s3 = await store.client()
    await s3.create_bucket(Bucket=bucket)
    stores = stores_for(nc)
    app = build_app(stores, admin_token=ADMIN, store=store)
    async with client(app, ADMIN) as http:
        yield Fixture(http, stores, store, s3, bucket, f"p-{unique}")
    await store.close()


async def upload(f: Fixture) -> str:
    data, digest = archive()
    r = await f.http.put(blob_path(f.ns, digest), content=data)
    assert r.status_code == 201, r.text
    return digest


async def in_store(f: Fixture, digest: str) -> bool:
    listed = await f.s3.list_objects_v2(Bucket=f.bucket, Prefix=blob_key(f.ns, digest))
    return bool(listed.get("KeyCount"))


async def exists(f: Fixture, digest: str) -> bool:
    return (await f.http.head(blob_path(f.ns, digest))).status_code == 200


async def job_with(stores: Stores, ns: str, name: str, digest: str) -> None:
    job: Job = minimal_job()
    job.metadata = ObjectMeta(name=name, namespace=ns)
    job.spec.source = Source(blob=digest)
    await stores["jobs"].create(job)


def reaper(f: Fixture) -> BlobReaper:
    store: StoreAccess = f.store
    return BlobReaper(f.stores, store, ttl=timedelta(days=7))


async def test_an_unused_blob_goes_after_the_ttl_and_a_referenced_one_stays(gw: Fixture) -> None:
    code, data, loose = await upload(gw), await upload(gw), await upload(gw)
    await job_with(gw.stores, gw.ns, "uses-code", code)
    r = await gw.http.post(f"{V1}/namespaces/{gw.ns}/volumes", json={"metadata": {"name": "ds"}})
    assert r.status_code == 201, r.text
    r = await gw.http.post(f"{V1}/namespaces/{gw.ns}/volumes/ds/revisions", json={"digest": data})
    assert r.status_code == 201, r.text

    assert await reaper(gw).sweep(datetime.now(UTC), gw.ns) == 0  # nothing is old yet
    assert await reaper(gw).sweep(LATER, gw.ns) == 1
    assert not await exists(gw, loose) and not await in_store(gw, loose)
    assert await exists(gw, code) and await in_store(gw, code)
    assert await exists(gw, data) and await in_store(gw, data)

    await gw.stores["jobs"].delete(gw.ns, "uses-code")
    assert await reaper(gw).sweep(LATER, gw.ns) == 1
    assert not await exists(gw, code) and not await in_store(gw, code)
    # An expired blob cannot become a revision: it is gone, and the answer says to upload it again.
    r = await gw.http.post(f"{V1}/namespaces/{gw.ns}/volumes/ds/revisions", json={"digest": code})
    assert r.status_code == 422, r.text
    assert "Upload it first" in r.json()["fix"]


async def test_a_use_that_races_the_sweep_keeps_the_blob(gw: Fixture) -> None:
    digest = await upload(gw)
    sweeper = reaper(gw)
    ((ns, judged),) = await sweeper.expired(LATER, gw.ns)
    await touch_blob(gw.stores, ns, digest)  # a Job admitted between the judgement and the delete
    assert not await sweeper.delete(ns, judged)
    assert await exists(gw, digest) and await in_store(gw, digest)


async def test_a_use_after_the_delete_is_refused(gw: Fixture) -> None:
    digest = await upload(gw)
    ((ns, judged),) = await reaper(gw).expired(LATER, gw.ns)
    assert await reaper(gw).delete(ns, judged)
    r = await gw.http.post(f"{V1}/namespaces/{gw.ns}/volumes", json={"metadata": {"name": "late"}})
    assert r.status_code == 201, r.text
    r = await gw.http.post(f"{V1}/namespaces/{gw.ns}/volumes/late/revisions", json={"digest": digest})
    assert r.status_code == 422, r.text
    assert (await gw.stores[BLOBS].list(gw.ns)).items == []
    resp: httpx.Response = await gw.http.head(blob_path(gw.ns, digest))
    assert resp.status_code == 404
