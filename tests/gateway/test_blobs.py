"""Blob uploads (ADR-0036) through the real gateway app, against the session's nats-server and SeaweedFS.

A gateway per module with a store (a bucket of its own on the session's SeaweedFS), projects ``a-<unique>``
and ``b-<unique>`` per test: alice is an editor in A, vera a viewer in A, bob an editor in B.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import pytest_asyncio
import zstandard
from fastapi import FastAPI
from nats.aio.client import Client as NATS

from nodus_gateway.app import build_app
from nodus_gateway.config import ConfigError, GatewayConfig
from nodus_gateway.principals import Principals
from nodus_gateway.resources import stores_for
from nodus_gateway.storeaccess import StoreAccess, StoreSettings
from nodus_schema.volumes import blob_key
from nodus_testing.seaweed import SeaweedS3

ADMIN_TOKEN = "blobs-admin-token-0123456789"
V1 = "/apis/nodus.dev/v1"
CAP = 48 * 1024**2
"""The module gateway's NODUS_BLOB_MAX_BYTES: room for a blob of several 16 MiB parts."""


def archive(size: int = 4096) -> tuple[bytes, str]:
    """A zstd frame of ``size`` random bytes (what a tar.zst looks like to the gateway) and its digest."""
    data = zstandard.ZstdCompressor(level=1).compress(os.urandom(size))
    return data, f"sha256:{hashlib.sha256(data).hexdigest()}"


def blob_path(namespace: str, digest: str) -> str:
    return f"{V1}/namespaces/{namespace}/blobs/{digest}"


def client(app: FastAPI, token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://gateway",
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )


async def mint(admin: httpx.AsyncClient, principal: str, roles: dict[str, str]) -> str:
    resp = await admin.post(f"{V1}/tokens", json={"spec": {"principal": principal, "roles": roles}})
    assert resp.status_code == 201, resp.text
    token: str = resp.json()["secret"]
    return token


def assert_status(resp: httpx.Response, code: int, reason: str) -> dict[str, Any]:
    assert resp.status_code == code, resp.text
    body: dict[str, Any] = resp.json()
    assert (body["kind"], body["reason"], body["code"]) == ("Status", reason, code)
    assert body["fix"] and body["docs"]
    return body


@dataclass
class Gateway:
    app: FastAPI
    store: StoreAccess
    s3: Any
    bucket: str


def store_for(seaweed: SeaweedS3, bucket: str, cap: int) -> StoreAccess:
    return StoreAccess(
        StoreSettings(
            bucket=bucket,
            endpoint=seaweed.endpoint_url,
            access_key=seaweed.access_key,
            secret_key=seaweed.secret_key,
            blob_max_bytes=cap,
        )
    )


@pytest_asyncio.fixture(scope="module")
async def gateway(nc: NATS, seaweed: SeaweedS3) -> AsyncIterator[Gateway]:
    bucket = f"blobs-{secrets.token_hex(4)}"
    store = store_for(seaweed, bucket, CAP)
    s3 = await store.client()
    await s3.create_bucket(Bucket=bucket)
    principals = Principals(nc, pepper=b"blobs-pepper", cache_ttl_s=0.2)
    app = build_app(stores_for(nc), admin_token=ADMIN_TOKEN, principals=principals, store=store)
    yield Gateway(app, store, s3, bucket)
    await store.close()


@dataclass
class Project:
    a: str
    b: str
    admin: httpx.AsyncClient
    alice: httpx.AsyncClient
    vera: httpx.AsyncClient
    bob: httpx.AsyncClient


@pytest_asyncio.fixture
async def project(gateway: Gateway, unique: str) -> AsyncIterator[Project]:
    a, b = f"a-{unique}", f"b-{unique}"
    async with client(gateway.app, ADMIN_TOKEN) as admin:
        for name in (a, b):
            resp = await admin.post(f"{V1}/projects", json={"metadata": {"name": name}})
            assert resp.status_code == 201, resp.text
        alice = await mint(admin, "alice", {a: "editor"})
        vera = await mint(admin, "vera", {a: "viewer"})
        bob = await mint(admin, "bob", {b: "editor"})
        async with (
            client(gateway.app, alice) as alice_c,
            client(gateway.app, vera) as vera_c,
            client(gateway.app, bob) as bob_c,
        ):
            yield Project(a, b, admin, alice_c, vera_c, bob_c)


async def uploads_in_progress(gateway: Gateway, key: str) -> list[Any]:
    reply = await gateway.s3.list_multipart_uploads(Bucket=gateway.bucket, Prefix=key)
    return list(reply.get("Uploads", []))


async def object_size(gateway: Gateway, key: str) -> int | None:
    size: int | None = await gateway.store.head(key)
    return size


# -- uploads ------------------------------------------------------------------------------------------------
async def test_upload_then_head_and_get_answer_the_record(gateway: Gateway, project: Project) -> None:
    data, digest = archive()
    resp = await project.alice.put(
        blob_path(project.a, digest), content=data, headers={"Content-Type": "application/octet-stream"}
    )
    assert resp.status_code == 201, resp.text
    assert resp.json() == {"digest": digest, "sizeBytes": len(data)}
    assert await object_size(gateway, blob_key(project.a, digest)) == len(data)

    head = await project.vera.head(blob_path(project.a, digest))
    assert head.status_code == 200
    assert head.headers["X-Nodus-Size"] == str(len(data))
    assert head.content == b""

    got = await project.vera.get(blob_path(project.a, digest))
    assert got.status_code == 200, got.text
    record = got.json()
    assert record["kind"] == "Blob"
    assert record["metadata"]["name"] == digest.removeprefix("sha256:")
    assert record["spec"] == {"sizeBytes": len(data), "creator": "alice"}
    assert record["status"]["lastUsedTime"]


async def test_a_blob_of_several_parts_is_stored_whole(gateway: Gateway, project: Project) -> None:
    # 40 MiB of random bytes: three 16 MiB parts of a multipart upload, streamed without a length.
    data, digest = archive(40 * 1024**2)

    async def body() -> AsyncIterator[bytes]:
        for i in range(0, len(data), 1024**2):
            yield data[i : i + 1024**2]

    resp = await project.alice.put(blob_path(project.a, digest), content=body())
    assert resp.status_code == 201, resp.text
    assert resp.json()["sizeBytes"] == len(data)
    stored = await gateway.s3.get_object(Bucket=gateway.bucket, Key=blob_key(project.a, digest))
    async with stored["Body"] as stream:
        assert hashlib.sha256(await stream.read()).hexdigest() == digest.removeprefix("sha256:")


async def test_an_existing_blob_answers_200_and_stores_nothing_new(
    gateway: Gateway, project: Project
) -> None:
    data, digest = archive()
    first = await project.alice.put(blob_path(project.a, digest), content=data)
    assert first.status_code == 201, first.text
    before = await gateway.s3.head_object(Bucket=gateway.bucket, Key=blob_key(project.a, digest))
    record = (await project.alice.get(blob_path(project.a, digest))).json()

    # Another body under the same name: not even read, so not refused for its digest either.
    again = await project.alice.put(blob_path(project.a, digest), content=b"not read at all")
    assert again.status_code == 200, again.text
    assert again.json() == {"digest": digest, "sizeBytes": len(data)}
    after = await gateway.s3.head_object(Bucket=gateway.bucket, Key=blob_key(project.a, digest))
    assert (after["ETag"], after["LastModified"]) == (before["ETag"], before["LastModified"])
    assert await uploads_in_progress(gateway, blob_key(project.a, digest)) == []
    kept = (await project.alice.get(blob_path(project.a, digest))).json()
    assert kept["metadata"]["resourceVersion"] == record["metadata"]["resourceVersion"]


async def test_a_wrong_digest_is_422_and_nothing_is_kept(gateway: Gateway, project: Project) -> None:
    data, actual = archive()
    _, named = archive()
    resp = await project.alice.put(blob_path(project.a, named), content=data)
    body = assert_status(resp, 422, "Invalid")
    assert named in body["message"] and actual in body["message"]
    key = blob_key(project.a, named)
    assert await object_size(gateway, key) is None
    assert await uploads_in_progress(gateway, key) == []
    assert_status(await project.alice.get(blob_path(project.a, named)), 404, "NotFound")
    assert_status(await project.alice.get(blob_path(project.a, actual)), 404, "NotFound")


async def test_a_wrong_digest_past_one_part_leaves_no_upload(gateway: Gateway, project: Project) -> None:
    data, _ = archive(20 * 1024**2)  # one whole part uploads before the end shows the mismatch
    _, named = archive()
    resp = await project.alice.put(blob_path(project.a, named), content=data)
    assert_status(resp, 422, "Invalid")
    key = blob_key(project.a, named)
    assert await object_size(gateway, key) is None
    assert await uploads_in_progress(gateway, key) == []


async def test_a_body_that_is_not_zstd_is_422(gateway: Gateway, project: Project) -> None:
    data = b"PK\x03\x04 a zip is no tar.zst" * 100
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    body = assert_status(await project.alice.put(blob_path(project.a, digest), content=data), 422, "Invalid")
    assert "tar.zst" in body["message"]
    assert await object_size(gateway, blob_key(project.a, digest)) is None
    empty = f"sha256:{hashlib.sha256(b'').hexdigest()}"
    assert_status(await project.alice.put(blob_path(project.a, empty), content=b""), 422, "Invalid")


async def test_a_malformed_digest_is_400(project: Project) -> None:
    for name in ("sha256:ABC", "md5:" + "0" * 32, "sha256:" + "0" * 63):
        body = assert_status(
            await project.alice.put(blob_path(project.a, name), content=b"x"), 400, "BadRequest"
        )
        assert "sha256:<64" in body["fix"] or "sha256:<64" in body["message"]


async def test_over_the_limit_is_413(
    nc: NATS, seaweed: SeaweedS3, gateway: Gateway, project: Project
) -> None:
    small = store_for(seaweed, gateway.bucket, 8192)
    app = build_app(stores_for(nc), admin_token=ADMIN_TOKEN, store=small)
    data, digest = archive(64 * 1024)
    async with client(app, ADMIN_TOKEN) as admin:
        # Said by its Content-Length, before reading...
        body = assert_status(
            await admin.put(blob_path(project.a, digest), content=data), 413, "RequestEntityTooLarge"
        )
        assert "NODUS_BLOB_MAX_BYTES" in body["message"]

        # ...and without one, the moment the body passes the cap.
        async def chunks() -> AsyncIterator[bytes]:
            for i in range(0, len(data), 4096):
                yield data[i : i + 4096]

        assert_status(
            await admin.put(blob_path(project.a, digest), content=chunks()), 413, "RequestEntityTooLarge"
        )
    await small.close()
    assert await object_size(gateway, blob_key(project.a, digest)) is None
    assert await uploads_in_progress(gateway, blob_key(project.a, digest)) == []


# -- who may ------------------------------------------------------------------------------------------------
async def test_a_viewer_cannot_upload(gateway: Gateway, project: Project) -> None:
    data, digest = archive()
    body = assert_status(await project.vera.put(blob_path(project.a, digest), content=data), 403, "Forbidden")
    assert "viewer" in body["fix"]
    assert await object_size(gateway, blob_key(project.a, digest)) is None


async def test_another_project_cannot_see_or_write_a_blob(gateway: Gateway, project: Project) -> None:
    data, digest = archive()
    assert (await project.alice.put(blob_path(project.a, digest), content=data)).status_code == 201
    # As the generic routes answer for a named object in a project without a role: exactly a 404.
    for resp in (
        await project.bob.get(blob_path(project.a, digest)),
        await project.bob.head(blob_path(project.a, digest)),
        await project.bob.put(blob_path(project.a, digest), content=data),
    ):
        assert resp.status_code == 404, resp.text
    # The same bytes in bob's own project are a blob of its own, not found until bob uploads them.
    assert_status(await project.bob.get(blob_path(project.b, digest)), 404, "NotFound")
    assert (await project.bob.put(blob_path(project.b, digest), content=data)).status_code == 201
    assert (await project.bob.get(blob_path(project.b, digest))).json()["spec"]["creator"] == "bob"


async def test_without_a_store_the_blob_routes_answer_503(nc: NATS, project: Project) -> None:
    app = build_app(stores_for(nc), admin_token=ADMIN_TOKEN)
    data, digest = archive()
    async with client(app, ADMIN_TOKEN) as admin:
        for resp in (
            await admin.put(blob_path(project.a, digest), content=data),
            await admin.get(blob_path(project.a, digest)),
        ):
            body = assert_status(resp, 503, "ServiceUnavailable")
            assert "NODUS_STORE_BUCKET" in body["fix"]


# -- settings -----------------------------------------------------------------------------------------------
def test_store_settings_are_read_with_the_gateways_and_keep_the_secret_out_of_reprs() -> None:
    env = {
        "NODUS_ADMIN_TOKEN": ADMIN_TOKEN,
        "NODUS_STORE_BUCKET": "nodus-local",
        "NODUS_S3_ENDPOINT": "http://127.0.0.1:8333",
        "NODUS_S3_ACCESS_KEY": "nodus",
        "NODUS_S3_SECRET_KEY": "very-secret-key",
        "NODUS_BLOB_MAX_BYTES": "1Gi",
    }
    store = GatewayConfig.from_env(env).store
    assert (store.bucket, store.region, store.blob_max_bytes) == ("nodus-local", "us-east-1", 1024**3)
    assert store.workspace_file_max_bytes == 20 * 1024**3
    assert "very-secret-key" not in repr(store) and "very-secret-key" not in repr(GatewayConfig.from_env(env))
    assert GatewayConfig.from_env({"NODUS_ADMIN_TOKEN": ADMIN_TOKEN}).store.bucket is None


def test_a_bad_cap_stops_the_start_naming_the_variable() -> None:
    for value in ("lots", "0", "1.5"):
        with pytest.raises(ConfigError) as err:
            GatewayConfig.from_env(
                {"NODUS_ADMIN_TOKEN": ADMIN_TOKEN, "NODUS_WORKSPACE_FILE_MAX_BYTES": value}
            )
        assert "NODUS_WORKSPACE_FILE_MAX_BYTES" in str(err.value)
