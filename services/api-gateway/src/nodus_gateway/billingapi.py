"""A project's account, credits, usage and invoices (issue #7): the gateway asks billing, over the bus.

=====================================================  =====================  ================================
route                                                  who                    answer
=====================================================  =====================  ================================
GET  .../namespaces/{ns}/account                       viewer of the project  Account (balances in USD)
POST .../namespaces/{ns}/account/grants                the cluster admin      201 Account, after the grant
GET  .../namespaces/{ns}/usage?month=&format=          viewer of the project  UsageList, or CSV
GET  .../namespaces/{ns}/invoices/{month}?format=      viewer of the project  Invoice, or CSV
=====================================================  =====================  ================================

Billing owns the books (accounts, holds, the ledger); the gateway only asks, on the request/reply
subjects of :mod:`nodus_schema.billing`, and turns micro-dollars into USD strings (:mod:`invoicing`).
When billing does not answer the caller gets 503 ServiceUnavailable (nobody serves the subject) or 504
Timeout, each with a fix; a grant retried with the same id after a timeout counts once. No billing
failure is a 500: billing answering that it could not serve the request just now (a failure it logged) is
a 503 too, with its sentence and a fix; a book that kept changing under billing's tries is a 409 Conflict
to retry. A grant's amount is checked here first: a USD string, positive, at most MAX_USD
(``nodus_schema.quantities``) with at most 6 decimals, else 422 Invalid on ``amountUSD``.

A grant's id makes a retry the same grant: the body's ``id``, else the ``Idempotency-Key`` header, else a
new uuid4 (then a retry is a new grant). A revoke (``"revoke": true``) takes back only what no hold
reserves; more is refused with InsufficientCredits as a 409 (the account's state conflicts with the
request, and can change as holds release), with billing's message and fix.

CSV is chosen by ``format=csv`` or by an ``Accept`` header that lists ``text/csv`` before JSON.
"""

from __future__ import annotations

import re
import uuid
from typing import Annotated, Any, Final

import msgspec
from fastapi import APIRouter, Query, Request
from nats.aio.client import Client as NATS
from starlette.responses import Response

from nodus_gateway import bodies, invoicing
from nodus_gateway.authorizing import authorize, forbidden, principal_of
from nodus_gateway.clusterrouting import check_namespace
from nodus_gateway.principals import PROJECTS_BUCKET
from nodus_gateway.responding import ApiError, object_response
from nodus_gateway.routing import API_PREFIX
from nodus_kit import errors as kit
from nodus_kit import messaging
from nodus_kit.storing import ObjectStore
from nodus_schema import API_GROUP, CauseType, FieldError, ObjectMeta, decode, status_for
from nodus_schema.access import Project
from nodus_schema.billing import (
    ACCOUNT_SUBJECT,
    GRANT_SUBJECT,
    INSUFFICIENT_CREDITS,
    USAGE_SUBJECT,
    Account,
    AccountRequest,
    AccountStatus,
    AccountView,
    CreditGrant,
    GrantReply,
    GrantRequest,
    UsageReply,
    UsageRequest,
    UsageRow,
)
from nodus_schema.quantities import MAX_USD, MAX_USD_MICROS, micros_to_usd, usd_to_micros

BILLING_TIMEOUT_S: Final = 2.0
"""Each request to billing; a billing that is up answers in milliseconds."""
CSV: Final = "text/csv"
JSON: Final = "application/json"
FORMATS: Final = ("json", "csv")
IDEMPOTENCY_KEY: Final = "Idempotency-Key"
GRANT_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
"""What a grant id may be: a uuid, a ticket number, an invoice id (it names ledger entries)."""
_ID_RULE: Final = "must be 1 to 128 letters, digits, '.', '_', ':' or '-', starting with a letter or digit"
MAX_NOTE: Final = 1024
NOBODY_SERVES: Final = "nobody serves"
"""How ``messaging.request`` words a subject nobody serves (billing not running), as opposed to billing
answering ServiceUnavailable itself."""
START_BILLING: Final = (
    "Start the billing service (`nodus-billing`; `make up` runs it with the local stack) and retry."
)

PROJECT_PATH: Final = f"{API_PREFIX}/namespaces/{{namespace}}"
ACCOUNT_PATH: Final = f"{PROJECT_PATH}/account"
GRANTS_PATH: Final = f"{ACCOUNT_PATH}/grants"
USAGE_PATH: Final = f"{PROJECT_PATH}/usage"
INVOICE_PATH: Final = f"{PROJECT_PATH}/invoices/{{month}}"

MonthQ = Annotated[str | None, Query()]
FormatQ = Annotated[str | None, Query(alias="format")]
# Read by the direct lane too (dispatching.Parameters; querying.py has the API's own).
QUERIES: Final[tuple[Any, ...]] = (MonthQ, FormatQ)


# ---------------------------------------------------------------------------------------------------------
# Asking billing
# ---------------------------------------------------------------------------------------------------------


def billing_error(err: kit.NodusError) -> ApiError:
    """Billing did not answer, or answered with an error: a Status that says which, with a fix."""
    if isinstance(err, kit.Unavailable) and str(err).startswith(NOBODY_SERVES):
        return ApiError.of(
            "ServiceUnavailable", f"billing is not running: {err}", fix=START_BILLING, retry_after=1
        )
    if isinstance(err, kit.Timeout):
        return ApiError.of(
            "Timeout",
            f"billing did not answer in time: {err}",
            fix="Retry. A grant retried with the same id (or Idempotency-Key) counts once.",
            retry_after=1,
        )
    if isinstance(err, kit.Invalid):
        return ApiError.of("BadRequest", f"billing refused the request: {err}")
    if isinstance(err, kit.Conflict):
        return ApiError.of(
            "Conflict",
            f"billing could not apply the request: {err}",
            fix="Retry. A grant retried with the same id (or Idempotency-Key) counts once.",
            retry_after=1,
        )
    # Anything else billing answered (a failure it logged, a book it cannot write, an answer this gateway
    # cannot read) is billing unable to serve the request now, not a gateway error: its words only when
    # they are billing's own sentence (ServiceUnavailable), never an exception's text.
    said = f": {err}" if isinstance(err, kit.Unavailable) else ""
    return ApiError.of(
        "ServiceUnavailable",
        f"billing could not serve the request just now{said}",
        fix="Nothing was changed. Retry (a grant with the same id counts once); if it keeps failing, the "
        "cluster operator should read nodus-billing's log.",
        retry_after=1,
    )


async def ask(nc: NATS, subject: str, message: Any, reply_type: type[Any]) -> Any:
    try:
        return await messaging.request(nc, subject, message, reply_type, timeout=BILLING_TIMEOUT_S)
    except kit.NodusError as e:
        raise billing_error(e) from None


def account_of(project: str, view: AccountView) -> Account:
    return Account(
        metadata=ObjectMeta(name=project, namespace=project),
        status=AccountStatus(
            granted_usd=micros_to_usd(view.granted_micros),
            available_usd=micros_to_usd(view.available_micros),
            held_usd=micros_to_usd(view.held_micros),
            spent_usd=micros_to_usd(view.spent_micros),
            unbilled_usd=micros_to_usd(view.unbilled_micros),
            open_holds=view.open_holds,
        ),
    )


async def read_account(nc: NATS, project: str) -> Account:
    view: AccountView = await ask(nc, ACCOUNT_SUBJECT, AccountRequest(project=project), AccountView)
    return account_of(project, view)


async def read_usage(nc: NATS, project: str, month: str | None) -> list[UsageRow]:
    reply: UsageReply = await ask(nc, USAGE_SUBJECT, UsageRequest(project=project, month=month), UsageReply)
    return reply.rows


# ---------------------------------------------------------------------------------------------------------
# Grants
# ---------------------------------------------------------------------------------------------------------


def invalid_grant(causes: list[FieldError], fix: str | None = None) -> ApiError:
    listed = ", ".join(str(c) for c in causes)
    message = f"CreditGrant.{API_GROUP} is invalid: " + (listed if len(causes) == 1 else f"[{listed}]")
    return ApiError.of("Invalid", message, kind="CreditGrant", causes=causes, fix=fix)


def grant_of(data: Any) -> CreditGrant:
    """The body as a CreditGrant, strictly (an unknown field is an error: a typo must not grant)."""
    if not isinstance(data, dict):
        raise ApiError.of(
            "BadRequest",
            'the request body must be a JSON object such as {"amountUSD": "100.00"}',
            fix='Send {"amountUSD": "100.00"} (and optionally "id", "revoke", "note").',
        )
    decoded = decode(data, CreditGrant)
    causes = decoded.errors + decoded.unknown_errors()
    if causes or decoded.value is None:
        raise invalid_grant(causes)
    grant: CreditGrant = decoded.value
    causes = grant_errors(grant)
    if causes:
        raise invalid_grant(causes)
    return grant


def grant_errors(grant: CreditGrant) -> list[FieldError]:
    causes: list[FieldError] = []
    try:
        micros = usd_to_micros(grant.amount_usd)
        if micros <= 0:
            causes.append(
                FieldError(
                    "amountUSD",
                    CauseType.INVALID,
                    f"Invalid value: {grant.amount_usd!r}: must be greater than 0 "
                    '(to take credits back, send "revoke": true)',
                )
            )
        elif micros > MAX_USD_MICROS:
            causes.append(
                FieldError(
                    "amountUSD",
                    CauseType.INVALID,
                    f"Invalid value: {grant.amount_usd!r}: must be at most {MAX_USD} "
                    "(one grant is at most a billion dollars; grant more in several)",
                )
            )
    except ValueError as e:
        causes.append(FieldError("amountUSD", CauseType.INVALID, f"Invalid value: {grant.amount_usd!r}: {e}"))
    if grant.id is not None and GRANT_ID.fullmatch(grant.id) is None:
        causes.append(FieldError("id", CauseType.INVALID, f"Invalid value: {grant.id!r}: {_ID_RULE}"))
    if len(grant.note) > MAX_NOTE:
        causes.append(
            FieldError(
                "note", CauseType.TOO_LONG, f"Too long: {len(grant.note)} characters; at most {MAX_NOTE}"
            )
        )
    return causes


def grant_id(grant: CreditGrant, request: Request) -> str:
    """The body's id, else the Idempotency-Key header, else a new one (a retry is then a new grant)."""
    if grant.id is not None:
        return grant.id
    key = request.headers.get(IDEMPOTENCY_KEY)
    if key is None:
        return str(uuid.uuid4())
    if GRANT_ID.fullmatch(key) is None:
        raise ApiError.of(
            "BadRequest",
            f"the {IDEMPOTENCY_KEY} header {key!r} cannot name a grant: it {_ID_RULE}",
            fix=f"Send a uuid as the {IDEMPOTENCY_KEY} header, or put the grant's id in the body's \"id\".",
        )
    return key


def refusal(project: str, reply: GrantReply) -> ApiError:
    """Billing's no, as a Status: InsufficientCredits is 409 (see the module's notes), Invalid is 422 on
    amountUSD; anything else under its own registered reason."""
    message = reply.message or f"billing refused the grant: {reply.code}"
    if reply.code == INSUFFICIENT_CREDITS:
        status = status_for(INSUFFICIENT_CREDITS, message, name=project, kind="Account", fix=reply.fix)
        return ApiError(msgspec.structs.replace(status, code=409))
    if reply.code == "Invalid":
        return invalid_grant([FieldError("amountUSD", CauseType.INVALID, message)], fix=reply.fix)
    if reply.code == "InternalError":  # billing could not apply it (logged there): not the gateway's 500
        return billing_error(kit.Unavailable(message))
    try:
        return ApiError(status_for(reply.code or "InternalError", message, fix=reply.fix))
    except ValueError:  # a reason this gateway does not know yet: still a refusal, said as one
        return ApiError.of("Forbidden", f"{reply.code}: {message}", fix=reply.fix)


async def check_project(projects: ObjectStore[Project], project: str) -> None:
    """Credits go to an existing project only (a typo must not park money under a name nobody has)."""
    try:
        await projects.get(None, project)
    except kit.NotFound:
        raise ApiError.of(
            "NotFound",
            f'projects.{API_GROUP} "{project}" not found',
            name=project,
            kind="projects",
            fix="Check the name (`GET /apis/nodus.dev/v1/projects` lists them), or create the project first.",
        ) from None


def check_cluster_admin(request: Request, project: str) -> None:
    """Credits are money: only the cluster admin grants or revokes them, as only it creates projects."""
    principal = principal_of(request)
    if not principal.admin:
        raise forbidden(
            principal,
            "create",
            "account/grants",
            project,
            None,
            fix="Only the cluster admin (the gateway's NODUS_ADMIN_TOKEN) grants or revokes credits.",
        )


# ---------------------------------------------------------------------------------------------------------
# Formats
# ---------------------------------------------------------------------------------------------------------


def wants_csv(request: Request, format_: str | None) -> bool:
    """``format=csv|json`` when given (anything else is a 400), else the Accept header: text/csv listed
    before JSON (or any type) asks for CSV."""
    if format_ is not None:
        if format_ not in FORMATS:
            raise ApiError.of(
                "BadRequest",
                f'format "{format_}" is not supported: it must be one of {", ".join(FORMATS)}',
                fix="Send format=json (the default) or format=csv, or Accept: text/csv.",
            )
        return format_ == "csv"
    for part in request.headers.get("accept", "").split(","):
        mime = part.split(";", 1)[0].strip().lower()
        if mime == CSV:
            return True
        if mime in (JSON, "application/*", "*/*"):
            return False
    return False


def csv_response(text: str, filename: str) -> Response:
    return Response(
        text.encode(),
        media_type=CSV,
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )


def check_month(month: str, what: str, fix: str) -> None:
    if not invoicing.is_month(month):
        raise ApiError.of(
            "BadRequest",
            f"{what} {month!r} is not a month: it must be YYYY-MM (UTC), such as 2026-11",
            fix=fix,
        )


# ---------------------------------------------------------------------------------------------------------
# The routes
# ---------------------------------------------------------------------------------------------------------


def billing_router(nc: NATS, *, max_body_bytes: int) -> APIRouter:
    """The account, grants, usage and invoice routes of every project."""
    router = APIRouter(tags=["billing"])
    projects: ObjectStore[Project] = ObjectStore(nc, PROJECTS_BUCKET, Project)

    @router.get(ACCOUNT_PATH, name="read account of a project")
    async def get_account(namespace: str, request: Request) -> Response:
        check_namespace(namespace)
        await authorize(request, "get", "account", namespace)
        return object_response(await read_account(nc, namespace))

    @router.post(GRANTS_PATH, status_code=201, name="grant credits to a project")
    async def grant_credits(namespace: str, request: Request) -> Response:
        check_namespace(namespace)
        check_cluster_admin(request, namespace)
        body = await bodies.read_body(request, max_body_bytes)
        grant = grant_of(bodies.parse(body, bodies.media_type(request)))
        await check_project(projects, namespace)
        wanted = GrantRequest(
            project=namespace,
            grant_id=grant_id(grant, request),
            amount_micros=usd_to_micros(grant.amount_usd),
            revoke=grant.revoke,
            note=grant.note,
        )
        reply: GrantReply = await ask(nc, GRANT_SUBJECT, wanted, GrantReply)
        if not reply.ok:
            raise refusal(namespace, reply)
        account = account_of(namespace, reply.account) if reply.account else await read_account(nc, namespace)
        return object_response(account, 201)

    @router.get(USAGE_PATH, name="read usage of a project")
    async def get_usage(
        namespace: str, request: Request, month: MonthQ = None, format_: FormatQ = None
    ) -> Response:
        check_namespace(namespace)
        await authorize(request, "list", "usage", namespace)
        if month is not None:
            check_month(
                month, "month", "Send month=YYYY-MM (UTC), e.g. month=2026-11, or leave it out for all."
            )
        csv = wants_csv(request, format_)
        usage = invoicing.usage_list(namespace, month, await read_usage(nc, namespace, month))
        if csv:
            return csv_response(invoicing.usage_csv(usage), f"usage-{namespace}-{month or 'all'}.csv")
        return object_response(usage)

    @router.get(INVOICE_PATH, name="read invoice of a project")
    async def get_invoice(namespace: str, month: str, request: Request, format_: FormatQ = None) -> Response:
        check_namespace(namespace)
        await authorize(request, "get", "invoices", namespace)
        check_month(
            month, "the invoice month", "Ask for .../invoices/YYYY-MM (UTC), e.g. .../invoices/2026-11."
        )
        csv = wants_csv(request, format_)
        inv = invoicing.invoice(namespace, month, await read_usage(nc, namespace, month))
        if csv:
            return csv_response(invoicing.invoice_csv(inv), f"invoice-{namespace}-{month}.csv")
        return object_response(inv)

    return router
