"""The Node authorizer's Volume answers (ADR-0036, nodus_gateway.noding): the revisions a run's grant
carries, and ``nodus.rpc.node.<node>.commit``, which makes a writable mount's upload the next revision only
for the claimant's unfinished Attempt on its own node.

The Job is created through the gateway (so admission pins its revisions and takes the writer claim); its
Attempt is written as the scheduler would (nodus_testing.binding). Requests go over the session's real
nats-server to the real endpoints (tests/conftest.py's ``node_access``, which has no S3 store: a commit is
checked against the blob's record there); the last test HEADs the blob in SeaweedFS, the gateway's store.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from nodus_gateway.blobbing import blob_exists, record_blob
from nodus_gateway.noding import NodeAccess
from nodus_gateway.resources import stores_for
from nodus_gateway.storeaccess import StoreAccess, StoreSettings
from nodus_kit import errors, messaging
from nodus_kit.storing import ObjectStore
from nodus_schema.jobs import Job, JobSpec, VolumeMount
from nodus_schema.meta import ObjectMeta, now_rfc3339
from nodus_schema.noding import (
    GrantedRevision,
    RunSecrets,
    RunSecretsRequest,
    VolumeCommitReply,
    VolumeCommitRequest,
    commit_subject,
    secrets_subject,
)
from nodus_schema.volumes import Volume, VolumeRevision, VolumeStatus, blob_key
from nodus_testing.binding import bind_attempt, finish
from nodus_testing.seaweed import SeaweedS3

API = "/apis/nodus.dev/v1"
NODE = "n1"


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


async def make_volume(stores: dict[str, ObjectStore[Any]], namespace: str, name: str, revisions: int) -> None:
    revs = [
        VolumeRevision(i, f"sha256:{i:064x}", 100 * i, "someone@example.com", now_rfc3339())
        for i in range(1, revisions + 1)
    ]
    status = VolumeStatus(revisions=revs, latest=revisions or None)
    await stores["volumes"].create(Volume(metadata=ObjectMeta(name=name, namespace=namespace), status=status))


@dataclass
class Run:
    namespace: str
    job: Job
    attempt: str
    stores: dict[str, ObjectStore[Any]]

    def commit(self, volume: str = "out", digest: str = "", size: int = 10) -> VolumeCommitRequest:
        return VolumeCommitRequest(
            namespace=self.namespace, attempt=self.attempt, volume=volume, digest=digest, size_bytes=size
        )


@pytest_asyncio.fixture
async def run(api: httpx.AsyncClient, nc: NATS, unique: str, node_access: None) -> Run:
    """A Job that writes Volume ``out`` (revision 1 there), reads ``ref`` (2 revisions) and has ``ref`` as
    an input at revision 1; one Attempt of it bound to n1."""
    stores = stores_for(nc)
    await make_volume(stores, unique, "out", 1)
    await make_volume(stores, unique, "ref", 2)
    spec = {
        "image": "x",
        "expectedDuration": "10m",
        "resources": {"gpu": "H100:1"},
        "volumes": [
            {"volume": "out", "mountPath": "/out", "readOnly": False},
            {"volume": "ref", "mountPath": "/ref", "readOnly": True},
        ],
        "inputs": [{"name": "old", "volume": {"name": "ref", "revision": 1}}],
    }
    resp = await api.post(f"{API}/namespaces/{unique}/jobs", json={"metadata": {"name": "w"}, "spec": spec})
    assert resp.status_code == 201, resp.text
    job: Job = await stores["jobs"].get(unique, "w")
    attempt = f"w-{(job.metadata.uid or '')[:8]}-0-a1"
    await bind_attempt(nc, unique, attempt, job, NODE)
    return Run(unique, job, attempt, stores)


async def ask_commit(nc: NATS, node: str, req: VolumeCommitRequest) -> int:
    reply = await messaging.request(nc, commit_subject(node), req, VolumeCommitReply, timeout=5)
    return reply.revision


async def revisions_of(run: Run, volume: str = "out") -> list[VolumeRevision]:
    vol: Volume = await run.stores["volumes"].get(run.namespace, volume)
    return vol.status.revisions


# -- the grant ----------------------------------------------------------------------------------------------
async def test_the_grant_carries_each_mounted_revision_and_names_a_missing_volume(nc: NATS, run: Run) -> None:
    req = RunSecretsRequest(namespace=run.namespace, attempt=run.attempt)
    grant = await messaging.request(nc, secrets_subject(NODE), req, RunSecrets, timeout=5)
    assert grant.revisions == [
        GrantedRevision(volume="out", revision=1, digest=f"sha256:{1:064x}", size_bytes=100),
        GrantedRevision(volume="ref", revision=2, digest=f"sha256:{2:064x}", size_bytes=200),
        GrantedRevision(volume="ref", revision=1, digest=f"sha256:{1:064x}", size_bytes=100),
    ]
    assert grant.missing == []
    await run.stores["volumes"].delete(run.namespace, "ref")
    grant = await messaging.request(nc, secrets_subject(NODE), req, RunSecrets, timeout=5)
    assert [g.volume for g in grant.revisions] == ["out"]
    assert grant.missing == ["Volume/ref"]


# -- the commit ---------------------------------------------------------------------------------------------
async def test_the_claimants_commit_becomes_the_next_revision_once(nc: NATS, run: Run) -> None:
    digest = digest_of(b"new content")
    await record_blob(run.stores, run.namespace, digest, 11, "agent-upload")
    req = run.commit(digest=digest, size=11)
    assert await ask_commit(nc, NODE, req) == 2
    # A retry (a lost reply, a restarted agent) answers the same revision and appends nothing.
    assert await ask_commit(nc, NODE, req) == 2
    revs = await revisions_of(run)
    assert [(r.revision, r.digest, r.creator, r.attempt) for r in revs][1:] == [
        (2, digest, "job:w", run.attempt)
    ]
    blob = await blob_exists(run.stores, run.namespace, digest)
    assert blob is not None and blob.spec.size_bytes == 11


async def test_a_commit_of_unchanged_content_is_the_latest_revision(nc: NATS, run: Run) -> None:
    """A writer that changed nothing: its content is revision 1 already, and no revision 2 is made."""
    (first,) = await revisions_of(run)
    req = run.commit(digest=first.digest, size=first.size_bytes)
    assert await ask_commit(nc, NODE, req) == 1
    assert [r.revision for r in await revisions_of(run)] == [1]


async def test_a_commit_is_refused_from_another_node_for_a_read_only_mount_or_a_missing_blob(
    nc: NATS, run: Run
) -> None:
    digest = digest_of(b"x" * 10)
    await record_blob(run.stores, run.namespace, digest, 10, "agent-upload")
    with pytest.raises(errors.NotFound):
        await ask_commit(nc, "n2", run.commit(digest=digest))  # not the node the Attempt is bound to
    with pytest.raises(errors.NotFound):
        await ask_commit(nc, NODE, run.commit("ref", digest=digest))  # mounted read-only
    with pytest.raises(errors.NotFound):
        await ask_commit(nc, NODE, run.commit(digest=digest_of(b"never uploaded")))
    with pytest.raises(errors.NotFound):
        await ask_commit(nc, NODE, run.commit(digest=digest, size=9))  # not the size uploaded
    with pytest.raises(errors.NotFound):
        await ask_commit(nc, NODE, run.commit(digest="sha256:../../etc"))
    assert [r.revision for r in await revisions_of(run)] == [1]


async def test_a_commit_is_refused_for_a_job_that_does_not_hold_the_claim(nc: NATS, run: Run) -> None:
    """Another Job mounting the same Volume writable, written without admission (so without the claim),
    and a finished Attempt of the claimant: neither may commit."""
    digest = digest_of(b"y" * 10)
    await record_blob(run.stores, run.namespace, digest, 10, "agent-upload")
    spec = JobSpec(image="x", volumes=[VolumeMount(mount_path="/out", read_only=False, volume="out")])
    meta = ObjectMeta(name="intruder", namespace=run.namespace, uid=str(uuid.uuid4()))
    intruder: Job = await run.stores["jobs"].create(Job(metadata=meta, spec=spec))
    attempt = f"intruder-{(intruder.metadata.uid or '')[:8]}-0-a1"
    await bind_attempt(nc, run.namespace, attempt, intruder, NODE)
    req = VolumeCommitRequest(
        namespace=run.namespace, attempt=attempt, volume="out", digest=digest, size_bytes=10
    )
    with pytest.raises(errors.NotFound):
        await ask_commit(nc, NODE, req)

    await finish(nc, run.namespace, run.attempt)
    with pytest.raises(errors.NotFound):
        await ask_commit(nc, NODE, run.commit(digest=digest))
    assert [r.revision for r in await revisions_of(run)] == [1]


async def test_a_commit_heads_the_blob_in_the_gateways_store(nc: NATS, run: Run, seaweed: SeaweedS3) -> None:
    bucket = f"gw-{secrets.token_hex(4)}"
    access = StoreAccess(
        StoreSettings(
            bucket=bucket,
            endpoint=seaweed.endpoint_url,
            access_key=seaweed.access_key,
            secret_key=seaweed.secret_key,
        )
    )
    try:
        client = await access.client()
        await client.create_bucket(Bucket=bucket)
        data = b"the mount, packed"
        digest = digest_of(data)
        node = NodeAccess(run.stores, access)
        subject = commit_subject(NODE)
        # With a store, a record is not enough: the object must be there.
        await record_blob(run.stores, run.namespace, digest, len(data), "agent-upload")
        with pytest.raises(errors.NotFound):
            await node.commit(run.commit(digest=digest, size=len(data)), subject)
        await client.put_object(Bucket=bucket, Key=blob_key(run.namespace, digest), Body=data)
        with pytest.raises(errors.NotFound):  # another size than the object's
            await node.commit(run.commit(digest=digest, size=len(data) + 1), subject)
        reply = await node.commit(run.commit(digest=digest, size=len(data)), subject)
        assert reply.revision == 2
        assert (await revisions_of(run))[-1].size_bytes == len(data)
    finally:
        await access.close()
