"""The NATS fixture: a real nats-server 2.15 with JetStream, and what survives a kill -9; it takes
authenticated clients only."""

from __future__ import annotations

from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

from nodus_kit import credentials
from nodus_testing.natsserver import NatsServer
from nodus_testing.waiting import eventually


async def _connect(url: str, seed: Path | None) -> Client:
    # Quick reconnects, so a test that restarts the server does not wait out nats-py's 2 s default.
    assert seed is not None, "the test server has a harness credential"
    return await nats.connect(
        url,
        connect_timeout=2,
        reconnect_time_wait=0.05,
        max_reconnect_attempts=-1,
        allow_reconnect=True,
        nkeys_seed=str(seed),
        inbox_prefix=credentials.inbox_of_seed(seed),
    )


async def test_session_server_answers_jetstream_kv(
    nats_server: NatsServer, nats_url: str, nats_seed: Path, unique: str
) -> None:
    assert nats_url == nats_server.url
    assert nats_server.proc is not None
    assert nats_server.proc.poll() is None
    nc = await _connect(nats_url, nats_seed)
    try:
        js = nc.jetstream()
        kv = await js.create_key_value(bucket=f"{unique}-kv")
        rev = await kv.put("default.a", b"one")
        entry = await kv.get("default.a")
        assert entry.value == b"one"
        assert entry.revision == rev
        # Compare-and-set, as every state write in Nodus is.
        rev2 = await kv.update("default.a", b"two", last=rev)
        assert rev2 > rev
        await js.delete_key_value(f"{unique}-kv")
    finally:
        await nc.close()


async def test_kill_9_and_restart_keeps_acknowledged_kv_writes(unique: str) -> None:
    # A private server: killing the session one would cut every other test's connection.
    with NatsServer() as server:
        nc = await _connect(server.url, server.harness_seed)
        try:
            kv = await nc.jetstream().create_key_value(bucket=f"{unique}-kv")
            revs = [await kv.put(f"default.k{i}", f"v{i}".encode()) for i in range(20)]

            port = server.port
            server.kill()  # SIGKILL right after the acks: sync_interval: always must have fsynced them
            assert server.proc is not None
            assert server.proc.returncode is not None
            server.start()
            assert server.port == port

            # The same client reconnects by itself; wait for that, bounded, instead of sleeping. Right
            # after the restart ``is_connected`` may still be True (the client has not read the EOF
            # yet), and a request sent then is lost, so the reconnect count is the condition.
            await eventually(
                lambda: nc.stats["reconnects"] >= 1 and nc.is_connected,
                deadline_s=10,
                message="client reconnected",
            )
            for i, rev in enumerate(revs):
                entry = await kv.get(f"default.k{i}")
                assert entry.value == f"v{i}".encode()
                assert entry.revision == rev

            # And a fresh connection sees the same data.
            nc2 = await _connect(server.url, server.harness_seed)
            try:
                kv2 = await nc2.jetstream().key_value(f"{unique}-kv")
                assert (await kv2.get("default.k19")).value == b"v19"
            finally:
                await nc2.close()
        finally:
            await nc.close()


async def test_the_server_refuses_anonymous_clients_and_unknown_nkeys(
    nats_server: NatsServer, nats_url: str, nats_seed: Path, tmp_path: Path
) -> None:
    # The session server, as every test meets it: no anonymous client, no key it was not configured with.
    stranger = tmp_path / "stranger.nk"
    stranger.write_bytes(credentials.new_seed() + b"\n")
    once = {"connect_timeout": 2, "allow_reconnect": False, "max_reconnect_attempts": 0}
    with pytest.raises(nats.errors.Error, match=r"(?i)authorization violation"):
        await nats.connect(nats_url, **once)
    with pytest.raises(nats.errors.Error, match=r"(?i)authorization violation"):
        await nats.connect(
            nats_url, nkeys_seed=str(stranger), inbox_prefix=credentials.inbox_of_seed(stranger), **once
        )
    # The harness credential is in; so is a generated one (admin: it may ask for stream configs).
    assert nats_server.credentials is not None
    for seed in (nats_seed, nats_server.credentials.seed("admin")):
        nc = await nats.connect(
            nats_url, nkeys_seed=str(seed), inbox_prefix=credentials.inbox_of_seed(seed), **once
        )
        try:
            assert nc.is_connected
            await nc.flush(timeout=2)
        finally:
            await nc.close()
