"""Killing the scheduler (SIGKILL, a real process) again and again while a 1,000-index Job runs."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nodus_schema.messages import StartAttempt
from nodus_testing.waiting import eventually

pytestmark = pytest.mark.slow

INDEXES = 1000
KILLS = 10


def _scheduler(url: str, seed: Path | None, log: Any) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "NODUS_NATS_URL": url,
        "NODUS_NATS_NKEY_SEED": str(seed),
        # The same replica name each time: the new process takes its own (dead) lease at once.
        "NODUS_REPLICA": "crashing",
        "NODUS_LOG_LEVEL": "WARNING",
        "NODUS_RESYNC_S": "2",
        "NODUS_FUNDING": "off",  # no billing in this rig
    }
    return subprocess.Popen(
        [sys.executable, "-m", "nodus_scheduler"], env=env, stdout=log, stderr=subprocess.STDOUT
    )


@pytest.mark.timeout(300)
async def test_killing_the_scheduler_ten_times_loses_no_index_and_runs_none_twice(
    make_rig: Callable[..., Any], tmp_path: Any
) -> None:
    rng = random.Random(7)

    def short_run(_: StartAttempt) -> tuple[float, int]:
        return (rng.uniform(0.02, 0.2), 0)

    async with make_rig(short_run, nodes=100, scheduler=False) as rig:
        await rig.submit("big", completions=INDEXES, parallelism=100)
        log = (tmp_path / "scheduler.log").open("ab")
        proc = _scheduler(rig.server.url, rig.server.harness_seed, log)
        try:
            for kill in range(KILLS):
                # Let it make some progress, then kill it where it stands (no graceful shutdown).
                floor = len(rig.fleet.started) + 40
                await eventually(
                    lambda floor=floor: len(rig.fleet.started) >= floor,
                    deadline_s=60,
                    message=f"no progress before kill {kill + 1}",
                )
                proc.kill()
                proc.wait(timeout=10)
                proc = _scheduler(rig.server.url, rig.server.harness_seed, log)
            job = await eventually(
                lambda: _finished(rig), deadline_s=180, message="the Job never finished after the kills"
            )
        finally:
            proc.kill()
            proc.wait(timeout=10)
            log.close()
        assert rig.fleet.overlaps == []  # never two runs of one index at once
        st = job.status
        assert (st.phase, st.succeeded, st.failed, st.completed_indexes) == (
            "Succeeded",
            INDEXES,
            0,
            f"0-{INDEXES - 1}",
        )
        attempts = await rig.attempts_of("big")
        succeeded = Counter(a.spec.index for a in attempts if a.status.phase == "Succeeded")
        assert set(succeeded) == set(range(INDEXES))
        assert max(succeeded.values()) == 1  # each index succeeded exactly once
        started = Counter(s.index for s in rig.fleet.started)
        assert started == Counter({i: 1 for i in range(INDEXES)})  # and ran once: nothing was lost


async def _finished(rig: Any) -> Any:
    job = await rig.job("big")
    return job if job.status.phase in ("Succeeded", "Failed") else None
