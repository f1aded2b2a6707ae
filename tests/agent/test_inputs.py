"""Inputs materialised under the attempt directory: url over a real local https server (a CA of its own),
bucket and output from SeaweedFS, and the refusals (http, bad digests, caps, unsafe archives)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import os
import re
import secrets
import socket
import ssl
import tarfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import zstandard
from aiobotocore.session import get_session
from aiohttp import web

from nodus_agent import s3
from nodus_agent.inputcontext import InputContext, InputError, InputSettings, S3Credentials
from nodus_agent.inputoutput import extract_tar_zst, output_keys
from nodus_agent.inputs import materialise
from nodus_schema.configs import Connection, ConnectionSpec, S3Connection, Secret
from nodus_schema.jobs import (
    BucketInput,
    JobInput,
    OutputInput,
    SecretKeySelector,
    StageInput,
    URLInput,
    VolumeInput,
    WorkspaceInput,
)
from nodus_schema.meta import ObjectMeta
from nodus_testing import certs
from nodus_testing.seaweed import SeaweedS3
from nodus_testing.waiting import eventually

BLOB = os.urandom(300_000)
BLOB_SHA = hashlib.sha256(BLOB).hexdigest()
BIG = 2 * 1024 * 1024  # what /big streams, chunked, with no Content-Length
RELEASE = web.AppKey("release", asyncio.Event)


# ---------------------------------------------------------------------------------------------------------
# A real https server on 127.0.0.1, with a certificate from a CA of its own
# ---------------------------------------------------------------------------------------------------------


@dataclass
class Server:
    base: str
    ca: Path
    app: web.Application
    hits: dict[str, int] = field(default_factory=dict)

    def url(self, path: str) -> str:
        return f"{self.base}{path}"


def _app(hits: dict[str, int], port_box: list[int]) -> web.Application:
    async def count(request: web.Request, handler: Any) -> web.StreamResponse:
        hits[request.path] = hits.get(request.path, 0) + 1
        response: web.StreamResponse = await handler(request)
        return response

    async def blob(_: web.Request) -> web.Response:
        return web.Response(body=BLOB)

    async def big(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for _ in range(BIG // 65536):
            await response.write(b"x" * 65536)
        await response.write_eof()
        return response

    async def big_declared(_: web.Request) -> web.Response:
        return web.Response(body=b"y" * BIG)

    async def stall(request: web.Request) -> web.StreamResponse:
        """Half of BIG, then nothing until the test releases it: a download to cancel in the middle."""
        response = web.StreamResponse()
        response.content_length = BIG
        await response.prepare(request)
        await response.write(b"z" * (BIG // 2))
        await request.app[RELEASE].wait()
        await response.write(b"z" * (BIG // 2))
        return response

    async def to_blob(_: web.Request) -> web.Response:
        raise web.HTTPFound("/blob")

    async def to_http(_: web.Request) -> web.Response:
        raise web.HTTPFound(f"http://127.0.0.1:{port_box[0]}/blob")

    app = web.Application(middlewares=[web.middleware(count)])
    app[RELEASE] = asyncio.Event()
    app.router.add_get("/blob", blob)
    app.router.add_get("/big", big)
    app.router.add_get("/big-declared", big_declared)
    app.router.add_get("/stall", stall)
    app.router.add_get("/redirect", to_blob)
    app.router.add_get("/redirect-http", to_http)
    return app


@pytest.fixture(scope="module")
def ca_dir(tmp_path_factory: pytest.TempPathFactory) -> certs.Certs:
    return certs.ensure(tmp_path_factory.mktemp("certs"))


@pytest_asyncio.fixture(scope="module")
async def https(ca_dir: certs.Certs) -> AsyncIterator[Server]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(ca_dir.cert, ca_dir.key)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    hits: dict[str, int] = {}
    app = _app(hits, [port])
    runner = web.AppRunner(app)
    await runner.setup()
    await web.SockSite(runner, sock, ssl_context=context).start()
    yield Server(base=f"https://127.0.0.1:{port}", ca=ca_dir.ca, app=app, hits=hits)
    app[RELEASE].set()
    await runner.cleanup()


def url_input(url: str, sha256: str | None = None, name: str = "data") -> JobInput:
    return JobInput(name=name, url=URLInput(url=url, sha256=sha256))


def ctx_for(server: Server, **settings: Any) -> InputContext:
    return InputContext(namespace="team", settings=InputSettings(ca_bundle=server.ca, **settings))


def leftovers(inputs: Path) -> list[str]:
    """Everything in the staging area: a failed materialisation leaves nothing there."""
    staging = inputs.parent / f".{inputs.name}.nodus" / "tmp"
    return sorted(p.name for p in staging.iterdir()) if staging.exists() else []


# ---------------------------------------------------------------------------------------------------------
# url
# ---------------------------------------------------------------------------------------------------------


async def test_url_input_with_a_good_digest_is_fetched_once(https: Server, tmp_path: Path) -> None:
    inputs = tmp_path / "inputs"
    ctx = ctx_for(https)
    (record,) = await materialise([url_input(https.url("/blob"), BLOB_SHA, "weights")], inputs, ctx)
    assert (inputs / "weights").read_bytes() == BLOB
    assert (record.kind, record.bytes, record.sha256, record.fetched) == ("url", len(BLOB), BLOB_SHA, True)
    assert record.path == "/nodus/inputs/weights"
    before = https.hits["/blob"]

    # A duplicate StartAttempt, or an agent restarted after the fetch: the marker keeps the file.
    (again,) = await materialise([url_input(https.url("/blob"), BLOB_SHA, "weights")], inputs, ctx)
    assert again.fetched is False
    assert again.sha256 == BLOB_SHA
    assert https.hits["/blob"] == before

    # A file changed under the same name is not trusted: fetched again.
    (inputs / "weights").write_bytes(b"tampered")
    (third,) = await materialise([url_input(https.url("/blob"), BLOB_SHA, "weights")], inputs, ctx)
    assert third.fetched is True
    assert (inputs / "weights").read_bytes() == BLOB


async def test_url_input_with_a_bad_digest_fails_naming_both(https: Server, tmp_path: Path) -> None:
    inputs = tmp_path / "inputs"
    wrong = "0" * 64
    with pytest.raises(InputError) as e:
        await materialise([url_input(https.url("/blob"), wrong)], inputs, ctx_for(https))
    assert wrong in str(e.value)
    assert BLOB_SHA in str(e.value)
    assert e.value.retryable is False
    assert not (inputs / "data").exists()
    assert leftovers(inputs) == []


async def test_plain_http_is_refused_even_through_a_redirect(https: Server, tmp_path: Path) -> None:
    inputs = tmp_path / "inputs"
    http_url = https.url("/blob").replace("https://", "http://")
    with pytest.raises(InputError, match="only https://"):
        await materialise([url_input(http_url)], inputs, ctx_for(https))
    with pytest.raises(InputError, match="only https://"):
        await materialise([url_input(https.url("/redirect-http"))], inputs, ctx_for(https))
    assert not (inputs / "data").exists()

    # An https redirect is followed.
    (record,) = await materialise([url_input(https.url("/redirect"), BLOB_SHA)], inputs, ctx_for(https))
    assert record.bytes == len(BLOB)


@pytest.mark.parametrize("path", ["/big", "/big-declared"], ids=["streamed", "content-length"])
async def test_size_cap_aborts_the_download(https: Server, tmp_path: Path, path: str) -> None:
    inputs = tmp_path / "inputs"
    with pytest.raises(InputError, match="size cap of 1000000 bytes"):
        await materialise([url_input(https.url(path))], inputs, ctx_for(https, max_bytes=1_000_000))
    assert not (inputs / "data").exists()
    assert leftovers(inputs) == []
    # Under the cap the same download succeeds.
    (record,) = await materialise([url_input(https.url(path))], inputs, ctx_for(https, max_bytes=BIG))
    assert record.bytes == BIG


async def test_cancelled_mid_download_leaves_nothing_and_a_rerun_completes(
    https: Server, tmp_path: Path
) -> None:
    inputs = tmp_path / "inputs"
    staging = inputs.parent / f".{inputs.name}.nodus" / "tmp"

    def half_written() -> bool:
        return any(p.stat().st_size >= BIG // 2 for p in staging.iterdir()) if staging.exists() else False

    task = asyncio.ensure_future(materialise([url_input(https.url("/stall"))], inputs, ctx_for(https)))
    await eventually(half_written, message="half of /stall on disk")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not (inputs / "data").exists()
    assert leftovers(inputs) == []

    https.app[RELEASE].set()
    (record,) = await materialise([url_input(https.url("/stall"))], inputs, ctx_for(https))
    assert record.bytes == BIG
    https.app[RELEASE].clear()


async def test_a_server_the_node_does_not_trust_is_refused(https: Server, tmp_path: Path) -> None:
    ctx = InputContext(namespace="team")  # the system's CAs only: the test CA is unknown to them
    with pytest.raises(InputError, match="NODUS_AGENT_CA_BUNDLE"):
        await materialise([url_input(https.url("/blob"))], tmp_path / "inputs", ctx)


async def test_a_missing_url_is_an_error_to_fix_not_to_retry(https: Server, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="answered 404") as e:
        await materialise([url_input(https.url("/nothing"))], tmp_path / "inputs", ctx_for(https))
    assert e.value.retryable is False


async def test_refused_kinds_and_bad_names_fail_before_any_fetch(https: Server, tmp_path: Path) -> None:
    stage = JobInput(name="prev", from_stage=StageInput(stage="prep", output="data"))
    before = https.hits.get("/blob", 0)
    with pytest.raises(InputError, match="a fromStage input is resolved by the Pipeline before the run"):
        await materialise([url_input(https.url("/blob")), stage], tmp_path / "inputs", ctx_for(https))
    with pytest.raises(InputError, match="a name is a letter"):
        await materialise([url_input(https.url("/blob"), name="../etc")], tmp_path / "inputs", ctx_for(https))
    assert https.hits.get("/blob", 0) == before


async def test_volume_and_workspace_inputs_are_left_to_the_mounts(https: Server, tmp_path: Path) -> None:
    volume = JobInput(name="weights", volume=VolumeInput(name="llama", revision=1))
    home = JobInput(name="notes", from_workspace=WorkspaceInput(name="home"))
    records = await materialise(
        [volume, url_input(https.url("/blob")), home], tmp_path / "inputs", ctx_for(https)
    )
    assert [r.name for r in records] == ["data"]
    assert sorted(p.name for p in (tmp_path / "inputs").iterdir()) == ["data"]
    with pytest.raises(InputError, match="two inputs have this name"):  # still checked with the others
        await materialise(
            [volume, JobInput(name="weights", from_workspace=WorkspaceInput(name="h"))],
            tmp_path / "inputs",
            ctx_for(https),
        )


def test_input_settings_from_env(tmp_path: Path) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_text("pem")
    s = InputSettings.from_env({"NODUS_AGENT_INPUT_MAX_BYTES": "2Gi", "NODUS_AGENT_CA_BUNDLE": str(bundle)})
    assert (s.max_bytes, s.ca_bundle) == (2 * 1024**3, bundle)
    assert InputSettings.from_env({}).max_bytes == 50 * 1024**3
    with pytest.raises(ValueError, match="NODUS_AGENT_INPUT_MAX_BYTES"):
        InputSettings.from_env({"NODUS_AGENT_INPUT_MAX_BYTES": "lots"})


def test_s3_credentials_from_a_connection_and_its_secret() -> None:
    conn = Connection(
        metadata=ObjectMeta(name="acme-s3", namespace="team"),
        spec=ConnectionSpec(
            type="S3",
            s3=S3Connection(
                endpoint="https://s3.example.com",
                bucket="acme-data",
                access_key_id_ref=SecretKeySelector(name="s3keys", key="id"),
                secret_access_key_ref=SecretKeySelector(name="s3keys", key="secret"),
            ),
        ),
    )
    secret = Secret(
        metadata=ObjectMeta(name="s3keys"),
        data={"id": base64.b64encode(b"AKIA1").decode(), "secret": base64.b64encode(b"shh").decode()},
    )
    creds = S3Credentials.from_connection(conn, {"s3keys": secret})
    assert (creds.bucket, creds.endpoint, creds.access_key, creds.secret_key) == (
        "acme-data",
        "https://s3.example.com",
        "AKIA1",
        "shh",
    )
    assert "shh" not in repr(creds)
    with pytest.raises(ValueError, match="Secret 's3keys' is not there"):
        S3Credentials.from_connection(conn, {})


# ---------------------------------------------------------------------------------------------------------
# bucket and output (SeaweedFS)
# ---------------------------------------------------------------------------------------------------------


@pytest_asyncio.fixture(scope="module")
async def creds(seaweed: SeaweedS3) -> S3Credentials:
    """One bucket for the module (SeaweedFS takes a second or more per new bucket); tests use own keys."""
    made = S3Credentials(
        bucket=f"t{secrets.token_hex(4)}-in",
        endpoint=seaweed.endpoint_url,
        region=seaweed.region,
        access_key=seaweed.access_key,
        secret_key=seaweed.secret_key,
    )
    async with get_session().create_client("s3", **seaweed.client_kwargs()) as s3:
        await s3.create_bucket(Bucket=made.bucket)
    return made


async def put(creds: S3Credentials, objects: dict[str, bytes]) -> None:
    async with s3.client(creds.settings()) as client:
        for key, body in objects.items():
            await client.put_object(Bucket=creds.bucket, Key=key, Body=body)


def bucket_ctx(creds: S3Credentials) -> InputContext:
    return InputContext(namespace="team", connections={"acme-s3": creds})


@pytest.mark.s3
@pytest.mark.slow
async def test_bucket_input_single_object_and_prefix(creds: S3Credentials, tmp_path: Path) -> None:
    await put(
        creds,
        {
            "corpus.bin": BLOB,
            "shards/": b"",  # a console-made "folder": skipped
            "shards/a.txt": b"alpha",
            "shards/sub/b.txt": b"beta",
            "shardsX/not-under-the-prefix": b"no",
        },
    )
    inputs = tmp_path / "inputs"
    one = JobInput(
        name="corpus",
        bucket=BucketInput(uri=f"s3://{creds.bucket}/corpus.bin", connection="acme-s3", sha256=BLOB_SHA),
    )
    tree = JobInput(
        name="shards", bucket=BucketInput(uri=f"s3://{creds.bucket}/shards/", connection="acme-s3")
    )
    file_rec, dir_rec = await materialise([one, tree], inputs, bucket_ctx(creds))
    assert (inputs / "corpus").read_bytes() == BLOB
    assert file_rec.sha256 == BLOB_SHA
    assert (inputs / "shards" / "a.txt").read_bytes() == b"alpha"
    assert (inputs / "shards" / "sub" / "b.txt").read_bytes() == b"beta"
    assert sorted(p.name for p in (inputs / "shards").iterdir()) == ["a.txt", "sub"]
    assert (dir_rec.directory, dir_rec.files, dir_rec.bytes) == (True, 2, 9)

    again = await materialise([one, tree], inputs, bucket_ctx(creds))
    assert [r.fetched for r in again] == [False, False]

    bad = JobInput(
        name="corpus",
        bucket=BucketInput(uri=f"s3://{creds.bucket}/corpus.bin", connection="acme-s3", sha256="1" * 64),
    )
    with pytest.raises(InputError, match="sha256 mismatch"):
        await materialise([bad], tmp_path / "other", bucket_ctx(creds))
    assert not (tmp_path / "other" / "corpus").exists()


@pytest.mark.s3
@pytest.mark.slow
async def test_bucket_input_refusals(creds: S3Credentials, tmp_path: Path) -> None:
    ctx = bucket_ctx(creds)
    missing = JobInput(
        name="x", bucket=BucketInput(uri=f"s3://{creds.bucket}/nope.bin", connection="acme-s3")
    )
    with pytest.raises(InputError, match="does not exist"):
        await materialise([missing], tmp_path / "inputs", ctx)
    other = JobInput(name="x", bucket=BucketInput(uri="s3://someone-else/k", connection="acme-s3"))
    with pytest.raises(InputError, match="is not in bucket"):
        await materialise([other], tmp_path / "inputs", ctx)
    unknown = JobInput(name="x", bucket=BucketInput(uri=f"s3://{creds.bucket}/k", connection="nope"))
    with pytest.raises(InputError, match="Connection 'nope' is not available"):
        await materialise([unknown], tmp_path / "inputs", ctx)


def tar_zst(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return zstandard.ZstdCompressor().compress(raw.getvalue())


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, 0o644
    return info


@pytest.mark.s3
@pytest.mark.slow
async def test_output_input_file_and_directory(creds: S3Credentials, tmp_path: Path) -> None:
    # The outputs module's layout: a file as is, a directory as tar.zst with its members under <name>/,
    # under the store's key prefix.
    root = "nodus/"
    file_key, _ = output_keys("team", "prep", 0, "vocab.txt", root)
    _, tar_key = output_keys("team", "prep", 2, "model", root)
    assert tar_key == "nodus/team/prep/2/outputs/model.tar.zst"
    archive = tar_zst(
        [
            (member("model", tarfile.DIRTYPE), None),
            (member("model/weights.bin"), b"w" * 1000),
            (member("model/sub", tarfile.DIRTYPE), None),
            (member("model/sub/config.json"), b"{}"),
            (member("model/latest", tarfile.SYMTYPE, "weights.bin"), None),
            (member("model/again", tarfile.LNKTYPE, "model/weights.bin"), None),
        ]
    )
    per_rank = f"{root}team/prep/0/outputs/ranked/rank-0"
    await put(creds, {file_key: b"a\nb\n", tar_key: archive, per_rank: b"r"})
    ctx = InputContext(namespace="team", outputs=creds.settings(), outputs_root=root)
    inputs = tmp_path / "inputs"
    vocab = JobInput(name="vocab", output=OutputInput(job="prep", name="vocab.txt"))
    model = JobInput(name="model", output=OutputInput(job="prep", name="model", index=2))
    v, m = await materialise([vocab, model], inputs, ctx)
    assert (inputs / "vocab").read_bytes() == b"a\nb\n"
    assert v.sha256 == hashlib.sha256(b"a\nb\n").hexdigest()
    assert (inputs / "model" / "weights.bin").read_bytes() == b"w" * 1000
    assert (inputs / "model" / "sub" / "config.json").read_bytes() == b"{}"
    assert os.readlink(inputs / "model" / "latest") == "weights.bin"
    assert (inputs / "model" / "again").read_bytes() == b"w" * 1000
    assert (m.directory, m.files, m.bytes) == (True, 2, 1002)

    absent = JobInput(name="gone", output=OutputInput(job="prep", name="nothing", index=0))
    with pytest.raises(InputError, match="has no committed output 'nothing' at index 0"):
        await materialise([absent], inputs, ctx)
    ranked = JobInput(name="ranked", output=OutputInput(job="prep", name="ranked", index=0))
    with pytest.raises(InputError, match="stored per rank"):
        await materialise([ranked], inputs, ctx)


@pytest.mark.parametrize(
    "bad",
    [
        member("../escape.txt"),
        member("/etc/evil"),
        member("link", tarfile.SYMTYPE, "../../outside"),
        member("abs-link", tarfile.SYMTYPE, "/etc/passwd"),
        member("hard", tarfile.LNKTYPE, "../x"),
        member("dev", tarfile.CHRTYPE),
    ],
    ids=["dotdot", "absolute", "symlink-out", "symlink-abs", "hardlink-out", "device"],
)
async def test_unsafe_archive_members_are_refused(tmp_path: Path, bad: tarfile.TarInfo) -> None:
    archive = tmp_path / "out.tar.zst"
    archive.write_bytes(tar_zst([(member("ok.txt"), b"fine"), (bad, b"evil" if bad.isfile() else None)]))
    dest = tmp_path / "a" / "b" / "dest"
    dest.parent.mkdir(parents=True)
    with pytest.raises(InputError, match="archive member"):
        await extract_tar_zst(archive, dest, "m", 1 << 20)
    assert not dest.exists()  # the good member extracted first is gone too
    assert sorted(p.name for p in dest.parent.parent.iterdir()) == ["b"]


async def test_an_archive_past_the_cap_is_refused_before_its_content_is_written(tmp_path: Path) -> None:
    archive = tmp_path / "out.tar.zst"
    # 64 MiB of zeros compress to a few KiB: the cap must count what the archive holds, not its size.
    archive.write_bytes(tar_zst([(member("zeros.bin"), bytes(64 << 20))]))
    assert archive.stat().st_size < 1 << 20
    with pytest.raises(InputError, match="size cap"):
        await extract_tar_zst(archive, tmp_path / "dest", "m", 1 << 20)
    assert not (tmp_path / "dest").exists()


@pytest.mark.s3
@pytest.mark.slow
async def test_an_unsafe_output_leaves_nothing_behind(
    creds: S3Credentials, tmp_path: Path, unique: str
) -> None:
    archive = tar_zst([(member("ok.txt"), b"fine"), (member("../escape.txt"), b"evil")])
    _, tar_key = output_keys("team", unique, 0, "model")
    await put(creds, {tar_key: archive})
    ctx = InputContext(namespace="team", outputs=creds.settings())
    inputs = tmp_path / "work" / "inputs"
    with pytest.raises(InputError, match=re.escape("archive member '../escape.txt'")):
        await materialise([JobInput(name="m", output=OutputInput(job=unique, name="model"))], inputs, ctx)
    assert not (inputs / "m").exists()
    assert leftovers(inputs) == []
