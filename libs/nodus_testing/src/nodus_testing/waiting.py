"""Await conditions with deadlines: the house rule is no sleeps as synchronisation."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar, overload

T = TypeVar("T")


@overload
async def eventually(
    predicate: Callable[[], Awaitable[T]],
    deadline_s: float = ...,
    interval_s: float = ...,
    message: str = ...,
) -> T: ...


@overload
async def eventually(
    predicate: Callable[[], T],
    deadline_s: float = ...,
    interval_s: float = ...,
    message: str = ...,
) -> T: ...


async def eventually(
    predicate: Callable[[], object],
    deadline_s: float = 10.0,
    interval_s: float = 0.02,
    message: str = "",
) -> object:
    """Call ``predicate`` (sync or async) until it returns something truthy, and return that.

    An AssertionError raised by the predicate counts as "not yet", so a predicate may be written with
    asserts; any other exception is a bug and propagates at once. Past the deadline this raises
    AssertionError with ``message`` and the last value seen. An async predicate that hangs is cut off by
    the same deadline.
    """
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    last: object = None
    last_error: AssertionError | None = None
    cut = False
    while True:
        try:
            result = predicate()
            if inspect.isawaitable(result):
                result = await _within(result, end - loop.time())
            # A call the deadline cut short tells nothing: the last one that ended does.
            cut = result is _CUT
            if not cut:
                last, last_error = result, None
                if result:
                    return result
        except AssertionError as exc:
            last, last_error, cut = None, exc, False
        if loop.time() >= end:
            what = message or getattr(predicate, "__qualname__", repr(predicate))
            detail = f"last assertion: {last_error}" if last_error else f"last value: {last!r}"
            detail += "; the last call was cut off by the deadline" if cut else ""
            raise AssertionError(f"{what}: not true within {deadline_s}s ({detail})") from last_error
        await asyncio.sleep(interval_s)


_CUT: Final = object()
"""What :func:`_within` returns for a call the overall deadline cut off."""


async def _within(awaitable: Awaitable[T], remaining_s: float) -> T | object:
    """Await under the overall deadline; :data:`_CUT` if our deadline cut it off (a TimeoutError the
    predicate raised on its own still propagates, like any other error of the predicate)."""
    scope = asyncio.timeout(max(remaining_s, 0.0))
    try:
        async with scope:
            return await awaitable
    except TimeoutError:
        if scope.expired():
            return _CUT
        raise
