"""The attempt runner: StartAttempt and StopAttempt in, a local process and reports out.

Every assignment may arrive twice and the agent may be killed at any line, so the runner decides from
its record on disk (:mod:`nodus_agent.attemptdir`), never from the message alone:

* running in this agent -> a duplicate StartAttempt is ignored;
* finished -> the recorded AttemptFinished is published again (same id: the stream drops it);
* started by an agent that is gone -> the program is stopped if it still runs and the attempt is
  reported Lost: without its parent no exit code can be known, and the scheduler's new attempt
  resumes from the checkpoint sooner than waiting for an orphan would;
* a StopAttempt for an attempt never seen leaves a Stopped record, so a StartAttempt arriving late
  does not run it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import msgspec

from nodus_agent import attemptdir, envcontract, processes
from nodus_agent.attemptdir import FINISHED, RUNNING, STARTING, AttemptDir, Record
from nodus_agent.reporting import Reporter
from nodus_agent.settings import AgentSettings
from nodus_agent.throughput import ReportTail, format_rate
from nodus_kit.errors import PermanentError
from nodus_kit.messaging import Delivery
from nodus_schema.messages import Assignment, AttemptFinished, StartAttempt, StopAttempt
from nodus_schema.meta import now_rfc3339

log = logging.getLogger(__name__)

POLL_S = 0.25  # how often report.jsonl is read and the deadline checked
PROGRESS_EVERY_S = 1.0  # at most one AttemptProgress per attempt per second

AGENT_RESTARTED = "the node agent restarted while the program ran"
AGENT_SHUTDOWN = "the node agent shut down"
STOPPED_BEFORE_START = "stopped before it started on this node"


def epoch_ms() -> int:
    return time.time_ns() // 1_000_000


def finished(
    record: Record,
    namespace: str,
    attempt: str,
    node: str,
    reason: str,
    exit_code: int | None,
    wall_millis: int,
    message: str | None,
    rate: Decimal | None,
) -> Record:
    """The record of a finished run, carrying the AttemptFinished report to send (not yet reported)."""
    report = AttemptFinished(
        namespace=namespace,
        attempt=attempt,
        node=node,
        time=now_rfc3339(),
        exit_code=exit_code,
        wall_millis=wall_millis,
        reason=reason,
        message=message,
        units_per_second=format_rate(rate) if rate is not None else None,
    )
    return msgspec.structs.replace(
        record, phase=FINISHED, finished=report.time, exit_code=exit_code, report=report, reported=False
    )


@dataclass
class Run:
    """One program this agent started and is watching."""

    msg: StartAttempt
    dir: AttemptDir
    record: Record
    proc: asyncio.subprocess.Process
    began: float  # monotonic, for wallMillis
    tail: ReportTail
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    stop_why: tuple[str, str] | None = None  # (reason, message) asked for
    stopped_by: tuple[str, str] | None = None  # the stop that actually ended the program
    sent_rate: Decimal | None = None
    sent_at: float = float("-inf")
    progress_n: int = 0
    task: asyncio.Task[None] | None = None

    def request_stop(self, reason: str, message: str) -> None:
        if self.stop_why is None:  # the first reason wins (a deadline is not turned into a Stopped)
            self.stop_why = (reason, message)
            self.stop.set()


class Runner:
    def __init__(self, settings: AgentSettings, reporter: Reporter) -> None:
        self.settings, self.reporter = settings, reporter
        self.runs: dict[tuple[str, str], Run] = {}
        self._lock = asyncio.Lock()  # one assignment at a time: decisions read and write the record

    # -- entry points -------------------------------------------------------------------------------
    async def handle(self, delivery: Delivery[Assignment]) -> None:
        msg = delivery.data
        self._check(msg)
        async with self._lock:
            if isinstance(msg, StartAttempt):
                await self.start(msg)
            else:
                await self.stop(msg)

    def _check(self, msg: Assignment) -> None:
        # A bad name would escape the work directory or break report subjects: a scheduler bug that
        # no retry fixes, so the message goes to the dead letters with the reason.
        for what, name in (("namespace", msg.namespace), ("attempt", msg.attempt)):
            if not attemptdir.valid_name(name):
                raise PermanentError(f"{what} {name!r} is not a DNS label")
        if isinstance(msg, StartAttempt) and msg.node != self.settings.node:
            raise PermanentError(f"StartAttempt for node {msg.node!r} reached node {self.settings.node!r}")

    async def start(self, msg: StartAttempt) -> None:
        if (msg.namespace, msg.attempt) in self.runs:
            log.info("duplicate StartAttempt ignored: the attempt runs", extra={"attempt": msg.attempt})
            return
        adir = AttemptDir(self.settings.workdir, msg.namespace, msg.attempt)
        record = adir.load()
        if record is not None:
            await self._settle(adir, record)
            return
        refusal = envcontract.refusal(msg)
        if refusal is not None:
            await self._finish(adir, Record(phase=STARTING, started=now_rfc3339()), "Lost", None, 0, refusal)
            return
        await self._launch(msg, adir)

    async def stop(self, msg: StopAttempt) -> None:
        run = self.runs.get((msg.namespace, msg.attempt))
        if run is not None:
            run.request_stop("Stopped", f"asked to stop ({msg.reason})")
            return
        adir = AttemptDir(self.settings.workdir, msg.namespace, msg.attempt)
        record = adir.load()
        if record is None:
            await self._finish(adir, Record(phase=STARTING), "Stopped", None, 0, STOPPED_BEFORE_START)
        else:
            await self._settle(adir, record)

    async def recover(self) -> None:
        """After a restart: report attempts an earlier agent left running or finished but unreported."""
        pending = []
        for adir in attemptdir.existing(self.settings.workdir):
            try:
                record = adir.load()
            except msgspec.DecodeError as e:
                log.error("unreadable record %s: %s", adir.record_path, e)
                continue
            if record is not None and not (record.phase == FINISHED and record.reported):
                pending.append(self._settle(adir, record))
        for result in await asyncio.gather(*pending, return_exceptions=True):
            if isinstance(result, BaseException):
                log.error("could not settle an attempt found at start: %s", result)

    async def shutdown(self) -> None:
        """Stop every program (reported Stopped), so nothing runs unmanaged once the agent is gone."""
        runs = list(self.runs.values())
        for run in runs:
            run.request_stop("Stopped", AGENT_SHUTDOWN)
        await asyncio.gather(*(r.task for r in runs if r.task), return_exceptions=True)

    # -- launching ----------------------------------------------------------------------------------
    async def _launch(self, msg: StartAttempt, adir: AttemptDir) -> None:
        adir.create()
        argv = envcontract.argv(msg)
        env = envcontract.build_env(msg, adir, self.settings)
        cwd = self.settings.cwd / msg.working_dir if msg.working_dir else self.settings.cwd
        # Recorded before the program exists: an agent killed right after spawning finds "Starting"
        # and reports Lost rather than running the program a second time.
        record = Record(phase=STARTING, started=now_rfc3339(), started_epoch_ms=epoch_ms())
        adir.save(record)
        began = time.monotonic()
        try:
            proc = await processes.spawn(argv, env, Path(cwd), adir.log)
        except OSError as e:
            # The customer's command (a typo, a missing working directory): an Error, counted against
            # backoffLimit as Kubernetes counts a container that fails to start.
            message = f"could not start {argv[0]!r}: {e}"
            await self._finish(adir, record, "Error", None, _ms_since(began), message)
            return
        record = msgspec.structs.replace(
            record, phase=RUNNING, pid=proc.pid, pid_start_ticks=processes.start_ticks(proc.pid)
        )
        adir.save(record)
        tail = ReportTail(adir.report, msg.attempt)
        run = Run(msg=msg, dir=adir, record=record, proc=proc, began=began, tail=tail)
        self.runs[(msg.namespace, msg.attempt)] = run
        run.task = asyncio.create_task(self._supervise(run), name=f"attempt:{msg.namespace}/{msg.attempt}")
        log.info("attempt started", extra={"attempt": msg.attempt, "ns": msg.namespace, "pid": proc.pid})

    # -- watching -----------------------------------------------------------------------------------
    async def _supervise(self, run: Run) -> None:
        try:
            started = run.record.started or now_rfc3339()
            try:
                await self.reporter.started(run.msg.namespace, run.msg.attempt, started)
            except Exception as e:  # the program runs on; its finish report still goes out
                log.error("AttemptStarted not sent: %s", e, extra={"attempt": run.msg.attempt})
            returncode = await self._watch(run)
            wall = _ms_since(run.began)
            processes.sweep_group(run.proc.pid)
            rate = run.tail.poll(final=True)
            reason, exit_code, message = self._outcome(run, returncode)
            await self._finish(run.dir, run.record, reason, exit_code, wall, message, rate)
        except Exception:
            log.exception("supervising the attempt failed", extra={"attempt": run.msg.attempt})
        finally:
            self.runs.pop((run.msg.namespace, run.msg.attempt), None)

    async def _watch(self, run: Run) -> int:
        """Until the program exits: tail its reports, enforce its deadline, act on a stop request."""
        timeout = run.msg.timeout_seconds
        deadline = run.began + timeout if timeout else None
        exited = asyncio.ensure_future(run.proc.wait())
        stopping = asyncio.ensure_future(run.stop.wait())
        try:
            while not exited.done():
                await asyncio.wait({exited, stopping}, timeout=POLL_S, return_when=asyncio.FIRST_COMPLETED)
                await self._progress(run)
                if deadline is not None and time.monotonic() >= deadline and not exited.done():
                    run.request_stop("DeadlineExceeded", f"the attempt ran past its timeout of {timeout}s")
                if run.stop_why is not None and not exited.done():
                    run.stopped_by = run.stop_why
                    return await processes.terminate(run.proc, self.settings.stop_grace_s)
            return exited.result()
        finally:
            stopping.cancel()
            exited.cancel()

    async def _progress(self, run: Run) -> None:
        latest = run.tail.poll()
        if latest is None or latest == run.sent_rate:
            return
        now = time.monotonic()
        if now - run.sent_at < PROGRESS_EVERY_S:
            return  # a later tick sends the newest value once the second has passed
        n = run.progress_n + 1
        if await self.reporter.progress(run.msg.namespace, run.msg.attempt, n, format_rate(latest)):
            run.progress_n, run.sent_rate, run.sent_at = n, latest, now

    def _outcome(self, run: Run, returncode: int) -> tuple[str, int, str | None]:
        code = processes.exit_code(returncode)
        if run.stopped_by is not None:
            reason, message = run.stopped_by
            return reason, code, message
        if code == 0:
            return "Completed", code, None
        tail = run.dir.log_tail()
        message = f"the program {processes.describe_exit(code)}"
        return "Error", code, f"{message}; the last lines of its log:\n{tail}" if tail else message

    # -- finishing ----------------------------------------------------------------------------------
    async def _settle(self, adir: AttemptDir, record: Record) -> None:
        """An attempt this agent is not watching but has a record of: finished, or an orphan."""
        if record.phase == FINISHED:
            await self._publish_finished(adir, record)
            return
        if record.pid is not None:
            await processes.terminate_pid(record.pid, record.pid_start_ticks, self.settings.stop_grace_s)
        wall = epoch_ms() - record.started_epoch_ms if record.started_epoch_ms else 0
        await self._finish(adir, record, "Lost", None, max(wall, 0), AGENT_RESTARTED)

    async def _finish(
        self,
        adir: AttemptDir,
        record: Record,
        reason: str,
        exit_code: int | None,
        wall_millis: int,
        message: str | None,
        rate: Decimal | None = None,
    ) -> None:
        record = finished(
            record,
            adir.namespace,
            adir.attempt,
            self.settings.node,
            reason,
            exit_code,
            wall_millis,
            message,
            rate,
        )
        adir.save(record)  # first the record, then the report: a crash in between re-sends at start
        log.info(
            "attempt finished",
            extra={"attempt": adir.attempt, "ns": adir.namespace, "reason": reason, "exitCode": exit_code},
        )
        await self._publish_finished(adir, record)

    async def _publish_finished(self, adir: AttemptDir, record: Record) -> None:
        assert record.report is not None, "a finished record carries its report"
        await self.reporter.finished(record.report)
        if not record.reported:
            adir.save(msgspec.structs.replace(record, reported=True))


def _ms_since(began: float) -> int:
    return int((time.monotonic() - began) * 1000)
