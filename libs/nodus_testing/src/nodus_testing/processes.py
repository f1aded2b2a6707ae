"""Helpers for the real servers the tests start: free ports, log readiness, bounded stops, and the base
of the servers that run as one process with a log."""

from __future__ import annotations

import abc
import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Self


def free_port() -> int:
    """A port the kernel just handed out on loopback; racy in theory, fine for tests in practice."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_log(log: Path, needle: str, proc: subprocess.Popen[bytes], deadline_s: float) -> str:
    """Poll a server's log until ``needle`` appears; fail early if the process exits."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        text = log.read_text(errors="replace") if log.exists() else ""
        if needle in text:
            return text
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} before ready:\n{text[-4000:]}")
        time.sleep(0.02)
    text = log.read_text(errors="replace") if log.exists() else ""
    raise TimeoutError(f"{needle!r} not seen in {log} within {deadline_s}s:\n{text[-4000:]}")


def wait_for_port(
    port: int, proc: subprocess.Popen[bytes], deadline_s: float, host: str = "127.0.0.1"
) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} before listening on {port}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
            return
        time.sleep(0.02)
    raise TimeoutError(f"nothing listened on {host}:{port} within {deadline_s}s")


def stop(proc: subprocess.Popen[bytes], grace_s: float = 5.0, sig: int = signal.SIGTERM) -> None:
    """Signal, wait a bounded time, then SIGKILL: some servers (SeaweedFS) ignore SIGTERM for long."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig) if _own_group(proc) else proc.send_signal(sig)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL) if _own_group(proc) else proc.kill()
        proc.wait(timeout=10)


def _own_group(proc: subprocess.Popen[bytes]) -> bool:
    try:
        return os.getpgid(proc.pid) == proc.pid
    except ProcessLookupError:
        return False


def venv_bin(name: str) -> str:
    """A binary installed in the running virtual environment (nats-server, weed), else from PATH."""
    import shutil
    import sys

    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found in the virtual environment or on PATH: run `make venv`")
    return found


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether ``port`` can be bound on ``host`` right now (racy like ``free_port``, fine for tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_ports_with_offset(count: int, offset: int = 10000, attempts: int = 500) -> list[int]:
    """``count`` distinct free ports whose ``port + offset`` is free too.

    SeaweedFS opens a gRPC listener at port+10000 beside each HTTP port, so both must be free; the
    kernel's ephemeral range reaches 60999, so ports whose partner would pass 65535 are skipped.
    """
    chosen: list[int] = []
    taken: set[int] = set()
    for _ in range(attempts):
        port = free_port()
        partner = port + offset
        if partner > 65535 or port in taken or partner in taken:
            continue
        if not port_is_free(partner):
            continue
        chosen.append(port)
        taken.update((port, partner))
        if len(chosen) == count:
            return chosen
    raise RuntimeError(f"no {count} free ports with free port+{offset} found in {attempts} attempts")


def die_with_parent() -> None:
    """``preexec_fn`` for Popen: the child gets SIGKILL when its parent dies, e.g. pytest killed by -9,
    which would otherwise leave servers in their own session running with nobody to stop them."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return
    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def spawn_server(
    cmd: list[str],
    log: Path,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    tie_to_parent: bool = False,
) -> subprocess.Popen[bytes]:
    """Start a server in its own process group (session), output appended to ``log``.

    Its own group lets ``stop`` signal the server and anything it forked in one go, and keeps a
    terminal's Ctrl-C for pytest, which then stops the servers in order. ``tie_to_parent`` (for test
    fixtures) also has the kernel SIGKILL it when this process dies uncleanly; the local stack leaves it
    off, because its servers must outlive the command that started them. It only applies from the main
    thread: the kernel ties the signal to the thread that forked, not to the process.
    """
    import threading

    tie = tie_to_parent and threading.current_thread() is threading.main_thread()
    with log.open("ab") as out:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            start_new_session=True,
            preexec_fn=die_with_parent if tie else None,
        )


class ServerProcess(abc.ABC):
    """A test server that runs as one process writing one log (podman's API service, SeaweedFS).

    A subclass spawns ``proc`` in :meth:`start` and hands over to :meth:`_await_ready`, which stops the
    process again if it never gets ready; ``close`` stops it and removes the temporary directory, if
    the server made one (``_tmp``).
    """

    log: Path
    proc: subprocess.Popen[bytes] | None
    startup_s: float | None
    _tmp: tempfile.TemporaryDirectory[str] | None

    @abc.abstractmethod
    def start(self, deadline_s: float = ...) -> Self:
        """Spawn the process, then ``return self._await_ready(began, deadline_s)``."""

    @abc.abstractmethod
    def _wait_ready(self, deadline_s: float) -> None:
        """Return once the server answers; raise (with :meth:`_log_tail`) if it exits or the time is up."""

    @abc.abstractmethod
    def stop(self, grace_s: float = ...) -> None:
        """Stop the process (a bounded wait, then SIGKILL); the log and the directory stay."""

    def _await_ready(self, began: float, deadline_s: float) -> Self:
        """The end of a start begun at ``began`` (``time.monotonic()``): wait until ready, or stop the
        process and raise; records ``startup_s``."""
        try:
            self._wait_ready(deadline_s)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - began
        return self

    def _log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""

    def close(self) -> None:
        self.stop()
        if self._tmp:
            self._tmp.cleanup()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
