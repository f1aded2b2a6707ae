"""``nodus`` and ServiceAccounts (ADR-0037): apply, get (also as ``sa``), describe and delete, against a
real gateway on the session's nats-server (tests/cli/conftest.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nodus_cli import main
from nodus_cli.kinds import SERVICE_ACCOUNT, resolve

TOKEN = "cli-test-token-0123456789"  # the gateway_url fixture's admin token (tests/cli/conftest.py)

ACCOUNT_YAML = """\
apiVersion: nodus.dev/v1
kind: ServiceAccount
metadata:
  name: launcher
spec:
  role: editor
"""


@pytest.fixture(autouse=True)
def no_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An absent config file of its own: a developer's ~/.config/nodus never leaks in."""
    monkeypatch.setenv("NODUS_CONFIG", str(tmp_path / "nodus-config" / "config.yaml"))


async def nodus(url: str, namespace: str, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = await asyncio.to_thread(main, ["--server", url, "--token", TOKEN, "-n", namespace, *argv])
    out, _ = capsys.readouterr()
    return code, out


def test_the_kind_answers_to_its_names() -> None:
    for typed in ("serviceaccount", "serviceaccounts", "sa", "ServiceAccount", "sa.nodus.dev"):
        assert resolve(typed) is SERVICE_ACCOUNT


async def test_apply_get_describe_and_delete(
    gateway_url: str, unique: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "sa.yaml"
    manifest.write_text(ACCOUNT_YAML)
    code, out = await nodus(gateway_url, unique, capsys, "apply", "-f", str(manifest))
    assert code == 0 and "serviceaccount.nodus.dev/launcher created" in out
    code, out = await nodus(gateway_url, unique, capsys, "get", "sa")
    header, row = out.splitlines()
    assert (
        code == 0 and header.split() == ["NAME", "ROLE", "AGE"] and row.split()[:2] == ["launcher", "editor"]
    )
    code, out = await nodus(gateway_url, unique, capsys, "describe", "serviceaccount", "launcher")
    assert code == 0 and "role: editor" in out
    code, out = await nodus(gateway_url, unique, capsys, "delete", "sa", "launcher")
    assert code == 0
    code, out = await nodus(gateway_url, unique, capsys, "get", "serviceaccounts")
    assert code == 0 and "launcher" not in out
