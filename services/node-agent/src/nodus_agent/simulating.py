"""A simulated fleet (issue #5) as a process: ``python -m nodus_agent.simulating`` and ``nodus-sim-fleet``.

The fleet itself is :mod:`nodus_agent.fleet` (its nodes and runs in :mod:`nodus_agent.fleetnodes`, its
journal in :mod:`nodus_agent.journaling`, its knobs and run plans in :mod:`nodus_agent.fleetplanning`);
docs/simulation.md says what it simulates. The names callers use are re-exported here.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Iterable
from pathlib import Path

import msgspec

from nodus_agent.fleet import ASSIGNMENTS, LOST_ON_REVIVE, SimulatedFleet
from nodus_agent.fleetnodes import LABEL_SIMULATED
from nodus_agent.fleetplanning import (
    FleetSettings,
    load_catalog,
    node_name,
    plan_run,
    run_rng,
    shape_of,
)
from nodus_kit.servicing import Check, Service
from nodus_kit.servicing import main as run_service

__all__ = [
    "ASSIGNMENTS",
    "LABEL_SIMULATED",
    "LOST_ON_REVIVE",
    "FleetService",
    "FleetSettings",
    "SimulatedFleet",
    "main",
    "node_name",
    "plan_run",
    "run_rng",
    "shape_of",
]

log = logging.getLogger(__name__)


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
    ("--record-s", "NODUS_FLEET_RECORD_S", "each node's record refresh (default 60)"),
    ("--median-s", "NODUS_FLEET_MEDIAN_S", "median run time in seconds (default 30; NODUS_SIM_SECONDS)"),
    ("--sigma", "NODUS_FLEET_SIGMA", "lognormal spread of run times (default 0.5; NODUS_SIM_SIGMA)"),
    ("--failure-rate", "NODUS_FLEET_FAILURE_RATE", "probability a run exits 1 (default 0)"),
    ("--units-per-second", "NODUS_FLEET_UNITS_PER_SECOND", "throughput of one L4-class GPU (default 100)"),
    ("--progress-s", "NODUS_FLEET_PROGRESS_S", "seconds between progress reports, 0 for none (default 5)"),
    ("--boot-s", "NODUS_FLEET_BOOT_S", "seconds from a run's start to its program, cold node (default 0)"),
    (
        "--warm-boot-s",
        "NODUS_FLEET_WARM_BOOT_S",
        "the same on a node kept warm for the project with the same image (default 0)",
    ),
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
