"""The attempt runner: StartAttempt and StopAttempt in, a program on a runtime and reports out.

An attempt goes through: its directory and record; :mod:`nodus_agent.preparing` (secret values, inputs
under /nodus/inputs, Volume mounts, the checkout of spec.source, the index's latest checkpoint restored
into /nodus/state); the program started on the agent's runtime (:mod:`nodus_agent.runtimes`: a local
process or a container); watching it (throughput reports, its log shipped to the bus, its deadline,
checkpoints at the policy's interval and before a stop that asks for one); and, on success, its outputs
committed to S3 and loaded into their sinks (:mod:`nodus_agent.committing`) and its writable Volume
mounts made their Volumes' next revisions. Each step's failure names the reason it is reported with: the
customer's (Error, OOMKilled: counted against backoffLimit; SourceUnavailable: its code cannot be
fetched) or the infrastructure's (Lost: a new Attempt elsewhere, counted against recovery.maxAttempts).

Every assignment may arrive twice and the agent may be killed at any line, so the runner decides from
its record on disk (:mod:`nodus_agent.attemptdir`), never from the message alone:

* running in this agent -> a duplicate StartAttempt is ignored;
* finished -> the recorded AttemptFinished is published again (same id: the stream drops it);
* started by an agent that is gone -> a runtime that can watch it again (a container) re-adopts it and
  reports its real end; otherwise (a local process, not our child: no exit code can ever be read) it is
  stopped and reported Lost, and the scheduler's new attempt resumes from the checkpoint;
* a StopAttempt for an attempt never seen leaves a Stopped record, so a StartAttempt arriving late
  does not run it.

One attempt's assignments are decided in order (a lock per attempt); another attempt's never wait on them.
A StartAttempt is acknowledged once its Starting record is written: its preparation (inputs, restore) and
launch (an image pull) go on in the background, so a StopAttempt for any attempt, this one included, is
carried out while they run. A stop that finds its attempt still preparing interrupts the preparation and
reports Stopped without launching; one that arrives during the launch stops the program once it runs.
What a stop does is decided from its :class:`~nodus_schema.messages.StopReason`, never from text.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from typing import Any

import msgspec

from nodus_agent import attemptdir, committing, envcontract, identifying, mounting, preparing
from nodus_agent.attemptdir import FINISHED, RUNNING, STARTING, AttemptDir, Record
from nodus_agent.keyedlocks import KeyedLocks
from nodus_agent.logshipping import Redactor
from nodus_agent.mountplan import MountPlan
from nodus_agent.preparing import PrepareError, Toolkit
from nodus_agent.reporting import Reporter
from nodus_agent.runtimes import Exit, Launch, LaunchError, ProcessRuntime, Running, Runtime
from nodus_agent.settings import AgentSettings
from nodus_agent.stopping import (
    Pending,
    asked_to_stop,
    checkpoint_reason,
    remember,
    remembered,
    unless_stopped,
)
from nodus_agent.throughput import ReportTail, format_rate
from nodus_kit import tracing
from nodus_kit.errors import PermanentError
from nodus_kit.messaging import Delivery
from nodus_schema.attempts import CheckpointRecord, MountRecord, OutputRecord, SourceRecord
from nodus_schema.messages import (
    Assignment,
    AttemptCheckpointed,
    AttemptFinished,
    StartAttempt,
    StopAttempt,
)
from nodus_schema.meta import now_rfc3339

log = logging.getLogger(__name__)

POLL_S = 0.25  # how often report.jsonl is read and the deadline checked
PROGRESS_EVERY_S = 1.0  # at most one AttemptProgress per attempt per second
CHECKPOINT_SIGNAL = signal.SIGUSR1  # docs/checkpoints.md: "a checkpoint request waits"

AGENT_RESTARTED = "the node agent restarted while the program ran"
AGENT_SHUTDOWN = "the node agent shut down"
STOPPED_BEFORE_START = "stopped before it started on this node"
LAUNCH_GRACE_S = 3.0
"""At shutdown, how long a launch in flight (an image pull) may take before it is cancelled and left Starting
for the next agent to settle: what the consumer gave an assignment in flight before launches ran apart."""


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
    *,
    outputs: list[OutputRecord] | None = None,
    restored_from: CheckpointRecord | None = None,
    mean_rate: Decimal | None = None,
    source: SourceRecord | None = None,
    mounts: list[MountRecord] | None = None,
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
        outputs=outputs or [],
        restored_from=restored_from,
        mean_units_per_second=format_rate(mean_rate) if mean_rate is not None else None,
        started_ms=record.started_epoch_ms,
        # Taken after the program is gone (released, outputs committed): billing stops here.
        stopped_ms=epoch_ms(),
        source=source,
        mounts=list(mounts or []),
    )
    return msgspec.structs.replace(
        record, phase=FINISHED, finished=report.time, exit_code=exit_code, report=report, reported=False
    )


@dataclass
class Run:
    """One program this agent started (or re-adopted) and is watching."""

    msg: StartAttempt
    dir: AttemptDir
    record: Record
    running: Running
    began: float  # monotonic, for wallMillis
    tail: ReportTail
    prepared: preparing.Prepared
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    stop_why: tuple[str, str] | None = None  # (reason, message) asked for
    stop_checkpoint: str | None = None  # the reason of the checkpoint to take before stopping, if any
    stopped_by: tuple[str, str] | None = None  # the stop that actually ended the program
    sent_rate: Decimal | None = None
    sent_at: float = float("-inf")
    progress_n: int = 0
    rates: list[Decimal] = field(default_factory=list)
    next_checkpoint: float | None = None  # monotonic
    last_checkpoint_cost: timedelta | None = None
    task: asyncio.Task[None] | None = None

    def request_stop(self, reason: str, message: str, *, checkpoint: str | None = None) -> None:
        """``checkpoint``: take one with this reason first (a Checkpointed Job's suspension)."""
        if self.stop_why is None:  # the first reason wins (a deadline is not turned into a Stopped)
            self.stop_why = (reason, message)
            self.stop_checkpoint = checkpoint
            self.stop.set()


class Runner:
    def __init__(
        self,
        settings: AgentSettings,
        reporter: Reporter,
        runtime: Runtime | None = None,
        toolkit: Toolkit | None = None,
    ) -> None:
        self.settings, self.reporter = settings, reporter
        self.runtime: Runtime = runtime or ProcessRuntime(settings.cwd)
        self.toolkit = toolkit or Toolkit()
        self.runs: dict[tuple[str, str], Run] = {}
        self.pending: dict[tuple[str, str], Pending] = {}
        """Attempts between their Starting record and a running program (or their finish)."""
        # An attempt's decisions read and write its record: one at a time per attempt, and only its own
        # (records are per attempt; the outbox serialises its appends itself).
        self.locks: KeyedLocks[tuple[str, str]] = KeyedLocks()
        self.drained: Callable[[], str | None] = lambda: None
        """Why this node takes no new work (a GPU fault, ADR-0022), or None; set by the service."""

    # -- entry points -------------------------------------------------------------------------------
    async def handle(self, delivery: Delivery[Assignment]) -> None:
        msg = delivery.data
        tracing.set_attributes(
            {"nodus.namespace": msg.namespace, "nodus.attempt": msg.attempt, "nodus.node": self.settings.node}
        )
        self._check(msg)
        key = (msg.namespace, msg.attempt)
        async with self.locks.hold(key):
            if not isinstance(msg, StartAttempt):
                await self.stop(msg)
                return
            launch = await self._admit(msg)
            if launch is not None:
                # Acknowledged now, with the Starting record written: a crash from here on is settled from
                # it. The consumer takes the next assignment (another attempt's stop) meanwhile.
                pending = self.pending[key]
                pending.task = asyncio.create_task(launch, name=f"launch:{msg.namespace}/{msg.attempt}")

    def _check(self, msg: Assignment) -> None:
        # A bad name would escape the work directory or break report subjects: a scheduler bug that
        # no retry fixes, so the message goes to the dead letters with the reason.
        for what, name in (("namespace", msg.namespace), ("attempt", msg.attempt)):
            if not attemptdir.valid_name(name):
                raise PermanentError(f"{what} {name!r} is not a DNS label")
        if isinstance(msg, StartAttempt) and msg.node != self.settings.node:
            raise PermanentError(f"StartAttempt for node {msg.node!r} reached node {self.settings.node!r}")

    async def start(self, msg: StartAttempt) -> None:
        """Decide a StartAttempt and, when it is to run, prepare and launch it: returns once its program
        runs or it has finished (:meth:`handle` returns sooner, leaving the launch in the background)."""
        launch = await self._admit(msg)
        if launch is not None:
            await launch

    async def _admit(self, msg: StartAttempt) -> Coroutine[Any, Any, None] | None:
        """Everything a StartAttempt decides before its program is prepared: a duplicate or a known attempt
        is settled here (None); a new one gets its Starting record, and the launch still to await."""
        key = (msg.namespace, msg.attempt)
        if key in self.runs or key in self.pending:
            log.info("duplicate StartAttempt ignored: the attempt runs", extra={"attempt": msg.attempt})
            return None
        adir = AttemptDir(self.settings.workdir, msg.namespace, msg.attempt)
        record = adir.load()
        if record is not None:
            await self._settle(adir, record, msg)
            return None
        refusal = envcontract.refusal(msg, self.runtime.name)
        drained = self.drained()
        if refusal is None and drained is not None:
            # Already on its way when the node drained: another node runs it (Lost, not the Job's fault).
            refusal = f"the node is drained and takes no new work: {drained}"
        if refusal is not None:
            await self._finish(adir, Record(phase=STARTING, started=now_rfc3339()), "Lost", None, 0, refusal)
            return None
        if self.toolkit.grants is not None:
            # Node restriction: the gateway answers only for an Attempt that exists, is bound to this
            # node and has not finished. A refusal (NotBound) dead-letters the assignment: nothing of a
            # run that is not ours starts, and no report is sent about it.
            await self.toolkit.grants.of(msg)
        record = self._record_start(msg, adir)
        self.pending[key] = Pending()
        return self._launch(msg, adir, record)

    async def stop(self, msg: StopAttempt) -> None:
        key = (msg.namespace, msg.attempt)
        adir = AttemptDir(self.settings.workdir, msg.namespace, msg.attempt)
        run, pending = self.runs.get(key), self.pending.get(key)
        if run is not None or pending is not None:
            # Acknowledged before it is carried out: kept on disk first, for an agent killed meanwhile.
            remember(adir, msg)
            if run is not None:
                _stop_run(run, msg)
            elif pending is not None:  # its launch carries the stop out, and reports it
                pending.request_stop(asked_to_stop(msg))
            return
        record = adir.load()
        if record is None:
            await self._finish(adir, Record(phase=STARTING), "Stopped", None, 0, STOPPED_BEFORE_START)
            return
        if record.phase != FINISHED:
            remember(adir, msg)  # so the settling below stops what it re-adopts
        await self._settle(adir, record, None)

    async def recover(self) -> None:
        """After a restart: re-adopt or report the attempts an earlier agent left running, and report
        those it finished but did not report."""
        pending = []
        for adir in attemptdir.existing(self.settings.workdir):
            try:
                record = adir.load()
            except msgspec.DecodeError as e:
                log.error("unreadable record %s: %s", adir.record_path, e)
                continue
            if record is not None and not (record.phase == FINISHED and record.reported):
                pending.append(self._settle(adir, record, None))
        for result in await asyncio.gather(*pending, return_exceptions=True):
            if isinstance(result, BaseException):
                log.error("could not settle an attempt found at start: %s", result)

    async def shutdown(self) -> None:
        """Stop every program (reported Stopped), so nothing runs unmanaged once the agent is gone; a
        preparation is interrupted (Stopped too), a launch in flight given :data:`LAUNCH_GRACE_S`."""
        for run in list(self.runs.values()):
            run.request_stop("Stopped", AGENT_SHUTDOWN)
        for pending in list(self.pending.values()):
            pending.request_stop(AGENT_SHUTDOWN)
        launches = [p.task for p in self.pending.values() if p.task is not None]
        if launches:
            _, late = await asyncio.wait(launches, timeout=LAUNCH_GRACE_S)
            for task in late:  # left Starting: the next agent settles it, as after a kill
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        runs = list(self.runs.values())  # with those launched meanwhile, which stopped once running
        await asyncio.gather(*(r.task for r in runs if r.task), return_exceptions=True)

    # -- launching ----------------------------------------------------------------------------------
    def _record_start(self, msg: StartAttempt, adir: AttemptDir) -> Record:
        adir.create()
        # Recorded before the program exists: an agent killed right after starting it finds "Starting"
        # and reports Lost (or re-adopts the container) rather than running the program a second time.
        adir.save_start(msg)
        record = Record(
            phase=STARTING,
            started=now_rfc3339(),
            started_epoch_ms=epoch_ms(),
            runtime=self.runtime.name,
            traceparent=tracing.current_traceparent(),
        )
        adir.save(record)
        return record

    async def _launch(self, msg: StartAttempt, adir: AttemptDir, record: Record) -> None:
        """Prepare and launch an attempt recorded Starting, then watch it; it leaves :attr:`pending` once it
        runs or has finished."""
        key = (msg.namespace, msg.attempt)
        pending = self.pending[key]
        try:
            await self._prepare_and_launch(msg, adir, record, pending)
        except Exception:
            log.exception("launching the attempt failed", extra={"attempt": msg.attempt})
            await self._after_failed_launch(msg, adir, record, pending)
        finally:
            self.pending.pop(key, None)

    async def _after_failed_launch(
        self, msg: StartAttempt, adir: AttemptDir, record: Record, pending: Pending
    ) -> None:
        """Nothing redelivers the assignment (acknowledged with its Starting record): settle the attempt as
        a redelivery would have, so it is reported (Lost), or its container re-adopted, and stopped if a
        stop came meanwhile. Still pending until then, so a stop cannot settle it a second time."""
        try:
            await self._settle(adir, adir.load() or record, msg)
        except Exception:
            log.exception(
                "settling the attempt after its failed launch failed", extra={"attempt": msg.attempt}
            )
            return
        run = self.runs.get((msg.namespace, msg.attempt))
        if run is not None and pending.stopped is not None:
            run.request_stop("Stopped", pending.stopped)

    async def _prepare_and_launch(
        self, msg: StartAttempt, adir: AttemptDir, record: Record, pending: Pending
    ) -> None:
        began = time.monotonic()
        try:
            prepared = await unless_stopped(
                pending, preparing.prepare(self.toolkit, self.settings, msg, adir)
            )
        except PrepareError as e:
            # SourceUnavailable says what was tried (the repository and ref, or the blob).
            await self._finish(adir, record, e.reason, None, _ms_since(began), e.message, source=e.source)
            return
        if prepared is None or pending.stopped is not None:  # nothing ran: nothing to checkpoint
            if prepared is not None:
                mounting.release(prepared.plan)
            await self._finish(adir, record, "Stopped", None, _ms_since(began), pending.stopped)
            return
        try:  # its ServiceAccount (ADR-0037): the token joins the secret values (env, masked logs)
            identity = await identifying.provide(self.toolkit.grants, msg, adir, prepared.secrets)
        except identifying.IdentityError as e:
            mounting.release(prepared.plan)
            await self._finish(adir, record, e.reason, None, _ms_since(began), e.message, prepared=prepared)
            return
        env = envcontract.build_env(msg, adir, self.settings, paths=self.runtime.paths(adir))
        env.update(prepared.secrets.env)
        launch = Launch(
            msg=msg,
            dir=adir,
            argv=envcontract.argv(msg),
            env=env,
            working_dir=msg.working_dir,
            secret_files=prepared.secret_dirs,
            plan=prepared.plan,
            identity=identity,
        )
        try:
            running = await self.runtime.launch(launch)
        except LaunchError as e:
            mounting.release(prepared.plan)
            await self._finish(adir, record, e.reason, None, _ms_since(began), e.message, prepared=prepared)
            return
        record = self.runtime.remember(
            msgspec.structs.replace(record, phase=RUNNING, restored=True, launched_epoch_ms=epoch_ms()),
            running,
        )
        adir.save(record)
        run = self._watch_run(msg, adir, record, running, began, prepared)
        if pending.stopped is not None:
            # Asked during the launch (an image pull): the program only just began, so no checkpoint.
            run.request_stop("Stopped", pending.stopped)
        log.info(
            "attempt started",
            extra={
                "attempt": msg.attempt,
                "ns": msg.namespace,
                "runtime": self.runtime.name,
                "id": running.ident,
            },
        )

    def _watch_run(
        self,
        msg: StartAttempt,
        adir: AttemptDir,
        record: Record,
        running: Running,
        began: float,
        prepared: preparing.Prepared,
        *,
        adopted: bool = False,
    ) -> Run:
        tail = ReportTail(adir.report, msg.attempt)
        run = Run(
            msg=msg, dir=adir, record=record, running=running, began=began, tail=tail, prepared=prepared
        )
        run.next_checkpoint = self._first_checkpoint(run)
        self.runs[(msg.namespace, msg.attempt)] = run
        run.task = asyncio.create_task(
            self._supervise(run, adopted=adopted), name=f"attempt:{msg.namespace}/{msg.attempt}"
        )
        return run

    # -- watching -----------------------------------------------------------------------------------
    async def _supervise(self, run: Run, *, adopted: bool = False) -> None:
        shipper = await preparing.start_log_shipper(self.toolkit, run.msg, run.dir, run.prepared)
        try:
            if not adopted:
                started = run.record.started or now_rfc3339()
                try:
                    await self.reporter.started(
                        run.msg.namespace,
                        run.msg.attempt,
                        started,
                        started_ms=run.record.started_epoch_ms,
                        program_ms=run.record.launched_epoch_ms,
                        source=run.prepared.plan.source,
                        mounts=run.prepared.plan.records,
                    )
                except Exception as e:  # the program runs on; its finish report still goes out
                    log.error("AttemptStarted not sent: %s", e, extra={"attempt": run.msg.attempt})
            exit = await self._watch(run)
            wall = _ms_since(run.began)
            await self.runtime.release(run.running)
            if shipper is not None:
                # The whole log on the bus before the finish: a follower (`nodus logs -f`) stops once the
                # Job has ended and everything published before that was read.
                await shipper.close(final=True)
                shipper = None
            rate = run.tail.poll(final=True)
            if rate is not None:
                run.rates.append(rate)
            reason, exit_code, message = self._outcome(run, exit)
            outputs: list[OutputRecord] = []
            if reason == "Completed":
                try:
                    outputs = await committing.commit(self.toolkit, run.msg, run.dir)
                except committing.CommitError as e:
                    reason, message = e.reason, e.message
            if reason == "Completed" and run.prepared.plan.writable:
                failed = await preparing.commit_mounts(self.toolkit, run.msg, run.prepared.plan)
                if failed is not None:
                    reason, message = failed
            await self._finish(
                run.dir,
                run.record,
                reason,
                exit_code,
                wall,
                message,
                rate,
                prepared=run.prepared,
                outputs=outputs,
                mean_rate=_mean(run.rates),
            )
        except Exception:
            log.exception("supervising the attempt failed", extra={"attempt": run.msg.attempt})
        finally:
            mounting.release(run.prepared.plan)  # its cached Volume revisions may be evicted now
            self.runs.pop((run.msg.namespace, run.msg.attempt), None)
            if self.toolkit.grants is not None:
                self.toolkit.grants.forget(run.msg.namespace, run.msg.attempt)
            if shipper is not None:
                await shipper.close(final=True)

    async def _watch(self, run: Run) -> Exit:
        """Until the program exits: tail its reports, enforce its deadline, checkpoint when due, act on
        a stop request (checkpointing first when the stop asks for it)."""
        timeout = run.msg.timeout_seconds
        deadline = run.began + timeout if timeout else None
        exited = asyncio.ensure_future(self.runtime.wait(run.running))
        stopping = asyncio.ensure_future(run.stop.wait())
        try:
            while not exited.done():
                await asyncio.wait({exited, stopping}, timeout=POLL_S, return_when=asyncio.FIRST_COMPLETED)
                await self._progress(run)
                if deadline is not None and time.monotonic() >= deadline and not exited.done():
                    run.request_stop("DeadlineExceeded", f"the attempt ran past its timeout of {timeout}s")
                if run.stop_why is not None and not exited.done():
                    if run.stop_checkpoint is not None:
                        await self._checkpoint(run, run.stop_checkpoint)
                    run.stopped_by = run.stop_why
                    return await self.runtime.stop(run.running, self.settings.stop_grace_s)
                due = run.next_checkpoint
                if due is not None and time.monotonic() >= due and not exited.done():
                    await self._checkpoint(run, "Interval")
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
        run.rates.append(latest)
        if await self.reporter.progress(run.msg.namespace, run.msg.attempt, n, format_rate(latest)):
            run.progress_n, run.sent_rate, run.sent_at = n, latest, now

    # -- checkpoints --------------------------------------------------------------------------------
    def _first_checkpoint(self, run: Run) -> float | None:
        """When the first Interval checkpoint is due (monotonic), None when this run takes none."""
        interval = preparing.checkpoint_interval(run.msg, self.settings, run.last_checkpoint_cost)
        return None if interval is None else time.monotonic() + interval.total_seconds()

    async def _checkpoint(self, run: Run, reason: str) -> None:
        """Take one checkpoint; a failure is logged and the run goes on (latest stays where it was)."""

        async def notify() -> None:
            await self.runtime.signal(run.running, CHECKPOINT_SIGNAL)

        began = time.monotonic()
        try:
            taken = await preparing.take_checkpoint(self.toolkit, run.msg, run.dir, reason, notify)
        except Exception as e:
            log.warning("checkpoint failed: %s", e, extra={"attempt": run.msg.attempt, "reason": reason})
            taken = None
        run.last_checkpoint_cost = timedelta(seconds=time.monotonic() - began)
        interval = preparing.checkpoint_interval(run.msg, self.settings, run.last_checkpoint_cost)
        run.next_checkpoint = None if interval is None else time.monotonic() + interval.total_seconds()
        if taken is None:
            return
        report = AttemptCheckpointed(
            namespace=run.msg.namespace, attempt=run.msg.attempt, node=self.settings.node, checkpoint=taken
        )
        try:
            await self.reporter.send(
                report, f"{run.msg.namespace}/{run.msg.attempt}:checkpoint:{taken.sequence}"
            )
        except Exception as e:
            log.warning("checkpoint report not sent: %s", e, extra={"attempt": run.msg.attempt})

    def _outcome(self, run: Run, exit: Exit) -> tuple[str, int | None, str | None]:
        code = exit.code
        if run.stopped_by is not None:
            reason, message = run.stopped_by
            return reason, code, message
        if exit.lost or code is None:
            return "Lost", code, exit.message or "the program was lost with no exit code"
        if code == 0:
            return "Completed", code, None
        # The log's last lines go on the bus in the report: secret values masked as in the shipped log.
        tail = Redactor(run.prepared.secrets.values())(run.dir.log_tail())
        if exit.oom_killed:
            message = exit.message or "the program ran out of memory (killed at its memory limit)"
            return "OOMKilled", code, f"{message}; the last lines of its log:\n{tail}" if tail else message
        message = f"the program {_describe(code)}"
        return "Error", code, f"{message}; the last lines of its log:\n{tail}" if tail else message

    # -- finishing ----------------------------------------------------------------------------------
    async def _settle(self, adir: AttemptDir, record: Record, msg: StartAttempt | None) -> None:
        """An attempt this agent is not watching but has a record of: finished, or an orphan (which the
        runtime re-adopts when it can watch it again, with the StartAttempt of a redelivery)."""
        # In the trace of its StartAttempt, also after a restart: the reports it sends join the run's trace.
        with tracing.continued(record.traceparent):
            await self._settle_run(adir, record, msg)

    async def _settle_run(self, adir: AttemptDir, record: Record, msg: StartAttempt | None) -> None:
        if record.phase == FINISHED:
            await self._publish_finished(adir, record)
            return
        running = await self.runtime.reattach(adir, record, self.settings.stop_grace_s)
        stop = remembered(adir)
        if running is not None:
            known = msg or adir.load_start()
            if known is None:  # an agent from before start.json: what the record knows is enough to wait
                known = StartAttempt(
                    namespace=adir.namespace,
                    job="",
                    attempt=adir.attempt,
                    index=0,
                    attempt_no=0,
                    node=self.settings.node,
                )
            began = time.monotonic() - max(0, epoch_ms() - (record.started_epoch_ms or epoch_ms())) / 1000
            log.info("re-adopted a running attempt", extra={"attempt": adir.attempt, "id": running.ident})
            prepared = await preparing.for_adoption(self.toolkit, known)
            await identifying.for_adoption(self.toolkit.grants, known, prepared.secrets)  # masked logs
            prepared.plan = adir.load_plan() or MountPlan()  # what its finish commits and reports
            await preparing.retain_mounts(self.toolkit, prepared.plan)
            run = self._watch_run(known, adir, record, running, began, prepared, adopted=True)
            if stop is not None:  # acknowledged by an agent killed before it carried it out
                _stop_run(run, stop)
            return
        wall = max(epoch_ms() - record.started_epoch_ms if record.started_epoch_ms else 0, 0)
        mounted = preparing.Prepared(plan=adir.load_plan() or MountPlan())  # reported with the finish
        if stop is not None:  # gone, but it was asked to stop: that is what it did, not lost capacity
            await self._finish(adir, record, "Stopped", None, wall, asked_to_stop(stop), prepared=mounted)
        else:
            await self._finish(adir, record, "Lost", None, wall, AGENT_RESTARTED, prepared=mounted)

    async def _finish(
        self,
        adir: AttemptDir,
        record: Record,
        reason: str,
        exit_code: int | None,
        wall_millis: int,
        message: str | None,
        rate: Decimal | None = None,
        *,
        prepared: preparing.Prepared | None = None,
        outputs: list[OutputRecord] | None = None,
        mean_rate: Decimal | None = None,
        source: SourceRecord | None = None,
    ) -> None:
        plan = prepared.plan if prepared is not None else None
        identifying.remove(adir)  # the run's API token must not outlive it on this disk (ADR-0037)
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
            outputs=outputs,
            restored_from=prepared.restored if prepared is not None else None,
            mean_rate=mean_rate,
            source=source or (plan.source if plan is not None else None),
            mounts=plan.records if plan is not None else None,
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


def _stop_run(run: Run, msg: StopAttempt) -> None:
    checkpoint = checkpoint_reason(msg.reason) if msg.checkpoint else None
    run.request_stop("Stopped", asked_to_stop(msg), checkpoint=checkpoint)


def _describe(code: int) -> str:
    from nodus_agent.processes import describe_exit

    return describe_exit(code)


def _mean(rates: list[Decimal]) -> Decimal | None:
    return sum(rates, Decimal(0)) / len(rates) if rates else None


def _ms_since(began: float) -> int:
    return int((time.monotonic() - began) * 1000)
