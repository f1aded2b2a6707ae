"""The gateway app in-process (httpx over ASGI) against the session's real nats-server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI
from nats.aio.client import Client as NATS

from nodus_billing.quoting import serve_quotes
from nodus_gateway import estimating
from nodus_gateway.app import build_app
from nodus_gateway.gitrefs import GitSettings
from nodus_gateway.resources import stores_for
from nodus_scheduler.answering import serve_estimates
from nodus_scheduler.cataloging import load_catalog

ADMIN_TOKEN = "test-admin-token-0123456789"


@pytest.fixture
def git_settings() -> GitSettings:
    """How the test gateway asks git hosts; a module with a git server overrides it."""
    return GitSettings()


@pytest_asyncio.fixture
async def app(nc: NATS, git_settings: GitSettings) -> FastAPI:
    # A new gateway: no pause left over from another test's unanswered estimate (estimating's notes).
    estimating.resume(nc)
    return build_app(stores_for(nc), admin_token=ADMIN_TOKEN, ready=lambda: nc.is_connected, git=git_settings)


@pytest_asyncio.fixture
async def api(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the app that sends the admin token."""
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://gateway",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    ) as client:
        yield client


@pytest_asyncio.fixture(scope="session", autouse=True)
async def billing_endpoints(nc: NATS) -> AsyncIterator[None]:
    """Billing's account, grant and usage endpoints (the real ones) for every gateway test: the account
    and usage routes answer from them, and a route that every GET test calls must not answer 503."""
    from nodus_billing.books import Books
    from nodus_billing.serving import serve_accounts

    subs = await serve_accounts(nc, Books(nc))
    yield
    for sub in subs:
        await sub.unsubscribe()


def failure(resp: httpx.Response, code: int, reason: str) -> dict[str, Any]:
    """The body of a ``code`` answer: a metav1.Status of ``reason`` with a fix."""
    assert resp.status_code == code, resp.text
    body: dict[str, Any] = resp.json()
    assert (body["kind"], body["code"], body["reason"]) == ("Status", code, reason)
    assert body["fix"]
    return body


@pytest_asyncio.fixture
async def endpoints(nc: NATS) -> AsyncIterator[None]:
    """The scheduler's and billing's estimate endpoints, on the real subjects the gateway asks."""
    subs = [await serve_estimates(nc, load_catalog()), await serve_quotes(nc)]
    yield
    for sub in subs:
        await sub.unsubscribe()
