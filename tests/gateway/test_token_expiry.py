"""Token expiry: a lifetime asked for at create (expirationSeconds or expirationTimestamp) or the 30-day
default, shown in status.expirationTimestamp and enforced on every request, cached or not; an expired
token's 401 says only that it expired, with the fix; a token minted before tokens expired lives a year
from its creation, with a Warning on every response; the admin token has no expiry.

The gateway's wall clock is injected (``Principals(now=...)``): time moves by assignment, never by waiting.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI
from nats.aio.client import Client as NATS

from nodus_cli import main
from nodus_gateway.app import build_app
from nodus_gateway.principals import (
    LEGACY_EXPIRATION_S,
    TOKEN_PREFIX,
    Principals,
    TokenRecord,
    expiration_of,
    new_secret,
)
from nodus_gateway.resources import stores_for
from nodus_gateway.server import ApiServer
from nodus_schema import ObjectMeta
from nodus_schema.access import (
    DEFAULT_TOKEN_EXPIRATION_S,
    MAX_TOKEN_EXPIRATION_S,
    MIN_TOKEN_EXPIRATION_S,
    TokenSpec,
)
from nodus_schema.meta import format_time

ADMIN_TOKEN = "expiry-admin-token-0123456789"
V1 = "/apis/nodus.dev/v1"
DAY = 24 * 3600


class Clock:
    """The gateway's wall clock (Unix seconds), moved by the test."""

    def __init__(self) -> None:
        self.t = float(math.floor(time.time()))

    def __call__(self) -> float:
        return self.t


def stamp(unix_s: float) -> str:
    return format_time(datetime.fromtimestamp(unix_s, UTC))


def client(app: FastAPI, token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://gateway",
        headers={"Authorization": f"Bearer {token}"},
    )


def sweeps(namespace: str) -> str:
    return f"{V1}/namespaces/{namespace}/sweeps"


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def principals(nc: NATS, clock: Clock) -> Principals:
    # A cache TTL longer than any step below: every request after the first is a cache hit, so the tests
    # show that the cache does not stretch a token's life.
    return Principals(nc, pepper=b"expiry-pepper", cache_ttl_s=300, now=clock)


@pytest_asyncio.fixture
async def gateway(nc: NATS, principals: Principals) -> FastAPI:
    return build_app(stores_for(nc), admin_token=ADMIN_TOKEN, principals=principals)


@pytest_asyncio.fixture
async def admin(gateway: FastAPI, unique: str) -> AsyncIterator[httpx.AsyncClient]:
    async with client(gateway, ADMIN_TOKEN) as c:
        resp = await c.post(f"{V1}/projects", json={"metadata": {"name": unique}})
        assert resp.status_code == 201, resp.text
        yield c


async def mint(admin: httpx.AsyncClient, project: str, **expiry: Any) -> dict[str, Any]:
    spec = {"principal": "carol", "roles": {project: "viewer"}, **expiry}
    resp = await admin.post(f"{V1}/tokens", json={"spec": spec})
    assert resp.status_code == 201, resp.text
    body: dict[str, Any] = resp.json()
    return body


async def status_of(gateway: FastAPI, token: str, project: str) -> int:
    async with client(gateway, token) as c:
        return (await c.get(sweeps(project))).status_code


# -- create ------------------------------------------------------------------------------------------------


async def test_a_token_asking_for_no_expiry_gets_30_days(
    gateway: FastAPI, admin: httpx.AsyncClient, clock: Clock, unique: str
) -> None:
    minted = await mint(admin, unique)
    assert minted["status"]["expirationTimestamp"] == stamp(clock.t + DEFAULT_TOKEN_EXPIRATION_S)
    assert minted["metadata"]["creationTimestamp"] == stamp(clock.t)
    assert "expirationSeconds" not in minted["spec"]  # the spec says what was asked: nothing
    got = await admin.get(f"{V1}/tokens/{minted['metadata']['name']}")
    assert got.json()["status"]["expirationTimestamp"] == minted["status"]["expirationTimestamp"]
    listed = (await admin.get(f"{V1}/tokens")).json()["items"]
    [row] = [t for t in listed if t["metadata"]["name"] == minted["metadata"]["name"]]
    assert row["status"]["expirationTimestamp"] == minted["status"]["expirationTimestamp"]

    start = clock.t
    assert await status_of(gateway, minted["secret"], unique) == 200
    clock.t = start + DEFAULT_TOKEN_EXPIRATION_S - 1
    assert await status_of(gateway, minted["secret"], unique) == 200
    clock.t = start + DEFAULT_TOKEN_EXPIRATION_S
    assert await status_of(gateway, minted["secret"], unique) == 401


async def test_expiration_seconds_is_the_lifetime_and_the_cache_does_not_stretch_it(
    gateway: FastAPI, admin: httpx.AsyncClient, clock: Clock, unique: str
) -> None:
    start = clock.t
    minted = await mint(admin, unique, expirationSeconds=MIN_TOKEN_EXPIRATION_S)
    assert minted["spec"]["expirationSeconds"] == MIN_TOKEN_EXPIRATION_S
    assert minted["status"]["expirationTimestamp"] == stamp(start + MIN_TOKEN_EXPIRATION_S)
    clock.t = start + MIN_TOKEN_EXPIRATION_S - 1
    assert await status_of(gateway, minted["secret"], unique) == 200  # looked up, and now cached
    clock.t = start + MIN_TOKEN_EXPIRATION_S
    assert await status_of(gateway, minted["secret"], unique) == 401  # a cache hit, still expired


async def test_expiration_timestamp_is_the_end(
    gateway: FastAPI, admin: httpx.AsyncClient, clock: Clock, unique: str
) -> None:
    end = clock.t + 7 * DAY
    # Another zone and a fraction: kept in the spec as sent, normalised (UTC, whole seconds) in status.
    asked = datetime.fromtimestamp(end + 0.5, UTC).astimezone().isoformat()
    minted = await mint(admin, unique, expirationTimestamp=asked)
    assert minted["spec"]["expirationTimestamp"] == asked
    assert minted["status"]["expirationTimestamp"] == stamp(end)
    clock.t = end - 1
    assert await status_of(gateway, minted["secret"], unique) == 200
    clock.t = end
    assert await status_of(gateway, minted["secret"], unique) == 401


def test_expiration_of_rounds_down() -> None:
    assert expiration_of(TokenSpec(expiration_seconds=600), 1000.9) == 1600.0
    assert expiration_of(TokenSpec(), 1000.0) == 1000.0 + DEFAULT_TOKEN_EXPIRATION_S
    spec = TokenSpec(expiration_timestamp="2030-01-01T00:00:00.999Z")
    assert expiration_of(spec, 0.0) == datetime(2030, 1, 1, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("expiry", "field"),
    [
        ({"expirationSeconds": MIN_TOKEN_EXPIRATION_S - 1}, "spec.expirationSeconds"),
        ({"expirationSeconds": MAX_TOKEN_EXPIRATION_S + 1}, "spec.expirationSeconds"),
        ({"expirationSeconds": "3600"}, "spec.expirationSeconds"),
        (
            {"expirationSeconds": 3600, "expirationTimestamp": "2099-01-01T00:00:00Z"},
            "spec.expirationTimestamp",
        ),
        ({"expirationTimestamp": "yesterday"}, "spec.expirationTimestamp"),
        ({"expirationTimestamp": "PAST"}, "spec.expirationTimestamp"),
        ({"expirationTimestamp": "SOON"}, "spec.expirationTimestamp"),
        ({"expirationTimestamp": "FAR"}, "spec.expirationTimestamp"),
    ],
)
async def test_expirations_out_of_bounds_are_422(
    admin: httpx.AsyncClient, clock: Clock, unique: str, expiry: dict[str, Any], field: str
) -> None:
    relative = {"PAST": -60, "SOON": MIN_TOKEN_EXPIRATION_S - 1, "FAR": MAX_TOKEN_EXPIRATION_S + 60}
    expiry = {
        k: stamp(clock.t + relative[v]) if isinstance(v, str) and v in relative else v
        for k, v in expiry.items()
    }
    spec = {"principal": "carol", "roles": {unique: "viewer"}, **expiry}
    resp = await admin.post(f"{V1}/tokens", json={"spec": spec})
    assert resp.status_code == 422, resp.text
    body = resp.json()
    assert body["reason"] == "Invalid"
    assert [c["field"] for c in body["details"]["causes"]] == [field]


# -- the expired 401 ---------------------------------------------------------------------------------------


async def test_an_expired_token_is_401_saying_only_that_it_expired(
    gateway: FastAPI, admin: httpx.AsyncClient, clock: Clock, unique: str
) -> None:
    minted = await mint(admin, unique, expirationSeconds=3600)
    clock.t += 3600
    async with client(gateway, minted["secret"]) as carol:
        resp = await carol.get(sweeps(unique))
    assert resp.status_code == 401, resp.text
    assert resp.headers["www-authenticate"].startswith("Bearer")
    body = resp.json()
    assert (body["kind"], body["reason"], body["code"]) == ("Status", "Unauthorized", 401)
    assert body["message"] == "Unauthorized: the bearer token has expired"
    assert "nodus login" in body["fix"] and "POST /apis/nodus.dev/v1/tokens" in body["fix"]
    assert body["docs"].endswith("/errors/Unauthorized")
    # Nothing about the token beyond "expired": not whose it was, its id, its project or when it ended.
    for secret_detail in (
        "carol",
        minted["metadata"]["name"],
        unique,
        minted["status"]["expirationTimestamp"],
    ):
        assert secret_detail not in resp.text
    assert "details" not in body
    # Shaped exactly as the 401 of a token that never existed.
    async with client(gateway, new_secret()) as stranger:
        never = (await stranger.get(sweeps(unique))).json()
    assert set(never) == set(body) and never["reason"] == body["reason"]


async def test_the_cli_shows_the_expired_tokens_fix(
    nc: NATS,
    principals: Principals,
    admin: httpx.AsyncClient,
    clock: Clock,
    unique: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    minted = await mint(admin, unique, expirationSeconds=600)
    clock.t += 600
    server = ApiServer(
        build_app(stores_for(nc), admin_token=ADMIN_TOKEN, principals=principals), "127.0.0.1", 0
    )
    await server.start()
    try:
        args = ["--server", server.url, "--token", minted["secret"], "get", "sweeps", "-n", unique]
        code = await asyncio.to_thread(main, args)
    finally:
        await server.stop()
    err = capsys.readouterr().err
    assert code == 1 and "the bearer token has expired" in err and "nodus login" in err


# -- tokens minted before expiry, and the admin token ------------------------------------------------------


async def legacy_token(principals: Principals, created: float, project: str) -> tuple[str, str]:
    """A record as the gateway wrote them before tokens expired: no status. Returns (secret, id)."""
    secret = new_secret()
    digest = principals.digest(secret)
    record = TokenRecord(
        metadata=ObjectMeta(name=digest[:24], creation_timestamp=stamp(created)),
        spec=TokenSpec(principal="old", roles={project: "viewer"}),
        digest=digest,
    )
    await principals.tokens.create(record)
    return secret, digest[:24]


async def test_a_token_minted_before_expiry_lives_a_year_from_its_creation_with_a_warning(
    gateway: FastAPI, admin: httpx.AsyncClient, principals: Principals, clock: Clock, unique: str
) -> None:
    created = clock.t - 100 * DAY
    secret, token_id = await legacy_token(principals, created, unique)
    ends = stamp(created + LEGACY_EXPIRATION_S)
    got = await admin.get(f"{V1}/tokens/{token_id}")
    assert got.json()["status"]["expirationTimestamp"] == ends
    async with client(gateway, secret) as old:
        resp = await old.get(sweeps(unique))
        assert resp.status_code == 200, resp.text
        [warning] = resp.headers.get_list("warning")
        assert warning.startswith('299 - "this token was minted before tokens expired') and ends in warning
        clock.t = created + LEGACY_EXPIRATION_S
        resp = await old.get(sweeps(unique))
        assert resp.status_code == 401 and "expired" in resp.json()["message"]


async def test_a_token_minted_before_expiry_over_a_year_ago_has_expired(
    gateway: FastAPI, principals: Principals, clock: Clock, unique: str
) -> None:
    secret, _ = await legacy_token(principals, clock.t - LEGACY_EXPIRATION_S - DAY, unique)
    assert await status_of(gateway, secret, unique) == 401


async def test_a_new_token_carries_no_warning(
    gateway: FastAPI, admin: httpx.AsyncClient, unique: str
) -> None:
    minted = await mint(admin, unique)
    async with client(gateway, minted["secret"]) as carol:
        resp = await carol.get(sweeps(unique))
    assert resp.status_code == 200 and "warning" not in resp.headers


async def test_the_admin_token_does_not_expire(gateway: FastAPI, clock: Clock, unique: str) -> None:
    clock.t += 10 * MAX_TOKEN_EXPIRATION_S
    assert await status_of(gateway, ADMIN_TOKEN, unique) == 200
    assert TOKEN_PREFIX not in ADMIN_TOKEN  # not looked up in the store at all
