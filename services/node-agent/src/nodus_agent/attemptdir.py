"""One attempt's directory on the node, and the runner's record of it.

``<workdir>/<namespace>/<attempt>/`` holds::

    inputs/        NODUS_INPUTS   (a container will see it at /nodus/inputs)
    outputs/       NODUS_OUTPUTS  (/nodus/outputs)
    state/         NODUS_STATE    (/nodus/state: checkpoints)
    report.jsonl   NODUS_REPORT   (the program appends throughput lines)
    log.txt        the program's stdout and stderr
    secrets/       NODUS_SECRETS  (/nodus/secrets: one folder per mounted Secret, files 0400)
    serviceaccount/ NODUS_SA_DIR  (/nodus/serviceaccount: the run's API token and CA, ADR-0037; deleted
                   when the attempt ends)
    src/           NODUS_SRC      (the checkout of spec.source, ADR-0036; at /nodus/src by default)
    mounts/        NODUS_MOUNTS   (process runtime: links standing for mounts, at their paths below it)
    plan.json      what was mounted and checked out (a re-adopted run still commits and reports it)
    start.json     the StartAttempt it runs for (a restarted agent re-adopting the program reads it)
    record.json    the runner's own record (below)

The record is what makes the runner idempotent and safe to kill at any line: it is written (atomically)
before the program starts, again with its pid once it runs, and again when it finishes, with the exact
AttemptFinished message, so a duplicate StartAttempt or a restarted agent re-publishes the same report
instead of running the program twice.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import msgspec

from nodus_agent import mountplan
from nodus_agent.mountplan import MountPlan
from nodus_schema.messages import AttemptFinished, StartAttempt

STARTING, RUNNING, FINISHED = "Starting", "Running", "Finished"

# Namespaces and attempt names are DNS labels or subdomains without dots: path components and subject
# tokens both, so a name that is not one must never reach the file system (no "..", no "/").
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,251}[a-z0-9])?")


def valid_name(name: str) -> bool:
    return bool(_NAME.fullmatch(name))


class Record(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel"):
    phase: str
    """Starting (program may or may not have started), Running (pid set), Finished (report set)."""
    pid: int | None = None
    pid_start_ticks: int | None = None
    container: str | None = None
    """The container's id (docker runtime): a restarted agent re-adopts it."""
    runtime: str | None = None
    """The runtime that started the program (process, docker)."""
    restored: bool = False
    """The checkpoint (if any) was restored: a relaunch after a crash does not restore over new state."""
    started: str | None = None
    started_epoch_ms: int | None = None
    """Wall clock of the start: after an agent restart the monotonic clock of the run is gone. Billing
    starts here (reported as startedMs)."""
    launched_epoch_ms: int | None = None
    """Wall clock of the program's launch (reported as programMs): the Boot segment ends here."""
    finished: str | None = None
    exit_code: int | None = None
    report: AttemptFinished | None = None
    reported: bool = False
    """The finish report was acknowledged by the stream; until then a restart publishes it again."""
    traceparent: str | None = None
    """The StartAttempt's trace context: reports sent after an agent restart stay in the run's trace."""


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Record)
_start_encoder = msgspec.json.Encoder()
_start_decoder = msgspec.json.Decoder(StartAttempt)


class AttemptDir:
    def __init__(self, workdir: Path, namespace: str, attempt: str) -> None:
        self.namespace, self.attempt = namespace, attempt
        self.root = workdir / namespace / attempt

    @property
    def inputs(self) -> Path:
        return self.root / "inputs"

    @property
    def outputs(self) -> Path:
        return self.root / "outputs"

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def secrets(self) -> Path:
        """``/nodus/secrets``: one directory per mounted Secret, one file per key (mode 0400)."""
        return self.root / "secrets"

    @property
    def serviceaccount(self) -> Path:
        """``/nodus/serviceaccount``: the run's API token and the gateway's CA (ADR-0037), files 0400."""
        return self.root / "serviceaccount"

    @property
    def src(self) -> Path:
        """The checkout of ``spec.source`` (git or an uploaded blob), made before the program starts."""
        return self.root / "src"

    @property
    def mounts(self) -> Path:
        """The process runtime's stand-in for a mount namespace: a link per mount at its path below."""
        return self.root / "mounts"

    @property
    def plan_path(self) -> Path:
        """The run's mount plan (:mod:`nodus_agent.mountplan`), saved before the program starts."""
        return self.root / "plan.json"

    @property
    def report(self) -> Path:
        return self.root / "report.jsonl"

    @property
    def log(self) -> Path:
        return self.root / "log.txt"

    @property
    def record_path(self) -> Path:
        return self.root / "record.json"

    @property
    def start_path(self) -> Path:
        """The StartAttempt the program was started for: an agent that restarts and re-adopts the
        program still knows its outputs, checkpoint policy and timeout."""
        return self.root / "start.json"

    def save_start(self, msg: StartAttempt) -> None:
        _write_atomic(self.start_path, _start_encoder.encode(msg))

    def load_start(self) -> StartAttempt | None:
        try:
            return _start_decoder.decode(self.start_path.read_bytes())
        except (FileNotFoundError, msgspec.DecodeError):
            return None

    def save_plan(self, plan: MountPlan) -> None:
        _write_atomic(self.plan_path, mountplan.to_json(plan))

    def load_plan(self) -> MountPlan | None:
        """The saved plan; None when the run mounted nothing (or an older agent started it)."""
        try:
            return mountplan.from_json(self.plan_path.read_bytes())
        except (FileNotFoundError, msgspec.DecodeError):
            return None

    def create(self) -> None:
        # state/.nodus: the checkpoint contract's files (docs/checkpoints.md), never archived.
        for d in (self.inputs, self.outputs, self.state, self.state / ".nodus"):
            d.mkdir(parents=True, exist_ok=True)
        self.report.touch()
        self.log.touch()

    def load(self) -> Record | None:
        try:
            return _decoder.decode(self.record_path.read_bytes())
        except FileNotFoundError:
            return None

    def save(self, record: Record) -> None:
        """Write-then-rename, fsynced: a crash leaves the old record or the new one, never half of one."""
        _write_atomic(self.record_path, _encoder.encode(record))

    def log_tail(self, lines: int = 20, max_bytes: int = 4096) -> str:
        """The last lines of log.txt, for the message of a failed attempt."""
        try:
            with self.log.open("rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - max_bytes))
                data = f.read()
        except FileNotFoundError:
            return ""
        return "\n".join(data.decode("utf-8", errors="replace").splitlines()[-lines:])


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def existing(workdir: Path) -> list[AttemptDir]:
    """Every attempt directory with a record under ``workdir`` (what an agent finds when it restarts)."""
    found = []
    for path in sorted(workdir.glob("*/*/record.json")):
        namespace, attempt = path.parent.parent.name, path.parent.name
        if valid_name(namespace) and valid_name(attempt):
            found.append(AttemptDir(workdir, namespace, attempt))
    return found
