"""Log shipping: the pure parts (parsing, redaction, cutting) and the shipper against the session's
nats-server (NODUS_LOGS): order, batching, redaction, resuming from the cursor, and a crash mid-batch."""

from __future__ import annotations

from pathlib import Path

import msgspec
import nats.errors
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from nodus_agent.logshipping import (
    MASK,
    STREAM,
    Cursor,
    Limits,
    LogLines,
    LogShipper,
    Redactor,
    cut_lines,
    load_cursor,
    parse_line,
    save_cursor,
    subject_of,
)
from nodus_kit.connecting import connect
from nodus_schema.messages import StartAttempt
from nodus_testing.waiting import eventually

NS = "team-a"
_decoder = msgspec.json.Decoder(LogLines)


# -- helpers ------------------------------------------------------------------------------------------------
async def batches(js: JetStreamContext, subject: str) -> list[LogLines]:
    """Every batch NODUS_LOGS holds on ``subject``, in order."""
    try:
        last = await js.get_last_msg(STREAM, subject)
    except NotFoundError:
        return []
    sub = await js.subscribe(
        subject, stream=STREAM, ordered_consumer=True, config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
    )
    out: list[LogLines] = []
    try:
        seq = 0
        while seq < (last.seq or 0):
            msg = await sub.next_msg(timeout=5)
            seq = msg.metadata.sequence.stream
            out.append(_decoder.decode(msg.data))
    finally:
        await sub.unsubscribe()
    return out


def texts(found: list[LogLines]) -> list[str]:
    return [line.text for b in found for line in b.lines]


def source(unique: str, attempt: str = "a1") -> StartAttempt:
    job = f"job-{unique}"
    return StartAttempt(
        namespace=NS, job=job, attempt=f"{job}-0-{attempt}", index=0, attempt_no=1, node="node-1"
    )


def write(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


# -- pure: lines, redaction, cuts ---------------------------------------------------------------------------
def test_runtime_lines_keep_their_time_and_stream_and_plain_lines_get_the_read_time() -> None:
    r = Redactor()
    line = parse_line(b"2025-03-01T10:00:00.123456789Z stderr oops: disk full", "T", r)
    assert (line.time, line.stream, line.text) == (
        "2025-03-01T10:00:00.123456789Z",
        "stderr",
        "oops: disk full",
    )
    assert parse_line(b"2025-03-01T10:00:00Z stdout", "T", r).text == ""
    plain = parse_line(b"epoch 3 loss 0.25\r", "2025-03-01T10:00:01Z", r)
    assert (plain.time, plain.stream, plain.text) == ("2025-03-01T10:00:01Z", None, "epoch 3 loss 0.25")
    # Not the runtime's shape (no stream name): a plain line, whole.
    assert parse_line(b"2025-03-01T10:00:00Z hello", "T", r).text == "2025-03-01T10:00:00Z hello"


def test_secrets_are_masked_longest_first_and_line_by_line() -> None:
    key = "-----BEGIN KEY-----\nAbCdEf123\n-----END KEY-----"
    r = Redactor(["hunter2", "hunter2-long", "", key])
    assert r("pw=hunter2-long and hunter2") == f"pw={MASK} and {MASK}"
    assert r("AbCdEf123") == MASK  # one line of a multi-line value
    assert r("nothing here") == "nothing here"


def test_a_long_line_is_cut_but_never_inside_a_secret_or_a_character() -> None:
    r = Redactor(["SECRET"])
    data = b"x" * 8 + b"SECRET" + b"y" * 10 + b"\n"
    lines = cut_lines(data, final=False, max_line=10, redactor=r)
    assert [raw for _, raw in lines] == [b"x" * 8, b"SECRET" + b"yyyy", b"y" * 6]
    assert [raw for _, raw in lines if b"SECRET" in raw] == [b"SECRETyyyy"]  # whole, so it is masked
    utf8 = "é".encode() * 6 + b"\n"  # 2-byte characters: a cut at an odd byte would split one
    pieces = [raw for _, raw in cut_lines(utf8, final=False, max_line=5, redactor=Redactor())]
    assert [p.decode() for p in pieces] == ["éé", "éé", "éé"]
    # A partial line waits for its newline, unless final.
    assert cut_lines(b"done\npart", final=False, max_line=100, redactor=r) == [(5, b"done")]
    assert cut_lines(b"done\npart", final=True, max_line=100, redactor=r) == [(5, b"done"), (9, b"part")]


# -- shipping -----------------------------------------------------------------------------------------------
async def test_lines_arrive_in_order_in_bounded_batches(nc: NATS, unique: str, tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    wanted = [f"step {i} loss {1 / (i + 1):.6f}" for i in range(2500)] + ["w" * 3000 for _ in range(40)]
    write(log, "".join(f"{t}\n" for t in wanted))
    src = source(unique)
    shipper = LogShipper(nc, src, log, limits=Limits(max_lines=1000, max_bytes=16 * 1024))
    assert await shipper.close(final=True)
    found = await batches(nc.jetstream(), subject_of(src))
    assert texts(found) == wanted
    assert all(len(b.lines) <= 1000 for b in found)
    assert all(
        len(msgspec.json.encode(b.lines)) <= 16 * 1024 + 3100 for b in found
    )  # one line may tip it over
    assert len(found) >= 11  # 40 lines of 3000 bytes need at least 8 batches of 16 KiB
    assert [b.offset for b in found[1:]] == [b.end for b in found[:-1]]  # the batches chain, no gap
    assert found[-1].end == log.stat().st_size
    assert load_cursor(shipper.cursor_path) == Cursor(offset=log.stat().st_size)


async def test_the_background_loop_ships_while_the_program_writes(
    nc: NATS, unique: str, tmp_path: Path
) -> None:
    log = tmp_path / "log.txt"
    src = source(unique)
    shipper = await LogShipper(nc, src, log, limits=Limits(interval_s=0.05)).start()
    try:
        write(log, "2025-03-01T10:00:00Z stdout starting\n")
        await eventually(lambda: _texts_are(nc, src, ["starting"]))
        write(log, "2025-03-01T10:00:01Z stderr warn\nno newline yet")
        await eventually(lambda: _texts_are(nc, src, ["starting", "warn"]))
    finally:
        assert await shipper.close(final=True)  # the last line, without its newline, goes too
    found = await batches(nc.jetstream(), subject_of(src))
    assert texts(found) == ["starting", "warn", "no newline yet"]
    assert [line.stream for b in found for line in b.lines] == ["stdout", "stderr", None]


async def _texts_are(nc: NATS, src: StartAttempt, wanted: list[str]) -> bool:
    return texts(await batches(nc.jetstream(), subject_of(src))) == wanted


async def test_secret_values_never_reach_the_bus(nc: NATS, unique: str, tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    secret = "s3cr3t-t0ken-" + unique
    write(
        log,
        f"token={secret}\n2025-03-01T10:00:00Z stderr auth {secret} failed\n{'z' * 50}{secret}{'z' * 50}\n",
    )
    src = source(unique)
    # A small max_line puts a cut right across the secret in the third line.
    assert await LogShipper(nc, src, log, secrets=[secret], limits=Limits(max_line=64)).close()
    found = await batches(nc.jetstream(), subject_of(src))
    joined = "".join(texts(found))
    assert secret not in joined and secret[:10] not in joined
    assert texts(found)[:2] == [f"token={MASK}", f"auth {MASK} failed"]
    assert len(texts(found)) > 3  # the third line was cut
    assert "".join(texts(found)[2:]) == f"{'z' * 50}{MASK}{'z' * 50}"


async def test_a_new_shipper_resumes_from_the_cursor(nc: NATS, unique: str, tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    src = source(unique)
    write(log, "".join(f"first {i}\n" for i in range(100)))
    first = LogShipper(nc, src, log)
    await first.ship_once()
    await first.close(final=False)  # the agent stops (or dies) while the program runs on
    write(log, "".join(f"second {i}\n" for i in range(100)))
    assert await LogShipper(nc, src, log).close(final=True)  # the next agent
    found = await batches(nc.jetstream(), subject_of(src))
    assert texts(found) == [f"first {i}" for i in range(100)] + [f"second {i}" for i in range(100)]
    assert [b.offset for b in found[1:]] == [b.end for b in found[:-1]]


async def test_a_crash_between_publish_and_cursor_resends_the_same_batch(
    nc: NATS, unique: str, tmp_path: Path
) -> None:
    log = tmp_path / "log.txt"
    src = source(unique)
    write(log, "".join(f"line {i}\n" for i in range(50)))
    shipper = LogShipper(nc, src, log)
    await shipper.ship_once()
    [batch] = await batches(nc.jetstream(), subject_of(src))
    # The cursor as the shipper wrote it just before publishing: that batch pending, not acknowledged.
    save_cursor(shipper.cursor_path, Cursor(offset=batch.offset, pending=batch.end))
    write(log, "".join(f"more {i}\n" for i in range(50)))  # the program wrote on meanwhile
    again = LogShipper(nc, src, log)
    assert await again.close(final=True)
    assert again.published == 2  # the pending batch again (the stream dropped it by id), then the rest
    found = await batches(nc.jetstream(), subject_of(src))
    assert texts(found) == [f"line {i}" for i in range(50)] + [f"more {i}" for i in range(50)]


async def test_a_batch_the_bus_did_not_take_is_pending_and_sent_later(
    nats_url: str, nats_seed: Path, nc: NATS, unique: str, tmp_path: Path
) -> None:
    log = tmp_path / "log.txt"
    src = source(unique)
    write(log, "".join(f"line {i}\n" for i in range(20)))
    gone = await connect(nats_url, "logshipping-test", nkey_seed=nats_seed)
    await gone.close()  # the bus is away
    shipper = LogShipper(gone, src, log)
    with pytest.raises(nats.errors.Error):
        await shipper.ship_once()
    # Written before the publish: the next try sends exactly this range, under the same id.
    assert load_cursor(shipper.cursor_path) == Cursor(offset=0, pending=log.stat().st_size)
    write(log, "later\n")
    assert await LogShipper(nc, src, log).close(final=True)
    found = await batches(nc.jetstream(), subject_of(src))
    assert [(b.offset, len(b.lines)) for b in found] == [(0, 20), (found[0].end, 1)]
    assert texts(found) == [f"line {i}" for i in range(20)] + ["later"]


async def test_what_the_drain_deadline_leaves_is_said_in_the_log(
    nc: NATS, unique: str, tmp_path: Path
) -> None:
    log = tmp_path / "log.txt"
    src = source(unique)
    write(log, "".join(f"{i:05d} {'n' * 100}\n" for i in range(2000)))  # ~210 KB
    limits = Limits(bytes_per_s=40 * 1024, interval_s=0.1, max_line=1024)  # ~4 KB a tick
    assert not await LogShipper(nc, src, log, limits=limits).close(final=True, drain_s=0.3)
    found = await batches(nc.jetstream(), subject_of(src))
    last = texts(found)[-1]
    assert last.startswith("[nodus] ") and "bytes of this log were not shipped" in last and str(log) in last
    assert 0 < len(texts(found)) - 1 < 2000
    assert load_cursor(log.with_name("log.cursor")).offset == log.stat().st_size


@pytest.mark.parametrize("stored", [b"", b"{not json"])
def test_a_missing_or_torn_cursor_ships_from_the_start(tmp_path: Path, stored: bytes) -> None:
    path = tmp_path / "log.cursor"
    if stored:
        path.write_bytes(stored)
    assert load_cursor(path) == Cursor()
