"""The sync client's watch: an iterator of a watch's events, resumed and relisted as
:mod:`nodus_sdk.watching` says.

Written by hand, not generated from :mod:`nodus_sdk.asyncwatch` as :mod:`nodus_sdk.syncclient` is from
:mod:`nodus_sdk.asyncclient`: a sync watch is iterated in one thread and closed from another (a thread
blocked in a socket read can be stopped no other way), which has no async counterpart. ``close()``
closes the response to end the blocked read, and the loop checks a flag, since another thread's generator
cannot be closed ("generator already executing").
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING, Generic, TypeVar

import httpx

from nodus_sdk.requesting import Call
from nodus_sdk.watching import Event, Expired, WatchState, unread

if TYPE_CHECKING:
    from nodus_sdk.syncclient import Client

T = TypeVar("T")


class Watch(Generic[T]):
    """An iterator of a watch's events; close it (or use ``with``) to stop early."""

    def __init__(self, client: Client, state: WatchState[T]) -> None:
        self._client, self.state = client, state
        self._closed = False
        self._response: httpx.Response | None = None
        self._events = self._run()

    def __iter__(self) -> Iterator[Event[T]]:
        return self

    def __next__(self) -> Event[T]:
        return next(self._events)

    def close(self) -> None:
        """Stop the watch; from another thread too (then its iteration ends at the next line or
        read timeout)."""
        self._closed = True
        resp = self._response
        if resp is not None:
            with contextlib.suppress(Exception):
                resp.close()
        with contextlib.suppress(ValueError):  # "generator already executing": in another thread
            self._events.close()

    def __enter__(self) -> Watch[T]:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @property
    def resource_version(self) -> str | None:
        """The last resourceVersion seen: where a new watch would resume."""
        return self.state.resource_version

    def _run(self) -> Generator[Event[T], None, None]:
        state, client = self.state, self._client
        delays = client.retry.delays()
        while not state.expired() and not self._closed:
            call = Call("GET", state.path, unread, state.params())
            try:
                with client.stream(call, read_timeout=state.read_timeout()) as resp:
                    self._response = resp
                    state.connections += 1
                    delays = client.retry.delays()  # connected: the next drop starts a fresh backoff
                    for line in resp.iter_lines():
                        event = state.on_line(line)
                        if event is not None:
                            yield event
                        if state.expired():
                            return
            except Expired:
                yield from self._relist()
            except Exception as e:
                if self._closed:
                    return
                delay = state.reconnect_delay(e, delays)
                if delay is None:
                    raise
                time.sleep(delay)

    def _relist(self) -> Iterator[Event[T]]:
        relist = self.state.relist()
        while (call := relist.next_call()) is not None:
            relist.add(self._client.send(call))
        yield from relist.events()
