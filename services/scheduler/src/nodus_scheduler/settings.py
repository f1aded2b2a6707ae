"""The scheduler's own settings: every ``NODUS_*`` variable it reads, read once in ``start()``
(:func:`nodus_kit.configuring.read_settings`); a bad one stops it before it serves, naming the variable."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Final

from msgspec import Meta

from nodus_kit.configuring import Env
from nodus_kit.leasing import LeaderSettings
from nodus_scheduler.capacity import UNREACHABLE_GRACE

__all__ = ["DELETE_AFTER", "DELETE_AFTER_ENV", "UNREACHABLE_GRACE_ENV", "SchedulerSettings"]

UNREACHABLE_GRACE_ENV: Final = "NODUS_NODE_UNREACHABLE_GRACE_S"
DELETE_AFTER_ENV: Final = "NODUS_NODE_DELETE_AFTER_S"
DELETE_AFTER: Final = timedelta(days=1)
"""How long a node may be NotReady before its record is deleted (the default of NODUS_NODE_DELETE_AFTER_S)."""

Seconds = Annotated[float, Meta(gt=0)]


class SchedulerSettings(LeaderSettings, frozen=True, kw_only=True):
    """The lease TTL and resync period (:class:`~nodus_kit.leasing.LeaderSettings`), and the scheduler's."""

    catalog: Annotated[str | None, Env("NODUS_CATALOG")] = None
    """Another price book file; None: the one shipped in ``nodus_scheduler/data`` (cataloging.py)."""
    funding: Annotated[bool, Env("NODUS_FUNDING")] = True
    """Off: a fleet nobody pays for runs without billing's holds (funding.py)."""
    unreachable_grace_s: Annotated[Seconds, Env(UNREACHABLE_GRACE_ENV, "seconds")] = (
        UNREACHABLE_GRACE.total_seconds()
    )
    """NotReady for longer: a node leaves placement and its explanations (capacity.py)."""
    delete_after_s: Annotated[Seconds, Env(DELETE_AFTER_ENV, "seconds")] = DELETE_AFTER.total_seconds()
    """NotReady for longer: a node's record is deleted (retiring.py)."""
