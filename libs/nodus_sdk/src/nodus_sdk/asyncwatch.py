"""The async client's watch: an async iterator of a watch's events, resumed and relisted as
:mod:`nodus_sdk.watching` says (:mod:`nodus_sdk.syncwatch` is its sync counterpart, written by hand)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, Generic, TypeVar

from nodus_sdk.requesting import Call
from nodus_sdk.watching import Event, Expired, WatchState, unread

if TYPE_CHECKING:
    from nodus_sdk.asyncclient import AsyncClient

T = TypeVar("T")


class Watch(Generic[T]):
    """An async iterator of a watch's events; ``aclose()`` it (or use ``async with``) to stop early."""

    def __init__(self, client: AsyncClient, state: WatchState[T]) -> None:
        self._client, self.state = client, state
        self._events = self._run()

    def __aiter__(self) -> AsyncIterator[Event[T]]:
        return self

    async def __anext__(self) -> Event[T]:
        return await anext(self._events)

    async def aclose(self) -> None:
        await self._events.aclose()

    async def __aenter__(self) -> Watch[T]:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    @property
    def resource_version(self) -> str | None:
        """The last resourceVersion seen: where a new watch would resume."""
        return self.state.resource_version

    async def _run(self) -> AsyncGenerator[Event[T], None]:
        state, client = self.state, self._client
        delays = client.retry.delays()
        while not state.expired():
            call = Call("GET", state.path, unread, state.params())
            try:
                async with client.stream(call, read_timeout=state.read_timeout()) as resp:
                    state.connections += 1
                    delays = client.retry.delays()  # connected: the next drop starts a fresh backoff
                    async for line in resp.aiter_lines():
                        event = state.on_line(line)
                        if event is not None:
                            yield event
                        if state.expired():
                            return
            except Expired:
                for relisted in await self._relist():
                    yield relisted
            except Exception as e:
                delay = state.reconnect_delay(e, delays)
                if delay is None:
                    raise
                await asyncio.sleep(delay)

    async def _relist(self) -> list[Event[T]]:
        relist = self.state.relist()
        while (call := relist.next_call()) is not None:
            relist.add(await self._client.send(call))
        return relist.events()
