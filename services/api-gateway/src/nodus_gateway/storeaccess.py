"""The gateway's way into Nodus's own S3 store (ADR-0036): blobs and Workspace files live there.

The store is the agents' checkpoint and output bucket; the gateway writes only under ``_nodus/``
(nodus_schema.volumes.STORE_PREFIX). Its settings are read once, at start, with the kit's typed settings:

=================================  ==========================================================================
variable                           what
=================================  ==========================================================================
NODUS_STORE_BUCKET                 the bucket; unset: every blob and Workspace file endpoint answers 503
NODUS_S3_ENDPOINT                  the S3 endpoint (unset: AWS's own for the region)
NODUS_S3_REGION                    default us-east-1
NODUS_S3_ACCESS_KEY/_SECRET_KEY    the keys (unset: the AWS SDK's usual chain)
NODUS_BLOB_MAX_BYTES               the largest blob an upload may make (a quantity, default 20Gi)
NODUS_WORKSPACE_FILE_MAX_BYTES     the largest Workspace file (a quantity, default 20Gi)
=================================  ==========================================================================

One aiobotocore client serves every request; it is made on first use (a gateway without a bucket never
imports the SDK) and closed with the service.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Annotated, Any, Final

import msgspec

from nodus_gateway.responding import ApiError
from nodus_kit.configuring import Env
from nodus_schema.quantities import parse_bytes, parse_duration

DEFAULT_MAX_BYTES: Final = 20 * 1024**3
"""20Gi: the default cap of one blob and of one Workspace file."""
BUCKET_VARIABLE: Final = "NODUS_STORE_BUCKET"
NO_STORE_FIX: Final = (
    f"The gateway has no store: set {BUCKET_VARIABLE} (the agents' checkpoint and output bucket) with "
    "NODUS_S3_ENDPOINT, NODUS_S3_ACCESS_KEY and NODUS_S3_SECRET_KEY on the gateway and restart it "
    "(the local stack sets them)."
)


DEFAULT_BLOB_TTL_S: Final = 7 * 86400.0
MIN_BLOB_TTL_S: Final = 2 * 3600.0
"""Above the hour between two touches of a blob in use (referencing.TOUCH_EVERY), with room to spare: a
blob in use is never judged unused."""


def _ttl(text: str) -> float:
    try:
        seconds = parse_duration(text).total_seconds()
    except ValueError as e:
        raise ValueError(f"give a duration such as 168h or 720h ({e})") from None
    if seconds < MIN_BLOB_TTL_S:
        raise ValueError("give at least 2h: a blob in use is touched only once an hour")
    return seconds


def _bytes(text: str) -> int:
    try:
        value = parse_bytes(text)
    except ValueError as e:
        raise ValueError(f"give a quantity of bytes such as 20Gi or 500Mi ({e})") from None
    if value < 1:
        raise ValueError("give a quantity of bytes of at least 1 (such as 20Gi)")
    return value


class StoreSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Where the gateway's blobs and Workspace files go, and the caps on them."""

    bucket: Annotated[str | None, Env(BUCKET_VARIABLE)] = None
    endpoint: Annotated[str | None, Env("NODUS_S3_ENDPOINT")] = None
    region: Annotated[str, Env("NODUS_S3_REGION")] = "us-east-1"
    access_key: Annotated[str | None, Env("NODUS_S3_ACCESS_KEY")] = None
    secret_key: Annotated[str | None, Env("NODUS_S3_SECRET_KEY")] = None
    blob_max_bytes: Annotated[int, Env("NODUS_BLOB_MAX_BYTES", parse=_bytes)] = DEFAULT_MAX_BYTES
    workspace_file_max_bytes: Annotated[int, Env("NODUS_WORKSPACE_FILE_MAX_BYTES", parse=_bytes)] = (
        DEFAULT_MAX_BYTES
    )
    blob_ttl_s: Annotated[float, Env("NODUS_BLOB_TTL", parse=_ttl)] = DEFAULT_BLOB_TTL_S
    """How long a blob nothing refers to is kept after its last use (blobreaping.py)."""

    def __repr__(self) -> str:
        # Never the secret key: settings end up in log lines and tracebacks.
        return (
            f"StoreSettings(bucket={self.bucket!r}, endpoint={self.endpoint!r}, region={self.region!r}, "
            f"blob_max_bytes={self.blob_max_bytes}, workspace_file_max_bytes={self.workspace_file_max_bytes})"
        )


def no_store() -> ApiError:
    """503 for a blob or file endpoint of a gateway started without a bucket."""
    return ApiError.of(
        "ServiceUnavailable",
        f"this gateway has no store for blobs and Workspace files ({BUCKET_VARIABLE} is not set)",
        fix=NO_STORE_FIX,
    )


def store_failed(what: str, err: BaseException) -> ApiError:
    """503 for a store that did not do what was asked (down, refused our keys): the caller retries. The
    SDK's message names the operation and the store's code, never a key."""
    return ApiError.of(
        "ServiceUnavailable",
        f"the store did not {what}: {type(err).__name__}: {err}",
        fix="Retry in a moment; if it persists, the operator checks the gateway's NODUS_S3_* settings and "
        "that the store is up.",
        retry_after=1,
    )


def too_large(cap: int, variable: str) -> ApiError:
    """413 for a body past the cap ``variable`` sets (said as soon as it passes, or from Content-Length)."""
    return ApiError.of(
        "RequestEntityTooLarge",
        f"the body is larger than this gateway's limit of {cap} bytes ({variable})",
        fix=f"Send less (split the data into several Volumes or files), or ask the operator to raise "
        f"{variable}.",
    )


def is_store_error(err: BaseException) -> bool:
    """Whether ``err`` is the S3 SDK's: the store answered an error, or could not be reached."""
    from botocore.exceptions import BotoCoreError, ClientError

    return isinstance(err, ClientError | BotoCoreError)


class StoreAccess:
    """The settings and one shared S3 client; :meth:`client` makes it on first use."""

    def __init__(self, settings: StoreSettings) -> None:
        self.settings = settings
        self._stack = contextlib.AsyncExitStack()
        self._client: Any = None
        self._lock = asyncio.Lock()

    @property
    def bucket(self) -> str:
        """The bucket; 503 ServiceUnavailable (an ApiError) when none is set."""
        if not self.settings.bucket:
            raise no_store()
        return self.settings.bucket

    async def client(self) -> Any:
        """The aiobotocore S3 client (path-style addressing: SeaweedFS, MinIO and AWS all take it)."""
        _ = self.bucket  # no bucket, no client
        async with self._lock:
            if self._client is None:
                self._client = await self._stack.enter_async_context(self._create())
        return self._client

    def _create(self) -> Any:
        # Imported here: the SDK takes a while to import, and a gateway without a store never needs it.
        from aiobotocore.config import AioConfig
        from aiobotocore.session import get_session

        s = self.settings
        config = AioConfig(
            s3={"addressing_style": "path"},
            max_pool_connections=32,
            retries={"max_attempts": 3, "mode": "standard"},
        )
        return get_session().create_client(
            "s3",
            endpoint_url=s.endpoint,
            region_name=s.region,
            aws_access_key_id=s.access_key,
            aws_secret_access_key=s.secret_key,
            config=config,
        )

    async def head(self, key: str) -> int | None:
        """The size of the object at ``key``, or None when there is none."""
        client = await self.client()
        try:
            reply = await client.head_object(Bucket=self.bucket, Key=key)
        except client.exceptions.ClientError as e:
            if is_missing(e):
                return None
            raise
        return int(reply["ContentLength"])

    async def delete(self, key: str) -> None:
        client = await self.client()
        await client.delete_object(Bucket=self.bucket, Key=key)

    async def close(self) -> None:
        async with self._lock:
            self._client = None
            await self._stack.aclose()


def _code(err: Any) -> str:
    """The S3 error code of a botocore ClientError (``NoSuchKey``, ``404``)."""
    response = getattr(err, "response", None) or {}
    return str((response.get("Error") or {}).get("Code", ""))


def is_missing(err: Exception) -> bool:
    """Whether a store error says the object is not there."""
    return _code(err) in ("404", "NoSuchKey", "NotFound")
