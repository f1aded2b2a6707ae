"""A simulated fleet: one process, one event loop, hundreds or thousands of fake nodes (issue #5).

Each simulated node is, for the rest of the system, a node agent like any other: a Node record in the
``nodes`` bucket (labels, fake GPU inventory, heartbeats), assignments on ``nodus.assign.<node>``, and
``AttemptStarted`` / ``AttemptProgress`` / ``AttemptFinished`` reports on
``nodus.report.<node>.<namespace>.<attempt>`` with the agent's message ids. Nothing runs: an attempt
"runs" for a time sampled from a lognormal distribution and ends the way its knobs say. See
``docs/simulation.md`` for the knobs and what is not simulated.

What keeps it cheap:

* **Heartbeats**: one loop for the whole fleet walks the nodes in a fixed order, spread evenly over the
  interval (node ``i`` beats at ``i/N`` of it), a handful of writes per tick. Each node keeps the Node
  it last wrote, so a beat is one compare-and-set write (no read first); a lost race or a deleted
  record falls back to the real agent's read-modify-write (:class:`~nodus_agent.registering.Registration`).
* **Assignments**: one durable pull consumer per chunk of nodes (``--chunk``, 500 by default) on the
  work-queue stream, with ``filter_subjects`` listing the chunk's ``nodus.assign.<node>`` subjects
  (nats-server >= 2.10), consumed by the kit's :class:`~nodus_kit.messaging.Consumer` as every service
  consumes (outcomes, retries, dead letters). It hands a fetched batch's assignments to the handler side
  by side: each is decided and recorded in the fleet's journal, the batch's records share one fsync, and
  each is acknowledged only then.
* **Runs**: no task per run. Each run holds one timer handle (its next progress tick or its end); when
  it fires, the run is queued for one publisher loop that records finishes (again one fsync per batch)
  and publishes the reports of a batch concurrently.

Idempotency is the real agent's rule (ADR-0008), decided from the journal, never from the message: a
StartAttempt for a run in progress is ignored, one for a finished run re-publishes its AttemptFinished
(same id), one for a run an earlier fleet process (or a vanished node) left behind reports it Lost; a
StopAttempt for an attempt never seen leaves a Stopped record so a late start never runs it.

Samples are a pure function of the seed and the attempt's ``(namespace, job, index, attemptNo)``, so a
run of a test or a benchmark is repeatable whatever order messages arrive in, and a redelivery samples
the same run again.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from decimal import Decimal
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from nodus_agent import attemptdir
from nodus_agent.attemptdir import FINISHED, RUNNING, Record
from nodus_agent.fleetnodes import ASSIGN_PREFIX, PostSync, SimNode, SimRegistration, SimRun, _Chunk
from nodus_agent.fleetplanning import (
    PROGRESS_JITTER,
    SIGTERM_EXIT,
    FleetSettings,
    load_catalog,
    node_name,
    plan_run,
    run_rng,
    shape_of,
)
from nodus_agent.inventory import Inventory, fake_devices
from nodus_agent.journaling import Entry, Journal, Known
from nodus_agent.reporting import Reporter
from nodus_agent.running import AGENT_RESTARTED, AGENT_SHUTDOWN, STOPPED_BEFORE_START, epoch_ms, finished
from nodus_agent.settings import AgentSettings
from nodus_agent.throughput import format_rate
from nodus_kit.errors import NotFound, PermanentError, TemporaryError
from nodus_kit.messaging import Consumer, Delivery
from nodus_kit.storing import ObjectStore
from nodus_schema.messages import Assignment, StartAttempt, StopAttempt
from nodus_schema.meta import now_rfc3339
from nodus_schema.nodes import Node

log = logging.getLogger(__name__)

ASSIGNMENTS = "NODUS_ASSIGNMENTS"

FETCH_BATCH = 256
MAX_DELIVER = 8  # deliveries before a failing assignment goes to the dead letters (the Consumer's default)
# The Consumer's own limit, in effect none: an assignment for a vanished node waits in the stream for as long
# as the node is away, redelivered every VANISHED_RETRY_S, so the handler applies MAX_DELIVER to failures.
CONSUMER_MAX_DELIVER = 2**31 - 1
VANISHED_RETRY_S = 5.0
MIN_TICK_S = 0.05  # the heartbeat loop's finest step


async def trickle(count: int, start: float, period: float, tick: float) -> AsyncIterator[slice]:
    """One period of a steady trickle from ``start`` (loop time): item ``i`` of ``count`` is due at
    ``i/count`` of the period. Yields the slice of items due, in order, as their time comes; those due
    within ``tick`` of each other come together (bench/beat_floor.py sends its beats on the same schedule).
    """
    loop = asyncio.get_running_loop()
    done = 0
    while done < count:
        due = min(count, int((loop.time() - start) / period * count) + 1)
        if due > done:
            yield slice(done, due)
            done = due
        if done < count:
            await asyncio.sleep(max(start + done * period / count - loop.time(), tick))


REGISTER_CONCURRENCY = 64
LOST_ON_REVIVE = "the node vanished while the attempt ran (simulated node loss)"


# -- the fleet ------------------------------------------------------------------------------------------
class SimulatedFleet:
    """N simulated node agents in this event loop. ``start``, then ``stop`` (or ``halt`` for a crash)."""

    def __init__(
        self, nc: NATS, settings: FleetSettings, *, on_fatal: Callable[[BaseException], None] | None = None
    ) -> None:
        self.nc, self.settings = nc, settings
        self.on_fatal = on_fatal
        """Called when the fleet cannot go on (its journal cannot be written); it has stopped consuming."""
        self.js: JetStreamContext = nc.jetstream()
        self.store = ObjectStore(nc, "nodes", Node, direct_reads=True)  # key-scoped credential
        catalog = load_catalog(settings.catalog)
        shapes = [shape_of(o, catalog) for o in settings.offerings]
        self.nodes: dict[str, SimNode] = {}
        for i in range(settings.nodes):
            name = node_name(settings.fleet, i)
            shape = shapes[i % len(shapes)]  # round robin: repeat an offering in the list to weight it
            agent = AgentSettings(
                node=name,
                offering=shape.offering,
                region_class=shape.region_class,
                variant=shape.variant,
                gpu_memory=shape.memory,
                gpus=shape.gpus,
                workdir=settings.workdir,
                cwd=settings.workdir,
                heartbeat_s=settings.heartbeat_s,
                record_s=settings.record_s,
                pool=settings.pool,
                fake_gpus=True,
            )
            inventory = Inventory(gpus=fake_devices(agent), fake=True)
            registration = SimRegistration(self.store, agent, inventory, settings.fleet)
            self.nodes[name] = SimNode(name, shape, registration, Reporter(self.js, name))
        names = list(self.nodes)
        self.chunks = [
            _Chunk(f"simfleet-{settings.fleet}-{k}", names[i : i + settings.chunk])
            for k, i in enumerate(range(0, len(names), settings.chunk))
        ]
        self.journal = Journal(settings.workdir / "journal.jsonl")
        self.known: dict[tuple[str, str], Known] = {}
        self.runs: dict[tuple[str, str], SimRun] = {}
        self.stats: Counter[str] = Counter()
        """started, duplicate, resent, stopped, lost, finished:<reason>, dead, heartbeats, ..."""
        self.registered = False
        self.peak_runs = 0
        """The most runs at once (tests check parallelism with it)."""
        self._broken: BaseException | None = None
        """Why the journal cannot be written (the fleet then takes no more work), or None."""
        self._wake = asyncio.Event()
        self._pump_lock = asyncio.Lock()  # one batch of recording and reporting at a time
        self._pump_task: asyncio.Task[None] | None = None
        self._due: list[SimRun] = []
        self._outbox: list[tuple[contextvars.Context, Callable[[], Coroutine[Any, Any, Any]]]] = []
        """Reports to send, each in the context (request id, trace) of the assignment it answers."""
        self._tasks: list[asyncio.Task[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- lifecycle ----------------------------------------------------------------------------------
    async def start(self) -> SimulatedFleet:
        self._loop = asyncio.get_running_loop()
        self.known = await asyncio.to_thread(self.journal.load)
        await self._each(list(self.nodes.values()), lambda n: n.registration.register(), strict=True)
        self.registered = True
        log.info(
            "simulated fleet registered",
            extra={"fleet": self.settings.fleet, "nodes": len(self.nodes), "consumers": len(self.chunks)},
        )
        self._pump_task = asyncio.create_task(self._pump(), name="sim:pump")
        self._settle_left_behind(lambda node: True, AGENT_RESTARTED)
        self._tasks.append(asyncio.create_task(self._heartbeats(), name="sim:heartbeats"))
        await self._ensure_consumers()
        return self

    async def stop(self, *, forget: bool = False) -> None:
        """As a real agent stops: no new work, every run reported Stopped, every Node NotReady.

        ``forget`` also deletes the Node records and the fleet's durable consumers (tests, benchmarks)."""
        await self._stop_consuming()
        for run in list(self.runs.values()):
            if not run.done:
                self._end(run, "Stopped", SIGTERM_EXIT, self._ms(run), AGENT_SHUTDOWN, run.last_rate)
        async with self._pump_lock:  # the batch in flight is sent first
            await self._cancel_pump()
            try:
                while self._due or self._outbox:
                    await self._pump_once()
            except OSError as e:
                log.error("could not record the last runs: %s", e)
        await self._cancel_tasks()
        if forget:
            await self.forget()
        else:
            alive = [n for n in self.nodes.values() if n.alive]
            await self._each(alive, lambda n: n.registration.mark_not_ready())
        self.journal.close()
        self.registered = False

    async def forget(self) -> None:
        """Delete the fleet's Node records and durable consumers (after ``stop`` or ``halt``)."""
        await self._each(list(self.nodes.values()), lambda n: self._delete_node(n.name))
        for chunk in self.chunks:
            with contextlib.suppress(NotFoundError):
                await self.js.delete_consumer(ASSIGNMENTS, chunk.durable)

    async def halt(self) -> None:
        """Stop dead, as SIGKILL would: no reports, no NotReady, nothing acknowledged that was not yet."""
        await self._stop_consuming()
        for run in self.runs.values():
            if run.handle is not None:
                run.handle.cancel()
        await self._cancel_pump()
        await self._cancel_tasks()
        self.journal.close()
        self.registered = False

    async def _stop_consuming(self) -> None:
        """Every consumer finishes the batch in hand (acknowledging what it recorded) and stops."""
        consumers = [c.consumer for c in self.chunks if c.consumer is not None]
        await asyncio.gather(*(consumer.stop() for consumer in consumers))

    async def _cancel_pump(self) -> None:
        if self._pump_task is not None:
            self._pump_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump_task
            self._pump_task = None

    def _fatal(self, error: BaseException) -> None:
        """The journal cannot be written: no more work is taken (what is not recorded is not acknowledged,
        and comes again to a fleet that can record it)."""
        if self._broken is not None:
            return
        self._broken = error
        log.critical("the fleet's journal cannot be written: it stops taking work (%s)", error)
        # Called from a handler, inside a Consumer's loop, whose stop waits for that loop: so a task apart.
        self._tasks.append(asyncio.create_task(self._stop_consuming(), name="sim:stop-consuming"))
        if self.on_fatal is not None:
            self.on_fatal(error)

    async def _cancel_tasks(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def _delete_node(self, name: str) -> None:
        with contextlib.suppress(NotFound):
            await self.store.delete(None, name)

    async def _each(
        self, items: Sequence[SimNode], op: Callable[[SimNode], Awaitable[Any]], *, strict: bool = False
    ) -> None:
        """``op`` on every node, a bounded number at a time; a failure is raised (``strict``) or logged."""
        for i in range(0, len(items), REGISTER_CONCURRENCY):
            batch = items[i : i + REGISTER_CONCURRENCY]
            results = await asyncio.gather(*(op(n) for n in batch), return_exceptions=True)
            for node, result in zip(batch, results, strict=True):
                if isinstance(result, BaseException):
                    if strict or isinstance(result, asyncio.CancelledError):
                        raise result
                    log.warning("node %s: %s", node.name, result)

    # -- node loss ----------------------------------------------------------------------------------
    async def vanish(self, name: str, *, delete_record: bool = False) -> None:
        """The node is gone: no heartbeat, no report, its assignments wait in the stream.

        Its runs end silently (the scheduler finds them Lost once the heartbeat is stale); with
        ``delete_record`` its Node record goes too."""
        node = self.nodes[name]
        node.alive = False
        for run in self.runs.values():
            if run.node is node and not run.done:
                run.done = True
                if run.handle is not None:
                    run.handle.cancel()
        for key in [k for k, r in self.runs.items() if r.node is node]:
            del self.runs[key]
        self.stats["vanished"] += 1
        if delete_record:
            await self._delete_node(name)

    async def revive(self, name: str) -> None:
        """The node's agent is back (same name): registered again, its left-behind runs reported Lost."""
        node = self.nodes[name]
        await node.registration.register()
        self._settle_left_behind(lambda n: n == name, LOST_ON_REVIVE)
        node.alive = True

    def _settle_left_behind(self, which: Callable[[str], bool], message: str) -> None:
        """Runs recorded Running that nobody runs (a fleet restart, a vanished node): Lost. Finished runs
        whose report was never acknowledged: sent again."""
        now = epoch_ms()
        for key, k in list(self.known.items()):
            if not which(k.node) or key in self.runs:
                continue
            if k.record.phase != FINISHED:
                started = k.record.started_epoch_ms
                wall = max(now - started, 0) if started else 0
                self._record_finish(key, k.node, k.record, "Lost", None, wall, message, None)
                self.stats["lost"] += 1
                self._send(functools.partial(self._publish_finished, key))
            elif not k.record.reported:
                self._send(functools.partial(self._publish_finished, key))
        self._wake.set()

    # -- heartbeats ---------------------------------------------------------------------------------
    async def _heartbeats(self) -> None:
        """Every node beats once per interval, node ``i`` at ``i/N`` of it: a steady trickle of beats on the
        bus, and of record refreshes (each node's every ``record_s``)."""
        loop = asyncio.get_running_loop()
        period = self.settings.heartbeat_s
        cycle = loop.time() + period  # registration just wrote every heartbeat
        await asyncio.sleep(period)
        while True:
            order = list(self.nodes.values())
            async for due in trickle(len(order), cycle, period, MIN_TICK_S):
                await asyncio.gather(*(self._beat(node) for node in order[due] if node.alive))
            cycle = max(cycle + period, loop.time())
            await asyncio.sleep(max(cycle - loop.time(), 0.0))

    async def _beat(self, node: SimNode) -> None:
        try:
            await node.registration.tick()
            self.stats["heartbeats"] += 1
        except Exception as e:  # the bus may be reconnecting: the next beat tries again
            self.stats["heartbeat_failures"] += 1
            log.warning("heartbeat failed: %s", e, extra={"node": node.name})

    # -- assignments --------------------------------------------------------------------------------
    async def _ensure_consumers(self) -> None:
        """One durable per chunk; durables of this fleet left by another layout are deleted first
        (two consumers of a work-queue stream may not share a subject)."""
        wanted = {c.durable: c for c in self.chunks}
        prefix = f"simfleet-{self.settings.fleet}-"
        infos: list[Any] = []
        while page := await self.js.consumers_info(ASSIGNMENTS, offset=len(infos)):
            infos.extend(page)
        for info in infos:
            name = info.name or ""
            if not name.startswith(prefix):
                continue
            chunk = wanted.get(name)
            if chunk is None or sorted(info.config.filter_subjects or []) != sorted(chunk.subjects):
                await self.js.delete_consumer(ASSIGNMENTS, name)
        for chunk in self.chunks:
            await self.js.add_consumer(ASSIGNMENTS, chunk.config())
            chunk.consumer = await Consumer(
                self.js,
                stream=ASSIGNMENTS,
                durable=chunk.durable,
                # The durable exists, with its chunk's filter_subjects: the Consumer binds to it as it is.
                subject=chunk.subjects[0],
                typ=Assignment,  # type: ignore[arg-type]  # a union is a valid msgspec type, not a class
                handler=self._on_assignment,
                max_deliver=CONSUMER_MAX_DELIVER,
                batch=FETCH_BATCH,
                concurrent=True,  # a batch's records share one fsync (Journal.sync)
            ).start()

    async def _on_assignment(self, delivery: Delivery[Assignment]) -> None:
        """One assignment, decoded and in its trace context: decided, recorded, then acted on; the
        Consumer acknowledges it once this returns. Raises TemporaryError to leave it waiting in the
        stream, PermanentError to dead-letter it (counted in ``stats["dead"]``)."""
        if self._broken is not None:
            raise TemporaryError("the fleet's journal cannot be written", delay=VANISHED_RETRY_S)
        node = self._addressee(delivery)
        after: list[PostSync] = []
        try:
            if isinstance(delivery.data, StartAttempt):
                self._start(node, delivery.data, after)
            else:
                self._stop(node, delivery.data, after)
        except Exception as e:
            if delivery.attempt < MAX_DELIVER:
                raise  # the Consumer logs it and redelivers it after a backoff
            log.exception("assignment failed", extra={"subject": delivery.subject})
            raise self._dead(f"gave up after {delivery.attempt} deliveries: {e}") from e
        try:
            await self.journal.sync()
        except OSError as e:
            self._fatal(e)
            raise
        for action in after:
            action()
        self._wake.set()

    def _addressee(self, delivery: Delivery[Assignment]) -> SimNode:
        """The node an assignment is for. PermanentError for one no node of this fleet can take,
        TemporaryError while its node has vanished (it waits in the stream for the node's return)."""
        node = self.nodes.get(delivery.subject[len(ASSIGN_PREFIX) :])
        if node is None:
            raise self._dead(f"{delivery.subject} is not a node of fleet {self.settings.fleet}")
        if not node.alive:
            raise TemporaryError(f"node {node.name} has vanished", delay=VANISHED_RETRY_S)
        data = delivery.data
        for what, name in (("namespace", data.namespace), ("attempt", data.attempt)):
            if not attemptdir.valid_name(name):
                raise self._dead(f"{what} {name!r} is not a DNS label")
        if isinstance(data, StartAttempt) and data.node != node.name:
            raise self._dead(f"StartAttempt for node {data.node!r} reached node {node.name!r}")
        return node

    def _dead(self, reason: str) -> PermanentError:
        """The error that makes the Consumer dead-letter an assignment, counted."""
        self.stats["dead"] += 1
        return PermanentError(reason)

    def _start(self, node: SimNode, msg: StartAttempt, after: list[PostSync]) -> None:
        key = (msg.namespace, msg.attempt)
        if key in self.runs:
            self.stats["duplicate"] += 1
            return
        known = self.known.get(key)
        if known is not None:
            if known.record.phase == FINISHED:
                self.stats["resent"] += 1
                after.append(self._later(functools.partial(self._publish_finished, key)))
            else:  # recorded as running but nobody runs it: an earlier process, or a vanished node
                started = known.record.started_epoch_ms
                wall = max(epoch_ms() - started, 0) if started else 0
                self._record_finish(key, known.node, known.record, "Lost", None, wall, AGENT_RESTARTED, None)
                self.stats["lost"] += 1
                after.append(self._later(functools.partial(self._publish_finished, key)))
            return
        rng = run_rng(self.settings.seed, msg)
        warm = msg.warm_reuse and node.last_image == msg.image
        node.last_image = msg.image
        plan = plan_run(msg, node.shape, self.settings, rng, warm=warm)
        record = Record(phase=RUNNING, started=now_rfc3339(), started_epoch_ms=epoch_ms())
        self.journal.append(
            Entry(namespace=msg.namespace, attempt=msg.attempt, node=node.name, record=record)
        )
        self.known[key] = Known(node.name, record)
        run = SimRun(node, msg.namespace, msg.attempt, plan, rng, record, ctx=contextvars.copy_context())
        self.runs[key] = run
        self.stats["started"] += 1
        self.peak_runs = max(self.peak_runs, len(self.runs))
        after.append(lambda: self._launch(run))

    def _launch(self, run: SimRun) -> None:
        """Once the start is durable: the node boots (the plan's boot, cold or warm), then AttemptStarted
        goes out and the run's clock starts."""
        assert self._loop is not None
        if run.plan.boot_seconds > 0:
            run.handle = self._loop.call_later(run.plan.boot_seconds, self._program, run)
        else:
            self._program(run)

    def _program(self, run: SimRun) -> None:
        """The program launches: AttemptStarted (billing's start and the launch, both on the node's clock)."""
        assert self._loop is not None
        run.handle = None
        if run.done:
            return  # stopped while booting
        started = run.record.started or now_rfc3339()
        ms = run.record.started_epoch_ms
        program = ms + int(run.plan.boot_seconds * 1000) if ms is not None else None
        report = functools.partial(
            run.node.reporter.started, run.namespace, run.attempt, started, started_ms=ms, program_ms=program
        )
        self._send(report, run.ctx)
        if run.done:
            return  # stopped in the same batch
        run.began = self._loop.time()
        run.end_at = run.began + run.plan.seconds
        if self.settings.progress_s > 0 and run.plan.units_per_second is not None:
            run.next_progress_at = run.began + min(self.settings.progress_s, run.plan.seconds / 2)
        self._arm(run)

    def _arm(self, run: SimRun) -> None:
        assert self._loop is not None
        run.handle = self._loop.call_at(min(run.end_at, run.next_progress_at), self._fire, run)

    def _fire(self, run: SimRun) -> None:
        """A run's timer: its end, or a progress tick (and the next timer)."""
        assert self._loop is not None
        run.handle = None
        if run.done:
            return
        if self._loop.time() >= run.end_at or run.next_progress_at >= run.end_at:
            p = run.plan
            self._end(run, p.reason, p.exit_code, int(p.seconds * 1000), p.message, p.units_per_second)
            self._wake.set()
            return
        assert run.plan.units_per_second is not None
        jitter = 1.0 + PROGRESS_JITTER * run.rng.gauss(0.0, 1.0)
        rate = Decimal(f"{float(run.plan.units_per_second) * max(jitter, 0.0):.1f}")
        if rate != run.last_rate:  # as the real agent: a progress report only when the rate changed
            run.progress_n += 1
            run.last_rate = rate
            progress = run.node.reporter.progress
            self._send(
                functools.partial(progress, run.namespace, run.attempt, run.progress_n, format_rate(rate)),
                run.ctx,
            )
        run.next_progress_at += self.settings.progress_s
        self._arm(run)

    def _end(
        self,
        run: SimRun,
        reason: str,
        exit_code: int | None,
        wall: int,
        message: str | None,
        rate: Decimal | None,
    ) -> None:
        """The run's end is decided; the publisher loop records it and reports it."""
        run.done = True
        if run.handle is not None:
            run.handle.cancel()
            run.handle = None
        run.outcome = (reason, exit_code, wall, message, rate)
        self._due.append(run)

    def _stop(self, node: SimNode, msg: StopAttempt, after: list[PostSync]) -> None:
        key = (msg.namespace, msg.attempt)
        run = self.runs.get(key)
        if run is not None:
            if not run.done:
                self.stats["stopped"] += 1
                self._end(
                    run,
                    "Stopped",
                    SIGTERM_EXIT,
                    self._ms(run),
                    f"asked to stop ({msg.reason})",
                    run.last_rate,
                )
            return
        known = self.known.get(key)
        if known is None:
            # Never seen: a Stopped record, so a StartAttempt arriving late does not run it.
            self._record_finish(
                key, node.name, Record(phase=RUNNING), "Stopped", None, 0, STOPPED_BEFORE_START, None
            )
            self.stats["stopped"] += 1
        elif known.record.phase != FINISHED:
            started = known.record.started_epoch_ms
            wall = max(epoch_ms() - started, 0) if started else 0
            self._record_finish(key, known.node, known.record, "Lost", None, wall, AGENT_RESTARTED, None)
            self.stats["lost"] += 1
        after.append(self._later(functools.partial(self._publish_finished, key)))

    def _ms(self, run: SimRun) -> int:
        assert self._loop is not None
        return int((self._loop.time() - run.began) * 1000) if run.began else 0

    # -- finishing and reporting --------------------------------------------------------------------
    def _send(
        self, send: Callable[[], Coroutine[Any, Any, Any]], ctx: contextvars.Context | None = None
    ) -> None:
        """Queue a report for the publisher loop (in ``ctx``, or the current context)."""
        self._outbox.append((contextvars.copy_context() if ctx is None else ctx, send))
        self._wake.set()

    def _later(self, send: Callable[[], Coroutine[Any, Any, Any]]) -> PostSync:
        """``_send`` once the batch is recorded, in the context of the assignment being decided now."""
        ctx = contextvars.copy_context()
        return lambda: self._send(send, ctx)

    def _record_finish(
        self,
        key: tuple[str, str],
        node: str,
        record: Record,
        reason: str,
        exit_code: int | None,
        wall_millis: int,
        message: str | None,
        rate: Decimal | None,
    ) -> None:
        record = finished(record, key[0], key[1], node, reason, exit_code, wall_millis, message, rate)
        self.journal.append(Entry(namespace=key[0], attempt=key[1], node=node, record=record))
        self.known[key] = Known(node, record)
        self.stats[f"finished:{reason}"] += 1

    async def _publish_finished(self, key: tuple[str, str]) -> None:
        known = self.known[key]
        report = known.record.report
        assert report is not None, "a finished record carries its report"
        node = self.nodes.get(known.node)
        # A node no longer in the fleet (a restart with fewer nodes) still gets its report sent.
        reporter = node.reporter if node is not None else Reporter(self.js, known.node)
        await reporter.finished(report)
        if not known.record.reported:
            known.record = msgspec.structs.replace(known.record, reported=True)
            # No fsync: a lost mark only means the same report (same id) is sent again after a restart.
            entry = Entry(namespace=key[0], attempt=key[1], node=known.node, reported=True)
            self.journal.append(entry, durable=False)

    async def _pump(self) -> None:
        """The one loop that records ended runs (one fsync per batch) and publishes every report."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            async with self._pump_lock:
                try:
                    await self._pump_once()
                except OSError as e:
                    self._fatal(e)
                    return

    async def _pump_once(self) -> None:
        due, self._due = self._due, []
        for run in due:
            assert run.outcome is not None
            key = (run.namespace, run.attempt)
            self._record_finish(key, run.node.name, run.record, *run.outcome)
            self.runs.pop(key, None)
            self._send(functools.partial(self._publish_finished, key), run.ctx)
        await self.journal.sync()
        out, self._outbox = self._outbox, []
        if not out:
            return
        loop = asyncio.get_running_loop()
        sends = [loop.create_task(send(), context=ctx) for ctx, send in out]
        for result in await asyncio.gather(*sends, return_exceptions=True):
            if isinstance(result, BaseException):
                if isinstance(result, asyncio.CancelledError):
                    raise result
                log.error("report not sent: %s", result)
