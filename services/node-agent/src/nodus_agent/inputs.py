"""A Job's inputs, materialised under the attempt directory before its program starts (ADR-0020).

Each input ``<name>`` ends up at ``<attempt dir>/inputs/<name>`` (the program sees ``/nodus/inputs/<name>``):

* ``url``: one file over **https only**, streamed to disk under a size cap, its sha256 checked when given;
* ``bucket``: one S3 object (``s3://bucket/key``) or every object under a prefix (``s3://bucket/dir/``,
  a directory), read with the endpoint and keys of a Connection (:class:`S3Credentials`);
* ``output``: another Job's committed output from the agent's own output store: a file, or a directory
  archived as ``.tar.zst`` and extracted safely here.

``volume``, ``fromWorkspace`` and ``fromStage`` are refused (admission refuses them too).

Safe to kill at any line, and idempotent: everything is fetched into a private staging directory beside
``inputs/`` and renamed into place only once complete and verified, so the final name never holds a partial
file; a small marker written after the rename lets a second :func:`materialise` (a duplicate StartAttempt,
an agent restarted mid-way) keep what is already there instead of fetching it again.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import os
import posixpath
import re
import secrets
import shutil
import ssl
import tarfile
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar
from urllib.parse import urljoin, urlsplit

import aiohttp
import msgspec
import zstandard
from botocore.exceptions import BotoCoreError, ClientError

from nodus_agent import s3
from nodus_agent.s3 import S3Settings
from nodus_schema.configs import Connection, Secret
from nodus_schema.jobs import JobInput, SecretKeySelector
from nodus_schema.quantities import parse_bytes

__all__ = [
    "CONTAINER_INPUTS",
    "InputContext",
    "InputError",
    "InputRecord",
    "InputSettings",
    "S3Credentials",
    "extract_tar_zst",
    "materialise",
    "output_keys",
    "secret_value",
]

GiB: Final = 1 << 30
CHUNK: Final = 1 << 20
"""Bytes handed to a worker thread at a time: large enough that the thread hop costs nothing."""
MAX_REDIRECTS: Final = 5
CONTAINER_INPUTS: Final = "/nodus/inputs"
INPUT_NAME: Final = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
REFUSED_KINDS: Final = {"volume": "Volumes", "fromWorkspace": "Workspaces", "fromStage": "Pipelines"}
_S3_URI: Final = re.compile(r"s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/(?P<key>.*)")
_SHA256: Final = re.compile(r"[0-9a-f]{64}")
_REDIRECTS: Final = (301, 302, 303, 307, 308)
_NO_SUCH_KEY: Final = ("NoSuchKey", "404", "NotFound")
_DENIED: Final = ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch")

T = TypeVar("T")


class InputError(Exception):
    """One input could not be materialised; the message says what to change.

    ``retryable`` is True when the same input may well work on a second try (a network error, a 5xx),
    False when only a change to the Job, its Connection or the data can help (a bad digest, a 404).
    """

    def __init__(self, name: str, message: str, *, retryable: bool = False) -> None:
        super().__init__(f"input {name!r}: {message}")
        self.input, self.retryable = name, retryable


# ---------------------------------------------------------------------------------------------------------
# Settings, credentials and the context a materialisation runs in
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InputSettings:
    """The agent's limits on inputs (``NODUS_AGENT_INPUT_*``)."""

    max_bytes: int = 50 * GiB
    """Per input: a file's size, a prefix's total, an archive's extracted total. Exceeding it aborts."""
    ca_bundle: Path | None = None
    """Extra CA certificates (PEM) trusted for url inputs, besides the system's (a private mirror, tests)."""
    connect_timeout_s: float = 30.0
    read_timeout_s: float = 300.0
    """The longest a download may stall between two reads; a slow but moving download is never cut."""
    parallel: int = 4
    """Inputs fetched at once."""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> InputSettings:
        """``NODUS_AGENT_INPUT_MAX_BYTES`` (a quantity: ``50Gi``), ``NODUS_AGENT_CA_BUNDLE`` (a PEM file),
        ``NODUS_AGENT_INPUT_PARALLEL``; raises ValueError naming the variable to fix."""
        raw = env.get("NODUS_AGENT_INPUT_MAX_BYTES", "50Gi")
        try:
            max_bytes = parse_bytes(raw)
        except ValueError as e:
            raise ValueError(f"NODUS_AGENT_INPUT_MAX_BYTES={raw!r}: {e}") from None
        if max_bytes < 1:
            raise ValueError(f"NODUS_AGENT_INPUT_MAX_BYTES={raw!r} must be positive")
        bundle = env.get("NODUS_AGENT_CA_BUNDLE") or None
        if bundle is not None and not Path(bundle).is_file():
            raise ValueError(f"NODUS_AGENT_CA_BUNDLE={bundle!r} is not a file: point it at a PEM bundle")
        parallel = env.get("NODUS_AGENT_INPUT_PARALLEL", "4")
        if not parallel.isdigit() or int(parallel) < 1:
            raise ValueError(f"NODUS_AGENT_INPUT_PARALLEL={parallel!r} must be a whole number, at least 1")
        return cls(max_bytes=max_bytes, ca_bundle=Path(bundle) if bundle else None, parallel=int(parallel))


@dataclass(frozen=True)
class S3Credentials:
    """An S3 Connection resolved for use: its endpoint, its bucket and the keys from its Secret."""

    bucket: str
    endpoint: str | None = None
    region: str = "us-east-1"
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)  # never in a repr, so never in a log line

    def settings(self) -> S3Settings:
        return S3Settings(
            bucket=self.bucket,
            endpoint=self.endpoint,
            region=self.region,
            access_key=self.access_key,
            secret_key=self.secret_key,
        )

    @classmethod
    def from_connection(cls, conn: Connection, secrets: Mapping[str, Secret]) -> S3Credentials:
        """Resolve an S3 Connection with the Secrets it names (``secrets`` by name, values not redacted).

        Raises ValueError saying which Connection field or Secret key to fix."""
        spec = conn.spec.s3
        name = conn.metadata.name
        if conn.spec.type != "S3" or spec is None or not spec.bucket:
            raise ValueError(f"Connection {name!r} is not an S3 Connection with a bucket")
        access = secret_key = None
        if spec.access_key_id_ref is not None and spec.secret_access_key_ref is not None:
            access = secret_value(secrets, spec.access_key_id_ref, f"Connection {name!r} accessKeyIdRef")
            secret_key = secret_value(
                secrets, spec.secret_access_key_ref, f"Connection {name!r} secretAccessKeyRef"
            )
        return cls(
            bucket=spec.bucket,
            endpoint=spec.endpoint,
            region=spec.region or "us-east-1",
            access_key=access,
            secret_key=secret_key,
        )


def secret_value(secrets: Mapping[str, Secret], ref: SecretKeySelector, what: str) -> str:
    """The plain value of one Secret key (``data`` is base64, as stored). The error never shows a value."""
    secret = secrets.get(ref.name or "")
    if secret is None:
        raise ValueError(f"{what}: Secret {ref.name!r} is not there; create it in the Job's project")
    if ref.key in secret.string_data:  # not folded yet (the API folds it on write)
        return secret.string_data[ref.key or ""]
    encoded = secret.data.get(ref.key or "")
    if encoded is None:
        raise ValueError(f"{what}: Secret {ref.name!r} has no key {ref.key!r}; add it or fix the reference")
    try:
        return base64.b64decode(encoded, validate=True).decode()
    except (binascii.Error, ValueError):
        raise ValueError(f"{what}: Secret {ref.name!r} key {ref.key!r} is not base64 UTF-8 text") from None


@dataclass(frozen=True)
class InputContext:
    """What a materialisation needs beyond the inputs themselves."""

    namespace: str
    """The Job's project: where ``output`` inputs are looked up."""
    connections: Mapping[str, S3Credentials] = field(default_factory=dict)
    """The Job's S3 Connections by name, already resolved (only those bucket inputs name are needed)."""
    outputs: S3Settings | None = None
    """The store committed outputs live in (``<root><namespace>/<job>/<index>/outputs/<name>``)."""
    outputs_root: str = ""
    """The key prefix of that store (empty, or ending in '/')."""
    settings: InputSettings = field(default_factory=InputSettings)


class InputRecord(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel"):
    """What one input became: for the attempt's report and for the idempotency marker."""

    name: str
    kind: str
    """url, bucket or output."""
    source: str
    """Where it came from: the URL without its query (signed URLs carry keys there), or an s3:// URI."""
    path: str
    """Where the program sees it: /nodus/inputs/<name>."""
    directory: bool = False
    bytes: int = 0
    files: int = 1
    sha256: str | None = None
    """The digest of the file (not set for a directory)."""
    fetched: bool = True
    """False when an earlier materialisation had already put it in place."""


class _Marker(msgspec.Struct, kw_only=True, rename="camel"):
    fingerprint: str
    mtime_ns: int
    record: InputRecord


_marker_encoder = msgspec.json.Encoder()
_marker_decoder = msgspec.json.Decoder(_Marker)


# ---------------------------------------------------------------------------------------------------------
# Materialise
# ---------------------------------------------------------------------------------------------------------


async def materialise(inputs: Sequence[JobInput], dir: Path, ctx: InputContext) -> list[InputRecord]:
    """Put every input under ``dir`` (the attempt's ``inputs/``), in order of ``inputs``; one record each.

    Checks every input before fetching any. Raises :class:`InputError` on the first input that fails; the
    others are cancelled, and nothing partial is left under a final name. One call per ``dir`` at a time
    (the runner's lock serialises assignments)."""
    for inp in inputs:
        _check(inp)
    names = [inp.name for inp in inputs]
    for name in names:
        if names.count(name) > 1:
            raise InputError(str(name), "two inputs have this name; names must be unique")
    run = _Run(await asyncio.to_thread(_Layout.prepare, dir), _Clients())
    gate = asyncio.Semaphore(ctx.settings.parallel)

    async def one(inp: JobInput) -> InputRecord:
        async with gate:
            return await _materialise_one(inp, run, ctx)

    tasks = [asyncio.ensure_future(one(inp)) for inp in inputs]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # every staging file is cleaned up first
        raise
    finally:
        await run.clients.aclose()


def _kind_of(inp: JobInput) -> str:
    """The one source an input names (``url``, ``bucket``, ``output``, or a refused kind); "" for none."""
    kinds = _kinds(inp)
    return kinds[0] if len(kinds) == 1 else ""


def _kinds(inp: JobInput) -> list[str]:
    candidates = (
        ("url", inp.url),
        ("bucket", inp.bucket),
        ("output", inp.output),
        ("volume", inp.volume),
        ("fromWorkspace", inp.from_workspace),
        ("fromStage", inp.from_stage),
    )
    return [kind for kind, value in candidates if value is not None]


def _check(inp: JobInput) -> None:
    """Admission's rules again, as the agent needs them: a bad name would escape ``inputs/``."""
    name = inp.name or ""
    if not INPUT_NAME.fullmatch(name):
        raise InputError(name, "a name is a letter, then up to 63 letters, digits or '_'")
    kinds = _kinds(inp)
    if len(kinds) != 1:
        raise InputError(name, f"an input has exactly one of url, bucket or output; this one has {kinds}")
    if kinds[0] in REFUSED_KINDS:
        raise InputError(
            name,
            f"{kinds[0]} inputs are not supported yet (Nodus has no {REFUSED_KINDS[kinds[0]]}); "
            "use url, bucket or output",
        )
    digest = inp.url.sha256 if inp.url else inp.bucket.sha256 if inp.bucket else None
    if digest is not None and not _SHA256.fullmatch(digest):
        raise InputError(name, f"sha256 {digest!r} is not 64 lower case hex digits")


async def _materialise_one(inp: JobInput, run: _Run, ctx: InputContext) -> InputRecord:
    name, kind = inp.name or "", _kind_of(inp)
    fingerprint = _fingerprint(inp, ctx)
    kept = await asyncio.to_thread(run.layout.kept, name, fingerprint)
    if kept is not None:
        return msgspec.structs.replace(kept, fetched=False)
    record = await _FETCHERS[kind](inp, run, ctx)
    await asyncio.to_thread(run.layout.mark, name, fingerprint, record)
    return record


def _fingerprint(inp: JobInput, ctx: InputContext) -> str:
    """Same spec from the same place: what an existing marker must match to be kept."""
    where: Any = None
    if inp.bucket is not None:
        creds = ctx.connections.get(inp.bucket.connection or "")
        where = creds and [creds.endpoint, creds.bucket]
    elif inp.output is not None:
        where = ctx.outputs and [ctx.outputs.endpoint, ctx.outputs.bucket, ctx.outputs_root, ctx.namespace]
    return hashlib.sha256(msgspec.json.encode([inp, where])).hexdigest()


# ---------------------------------------------------------------------------------------------------------
# Where files go: staging beside inputs/, final names inside it, markers beside both
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Layout:
    final: Path
    """``inputs/``: what the program sees."""
    staging: Path
    """``.inputs.nodus/tmp``: on the same file system, so a rename into ``inputs/`` is atomic."""
    marks: Path

    @classmethod
    def prepare(cls, final: Path) -> _Layout:
        work = final.parent / f".{final.name}.nodus"
        layout = cls(final, work / "tmp", work / "marks")
        # Whatever an earlier, killed materialisation left half-done is of no use: start clean.
        shutil.rmtree(layout.staging, ignore_errors=True)
        for d in (final, layout.staging, layout.marks):
            d.mkdir(parents=True, exist_ok=True)
        return layout

    def temp(self, suffix: str = "") -> Path:
        return self.staging / f"{secrets.token_hex(8)}{suffix}"

    def kept(self, name: str, fingerprint: str) -> InputRecord | None:
        """The record of an input already in place from the same spec, unchanged since; else None."""
        try:
            marker = _marker_decoder.decode((self.marks / f"{name}.json").read_bytes())
            st = (self.final / name).stat()
        except (OSError, msgspec.DecodeError):
            return None
        if marker.fingerprint != fingerprint or st.st_mtime_ns != marker.mtime_ns:
            return None
        if marker.record.directory != (self.final / name).is_dir():
            return None
        if not marker.record.directory and st.st_size != marker.record.bytes:
            return None
        return marker.record

    def place(self, name: str, staged: Path) -> None:
        """Move a complete, verified file or directory to its final name (replacing what was there)."""
        target = self.final / name
        with contextlib.suppress(FileNotFoundError):
            (self.marks / f"{name}.json").unlink()
        if target.is_dir() and not target.is_symlink():
            trash = self.temp(".old")
            os.replace(target, trash)
            shutil.rmtree(trash, ignore_errors=True)
        elif staged.is_dir():
            target.unlink(missing_ok=True)  # a directory cannot replace a file in one rename
        os.replace(staged, target)  # a file replaces a file atomically; a directory lands on a free name
        _fsync_dir(self.final)

    def mark(self, name: str, fingerprint: str, record: InputRecord) -> None:
        """Written after :meth:`place`: a crash in between costs a second fetch, never a wrong file."""
        mtime = (self.final / name).stat().st_mtime_ns
        marker = _Marker(fingerprint=fingerprint, mtime_ns=mtime, record=record)
        tmp = self.marks / f".{name}.json.tmp"
        tmp.write_bytes(_marker_encoder.encode(marker))
        os.replace(tmp, self.marks / f"{name}.json")


class _Clients:
    """One S3 client per store for a whole materialisation: making one costs a third of a second of CPU
    (botocore loads its service model), so inputs from the same store share it."""

    def __init__(self) -> None:
        self._stack = contextlib.AsyncExitStack()
        self._made: dict[S3Settings, Any] = {}
        self._lock = asyncio.Lock()

    async def get(self, settings: S3Settings) -> Any:
        async with self._lock:
            if settings not in self._made:
                self._made[settings] = await self._stack.enter_async_context(s3.client(settings))
            return self._made[settings]

    async def aclose(self) -> None:
        await self._stack.aclose()


@dataclass(frozen=True)
class _Run:
    """One :func:`materialise` call: where files go, and the S3 clients it has opened."""

    layout: _Layout
    clients: _Clients


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Stopped(Exception):
    """A worker thread saw its stop flag: the coroutine that started it was cancelled."""


async def _offload(fn: Callable[..., T], *args: Any, stop: threading.Event | None = None) -> T:
    """Run blocking file work in a thread and, if cancelled, still wait for the thread to end (after
    raising ``stop``, which long work checks), so the caller's cleanup never races a write in flight."""
    task = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if stop is not None:
            stop.set()
        await asyncio.wait([task])
        raise


class _Writer:
    """A staged file being written: sha256 and size as the bytes pass, the cap checked before each write.

    Writes and hashing run in a worker thread a megabyte at a time: hashing 50 GiB in the event loop would
    stall heartbeats for a minute."""

    def __init__(self, path: Path, name: str, budget: _Budget) -> None:
        self.path, self.name, self.budget = path, name, budget
        self.size = 0
        self._hash = hashlib.sha256()
        self._buffer = bytearray()
        self._file = path.open("wb")

    async def write(self, chunk: bytes) -> None:
        self.budget.take(len(chunk))
        self._buffer += chunk
        if len(self._buffer) >= CHUNK:
            await self._drain()

    async def finish(self) -> str:
        """Flush, fsync and close; the hex sha256 of everything written."""
        await self._drain()
        await _offload(self._close, True)
        return self._hash.hexdigest()

    async def abort(self) -> None:
        await _offload(self._close, False)
        await asyncio.to_thread(self.path.unlink, True)

    async def _drain(self) -> None:
        data, self._buffer = bytes(self._buffer), bytearray()
        if data:
            await _offload(self._write, data)

    def _write(self, data: bytes) -> None:
        self._file.write(data)
        self._hash.update(data)
        self.size += len(data)

    def _close(self, sync: bool) -> None:
        if self._file.closed:
            return
        if sync:
            self._file.flush()
            os.fsync(self._file.fileno())
        self._file.close()


class _Budget:
    """The size cap of one input, shared by every file it writes."""

    def __init__(self, name: str, limit: int) -> None:
        self.name, self.limit, self.used = name, limit, 0

    def take(self, n: int) -> None:
        self.used += n
        if self.used > self.limit:
            raise InputError(
                self.name,
                f"larger than the agent's input size cap of {self.limit} bytes; "
                "use a smaller input, or raise NODUS_AGENT_INPUT_MAX_BYTES on the node",
            )


async def _stream_to(
    staged: Path, name: str, budget: _Budget, chunks: AsyncIterator[bytes], expect: str | None
) -> tuple[int, str]:
    """Write an async iterator of chunks to ``staged``; (size, sha256), the digest checked when expected."""
    writer = _Writer(staged, name, budget)
    try:
        async for chunk in chunks:
            await writer.write(chunk)
        digest = await writer.finish()
    except BaseException:
        await writer.abort()
        raise
    if expect is not None and digest != expect:
        await asyncio.to_thread(staged.unlink, True)
        raise InputError(
            name,
            f"sha256 mismatch: expected {expect}, got {digest}; the content changed at its source, "
            "or the Job's sha256 is wrong",
        )
    return writer.size, digest


# ---------------------------------------------------------------------------------------------------------
# url
# ---------------------------------------------------------------------------------------------------------


def _redact(url: str) -> str:
    """The URL without credentials or query: signed URLs carry their keys in the query string."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}" + ("?…" if parts.query else "")


def _https_only(name: str, url: str) -> None:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parsing the port is the check
    except ValueError as e:
        raise InputError(name, f"{url!r} is not a URL: {e}") from None
    if parts.scheme != "https" or not parts.hostname:
        raise InputError(
            name,
            f"only https:// URLs are fetched, not {_redact(url)!r}: plain http can be altered on the way; "
            "serve it over https, or put it in a bucket",
        )


def _ssl_context(bundle: Path | None) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if bundle is not None:
        context.load_verify_locations(cafile=str(bundle))
    return context


async def _fetch_url(inp: JobInput, run: _Run, ctx: InputContext) -> InputRecord:
    assert inp.url is not None and inp.name is not None
    name, url, expect = inp.name, inp.url.url or "", inp.url.sha256
    _https_only(name, url)
    settings = ctx.settings
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=settings.connect_timeout_s, sock_read=settings.read_timeout_s
    )
    staged = run.layout.temp()
    budget = _Budget(name, settings.max_bytes)
    try:
        async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as session:
            size, digest = await _download(session, name, url, staged, budget, expect, settings)
    except aiohttp.ClientConnectorCertificateError as e:
        raise InputError(
            name,
            f"the certificate of {_redact(url)} did not verify ({e.certificate_error}); "
            "if a private CA signs it, give the node NODUS_AGENT_CA_BUNDLE",
        ) from None
    except (aiohttp.ClientError, TimeoutError) as e:
        raise InputError(
            name, f"downloading {_redact(url)} failed: {e or type(e).__name__}", retryable=True
        ) from None
    await asyncio.to_thread(run.layout.place, name, staged)
    return InputRecord(
        name=name, kind="url", source=_redact(url), path=_container_path(name), bytes=size, sha256=digest
    )


async def _download(
    session: aiohttp.ClientSession,
    name: str,
    url: str,
    staged: Path,
    budget: _Budget,
    expect: str | None,
    settings: InputSettings,
) -> tuple[int, str]:
    """GET with redirects followed by hand: each hop must stay https (aiohttp would follow one to http)."""
    context = _ssl_context(settings.ca_bundle)
    # identity: the digest is of the bytes as served, not of a transfer encoding's unpacking.
    headers = {"Accept-Encoding": "identity"}
    for _ in range(MAX_REDIRECTS + 1):
        async with session.get(url, ssl=context, allow_redirects=False, headers=headers) as resp:
            if resp.status in _REDIRECTS and "Location" in resp.headers:
                url = urljoin(url, resp.headers["Location"])
                _https_only(name, url)
                continue
            if resp.status != 200:
                raise InputError(
                    name,
                    f"GET {_redact(url)} answered {resp.status} {resp.reason or ''}".rstrip()
                    + ("; check the URL" if resp.status < 500 else ""),
                    retryable=resp.status >= 500 or resp.status in (408, 429),
                )
            if resp.content_length is not None and resp.content_length > budget.limit:
                budget.take(resp.content_length)  # raises: refused before a byte is written
            return await _stream_to(staged, name, budget, resp.content.iter_chunked(CHUNK), expect)
    raise InputError(name, f"more than {MAX_REDIRECTS} redirects from {_redact(url)}")


# ---------------------------------------------------------------------------------------------------------
# bucket
# ---------------------------------------------------------------------------------------------------------


def _parse_uri(name: str, uri: str) -> tuple[str, str]:
    match = _S3_URI.fullmatch(uri)
    if match is None or not match["key"]:
        raise InputError(name, f"{uri!r} is not s3://bucket/key (or s3://bucket/prefix/ for a directory)")
    return match["bucket"], match["key"]


async def _fetch_bucket(inp: JobInput, run: _Run, ctx: InputContext) -> InputRecord:
    assert inp.bucket is not None and inp.name is not None
    name, uri, expect = inp.name, inp.bucket.uri or "", inp.bucket.sha256
    bucket, key = _parse_uri(name, uri)
    if not inp.bucket.connection:
        raise InputError(name, "bucket inputs read through an S3 Connection: set bucket.connection")
    creds = ctx.connections.get(inp.bucket.connection)
    if creds is None:
        raise InputError(
            name,
            f"Connection {inp.bucket.connection!r} is not available to this Job; create it in the project "
            "and list it in spec.connections",
        )
    if creds.bucket != bucket:
        raise InputError(
            name,
            f"{uri} is not in bucket {creds.bucket!r} of Connection {inp.bucket.connection!r}; "
            "use a Connection for that bucket",
        )
    budget = _Budget(name, ctx.settings.max_bytes)
    try:
        client = await run.clients.get(creds.settings())
        if key.endswith("/"):
            if expect is not None:
                raise InputError(name, "sha256 checks one object; name one key, or drop the sha256")
            return await _fetch_prefix(client, name, bucket, key, uri, run.layout, budget)
        staged = run.layout.temp()
        size, digest = await _get_object(client, name, bucket, key, staged, budget, expect)
    except (ClientError, BotoCoreError) as e:
        raise _s3_error(name, uri, e, inp.bucket.connection) from None
    await asyncio.to_thread(run.layout.place, name, staged)
    return InputRecord(
        name=name, kind="bucket", source=uri, path=_container_path(name), bytes=size, sha256=digest
    )


async def _get_object(
    client: Any, name: str, bucket: str, key: str, staged: Path, budget: _Budget, expect: str | None
) -> tuple[int, str]:
    resp = await client.get_object(Bucket=bucket, Key=key)
    async with resp["Body"] as body:
        return await _stream_to(staged, name, budget, body.iter_chunks(CHUNK), expect)


async def _fetch_prefix(
    client: Any, name: str, bucket: str, prefix: str, uri: str, layout: _Layout, budget: _Budget
) -> InputRecord:
    """Every object under ``prefix`` into a directory, keys relative to the prefix as paths."""
    staged = layout.temp(".d")
    await asyncio.to_thread(staged.mkdir)
    files = 0
    try:
        paginator = client.get_paginator("list_objects_v2")
        async for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                rel = obj["Key"][len(prefix) :]
                if not rel or rel.endswith("/"):
                    continue  # a "folder" marker object: no content of its own
                target = staged / _safe_relative(name, rel, f"object {obj['Key']!r}")
                await asyncio.to_thread(target.parent.mkdir, parents=True, exist_ok=True)
                await _get_object(client, name, bucket, obj["Key"], target, budget, None)
                files += 1
        if files == 0:
            raise InputError(name, f"there is no object under {uri}; check the prefix (it ends with '/')")
        await asyncio.to_thread(layout.place, name, staged)
    except BaseException:
        await asyncio.to_thread(shutil.rmtree, staged, True)
        raise
    return InputRecord(
        name=name,
        kind="bucket",
        source=uri,
        path=_container_path(name),
        directory=True,
        bytes=budget.used,
        files=files,
    )


def _safe_relative(name: str, rel: str, what: str) -> str:
    """``rel`` if it is a plain relative path (no absolute, empty, '.' or '..' parts), else InputError."""
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\x00" in rel:
        raise InputError(name, f"{what} is not a safe relative path (absolute, empty, '.' or '..' parts)")
    return rel


def _s3_error(name: str, uri: str, e: Exception, connection: str | None) -> InputError:
    code = ""
    if isinstance(e, ClientError):
        code = str(e.response.get("Error", {}).get("Code", ""))
    if code in _NO_SUCH_KEY or code == "NoSuchBucket":
        return InputError(name, f"{uri} does not exist ({code}); check the URI")
    if code in _DENIED:
        return InputError(
            name, f"Connection {connection!r} may not read {uri} ({code}); check its keys and policy"
        )
    return InputError(name, f"reading {uri} failed: {e}", retryable=True)


# ---------------------------------------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------------------------------------


def output_keys(namespace: str, job: str, index: int, output: str, root: str = "") -> tuple[str, str]:
    """The S3 keys of a committed output: (as a file, as a directory's ``.tar.zst``).

    The outputs module writes them; this is the same layout (``<root><namespace>/<job>/<index>/outputs/``),
    restated rather than imported so that reading never depends on the writer's internals."""
    key = f"{root}{namespace}/{job}/{index}/outputs/{output}"
    return key, f"{key}.tar.zst"


async def _fetch_output(inp: JobInput, run: _Run, ctx: InputContext) -> InputRecord:
    assert inp.output is not None and inp.name is not None
    name, out = inp.name, inp.output
    job, output, index = out.job or "", out.name or "", out.index or 0
    if ctx.outputs is None:
        raise InputError(name, "this node has no output store configured; set the agent's output bucket")
    bucket = ctx.outputs.bucket
    file_key, tar_key = output_keys(ctx.namespace, job, index, output, ctx.outputs_root)
    try:
        client = await run.clients.get(ctx.outputs)
        found = await _first_existing(client, bucket, (file_key, tar_key))
        if found is None:
            listed = await client.list_objects_v2(Bucket=bucket, Prefix=f"{file_key}/", MaxKeys=1)
            if listed.get("KeyCount", 0):
                raise InputError(
                    name,
                    f"output {output!r} of Job {job!r} was stored per rank (fromRanks All); reading one "
                    "is not supported yet: declare it with fromRanks Zero",
                )
            raise InputError(
                name,
                f"Job {job!r} has no committed output {output!r} at index {index} (looked for "
                f"s3://{bucket}/{file_key} and .tar.zst); check that the Job succeeded and declares it",
            )
        if found == file_key:
            return await _output_file(client, name, bucket, file_key, run.layout, ctx.settings)
        return await _output_directory(client, name, output, bucket, tar_key, run.layout, ctx.settings)
    except (ClientError, BotoCoreError) as e:
        raise _s3_error(name, f"s3://{bucket}/{file_key}", e, None) from None


async def _output_file(
    client: Any, name: str, bucket: str, key: str, layout: _Layout, settings: InputSettings
) -> InputRecord:
    staged = layout.temp()
    size, digest = await _get_object(
        client, name, bucket, key, staged, _Budget(name, settings.max_bytes), None
    )
    await asyncio.to_thread(layout.place, name, staged)
    source = f"s3://{bucket}/{key}"
    return InputRecord(
        name=name, kind="output", source=source, path=_container_path(name), bytes=size, sha256=digest
    )


async def _output_directory(
    client: Any, name: str, output: str, bucket: str, key: str, layout: _Layout, settings: InputSettings
) -> InputRecord:
    archive, staged = layout.temp(".tar.zst"), layout.temp(".d")
    try:
        # The cap is on what the archive holds; the download itself gets twice that, for tar's headers
        # and padding around many small files, and still cannot fill the disk.
        archive_budget = _Budget(name, 2 * settings.max_bytes)
        await _get_object(client, name, bucket, key, archive, archive_budget, None)
        # Its members are <output>/...: the input's directory is that directory, not its parent.
        size, files = await extract_tar_zst(archive, staged, name, settings.max_bytes, strip=output)
    finally:
        await asyncio.to_thread(archive.unlink, True)
    await asyncio.to_thread(layout.place, name, staged)
    return InputRecord(
        name=name,
        kind="output",
        source=f"s3://{bucket}/{key}",
        path=_container_path(name),
        directory=True,
        bytes=size,
        files=files,
    )


async def _first_existing(client: Any, bucket: str, keys: Sequence[str]) -> str | None:
    for key in keys:
        try:
            await client.head_object(Bucket=bucket, Key=key)
            return key
        except ClientError as e:
            if str(e.response.get("Error", {}).get("Code", "")) not in _NO_SUCH_KEY:
                raise
    return None


async def extract_tar_zst(
    archive: Path, dest: Path, name: str, max_bytes: int, *, strip: str | None = None
) -> tuple[int, int]:
    """Extract a ``.tar.zst`` into the new directory ``dest`` in a worker thread; (bytes, files).

    ``strip``: members under ``<strip>/`` land in ``dest`` itself (and a member ``<strip>`` is ``dest``).
    Refuses (InputError for input ``name``) absolute or '..' paths, links leading outside ``dest``,
    special files, and more than ``max_bytes`` of content. On any failure, or when cancelled (it stops at
    the next member), ``dest`` is removed."""
    budget = _Budget(name, max_bytes)
    stop = threading.Event()
    try:
        return await _offload(_extract_sync, archive, dest, budget, strip, stop, stop=stop)
    except BaseException:
        await asyncio.to_thread(shutil.rmtree, dest, True)
        raise


def _extract_sync(
    archive: Path, dest: Path, budget: _Budget, strip: str | None, stop: threading.Event
) -> tuple[int, int]:
    dest.mkdir()
    files = 0
    with (
        archive.open("rb") as raw,
        zstandard.ZstdDecompressor().stream_reader(raw) as reader,
        tarfile.open(fileobj=reader, mode="r|") as tar,
    ):
        for member in tar:
            if stop.is_set():
                raise _Stopped
            if strip is not None and not _strip(member, strip):
                continue
            _check_member(budget.name, member)
            if member.isfile():
                budget.take(member.size)  # before extracting: a bomb is refused, not written
                files += 1
            # Our checks above, and Python's "data" filter as a second line: no device files, no
            # set-uid bits, no owner taken from the archive.
            tar.extract(member, dest, set_attrs=True, filter="data")
    return budget.used, files


def _strip(member: tarfile.TarInfo, top: str) -> bool:
    """Re-root a member from ``<top>/x`` to ``x`` (a hard link's target too); False for ``<top>`` itself."""
    path = member.name.rstrip("/")
    if path == top:
        return False
    prefix = f"{top}/"
    if path.startswith(prefix):
        member.name = path[len(prefix) :]
    if member.islnk() and member.linkname.startswith(prefix):
        member.linkname = member.linkname[len(prefix) :]
    return True


def _check_member(name: str, member: tarfile.TarInfo) -> None:
    """Refuse what could write outside the directory: absolute or '..' paths, links that escape, devices."""
    what = f"archive member {member.name!r}"
    path = member.name.rstrip("/")
    if path.startswith("/") or ".." in path.split("/") or "\x00" in path:
        raise InputError(name, f"{what} has an absolute or '..' path; the archive is unsafe")
    if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        raise InputError(name, f"{what} is a device, fifo or other special file; only files are accepted")
    if member.issym():
        target = posixpath.normpath(posixpath.join(posixpath.dirname(path), member.linkname))
        if member.linkname.startswith("/") or target == ".." or target.startswith("../"):
            raise InputError(name, f"{what} is a link to {member.linkname!r}, outside the output")
    if member.islnk():
        target = posixpath.normpath(member.linkname)
        if member.linkname.startswith("/") or target == ".." or target.startswith("../"):
            raise InputError(name, f"{what} is a hard link to {member.linkname!r}, outside the output")


def _container_path(name: str) -> str:
    return f"{CONTAINER_INPUTS}/{name}"


_FETCHERS: Final[dict[str, Callable[[JobInput, _Run, InputContext], Awaitable[InputRecord]]]] = {
    "url": _fetch_url,
    "bucket": _fetch_bucket,
    "output": _fetch_output,
}
