"""S3 transfers for checkpoints and outputs (aiobotocore): a multipart upload of an async stream of chunks
with parts in flight, a ranged download with ranges in flight, and the small calls around them.

The client comes from :func:`nodus_agent.s3.client` (endpoint, region and keys in :class:`S3Settings`).

An upload never leaves an open multipart upload behind when it fails or is cancelled: every exit that is
not a completion aborts it (under ``asyncio.shield``, so a second cancel cannot skip the abort). Only a
process killed outright can orphan one; :func:`abort_open_uploads` clears those, and the checkpointer calls
it before each checkpoint of the same index. A bucket lifecycle rule ``AbortIncompleteMultipartUpload``
(docs/checkpoints.md) is the operator's backstop.

The sha256: S3 takes an object's metadata when the upload is *created*, before a streamed body's digest
exists. An object small enough for one PUT (under one part) carries it as metadata ``sha256``; a multipart
object cannot, so its digest is returned in :class:`Uploaded` for the caller to record (the checkpoint
manifest and ``latest`` pointer, an output's record). :func:`verify` checks the size, and the metadata
digest where the object has one. ADR-0019 explains why the digest is not copied onto the object afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError

log = logging.getLogger(__name__)

MiB = 1 << 20
PART_SIZE = 16 * MiB
"""The part size an upload starts with; see :func:`part_size_for` for how it grows."""
IN_FLIGHT = 4
"""Parts (or download ranges) on the wire at once."""
MIN_PART = 5 * MiB  # S3's floor for every part but the last
MAX_PARTS = 10_000  # S3's ceiling
GROW_EVERY = 1_000
"""Parts per part size: the size doubles every 1,000 parts, so 10,000 parts reach past S3's 5 TiB object
limit while a small upload keeps small parts (and small memory)."""
MAX_PART_TARGET = 4 << 30  # parts may run over by one chunk; S3's ceiling is 5 GiB
SHA256_META = "sha256"

OnPart = Callable[[int, int], None]
"""Called with (part number, bytes) as each part is stored: progress for logs, and a hook for tests."""


class UploadError(Exception):
    """An upload failed; it was aborted, so no part of it stays in the bucket."""


class SizeLimitExceeded(UploadError):
    """The stream grew past ``max_size``; the upload was aborted."""


class VerifyFailed(UploadError):
    """The stored object is not what was uploaded (size or recorded sha256 differ)."""


@dataclass(frozen=True)
class Uploaded:
    bucket: str
    key: str
    size: int
    parts: int
    """1 for a single PUT."""
    etag: str
    sha256: str | None
    """The stream's digest, when the stream knows one (:class:`nodus_agent.chunkstreams.ChunkStream` does)."""

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


def part_size_for(number: int, base: int = PART_SIZE) -> int:
    """The least size of part ``number`` (1-based): ``base`` for the first 1,000 parts, doubling every
    1,000, at most 4 GiB (S3 allows 5). With 16 MiB that is 15.6 GiB in 16 MiB parts, and 2 TiB (the
    largest checkpoint) by part 8,000."""
    return min(base << ((number - 1) // GROW_EVERY), MAX_PART_TARGET)


async def _parts(
    chunks: AsyncIterable[bytes], base: int, max_size: int | None
) -> AsyncGenerator[bytes, None]:
    """Gather a stream's chunks into parts of at least :func:`part_size_for` (parts need not be equal: a
    chunk that is big enough is a part as it is, with no copy), the last one shorter, at least one part
    even for an empty stream; ``max_size`` is enforced on the way."""
    pending: list[bytes] = []
    number = 1
    size = total = 0
    async for chunk in chunks:
        total += len(chunk)
        if max_size is not None and total > max_size:
            raise SizeLimitExceeded(f"the stream passed {max_size} bytes (the cap) after {total} bytes")
        pending.append(chunk)
        size += len(chunk)
        if size >= part_size_for(number, base):
            yield pending[0] if len(pending) == 1 else b"".join(pending)
            pending, size, number = [], 0, number + 1
    if pending or number == 1:
        yield b"".join(pending)


async def upload(
    client: Any,
    bucket: str,
    key: str,
    chunks: AsyncIterable[bytes],
    *,
    max_size: int | None = None,
    part_size: int = PART_SIZE,
    in_flight: int = IN_FLIGHT,
    metadata: dict[str, str] | None = None,
    content_type: str = "application/octet-stream",
    on_part: OnPart | None = None,
) -> Uploaded:
    """Upload ``chunks`` to ``key``: one PUT if they fit in one part, else a multipart upload with up to
    ``in_flight`` parts on the wire. Aborted (nothing left behind) on any error or cancellation, and with
    :class:`SizeLimitExceeded` once more than ``max_size`` bytes arrive."""
    if part_size < MIN_PART:
        raise ValueError(f"part_size {part_size} is below S3's minimum of {MIN_PART} bytes")
    meta = dict(metadata or {})
    parts = _parts(chunks, part_size, max_size)
    try:
        first = await anext(parts)
        second = await anext(parts, None)
        if second is None:
            return await _put_one(client, bucket, key, first, chunks, meta, content_type, on_part)
        upload_id = await _create(client, bucket, key, meta, content_type)
        multipart = _Multipart(client, bucket, key, upload_id, part_size, in_flight, on_part)
        size, count, etag = await multipart.run(first, second, parts)
    finally:
        await parts.aclose()
    return Uploaded(bucket, key, size, count, etag, getattr(chunks, "sha256", None))


async def _put_one(
    client: Any,
    bucket: str,
    key: str,
    body: bytes,
    chunks: AsyncIterable[bytes],
    meta: dict[str, str],
    content_type: str,
    on_part: OnPart | None,
) -> Uploaded:
    sha = getattr(chunks, "sha256", None)  # the stream has ended, so a digesting stream knows it now
    if sha:
        meta[SHA256_META] = sha
    r = await client.put_object(Bucket=bucket, Key=key, Body=body, Metadata=meta, ContentType=content_type)
    if on_part:
        on_part(1, len(body))
    return Uploaded(bucket, key, len(body), 1, r["ETag"], sha)


async def _create(client: Any, bucket: str, key: str, meta: dict[str, str], content_type: str) -> str:
    r = await client.create_multipart_upload(Bucket=bucket, Key=key, Metadata=meta, ContentType=content_type)
    return str(r["UploadId"])


class _Multipart:
    """One multipart upload: parts on the wire within a budget, completed in order, else aborted."""

    def __init__(
        self,
        client: Any,
        bucket: str,
        key: str,
        upload_id: str,
        part_size: int,
        in_flight: int,
        on_part: OnPart | None,
    ) -> None:
        self.client, self.bucket, self.key, self.upload_id = client, bucket, key, upload_id
        self.part_size, self.in_flight, self.on_part = part_size, max(1, in_flight), on_part
        # Budget in base-size parts: a part that grew to 4x the base takes 4 (at most all), so memory on
        # the wire stays near in_flight x part_size whatever size the parts have grown to.
        self.budget = asyncio.Semaphore(self.in_flight)
        self.etags: dict[int, str] = {}

    async def run(self, first: bytes, second: bytes, rest: AsyncIterator[bytes]) -> tuple[int, int, str]:
        size = 0
        try:
            async with asyncio.TaskGroup() as tg, contextlib.aclosing(_chain(first, second, rest)) as bodies:
                number = 0
                async for body in bodies:
                    number += 1
                    if number > MAX_PARTS:
                        raise UploadError(f"more than {MAX_PARTS} parts: the object is over S3's limit")
                    size += len(body)
                    units = min(self.in_flight, max(1, len(body) // self.part_size))
                    for _ in range(units):  # one acquirer only (this loop), so no deadlock
                        await self.budget.acquire()
                    tg.create_task(self._part(number, body, units))
            etag = await self._complete()
        except BaseException as e:
            await asyncio.shield(self._abort())
            if isinstance(e, BaseExceptionGroup):
                raise _first(e) from None
            raise
        return size, len(self.etags), etag

    async def _part(self, number: int, body: bytes, units: int) -> None:
        try:
            r = await self.client.upload_part(
                Bucket=self.bucket, Key=self.key, UploadId=self.upload_id, PartNumber=number, Body=body
            )
            self.etags[number] = r["ETag"]
        finally:
            for _ in range(units):
                self.budget.release()
        if self.on_part:
            self.on_part(number, len(body))

    async def _complete(self) -> str:
        parts = [{"PartNumber": n, "ETag": self.etags[n]} for n in sorted(self.etags)]
        r = await self.client.complete_multipart_upload(
            Bucket=self.bucket, Key=self.key, UploadId=self.upload_id, MultipartUpload={"Parts": parts}
        )
        return str(r["ETag"])

    async def _abort(self) -> None:
        try:
            await self.client.abort_multipart_upload(
                Bucket=self.bucket, Key=self.key, UploadId=self.upload_id
            )
        except ClientError as e:
            if _code(e) != "NoSuchUpload":
                log.error("could not abort upload %s of %s: %s", self.upload_id, self.key, e)
        except Exception as e:  # the store is unreachable: the next checkpoint's sweep retries
            log.error("could not abort upload %s of %s: %s", self.upload_id, self.key, e)


async def _chain(first: bytes, second: bytes, rest: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
    yield first
    yield second
    async for part in rest:
        yield part


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The error worth raising from a task group: the first that is not a cancellation."""
    leaves: list[BaseException] = []

    def walk(g: BaseExceptionGroup[BaseException]) -> None:
        for e in g.exceptions:
            if isinstance(e, BaseExceptionGroup):
                walk(e)
            else:
                leaves.append(e)

    walk(group)
    return next((e for e in leaves if not isinstance(e, asyncio.CancelledError)), leaves[0])


def _code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def not_found(e: ClientError) -> bool:
    """A missing key (GET says NoSuchKey, HEAD only 404)."""
    return _code(e) in ("NoSuchKey", "404", "NotFound")


async def verify(
    client: Any, bucket: str, key: str, *, size: int, sha256: str | None = None
) -> dict[str, Any]:
    """HEAD ``key``: its size must be ``size``, and a ``sha256`` in its metadata must equal ``sha256``.
    Returns the HEAD response; raises :class:`VerifyFailed` saying what differs."""
    try:
        head: dict[str, Any] = await client.head_object(Bucket=bucket, Key=key)
    except ClientError as e:
        if not_found(e):
            raise VerifyFailed(f"s3://{bucket}/{key} is missing right after its upload") from e
        raise
    if head["ContentLength"] != size:
        raise VerifyFailed(
            f"s3://{bucket}/{key} holds {head['ContentLength']} bytes, not the {size} uploaded"
        )
    stored = head.get("Metadata", {}).get(SHA256_META)
    if sha256 is not None and stored is not None and stored != sha256:
        raise VerifyFailed(f"s3://{bucket}/{key} records sha256 {stored}, not {sha256}")
    return head


async def download(
    client: Any,
    bucket: str,
    key: str,
    *,
    chunk_size: int = PART_SIZE,
    in_flight: int = IN_FLIGHT,
) -> AsyncGenerator[bytes, None]:
    """The object's bytes in order, fetched as ranges with up to ``in_flight`` on the wire (memory: that
    many chunks). Every range is asked for with the ETag seen first (If-Match), so an object replaced
    half-way fails the download instead of splicing two versions. Close it (``contextlib.aclosing``) to
    stop early."""
    head = await client.head_object(Bucket=bucket, Key=key)
    size, etag = int(head["ContentLength"]), str(head["ETag"])
    ranges = deque((start, min(start + chunk_size, size)) for start in range(0, size, chunk_size))
    pending: deque[asyncio.Task[bytes]] = deque()

    def refill() -> None:
        while ranges and len(pending) < max(1, in_flight):
            start, end = ranges.popleft()
            pending.append(asyncio.ensure_future(_range(client, bucket, key, etag, start, end)))

    try:
        refill()
        while pending:
            chunk = await pending.popleft()
            refill()
            yield chunk
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


async def _range(client: Any, bucket: str, key: str, etag: str, start: int, end: int) -> bytes:
    r = await client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}", IfMatch=etag)
    async with r["Body"] as body:
        data: bytes = await body.read()
    if len(data) != end - start:
        raise UploadError(f"s3://{bucket}/{key}: range {start}-{end} gave {len(data)} bytes")
    return data


async def download_pieces(
    client: Any,
    bucket: str,
    key: str,
    *,
    chunk_size: int = PART_SIZE,
    in_flight: int = IN_FLIGHT,
) -> AsyncGenerator[list[bytes], None]:
    """The object's bytes in order as :func:`download` fetches them (the same ranges in flight, each with
    If-Match), handed over as lists of the pieces they arrived in, as soon as they arrive: joined, the
    lists are the object. A reader that takes bytes piece by piece (:func:`nodus_agent.unpacking.unpack`)
    starts on the first range while it is still on the wire, and the event loop never copies a range into
    a fresh buffer (measured: 0.15 CPU-s of a 135 MB download, 0.08 without it; docs/benchmarks.md)."""
    head = await client.head_object(Bucket=bucket, Key=key)
    size, etag = int(head["ContentLength"]), str(head["ETag"])
    ranges = deque((start, min(start + chunk_size, size)) for start in range(0, size, chunk_size))
    pending: deque[_Fetch] = deque()

    def refill() -> None:
        while ranges and len(pending) < max(1, in_flight):
            start, end = ranges.popleft()
            pending.append(_Fetch(client, bucket, key, etag, start, end))

    try:
        refill()
        while pending:
            pieces = await pending[0].arrived()
            if pending[0].over:
                pending.popleft()
                refill()
            if pieces:
                yield pieces
    finally:
        for fetch in pending:
            fetch.task.cancel()
        await asyncio.gather(*(f.task for f in pending), return_exceptions=True)


class _Fetch:
    """One range on the wire, its pieces kept as they arrive until the reader takes them."""

    def __init__(self, client: Any, bucket: str, key: str, etag: str, start: int, end: int) -> None:
        self.pieces: list[bytes] = []
        self._more = asyncio.Event()
        self.task = asyncio.ensure_future(self._get(client, bucket, key, etag, start, end))

    async def _get(self, client: Any, bucket: str, key: str, etag: str, start: int, end: int) -> None:
        r = await client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}", IfMatch=etag)
        got = 0
        async with r["Body"] as body:
            # read(n) hands over what has arrived (up to n) as it is; read() would join it all in one copy.
            while piece := await body.read(end - start):
                self.pieces.append(piece)
                got += len(piece)
                self._more.set()
        if got != end - start:
            raise UploadError(f"s3://{bucket}/{key}: range {start}-{end} gave {got} bytes")

    @property
    def over(self) -> bool:
        """Everything of the range was taken."""
        return self.task.done() and not self.pieces

    async def arrived(self) -> list[bytes]:
        """The pieces that arrived since the last call, waiting for at least one unless the range is over
        (then an empty list); raises the range's error."""
        while not self.pieces and not self.task.done():
            self._more.clear()
            more = asyncio.ensure_future(self._more.wait())
            await asyncio.wait({more, self.task}, return_when=asyncio.FIRST_COMPLETED)
            more.cancel()
        if self.task.done():
            self.task.result()
        pieces, self.pieces = self.pieces, []
        return pieces


async def put_bytes(
    client: Any, bucket: str, key: str, data: bytes, content_type: str = "application/json"
) -> None:
    """A small object in one PUT (a manifest, a pointer)."""
    await client.put_object(Bucket=bucket, Key=key, Body=data, ContentType=content_type)


async def get_bytes(client: Any, bucket: str, key: str) -> bytes | None:
    """A small object's bytes, or None if there is no such key."""
    try:
        r = await client.get_object(Bucket=bucket, Key=key)
    except ClientError as e:
        if not_found(e):
            return None
        raise
    async with r["Body"] as body:
        data: bytes = await body.read()
    return data


async def list_objects(client: Any, bucket: str, prefix: str) -> list[dict[str, Any]]:
    """Every object under ``prefix`` (Key, Size, LastModified, ...), in key order."""
    found: list[dict[str, Any]] = []
    async for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        found.extend(page.get("Contents", []))
    return found


async def delete_keys(client: Any, bucket: str, keys: list[str]) -> None:
    """Delete ``keys`` (1,000 a request); a key already gone is no error."""
    for i in range(0, len(keys), 1000):
        batch = [{"Key": k} for k in keys[i : i + 1000]]
        r = await client.delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True})
        errors = [e for e in r.get("Errors", []) if e.get("Code") != "NoSuchKey"]
        if errors:
            raise UploadError(f"could not delete {len(errors)} objects, first {errors[0]}")


async def open_uploads(client: Any, bucket: str, prefix: str) -> list[dict[str, Any]]:
    """Multipart uploads started under ``prefix`` and neither completed nor aborted."""
    found: list[dict[str, Any]] = []
    async for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=prefix):
        found.extend(page.get("Uploads", None) or [])
    return found


async def abort_open_uploads(client: Any, bucket: str, prefix: str, *, before: datetime | None = None) -> int:
    """Abort the open multipart uploads under ``prefix`` (started before ``before``, if given): the
    leftovers of a process killed mid-upload. Returns how many were aborted."""
    aborted = 0
    for u in await open_uploads(client, bucket, prefix):
        if before is not None and u["Initiated"] >= before:
            continue
        with contextlib.suppress(ClientError):  # gone already: somebody else finished the job
            await client.abort_multipart_upload(Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"])
            aborted += 1
            log.info("aborted a multipart upload left open: %s (%s)", u["Key"], u["UploadId"])
    return aborted
