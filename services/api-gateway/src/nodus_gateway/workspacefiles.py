"""A Workspace's files (ADR-0036): one store object per file under ``_nodus/workspaces/<ns>/<name>/``.

=========================================================  ======  =====================================
route                                                      who     answer
=========================================================  ======  =====================================
GET    .../namespaces/{ns}/workspaces/{name}/files?prefix=  viewer  {"items": [...], "continue"?}
PUT    .../namespaces/{ns}/workspaces/{name}/files/{path}   editor  201 (new) or 200 {"path","sizeBytes"}
GET    .../namespaces/{ns}/workspaces/{name}/files/{path}   viewer  the file's bytes (octet-stream)
DELETE .../namespaces/{ns}/workspaces/{name}/files/{path}   editor  200 {"path","sizeBytes"}
=========================================================  ======  =====================================

The Workspace must exist (404 otherwise). Paths are normalised with nodus_schema.volumes.workspace_path:
a path that would leave the home (``..``) or holds a control character is a 422. A write streams the body
into the store (one PutObject, or a multipart upload past 16 MiB) under ``NODUS_WORKSPACE_FILE_MAX_BYTES``;
a failed write leaves the file as it was. After each write or delete the Workspace's status (files,
sizeBytes, updateTime) moves by the change, compare-and-set: cheap, and right for one writer at a time; a
status write that fails never fails the file's write (the file is what was asked for).

``prefix`` lists a directory of the home (``prefix=data/raw`` lists ``data/raw/...``; none lists all of
it), paginated by the store's continuation (``limit``, at most 1000, and ``continue``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Annotated, Any, Final

import msgspec
from fastapi import APIRouter, Query, Request
from starlette.responses import Response, StreamingResponse

from nodus_gateway.authorizing import authorize
from nodus_gateway.blobbing import BodyLimits, store_body
from nodus_gateway.clusterrouting import check_name, check_namespace
from nodus_gateway.querying import ContinueQ, LimitQ
from nodus_gateway.resources import Stores, resource
from nodus_gateway.responding import ApiError, object_response, store_errors
from nodus_gateway.routing import API_PREFIX
from nodus_gateway.storeaccess import StoreAccess, is_missing, is_store_error, no_store, store_failed
from nodus_kit import errors as kit
from nodus_schema import CauseType, FieldError, status_for
from nodus_schema.meta import now_rfc3339
from nodus_schema.volumes import Workspace, workspace_key, workspace_path, workspace_prefix

log = logging.getLogger(__name__)

FILES_PATH: Final = f"{API_PREFIX}/namespaces/{{namespace}}/workspaces/{{name}}/files"
FILE_PATH: Final = f"{FILES_PATH}/{{path:path}}"
FILE_CAP_VARIABLE: Final = "NODUS_WORKSPACE_FILE_MAX_BYTES"
MAX_KEY_BYTES: Final = 1024
"""S3's longest key: a path whose key would be longer is refused before the store sees it."""
MAX_PAGE: Final = 1000
"""The most keys one ListObjectsV2 page answers (S3's own cap)."""
READ_CHUNK: Final = 1024 * 1024
OCTETS: Final = "application/octet-stream"

PrefixQ = Annotated[str | None, Query()]
QUERIES: Final[tuple[Any, ...]] = (PrefixQ,)
"""The query parameters of these routes the direct lane must know (besides querying's)."""


# -- paths ----------------------------------------------------------------------------------------------
def _invalid_path(name: str, path: str, why: str) -> ApiError:
    cause = FieldError("path", CauseType.INVALID, f"Invalid value: {why}")
    return ApiError(
        status_for(
            "Invalid",
            f'the path {path!r} in Workspace "{name}" is invalid: {why}',
            name=name,
            kind="Workspace",
            causes=[cause],
            fix="Name a file inside the home: a relative path such as data/train.csv, without '..' "
            "segments or control characters.",
        )
    )


def file_key(namespace: str, name: str, path: str) -> tuple[str, str]:
    """(normalised path, store key) of a file of the home; 422 for a path that is not one."""
    try:
        rel = workspace_path(path)
        key = workspace_key(namespace, name, rel)
    except ValueError as e:
        raise _invalid_path(name, path, str(e)) from None
    if len(key.encode()) > MAX_KEY_BYTES:
        raise _invalid_path(name, path, f"the path is too long (at most {MAX_KEY_BYTES} bytes with its home)")
    return rel, key


def _dir_prefix(namespace: str, name: str, prefix: str | None) -> str:
    """The store prefix a listing reads: the home, or one directory of it."""
    try:
        rel = workspace_path(prefix or "")
    except ValueError as e:
        raise _invalid_path(name, prefix or "", str(e)) from None
    return workspace_prefix(namespace, name) + (f"{rel}/" if rel else "")


# -- the Workspace's status -----------------------------------------------------------------------------
async def workspace_of(stores: Stores, namespace: str, name: str) -> Workspace:
    """The Workspace, or 404 as for any missing object (a name that could not exist included)."""
    res = resource("workspaces")
    check_namespace(namespace)
    check_name(res, name, namespace)
    with store_errors(res, namespace, name):
        ws: Workspace = await stores[res.plural].get(namespace, name)
    return ws


async def count_change(stores: Stores, namespace: str, name: str, files: int, size: int) -> None:
    """Move the Workspace's status by ``files`` and ``size`` (never below zero), compare-and-set. The
    file is already written or gone: a status that cannot be written is logged, not answered."""

    def changed(ws: Workspace) -> Workspace:
        st = ws.status
        status = msgspec.structs.replace(
            st,
            files=max(0, st.files + files),
            size_bytes=max(0, st.size_bytes + size),
            update_time=now_rfc3339(),
        )
        return msgspec.structs.replace(ws, status=status)

    try:
        await stores[resource("workspaces").plural].mutate(namespace, name, changed)
    except kit.NotFound:
        pass  # deleted meanwhile: its files go with it
    except Exception:  # the write succeeded; the count is a convenience
        log.warning("cannot update the status of Workspace %s/%s", namespace, name, exc_info=True)


def _store(access: StoreAccess | None) -> StoreAccess:
    if access is None or not access.settings.bucket:
        raise no_store()
    return access


def file_not_found(namespace: str, name: str, path: str) -> ApiError:
    return ApiError.of(
        "NotFound",
        f'file "{path}" not found in Workspace "{name}"',
        name=name,
        kind="workspaces",
        fix=f"List the home's files: GET {API_PREFIX}/namespaces/{namespace}/workspaces/{name}/files "
        f"(nodus workspace ls {name}).",
    )


# -- the store ------------------------------------------------------------------------------------------
async def _size_of(access: StoreAccess, key: str) -> int | None:
    try:
        return await access.head(key)
    except Exception as e:
        if is_store_error(e):
            raise store_failed("answer", e) from None
        raise


async def _page(access: StoreAccess, prefix: str, limit: int, token: str | None) -> dict[str, Any]:
    client = await access.client()
    ask: dict[str, Any] = {"Bucket": access.bucket, "Prefix": prefix, "MaxKeys": limit}
    if token:
        ask["ContinuationToken"] = token
    try:
        return dict(await client.list_objects_v2(**ask))
    except Exception as e:
        if not is_store_error(e):
            raise
        if "ContinuationToken" in ask and "InvalidArgument" in str(e):
            raise ApiError.of(
                "BadRequest",
                "the continue token is not one this listing gave",
                fix="Send the continue value of the previous page as it was, or leave it out.",
            ) from None
        raise store_failed("list the files", e) from None


def _stamp(value: Any) -> str:
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return str(value)


async def delete_home(access: StoreAccess | None, namespace: str, name: str) -> int:
    """Delete every file of a Workspace's home (after the Workspace itself is gone); the count deleted.
    Best effort: a failure is logged and leaves the rest for the next delete of that name."""
    if access is None or not access.settings.bucket:
        return 0
    deleted = 0
    try:
        client = await access.client()
        token: str | None = None
        while True:
            page = await _page(access, workspace_prefix(namespace, name), MAX_PAGE, token)
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                await client.delete_objects(Bucket=access.bucket, Delete={"Objects": keys, "Quiet": True})
                deleted += len(keys)
            token = page.get("NextContinuationToken") if page.get("IsTruncated") else None
            if not token:
                return deleted
    except Exception:
        log.warning("cannot delete the files of Workspace %s/%s", namespace, name, exc_info=True)
        return deleted


# -- routes ---------------------------------------------------------------------------------------------
def _limit(limit: int | None) -> int:
    return MAX_PAGE if not limit else min(limit, MAX_PAGE)


async def _chunks(body: Any) -> AsyncIterator[bytes]:
    async with body:
        async for chunk in body.iter_chunks(READ_CHUNK):
            yield chunk


def workspace_file_router(stores: Stores, access: StoreAccess | None) -> APIRouter:
    """The files of Workspaces: list, write, read and delete."""
    router = APIRouter(tags=["workspaces"])
    plural = resource("workspaces").plural

    @router.get(FILES_PATH, name="list files of workspaces")
    async def list_files(
        namespace: str,
        name: str,
        request: Request,
        prefix: PrefixQ = None,
        limit: LimitQ = None,
        continue_: ContinueQ = None,
    ) -> Response:
        await authorize(request, "get", plural, namespace)
        await workspace_of(stores, namespace, name)
        where = _store(access)
        home = workspace_prefix(namespace, name)
        page = await _page(where, _dir_prefix(namespace, name, prefix), _limit(limit), continue_)
        items = [
            {
                "path": o["Key"][len(home) :],
                "sizeBytes": int(o["Size"]),
                "lastModified": _stamp(o["LastModified"]),
            }
            for o in page.get("Contents", [])
        ]
        out: dict[str, Any] = {"items": items}
        if page.get("IsTruncated") and page.get("NextContinuationToken"):
            out["continue"] = page["NextContinuationToken"]
        return object_response(out)

    @router.put(FILE_PATH, name="write file of workspaces")
    async def put_file(namespace: str, name: str, path: str, request: Request) -> Response:
        await authorize(request, "update", plural, namespace)
        await workspace_of(stores, namespace, name)
        rel, key = file_key(namespace, name, path)
        where = _store(access)
        before = await _size_of(where, key)
        limits = BodyLimits(where.settings.workspace_file_max_bytes, FILE_CAP_VARIABLE)
        size = await store_body(request, where, key, limits)
        await count_change(stores, namespace, name, 1 if before is None else 0, size - (before or 0))
        return object_response({"path": rel, "sizeBytes": size}, 201 if before is None else 200)

    @router.get(FILE_PATH, name="read file of workspaces")
    async def get_file(namespace: str, name: str, path: str, request: Request) -> Response:
        await authorize(request, "get", plural, namespace)
        await workspace_of(stores, namespace, name)
        rel, key = file_key(namespace, name, path)
        where = _store(access)
        client = await where.client()
        try:
            reply = await client.get_object(Bucket=where.bucket, Key=key)
        except Exception as e:
            if is_store_error(e) and is_missing(e):
                raise file_not_found(namespace, name, rel) from None
            if is_store_error(e):
                raise store_failed("read the file", e) from None
            raise
        # A file a user put there is served as bytes to save, never as a page: a browser must not run an
        # uploaded .html on the API's origin (where the web view keeps its token).
        headers = {
            "Content-Length": str(reply["ContentLength"]),
            "Content-Disposition": "attachment",
            "X-Content-Type-Options": "nosniff",
        }
        return StreamingResponse(
            _chunks(reply["Body"]), media_type="application/octet-stream", headers=headers
        )

    @router.delete(FILE_PATH, name="delete file of workspaces")
    async def delete_file(namespace: str, name: str, path: str, request: Request) -> Response:
        await authorize(request, "delete", plural, namespace)
        await workspace_of(stores, namespace, name)
        rel, key = file_key(namespace, name, path)
        where = _store(access)
        before = await _size_of(where, key)
        if before is None:
            raise file_not_found(namespace, name, rel)
        try:
            await where.delete(key)
        except Exception as e:
            if is_store_error(e):
                raise store_failed("delete the file", e) from None
            raise
        await count_change(stores, namespace, name, -1, -before)
        return object_response({"path": rel, "sizeBytes": before})

    return router
