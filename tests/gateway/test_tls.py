"""HTTPS in the gateway: NODUS_GATEWAY_TLS_CERT and NODUS_GATEWAY_TLS_KEY, both or neither."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from nats.aio.client import Client as NATS

from nodus_gateway.app import build_app
from nodus_gateway.config import ConfigError, GatewayConfig
from nodus_gateway.resources import stores_for
from nodus_gateway.server import ApiServer
from nodus_testing import certs

TOKEN = "tls-test-token-0123456789"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> certs.Certs:
    return certs.ensure(tmp_path_factory.mktemp("certs"))


def test_tls_settings_are_both_or_neither(tls: certs.Certs) -> None:
    base = {"NODUS_ADMIN_TOKEN": TOKEN}
    assert not GatewayConfig.from_env(base).tls
    both = {**base, "NODUS_GATEWAY_TLS_CERT": str(tls.cert), "NODUS_GATEWAY_TLS_KEY": str(tls.key)}
    config = GatewayConfig.from_env(both)
    assert config.tls and (config.tls_cert, config.tls_key) == (str(tls.cert), str(tls.key))
    with pytest.raises(ConfigError, match="NODUS_GATEWAY_TLS_CERT is set but NODUS_GATEWAY_TLS_KEY is not"):
        GatewayConfig.from_env({**base, "NODUS_GATEWAY_TLS_CERT": str(tls.cert)})
    with pytest.raises(ConfigError, match="NODUS_GATEWAY_TLS_KEY is set but NODUS_GATEWAY_TLS_CERT is not"):
        GatewayConfig.from_env({**base, "NODUS_GATEWAY_TLS_KEY": str(tls.key)})
    with pytest.raises(ConfigError, match=r"NODUS_GATEWAY_TLS_KEY='/nowhere/key\.pem': no such file"):
        GatewayConfig.from_env({**both, "NODUS_GATEWAY_TLS_KEY": "/nowhere/key.pem"})


@pytest.mark.parametrize("half", ["NODUS_GATEWAY_TLS_CERT", "NODUS_GATEWAY_TLS_KEY"])
def test_the_process_refuses_half_a_tls_setting(
    nats_url: str, nats_seed: Path, tls: certs.Certs, half: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODUS_GATEWAY_TLS_")}
    env |= {"NODUS_NATS_URL": nats_url, "NODUS_NATS_NKEY_SEED": str(nats_seed)}
    env |= {"NODUS_ADMIN_TOKEN": TOKEN, half: str(tls.cert)}
    done = subprocess.run(
        [sys.executable, "-m", "nodus_gateway"], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2
    assert f"refusing to start: {half} is set but" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_process_refuses_a_key_that_does_not_load(
    nats_url: str, nats_seed: Path, tls: certs.Certs, tmp_path: Path
) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a key\n")
    env = {**os.environ, "NODUS_NATS_URL": nats_url, "NODUS_NATS_NKEY_SEED": str(nats_seed)}
    env |= {"NODUS_ADMIN_TOKEN": TOKEN}
    env |= {"NODUS_GATEWAY_TLS_CERT": str(tls.cert), "NODUS_GATEWAY_TLS_KEY": str(junk)}
    done = subprocess.run(
        [sys.executable, "-m", "nodus_gateway"], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2
    assert "refusing to start: cannot load NODUS_GATEWAY_TLS_CERT=" in done.stderr
    assert "Traceback" not in done.stderr


async def test_the_server_speaks_https_with_the_local_ca(nc: NATS, tls: certs.Certs) -> None:
    app = build_app(stores_for(nc), admin_token=TOKEN)
    server = ApiServer(app, "127.0.0.1", 0, ssl_certfile=str(tls.cert), ssl_keyfile=str(tls.key))
    await server.start()
    try:
        assert server.url.startswith("https://127.0.0.1:") and server.serving
        trusted = ssl.create_default_context(cafile=str(tls.ca))
        async with httpx.AsyncClient(verify=trusted, timeout=5) as client:
            assert (await client.get(f"{server.url}/readyz")).text == "ok"
            listed = await client.get(
                f"{server.url}/apis/nodus.dev/v1/namespaces/default/sweeps",
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
            assert listed.status_code == 200, listed.text
        async with httpx.AsyncClient(timeout=5) as client:  # the system's CAs only
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await client.get(f"{server.url}/readyz")
    finally:
        await server.stop()


async def test_a_bad_certificate_fails_the_start(tmp_path: Path, tls: certs.Certs) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    server = ApiServer(object(), "127.0.0.1", 0, ssl_certfile=str(junk), ssl_keyfile=str(tls.key))
    with pytest.raises(ssl.SSLError):
        await server.start()
    assert not server.serving
