"""Billing's bus API and API objects (ADR-0024): holds, funding, accounts, credits, Budgets, usage.

Request/reply subjects are served by the billing service in queue group ``billing``; every request is one
Struct (fields can be added without breaking anyone). Amounts are integer micro-dollars on the bus and
decimal USD strings on the HTTP API.
"""

from __future__ import annotations

from typing import Final

import msgspec

from nodus_schema.meta import ListMeta, ObjectMeta
from nodus_schema.wire import API_VERSION, Wire

HOLD_SUBJECT: Final = "nodus.rpc.billing.hold"
"""scheduler -> billing: fund an Attempt before it is provisioned (HoldRequest -> HoldReply)."""
ACCOUNT_SUBJECT: Final = "nodus.rpc.billing.account"
"""api-gateway -> billing: a project's balances (AccountRequest -> AccountView)."""
GRANT_SUBJECT: Final = "nodus.rpc.billing.grant"
"""api-gateway -> billing: grant or revoke credits, admin only (GrantRequest -> GrantReply)."""
USAGE_SUBJECT: Final = "nodus.rpc.billing.usage"
"""api-gateway -> billing: a project's charges in a month, per Attempt (UsageRequest -> UsageReply)."""

FUNDING_BUCKET: Final = "funding"
"""KV bucket of :class:`Funding` records, key ``<namespace>.<job>`` (owner: billing; the scheduler reads)."""

# Why a Job may not run (Funding.blocked.reason); each has a page under docs/errors/.
MAX_COST_REACHED: Final = "MaxCostReached"
INSUFFICIENT_CREDITS: Final = "InsufficientCredits"
BUDGET_EXCEEDED: Final = "BudgetExceeded"
FUNDING_REASONS: Final = (MAX_COST_REACHED, INSUFFICIENT_CREDITS, BUDGET_EXCEEDED)


# --- holds and funding -------------------------------------------------------------------------------


class HoldRequest(Wire):
    """Fund one Attempt: a hold of ``rate × window`` named after the Attempt (so a retry is the same hold)."""

    namespace: str
    job: str
    job_uid: str
    attempt: str
    rate_micros_per_hour: int
    window_millis: int


class HoldReply(Wire):
    ok: bool
    hold_micros: int = 0
    funded_until_ms: int = 0
    code: str | None = None
    """MaxCostReached, InsufficientCredits or BudgetExceeded when refused (the Job is then blocked)."""
    message: str | None = None
    fix: str | None = None


class Block(Wire):
    """Why a Job may not start or keep running until someone raises a cap, grants credits or a Budget."""

    reason: str
    message: str
    fix: str
    rate_micros_per_hour: int = 0
    """The rate the Job was refused at: it may run again once one stop margin at this rate fits."""


class Funding(Wire):
    """Billing's word on one Job for the scheduler: blocked (stop with a checkpoint, start nothing) or not."""

    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "Funding")
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    job_uid: str = ""
    blocked: Block | None = None
    funded_until_ms: int = 0


# --- accounts and credits ----------------------------------------------------------------------------


class AccountRequest(Wire):
    project: str


class AccountView(Wire):
    """A project's credits: ``granted`` = ``available`` + ``held`` + ``spent`` (µ$), always."""

    project: str
    granted_micros: int = 0
    available_micros: int = 0
    held_micros: int = 0
    spent_micros: int = 0
    unbilled_micros: int = 0
    """Usage Nodus absorbed (beyond what holds reserved, or covered by Nodus): recorded, never charged."""
    open_holds: int = 0


class GrantRequest(Wire):
    """Grant (or, with ``revoke``, take back) credits. ``grant_id`` makes a retry the same grant."""

    project: str
    grant_id: str
    amount_micros: int
    revoke: bool = False
    note: str = ""


class GrantReply(Wire):
    ok: bool
    code: str | None = None
    message: str | None = None
    fix: str | None = None
    account: AccountView | None = None


# --- usage and invoices ------------------------------------------------------------------------------


class UsageRequest(Wire):
    project: str
    month: str | None = None
    """``YYYY-MM`` (UTC); all months when empty."""


class UsageRow(Wire):
    """One Attempt's charge: what ran where, for how long, at which rate, split by segment."""

    month: str
    job: str
    attempt: str
    offering: str = ""
    pricebook_version: str = ""
    rate_micros_per_hour: int = 0
    billed_millis: int = 0
    amount_micros: int = 0
    boot_micros: int = 0
    running_micros: int = 0
    restore_micros: int = 0
    teardown_micros: int = 0
    covered_micros: int = 0
    """What the run's time would have cost where Nodus was at fault: recorded, not charged."""
    sweep: str | None = None
    start_time: str | None = None
    finish_time: str | None = None


class UsageReply(Wire):
    project: str
    rows: list[UsageRow] = msgspec.field(default_factory=list)


# --- Budgets (API objects: the gateway stores them, billing enforces them) ---------------------------


class BudgetSpec(Wire):
    monthly_usd: str = msgspec.field(name="monthlyUSD")
    """What the holds and charges of the project (or of its Jobs matching ``selector``) may reach a month."""
    selector: dict[str, str] = msgspec.field(default_factory=dict)
    """matchLabels: the Budget applies to Jobs carrying all these labels; empty applies to every Job."""


class BudgetStatus(Wire):
    month: str | None = None
    used_usd: str | None = msgspec.field(default=None, name="usedUSD")
    observed_generation: int | None = None


class Budget(Wire):
    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "Budget")
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: BudgetSpec = msgspec.field(default_factory=lambda: BudgetSpec(monthly_usd="0"))
    status: BudgetStatus = msgspec.field(default_factory=BudgetStatus)


class BudgetList(Wire, omit_defaults=False):
    # Not omit_defaults: an empty list still says "items": [], as Kubernetes does.
    """A list of Budgets."""

    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "BudgetList")
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[Budget] = msgspec.field(default_factory=list)


# --- the HTTP API's views of accounts, usage and invoices (served by the gateway, asked of billing) ----


class AccountStatus(Wire, omit_defaults=False):
    """A project's credits in USD: ``grantedUSD`` = ``availableUSD`` + ``heldUSD`` + ``spentUSD``, always."""

    granted_usd: str = msgspec.field(default="0.00", name="grantedUSD")
    """Every credit granted to the project, less every credit revoked."""
    available_usd: str = msgspec.field(default="0.00", name="availableUSD")
    """What new holds may still reserve (and what a revoke may take back)."""
    held_usd: str = msgspec.field(default="0.00", name="heldUSD")
    """Reserved by the open holds of running Attempts: charged as they run, the rest released after."""
    spent_usd: str = msgspec.field(default="0.00", name="spentUSD")
    """Charged for finished runs and meter ticks."""
    unbilled_usd: str = msgspec.field(default="0.00", name="unbilledUSD")
    """Usage Nodus absorbed (beyond what holds reserved, or covered by Nodus): recorded, never charged."""
    open_holds: int = 0
    """How many holds are open now (one per running Attempt)."""


class Account(Wire):
    """A project's billing account (read-only): its credits as billing keeps them, named after the project."""

    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "Account")
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    status: AccountStatus = msgspec.field(default_factory=AccountStatus)


class CreditGrant(Wire):
    """The body of ``POST .../namespaces/{ns}/account/grants`` (cluster admin only): grant or revoke."""

    amount_usd: str = msgspec.field(name="amountUSD")
    """A positive USD amount as a decimal string (at most 6 decimals): ``"100.00"``."""
    id: str | None = None
    """Makes a retry the same grant (counted once); default: the Idempotency-Key header, else a new id."""
    revoke: bool = False
    """Take the amount back instead (only credits no hold reserves: ``availableUSD``)."""
    note: str = ""
    """Why, for the people who read the ledger later."""


class UsageItem(Wire, omit_defaults=False):
    """One Attempt's charge as the usage export shows it: every amount a USD string, every key present."""

    month: str
    """The UTC month (``YYYY-MM``) the charge counts in."""
    job: str
    attempt: str
    sweep: str | None = None
    """The Sweep the Job is a cell of; null for a Job of its own."""
    offering: str = ""
    pricebook_version: str = ""
    rate_usd_per_hour: str = msgspec.field(default="0.00", name="rateUSDPerHour")
    billed_seconds: str = "0.000"
    """The billed time in seconds, a decimal string with 3 decimals (milliseconds)."""
    start_time: str | None = None
    finish_time: str | None = None
    cost_usd: str = msgspec.field(default="0.00", name="costUSD")
    """What was charged for the Attempt: bootUSD + runningUSD + restoreUSD + teardownUSD."""
    boot_usd: str = msgspec.field(default="0.00", name="bootUSD")
    running_usd: str = msgspec.field(default="0.00", name="runningUSD")
    restore_usd: str = msgspec.field(default="0.00", name="restoreUSD")
    teardown_usd: str = msgspec.field(default="0.00", name="teardownUSD")
    covered_usd: str = msgspec.field(default="0.00", name="coveredUSD")
    """What the run's time would have cost where Nodus was at fault: recorded, not charged."""


class UsageList(Wire, omit_defaults=False):
    """A project's charges, one item per Attempt, in one UTC month (every month when ``month`` is null)."""

    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "UsageList")
    project: str = ""
    month: str | None = None
    items: list[UsageItem] = msgspec.field(default_factory=list)


class InvoiceLine(Wire, omit_defaults=False):
    """The charges of one Sweep (or one Job of its own) on one offering at one rate, in one month."""

    sweep: str | None = None
    job: str | None = None
    """Set for a Job that is not a cell of a Sweep (a Sweep's line sums its cells)."""
    offering: str = ""
    rate_usd_per_hour: str = msgspec.field(default="0.00", name="rateUSDPerHour")
    attempts: int = 0
    """How many Attempts the line sums."""
    quantity: str = "0.000000"
    """Billed hours, a decimal string with 6 decimals."""
    amount_usd: str = msgspec.field(default="0.00", name="amountUSD")
    """What was charged: the sum of the Attempts' charges (each rounded up to the micro-dollar)."""
    covered_usd: str = msgspec.field(default="0.00", name="coveredUSD")
    """Covered by Nodus: recorded, not charged."""


class Invoice(Wire, omit_defaults=False):
    """A project's charges in one UTC month, grouped by Sweep (or Job), offering and rate."""

    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "Invoice")
    project: str = ""
    month: str = ""
    lines: list[InvoiceLine] = msgspec.field(default_factory=list)
    total_usd: str = msgspec.field(default="0.00", name="totalUSD")
    """The sum of the lines' amountUSD."""
    covered_usd: str = msgspec.field(default="0.00", name="coveredUSD")
    """The sum of the lines' coveredUSD."""
