"""Admission checks that read other objects (ADR-0036, nodus_gateway.referencing): Volumes, revisions,
Workspaces, blobs and git refs a Job or Sweep names; pinning; the writer claim; the estimate's downloads.

The gateway runs in-process against the session's real nats-server; the scheduler's and billing's
estimate endpoints are served on the real subjects (a dry run needs them). Volumes are written straight
into the gateway's bucket with the revisions a test needs (a revision's blob is not read at admission).
The git tests run ``git ls-remote`` against the harness's https git server.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import msgspec
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from nodus_billing.quoting import serve_quotes
from nodus_gateway.app import build_app
from nodus_gateway.blobbing import blob_exists, record_blob
from nodus_gateway.estimating import LARGE_DOWNLOAD_BYTES, download_bps
from nodus_gateway.gitrefs import GitSettings, covers
from nodus_gateway.resources import stores_for
from nodus_kit.storing import ObjectStore
from nodus_scheduler.answering import serve_estimates
from nodus_scheduler.cataloging import load_catalog
from nodus_schema.jobs import Job
from nodus_schema.meta import ObjectMeta, now_rfc3339
from nodus_schema.quantities import parse_duration
from nodus_schema.volumes import Volume, VolumeRevision, VolumeStatus, Workspace
from nodus_testing.gitserver import GitServer
from tests.gateway.conftest import ADMIN_TOKEN

API = "/apis/nodus.dev/v1"
DRY = {"dryRun": "All"}
DIGEST = "sha256:" + "ab" * 32


def path(namespace: str, plural: str, *rest: str) -> str:
    return "/".join([f"{API}/namespaces/{namespace}/{plural}", *rest])


def job_body(name: str, **spec: Any) -> dict[str, Any]:
    base = {
        "image": "ghcr.io/acme/train:1.0",
        "expectedDuration": "30m",
        "resources": {"gpu": "H100:1"},
        "placement": {"regions": ["us"]},
    }
    return {"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": name}, "spec": base | spec}


def sweep_body(name: str, **spec: Any) -> dict[str, Any]:
    template = job_body("x", **spec)["spec"]
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Sweep",
        "metadata": {"name": name},
        "spec": {
            "matrix": {"params": {"LR": ["0.1", "0.01"]}},
            "template": {"kind": "Job", "spec": template},
        },
    }


def ro(volume: str, mount: str = "/data", **kw: Any) -> dict[str, Any]:
    return {"volume": volume, "mountPath": mount, "readOnly": True, **kw}


def causes(resp: httpx.Response) -> dict[str, dict[str, str]]:
    """422 Invalid's causes by field."""
    assert resp.status_code == 422, resp.text
    body = resp.json()
    assert body["reason"] == "Invalid"
    return {c["field"]: c for c in body["details"]["causes"]}


@pytest.fixture
def stores(nc: NATS) -> dict[str, ObjectStore[Any]]:
    return stores_for(nc)


@pytest_asyncio.fixture
async def endpoints(nc: NATS) -> AsyncIterator[None]:
    """The scheduler's and billing's estimate endpoints, on the real subjects the gateway asks."""
    subs = [await serve_estimates(nc, load_catalog()), await serve_quotes(nc)]
    yield
    for sub in subs:
        await sub.unsubscribe()


async def make_volume(
    stores: dict[str, ObjectStore[Any]], namespace: str, name: str, revisions: int, size: int = 1000
) -> Volume:
    revs = [
        VolumeRevision(i, f"sha256:{i:064x}", size, "someone@example.com", now_rfc3339())
        for i in range(1, revisions + 1)
    ]
    status = VolumeStatus(revisions=revs, latest=revisions or None)
    vol: Volume = await stores["volumes"].create(
        Volume(metadata=ObjectMeta(name=name, namespace=namespace), status=status)
    )
    return vol


async def stored_job(stores: dict[str, ObjectStore[Any]], namespace: str, name: str) -> Job:
    job: Job = await stores["jobs"].get(namespace, name)
    return job


async def writer_of(stores: dict[str, ObjectStore[Any]], namespace: str, name: str) -> Any:
    vol: Volume = await stores["volumes"].get(namespace, name)
    return vol.status.writer


# -- refusals -----------------------------------------------------------------------------------------------
async def test_unknown_volumes_workspaces_and_blobs_are_refused_at_their_fields_all_at_once(
    api: httpx.AsyncClient, unique: str, endpoints: None
) -> None:
    inputs = [
        {"name": "ds", "volume": {"name": "nope-in"}},
        {"name": "home", "fromWorkspace": {"name": "nope-ws"}},
    ]
    body = job_body("j", volumes=[ro("nope")], inputs=inputs, source={"blob": DIGEST})
    found = causes(await api.post(path(unique, "jobs"), json=body))
    assert set(found) == {
        "spec.volumes[0].volume",
        "spec.inputs[0].volume.name",
        "spec.inputs[1].fromWorkspace.name",
        "spec.source.blob",
    }
    assert all(c["reason"] == "FieldValueNotFound" for c in found.values())
    assert "nodus volume push nope DIR" in found["spec.volumes[0].volume"]["message"]
    assert "nodus workspace push nope-ws" in found["spec.inputs[1].fromWorkspace.name"]["message"]
    assert f"/namespaces/{unique}/blobs/{DIGEST}" in found["spec.source.blob"]["message"]
    assert (await api.get(path(unique, "jobs", "j"))).status_code == 404


async def test_a_blob_of_another_project_is_not_found_here(
    api: httpx.AsyncClient, unique: str, endpoints: None, stores: dict[str, ObjectStore[Any]]
) -> None:
    await record_blob(stores, f"{unique}-other", DIGEST, 10, "mallory")
    found = causes(await api.post(path(unique, "jobs"), json=job_body("j", source={"blob": DIGEST})))
    assert set(found) == {"spec.source.blob"}


async def test_revision_zero_and_a_revision_the_volume_does_not_have_are_refused(
    api: httpx.AsyncClient, unique: str, endpoints: None, stores: dict[str, ObjectStore[Any]]
) -> None:
    await make_volume(stores, unique, "data", revisions=2)
    # 0 is the schema's rule (revisions count from 1): refused before anything is read.
    zero = causes(await api.post(path(unique, "jobs"), json=job_body("j", volumes=[ro("data", revision=0)])))
    assert set(zero) == {"spec.volumes[0].revision"}
    assert zero["spec.volumes[0].revision"]["reason"] == "FieldValueInvalid"

    inputs = [{"name": "ds", "volume": {"name": "data", "revision": 9}}]
    body = job_body("j", volumes=[ro("data", revision=9)], inputs=inputs)
    found = causes(await api.post(path(unique, "jobs"), json=body))
    assert set(found) == {"spec.volumes[0].revision", "spec.inputs[0].volume.revision"}
    message = found["spec.volumes[0].revision"]["message"]
    assert message.startswith("Not found: 9: Volume 'data' has revisions 1, 2;"), message


async def test_a_volume_without_revisions_cannot_be_read(
    api: httpx.AsyncClient, unique: str, endpoints: None, stores: dict[str, ObjectStore[Any]]
) -> None:
    await make_volume(stores, unique, "empty", revisions=0)
    inputs = [{"name": "ds", "volume": {"name": "empty"}}]
    found = causes(
        await api.post(path(unique, "jobs"), json=job_body("j", volumes=[ro("empty")], inputs=inputs))
    )
    assert set(found) == {"spec.volumes[0].volume", "spec.inputs[0].volume.name"}
    assert "nodus volume push empty DIR" in found["spec.volumes[0].volume"]["message"]


async def test_a_sweep_template_is_checked_at_its_wire_path(
    api: httpx.AsyncClient, unique: str, endpoints: None, stores: dict[str, ObjectStore[Any]]
) -> None:
    await make_volume(stores, unique, "data", revisions=1)
    inputs = [{"name": "ds", "volume": {"name": "data", "revision": 3}}]
    found = causes(await api.post(path(unique, "sweeps"), json=sweep_body("s", inputs=inputs)))
    assert set(found) == {"spec.template.spec.inputs[0].volume.revision"}


# -- pinning ------------------------------------------------------------------------------------------------
async def test_the_latest_revision_is_pinned_into_the_stored_job_and_kept_by_a_reapply(
    api: httpx.AsyncClient, unique: str, endpoints: None, stores: dict[str, ObjectStore[Any]]
) -> None:
    await make_volume(stores, unique, "data", revisions=3)
    await make_volume(stores, unique, "ref", revisions=2)
    inputs = [{"name": "ds", "volume": {"name": "ref"}}]
    body = job_body("j", volumes=[ro("data")], inputs=inputs)
    resp = await api.post(path(unique, "jobs"), json=body)
    assert resp.status_code == 201, resp.text
    job = await stored_job(stores, unique, "j")
    assert job.spec.volumes[0].revision == 3 and job.spec.inputs[0].volume is not None
    assert job.spec.inputs[0].volume.revision == 2
    # A newer revision does not move a pinned Job; applying the manifest it came from is not a change.
    await make_volume(stores, unique, "later", revisions=1)
    body["spec"]["maxCostUSD"] = "50"
    resp = await api.patch(
        path(unique, "jobs", "j"),
        content=msgspec.json.encode(body),
        params={"fieldManager": "test"},
        headers={"Content-Type": "application/apply-patch+yaml"},
    )
    assert resp.status_code == 200, resp.text
    job = await stored_job(stores, unique, "j")
    assert (job.spec.volumes[0].revision, job.spec.max_cost_usd) == (3, "50")
    # Asking for another revision is a change of an immutable field.
    body["spec"]["volumes"][0]["revision"] = 1
    put = {**body, "metadata": {"name": "j", "resourceVersion": job.metadata.resource_version}}
    refused = causes(await api.put(path(unique, "jobs", "j"), json=put))
    assert "spec.volumes[0].revision" in refused


async def test_a_sweep_template_is_pinned_for_every_cell(
    api: httpx.AsyncClient, unique: str, endpoints: None, stores: dict[str, ObjectStore[Any]]
) -> None:
    await make_volume(stores, unique, "data", revisions=4)
    resp = await api.post(path(unique, "sweeps"), json=sweep_body("s", volumes=[ro("data")]))
    assert resp.status_code == 201, resp.text
    assert resp.json()["spec"]["template"]["spec"]["volumes"][0]["revision"] == 4
    stored = await stores["sweeps"].get(unique, "s")
    assert stored.spec.template.spec.volumes[0].revision == 4


async def test_a_dry_run_pins_in_its_answer_and_claims_nothing(
    api: httpx.AsyncClient, unique: str, endpoints: None, stores: dict[str, ObjectStore[Any]]
) -> None:
    await make_volume(stores, unique, "data", revisions=2)
    await make_volume(stores, unique, "out", revisions=0)
    await record_blob(stores, unique, DIGEST, 10, "me")
    before = await blob_exists(stores, unique, DIGEST)
    body = job_body(
        "j",
        volumes=[ro("data"), {"volume": "out", "mountPath": "/out", "readOnly": False}],
        source={"blob": DIGEST},
    )
    resp = await api.post(path(unique, "jobs"), json=body, params=DRY)
    assert resp.status_code == 201, resp.text
    assert resp.json()["spec"]["volumes"][0]["revision"] == 2
    assert await writer_of(stores, unique, "out") is None
    assert (await api.get(path(unique, "jobs", "j"))).status_code == 404
    after = await blob_exists(stores, unique, DIGEST)
    assert after is not None and before is not None
    assert after.metadata.resource_version == before.metadata.resource_version  # not touched


async def test_a_create_touches_its_source_blob(
    api: httpx.AsyncClient, unique: str, endpoints: None, stores: dict[str, ObjectStore[Any]]
) -> None:
    await record_blob(stores, unique, DIGEST, 10, "me")
    old = "2020-01-01T00:00:00Z"
    blob = await blob_exists(stores, unique, DIGEST)
    assert blob is not None
    await stores["blobs"].update(
        msgspec.structs.replace(blob, status=msgspec.structs.replace(blob.status, last_used_time=old))
    )
    resp = await api.post(path(unique, "jobs"), json=job_body("j", source={"blob": DIGEST}))
    assert resp.status_code == 201, resp.text
    touched = await blob_exists(stores, unique, DIGEST)
    assert touched is not None and touched.status.last_used_time not in (None, old)


# -- the writer claim ---------------------------------------------------------------------------------------
def writer_body(name: str, volume: str = "out") -> dict[str, Any]:
    return job_body(name, volumes=[{"volume": volume, "mountPath": "/out", "readOnly": False}])


async def test_a_second_writer_is_refused_while_the_first_runs_and_takes_over_when_it_finished(
    api: httpx.AsyncClient, unique: str, endpoints: None, stores: dict[str, ObjectStore[Any]]
) -> None:
    await make_volume(stores, unique, "out", revisions=1)
    first = await api.post(path(unique, "jobs"), json=writer_body("first"))
    assert first.status_code == 201, first.text
    uid = first.json()["metadata"]["uid"]
    holder = await writer_of(stores, unique, "out")
    assert (holder.job, holder.uid) == ("first", uid)

    refused = await api.post(path(unique, "jobs"), json=writer_body("second"))
    assert refused.status_code == 409, refused.text
    status = refused.json()
    assert status["reason"] == "Conflict" and 'Job "first"' in status["message"] and status["fix"]
    assert (await api.get(path(unique, "jobs", "second"))).status_code == 404
    # A dry run says so too.
    assert (await api.post(path(unique, "jobs"), json=writer_body("second"), params=DRY)).status_code == 409

    def finished(job: Job) -> Job:
        return msgspec.structs.replace(job, status=msgspec.structs.replace(job.status, phase="Succeeded"))

    await stores["jobs"].mutate(unique, "first", finished)
    second = await api.post(path(unique, "jobs"), json=writer_body("second"))
    assert second.status_code == 201, second.text
    holder = await writer_of(stores, unique, "out")
    assert (holder.job, holder.uid) == ("second", second.json()["metadata"]["uid"])


async def test_a_deleted_or_re_created_writer_loses_its_claim(
    api: httpx.AsyncClient, unique: str, endpoints: None, stores: dict[str, ObjectStore[Any]]
) -> None:
    await make_volume(stores, unique, "out", revisions=0)
    assert (await api.post(path(unique, "jobs"), json=writer_body("first"))).status_code == 201
    assert (await api.delete(path(unique, "jobs", "first"))).status_code == 200
    # The same name again is another Job (another uid): it takes the claim over.
    again = await api.post(path(unique, "jobs"), json=writer_body("first"))
    assert again.status_code == 201, again.text
    assert (await writer_of(stores, unique, "out")).uid == again.json()["metadata"]["uid"]


async def test_of_concurrent_writers_exactly_one_is_admitted(
    api: httpx.AsyncClient, unique: str, endpoints: None, stores: dict[str, ObjectStore[Any]]
) -> None:
    await make_volume(stores, unique, "out", revisions=1)
    names = [f"w{i}" for i in range(6)]
    answers = await asyncio.gather(*(api.post(path(unique, "jobs"), json=writer_body(n)) for n in names))
    codes = sorted(r.status_code for r in answers)
    assert codes == [201] + [409] * 5, [r.text for r in answers]
    (winner,) = [r.json()["metadata"] for r in answers if r.status_code == 201]
    holder = await writer_of(stores, unique, "out")
    assert (holder.job, holder.uid) == (winner["name"], winner["uid"])
    listed = (await api.get(path(unique, "jobs"))).json()["items"]
    assert [j["metadata"]["name"] for j in listed] == [winner["name"]]  # the losers were removed again


# -- the estimate -------------------------------------------------------------------------------------------
async def test_the_estimate_adds_the_download_of_the_mounted_revisions(
    api: httpx.AsyncClient, unique: str, endpoints: None, stores: dict[str, ObjectStore[Any]]
) -> None:
    size = LARGE_DOWNLOAD_BYTES + 1
    await make_volume(stores, unique, "big", revisions=1, size=size)
    plain = (await api.post(path(unique, "jobs"), json=job_body("j"), params=DRY)).json()["status"][
        "estimate"
    ]
    resp = await api.post(path(unique, "jobs"), json=job_body("j", volumes=[ro("big")]), params=DRY)
    assert resp.status_code == 201, resp.text
    estimate = resp.json()["status"]["estimate"]
    extra = parse_duration(estimate["startup"]["cold"]["p50"]) - parse_duration(
        plain["startup"]["cold"]["p50"]
    )
    micros = -(-size * 1_000_000 // download_bps())
    assert extra.days * 86_400_000_000 + extra.seconds * 1_000_000 + extra.microseconds == micros
    extra90 = parse_duration(estimate["startup"]["cold"]["p90"]) - parse_duration(
        plain["startup"]["cold"]["p90"]
    )
    assert extra90 == extra
    (warning,) = [w for w in estimate["warnings"] if w["code"] == "LargeDownload"]
    assert str(size) in warning["message"]
    assert "LargeDownload" not in [w["code"] for w in plain.get("warnings", [])]


async def test_a_small_download_has_no_warning(
    api: httpx.AsyncClient, unique: str, endpoints: None, stores: dict[str, ObjectStore[Any]]
) -> None:
    await make_volume(stores, unique, "small", revisions=1, size=1000)
    resp = await api.post(path(unique, "jobs"), json=job_body("j", volumes=[ro("small")]), params=DRY)
    estimate = resp.json()["status"]["estimate"]
    assert "LargeDownload" not in [w["code"] for w in estimate.get("warnings", [])]


# -- workspaces ---------------------------------------------------------------------------------------------
async def test_an_existing_workspace_is_admitted(
    api: httpx.AsyncClient, unique: str, endpoints: None, stores: dict[str, ObjectStore[Any]]
) -> None:
    await stores["workspaces"].create(Workspace(metadata=ObjectMeta(name="home", namespace=unique)))
    inputs = [{"name": "home", "fromWorkspace": {"name": "home", "path": "runs"}}]
    resp = await api.post(path(unique, "jobs"), json=job_body("j", inputs=inputs))
    assert resp.status_code == 201, resp.text


# -- git ----------------------------------------------------------------------------------------------------
@pytest.fixture
def git_settings(git_server: GitServer) -> GitSettings:
    """The gateway resolves owner/name against the test git server and trusts its CA."""
    return GitSettings(host=git_server.base, ca_bundle=str(git_server.ca))


@pytest.fixture
def git_host(git_server: GitServer) -> GitServer:
    return git_server


@asynccontextmanager
async def gateway_with(nc: NATS, settings: GitSettings) -> AsyncIterator[httpx.AsyncClient]:
    """A client of a gateway with other git settings than the module's."""
    app = build_app(stores_for(nc), admin_token=ADMIN_TOKEN, git=settings)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://gateway",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    ) as client:
        yield client


def git_body(name: str, repo: str, ref: str | None = None, **spec: Any) -> dict[str, Any]:
    git = {"repo": repo} | ({"ref": ref} if ref is not None else {})
    return job_body(name, source={"git": git}, **spec)


def ls_remotes(server: GitServer, repo: str) -> int:
    return sum(1 for r in server.requests if r.method == "GET" and r.path == f"/{repo}.git/info/refs")


async def test_a_git_ref_is_checked_with_ls_remote(
    api: httpx.AsyncClient, unique: str, endpoints: None, git_host: GitServer
) -> None:
    repo, commit = git_host.create_repo(f"acme/{unique}", {"train.py": "print(1)\n"})
    repo.tag("v1", commit)
    for i, ref in enumerate(("main", "v1", "refs/heads/main", None, "f" * 40)):
        resp = await api.post(path(unique, "jobs"), json=git_body(f"ok{i}", f"acme/{unique}", ref))
        assert resp.status_code == 201, (ref, resp.text)
    found = causes(await api.post(path(unique, "jobs"), json=git_body("j", f"acme/{unique}", "nope")))
    assert set(found) == {"spec.source.git.ref"}
    assert found["spec.source.git.ref"]["message"] == (
        f"Not found: 'nope': {git_host.url(f'acme/{unique}')} has no branch or tag 'nope'"
    )
    short = causes(await api.post(path(unique, "jobs"), json=git_body("j", f"acme/{unique}", commit[:12])))
    assert "full 40-character commit id" in short["spec.source.git.ref"]["message"]
    # A repository that is not there, by owner/name or by URL.
    missing = causes(await api.post(path(unique, "jobs"), json=git_body("j", f"acme/{unique}-gone", "main")))
    assert missing["spec.source.git.repo"]["reason"] == "FieldValueNotFound"
    url = git_host.url(f"acme/{unique}-gone2")
    assert set(causes(await api.post(path(unique, "jobs"), json=git_body("j", url)))) == {
        "spec.source.git.repo"
    }


async def test_a_burst_of_creates_runs_git_once(
    api: httpx.AsyncClient, unique: str, endpoints: None, git_host: GitServer
) -> None:
    git_host.create_repo(f"acme/{unique}", {"a": "1"})
    bodies = [git_body(f"b{i}", f"acme/{unique}", "main") for i in range(5)]
    answers = await asyncio.gather(*(api.post(path(unique, "jobs"), json=b) for b in bodies))
    assert [r.status_code for r in answers] == [201] * 5
    assert ls_remotes(git_host, f"acme/{unique}") == 1


async def test_a_private_repository_is_checked_with_its_git_connections_token(
    api: httpx.AsyncClient, unique: str, endpoints: None, git_host: GitServer
) -> None:
    name = f"private/{unique}"
    git_host.create_repo(name, {"a": "1"})
    # Without a token the host answers 401: not found, or private.
    refused = causes(await api.post(path(unique, "jobs"), json=git_body("j", name, "main")))
    assert "spec.connections" in refused["spec.source.git.repo"]["message"]

    secret = {"metadata": {"name": "gittoken"}, "stringData": {"token": git_host.token}}
    assert (await api.post(path(unique, "secrets"), json=secret)).status_code == 201
    conn = {
        "metadata": {"name": "githost"},
        "spec": {
            "type": "Git",
            "git": {"url": git_host.base, "tokenRef": {"name": "gittoken", "key": "token"}},
        },
    }
    assert (await api.post(path(unique, "connections"), json=conn)).status_code == 201, conn
    resp = await api.post(path(unique, "jobs"), json=git_body("j", name, "main", connections=["githost"]))
    assert resp.status_code == 201, resp.text
    sent = [
        r.authorization for r in git_host.requests if r.path.startswith(f"/{name}.git") and r.status == 200
    ]
    assert sent and all(a is not None and a.startswith("Basic ") for a in sent)
    assert git_host.token not in resp.text


async def test_a_wrong_token_is_never_quoted(
    api: httpx.AsyncClient, unique: str, endpoints: None, git_host: GitServer
) -> None:
    name = f"private/{unique}"
    git_host.create_repo(name, {"a": "1"})
    wrong = f"wrong-{unique}-token"
    secret = {"metadata": {"name": "gittoken"}, "stringData": {"token": wrong}}
    assert (await api.post(path(unique, "secrets"), json=secret)).status_code == 201
    conn = {
        "metadata": {"name": "githost"},
        "spec": {
            "type": "Git",
            "git": {"url": git_host.base, "tokenRef": {"name": "gittoken", "key": "token"}},
        },
    }
    assert (await api.post(path(unique, "connections"), json=conn)).status_code == 201
    resp = await api.post(path(unique, "jobs"), json=git_body("j", name, "main", connections=["githost"]))
    assert set(causes(resp)) == {"spec.source.git.repo"}
    assert wrong not in resp.text
    assert base64.b64encode(f"x-access-token:{wrong}".encode()).decode() not in resp.text


async def test_an_unreachable_host_is_said_at_the_repository(nc: NATS, unique: str, endpoints: None) -> None:
    unreachable = GitSettings(host="https://127.0.0.1:9")  # nothing listens on the discard port
    async with gateway_with(nc, unreachable) as api:
        found = causes(await api.post(path(unique, "jobs"), json=git_body("j", f"acme/{unique}", "main")))
    message = found["spec.source.git.repo"]["message"]
    assert "could not be reached" in message and "https://127.0.0.1:9/" in message


async def test_a_host_that_does_not_answer_in_time_is_cut_off(
    nc: NATS, unique: str, endpoints: None, git_host: GitServer, git_settings: GitSettings
) -> None:
    git_host.create_repo(f"acme/{unique}", {"a": "1"})
    async with gateway_with(nc, msgspec.structs.replace(git_settings, timeout_s=0.001)) as api:
        found = causes(await api.post(path(unique, "jobs"), json=git_body("j", f"acme/{unique}", "main")))
    assert "no answer within 0.001 s" in found["spec.source.git.repo"]["message"]


async def test_a_repository_on_a_host_not_allowed_is_refused_without_asking_it(
    api: httpx.AsyncClient, unique: str, endpoints: None, git_host: GitServer
) -> None:
    """Admission runs git inside the cluster: a URL a user sends must not reach an internal address."""
    for url in ("https://169.254.169.254/latest/meta-data.git", "https://localhost:9/x.git"):
        before = len(git_host.requests)
        found = causes(await api.post(path(unique, "jobs"), json=git_body("j", url, "main")))
        message = found["spec.source.git.repo"]["message"]
        assert "fetches code only from" in message and "NODUS_GIT_ALLOWED_HOSTS" in message
        assert len(git_host.requests) == before


def test_the_allowed_hosts_are_the_git_hosts_the_public_forges_or_a_list() -> None:
    default = GitSettings(host="https://git.acme.io")
    assert default.allows("https://git.acme.io/team/x.git") and default.allows("https://github.com/a/b")
    assert not default.allows("https://10.0.0.7/a/b.git")
    only = GitSettings(allowed_hosts=("git.internal:8443",))
    assert only.allows("https://git.internal:8443/a.git") and only.allows("https://github.com/a/b")
    assert not only.allows("https://gitlab.com/a/b")
    assert GitSettings(allowed_hosts=("*",)).allows("https://10.0.0.7/a/b.git")


def test_a_connection_url_covers_only_its_own_paths() -> None:
    assert covers("https://github.com", "https://github.com/acme/x.git")
    assert covers("https://git.example.com/team/", "https://git.example.com/team/x.git")
    assert not covers("https://github.com", "https://github.com.evil.io/acme/x.git")
    assert not covers("https://git.example.com/team", "https://git.example.com/team-b/x.git")
    assert not covers("", "https://github.com/acme/x.git")
