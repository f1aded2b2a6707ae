"""Failed authentication limited per client: N rejected credentials in a window, then 429 with Retry-After
and a TooManyRequests Status; valid minted tokens keep working, from the limited client too; the admin
token from a limited client is not compared; other clients are never limited; X-Forwarded-For is believed
only from a trusted proxy; memory stays bounded however many addresses fail; settings from the environment.

The limiter's clock is injected: the window passes by assignment, never by waiting.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI
from nats.aio.client import Client as NATS

from nodus_gateway import authlimits
from nodus_gateway.app import build_app
from nodus_gateway.authlimits import AuthFailureLimiter, client_key
from nodus_gateway.config import ConfigError, GatewayConfig
from nodus_gateway.principals import Principals, new_secret
from nodus_gateway.resources import stores_for
from nodus_gateway.server import ApiServer

ADMIN_TOKEN = "limit-admin-token-0123456789"
V1 = "/apis/nodus.dev/v1"
FAILURES = 3
WINDOW = 60.0
ATTACKER = "10.0.0.1"
NEIGHBOUR = "10.0.0.2"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def limiter(clock: Clock) -> AuthFailureLimiter:
    return AuthFailureLimiter(FAILURES, WINDOW, 100, clock=clock)


@pytest_asyncio.fixture
async def gateway(nc: NATS, limiter: AuthFailureLimiter) -> FastAPI:
    principals = Principals(nc, pepper=b"limit-pepper", cache_ttl_s=0.2)
    return build_app(stores_for(nc), admin_token=ADMIN_TOKEN, principals=principals, auth_limiter=limiter)


def client(app: FastAPI, address: str, token: str | None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, client=(address, 40000)),
        base_url="http://gateway",
        headers=headers,
    )


def sweeps(namespace: str) -> str:
    return f"{V1}/namespaces/{namespace}/sweeps"


async def get(app: FastAPI, address: str, token: str | None, path: str) -> httpx.Response:
    async with client(app, address, token) as c:
        return await c.get(path)


@pytest_asyncio.fixture
async def minted(gateway: FastAPI, unique: str) -> str:
    """A valid token (viewer in the project ``unique``), minted from an address that never fails."""
    async with client(gateway, "192.0.2.1", ADMIN_TOKEN) as admin:
        resp = await admin.post(f"{V1}/projects", json={"metadata": {"name": unique}})
        assert resp.status_code == 201, resp.text
        resp = await admin.post(
            f"{V1}/tokens", json={"spec": {"principal": "vic", "roles": {unique: "viewer"}}}
        )
        assert resp.status_code == 201, resp.text
        secret: str = resp.json()["secret"]
        return secret


async def limit(app: FastAPI, address: str, unique: str) -> None:
    """Fail FAILURES times from ``address``, on different paths and so through both of the app's lanes
    (the direct handlers and FastAPI's): each is an ordinary 401."""
    paths = [sweeps(unique), "/apis", f"{V1}/tokens", "/openapi/v2"]
    for i in range(FAILURES):
        token = "wrong" if i % 2 else new_secret()  # a non-minted guess, and a minted-looking one
        resp = await get(app, address, token, paths[i % len(paths)])
        assert resp.status_code == 401, resp.text


def assert_limited(resp: httpx.Response, retry_after: int) -> dict[str, Any]:
    assert resp.status_code == 429, resp.text
    assert resp.headers["retry-after"] == str(retry_after)
    body: dict[str, Any] = resp.json()
    assert (body["kind"], body["reason"], body["code"]) == ("Status", "TooManyRequests", 429)
    assert body["details"]["retryAfterSeconds"] == retry_after
    assert body["docs"].endswith("/errors/TooManyRequests") and "Retry-After" in body["fix"]
    return body


# -- the limit ---------------------------------------------------------------------------------------------


async def test_n_failures_then_429_until_the_window_ends(gateway: FastAPI, clock: Clock, unique: str) -> None:
    await limit(gateway, ATTACKER, unique)
    assert_limited(await get(gateway, ATTACKER, "wrong", sweeps(unique)), 60)
    assert_limited(await get(gateway, ATTACKER, new_secret(), sweeps(unique)), 60)
    clock.t += 29.5
    assert_limited(await get(gateway, ATTACKER, "wrong", "/apis"), 31)
    clock.t += 30.5  # the window started at the first failure: it is over
    assert (await get(gateway, ATTACKER, "wrong", "/apis")).status_code == 401


async def test_a_valid_minted_token_still_works_from_a_limited_client(
    gateway: FastAPI, minted: str, unique: str
) -> None:
    await limit(gateway, ATTACKER, unique)
    assert (await get(gateway, ATTACKER, minted, sweeps(unique))).status_code == 200
    # Its success does not reset the count: the next wrong one is still refused.
    assert_limited(await get(gateway, ATTACKER, new_secret(), sweeps(unique)), 60)


async def test_the_admin_token_from_a_limited_client_is_not_compared(
    gateway: FastAPI, clock: Clock, unique: str
) -> None:
    await limit(gateway, ATTACKER, unique)
    # A right guess of the operator-chosen admin token looks exactly like a wrong one.
    right = assert_limited(await get(gateway, ATTACKER, ADMIN_TOKEN, sweeps(unique)), 60)
    wrong = assert_limited(await get(gateway, ATTACKER, ADMIN_TOKEN + "x", sweeps(unique)), 60)
    assert {k: v for k, v in right.items() if k != "requestId"} == {
        k: v for k, v in wrong.items() if k != "requestId"
    }
    clock.t += WINDOW
    assert (await get(gateway, ATTACKER, ADMIN_TOKEN, sweeps(unique))).status_code == 200


async def test_other_clients_are_never_limited(gateway: FastAPI, minted: str, unique: str) -> None:
    await limit(gateway, ATTACKER, unique)
    assert (await get(gateway, NEIGHBOUR, ADMIN_TOKEN, sweeps(unique))).status_code == 200
    assert (await get(gateway, NEIGHBOUR, minted, sweeps(unique))).status_code == 200
    assert (await get(gateway, NEIGHBOUR, "wrong", sweeps(unique))).status_code == 401


async def test_a_request_without_a_token_is_not_a_failure(gateway: FastAPI, unique: str) -> None:
    for _ in range(FAILURES * 3):
        assert (await get(gateway, ATTACKER, None, sweeps(unique))).status_code == 401
    assert (await get(gateway, ATTACKER, ADMIN_TOKEN, sweeps(unique))).status_code == 200


async def test_x_forwarded_for_does_not_choose_the_client_in_process(gateway: FastAPI, unique: str) -> None:
    for i in range(FAILURES + 2):
        async with client(gateway, ATTACKER, "wrong") as c:
            resp = await c.get(sweeps(unique), headers={"X-Forwarded-For": f"198.51.100.{i}"})
    assert_limited(resp, 60)


async def test_a_valid_request_costs_the_limiter_one_lookup_whatever_it_tracks(
    gateway: FastAPI, limiter: AuthFailureLimiter, minted: str, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    real = authlimits.client_key

    def counting(scope: Any) -> str:
        calls.append(1)
        return real(scope)

    monkeypatch.setattr(authlimits, "client_key", counting)
    assert (await get(gateway, NEIGHBOUR, ADMIN_TOKEN, sweeps(unique))).status_code == 200
    assert calls == []  # no client tracked: nothing computed at all
    for i in range(100):
        await get(gateway, f"10.1.0.{i}", "wrong", "/apis")
    assert len(limiter) == 100
    for token in (ADMIN_TOKEN, minted):
        calls.clear()
        assert (await get(gateway, NEIGHBOUR, token, sweeps(unique))).status_code == 200
        assert len(calls) <= 1, "one dictionary lookup, however many clients are tracked"


# -- through the real server: X-Forwarded-For and trusted proxies ------------------------------------------


async def failures_through(nc: NATS, trusted: tuple[str, ...], unique: str) -> list[int]:
    """The codes of FAILURES + 1 wrong tokens sent from 127.0.0.1, each claiming another X-Forwarded-For."""
    app = build_app(
        stores_for(nc), admin_token=ADMIN_TOKEN, auth_limiter=AuthFailureLimiter(FAILURES, WINDOW, 100)
    )
    server = ApiServer(app, "127.0.0.1", 0, trusted_proxies=trusted)
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.url) as c:
            return [
                (
                    await c.get(
                        sweeps(unique),
                        headers={"Authorization": "Bearer wrong", "X-Forwarded-For": f"198.51.100.{i}"},
                    )
                ).status_code
                for i in range(FAILURES + 1)
            ]
    finally:
        await server.stop()


async def test_x_forwarded_for_is_ignored_unless_the_peer_is_a_trusted_proxy(nc: NATS, unique: str) -> None:
    # uvicorn alone would believe it from 127.0.0.1: the gateway's server does not, by default.
    assert await failures_through(nc, (), unique) == [401] * FAILURES + [429]
    # From a trusted proxy, each forwarded address is its own client.
    assert await failures_through(nc, ("127.0.0.1",), unique) == [401] * (FAILURES + 1)


# -- bounded memory and client keys ------------------------------------------------------------------------


def scope_of(host: str) -> dict[str, Any]:
    return {"client": (host, 1)}


def test_memory_is_bounded_when_addresses_rotate(clock: Clock) -> None:
    limiter = AuthFailureLimiter(2, WINDOW, 50, clock=clock)
    limiter.failed(scope_of("10.9.9.9"))
    limiter.failed(scope_of("10.9.9.9"))
    assert limiter.retry_after(scope_of("10.9.9.9")) == 60
    for i in range(10_000):
        limiter.failed(scope_of(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}"))
        assert len(limiter) <= 50
    # The least recently failing clients were forgotten first; the latest are still counted.
    assert limiter.retry_after(scope_of("10.9.9.9")) is None
    limiter.failed(scope_of("10.0.39.15"))  # the last address above, failing a second time
    assert limiter.retry_after(scope_of("10.0.39.15")) == 60


def test_a_window_over_starts_afresh(clock: Clock) -> None:
    limiter = AuthFailureLimiter(2, WINDOW, 10, clock=clock)
    limiter.failed(scope_of("10.0.0.1"))
    clock.t += WINDOW
    limiter.failed(scope_of("10.0.0.1"))  # the first of a new window
    assert limiter.retry_after(scope_of("10.0.0.1")) is None
    limiter.failed(scope_of("10.0.0.1"))
    assert limiter.retry_after(scope_of("10.0.0.1")) == 60


def test_no_limit_when_failures_is_0(clock: Clock) -> None:
    limiter = AuthFailureLimiter(0, WINDOW, 10, clock=clock)
    for _ in range(100):
        limiter.failed(scope_of("10.0.0.1"))
    assert limiter.retry_after(scope_of("10.0.0.1")) is None and len(limiter) == 0


@pytest.mark.parametrize(
    ("host", "key"),
    [
        ("10.0.0.1", "10.0.0.1"),
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff::1", "2001:db8:1:2::/64"),  # the same /64: one client
        ("::ffff:10.0.0.1", "10.0.0.1"),  # IPv4 on a dual-stack socket: not all IPv4 in one /64
        ("fe80::1%eth0", "fe80::/64"),
    ],
)
def test_client_keys(host: str, key: str) -> None:
    assert client_key(scope_of(host)) == key


def test_no_client_address_is_one_client() -> None:
    assert client_key({}) == client_key({"client": None}) == ""


# -- settings ----------------------------------------------------------------------------------------------


def test_settings() -> None:
    base = {"NODUS_ADMIN_TOKEN": "x"}
    config = GatewayConfig.from_env(base)
    assert (config.auth_failures, config.auth_window_s, config.auth_max_clients) == (10, 60.0, 10_000)
    assert config.trusted_proxies == ()
    config = GatewayConfig.from_env(
        {
            **base,
            "NODUS_GATEWAY_AUTH_FAILURES": "0",
            "NODUS_GATEWAY_AUTH_WINDOW_S": "2.5",
            "NODUS_GATEWAY_AUTH_MAX_CLIENTS": "7",
            "NODUS_GATEWAY_TRUSTED_PROXIES": "10.0.0.0/8, 127.0.0.1,::1",
        }
    )
    assert (config.auth_failures, config.auth_window_s, config.auth_max_clients) == (0, 2.5, 7)
    assert config.trusted_proxies == ("10.0.0.0/8", "127.0.0.1", "::1")
    for name, bad in (
        ("NODUS_GATEWAY_AUTH_FAILURES", "-1"),
        ("NODUS_GATEWAY_AUTH_FAILURES", "many"),
        ("NODUS_GATEWAY_AUTH_WINDOW_S", "0"),
        ("NODUS_GATEWAY_AUTH_WINDOW_S", "soon"),
        ("NODUS_GATEWAY_AUTH_MAX_CLIENTS", "0"),
        ("NODUS_GATEWAY_TRUSTED_PROXIES", "*"),
        ("NODUS_GATEWAY_TRUSTED_PROXIES", "proxy.internal"),
    ):
        with pytest.raises(ConfigError, match=name):
            GatewayConfig.from_env({**base, name: bad})


async def test_the_service_builds_its_limiter_and_server_from_the_settings(
    nc: NATS, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nodus_gateway import service
    from nodus_kit.servicing import Settings

    seen: dict[str, Any] = {}

    def fake_build_app(*_: Any, **kw: Any) -> object:
        seen.update(kw)
        return object()

    class FakeServer:
        def __init__(self, *_: Any, **kw: Any) -> None:
            seen.update(kw)
            self.url = "http://fake"

        async def start(self) -> None:
            return None

    monkeypatch.setattr(service, "build_app", fake_build_app)
    monkeypatch.setattr(service, "ApiServer", FakeServer)
    env = {
        "NODUS_ADMIN_TOKEN": "x",
        "NODUS_GATEWAY_AUTH_FAILURES": "4",
        "NODUS_GATEWAY_AUTH_WINDOW_S": "30",
        "NODUS_GATEWAY_AUTH_MAX_CLIENTS": "9",
        "NODUS_GATEWAY_TRUSTED_PROXIES": "10.0.0.0/8",
    }
    gw = service.GatewayService(Settings.from_env("nodus-gateway", env))
    gw.nc = nc  # connected already: start() only builds the app and the server
    await gw.start()
    limiter = seen["auth_limiter"]
    assert (limiter.failures, limiter.window_s, limiter.max_clients) == (4, 30.0, 9)
    assert seen["trusted_proxies"] == ("10.0.0.0/8",)
