"""``bucket`` inputs (:mod:`nodus_agent.inputs`): one S3 object, or every object under a prefix as a
directory, read with the endpoint and keys of the Job's S3 Connection; and the S3 reading and error
wording that ``output`` inputs share."""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path
from typing import Any, Final

from botocore.exceptions import BotoCoreError, ClientError

from nodus_agent.inputcontext import InputContext, InputError, InputRecord, container_path
from nodus_agent.inputstaging import CHUNK, Budget, Layout, Materialisation, stream_to
from nodus_schema.jobs import JobInput

__all__ = ["NO_SUCH_KEY", "fetch_bucket", "get_object", "s3_error"]

_S3_URI: Final = re.compile(r"s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/(?P<key>.*)")
NO_SUCH_KEY: Final = ("NoSuchKey", "404", "NotFound")
_DENIED: Final = ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch")


def _parse_uri(name: str, uri: str) -> tuple[str, str]:
    match = _S3_URI.fullmatch(uri)
    if match is None or not match["key"]:
        raise InputError(name, f"{uri!r} is not s3://bucket/key (or s3://bucket/prefix/ for a directory)")
    return match["bucket"], match["key"]


async def fetch_bucket(inp: JobInput, run: Materialisation, ctx: InputContext) -> InputRecord:
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
    budget = Budget(name, ctx.settings.max_bytes)
    try:
        client = await run.clients.get(creds.settings())
        if key.endswith("/"):
            if expect is not None:
                raise InputError(name, "sha256 checks one object; name one key, or drop the sha256")
            return await _fetch_prefix(client, name, bucket, key, uri, run.layout, budget)
        staged = run.layout.temp()
        size, digest = await get_object(client, name, bucket, key, staged, budget, expect)
    except (ClientError, BotoCoreError) as e:
        raise s3_error(name, uri, e, inp.bucket.connection) from None
    await asyncio.to_thread(run.layout.place, name, staged)
    return InputRecord(
        name=name, kind="bucket", source=uri, path=container_path(name), bytes=size, sha256=digest
    )


async def get_object(
    client: Any, name: str, bucket: str, key: str, staged: Path, budget: Budget, expect: str | None
) -> tuple[int, str]:
    resp = await client.get_object(Bucket=bucket, Key=key)
    async with resp["Body"] as body:
        return await stream_to(staged, name, budget, body.iter_chunks(CHUNK), expect)


async def _fetch_prefix(
    client: Any, name: str, bucket: str, prefix: str, uri: str, layout: Layout, budget: Budget
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
                await get_object(client, name, bucket, obj["Key"], target, budget, None)
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
        path=container_path(name),
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


def s3_error(name: str, uri: str, e: Exception, connection: str | None) -> InputError:
    code = ""
    if isinstance(e, ClientError):
        code = str(e.response.get("Error", {}).get("Code", ""))
    if code in NO_SUCH_KEY or code == "NoSuchBucket":
        return InputError(name, f"{uri} does not exist ({code}); check the URI")
    if code in _DENIED:
        return InputError(
            name, f"Connection {connection!r} may not read {uri} ({code}); check its keys and policy"
        )
    return InputError(name, f"reading {uri} failed: {e}", retryable=True)
