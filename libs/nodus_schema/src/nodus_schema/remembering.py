"""A bounded memo, least recently used out: what the admission path remembers per distinct spec (and
billing per project with no book yet, its opening state).

A spec's verdicts depend on the spec alone (not on the time, the name or anything stored), and the same
spec comes back often: a Sweep file submitted again under a new name, a client's retry, `kubectl apply` of
an unchanged file, a dry run and then its create. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Final, Generic, TypeVar

SPEC_MEMO_SIZE: Final = 512
"""How many distinct specs each memo of the admission path keeps."""

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Memo(Generic[K, V]):
    """At most ``size`` values by key; the least recently used goes first."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K, make: Callable[[], V]) -> V:
        """The value remembered for ``key``, else ``make()``'s, remembered. An exception from ``make``
        propagates and nothing is remembered."""
        found = self._items.get(key)
        if found is not None:
            self._items.move_to_end(key)
            return found
        value = self._items[key] = make()
        if len(self._items) > self.size:
            self._items.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._items)
