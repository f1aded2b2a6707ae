"""A real container engine for tests: podman's Docker-compatible API service on a private unix socket.

There is no Docker engine on these machines and no image registry is reachable (``notes/containers.md``):
podman (Debian) serves the Docker Engine API, runc is the runtime because crun cannot set rlimits in
this sandbox, and the one test image is imported from a busybox root file system built locally.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, Self

import httpx

from nodus_testing.processes import ServerProcess, spawn_server, stop

API_VERSION = "v1.41"
BUSYBOX_TAG = "localhost/nodus-test:busybox"
# The commands tests and example programs use; each is a symlink to /bin/busybox in the image.
BUSYBOX_APPLETS = (
    *("sh", "echo", "sleep", "cat", "ls", "env", "printf", "test", "true", "false"),
    *("mkdir", "rm", "wc", "sha256sum", "tail", "head", "grep", "date"),
)
MISSING_HINT = "run `make system-deps` (installs podman, runc and busybox-static)"

# This sandbox may not raise rlimits, and the runtime copies the engine's (higher) limits into every
# container unless told otherwise, so each container here is created with these explicit, lower ones.
# Do not mutate: copy it (``list(SANDBOX_ULIMITS)``) when a test needs a variant.
SANDBOX_ULIMITS: list[dict[str, Any]] = [
    {"Name": "nofile", "Soft": 1024, "Hard": 1024},
    {"Name": "nproc", "Soft": 1024, "Hard": 1024},
]


def require_binary(name: str) -> str:
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found on PATH: {MISSING_HINT}")
    return found


class PodmanService(ServerProcess):
    """``podman --runtime runc system service`` on a socket in a temporary directory."""

    def __init__(
        self, runtime: str = "runc", base_dir: Path | None = None, tie_to_parent: bool = False
    ) -> None:
        """``tie_to_parent``: SIGKILL the service if this process dies (fixtures; see ``spawn_server``)."""
        self.tie_to_parent = tie_to_parent
        self.podman = require_binary("podman")
        self.runtime = require_binary(runtime)
        self._tmp = None if base_dir else tempfile.TemporaryDirectory(prefix="nodus-podman-")
        self.base_dir = base_dir or Path(self._tmp.name)  # type: ignore[union-attr]
        self.socket_path = self.base_dir / "podman.sock"
        self.log = self.base_dir / "podman.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None

    @property
    def docker_host(self) -> str:
        """The value for DOCKER_HOST (docker-py, testcontainers and the node agent all take it)."""
        return f"unix://{self.socket_path}"

    @property
    def base_url(self) -> str:
        # The host part is ignored over a unix socket; the API version prefix is what podman routes on.
        return f"http://podman/{API_VERSION}"

    def client(self, timeout_s: float = 30.0) -> httpx.Client:
        return httpx.Client(
            transport=httpx.HTTPTransport(uds=str(self.socket_path)),
            base_url=self.base_url,
            timeout=timeout_s,
        )

    def async_client(self, timeout_s: float = 30.0) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(self.socket_path)),
            base_url=self.base_url,
            timeout=timeout_s,
        )

    def start(self, deadline_s: float = 20.0) -> Self:
        began = time.monotonic()
        cmd = [
            self.podman,
            "--runtime",
            self.runtime,
            "system",
            "service",
            "--time=0",  # never exit for idleness: the fixture decides when it ends
            self.docker_host,
        ]
        self.proc = spawn_server(cmd, self.log, cwd=self.base_dir, tie_to_parent=self.tie_to_parent)
        return self._await_ready(began, deadline_s)

    def _wait_ready(self, deadline_s: float) -> None:
        """Ready means the API answers ``GET /version``, not merely that the socket file exists."""
        assert self.proc is not None
        end = time.monotonic() + deadline_s
        last_error: Exception | None = None
        with self.client(timeout_s=2.0) as client:
            while time.monotonic() < end:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"podman system service exited with {self.proc.returncode}:\n{self._log_tail()}"
                    )
                if self.socket_path.exists():
                    try:
                        if client.get("/version").status_code == 200:
                            return
                    except httpx.HTTPError as exc:  # socket bound but not serving yet
                        last_error = exc
                time.sleep(0.02)
        raise TimeoutError(
            f"podman API at {self.socket_path} did not answer within {deadline_s}s "
            f"(last error: {last_error!r}):\n{self._log_tail()}"
        )

    def ensure_busybox_image(self, tag: str = BUSYBOX_TAG, deadline_s: float = 60.0) -> str:
        """Import a busybox image under ``tag`` unless podman's store already has it; returns the tag.

        The image store is podman's default one (shared with the CLI and other sessions), so the import
        happens once per machine, not once per test session.
        """
        exists = subprocess.run(
            [self.podman, "image", "exists", tag], capture_output=True, timeout=deadline_s, check=False
        )
        if exists.returncode == 0:
            return tag
        rootfs_tar = _busybox_rootfs_tar(_static_busybox())
        result = subprocess.run(
            [self.podman, "import", "--change", 'CMD ["sh"]', "-", tag],
            input=rootfs_tar,
            capture_output=True,
            timeout=deadline_s,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"podman import {tag} failed: {result.stderr.decode(errors='replace')}")
        return tag

    def stop(self, grace_s: float = 5.0) -> None:
        if self.proc:
            stop(self.proc, grace_s=grace_s)


def _static_busybox() -> Path:
    """The busybox binary to copy into the image; it must be static, as the image has no libc."""
    for candidate in ("/bin/busybox", "/usr/bin/busybox", shutil.which("busybox")):
        if candidate and Path(candidate).is_file():
            path = Path(candidate)
            # A dynamically linked ELF names its loader (PT_INTERP) near the start of the file.
            if b"/ld-linux" in path.read_bytes()[:4096]:
                raise FileNotFoundError(f"{path} is dynamically linked: {MISSING_HINT}")
            return path
    raise FileNotFoundError(f"busybox not found: {MISSING_HINT}")


def _busybox_rootfs_tar(busybox: Path) -> bytes:
    """A root file system as a tar stream: /bin/busybox, one symlink per applet, and an empty /tmp."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, mode in (("bin", 0o755), ("etc", 0o755), ("tmp", 0o1777)):
            info = tarfile.TarInfo(name)
            info.type = tarfile.DIRTYPE
            info.mode = mode
            tar.addfile(info)
        data = busybox.read_bytes()
        info = tarfile.TarInfo("bin/busybox")
        info.size = len(data)
        info.mode = 0o755
        tar.addfile(info, io.BytesIO(data))
        for applet in BUSYBOX_APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type = tarfile.SYMTYPE
            link.linkname = "busybox"
            tar.addfile(link)
    return buf.getvalue()


def docker_engine_available(socket_path: str = "/var/run/docker.sock") -> str | None:
    """DOCKER_HOST of a real Docker engine if one answers (where testcontainers would serve), else None.

    DOCKER_HOST is honoured first when it names a unix socket. podman's compatible service answers the
    same API but is not counted: its version report names a "Podman Engine" component.
    """
    candidates: list[str] = []
    env_host = os.environ.get("DOCKER_HOST", "")
    if env_host.startswith("unix://"):
        candidates.append(env_host.removeprefix("unix://"))
    candidates.append(socket_path)
    for path in candidates:
        if not Path(path).exists():
            continue
        try:
            with httpx.Client(
                transport=httpx.HTTPTransport(uds=path), base_url="http://docker", timeout=2.0
            ) as client:
                response = client.get("/version")
        except httpx.HTTPError:
            continue
        if response.status_code != 200:
            continue
        components = response.json().get("Components") or []
        if any("podman" in str(c.get("Name", "")).lower() for c in components):
            continue
        return f"unix://{path}"
    return None
