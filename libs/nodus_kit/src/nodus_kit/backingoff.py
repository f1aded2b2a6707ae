"""Capped exponential backoff with jitter: the one way the kit and its services wait before a retry.

Retries that wait the same exponential (0.5 s, 1 s, 2 s, ...) stay in step: every agent that lost the
bus in the same outage, every message a handler failed on at once, comes back in the same instant, and
the load that failed them comes back with them. Waiting a random part of the exponential spreads them
out. AWS's "Exponential Backoff And Jitter" (Brooker, 2015) measured the variants; two are here:

* :meth:`Backoff.delay`, *full jitter*: the n-th retry waits ``uniform(0, min(cap, base * 2**(n-1)))``.
  Stateless: for a caller that counts its attempts already (a redelivery's number, a key's failures).
* :meth:`Backoff.pauses`, *decorrelated jitter*: each wait ``min(cap, uniform(base, 3 * last))``. For a
  retry loop that keeps no count, only its last pause.

Both take a :class:`random.Random` so that a test can fix the draws.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

_MAX_DOUBLINGS: Final = 64
"""Past 2**64 any base is over any cap; a bound keeps ``2 ** n`` from overflowing a float."""
_shared: Final = random.Random()


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential from ``base`` seconds, doubling per attempt, never over ``cap`` seconds."""

    base: float
    cap: float

    def __post_init__(self) -> None:
        if not 0 < self.base <= self.cap:
            raise ValueError(f"backoff needs 0 < base <= cap, got base={self.base} cap={self.cap}")

    def ceiling(self, attempt: int) -> float:
        """The exponential itself for the ``attempt``-th retry (1, 2, ...): ``base * 2**(attempt-1)``,
        capped. Every :meth:`delay` of that attempt is at most this."""
        doublings = min(max(attempt - 1, 0), _MAX_DOUBLINGS)
        return min(self.cap, self.base * 2.0**doublings)

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Full jitter: how long the ``attempt``-th retry waits, uniform in ``[0, ceiling(attempt)]``."""
        return (rng or _shared).uniform(0.0, self.ceiling(attempt))

    def pauses(self, rng: random.Random | None = None) -> Iterator[float]:
        """Decorrelated jitter: the waits of one retry loop, each in ``[base, cap]``, growing about
        threefold while the retries go on (``next(pauses)`` before each retry)."""
        draw = rng or _shared
        last = self.base
        while True:
            last = min(self.cap, draw.uniform(self.base, last * 3))
            yield last
