"""Run history for estimates: how long similar finished Jobs ran, read from the jobs bucket, summarised per
kind of Job (namespace, image, GPU request, gang size) and refreshed in the background; and the run band
an estimate uses (spec.expectedDuration first, then that history, then the default hour). Memory is bounded
whatever the size of the jobs bucket. Used by :mod:`nodus_scheduler.estimating`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Final

from nodus_kit.storing import ObjectStore
from nodus_scheduler.placing import request_of
from nodus_schema.estimating import HISTORY_MIN_SAMPLES, duration_band, history_band
from nodus_schema.jobs import Job, JobSpec
from nodus_schema.quantities import parse_bytes, parse_duration

log = logging.getLogger(__name__)

HISTORY_REFRESH_S: Final = 60.0
"""How old the run-history summary may get before the next request starts a refresh in the background."""
HISTORY_RUNS: Final = 20
"""Runs kept per kind of Job (namespace, image, GPU request, gang size): the most recent ones."""
HISTORY_KEYS: Final = 10_000
"""Kinds of Job kept; beyond it, those whose latest run is the oldest are dropped. Memory is bounded by
HISTORY_KEYS × HISTORY_RUNS integers, whatever the size of the jobs bucket."""
HISTORY_FIRST_WAIT_S: Final = 0.5
"""How long a request waits for the first load of the history (only while it is in flight); after that it
is answered without history. The gateway's timeout is 2 s."""


# ---------------------------------------------------------------------------------------------------------
# Run history: how long similar Jobs ran, read from the jobs bucket, summarised, refreshed periodically
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HistoryKey:
    """What makes finished Jobs similar: the namespace, the image, the GPU request and the gang size."""

    namespace: str
    image: str
    gpu: str
    nodes: int


def _gpu_key(spec: JobSpec) -> str:
    """A canonical text of the GPU request: type names upper-cased and sorted, count, and the floors."""
    r = request_of(spec)
    if r is None:
        return "-"
    parts = [",".join(sorted(t.upper() for t in r.type)), str(r.count or 1)]
    if r.exact:
        parts.append("exact")
    if r.interconnect and r.interconnect != "Any":
        parts.append(r.interconnect)
    if r.min_memory:
        try:
            parts.append(f"min{parse_bytes(r.min_memory)}")
        except ValueError:
            parts.append(f"min{r.min_memory}")
    return ":".join(parts)


def gang_of(spec: JobSpec) -> tuple[int, int | None]:
    """(nodes, gpus per node if known) of a spec; nodes is 1 for a plain Job."""
    d = spec.distributed
    request = request_of(spec)
    per_node = (d.gpus_per_node if d else None) or (request.count if request else None)
    if d and d.nodes:
        return d.nodes, per_node
    if d and d.total_gpus and per_node:
        return max(1, d.total_gpus // per_node), per_node
    res_nodes = spec.resources.nodes if spec.resources else None
    return max(1, res_nodes or 1), per_node


def history_key(namespace: str, spec: JobSpec) -> HistoryKey | None:
    """The key of a spec's kind of Job; None when it has no image to match by."""
    image = spec.image or spec.image_ref
    if not image:
        return None
    return HistoryKey(namespace, image, _gpu_key(spec), gang_of(spec)[0])


def run_seconds_of(job: Job) -> int | None:
    """The run time of one index of a Succeeded Job, from ``status.wallSeconds``, or None.

    The wall time spans every wave of indexes (⌈completions / parallelism⌉ of them), so one index ran about
    wall ÷ waves (rounded up). It also includes the start of the first wave, so the history errs long, as
    estimates should. Failed and cancelled Jobs say nothing about how long a run that works takes."""
    st = job.status
    if st.phase != "Succeeded" or st.wall_seconds is None or st.wall_seconds <= 0:
        return None
    completions = max(1, job.spec.completions or 1)
    parallelism = max(1, min(job.spec.parallelism or 1, completions))
    waves = -(-completions // parallelism)
    return -(-st.wall_seconds // waves)


class RunHistory:
    """A bounded summary of finished runs per :class:`HistoryKey`: the last :data:`HISTORY_RUNS` run times
    of at most :data:`HISTORY_KEYS` kinds of Job.

    Built from one list of the jobs bucket (:meth:`refresh`), never per request: :meth:`maybe_refresh`
    starts a refresh in the background when the summary is older than :data:`HISTORY_REFRESH_S`, and
    requests read whatever summary is current. Without a store (``jobs=None``) it holds what :meth:`load`
    was given, for tests and tools.
    """

    def __init__(
        self,
        jobs: ObjectStore[Job] | None = None,
        *,
        refresh_s: float = HISTORY_REFRESH_S,
        runs_per_key: int = HISTORY_RUNS,
        max_keys: int = HISTORY_KEYS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.jobs = jobs
        self.refresh_s = refresh_s
        self.runs_per_key = runs_per_key
        self.max_keys = max_keys
        self.clock = clock
        self.loaded = False
        self.failed: str | None = None
        self._runs: dict[HistoryKey, tuple[int, ...]] = {}
        self._loaded_at: float | None = None
        self._task: asyncio.Task[None] | None = None

    def load(self, jobs: Iterable[Job]) -> None:
        """Replace the summary with the finished runs of ``jobs``."""
        found: dict[HistoryKey, list[tuple[str, int]]] = {}
        for job in jobs:
            seconds = run_seconds_of(job)
            if seconds is None:
                continue
            key = history_key(job.metadata.namespace or "", job.spec)
            if key is not None:
                found.setdefault(key, []).append((job.status.completion_time or "", seconds))
        newest: dict[HistoryKey, list[tuple[str, int]]] = {}
        for key, runs in found.items():
            runs.sort()  # RFC 3339 UTC times sort as text; the most recent last
            newest[key] = runs[-self.runs_per_key :]
        if len(newest) > self.max_keys:
            kept = sorted(newest, key=lambda k: newest[k][-1][0], reverse=True)[: self.max_keys]
            newest = {k: newest[k] for k in kept}
        self._runs = {k: tuple(s for _, s in v) for k, v in newest.items()}
        self.loaded, self.failed, self._loaded_at = True, None, self.clock()

    def runs(self, key: HistoryKey | None) -> tuple[int, ...]:
        """The run times (seconds) of the most recent finished runs of this kind, oldest first."""
        return self._runs.get(key, ()) if key is not None else ()

    def band(self, key: HistoryKey | None) -> tuple[timedelta, timedelta] | None:
        """(p50, p90) of the runs of this kind (:func:`nodus_schema.estimating.history_band`), or None."""
        return history_band(self.runs(key))

    def __len__(self) -> int:
        return len(self._runs)

    async def refresh(self) -> None:
        """List the jobs bucket once and replace the summary."""
        if self.jobs is None:
            return
        self.load((await self.jobs.list()).items)

    async def _refresh_logged(self) -> None:
        try:
            await self.refresh()
        except Exception as e:  # the estimate goes on without history; the next refresh tries again
            self.failed, self._loaded_at = str(e) or type(e).__name__, self.clock()
            log.warning("run history not refreshed: %s", e)

    def maybe_refresh(self) -> asyncio.Task[None] | None:
        """Start a refresh in the background if the summary is stale and none is in flight; the task
        started, if one was."""
        if self.jobs is None or (self._task is not None and not self._task.done()):
            return None
        if self._loaded_at is not None and self.clock() - self._loaded_at < self.refresh_s:
            return None
        self._task = asyncio.get_running_loop().create_task(self._refresh_logged())
        return self._task

    async def ready(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the first load, if it is in flight; at once otherwise."""
        task = self._task
        if self.loaded or task is None or task.done():
            return
        await asyncio.wait({task}, timeout=timeout)

    def why_none(self, key: HistoryKey | None) -> str:
        """Why this kind of Job has no history band (for the NoHistory warning)."""
        if key is None:
            return "the spec has no image to match finished Jobs by"
        if not self.loaded and self.jobs is None:
            return "no run history is kept"
        if not self.loaded:
            return (
                f"run history is not available ({self.failed})"
                if self.failed
                else "run history is still loading"
            )
        n = len(self.runs(key))
        gpu = "no GPU" if key.gpu == "-" else f"GPU {key.gpu}"
        gang = f", {key.nodes} nodes" if key.nodes > 1 else ""
        return (
            f"{n} succeeded Job{'s' if n != 1 else ''} with image {key.image} and {gpu}{gang} in namespace "
            f"{key.namespace} recorded a wall time; {HISTORY_MIN_SAMPLES} are needed"
        )


# ---------------------------------------------------------------------------------------------------------
# The run band: declared, else history, else the default
# ---------------------------------------------------------------------------------------------------------

DECLARED, HISTORY, DEFAULT = "Declared", "History", "Default"


@dataclass(frozen=True, slots=True)
class RunBand:
    """The run time of one index (p50, p90), where it came from, and what spec.timeout cut off."""

    p50: timedelta
    p90: timedelta
    source: str
    """DECLARED (spec.expectedDuration), HISTORY or DEFAULT."""
    runs: int = 0
    """History runs behind a HISTORY band."""
    uncapped: tuple[timedelta, timedelta] | None = None
    """(p50, p90) before spec.timeout capped them, when it capped the p90."""


def run_band(spec: JobSpec, key: HistoryKey | None, history: RunHistory | None) -> RunBand:
    """spec.expectedDuration (p90 1.5 ×), else the history band of ``key``, else the default hour (p90
    1.5 ×); both capped at spec.timeout. Raises ValueError for a duration that does not parse."""
    band = history.band(key) if history is not None and not spec.expected_duration else None
    if band is not None and history is not None:
        p50, p90, source, runs = band[0], band[1], HISTORY, len(history.runs(key))
    else:
        p50, p90, assumed = duration_band(spec.expected_duration)
        source, runs = (DEFAULT if assumed else DECLARED), 0
    uncapped = None
    limit = parse_duration(spec.timeout) if spec.timeout else None
    if limit is not None and limit > timedelta(0):
        if p90 > limit:
            uncapped = (p50, p90)
        p50, p90 = min(p50, limit), min(p90, limit)
    return RunBand(p50, p90, source, runs, uncapped)
