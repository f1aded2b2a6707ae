"""Fixtures the agent's S3 tests share: one bucket per module on the session's SeaweedFS, and each test's
own corner of it."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio

from nodus_agent import s3
from nodus_testing.seaweed import SeaweedS3


@dataclass(frozen=True)
class Store:
    """One test's corner of the module's bucket: every key it writes starts with ``root``."""

    client: Any
    bucket: str
    root: str


@pytest_asyncio.fixture(scope="module")
async def bucket(seaweed: SeaweedS3) -> AsyncIterator[tuple[Any, str]]:
    """One client and bucket per module (a client costs a few hundred ms to build); tests keep apart by
    key prefix."""
    name = f"agent-{secrets.token_hex(4)}"
    settings = s3.S3Settings(
        bucket=name,
        endpoint=seaweed.endpoint_url,
        access_key=seaweed.access_key,
        secret_key=seaweed.secret_key,
    )
    async with s3.client(settings) as client:
        await client.create_bucket(Bucket=name)
        yield client, name


@pytest.fixture
def store(bucket: tuple[Any, str], unique: str) -> Store:
    return Store(bucket[0], bucket[1], f"{unique}/")
