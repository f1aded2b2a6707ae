"""Locks by name: one :class:`asyncio.Lock` per key, made when first wanted and dropped once nobody holds or
waits for it, so work on one key is serialised while work on another never waits on it, and a long-lived
agent keeps no lock for the thousands of attempts it is done with."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass
class _Entry:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0
    """Holders and waiters: the entry goes when the last of them leaves."""


class KeyedLocks(Generic[K]):
    def __init__(self) -> None:
        self._entries: dict[K, _Entry] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: K) -> AsyncIterator[None]:
        """Hold ``key``'s lock for the block; waiters get it in the order they asked."""
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:  # also when cancelled while waiting: a waiter that gave up is no user any more
            entry.users -= 1
            if entry.users == 0:
                del self._entries[key]

    def __contains__(self, key: object) -> bool:
        """Whether someone holds or waits for ``key``."""
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)
