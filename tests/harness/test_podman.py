"""The container fixture: podman's Docker Engine API, driven exactly as the node agent drives Docker."""

from __future__ import annotations

import struct

import pytest

from nodus_testing.podman import SANDBOX_ULIMITS, PodmanService, docker_engine_available

pytestmark = pytest.mark.containers


def demux(raw: bytes) -> list[tuple[int, bytes]]:
    """Split a multiplexed log stream: 8-byte header (stream, 0, 0, 0, big-endian size), then payload."""
    frames: list[tuple[int, bytes]] = []
    offset = 0
    while offset < len(raw):
        stream, size = struct.unpack(">BxxxL", raw[offset : offset + 8])
        frames.append((stream, raw[offset + 8 : offset + 8 + size]))
        offset += 8 + size
    assert offset == len(raw), "a truncated frame"
    return frames


async def test_container_runs_with_env_exit_code_and_logs(
    podman: PodmanService, busybox_image: str, unique: str
) -> None:
    async with podman.async_client() as api:
        version = (await api.get("/version")).json()
        assert version["ApiVersion"]

        created = await api.post(
            "/containers/create",
            params={"name": f"{unique}-hello"},
            json={
                "Image": busybox_image,
                "Env": ["NAME=nodus"],
                "Cmd": ["sh", "-c", "echo hello $NAME; echo to-stderr >&2; exit 3"],
                "HostConfig": {"Ulimits": SANDBOX_ULIMITS},
            },
        )
        assert created.status_code == 201, created.text
        cid = created.json()["Id"]
        try:
            started = await api.post(f"/containers/{cid}/start")
            assert started.status_code == 204, started.text
            # /wait blocks until the container exits; the client timeout bounds it.
            waited = await api.post(f"/containers/{cid}/wait")
            assert waited.status_code == 200, waited.text
            assert waited.json()["StatusCode"] == 3

            logs = await api.get(f"/containers/{cid}/logs", params={"stdout": "1", "stderr": "1"})
            assert logs.status_code == 200, logs.text
            frames = demux(logs.content)
            stdout = b"".join(p for s, p in frames if s == 1)
            stderr = b"".join(p for s, p in frames if s == 2)
            assert b"hello nodus" in stdout
            assert b"to-stderr" in stderr

            inspected = (await api.get(f"/containers/{cid}/json")).json()
            assert inspected["State"]["ExitCode"] == 3
        finally:
            removed = await api.delete(f"/containers/{cid}", params={"force": "1"})
            assert removed.status_code in (204, 404), removed.text
        assert (await api.get(f"/containers/{cid}/json")).status_code == 404


def test_busybox_image_is_idempotent(podman: PodmanService, busybox_image: str) -> None:
    assert podman.ensure_busybox_image(busybox_image) == busybox_image
    assert podman.docker_host == f"unix://{podman.socket_path}"


def test_docker_engine_probe_does_not_count_podman(
    podman: PodmanService, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pointing DOCKER_HOST at podman's socket must not pass it off as a Docker engine.
    monkeypatch.setenv("DOCKER_HOST", podman.docker_host)
    assert docker_engine_available(socket_path="/nonexistent/docker.sock") is None
