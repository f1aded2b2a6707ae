"""Conditions to wait for (``client.wait_for(sweep, finished, timeout=600)``), and the wait's timeout.

A condition is any ``Callable[[obj], bool]``; these are the common ones. A wait watches the one object
(a field selector on its name), so it returns as soon as the change arrives, without polling.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nodus_schema import TERMINAL_PHASES

Condition = Callable[[Any], bool]


class WaitTimeout(TimeoutError):
    """The condition did not hold within the timeout; ``last`` is the object as last seen (or None)."""

    def __init__(self, what: str, timeout: float, last: Any) -> None:
        super().__init__(f"{what}: the condition did not hold within {timeout}s")
        self.last = last


def phase(obj: Any) -> str | None:
    status = getattr(obj, "status", None)
    return getattr(status, "phase", None)


def finished(obj: Any) -> bool:
    """A Job or Sweep reached a terminal phase (Succeeded, Failed or Cancelled)."""
    return phase(obj) in TERMINAL_PHASES


def succeeded(obj: Any) -> bool:
    return phase(obj) == "Succeeded"


def settled(obj: Any) -> bool:
    """Finished, and its final charge posted (``status.cost.final``): the cost will not change again."""
    cost = getattr(getattr(obj, "status", None), "cost", None)
    return finished(obj) and bool(cost is not None and cost.final)


def phase_in(*phases: str) -> Condition:
    """The object's phase is one of ``phases`` (``phase_in("Running", "Succeeded")``)."""

    def condition(obj: Any) -> bool:
        return phase(obj) in phases

    return condition
