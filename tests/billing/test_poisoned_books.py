"""Books an older billing poisoned are mended on read, and no billing failure reaches a user as Python.

What the older version did (reproduced by :func:`applied_before_the_bounds`): a Job admitted with
``maxCostUSD: "99999999999999"`` (10^20 µ$) was put into its project's book by the meter, and the write
succeeded, because a book is JSON in KV and JSON takes any integer. Every later ``apply`` copies the
book through msgpack, whose integers are 64-bit: OverflowError, for every hold, grant and meter tick of
the project, forever; deleting the Job left its record in the book, and restarting billing read the same
bytes again. Holds open at that moment stayed open, for Jobs deleted since.

Here such a book is written into the ``accounts`` bucket byte for byte, and billing is shown to mend it
by itself: the repair is recorded in the book, counted, logged and announced as an event; the admin's
grant answers 201 through the gateway; the project's later Jobs are funded and run; the hold of the
deleted Job is released and its credits come back.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import msgspec
import pytest
import pytest_asyncio
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.aio.client import Client as NATS

from nodus_billing import books as books_module
from nodus_billing import holding
from nodus_billing.accounting import fold, post
from nodus_billing.archiving import Archive
from nodus_billing.books import REPAIRED, Book, Books
from nodus_billing.holding import Capture, Charge, Grant, Op, PlaceHold, PutBudget, PutJob, decode, encode
from nodus_billing.metering import Metering, Terms, job_ref
from nodus_billing.repairing import encodable, repair
from nodus_billing.serving import Holds, serve_accounts
from nodus_billing.standing import BOOK_MAX_MICROS, Hold, State, Usage, available
from nodus_gateway.app import build_app
from nodus_gateway.principals import Principals
from nodus_gateway.resources import stores_for
from nodus_kit import errors, messaging
from nodus_kit.keying import key_of
from nodus_kit.storing import ObjectStore
from nodus_schema.billing import HoldReply, HoldRequest
from nodus_schema.defaulting import default_job
from nodus_schema.jobs import Job, JobSpec
from nodus_schema.messages import ObjectEvent
from nodus_schema.meta import ObjectMeta, now_rfc3339
from nodus_schema.quantities import usd_to_micros
from nodus_testing.waiting import eventually

pytestmark = pytest.mark.timeout(120)

ADMIN_TOKEN = "poisoned-books-admin-token-0123456789"
V1 = "/apis/nodus.dev/v1"
THE_CAP = "99999999999999"  # the bug report's maxCostUSD: 10^20 µ$, beyond 64 bits
USD = 1_000_000
RATE = 790_000  # l4-x1-us, µ$/h (the rig's offering)


# ---------------------------------------------------------------------------------------------------------
# The older version, reproduced
# ---------------------------------------------------------------------------------------------------------


def applied_before_the_bounds(state: State, op: Op) -> State:
    """``holding.apply`` as it was before the bounds, for the operations these books need (a put, a grant,
    a hold): the operation's handler on a copy, its entries posted, its result remembered, nothing bounded.
    (Its copy was through msgpack, which worked as long as the book before the operation held no oversize
    integer; the copy here is through JSON, so that the operation that poisons the book can be shown.)"""
    key = holding.op_id(op)
    new = decode(encode(state))
    result, entries = holding._HANDLERS[type(op)](new, op, key)
    post(new.ledger, new.balances, entries)
    if result.ok:
        new.results[key] = result
    return new


def stored_bytes(project: str, state: State) -> bytes:
    """The KV value the ObjectStore wrote for a book: its JSON, without resourceVersion."""
    meta = ObjectMeta(name=project, uid=str(uuid.uuid4()), creation_timestamp=now_rfc3339())
    return msgspec.json.encode(Book(metadata=meta, state=state))


def poisoned_state(project: str, *, credits_usd: int = 10, gone_hold: bool = True) -> State:
    """A project's book as the older version left it: credits granted, an open hold of a Job that has
    been deleted since (placed an hour ago, its funding run out), and the record of the Job whose cap
    poisoned it. Returns the state; ``stored_bytes`` makes it a KV value."""
    now = int(datetime.now(UTC).timestamp() * 1000)
    state = State()
    ops: list[Op] = [
        Grant(grant_id=f"starting:{project}", project=project, amount_micros=credits_usd * USD),
        PutJob(name="gone@uid-gone", project=project, generation=1),
        *(
            [
                PlaceHold(
                    hold_id="gone-0-1",
                    job="gone@uid-gone",
                    amount_micros=USD,
                    funded_until_ms=now - 3_000_000,
                    at_ms=now - 3_600_000,
                    rate_micros_per_hour=RATE,
                )
            ]
            if gone_hold
            else []
        ),
        PutJob(name="big@uid-big", project=project, generation=1, max_cost_micros=usd_to_micros(THE_CAP)),
    ]
    for op in ops:
        state = applied_before_the_bounds(state, op)
    return state


async def write_poisoned(nc: NATS, project: str, **kwargs: Any) -> bytes:
    data = stored_bytes(project, poisoned_state(project, **kwargs))
    kv = await nc.jetstream().key_value("accounts")
    await kv.put(key_of(None, project), data)
    return data


def test_the_older_version_wrote_an_integer_beyond_64_bits_that_every_later_copy_fails_on() -> None:
    data = stored_bytes("p", poisoned_state("p"))
    assert b'"maxCostMicros":99999999999999000000' in data, "the cap as the older version stored it"
    state = msgspec.json.decode(data, type=Book).state  # what every replica reads back from KV
    with pytest.raises(OverflowError):
        msgspec.msgpack.encode(state)  # holding._clone, the first line of every apply


# ---------------------------------------------------------------------------------------------------------
# The repair, as a value
# ---------------------------------------------------------------------------------------------------------

huge = st.one_of(
    st.integers(min_value=2**64, max_value=10**40), st.integers(min_value=-(10**40), max_value=-(2**63) - 1)
)
PLACES = ("job-cap", "job-unbilled", "budget", "hold-reserved", "hold-rate", "entry", "usage", "result")


def a_book(project: str = "p") -> State:
    state = State()
    for op in (
        Grant(grant_id="g", project=project, amount_micros=100 * USD),
        PutJob(name="j", project=project, generation=1, max_cost_micros=50 * USD),
        PutBudget(name="b", project=project, monthly_micros=80 * USD, generation=1),
        PlaceHold(hold_id="h1", job="j", amount_micros=5 * USD, funded_until_ms=10**12, at_ms=10**12),
        PlaceHold(hold_id="h2", job="j", amount_micros=5 * USD, funded_until_ms=10**12, at_ms=10**12),
        Charge(hold_id="h1", tick="1", amount_micros=USD),
        Capture(
            hold_id="h2",
            amount_micros=0,
            usage=Usage(attempt="h2", segments={"Running": 2 * USD}),
            total_micros=2 * USD,
        ),
    ):
        state, result, _ = holding.apply(state, op)
        assert result.ok, result
    return state


def poison(state: State, place: str, value: int) -> tuple[State, int]:
    """The state with one integer beyond 64 bits (``value``, or beyond 2^64 where only a positive one
    makes sense) where an older version could have put it; and the integer put."""
    bad = decode(encode(state))
    if place in ("job-cap", "entry"):
        value = 2**64 + abs(value)
    match place:
        case "job-cap":
            bad.jobs["j"].max_cost_micros = value
        case "job-unbilled":
            bad.jobs["j"].unbilled_micros = value
        case "budget":
            bad.budgets["b"].monthly_micros = value
        case "hold-reserved":
            bad.holds["h1"].reserved_micros = value
        case "hold-rate":
            bad.holds["h1"].rate_micros_per_hour = value
        case "entry":
            grant = bad.ledger["grant:g"]
            grant.amount_micros = value
            bad.balances = fold(bad.ledger.values())
        case "usage":
            usage = bad.holds["h2"].usage
            assert usage is not None
            usage.segments["Running"] = value
        case "result":
            bad.results["grant:g"].charged_micros = value
    return decode(encode(bad)), value  # as it comes back from KV: JSON keeps the integer


@settings(max_examples=200, deadline=None)
@given(place=st.sampled_from(PLACES), value=huge, at_ms=st.integers(min_value=0, max_value=2**41))
def test_any_oversize_integer_is_repaired_into_a_book_that_encodes_and_keeps_its_identity(
    place: str, value: int, at_ms: int
) -> None:
    bad, value = poison(a_book(), place, value)
    assert not encodable(bad), "poisoned: the older version's apply would fail on it"
    mended, repairs = repair(bad, at_ms)
    assert repairs and all(r.at_ms == at_ms for r in repairs)
    assert str(value) in {r.was for r in repairs}
    assert mended.repairs[-len(repairs) :] == repairs, "recorded in the book"
    # Encodes both ways and decodes to the same value; the double entry holds exactly.
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(mended), type=State) == mended
    assert decode(encode(mended)) == mended
    assert mended.balances == fold(mended.ledger.values()) and sum(mended.balances.values()) == 0
    if place == "job-cap":
        assert mended.jobs["j"].max_cost_micros is None, "a cap beyond the book is no cap"
    # Deterministic, and once is enough.
    assert repair(bad, at_ms) == (mended, repairs)
    assert repair(mended, at_ms + 1) == (mended, [])
    # And the book takes operations again.
    after, result, _ = holding.apply(mended, Grant(grant_id="later", project="p", amount_micros=USD))
    assert encodable(after)
    assert result.ok or result.code == "Invalid", result  # a grant past the book's total is refused, alone


def test_a_book_that_needs_no_repair_is_returned_as_it_is() -> None:
    book = a_book()
    assert repair(book, 1) == (book, [])


def test_the_poisoned_book_of_the_report_keeps_its_money_and_loses_only_the_cap() -> None:
    bad = msgspec.json.decode(stored_bytes("p", poisoned_state("p")), type=Book).state
    mended, repairs = repair(bad, 1)
    assert [(r.path, r.was, r.now) for r in repairs] == [
        ("jobs.big@uid-big.maxCostMicros", "99999999999999000000", None)
    ]
    assert (mended.ledger, mended.balances, mended.holds) == (bad.ledger, bad.balances, bad.holds)


# ---------------------------------------------------------------------------------------------------------
# The books on a real bus: repaired on read, written back, counted, announced
# ---------------------------------------------------------------------------------------------------------


async def next_event(sub: Any) -> ObjectEvent:
    msg = await sub.next_msg(timeout=5)
    return msgspec.json.decode(msg.data, type=ObjectEvent)


async def test_a_grant_on_a_poisoned_book_repairs_it_and_says_so(nc: NATS, unique: str) -> None:
    await write_poisoned(nc, unique)
    events = await nc.subscribe(f"nodus.events.{unique}.accounts.>")
    books = Books(nc)
    applied = await books.apply(unique, [Grant(grant_id="after", project=unique, amount_micros=5 * USD)])
    assert applied.results[0] is not None and applied.results[0].ok
    assert available(applied.state, unique) == 14 * USD, "10 granted, 1 held by the gone Job's hold, 5 more"
    stored = await books.store.get(None, unique)
    assert encodable(stored.state), "the book in KV is mended"
    assert stored.state.jobs["big@uid-big"].max_cost_micros is None
    assert [r.path for r in stored.state.repairs] == ["jobs.big@uid-big.maxCostMicros"]
    assert books.repairs == 1
    event = await next_event(events)
    assert (event.kind, event.name, event.reason, event.severity) == ("Account", unique, REPAIRED, "Warning")
    assert "jobs.big@uid-big.maxCostMicros was 99999999999999000000" in event.message
    await events.unsubscribe()


async def test_reading_a_poisoned_book_writes_it_back_mended(nc: NATS, unique: str) -> None:
    await write_poisoned(nc, unique)
    books = Books(nc)
    state = await books.read(unique)
    assert state.jobs["big@uid-big"].max_cost_micros is None, "read repaired"

    async def written() -> bool:
        return encodable((await books.store.get(None, unique)).state) and books.repairs == 1

    await eventually(written, deadline_s=5, message="the repaired book is written back, counted once")


async def test_an_operation_that_fails_is_refused_alone_and_the_rest_of_its_commit_applies(
    nc: NATS, unique: str
) -> None:
    books = Books(nc)

    def broken(state: State) -> Op | None:
        raise RuntimeError("a bug in a planner")

    applied = await books.apply(
        unique,
        [
            Grant(grant_id="a", project=unique, amount_micros=USD),
            broken,
            Grant(grant_id="b", project=unique, amount_micros=2 * USD),
        ],
    )
    first, failed, last = applied.results
    assert first is not None and first.ok and last is not None and last.ok
    assert failed is not None and failed.code == "InternalError" and failed.fix
    assert "RuntimeError" not in (failed.message or "") and "bug in a planner" not in (failed.message or "")
    assert available(await books.read(unique), unique) == 3 * USD


async def test_a_commit_that_would_not_encode_refuses_the_operation_that_did_it_and_writes_the_rest(
    nc: NATS, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last line of defence, under the bounds: were an operation to get past them, the book written
    would still encode (the operation is refused, the others applied)."""
    real = holding.apply

    def leaky(state: State, op: Op) -> Any:
        new, result, entries = real(state, op)
        if holding.op_id(op) == "grant:leak":
            new.balances["leak"] = 2**70
        return new, result, entries

    monkeypatch.setattr(books_module, "apply", leaky)
    books = Books(nc)
    applied = await books.apply(
        unique,
        [
            Grant(grant_id="ok-1", project=unique, amount_micros=USD),
            Grant(grant_id="leak", project=unique, amount_micros=USD),
            Grant(grant_id="ok-2", project=unique, amount_micros=USD),
        ],
    )
    assert [r.ok if r else None for r in applied.results] == [True, False, True]
    assert applied.results[1] is not None and applied.results[1].code == "Invalid"
    stored = (await books.store.get(None, unique)).state
    assert encodable(stored) and available(stored, unique) == 2 * USD


async def test_a_book_grown_past_the_bus_message_limit_is_refused_with_a_sentence(
    nc: NATS, unique: str
) -> None:
    """A book keeps every run (about 800 bytes each): the bus refuses a book past its largest message. That
    write is refused with a sentence naming the limit and the fix, never the client's exception; the book
    stored stays as it was."""
    hold = Hold(job="j", project=unique, month="2026-01", funded_until_ms=1, status="Captured")
    each = len(msgspec.json.encode({"run-000000": hold}))  # one more hold in the book's map
    runs = (nc.max_payload - 20_000) // each
    state = State(holds={f"run-{i:06d}": hold for i in range(runs)})
    data = stored_bytes(unique, state)
    assert 0 < nc.max_payload - len(data) < 30_000, "just under the limit"
    kv = await nc.jetstream().key_value("accounts")
    await kv.put(key_of(None, unique), data)
    labels = {f"label-{i}": "x" * 60 for i in range(600)}  # 40 KB more: past the limit
    with pytest.raises(errors.Unavailable) as caught:
        await Books(nc).apply(unique, [PutJob(name="wide", project=unique, generation=1, labels=labels)])
    said = str(caught.value)
    assert "outgrown the bus's largest message" in said and "max_payload" in said and "MaxPayload" not in said
    assert (await kv.get(key_of(None, unique))).value == data, "nothing was changed"


# ---------------------------------------------------------------------------------------------------------
# Through the gateway: the admin's grant is 201 on a poisoned book, and never a 500
# ---------------------------------------------------------------------------------------------------------


def client(app: Any, token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://gateway",
        headers={"Authorization": f"Bearer {token}"},
    )


@pytest_asyncio.fixture
async def admin(nc: NATS, unique: str) -> AsyncIterator[httpx.AsyncClient]:
    """A gateway whose billing endpoints are served on the session's bus, and its admin; the project
    ``unique`` exists."""
    books = Books(nc)
    subs = await serve_accounts(nc, books)
    app = build_app(stores_for(nc), admin_token=ADMIN_TOKEN, principals=Principals(nc, pepper=b"pepper"))
    async with client(app, ADMIN_TOKEN) as admin:
        resp = await admin.post(f"{V1}/projects", json={"metadata": {"name": unique}})
        assert resp.status_code == 201, resp.text
        yield admin
    for sub in subs:
        await sub.unsubscribe()


async def test_the_admins_grant_on_a_poisoned_book_answers_201(
    nc: NATS, unique: str, admin: httpx.AsyncClient
) -> None:
    await write_poisoned(nc, unique)
    resp = await admin.post(
        f"{V1}/namespaces/{unique}/account/grants", json={"amountUSD": "5.00", "id": "after-the-poison"}
    )
    assert resp.status_code == 201, resp.text
    status = resp.json()["status"]
    assert (status["grantedUSD"], status["availableUSD"], status["heldUSD"]) == ("15.00", "14.00", "1.00")
    read = await admin.get(f"{V1}/namespaces/{unique}/account")
    assert read.status_code == 200 and read.json()["status"] == status


async def test_a_billing_failure_on_a_grant_is_a_503_with_a_sentence_not_a_500(
    nc: NATS, unique: str, admin: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def failing(self: Books, project: str, batches: Any) -> Any:
        raise OverflowError("can't serialize ints < -2**63 or > 2**64 - 1")

    monkeypatch.setattr(Books, "_write", failing)
    resp = await admin.post(f"{V1}/namespaces/{unique}/account/grants", json={"amountUSD": "1", "id": "x"})
    assert resp.status_code == 503, resp.text
    body = resp.json()
    assert (body["kind"], body["reason"]) == ("Status", "ServiceUnavailable")
    assert body["fix"] and body["docs"].endswith("/errors/ServiceUnavailable")
    assert "nothing was changed" in body["message"] and "not running" not in body["message"], body
    assert "nodus-billing's log" in body["fix"] and body["details"]["retryAfterSeconds"] == 1
    assert "OverflowError" not in resp.text and "serialize" not in resp.text


# ---------------------------------------------------------------------------------------------------------
# Holds: a billing failure reaches the scheduler as a registered reason and a sentence
# ---------------------------------------------------------------------------------------------------------


async def test_a_billing_failure_on_a_hold_answers_service_unavailable_with_a_sentence(
    nc: NATS, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the scheduler puts into status.message ("waiting for billing to fund the run: ...") is billing's
    error text: it must be a sentence, never an exception's."""
    jobs = ObjectStore(nc, "jobs", Job)
    body = {"image": "busybox", "command": ["true"], "resources": {"gpu": "L4:1"}}
    job = await jobs.create(
        default_job(Job(metadata=ObjectMeta(name="j", namespace=unique), spec=msgspec.convert(body, JobSpec)))
    )
    books = Books(nc)

    async def failing(self: Books, project: str, batches: Any) -> Any:
        raise OverflowError("can't serialize ints < -2**63 or > 2**64 - 1")

    monkeypatch.setattr(Books, "_write", failing)
    subject = f"test.{unique}.hold"
    sub = await messaging.serve(nc, subject, HoldRequest, Holds(books, Metering(nc, books, Terms())).hold)
    ask = HoldRequest(
        namespace=unique,
        job="j",
        job_uid=job.metadata.uid or "",
        attempt="j-0-1",
        rate_micros_per_hour=RATE,
        window_millis=0,
    )
    with pytest.raises(errors.NodusError) as caught:
        await messaging.request(nc, subject, ask, HoldReply)
    await sub.unsubscribe()
    assert caught.value.reason == "ServiceUnavailable"
    said = str(caught.value)
    assert "OverflowError" not in said and "serialize" not in said
    assert said.startswith("billing could not fund the run for project") and "nothing was changed" in said


# ---------------------------------------------------------------------------------------------------------
# End to end: the scheduler, billing and a fleet on a book the older version poisoned
# ---------------------------------------------------------------------------------------------------------

TERMS = {
    "NODUS_HOLD_WINDOW_S": "4",
    "NODUS_METER_TICK_S": "0.5",
    "NODUS_STOP_MARGIN_S": "1",
    "NODUS_ORPHAN_HOLD_S": "10",
}


async def test_after_the_poison_the_projects_jobs_are_funded_and_the_gone_jobs_hold_is_released(
    make_rig: Callable[..., Any],
) -> None:
    async with make_rig(funding=True) as rig:
        await write_poisoned(rig.nc, "t")
        # Billing (re)started on the poisoned book, with the same starting credits it granted before.
        billing = await rig.start_billing(NODUS_STARTING_CREDITS_USD="10", **TERMS)
        await rig.submit("after", completions=2, parallelism=2)

        async def succeeded() -> Job:
            job: Job = await rig.job("after")
            message = job.status.message or ""
            assert "Error" not in message and "serialize" not in message, message  # never Python's words
            assert job.status.phase == "Succeeded" and job.status.cost and job.status.cost.final, job.status
            return job

        job = await eventually(succeeded, deadline_s=40, message="the project's later Job is funded and runs")
        spent = usd_to_micros(job.status.cost.total_usd or "0") if job.status.cost else 0
        assert spent > 0

        async def released() -> State:
            # Released, then filed out of the book (filing); the deleted Job's record, and that of the Job
            # whose cap poisoned the book (no such Job is stored), folded into its totals (forgetting), as
            # the finished Job's is once its cost is final.
            state: State = await billing.books.read("t")
            assert "gone-0-1" not in state.holds, state.holds.get("gone-0-1")
            after = job_ref("after", job.metadata.uid)
            assert not {"gone@uid-gone", "big@uid-big", after} & set(state.jobs), list(state.jobs)
            rows = [(row.jobs, sum(row.months.values())) for row in state.forgotten]
            assert rows == [(3, spent)], "the two spent nothing, the finished Job its cost"
            filed = await Archive(rig.nc).holds("t")
            assert filed["gone-0-1"].status == "Released", filed.get("gone-0-1")
            return state

        state = await eventually(released, deadline_s=20, message="the deleted Job's hold is released")
        assert available(state, "t") == 10 * USD - spent, "its credit came back; the new Job's spend is exact"
        assert state.balances == fold(state.ledger.values())
        assert [r.path for r in state.repairs] == ["jobs.big@uid-big.maxCostMicros"]
        assert billing.books.repairs >= 1
        assert all(v <= BOOK_MAX_MICROS for v in state.balances.values())
