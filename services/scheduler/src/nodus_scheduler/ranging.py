"""A stored Job read within the ranges admission keeps to, so no value can crash or hang a reconcile.

The gateway refuses every number and duration outside its documented range (``nodus_schema.ranges``), but
a Job written before that (or straight into the store) may still carry one: a ``ttlSecondsAfterFinished``
of 2^63 is past what a timedelta holds, a ``timeout`` of ``99999999999999h`` does not even parse into one,
and ``completions`` of 2^63 would have the scheduler list that many indexes. Each would fail the Job's
reconcile, and the retry fail again, for ever. :func:`within_ranges` gives the lifecycle the Job with
every such value clamped to its range, so it runs as the largest Job admission lets through would:

* ``ttlSecondsAfterFinished`` to [0, 2^31 - 1] seconds;
* ``timeout``, ``placement.queueTimeout`` and ``recovery.minProgressDuration`` to at most
  :data:`~nodus_schema.quantities.MAX_DURATION` (a value that does not parse at all: its default, and no
  limit for a timeout);
* ``distributed.startupTimeout`` to at most 60m (unreadable: the default 15m); a shorter one than
  admission's 5m cannot hang or crash anything, so it is kept (tests assemble gangs in seconds);
* ``completions`` to 1-10000 and ``parallelism`` to 1-256.

Only what the scheduler reads is changed, and only in memory: the stored spec stays as written (the status
is the only part the scheduler writes). Each clamp is logged once per Job generation.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any, Final

import msgspec

from nodus_schema.jobs import Job
from nodus_schema.quantities import MAX_DURATION, MAX_INT32, format_duration, parse_duration

__all__ = ["within_ranges"]

log = logging.getLogger(__name__)

MAX_COMPLETIONS: Final = 10_000
MAX_PARALLELISM: Final = 256
_MIN_STARTUP, _MAX_STARTUP = timedelta(0), timedelta(minutes=60)
_LOGGED_MAX: Final = 4096

_logged: set[tuple[str, int, str]] = set()


def _duration(text: str | None, lo: timedelta, hi: timedelta, unreadable: str | None) -> str | None:
    """``text`` itself when it reads as a duration in [lo, hi]; else the nearest bound, or ``unreadable``
    for a text that is no duration at all."""
    if text is None:
        return None
    try:
        d = parse_duration(text)
    except OverflowError:
        return format_duration(hi)
    except ValueError:
        return unreadable
    if d > hi:
        return format_duration(hi)
    if d < lo:
        return format_duration(lo)
    return text


def _int(value: int | None, lo: int, hi: int) -> int | None:
    return None if value is None else min(max(value, lo), hi)


def within_ranges(job: Job) -> Job:
    """``job`` as the lifecycle may read it: every value it turns into a timer, a datetime or a loop within
    the range admission keeps to (see the module's notes). The same object when nothing is out of range."""
    spec = job.spec
    changes: dict[str, Any] = {}
    ttl = _int(spec.ttl_seconds_after_finished, 0, MAX_INT32)
    if ttl != spec.ttl_seconds_after_finished:
        changes["ttl_seconds_after_finished"] = ttl
    timeout = _duration(spec.timeout, timedelta(0), MAX_DURATION, None)
    if timeout != spec.timeout:
        changes["timeout"] = timeout
    completions = _int(spec.completions, 1, MAX_COMPLETIONS)
    if completions != spec.completions:
        changes["completions"] = completions
    parallelism = _int(spec.parallelism, 1, MAX_PARALLELISM)
    if parallelism != spec.parallelism:
        changes["parallelism"] = parallelism
    p = spec.placement
    if p is not None:
        queue = _duration(p.queue_timeout, timedelta(0), MAX_DURATION, "24h")
        if queue != p.queue_timeout:
            changes["placement"] = msgspec.structs.replace(p, queue_timeout=queue)
    r = spec.recovery
    if r is not None:
        progress = _duration(r.min_progress_duration, timedelta(0), MAX_DURATION, None)
        if progress != r.min_progress_duration:
            changes["recovery"] = msgspec.structs.replace(r, min_progress_duration=progress)
    d = spec.distributed
    if d is not None:
        startup = _duration(d.startup_timeout, _MIN_STARTUP, _MAX_STARTUP, None)
        if startup != d.startup_timeout:
            changes["distributed"] = msgspec.structs.replace(d, startup_timeout=startup)
    if not changes:
        return job
    _log(job, changes)
    return msgspec.structs.replace(job, spec=msgspec.structs.replace(spec, **changes))


def _log(job: Job, changes: dict[str, Any]) -> None:
    meta = job.metadata
    key = (meta.uid or f"{meta.namespace}/{meta.name}", meta.generation or 0, ",".join(sorted(changes)))
    if key in _logged:
        return
    if len(_logged) >= _LOGGED_MAX:
        _logged.clear()
    _logged.add(key)
    log.warning(
        "the stored Job has values outside the admitted ranges; read within them",
        extra={"namespace": meta.namespace, "job": meta.name, "fields": sorted(changes)},
    )
