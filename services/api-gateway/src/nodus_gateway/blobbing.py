"""Blob uploads (ADR-0036): a project's tar.zst archives, named by the sha256 of their bytes.

==========================================  ======  =================================================
route                                       who     answer
==========================================  ======  =================================================
PUT  .../namespaces/{ns}/blobs/sha256:{hex}  editor  201 {"digest","sizeBytes"}; 200 if it exists
GET  .../namespaces/{ns}/blobs/sha256:{hex}  viewer  200 the Blob record; 404 Status
HEAD .../namespaces/{ns}/blobs/sha256:{hex}  viewer  200 with X-Nodus-Size and no body; 404
==========================================  ======  =================================================

An upload streams the body into an S3 multipart upload (parts of 16 MiB, a few in flight) while hashing
and counting it: a body over ``NODUS_BLOB_MAX_BYTES`` is refused (413) the moment it passes the cap (or at
once when its Content-Length says so), one that is not a zstd frame (magic ``28 B5 2F FD``) or whose
sha256 is not the name's is refused (422), and every failure aborts the multipart upload, so nothing is
kept. Only a complete, verified upload gets its record (bucket ``blobs``, key ``<ns>.<hex>``), which is
what every other part of Nodus asks: a blob without a record does not exist. A blob that has its record
answers 200 at once, without reading the body. The bytes are never served back (agents read the store).

Authorization is that of the generic routes, with ``blobs`` as the resource and the digest as the name:
the authentication middleware has already decided from the path (auth.request_info), and each route asks
:func:`~nodus_gateway.authorizing.authorize` again; a project the caller has no role in answers as if the
blob did not exist.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import msgspec
from fastapi import APIRouter, Request
from starlette.responses import Response

from nodus_gateway.authorizing import authorize
from nodus_gateway.clusterrouting import check_namespace
from nodus_gateway.resources import BLOBS, Stores
from nodus_gateway.responding import ApiError, object_response
from nodus_gateway.routing import API_PREFIX
from nodus_gateway.storeaccess import StoreAccess, is_store_error, no_store, store_failed, too_large
from nodus_kit import errors as kit
from nodus_schema import CauseType, FieldError, status_for
from nodus_schema.meta import ObjectMeta, now_rfc3339
from nodus_schema.volumes import BLOB_PATTERN, Blob, BlobSpec, BlobStatus, blob_key, digest_hex

BLOB_PATH: Final = f"{API_PREFIX}/namespaces/{{namespace}}/blobs/{{name}}"
PART_BYTES: Final = 16 * 1024**2
"""16 MiB: above S3's 5 MiB floor for every part but the last, and 640 parts for a 10 GiB blob (S3 allows
10,000)."""
PARTS_IN_FLIGHT: Final = 3
"""Parts uploading at once while the next one is read: the body is read no faster than the store takes it,
so one upload holds at most (this + 1) parts in memory."""
ZSTD_MAGIC: Final = b"\x28\xb5\x2f\xfd"
SIZE_HEADER: Final = "X-Nodus-Size"
BLOB_CAP_VARIABLE: Final = "NODUS_BLOB_MAX_BYTES"
DIGEST_FIX: Final = "Name a blob by its digest: sha256:<64 lower-case hex digits> of the archive's bytes."


# -- the records ---------------------------------------------------------------------------------------------
async def blob_exists(stores: Stores, namespace: str, digest: str) -> Blob | None:
    """The record of the project's blob ``digest`` (``sha256:<hex>``), or None when it was never uploaded."""
    try:
        blob: Blob = await stores[BLOBS].get(namespace, digest_hex(digest))
    except kit.NotFound:
        return None
    return blob


async def record_blob(stores: Stores, namespace: str, digest: str, size_bytes: int, creator: str) -> Blob:
    """Create the record of an uploaded blob, or keep the one there is (the same bytes, uploaded before or
    at the same time by someone else). Also for a writable mount's commit, whose agent uploaded it."""
    blob = Blob(
        metadata=ObjectMeta(name=digest_hex(digest), namespace=namespace),
        spec=BlobSpec(size_bytes=size_bytes, creator=creator),
        status=BlobStatus(last_used_time=now_rfc3339()),
    )
    try:
        created: Blob = await stores[BLOBS].create(blob)
    except kit.AlreadyExists:
        kept = await blob_exists(stores, namespace, digest)
        if kept is None:  # deleted between the two calls: a retry creates it
            return await record_blob(stores, namespace, digest, size_bytes, creator)
        return kept
    return created


async def touch_blob(stores: Stores, namespace: str, digest: str, *, strict: bool = False) -> None:
    """Set the record's lastUsedTime to now (expiry counts from there). A blob with no record is left
    alone, or with ``strict`` refused (NotFound): a use that must not proceed with a blob the reaper just
    took (blobreaping.py says why a touch is what keeps it)."""

    def touched(blob: Blob) -> Blob:
        status = msgspec.structs.replace(blob.status, last_used_time=now_rfc3339(), uses=blob.status.uses + 1)
        return msgspec.structs.replace(blob, status=status)

    try:
        await stores[BLOBS].mutate(namespace, digest_hex(digest), touched)
    except kit.NotFound:
        if strict:
            raise blob_not_found(namespace, digest) from None


def blob_reply(digest: str, size_bytes: int) -> dict[str, Any]:
    return {"digest": digest, "sizeBytes": size_bytes}


# -- errors --------------------------------------------------------------------------------------------------
def bad_digest(name: str) -> ApiError:
    return ApiError.of(
        "BadRequest", f"{name!r} is not a blob digest (sha256:<64 lower-case hex digits>)", fix=DIGEST_FIX
    )


def blob_not_found(namespace: str, digest: str) -> ApiError:
    return ApiError.of(
        "NotFound",
        f'blob "{digest}" not found in project "{namespace}"',
        name=digest,
        kind="blobs",
        fix=f"Upload it first: PUT {API_PREFIX}/namespaces/{namespace}/blobs/{digest} with the archive as "
        "the body (nodus apply and nodus volume push do it for you).",
    )


def _invalid_body(namespace: str, digest: str, message: str, fix: str) -> ApiError:
    cause = FieldError("body", CauseType.INVALID, f"Invalid value: {message}")
    return ApiError(
        status_for(
            "Invalid",
            f'blob "{digest}" is invalid: {message}',
            name=digest,
            kind="blobs",
            causes=[cause],
            fix=fix,
        )
    )


def not_zstd(namespace: str, digest: str) -> ApiError:
    return _invalid_body(
        namespace,
        digest,
        "a blob is a tar.zst archive, and this body does not start with zstd's magic bytes 28 B5 2F FD",
        "Pack the directory as a tar stream compressed with zstd (nodus_sdk.packing does, and nodus apply "
        "and nodus volume push use it).",
    )


def digest_mismatch(namespace: str, expected: str, actual: str) -> ApiError:
    return _invalid_body(
        namespace,
        expected,
        f"the body's sha256 is {actual}, not the {expected} the path names; nothing was kept",
        "Send the body whose digest the path names (compute it over the exact bytes you send), or PUT it "
        f"to .../blobs/{actual}.",
    )


def _digest_of(name: str) -> str:
    if BLOB_PATTERN.fullmatch(name) is None:
        raise bad_digest(name)
    return name


# -- streaming a body into the store ------------------------------------------------------------------------
class MultipartUpload:
    """One multipart upload: parts go up in the background while the body is read."""

    def __init__(self, client: Any, bucket: str, key: str) -> None:
        self.client, self.bucket, self.key = client, bucket, key
        self.upload_id: str | None = None
        self.parts: list[asyncio.Task[dict[str, Any]]] = []
        self.room = asyncio.Semaphore(PARTS_IN_FLIGHT)

    async def put(self, data: bytes) -> None:
        """Queue one part; waits while PARTS_IN_FLIGHT are uploading (and raises what failed one)."""
        if self.upload_id is None:
            reply = await self.client.create_multipart_upload(Bucket=self.bucket, Key=self.key)
            self.upload_id = str(reply["UploadId"])
        await self.room.acquire()
        for done in (t for t in self.parts if t.done()):
            done.result()  # a failed part fails the upload now, not after the whole body was read
        number = len(self.parts) + 1
        self.parts.append(asyncio.create_task(self._part(number, data)))

    async def _part(self, number: int, data: bytes) -> dict[str, Any]:
        try:
            reply = await self.client.upload_part(
                Bucket=self.bucket, Key=self.key, UploadId=self.upload_id, PartNumber=number, Body=data
            )
        finally:
            self.room.release()
        return {"PartNumber": number, "ETag": reply["ETag"]}

    async def complete(self) -> None:
        parts = await asyncio.gather(*self.parts)
        await self.client.complete_multipart_upload(
            Bucket=self.bucket, Key=self.key, UploadId=self.upload_id, MultipartUpload={"Parts": parts}
        )

    async def abort(self) -> None:
        """Nothing kept: the parts in flight are stopped and the upload aborted (best effort: the store's
        own lifecycle rule for incomplete uploads is the net under a gateway killed here)."""
        for task in self.parts:
            task.cancel()
        await asyncio.gather(*self.parts, return_exceptions=True)
        if self.upload_id is not None:
            with contextlib.suppress(Exception):
                await self.client.abort_multipart_upload(
                    Bucket=self.bucket, Key=self.key, UploadId=self.upload_id
                )


def _nothing(_: bytes) -> None:
    return None


def _fine() -> None:
    return None


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """What a streamed body is held to: a cap (and the variable that sets it, for the 413's fix), a look
    at every chunk as it passes, and a last check before anything is kept; both raise to refuse."""

    cap: int
    variable: str
    seen: Callable[[bytes], None] = _nothing
    verify: Callable[[], None] = _fine


async def store_body(request: Request, access: StoreAccess, key: str, limits: BodyLimits) -> int:
    """Stream the request's body to ``key``; its size. A body that fits in one part is one PutObject, a
    larger one a multipart upload; either way nothing is written unless ``limits`` pass, and a failure
    leaves what was at ``key`` before (a multipart upload replaces the object only when completed)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.cap:
        raise too_large(limits.cap, limits.variable)
    client = await access.client()
    upload = MultipartUpload(client, access.bucket, key)
    size = 0
    buffer = bytearray()
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limits.cap:
                raise too_large(limits.cap, limits.variable)
            limits.seen(chunk)
            buffer += chunk
            while len(buffer) >= PART_BYTES:
                await upload.put(bytes(buffer[:PART_BYTES]))
                del buffer[:PART_BYTES]
        limits.verify()
        if upload.upload_id is None:
            await client.put_object(Bucket=access.bucket, Key=key, Body=bytes(buffer))
        else:
            if buffer:
                await upload.put(bytes(buffer))
            await upload.complete()
    except BaseException as e:
        # A refusal, a store error, the client gone, the request cancelled: abort whatever the cause.
        await asyncio.shield(upload.abort())
        if is_store_error(e):
            raise store_failed("take the upload", e) from None
        raise
    return size


class _BlobCheck:
    """The checks of a blob's body: zstd's magic bytes first, and the sha256 the path names."""

    def __init__(self, namespace: str, digest: str) -> None:
        self.namespace, self.digest = namespace, digest
        self.hasher = hashlib.sha256()
        self.head = b""

    def seen(self, chunk: bytes) -> None:
        self.hasher.update(chunk)
        if len(self.head) < len(ZSTD_MAGIC):
            self.head += chunk[: len(ZSTD_MAGIC) - len(self.head)]
            if not ZSTD_MAGIC.startswith(self.head):  # refused from the first bytes, not after the body
                raise not_zstd(self.namespace, self.digest)

    def verify(self) -> None:
        if self.head != ZSTD_MAGIC:
            raise not_zstd(self.namespace, self.digest)  # shorter than the magic bytes: no archive
        actual = f"sha256:{self.hasher.hexdigest()}"
        if actual != self.digest:
            raise digest_mismatch(self.namespace, self.digest, actual)


async def upload_blob(request: Request, access: StoreAccess, namespace: str, digest: str) -> int:
    """Stream the request's body to the blob's key; its size. Nothing is kept unless it all checks out."""
    check = _BlobCheck(namespace, digest)
    limits = BodyLimits(access.settings.blob_max_bytes, BLOB_CAP_VARIABLE, check.seen, check.verify)
    return await store_body(request, access, blob_key(namespace, digest), limits)


# -- routes --------------------------------------------------------------------------------------------------
def blob_router(stores: Stores, access: StoreAccess | None) -> APIRouter:
    """PUT, GET and HEAD of a project's blobs."""
    router = APIRouter(tags=["blobs"])

    def store() -> StoreAccess:
        if access is None or not access.settings.bucket:
            raise no_store()
        return access

    @router.put(BLOB_PATH, name="upload blob")
    async def put_blob(namespace: str, name: str, request: Request) -> Response:
        check_namespace(namespace)
        principal = await authorize(request, "update", BLOBS, namespace)
        digest = _digest_of(name)
        where = store()
        kept = await blob_exists(stores, namespace, digest)
        if kept is not None:  # the same bytes are there: nothing to read or store
            return object_response(blob_reply(digest, kept.spec.size_bytes))
        size = await upload_blob(request, where, namespace, digest)
        await record_blob(stores, namespace, digest, size, principal.name)
        return object_response(blob_reply(digest, size), 201)

    @router.api_route(BLOB_PATH, methods=["GET", "HEAD"], name="read blob")
    async def read_blob(namespace: str, name: str, request: Request) -> Response:
        check_namespace(namespace)
        await authorize(request, "get", BLOBS, namespace)
        digest = _digest_of(name)
        store()  # without a store there are no blobs to speak of: said, rather than a 404
        blob = await blob_exists(stores, namespace, digest)
        if blob is None:
            raise blob_not_found(namespace, digest)
        headers = {SIZE_HEADER: str(blob.spec.size_bytes)}
        if request.method == "HEAD":
            return Response(status_code=200, headers=headers)
        response = object_response(blob)
        response.headers.update(headers)
        return response

    return router
