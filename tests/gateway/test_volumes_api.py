"""Volumes and Workspaces through the real gateway app (ADR-0036), against the session's nats-server and
SeaweedFS: revisions, the gateway-owned status, Workspace files, deletes refused while in use, Tables.

A gateway per module with a store (a bucket of its own); per test a project ``p-<unique>`` where alice is an
editor and vera a viewer. Jobs and Sweeps that use a Volume or Workspace are written straight into their
stores: their admission against these objects is another module's (referencing.py).
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec
import pytest
import pytest_asyncio
import zstandard
from fastapi import FastAPI
from nats.aio.client import Client as NATS

from nodus_gateway import volumeapi
from nodus_gateway.app import build_app
from nodus_gateway.principals import Principals
from nodus_gateway.resources import Stores, stores_for
from nodus_gateway.responding import ApiError
from nodus_gateway.storeaccess import StoreAccess, StoreSettings
from nodus_gateway.volumeapi import append_revision
from nodus_schema import (
    Job,
    JobInput,
    JobSpec,
    ObjectMeta,
    Sweep,
    VolumeInput,
    VolumeMount,
    WorkspaceInput,
)
from nodus_schema.jobs import JobStatus
from nodus_schema.sweeps import SweepSpec, SweepStatus, SweepTemplate
from nodus_schema.volumes import workspace_prefix
from nodus_testing.seaweed import SeaweedS3

ADMIN_TOKEN = "volumes-admin-token-0123456789"
V1 = "/apis/nodus.dev/v1"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"


def archive(size: int = 4096) -> tuple[bytes, str]:
    data = zstandard.ZstdCompressor(level=1).compress(os.urandom(size))
    return data, f"sha256:{hashlib.sha256(data).hexdigest()}"


def client(app: FastAPI, token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://gateway",
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )


def assert_status(resp: httpx.Response, code: int, reason: str) -> dict[str, Any]:
    assert resp.status_code == code, resp.text
    body: dict[str, Any] = resp.json()
    assert (body["kind"], body["reason"], body["code"]) == ("Status", reason, code)
    assert body["fix"] and body["docs"]
    return body


@dataclass
class Gateway:
    app: FastAPI
    stores: Stores
    store: StoreAccess
    s3: Any
    bucket: str


@pytest_asyncio.fixture(scope="module")
async def gateway(nc: NATS, seaweed: SeaweedS3) -> AsyncIterator[Gateway]:
    bucket = f"volumes-{secrets.token_hex(4)}"
    store = StoreAccess(
        StoreSettings(
            bucket=bucket,
            endpoint=seaweed.endpoint_url,
            access_key=seaweed.access_key,
            secret_key=seaweed.secret_key,
            workspace_file_max_bytes=1024 * 1024,
        )
    )
    s3 = await store.client()
    await s3.create_bucket(Bucket=bucket)
    stores = stores_for(nc)
    principals = Principals(nc, pepper=b"volumes-pepper", cache_ttl_s=0.2)
    app = build_app(stores, admin_token=ADMIN_TOKEN, principals=principals, store=store)
    yield Gateway(app, stores, store, s3, bucket)
    await store.close()


@dataclass
class Project:
    ns: str
    admin: httpx.AsyncClient
    alice: httpx.AsyncClient
    vera: httpx.AsyncClient

    def path(self, *rest: str) -> str:
        return "/".join([f"{V1}/namespaces/{self.ns}", *rest])


@pytest_asyncio.fixture
async def project(gateway: Gateway, unique: str) -> AsyncIterator[Project]:
    ns = f"p-{unique}"
    async with client(gateway.app, ADMIN_TOKEN) as admin:
        resp = await admin.post(f"{V1}/projects", json={"metadata": {"name": ns}})
        assert resp.status_code == 201, resp.text
        tokens = {}
        for who, role in (("alice", "editor"), ("vera", "viewer")):
            resp = await admin.post(f"{V1}/tokens", json={"spec": {"principal": who, "roles": {ns: role}}})
            assert resp.status_code == 201, resp.text
            tokens[who] = resp.json()["secret"]
        async with client(gateway.app, tokens["alice"]) as alice, client(gateway.app, tokens["vera"]) as vera:
            yield Project(ns, admin, alice, vera)


async def upload(who: httpx.AsyncClient, project: Project, size: int = 4096) -> tuple[str, int]:
    data, digest = archive(size)
    resp = await who.put(project.path("blobs", digest), content=data)
    assert resp.status_code == 201, resp.text
    return digest, len(data)


async def create(
    who: httpx.AsyncClient, project: Project, plural: str, kind: str, name: str
) -> dict[str, Any]:
    body = {
        "apiVersion": "nodus.dev/v1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": {"description": f"the {name} of the tests"},
        # Never the caller's: dropped at create, as every status is.
        "status": {"latest": 9, "revisions": [{"revision": 9, "digest": "sha256:" + "0" * 64}]},
    }
    resp = await who.post(project.path(plural), json=body)
    assert resp.status_code == 201, resp.text
    created: dict[str, Any] = resp.json()
    return created


# -- Volumes and revisions ----------------------------------------------------------------------------------
async def test_two_revisions_count_up_with_sizes_and_creators(project: Project) -> None:
    created = await create(project.alice, project, "volumes", "Volume", "data")
    assert created.get("status", {}) == {}
    first, first_size = await upload(project.alice, project)
    second, second_size = await upload(project.admin, project, 8192)

    resp = await project.alice.post(project.path("volumes", "data", "revisions"), json={"digest": first})
    assert resp.status_code == 201, resp.text
    resp = await project.admin.post(project.path("volumes", "data", "revisions"), json={"digest": second})
    assert resp.status_code == 201, resp.text
    status = resp.json()["status"]
    assert status["latest"] == 2
    got = [(r["revision"], r["digest"], r["sizeBytes"], r["creator"]) for r in status["revisions"]]
    assert got == [(1, first, first_size, "alice"), (2, second, second_size, "admin")]
    assert all(r["time"] for r in status["revisions"])

    # The latest's bytes again change nothing; an older revision's bytes again make it the latest.
    again = await project.alice.post(project.path("volumes", "data", "revisions"), json={"digest": second})
    assert again.json()["status"]["latest"] == 2
    back = await project.alice.post(project.path("volumes", "data", "revisions"), json={"digest": first})
    assert back.json()["status"]["latest"] == 3


async def test_a_revision_needs_an_uploaded_blob_and_a_volume(project: Project) -> None:
    await create(project.alice, project, "volumes", "Volume", "data")
    _, missing = archive()
    body = assert_status(
        await project.alice.post(project.path("volumes", "data", "revisions"), json={"digest": missing}),
        422,
        "Invalid",
    )
    assert body["details"]["causes"][0]["field"] == "digest"
    assert f"blobs/{missing}" in body["fix"]
    bad = await project.alice.post(project.path("volumes", "data", "revisions"), json={"digest": "latest"})
    assert assert_status(bad, 422, "Invalid")["details"]["causes"][0]["field"] == "digest"
    digest, _ = await upload(project.alice, project)
    gone = await project.alice.post(project.path("volumes", "nothing", "revisions"), json={"digest": digest})
    assert_status(gone, 404, "NotFound")
    viewer = await project.vera.post(project.path("volumes", "data", "revisions"), json={"digest": digest})
    assert_status(viewer, 403, "Forbidden")


async def test_a_user_never_writes_a_volumes_status(project: Project) -> None:
    await create(project.alice, project, "volumes", "Volume", "data")
    digest, _ = await upload(project.alice, project)
    resp = await project.alice.post(project.path("volumes", "data", "revisions"), json={"digest": digest})
    stored = resp.json()

    forged = {**stored, "spec": {"description": "changed"}}
    forged["status"] = {"latest": 7, "revisions": [], "writer": {"job": "mine", "uid": "x"}}
    put = await project.alice.put(project.path("volumes", "data"), json=forged)
    assert put.status_code == 200, put.text
    assert put.json()["spec"]["description"] == "changed"
    assert put.json()["status"] == stored["status"]

    patch = await project.alice.patch(
        project.path("volumes", "data"),
        json={"status": {"latest": 8, "writer": {"job": "mine", "uid": "x"}}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert patch.status_code == 200, patch.text
    assert patch.json()["status"] == stored["status"]
    status_put = await project.alice.put(project.path("volumes", "data", "status"), json=forged)
    assert status_put.status_code in (404, 405), status_put.text
    assert (await project.alice.get(project.path("volumes", "data"))).json()["status"] == stored["status"]


async def test_append_revision_is_idempotent_per_attempt_and_keeps_the_newest(
    gateway: Gateway, project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    await create(project.alice, project, "volumes", "Volume", "data")
    digest, size = await upload(project.alice, project)
    first = await append_revision(gateway.stores, project.ns, "data", digest, size, "job:train", "train-a1")
    retried = await append_revision(gateway.stores, project.ns, "data", digest, size, "job:train", "train-a1")
    assert retried == first
    assert (first.revision, first.creator, first.attempt) == (1, "job:train", "train-a1")

    monkeypatch.setattr(volumeapi, "MAX_REVISIONS", 3)
    for _ in range(4):
        await append_revision(gateway.stores, project.ns, "data", digest, size, "alice", None)
        other, other_size = await upload(project.alice, project)
        await append_revision(gateway.stores, project.ns, "data", other, other_size, "alice")
    vol = (await project.alice.get(project.path("volumes", "data"))).json()
    assert [r["revision"] for r in vol["status"]["revisions"]] == [7, 8, 9]
    assert vol["status"]["latest"] == 9

    with pytest.raises(ApiError) as missing:
        await append_revision(gateway.stores, project.ns, "nothing", digest, size, "alice")
    assert missing.value.status.reason == "NotFound"


# -- Workspace files ----------------------------------------------------------------------------------------
async def test_workspace_files_put_get_list_delete_with_counts(project: Project) -> None:
    await create(project.alice, project, "workspaces", "Workspace", "home")
    files = project.path("workspaces", "home", "files")

    put = await project.alice.put(f"{files}/data/a.csv", content=b"a,b\n1,2\n")
    assert put.status_code == 201, put.text
    assert put.json() == {"path": "data/a.csv", "sizeBytes": 8}
    assert (await project.alice.put(f"{files}/./notes.txt", content=b"hello")).status_code == 201
    overwritten = await project.alice.put(f"{files}/data/a.csv", content=b"a,b\n")
    assert overwritten.status_code == 200, overwritten.text
    ws = (await project.vera.get(project.path("workspaces", "home"))).json()
    assert (ws["status"]["files"], ws["status"]["sizeBytes"]) == (2, 4 + 5)
    assert ws["status"]["updateTime"]

    got = await project.vera.get(f"{files}/data/a.csv")
    assert got.status_code == 200
    assert (got.content, got.headers["content-type"]) == (b"a,b\n", "application/octet-stream")
    # Bytes to save, never a page a browser would render on the API's origin.
    assert (got.headers["content-disposition"], got.headers["x-content-type-options"]) == (
        "attachment",
        "nosniff",
    )
    listed = (await project.vera.get(files)).json()
    assert sorted((i["path"], i["sizeBytes"]) for i in listed["items"]) == [
        ("data/a.csv", 4),
        ("notes.txt", 5),
    ]
    assert all(i["lastModified"].endswith("Z") for i in listed["items"])
    only = (await project.vera.get(files, params={"prefix": "data"})).json()
    assert [i["path"] for i in only["items"]] == ["data/a.csv"]
    page = (await project.vera.get(files, params={"limit": 1})).json()
    assert len(page["items"]) == 1 and page["continue"]
    rest = (await project.vera.get(files, params={"limit": 1, "continue": page["continue"]})).json()
    assert len(rest["items"]) == 1 and rest["items"][0]["path"] != page["items"][0]["path"]

    deleted = await project.alice.delete(f"{files}/notes.txt")
    assert deleted.status_code == 200, deleted.text
    assert_status(await project.vera.get(f"{files}/notes.txt"), 404, "NotFound")
    assert_status(await project.alice.delete(f"{files}/notes.txt"), 404, "NotFound")
    ws = (await project.vera.get(project.path("workspaces", "home"))).json()
    assert (ws["status"]["files"], ws["status"]["sizeBytes"]) == (1, 4)


async def test_paths_that_leave_the_home_are_refused(gateway: Gateway, project: Project) -> None:
    await create(project.alice, project, "workspaces", "Workspace", "home")
    files = project.path("workspaces", "home", "files")
    for path in ("%2E%2E/%2E%2E/other/secret", "a/%2E%2E/%2E%2E/b", "bad%0Aname", ""):
        resp = await project.alice.put(f"{files}/{path}", content=b"x")
        assert resp.status_code in (404, 405, 422), resp.text  # "" is no file route at all
        if path:
            body = assert_status(resp, 422, "Invalid")
            assert body["details"]["causes"][0]["field"] == "path"
    assert_status(await project.vera.get(f"{files}/%2E%2E/x"), 422, "Invalid")
    listed = await gateway.s3.list_objects_v2(
        Bucket=gateway.bucket, Prefix=f"_nodus/workspaces/{project.ns}/"
    )
    assert listed.get("KeyCount", 0) == 0


async def test_file_routes_need_the_workspace_the_role_and_the_cap(project: Project) -> None:
    missing = project.path("workspaces", "nothing", "files", "a.txt")
    assert_status(await project.alice.put(missing, content=b"x"), 404, "NotFound")
    assert_status(await project.vera.get(project.path("workspaces", "nothing", "files")), 404, "NotFound")
    await create(project.alice, project, "workspaces", "Workspace", "home")
    files = project.path("workspaces", "home", "files")
    assert_status(await project.vera.put(f"{files}/a.txt", content=b"x"), 403, "Forbidden")
    big = await project.alice.put(f"{files}/big.bin", content=b"\0" * (1024 * 1024 + 1))
    assert "NODUS_WORKSPACE_FILE_MAX_BYTES" in assert_status(big, 413, "RequestEntityTooLarge")["message"]
    assert (await project.vera.get(files)).json()["items"] == []


# -- deletes while in use -----------------------------------------------------------------------------------
async def _job(gateway: Gateway, ns: str, name: str, spec: JobSpec, phase: str) -> Job:
    job = Job(metadata=ObjectMeta(name=name, namespace=ns), spec=spec, status=JobStatus(phase=phase))
    created: Job = await gateway.stores["jobs"].create(job)
    return created


async def _finish(gateway: Gateway, job: Job) -> None:
    def done(j: Job) -> Job:
        return msgspec.structs.replace(j, status=msgspec.structs.replace(j.status, phase="Succeeded"))

    assert job.metadata.name is not None
    await gateway.stores["jobs"].mutate(job.metadata.namespace, job.metadata.name, done)


async def test_a_volume_in_use_is_not_deleted_until_its_users_finish(
    gateway: Gateway, project: Project
) -> None:
    await create(project.alice, project, "volumes", "Volume", "data")
    mounted = JobSpec(volumes=[VolumeMount(volume="data", mount_path="/data", read_only=True)])
    job = await _job(gateway, project.ns, "train", mounted, "Running")
    read = JobSpec(inputs=[JobInput(name="ds", volume=VolumeInput(name="data", revision=1))])
    await _job(gateway, project.ns, "eval", read, "Queued")
    await _job(gateway, project.ns, "old", mounted, "Failed")  # finished: no longer a user
    sweep = Sweep(
        metadata=ObjectMeta(name="grid", namespace=project.ns),
        spec=SweepSpec(template=SweepTemplate(kind="Job", spec=mounted)),
        status=SweepStatus(phase="Running"),
    )
    await gateway.stores["sweeps"].create(sweep)

    refused = assert_status(await project.alice.delete(project.path("volumes", "data")), 409, "Conflict")
    for user in ("job/train", "job/eval", "sweep/grid"):
        assert user in refused["message"]
    assert "job/old" not in refused["message"]
    dry = await project.alice.delete(project.path("volumes", "data"), params={"dryRun": "All"})
    assert_status(dry, 409, "Conflict")

    await _finish(gateway, job)
    await _finish(gateway, await gateway.stores["jobs"].get(project.ns, "eval"))
    await gateway.stores["sweeps"].delete(project.ns, "grid")
    deleted = await project.alice.delete(project.path("volumes", "data"))
    assert deleted.status_code == 200, deleted.text
    assert deleted.json()["metadata"]["name"] == "data"
    assert_status(await project.alice.get(project.path("volumes", "data")), 404, "NotFound")


async def test_a_workspace_in_use_stays_and_its_files_go_with_it(gateway: Gateway, project: Project) -> None:
    await create(project.alice, project, "workspaces", "Workspace", "home")
    files = project.path("workspaces", "home", "files")
    for name in ("a.txt", "dir/b.txt"):
        assert (await project.alice.put(f"{files}/{name}", content=b"x")).status_code == 201
    reads = JobSpec(inputs=[JobInput(name="home", from_workspace=WorkspaceInput(name="home", path="dir"))])
    job = await _job(gateway, project.ns, "reader", reads, "Pending")

    refused = assert_status(await project.alice.delete(project.path("workspaces", "home")), 409, "Conflict")
    assert "job/reader" in refused["message"]
    await _finish(gateway, job)
    assert (await project.alice.delete(project.path("workspaces", "home"))).status_code == 200
    prefix = workspace_prefix(project.ns, "home")
    listed = await gateway.s3.list_objects_v2(Bucket=gateway.bucket, Prefix=prefix)
    assert listed.get("KeyCount", 0) == 0
    # A Workspace of the same name starts empty.
    await create(project.alice, project, "workspaces", "Workspace", "home")
    assert (await project.vera.get(files)).json()["items"] == []


async def test_a_viewer_cannot_delete_and_a_missing_one_is_404(project: Project) -> None:
    await create(project.alice, project, "volumes", "Volume", "data")
    assert_status(await project.vera.delete(project.path("volumes", "data")), 403, "Forbidden")
    assert_status(await project.alice.delete(project.path("volumes", "nothing")), 404, "NotFound")
    assert_status(await project.alice.delete(project.path("workspaces", "nothing")), 404, "NotFound")


# -- kubectl ------------------------------------------------------------------------------------------------
async def test_tables_and_discovery_show_volumes_and_workspaces(project: Project) -> None:
    await create(project.alice, project, "volumes", "Volume", "data")
    digest, _ = await upload(project.alice, project, 64 * 1024)
    await project.alice.post(project.path("volumes", "data", "revisions"), json={"digest": digest})
    await create(project.alice, project, "workspaces", "Workspace", "home")
    await project.alice.put(project.path("workspaces", "home", "files", "a.bin"), content=b"\1" * 3000)

    vols = (await project.vera.get(project.path("volumes"), headers={"Accept": TABLE})).json()
    assert [c["name"] for c in vols["columnDefinitions"]] == ["Name", "Latest", "Size", "Writer", "Age"]
    name, latest, size, writer, _ = vols["rows"][0]["cells"]
    assert (name, latest, writer) == ("data", 1, "-")
    assert size.endswith("Ki")
    homes = (await project.vera.get(project.path("workspaces", "home"), headers={"Accept": TABLE})).json()
    assert [c["name"] for c in homes["columnDefinitions"]] == ["Name", "Files", "Size", "Age"]
    assert homes["rows"][0]["cells"][:3] == ["home", 1, "2.9Ki"]

    found = (await project.vera.get(V1)).json()["resources"]
    by_name = {r["name"]: r for r in found}
    assert by_name["volumes"]["shortNames"] == ["vol"]
    assert "deletecollection" not in by_name["volumes"]["verbs"]
    assert by_name["workspaces"]["shortNames"] == ["ws"]
    assert "volumes/revisions" in by_name and "workspaces/files" in by_name
