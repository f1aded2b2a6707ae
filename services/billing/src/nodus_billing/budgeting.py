"""Budgets: the gateway stores them (spec), billing puts them in the books and writes their status.

A Budget applies to the holds of its project's Jobs whose labels match its selector, per UTC month
(ADR-0023). Its ``status`` shows the month and what is used (charged + held) in it; a changed or deleted
Budget may let blocked Jobs run again, so the project's blocked Jobs are looked at.

The Budget is read from the leader's informer of Budgets (the controller's ``for_``), never from the
store; the status billing writes goes back into it at once (write-through). Every resync reads the book
of each Budget's project (its use changes with every hold, which no event announces): one read per
Budget, not per Job.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec
from nats.aio.client import Client as NATS

from nodus_billing.books import Books
from nodus_billing.holding import PutBudget
from nodus_billing.standing import budget_used, month_of
from nodus_kit import errors
from nodus_kit.errors import Conflict, NotFound
from nodus_kit.informing import Informer
from nodus_kit.storing import ObjectStore
from nodus_schema.billing import Budget, BudgetStatus
from nodus_schema.quantities import micros_to_usd, usd_to_micros


def budget_ref(name: str, uid: str | None) -> str:
    return f"{name}@{uid or ''}"


class Budgets:
    def __init__(
        self,
        nc: NATS,
        books: Books,
        *,
        view: Informer[Budget] | None = None,
        requeue_project: Callable[[str], None] = lambda project: None,
    ) -> None:
        self.books = books
        self.store = ObjectStore(nc, "budgets", Budget)
        self.view = view
        """The informer of Budgets the reconcile reads (the service's)."""
        self.requeue_project = requeue_project

    async def reconcile(self, key: tuple[str, str]) -> float | None:
        ns, name = key
        if self.view is None or not self.view.synced.is_set():
            raise errors.Unavailable("billing's view of Budgets is not listed yet")
        budget = self.view.get(ns, name)
        state = await self.books.read(ns)
        ref = budget_ref(name, budget.metadata.uid) if budget else None
        ops = [
            PutBudget(name=r, project=ns, monthly_micros=0, generation=b.generation, deleted=True)
            for r, b in state.budgets.items()
            if r.rsplit("@", 1)[0] == name and r != ref and b.project == ns and not b.deleted
        ]
        if budget is not None and ref is not None:
            gen = budget.metadata.generation or 1
            known = state.budgets.get(ref)
            if known is None or known.generation < gen:
                ops.append(
                    PutBudget(
                        name=ref,
                        project=ns,
                        monthly_micros=usd_to_micros(budget.spec.monthly_usd),
                        generation=gen,
                        selector=dict(budget.spec.selector),
                    )
                )
        if ops:
            state = (await self.books.apply(ns, ops)).state
            self.requeue_project(ns)
        if budget is None or ref not in state.budgets or state.budgets[ref].deleted:
            return None
        month = month_of(int(time.time() * 1000))
        status = BudgetStatus(
            month=month,
            used_usd=micros_to_usd(budget_used(state, state.budgets[ref], month)),
            observed_generation=budget.metadata.generation,
        )
        if budget.status != status:
            try:
                self.view.apply(await self.store.update(msgspec.structs.replace(budget, status=status)))
            except (Conflict, NotFound):
                return 1.0  # changed meanwhile: look again
        return None
