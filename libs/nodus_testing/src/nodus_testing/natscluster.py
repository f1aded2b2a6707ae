"""Three (or N) real nats-server processes clustered on loopback, with JetStream, for failover tests.

Each member has its own client port, cluster port and store, a ``server_name`` (JetStream clustering
needs one), ``sync_interval: always`` (the production setting, docs/bus.md) and routes to every member.
A member can be killed (SIGKILL, as a crash) and started again on the same ports and store.

Ready means more than each log's "Server is ready": the JetStream meta group must have a leader before
a stream can be created, so :meth:`NatsCluster.start` also waits for the log line that says one was
elected (in any member's log).
"""

from __future__ import annotations

import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from nodus_testing.processes import free_port, spawn_server, stop, venv_bin

READY = "Server is ready"
META_LEADER = ("JetStream cluster new metadata leader", "Self is new JetStream cluster metadata leader")


@dataclass
class Member:
    name: str
    port: int
    cluster_port: int
    root: Path
    proc: subprocess.Popen[bytes] | None = None
    _offset: int = field(default=0, repr=False)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.root / "nats.log"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def config(self, routes: list[int], cluster_name: str, extra: str = "") -> str:
        route_urls = ", ".join(f"nats-route://127.0.0.1:{p}" for p in routes if p != self.cluster_port)
        return (
            f"server_name: {self.name}\n"
            f"listen: 127.0.0.1:{self.port}\n"
            # sync_interval: always — Jepsen (2025) showed the default fsync cadence can lose acked writes.
            f'jetstream {{\n  store_dir: "{self.root / "js"}"\n  sync_interval: always\n}}\n'
            f"cluster {{\n  name: {cluster_name}\n  listen: 127.0.0.1:{self.cluster_port}\n"
            f"  routes: [{route_urls}]\n}}\n"
            f"{extra}"
        )

    def spawn(self, conf: str, tie_to_parent: bool) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / "nats.conf"
        path.write_text(conf)
        self._offset = self.log.stat().st_size if self.log.exists() else 0
        cmd = [venv_bin("nats-server"), "-c", str(path), "-l", str(self.log)]
        self.proc = spawn_server(cmd, self.root / "nats.stdout", tie_to_parent=tie_to_parent)

    def written(self) -> str:
        """What this member logged since its last start."""
        if not self.log.exists():
            return ""
        with self.log.open("rb") as f:
            f.seek(self._offset)
            return f.read().decode(errors="replace")


class NatsCluster:
    def __init__(
        self,
        size: int = 3,
        root: Path | None = None,
        *,
        name: str = "nodus",
        tie_to_parent: bool = True,
        extra_config: str = "",
    ) -> None:
        """``extra_config`` is appended to every member's config (accounts and users, for example)."""
        self.extra_config = extra_config
        self._tmp = None if root else tempfile.TemporaryDirectory(prefix="nodus-nats-cluster-")
        self.root = root or Path(self._tmp.name)  # type: ignore[union-attr]
        self.name = name
        self.tie_to_parent = tie_to_parent
        self.members = [
            Member(f"n{i + 1}", free_port(), free_port(), self.root / f"n{i + 1}") for i in range(size)
        ]

    @property
    def urls(self) -> list[str]:
        return [m.url for m in self.members]

    @property
    def url(self) -> str:
        """Every member, comma-separated, as ``NODUS_NATS_URL`` takes them."""
        return ",".join(self.urls)

    def _routes(self) -> list[int]:
        return [m.cluster_port for m in self.members]

    def start(self, deadline_s: float = 30.0) -> NatsCluster:
        for m in self.members:
            m.spawn(m.config(self._routes(), self.name, self.extra_config), self.tie_to_parent)
        self._wait(self.members, deadline_s, meta_leader=True)
        return self

    def kill(self, member: Member) -> None:
        """SIGKILL one member, as a crash would; its store stays for :meth:`restart`."""
        if member.proc is not None:
            stop(member.proc, grace_s=0.1, sig=signal.SIGKILL)

    def restart(self, member: Member, deadline_s: float = 30.0) -> None:
        self.kill(member)
        member.spawn(member.config(self._routes(), self.name, self.extra_config), self.tie_to_parent)
        self._wait([member], deadline_s, meta_leader=False)

    def _wait(self, members: list[Member], deadline_s: float, *, meta_leader: bool) -> None:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            for m in members:
                if m.proc is not None and m.proc.poll() is not None:
                    code = m.proc.returncode
                    raise RuntimeError(f"nats-server {m.name} exited with {code}:\n{m.written()}")
            ready = all(READY in m.written() for m in members)
            led = not meta_leader or any(
                marker in m.written() for m in self.members for marker in META_LEADER
            )
            if ready and led:
                return
            time.sleep(0.05)
        logs = "\n".join(f"--- {m.name}\n{m.written()[-3000:]}" for m in members)
        raise TimeoutError(f"the NATS cluster was not ready within {deadline_s}s:\n{logs}")

    def close(self) -> None:
        for m in self.members:
            if m.proc is not None:
                stop(m.proc, grace_s=10.0)
        if self._tmp:
            self._tmp.cleanup()

    def __enter__(self) -> NatsCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
