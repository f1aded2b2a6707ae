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
  (nats-server >= 2.10). A fetched batch is decided, recorded in the fleet's journal with one fsync, and
  only then acknowledged.
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

import argparse
import asyncio
import contextlib
import contextvars
import functools
import logging
import math
import os
import random
import re
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import NotFoundError

from nodus_agent import attemptdir, processes
from nodus_agent.attemptdir import FINISHED, RUNNING, Record
from nodus_agent.inventory import Inventory, fake_devices
from nodus_agent.registering import Registration
from nodus_agent.reporting import Reporter
from nodus_agent.running import AGENT_RESTARTED, AGENT_SHUTDOWN, STOPPED_BEFORE_START, epoch_ms, finished
from nodus_agent.settings import AgentSettings
from nodus_agent.throughput import format_rate
from nodus_kit import tracing
from nodus_kit.errors import Conflict, NotFound
from nodus_kit.messaging import DEAD_REASON, DEAD_SUBJECT, MSG_ID, backoff
from nodus_kit.servicing import Check, Service
from nodus_kit.servicing import main as run_service
from nodus_kit.storing import ObjectStore
from nodus_schema.messages import Assignment, StartAttempt, StopAttempt
from nodus_schema.meta import now_rfc3339
from nodus_schema.nodes import Node

log = logging.getLogger(__name__)

ASSIGNMENTS = "NODUS_ASSIGNMENTS"
ASSIGN_PREFIX = "nodus.assign."
LABEL_SIMULATED = "nodus.dev/simulated"
"""On every simulated Node: the fleet's name (``kubectl get nodes -l nodus.dev/simulated``)."""

# Knobs a Job may set in its spec's env (literal values), overriding the fleet's defaults.
ENV_SECONDS = "NODUS_SIM_SECONDS"
ENV_SIGMA = "NODUS_SIM_SIGMA"
ENV_EXIT = "NODUS_SIM_EXIT"
ENV_FAILURE_RATE = "NODUS_SIM_FAILURE_RATE"
ENV_FAIL_ATTEMPTS = "NODUS_SIM_FAIL_ATTEMPTS"
ENV_UNITS = "NODUS_SIM_UNITS_PER_SECOND"

SIGTERM_EXIT = 143  # what a program killed by SIGTERM reports (128 + 15), as the real runner sees it
THROUGHPUT_SIGMA = 0.05  # run-to-run spread of throughput around its median
PROGRESS_JITTER = 0.02  # tick-to-tick spread of a run's reported throughput
# Relative speed of one GPU of a family (units per second per GPU = base x this): enough for a Sweep
# over GPU types to have a best cell by throughput. Unknown families count as 1.
FAMILY_SPEED = {"B200": 6.0, "H200": 4.0, "H100": 3.0, "MI300X": 3.0, "A100": 2.0, "L40S": 1.5, "L4": 1.0}
KNOWN_MEMORY = {
    "L4": "24Gi",
    "L40S": "48Gi",
    "A10G": "24Gi",
    "MI300X": "192Gi",
}  # variants whose name does not carry their memory

FETCH_BATCH = 256
MAX_DELIVER = 8  # handler failures before an assignment goes to the dead letters (as messaging.Consumer)
VANISHED_RETRY_S = 5.0  # an assignment for a vanished node waits in the stream, redelivered this often
MIN_TICK_S = 0.05  # the heartbeat loop's finest step
REGISTER_CONCURRENCY = 64
LOST_ON_REVIVE = "the node vanished while the attempt ran (simulated node loss)"

_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_OFFERING = re.compile(r"(?P<variant>[a-z0-9]+(?:-[a-z0-9]+)*?)-x(?P<gpus>[1-9][0-9]*)-(?P<region>[a-z0-9]+)")
_MEMORY_IN_NAME = re.compile(r"-([0-9]+)G(?:-|$)")


# -- settings -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FleetSettings:
    """A fleet's knobs; ``from_env`` reads ``NODUS_FLEET_*`` (the CLI sets the same variables)."""

    fleet: str = "sim"
    nodes: int = 100
    offerings: tuple[str, ...] = ("h100-sxm-80g-x1-us",)
    pool: str | None = None
    heartbeat_s: float = 5.0
    median_s: float = 30.0
    sigma: float = 0.5
    failure_rate: float = 0.0
    units_per_second: float = 100.0
    """Median throughput of one GPU of speed 1 (an L4); a node's is this x family speed x GPUs."""
    progress_s: float = 5.0
    """Seconds between AttemptProgress reports of a run (0: none)."""
    seed: int = 1
    chunk: int = 500
    """Nodes per durable consumer."""
    workdir: Path = Path(".nodus/sim/sim")
    catalog: Path | None = None
    """A price book (the scheduler's catalog.json) for exact variants and memory; else the naming rule."""

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.fleet):
            raise ValueError(f"fleet name {self.fleet!r} is not a DNS label")
        longest = node_name(self.fleet, max(self.nodes - 1, 0))
        if len(longest) > 63:
            raise ValueError(f"node names such as {longest!r} are longer than 63 characters")
        if self.nodes < 1 or self.chunk < 1:
            raise ValueError("nodes and chunk must be at least 1")
        if not self.offerings:
            raise ValueError("at least one offering is needed")
        if self.heartbeat_s <= 0:
            raise ValueError(f"heartbeat_s={self.heartbeat_s} must be positive")
        if not 0 <= self.failure_rate <= 1:
            raise ValueError(f"failure_rate={self.failure_rate} must be between 0 and 1")
        if self.median_s < 0 or self.sigma < 0 or self.progress_s < 0 or self.units_per_second < 0:
            raise ValueError("median_s, sigma, progress_s and units_per_second must not be negative")

    @classmethod
    def from_env(cls, env: dict[str, str]) -> FleetSettings:
        fleet = env.get("NODUS_FLEET_NAME", cls.fleet)
        offerings = tuple(o.strip() for o in env.get("NODUS_FLEET_OFFERINGS", "").split(",") if o.strip())
        catalog = env.get("NODUS_FLEET_CATALOG") or env.get("NODUS_CATALOG")
        return cls(
            fleet=fleet,
            nodes=int(env.get("NODUS_FLEET_NODES", str(cls.nodes))),
            offerings=offerings or cls.offerings,
            pool=env.get("NODUS_FLEET_POOL") or None,
            heartbeat_s=float(env.get("NODUS_FLEET_HEARTBEAT_S", str(cls.heartbeat_s))),
            median_s=float(env.get("NODUS_FLEET_MEDIAN_S", str(cls.median_s))),
            sigma=float(env.get("NODUS_FLEET_SIGMA", str(cls.sigma))),
            failure_rate=float(env.get("NODUS_FLEET_FAILURE_RATE", str(cls.failure_rate))),
            units_per_second=float(env.get("NODUS_FLEET_UNITS_PER_SECOND", str(cls.units_per_second))),
            progress_s=float(env.get("NODUS_FLEET_PROGRESS_S", str(cls.progress_s))),
            seed=int(env.get("NODUS_FLEET_SEED", str(cls.seed))),
            chunk=int(env.get("NODUS_FLEET_CHUNK", str(cls.chunk))),
            workdir=Path(env.get("NODUS_FLEET_WORKDIR") or Path(".nodus") / "sim" / fleet).absolute(),
            catalog=Path(catalog) if catalog else None,
        )


def node_name(fleet: str, i: int) -> str:
    return f"sim-{fleet}-{i}"


# -- offerings ------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class NodeShape:
    """What a node of an offering has: the variant, GPUs per node, region class, GPU memory."""

    offering: str
    variant: str
    gpus: int
    region_class: str
    memory: str

    @property
    def speed(self) -> float:
        """Relative throughput of a whole node (GPUs x the family's speed per GPU)."""
        return FAMILY_SPEED.get(self.variant.split("-")[0].upper(), 1.0) * self.gpus


@dataclass(frozen=True, slots=True)
class PriceBookFile:
    """What the fleet reads of a price book file (the scheduler's ``catalog.json``): offering shapes and
    variant memory, from every version in it. Read as plain JSON, so the fleet does not depend on the
    scheduler's catalog code, and either form of the file (one book, or ``pricebooks``) works."""

    offerings: dict[str, NodeShape]

    @classmethod
    def load(cls, path: Path) -> PriceBookFile:
        data = msgspec.json.decode(path.read_bytes())
        if not isinstance(data, dict):
            raise ValueError(f"{path}: not a price book (a JSON object)")
        memory = {v.get("id"): v.get("memory") for v in data.get("variants") or [] if isinstance(v, dict)}
        books = [data, *(b for b in data.get("pricebooks") or [] if isinstance(b, dict))]
        shapes: dict[str, NodeShape] = {}
        for book in reversed(books):  # the first book of the file (the newest) wins
            for o in book.get("offerings") or []:
                try:
                    variant = str(o["variant"])
                    shapes[str(o["id"])] = NodeShape(
                        str(o["id"]),
                        variant,
                        int(o["gpusPerNode"]),
                        str(o["regionClass"]),
                        str(memory.get(variant) or _memory_of(variant)),
                    )
                except (KeyError, TypeError, ValueError) as e:
                    raise ValueError(f"{path}: offering {o!r} lacks {e}") from None
        return cls(shapes)


def load_catalog(path: Path | None) -> PriceBookFile | None:
    return PriceBookFile.load(path) if path else None


def shape_of(offering: str, catalog: PriceBookFile | None = None) -> NodeShape:
    """The node an offering describes: from the price book when given, else from the naming rule
    ``<variant>-x<gpus>-<region>`` (``h100-sxm-80g-x8-us``: 8 x H100-SXM-80G in ``us``)."""
    if catalog is not None:
        found = catalog.offerings.get(offering)
        if found is None:
            raise ValueError(f"offering {offering!r} is not in the price book file")
        return found
    m = _OFFERING.fullmatch(offering)
    if not m:
        raise ValueError(
            f"offering {offering!r} does not follow <variant>-x<gpus>-<region> (h100-sxm-80g-x8-us); "
            "pass a price book (--catalog) for other names"
        )
    variant = m["variant"].upper()
    return NodeShape(offering, variant, int(m["gpus"]), m["region"], _memory_of(variant))


def _memory_of(variant: str) -> str:
    m = _MEMORY_IN_NAME.search(variant.upper())
    return f"{m[1]}Gi" if m else KNOWN_MEMORY.get(variant.upper(), "80Gi")


# -- sampling -------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Plan:
    """How one simulated run ends, decided when it starts."""

    seconds: float
    reason: str  # Completed, Error, DeadlineExceeded
    exit_code: int | None
    message: str | None
    units_per_second: Decimal | None


def run_rng(seed: int, msg: StartAttempt) -> random.Random:
    """The run's own generator: the same attempt of the same Job index samples the same run."""
    return random.Random(f"{seed}/{msg.namespace}/{msg.job}/{msg.index}/{msg.attempt_no}")


def plan_run(msg: StartAttempt, shape: NodeShape, cfg: FleetSettings, rng: random.Random) -> Plan:
    """Sample one run: duration (lognormal around the median), outcome, throughput.

    Draws are made in a fixed order whatever the knobs, so changing one knob never shifts the others.
    """
    z_time, u_fail, z_rate = rng.gauss(0.0, 1.0), rng.random(), rng.gauss(0.0, 1.0)
    env = {v.name: v.value for v in msg.env if v.name and v.value is not None}
    try:
        median = _number(env, ENV_SECONDS, cfg.median_s, low=0.0)
        sigma = _number(env, ENV_SIGMA, cfg.sigma, low=0.0)
        rate = _number(env, ENV_FAILURE_RATE, None, low=0.0, high=1.0)
        units = _number(env, ENV_UNITS, None, low=0.0)
        code = int(_number(env, ENV_EXIT, 0.0, low=0.0, high=255.0, whole=True) or 0)
        fail_attempts = int(_number(env, ENV_FAIL_ATTEMPTS, 0.0, low=0.0, whole=True) or 0)
    except ValueError as e:
        # The Job's own mistake, like a command that cannot start: an Error, counted against backoffLimit.
        return Plan(0.0, "Error", None, f"{e} (simulated run)", None)
    seconds = (median or 0.0) * math.exp((sigma or 0.0) * z_time)
    # NODUS_SIM_EXIT alone makes every run end with that code; a failure rate (the Job's, else the
    # fleet's) makes that share of runs end with it (or 1); NODUS_SIM_FAIL_ATTEMPTS fails the first tries.
    by_chance = u_fail < rate if rate is not None else code != 0 or u_fail < cfg.failure_rate
    fails = by_chance or msg.attempt_no <= fail_attempts
    exit_code = (code or 1) if fails else 0
    base = units if units is not None else cfg.units_per_second * shape.speed
    throughput = Decimal(f"{base * math.exp(THROUGHPUT_SIGMA * z_rate):.1f}")
    timeout = msg.timeout_seconds
    if timeout is not None and seconds > timeout:
        message = f"the attempt ran past its timeout of {timeout}s"
        return Plan(float(timeout), "DeadlineExceeded", SIGTERM_EXIT, message, throughput)
    if exit_code:
        return Plan(
            seconds, "Error", exit_code, f"the program {processes.describe_exit(exit_code)}", throughput
        )
    return Plan(seconds, "Completed", 0, None, throughput)


def _number(
    env: dict[str, str],
    key: str,
    default: float | None,
    *,
    low: float | None = None,
    high: float | None = None,
    whole: bool = False,
) -> float | None:
    raw = env.get(key)
    if raw is None or not raw.strip():
        return default
    try:
        value = int(raw) if whole else float(raw)
    except ValueError:
        raise ValueError(f"{key}={raw!r} is not a {'whole ' if whole else ''}number") from None
    if not math.isfinite(value) or (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{key}={raw!r} is out of range [{low}, {high if high is not None else 'inf'}]")
    return float(value)


# -- the journal ----------------------------------------------------------------------------------------
class Entry(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel"):
    """One line of the journal: an attempt's record from now on, or the mark that its finish was sent."""

    namespace: str
    attempt: str
    node: str
    record: Record | None = None
    reported: bool = False


@dataclass(slots=True)
class Known:
    node: str
    record: Record


class Journal:
    """The fleet's durable memory: JSON lines, appended, fsynced once per batch, compacted at start.

    It plays the part of the real agent's ``record.json`` files: what a node ran, runs and ran."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._encoder = msgspec.json.Encoder()
        self._file: Any = None
        self._written = 0  # durable entries appended
        self._synced = 0  # of those, how many an fsync has covered
        self._lock = asyncio.Lock()  # one fsync at a time; a caller whose entries it covered is done

    def load(self) -> dict[tuple[str, str], Known]:
        """Fold the journal into the latest record per attempt, and rewrite it as just that."""
        known: dict[tuple[str, str], Known] = {}
        decoder = msgspec.json.Decoder(Entry)
        if self.path.exists():
            with self.path.open("rb") as f:
                for n, line in enumerate(f, 1):
                    try:
                        e = decoder.decode(line)
                    except msgspec.DecodeError:
                        # Only the last line can be torn (a crash mid-append): everything before it holds.
                        log.warning(
                            "journal line %d unreadable: skipped", n, extra={"journal": str(self.path)}
                        )
                        continue
                    key = (e.namespace, e.attempt)
                    if e.record is not None:
                        known[key] = Known(e.node, e.record)
                    elif e.reported and key in known:
                        rec = known[key].record
                        known[key].record = msgspec.structs.replace(rec, reported=True)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("wb") as f:
            for (ns, attempt), k in known.items():
                f.write(self._line(Entry(namespace=ns, attempt=attempt, node=k.node, record=k.record)))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self._file = self.path.open("ab")
        return known

    def _line(self, entry: Entry) -> bytes:
        return self._encoder.encode(entry) + b"\n"

    def append(self, entry: Entry, *, durable: bool = True) -> None:
        """Append; ``durable`` entries make the next :meth:`sync` write to disk (others ride along)."""
        self._file.write(self._line(entry))
        if durable:
            self._written += 1

    async def sync(self) -> None:
        """Return once every durable entry appended so far is on disk (fsync off the event loop; callers
        that arrive while one runs share the next)."""
        target = self._written
        if self._synced >= target:
            return
        async with self._lock:
            if self._synced >= target:
                return  # the fsync we waited for covered ours
            mark = self._written
            self._file.flush()
            await asyncio.to_thread(os.fsync, self._file.fileno())
            self._synced = mark

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(Exception):
                self._file.flush()
            self._file.close()
            self._file = None


# -- nodes and runs -------------------------------------------------------------------------------------
class SimRegistration(Registration):
    """The real agent's registration, plus the simulated label and a cached Node: a beat is one write."""

    def __init__(
        self, store: ObjectStore[Node], settings: AgentSettings, inventory: Inventory, fleet: str
    ) -> None:
        super().__init__(store, settings, inventory)
        self.fleet = fleet
        self.node: Node | None = None

    async def register(self) -> Node:
        self.node = await super().register()
        return self.node

    async def beat(self) -> Node:
        cached = self.node
        if cached is not None:
            wanted = self._beat(cached)
            if wanted == cached:
                return cached  # same second as the last write: nothing to say
            try:
                self.node = await self.store.update(wanted)
                return self.node
            except (Conflict, NotFound):
                pass  # someone else wrote it, or deleted it: the agent's own path re-reads or registers
        self.node = await super().beat()
        return self.node

    def _ready(self, node: Node) -> Node:
        ready = super()._ready(node)
        labels = {**ready.metadata.labels, LABEL_SIMULATED: self.fleet}
        return msgspec.structs.replace(ready, metadata=msgspec.structs.replace(ready.metadata, labels=labels))


@dataclass(eq=False)
class SimNode:
    name: str
    shape: NodeShape
    registration: SimRegistration
    reporter: Reporter
    alive: bool = True


@dataclass(eq=False, slots=True)
class SimRun:
    node: SimNode
    namespace: str
    attempt: str
    plan: Plan
    rng: random.Random
    record: Record
    began: float = 0.0  # loop time the run started (once recorded)
    end_at: float = 0.0
    next_progress_at: float = math.inf
    progress_n: int = 0
    last_rate: Decimal | None = None
    handle: asyncio.TimerHandle | None = None
    done: bool = False
    """Its end is decided (timer fired, stopped, or vanished): nothing else may end it."""
    outcome: tuple[str, int | None, int, str | None, Decimal | None] | None = None
    ctx: contextvars.Context | None = None
    """The StartAttempt's context (request id, trace): the run's reports carry it, as the real agent's."""


@dataclass
class _Chunk:
    durable: str
    nodes: list[str]
    sub: Any = None
    task: asyncio.Task[None] | None = None

    @property
    def subjects(self) -> list[str]:
        return [ASSIGN_PREFIX + n for n in self.nodes]

    def config(self) -> ConsumerConfig:
        return ConsumerConfig(
            name=self.durable,
            durable_name=self.durable,
            filter_subjects=self.subjects,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=30.0,
            # No server-side max_deliver: an assignment for a vanished node waits for it (MAX_DELIVER
            # counts handler failures in the loop); enough pending room for every node's backlog.
            max_ack_pending=max(1000, 4 * len(self.nodes)),
        )


PostSync = Callable[[], None]


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
        self._decoder: msgspec.json.Decoder[StartAttempt | StopAttempt] = msgspec.json.Decoder(Assignment)
        self._stopping = asyncio.Event()
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
        for chunk in self.chunks:
            chunk.task = asyncio.create_task(self._consume(chunk), name=f"sim:{chunk.durable}")
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
        self._stopping.set()
        for chunk in self.chunks:
            if chunk.task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await chunk.task
            if chunk.sub is not None:
                with contextlib.suppress(Exception):
                    await chunk.sub.unsubscribe()

    async def _cancel_pump(self) -> None:
        if self._pump_task is not None:
            self._pump_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump_task
            self._pump_task = None

    def _fatal(self, error: BaseException) -> None:
        log.critical("the fleet's journal cannot be written: it stops taking work (%s)", error)
        self._stopping.set()
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
        """Every node beats once per interval, node ``i`` at ``i/N`` of it: a steady trickle of writes."""
        loop = asyncio.get_running_loop()
        period = self.settings.heartbeat_s
        cycle = loop.time() + period  # registration just wrote every heartbeat
        await asyncio.sleep(period)
        while True:
            order = list(self.nodes.values())
            n, done = len(order), 0
            while done < n:
                due = min(n, int((loop.time() - cycle) / period * n) + 1)
                if due > done:
                    batch = [node for node in order[done:due] if node.alive]
                    done = due
                    await asyncio.gather(*(self._beat(node) for node in batch))
                if done < n:
                    await asyncio.sleep(max(cycle + done * period / n - loop.time(), MIN_TICK_S))
            cycle = max(cycle + period, loop.time())
            await asyncio.sleep(max(cycle - loop.time(), 0.0))

    async def _beat(self, node: SimNode) -> None:
        try:
            await node.registration.beat()
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
            chunk.sub = await self.js.pull_subscribe_bind(durable=chunk.durable, stream=ASSIGNMENTS)

    async def _consume(self, chunk: _Chunk) -> None:
        while not self._stopping.is_set():
            try:
                msgs = await chunk.sub.fetch(FETCH_BATCH, timeout=1.0)
            except (TimeoutError, NatsTimeout):
                continue
            except NotFoundError:  # the durable is gone (deleted by hand, a server that lost its store)
                await asyncio.sleep(0.5)
                with contextlib.suppress(Exception):
                    await self.js.add_consumer(ASSIGNMENTS, chunk.config())
                continue
            except Exception as e:
                log.warning("fetch failed: %s", e, extra={"consumer": chunk.durable})
                await asyncio.sleep(0.5)
                continue
            try:
                await self._handle_batch(chunk, msgs)
            except OSError as e:
                # The journal could not be written: nothing of the batch is acknowledged (all of it comes
                # again, to a fleet that can record it), and this one stops taking work.
                self._fatal(e)
                return

    async def _handle_batch(self, chunk: _Chunk, msgs: list[Msg]) -> None:
        """Decide every message, record the decisions with one fsync, then act and acknowledge."""
        after: list[PostSync] = []
        replies: list[tuple[Msg, str, str]] = []  # (msg, ack|wait|retry|dead, reason)
        for msg in msgs:
            replies.append((msg, *self._decide(msg, after)))
        await self.journal.sync()
        for action in after:
            action()
        self._wake.set()
        for msg, verdict, reason in replies:
            try:
                if verdict == "ack":
                    await msg.ack()
                elif verdict == "wait":
                    await msg.nak(delay=VANISHED_RETRY_S)
                elif verdict == "retry":
                    await msg.nak(delay=backoff(int(msg.metadata.num_delivered)))
                else:
                    await self._dead(chunk, msg, reason)
            except Exception as e:  # not acknowledged: redelivered, and the journal says what was done
                log.warning("could not answer an assignment: %s", e, extra={"subject": msg.subject})

    def _decide(self, msg: Msg, after: list[PostSync]) -> tuple[str, str]:
        node = self.nodes.get(msg.subject[len(ASSIGN_PREFIX) :])
        if node is None:
            return "dead", f"{msg.subject} is not a node of fleet {self.settings.fleet}"
        if not node.alive:
            return "wait", ""
        try:
            data = self._decoder.decode(msg.data)
        except msgspec.DecodeError as e:
            return "dead", f"undecodable: {e}"
        for what, name in (("namespace", data.namespace), ("attempt", data.attempt)):
            if not attemptdir.valid_name(name):
                return "dead", f"{what} {name!r} is not a DNS label"
        if isinstance(data, StartAttempt) and data.node != node.name:
            return "dead", f"StartAttempt for node {data.node!r} reached node {node.name!r}"
        headers = msg.headers or {}
        outer = tracing.current_request_id()
        tracing.set_request_id(headers.get(tracing.REQUEST_ID))
        try:
            with tracing.tracer.start_as_current_span(
                f"consume {msg.subject}", context=tracing.extract(headers)
            ):
                if isinstance(data, StartAttempt):
                    self._start(node, data, after)
                else:
                    self._stop(node, data, after)
        except Exception as e:
            log.exception("assignment failed", extra={"subject": msg.subject})
            if int(msg.metadata.num_delivered) >= MAX_DELIVER:
                return "dead", f"gave up after {msg.metadata.num_delivered} deliveries: {e}"
            return "retry", ""
        finally:
            tracing.set_request_id(outer)
        return "ack", ""

    async def _dead(self, chunk: _Chunk, msg: Msg, reason: str) -> None:
        headers = {**(msg.headers or {}), DEAD_REASON: reason[:1000], DEAD_SUBJECT: msg.subject}
        headers[MSG_ID] = f"dead:{ASSIGNMENTS}:{msg.metadata.sequence.stream}"
        await self.js.publish(f"nodus.dead.{ASSIGNMENTS}.{chunk.durable}", msg.data, headers=headers)
        await msg.term()
        self.stats["dead"] += 1
        log.error("dead-lettered: %s", reason, extra={"consumer": chunk.durable, "subject": msg.subject})

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
        plan = plan_run(msg, node.shape, self.settings, rng)
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
        """Once the start is durable: AttemptStarted goes out and the run's clock starts."""
        assert self._loop is not None
        started = run.record.started or now_rfc3339()
        # A simulated node boots nothing: its program starts when the run does (both on its clock).
        ms = run.record.started_epoch_ms
        report = functools.partial(
            run.node.reporter.started, run.namespace, run.attempt, started, started_ms=ms, program_ms=ms
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


# -- the process ----------------------------------------------------------------------------------------
class FleetService(Service):
    """``python -m nodus_agent.simulating``: a fleet as a service (logs, /readyz, SIGTERM)."""

    name = "nodus-sim-fleet"
    fleet: SimulatedFleet | None = None

    async def start(self) -> None:
        settings = FleetSettings.from_env(self.settings.env)
        # A fleet that cannot record what it does stops the process, rather than run on without memory.
        self.fleet = await SimulatedFleet(self.bus, settings, on_fatal=lambda _: self.stopping.set()).start()

    async def stop(self) -> None:
        if self.fleet is not None:
            await self.fleet.stop()

    def checks(self) -> dict[str, Check]:
        async def registered() -> bool:
            return self.fleet is not None and self.fleet.registered

        return {**super().checks(), "registered": registered}


_FLAGS: tuple[tuple[str, str, str], ...] = (
    ("--fleet", "NODUS_FLEET_NAME", "fleet name: nodes are sim-<fleet>-<i> (default sim)"),
    ("--nodes", "NODUS_FLEET_NODES", "number of nodes (default 100)"),
    (
        "--offerings",
        "NODUS_FLEET_OFFERINGS",
        "comma-separated offerings, round robin (default h100-sxm-80g-x1-us)",
    ),
    ("--pool", "NODUS_FLEET_POOL", "pool of every node"),
    ("--heartbeat-s", "NODUS_FLEET_HEARTBEAT_S", "heartbeat interval of each node (default 5)"),
    ("--median-s", "NODUS_FLEET_MEDIAN_S", "median run time in seconds (default 30; NODUS_SIM_SECONDS)"),
    ("--sigma", "NODUS_FLEET_SIGMA", "lognormal spread of run times (default 0.5; NODUS_SIM_SIGMA)"),
    ("--failure-rate", "NODUS_FLEET_FAILURE_RATE", "probability a run exits 1 (default 0)"),
    ("--units-per-second", "NODUS_FLEET_UNITS_PER_SECOND", "throughput of one L4-class GPU (default 100)"),
    ("--progress-s", "NODUS_FLEET_PROGRESS_S", "seconds between progress reports, 0 for none (default 5)"),
    ("--seed", "NODUS_FLEET_SEED", "random seed (default 1)"),
    ("--chunk", "NODUS_FLEET_CHUNK", "nodes per durable consumer (default 500)"),
    ("--workdir", "NODUS_FLEET_WORKDIR", "journal directory (default .nodus/sim/<fleet>)"),
    ("--catalog", "NODUS_FLEET_CATALOG", "price book JSON for exact offering shapes"),
    ("--nats-url", "NODUS_NATS_URL", "NATS server URLs (default nats://127.0.0.1:4222)"),
)


def main(argv: Iterable[str] | None = None) -> None:
    """Flags become ``NODUS_FLEET_*`` variables, so flags and the environment are one set of settings."""
    parser = argparse.ArgumentParser(
        prog="nodus-sim-fleet"
        if Path(sys.argv[0]).name == "nodus-sim-fleet"
        else "python -m nodus_agent.simulating",
        description="Run a simulated fleet of node agents in one process (docs/simulation.md).",
    )
    for flag, var, text in _FLAGS:
        parser.add_argument(flag, dest=var, metavar="VALUE", help=f"{text} [{var}]")
    args = parser.parse_args(list(argv) if argv is not None else sys.argv[1:])
    flags = {k: v for k, v in vars(args).items() if v is not None}
    try:  # fail before connecting, with the knob to fix
        settings = FleetSettings.from_env({**os.environ, **flags})
        catalog = load_catalog(settings.catalog)
        for offering in settings.offerings:
            shape_of(offering, catalog)
    except (ValueError, OSError, msgspec.DecodeError) as e:
        parser.error(str(e))
    os.environ.update(flags)  # the service reads its settings from the environment
    run_service(FleetService)


if __name__ == "__main__":
    main()
