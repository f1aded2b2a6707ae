"""Agent reports -> Attempt status. Every report can arrive twice or out of order: a terminal Attempt
never changes again, and a late AttemptStarted does not undo a finish."""

from __future__ import annotations

import asyncio

import msgspec

from nodus_kit.errors import Conflict, NotFound
from nodus_kit.informing import Informer
from nodus_kit.messaging import Delivery
from nodus_kit.storing import ObjectStore
from nodus_kit.vouching import REPORT_PREFIX, Forgeries, sender
from nodus_scheduler.warming import WindowOf, finish_window
from nodus_schema.attempts import ATTEMPT_TERMINAL, Attempt
from nodus_schema.messages import (
    AttemptCheckpointed,
    AttemptFinished,
    AttemptProgress,
    AttemptStarted,
    Report,
)

FINISH_PHASE = {
    "Completed": "Succeeded",
    "Error": "Failed",
    "OOMKilled": "Failed",
    "DeadlineExceeded": "Failed",
    "Stopped": "Stopped",
    "Lost": "Lost",
    # spec.source could not be fetched (ADR-0036): the run failed before its program started.
    "SourceUnavailable": "Failed",
}
NEVER_STARTED = frozenset({"Lost", "SourceUnavailable"})
"""Finish reasons of a run whose program never started: no startTime, billed only as a failed start."""


class Reports:
    """``view``: the scheduler's informer of the Attempts (viewing.World.attempts). A report is applied to
    the Attempt it holds and written with compare-and-set on its revision: one write instead of a read and
    a write. A stale view loses the compare-and-set and the report is applied again to a fresh read.

    Reports of one Attempt are handled one write at a time, in the order they were delivered (the
    consumer runs a batch concurrently): a short run's Started and Finished arrive together, and applied
    side by side to the same cached revision one of them always lost its compare-and-set and was read and
    written again (0.85 refused writes per cell in bench/sweeps_bench.py). Reports that queue up while a
    write is under way are applied together, in order, in the next write: a 0-second run's Started and
    Finished cost one write of its Attempt, not two (issue #23).

    Node restriction: a report counts only when the node of its subject (which the bus lets only that
    node's agent publish on), the node it names and the Attempt's node agree; any other is dropped and
    counted (nodus_kit.vouching), so one GPU host cannot finish, fail or rate another's runs."""

    def __init__(
        self,
        attempts: ObjectStore[Attempt],
        view: Informer[Attempt] | None = None,
        *,
        window_of: WindowOf | None = None,
    ) -> None:
        self.attempts = attempts
        self.view = view
        self.window_of = window_of
        """The warm window a finishing run opens (warming.WarmWindows.window_of; None: never)."""
        self._turns: dict[tuple[str, str], _Turn] = {}
        self.forgeries = Forgeries("scheduler", "report")

    async def handle(self, delivery: Delivery[Report]) -> None:
        key = (delivery.data.namespace, delivery.data.attempt)
        turn = self._turns.get(key)
        if turn is None:
            turn = self._turns[key] = _Turn()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        turn.waiting.append((delivery.data, sender(delivery.subject, REPORT_PREFIX), done))
        if not turn.draining:
            await self._drain(key, turn)
        await done

    async def _drain(self, key: tuple[str, str], turn: _Turn) -> None:
        """Apply the reports of one Attempt in delivery order, those that queued up meanwhile together in
        one write (a short run's Started and Finished: one write instead of two). Each report's delivery
        is settled when the write that holds it is: a failed write fails (and so redelivers) every report
        in it, and each is applied again, idempotently."""
        turn.draining = True
        batch: list[_Waiting] = []
        try:
            # One turn of the loop first: the reports delivered in the same fetch (a Started and the
            # Finished right behind it) are queued by their handlers before the first write goes out.
            await asyncio.sleep(0)
            while turn.waiting:
                batch, turn.waiting = turn.waiting, []
                try:
                    await self._apply([(report, node) for report, node, _ in batch])
                except Exception as e:  # handed to every delivery of the write: each is redelivered
                    for *_, done in batch:
                        if not done.done():  # a waiter cancelled (its consumer stopping) took its own
                            done.set_exception(e)
                else:
                    for *_, done in batch:
                        if not done.done():
                            done.set_result(None)
                batch = []
        finally:
            for *_, done in batch + turn.waiting:  # cancelled mid-write (the service stops): nobody drains
                if not done.done():
                    done.cancel()
            turn.draining = False
            del self._turns[key]

    async def _apply(self, reports: list[tuple[Report, str | None]]) -> None:
        first = reports[0][0]
        cached = self.view.get(first.namespace, first.attempt) if self.view is not None else None
        if cached is not None:
            changed = self._recorded(cached, reports, None)
            if changed is None:
                return  # already recorded (redeliveries, late reports after the finish), or not genuine
            try:
                self._seen(await self.attempts.update(changed))
                return
            except (Conflict, NotFound):
                pass  # someone wrote first (or it was deleted): read it fresh below
        verdicts: list[bool] = []  # judged (and counted) once each, however often a lost race reads again
        try:
            self._seen(
                await self.attempts.mutate(
                    first.namespace, first.attempt, lambda a: self._recorded(a, reports, verdicts)
                )
            )
        except NotFound:
            return  # the Job (and its Attempts) were deleted meanwhile: nothing to record

    def _recorded(
        self, a: Attempt, reports: list[tuple[Report, str | None]], verdicts: list[bool] | None
    ) -> Attempt | None:
        """``a`` with each genuine report applied in order; None when nothing changes."""
        current, changed = a, False
        for i, (report, node) in enumerate(reports):
            if verdicts is not None and i < len(verdicts):
                genuine = verdicts[i]
            else:
                genuine = self._genuine(report, node, current)
                if verdicts is not None:
                    verdicts.append(genuine)
            after = apply(current, report, self.window_of) if genuine else None
            if after is not None:
                current, changed = after, True
        return current if changed else None

    def _genuine(self, report: Report, node: str | None, a: Attempt) -> bool:
        about = f"{type(report).__name__} of {report.namespace}/{report.attempt}"
        return self.forgeries.genuine(node, report.node, a.spec.node, about)

    def _seen(self, written: Attempt) -> None:
        if self.view is not None:
            self.view.apply(written)


_Waiting = tuple[Report, str | None, "asyncio.Future[None]"]
"""A report, the node its subject names, and what its delivery awaits."""


class _Turn:
    """The reports of one Attempt waiting to be written, and whether a handler is writing them."""

    __slots__ = ("draining", "waiting")

    def __init__(self) -> None:
        self.waiting: list[_Waiting] = []
        self.draining = False


def apply(a: Attempt, report: Report, window_of: WindowOf | None = None) -> Attempt | None:
    """``a`` with ``report`` recorded, None when nothing changes. ``window_of``: the warm window a finishing
    run opens, written with the finish (issue #21)."""
    st = a.status
    if st.phase in ATTEMPT_TERMINAL:
        return None
    if isinstance(report, AttemptStarted):
        if st.phase == "Running":
            return None
        st = msgspec.structs.replace(
            st,
            phase="Running",
            start_time=report.time,
            billing_start_ms=report.started_ms,
            program_start_ms=report.program_ms,
            source=report.source or st.source,
            mounts=list(report.mounts) or st.mounts,
        )
    elif isinstance(report, AttemptProgress):
        st = msgspec.structs.replace(st, units_per_second=report.units_per_second)
    elif isinstance(report, AttemptCheckpointed):
        seen = st.checkpoint.sequence if st.checkpoint is not None else -1
        if report.checkpoint.sequence <= seen:
            return None  # a redelivery, or an older one arriving late: the latest stays
        st = msgspec.structs.replace(st, checkpoint=report.checkpoint)
    elif isinstance(report, AttemptFinished):
        phase = FINISH_PHASE.get(report.reason, "Failed")
        if report.reason == "Completed" and report.exit_code not in (0, None):
            phase = "Failed"
        st = msgspec.structs.replace(
            st,
            phase=phase,
            reason=report.reason,
            message=report.message,
            finish_time=report.time,
            exit_code=report.exit_code,
            wall_millis=report.wall_millis,
            units_per_second=report.units_per_second or st.units_per_second,
            # A run that could not start on its node (Lost, no AttemptStarted) never started: no startTime,
            # so billing covers it whole and no replacement restores from it.
            start_time=st.start_time or (None if report.reason in NEVER_STARTED else report.time),
            outputs=list(report.outputs),
            restored_from=report.restored_from or st.restored_from,
            billing_start_ms=st.billing_start_ms or report.started_ms,
            billing_stop_ms=report.stopped_ms,
            source=report.source or st.source,
            mounts=list(report.mounts) or st.mounts,
        )
        window = finish_window(report, window_of(a, phase, report.reason)) if window_of else None
        if window is not None:
            st = msgspec.structs.replace(st, warm_since_ms=window[0], warm_until_ms=window[1])
    return msgspec.structs.replace(a, status=st)
