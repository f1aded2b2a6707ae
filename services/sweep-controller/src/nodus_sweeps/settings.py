"""The sweep controller's settings: every ``NODUS_*`` variable it reads, read once in ``start()``
(:func:`nodus_kit.configuring.read_settings`); a bad one stops it before it serves, naming the variable."""

from __future__ import annotations

from nodus_kit.leasing import LeaderSettings

__all__ = ["SweepsSettings"]


class SweepsSettings(LeaderSettings, frozen=True, kw_only=True):
    """The lease TTL and resync period (:class:`~nodus_kit.leasing.LeaderSettings`): the sweep controller
    has no variable of its own yet; one it gains is a field here."""
