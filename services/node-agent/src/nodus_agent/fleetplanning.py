"""The simulated fleet's knobs and what they decide, with no I/O: the fleet's settings, a node's shape from
its offering, and each run's plan (how long it runs, how it ends, its throughput), a pure function of the seed
and the attempt. ``nodus_agent.simulating`` runs the fleet on the bus; docs/simulation.md lists the knobs.
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import msgspec

from nodus_agent import processes
from nodus_schema.messages import StartAttempt

# Knobs a Job may set in its spec's env (literal values), overriding the fleet's defaults.
ENV_SECONDS = "NODUS_SIM_SECONDS"
ENV_SIGMA = "NODUS_SIM_SIGMA"
ENV_EXIT = "NODUS_SIM_EXIT"
ENV_FAILURE_RATE = "NODUS_SIM_FAILURE_RATE"
ENV_FAIL_ATTEMPTS = "NODUS_SIM_FAIL_ATTEMPTS"
ENV_UNITS = "NODUS_SIM_UNITS_PER_SECOND"
ENV_BOOT = "NODUS_SIM_BOOT_SECONDS"
ENV_WARM_BOOT = "NODUS_SIM_WARM_BOOT_SECONDS"

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
    record_s: float = 60.0
    """How often each node's record is written while nothing changes; beats in between go on the bus."""
    median_s: float = 30.0
    sigma: float = 0.5
    failure_rate: float = 0.0
    units_per_second: float = 100.0
    """Median throughput of one GPU of speed 1 (an L4); a node's is this x family speed x GPUs."""
    progress_s: float = 5.0
    """Seconds between AttemptProgress reports of a run (0: none)."""
    boot_s: float = 0.0
    """Seconds from a run's start to its program's launch on a cold node (the image pull, the inputs)."""
    warm_boot_s: float = 0.0
    """The same on a node kept warm for the run's project that last ran its image (only the container)."""
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
        if self.heartbeat_s <= 0 or self.record_s <= 0:
            raise ValueError(f"heartbeat_s={self.heartbeat_s} and record_s={self.record_s} must be positive")
        if not 0 <= self.failure_rate <= 1:
            raise ValueError(f"failure_rate={self.failure_rate} must be between 0 and 1")
        if min(self.median_s, self.sigma, self.progress_s, self.units_per_second) < 0:
            raise ValueError("median_s, sigma, progress_s and units_per_second must not be negative")
        if self.boot_s < 0 or self.warm_boot_s < 0:
            raise ValueError("boot_s and warm_boot_s must not be negative")

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
            record_s=float(env.get("NODUS_FLEET_RECORD_S", str(cls.record_s))),
            median_s=float(env.get("NODUS_FLEET_MEDIAN_S", str(cls.median_s))),
            sigma=float(env.get("NODUS_FLEET_SIGMA", str(cls.sigma))),
            failure_rate=float(env.get("NODUS_FLEET_FAILURE_RATE", str(cls.failure_rate))),
            units_per_second=float(env.get("NODUS_FLEET_UNITS_PER_SECOND", str(cls.units_per_second))),
            progress_s=float(env.get("NODUS_FLEET_PROGRESS_S", str(cls.progress_s))),
            boot_s=float(env.get("NODUS_FLEET_BOOT_S", str(cls.boot_s))),
            warm_boot_s=float(env.get("NODUS_FLEET_WARM_BOOT_S", str(cls.warm_boot_s))),
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
    boot_seconds: float = 0.0
    """From the run's start to its program's launch: the cold or the warm boot (no draw: deterministic)."""


def run_rng(seed: int, msg: StartAttempt) -> random.Random:
    """The run's own generator: the same attempt of the same Job index samples the same run."""
    return random.Random(f"{seed}/{msg.namespace}/{msg.job}/{msg.index}/{msg.attempt_no}")


def plan_run(
    msg: StartAttempt, shape: NodeShape, cfg: FleetSettings, rng: random.Random, *, warm: bool = False
) -> Plan:
    """Sample one run: duration (lognormal around the median), outcome, throughput; its boot, the warm one
    when ``warm`` (the node was kept warm for the project and last ran this image).

    Draws are made in a fixed order whatever the knobs, so changing one knob never shifts the others.
    """
    plan = _sample(msg, shape, cfg, rng)
    env = {v.name: v.value for v in msg.env if v.name and v.value is not None}
    try:
        cold = _number(env, ENV_BOOT, cfg.boot_s, low=0.0) or 0.0
        hot = _number(env, ENV_WARM_BOOT, cfg.warm_boot_s, low=0.0) or 0.0
    except ValueError as e:
        return Plan(0.0, "Error", None, f"{e} (simulated run)", None)
    return dataclasses.replace(plan, boot_seconds=hot if warm else cold)


def _sample(msg: StartAttempt, shape: NodeShape, cfg: FleetSettings, rng: random.Random) -> Plan:
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
