"""Errors as exceptions carrying the Status (reason, message, causes, fix, docs, requestId, code), from the
real gateway; a body that is not a Status (a proxy's page) and retries, from a real HTTP server that
answers what a proxy would."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio

from nodus_schema import Sweep, encode, status_for
from nodus_sdk import (
    AlreadyExists,
    BadCA,
    Client,
    Conflict,
    Forbidden,
    FundingError,
    Gone,
    InsufficientCredits,
    Invalid,
    MaxCostReached,
    NodusError,
    NotFound,
    Retry,
    ServerError,
    TooManyRequests,
    Unauthorized,
    Unreachable,
)
from nodus_sdk.errors import error_for, status_of
from nodus_testing.processes import free_port

run = asyncio.to_thread


async def test_not_found_carries_the_whole_status(client: Client, unique: str) -> None:
    with pytest.raises(NotFound) as err:
        await run(client.sweeps.get, "missing")
    e = err.value
    assert (e.code, e.reason) == (404, "NotFound")
    assert e.message == 'sweeps.nodus.dev "missing" not found'
    assert e.fix and e.docs == "https://docs.nodus.dev/errors/NotFound"
    assert e.request_id and len(e.request_id) >= 8
    assert e.status.details is not None and e.status.details.name == "missing"
    assert "fix:" in str(e)


async def test_invalid_carries_every_cause_with_its_field(
    client: Client, sweep: Callable[..., Sweep]
) -> None:
    body: dict[str, Any] = {
        "apiVersion": "nodus.dev/v1",
        "kind": "Sweep",
        "metadata": {"name": "broken"},
        "spec": {
            "maxParallel": 0,
            "template": {"spec": {"command": ["python"], "resources": {"gpu": "H100:3"}}},
        },
    }
    with pytest.raises(Invalid) as err:
        await run(client.sweeps.create, body)
    e = err.value
    assert e.code == 422 and e.fix
    fields = {c.field for c in e.causes}
    assert {"spec.maxParallel", "spec.template.spec.image"} <= fields, fields
    assert all(c.message and c.reason for c in e.causes)


async def test_a_wrong_token_is_unauthorized(gateway_url: str, unique: str) -> None:
    with Client(server=gateway_url, token="wrong", project=unique) as c, pytest.raises(Unauthorized) as err:
        await run(lambda: list(c.sweeps.list()))
    assert err.value.code == 401 and err.value.fix


async def test_a_cap_below_the_minimum_charge_is_max_cost_reached(
    client: Client, job: Callable[..., dict[str, Any]]
) -> None:
    # A cap is a ceiling (ADR-0023): $0.01 on an H100 ($2.99/h) is below the ten-minute first hold
    # (0.498334) but runs, its first hold the cap itself.
    body = job("capped")
    body["spec"]["maxCostUSD"] = "0.01"
    created = await run(client.jobs.create, body)
    assert created.status.estimate is not None
    assert (created.status.estimate.hold_usd, created.status.estimate.concurrent_hold_usd) == ("0.01", "0.01")
    # Only a cap below the minimum charge, one billing increment (1 s at 2.99 $/h: 0.000831), is refused.
    body = job("starved")
    body["spec"]["maxCostUSD"] = "0.0008"
    with pytest.raises(MaxCostReached) as err:
        await run(client.jobs.create, body)
    assert isinstance(err.value, FundingError) and isinstance(err.value, Forbidden)
    assert err.value.code == 403
    assert err.value.message == (
        "spec.maxCostUSD 0.0008 is below the minimum charge 0.000831 of one index (one billing increment "
        "at its rate): not even one slot could start"
    )
    assert err.value.fix and err.value.fix.startswith("Raise spec.maxCostUSD to at least 0.000831;")


async def test_revoking_more_than_is_available_is_insufficient_credits(client: Client, unique: str) -> None:
    project = await run(client.projects.create, {"metadata": {"name": unique}})
    assert project.metadata.name == unique and [
        p.metadata.name for p in await run(lambda: list(client.projects.list()))
    ]
    granted = await run(lambda: client.grant("5.00", id=f"{unique}-grant"))
    assert granted.status.available_usd == "5.00"
    with pytest.raises(InsufficientCredits) as err:
        await run(lambda: client.grant("1000000.00", revoke=True, id="revoke-too-much"))
    assert err.value.reason == "InsufficientCredits" and err.value.fix


async def test_nothing_listening_is_unreachable_after_the_retries() -> None:
    server = f"http://127.0.0.1:{free_port()}"
    retry = Retry(attempts=3, backoff_s=0.01)
    with Client(server=server, token="t", retry=retry) as c, pytest.raises(Unreachable) as err:
        await run(c.sweeps.get, "lr")
    e = err.value
    assert e.refused and e.server == server and e.reason == "ServiceUnavailable" and e.fix
    assert isinstance(e, ServerError) and isinstance(e, NodusError)


def test_an_unreadable_ca_is_named(tmp_path: Any) -> None:
    junk = tmp_path / "junk.crt"
    junk.write_text("not a certificate\n")
    with pytest.raises(BadCA) as err:
        Client(server="https://example.invalid", ca=str(junk))
    assert str(junk) in err.value.message


@pytest.mark.parametrize(
    ("reason", "cls"),
    [
        ("NotFound", NotFound),
        ("AlreadyExists", AlreadyExists),
        ("Conflict", Conflict),
        ("PreconditionFailed", Conflict),
        ("Invalid", Invalid),
        ("Unauthorized", Unauthorized),
        ("Forbidden", Forbidden),
        ("InsufficientCredits", InsufficientCredits),
        ("MaxCostReached", MaxCostReached),
        ("TooManyRequests", TooManyRequests),
        ("Expired", Gone),
        ("InternalError", ServerError),
        ("ServiceUnavailable", ServerError),
        # Nodus codes with no class of their own fall back on their HTTP code.
        ("CapacityUnavailable", ServerError),
        ("StoppedEarly", Conflict),
    ],
)
def test_each_reason_has_its_class(reason: str, cls: type[NodusError]) -> None:
    e = error_for(status_for(reason, "m"))
    assert type(e) is cls or (reason in ("CapacityUnavailable", "StoppedEarly") and isinstance(e, cls))
    assert e.reason == reason


# -- what a proxy answers --------------------------------------------------------------------------------


class RawServer:
    """A real HTTP/1.1 server that answers each request with the next of ``answers`` (the last repeats):
    what a proxy or load balancer in front of the gateway may say."""

    def __init__(self, answers: list[tuple[int, str, str]]) -> None:
        self.answers = answers
        self.requests: list[str] = []
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        self.requests.append(head.split(b" ", 1)[0].decode())
        code, ctype, body = self.answers[min(len(self.requests) - 1, len(self.answers) - 1)]
        data = body.encode()
        writer.write(
            f"HTTP/1.1 {code} X\r\nContent-Type: {ctype}\r\nContent-Length: {len(data)}\r\n"
            f"X-Request-Id: proxy-req-1\r\nConnection: close\r\n\r\n".encode()
            + data
        )
        await writer.drain()
        writer.close()


@pytest_asyncio.fixture
async def raw() -> AsyncIterator[Callable[[list[tuple[int, str, str]]], Any]]:
    servers: list[asyncio.Server] = []

    async def start(answers: list[tuple[int, str, str]]) -> RawServer:
        srv = RawServer(answers)
        srv._server = await asyncio.start_server(srv._serve, "127.0.0.1", 0)
        servers.append(srv._server)
        return srv

    yield start
    for s in servers:
        s.close()
        await s.wait_closed()


async def test_a_proxy_page_still_gets_a_status(raw: Any) -> None:
    srv = await raw([(502, "text/html", "<html><body>Bad Gateway</body></html>")])
    with Client(server=srv.url, retry=Retry(attempts=1)) as c, pytest.raises(ServerError) as err:
        await run(c.sweeps.get, "lr")
    e = err.value
    assert (e.code, e.reason, e.request_id) == (502, "ServiceUnavailable", "proxy-req-1")
    assert "Bad Gateway" in e.message and e.fix and e.docs


async def test_gets_are_retried_on_503_and_writes_are_not(raw: Any, sweep: Callable[..., Sweep]) -> None:
    ok = sweep("lr")
    answers = [
        (503, "text/plain", "busy"),
        (503, "text/plain", "busy"),
        (200, "application/json", encode(ok).decode()),
    ]
    srv = await raw(answers)
    retry = Retry(attempts=3, backoff_s=0.01)
    with Client(server=srv.url, project="p", retry=retry) as c:
        got = await run(c.sweeps.get, "lr")
    assert got.metadata.name == "lr" and srv.requests == ["GET", "GET", "GET"]
    srv = await raw(answers)
    with Client(server=srv.url, project="p", retry=retry) as c, pytest.raises(ServerError) as err:
        await run(c.sweeps.create, ok)
    assert err.value.code == 503 and srv.requests == ["POST"]


def test_status_of_a_non_status_json_body() -> None:
    status = status_of(409, b'{"error": "nope"}')
    assert (status.reason, status.code, status.kind) == ("Conflict", 409, "Status")
    assert status_of(418, b"").reason == "BadRequest" and status_of(599, b"").code == 599
