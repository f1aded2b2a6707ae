"""The nodus CLI against the gateway over HTTPS, as the local stack serves it: the CA comes from --ca,
NODUS_CA or local.env, on top of the system's CAs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nodus_cli import main
from nodus_cli.config import load
from nodus_testing import certs

TOKEN = "cli-test-token-0123456789"

SWEEP_YAML = """\
apiVersion: nodus.dev/v1
kind: Sweep
metadata:
  name: lr
spec:
  matrix:
    params:
      LR: ["0.1", "0.01"]
  template:
    spec:
      image: busybox
      command: ["true"]
      resources:
        gpu: H100:1
"""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NODUS_URL", "NODUS_TOKEN", "NODUS_CA"):
        monkeypatch.delenv(name, raising=False)


async def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = await asyncio.to_thread(main, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


async def test_ca_flag(https_url: str, tls: certs.Certs, unique: str, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    manifest = tmp_path / "sweep.yaml"
    manifest.write_text(SWEEP_YAML)
    base = ["--server", https_url, "--token", TOKEN, "--ca", str(tls.ca), "-n", unique]
    code, out, err = await run(capsys, *base, "apply", "-f", str(manifest))
    assert (code, out.strip()) == (0, "sweep.nodus.dev/lr created"), err
    code, out, err = await run(capsys, *base, "get", "sweeps")
    assert code == 0 and out.splitlines()[1].split()[:2] == ["lr", "Pending"], err
    code, out, err = await run(capsys, "get", "sweep", "lr", *base)  # after the command too
    assert code == 0, err


async def test_an_untrusted_certificate_says_which_ca_to_pass(
    https_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = await run(capsys, "--server", https_url, "--token", TOKEN, "get", "sweeps")
    assert code == 4 and out == ""  # exit 4: no answer it can trust (exiting.py)
    assert "certificate is not trusted" in err and "--ca or NODUS_CA" in err
    assert "not running" not in err  # it answered: the certificate is the problem, not the gateway


async def test_an_unreadable_ca_file_is_named(
    https_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.crt"
    code, _, err = await run(capsys, "--server", https_url, "--ca", str(missing), "get", "sweeps")
    assert code == 1 and f"cannot use the CA file '{missing}'" in err
    junk = tmp_path / "junk.crt"
    junk.write_text("not a certificate\n")
    code, _, err = await run(capsys, "--server", https_url, "--ca", str(junk), "get", "sweeps")
    assert code == 1 and f"cannot use the CA file '{junk}'" in err


async def test_nodus_ca_from_the_environment(
    https_url: str, tls: certs.Certs, unique: str, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("NODUS_URL", https_url)
    monkeypatch.setenv("NODUS_TOKEN", TOKEN)
    monkeypatch.setenv("NODUS_CA", str(tls.ca))
    code, _, err = await run(capsys, "get", "sweeps", "-n", unique)
    assert code == 0, err


async def test_url_token_and_ca_come_from_local_env(
    https_url: str,
    tls: certs.Certs,
    unique: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # As `make up` writes it.
    (tmp_path / ".nodus").mkdir()
    (tmp_path / ".nodus" / "local.env").write_text(
        f"NODUS_URL={https_url}\nNODUS_TOKEN={TOKEN}\nNODUS_CA={tls.ca}\n"
    )
    (tmp_path / "deep").mkdir()
    monkeypatch.chdir(tmp_path / "deep")
    code, _, err = await run(capsys, "get", "sweeps", "-n", unique)
    assert code == 0, err
    # The local CA, like the local token, goes with the local URL only.
    config = load(server=None, token=None, namespace=None, environ={}, cwd=Path.cwd())
    assert (config.server, config.token, config.ca) == (https_url, TOKEN, str(tls.ca))
    other = load(server="https://example.com", token=None, namespace=None, environ={}, cwd=Path.cwd())
    assert other.token is None and other.ca is None
    # A relative NODUS_CA is relative to the checkout (the directory that holds .nodus).
    (tmp_path / ".nodus" / "local.env").write_text(f"NODUS_URL={https_url}\nNODUS_CA=.nodus/ca.crt\n")
    assert load(server=None, token=None, namespace=None, environ={}, cwd=Path.cwd()).ca == str(
        tmp_path / ".nodus" / "ca.crt"
    )
