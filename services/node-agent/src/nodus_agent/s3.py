"""One way to reach an S3 store from the agent: checkpoints, outputs and bucket inputs all use it.

The endpoint and keys come either from the agent's own configuration (its checkpoint and output bucket)
or from a Job's Connection and the Secret it refers to (a bucket input). Either way the code that talks
to S3 sees only :class:`S3Settings`, so no module reads a Secret or a config file on its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session


@dataclass(frozen=True)
class S3Settings:
    """Where and as whom: ``endpoint`` None means AWS's own endpoint for ``region``."""

    bucket: str
    endpoint: str | None = None
    region: str = "us-east-1"
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)  # never in a repr, so never in a log line
    max_pool_connections: int = 32


@asynccontextmanager
async def client(settings: S3Settings) -> AsyncIterator[Any]:
    """An aiobotocore S3 client for ``settings`` (path-style addressing: SeaweedFS, MinIO and AWS all
    accept it, and it needs no DNS per bucket)."""
    config = AioConfig(
        s3={"addressing_style": "path"},
        max_pool_connections=settings.max_pool_connections,
        retries={"max_attempts": 5, "mode": "standard"},
    )
    session = get_session()
    async with session.create_client(
        "s3",
        endpoint_url=settings.endpoint,
        region_name=settings.region,
        aws_access_key_id=settings.access_key,
        aws_secret_access_key=settings.secret_key,
        config=config,
    ) as s3:
        yield s3
