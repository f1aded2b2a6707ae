"""The agent's outbox against real nats-servers: an outage loses no report, a restart re-sends, ids dedupe,
progress coalesces.

The outage test runs its own nats-server (it is stopped for 30 s, which the session's server must never
be); the others use the session's. Each test has its own node name, so its report subjects are its own.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
import time
from pathlib import Path

import msgspec
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from nodus_agent.attemptdir import AttemptDir
from nodus_agent.outbox import JOURNAL, Outbox, OutboxBusy, Put, outbox_dir, replay
from nodus_agent.reporting import Reporter, progress_key, subject
from nodus_agent.running import Runner
from nodus_agent.settings import AgentSettings
from nodus_kit import declaring
from nodus_kit.connecting import connect
from nodus_schema.messages import (
    AttemptFinished,
    AttemptProgress,
    AttemptStarted,
    Report,
    StartAttempt,
)
from nodus_testing.natsserver import NatsServer
from nodus_testing.waiting import eventually

NS = "team-a"
REPORTS = "NODUS_REPORTS"
OUTAGE_S = 30.0
_decoder: msgspec.json.Decoder[Report] = msgspec.json.Decoder(Report)

# A program that runs until "$NODUS_STATE/go" exists, so the test decides when it finishes.
WAIT_FOR_GO = textwrap.dedent("""
    import os, pathlib, time
    go = pathlib.Path(os.environ["NODUS_STATE"], "go")
    while not go.exists():
        time.sleep(0.02)
""")


# -- helpers ------------------------------------------------------------------------------------------------
async def stored(js: JetStreamContext, subjects: str) -> list[tuple[str, Report]]:
    """Every report the stream holds on ``subjects``, in stream order (read up to the last one now)."""
    try:
        last = await js.get_last_msg(REPORTS, subjects)
    except NotFoundError:
        return []
    sub = await js.subscribe(
        subjects,
        stream=REPORTS,
        ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
    )
    out: list[tuple[str, Report]] = []
    try:
        seq = 0
        while seq < (last.seq or 0):
            msg = await sub.next_msg(timeout=5)
            seq = msg.metadata.sequence.stream
            out.append((msg.headers["Nats-Msg-Id"] if msg.headers else "", _decoder.decode(msg.data)))
    finally:
        await sub.unsubscribe()
    return out


def summary(reports: list[tuple[str, Report]]) -> list[tuple[str, str, str]]:
    """(kind, attempt, detail) per report: what order and content tests compare."""
    out = []
    for _, r in reports:
        if isinstance(r, AttemptProgress):
            out.append(("Progress", r.attempt, r.units_per_second))
        elif isinstance(r, AttemptFinished):
            out.append(("Finished", r.attempt, r.reason))
        else:
            out.append(("Started", r.attempt, ""))
    return out


def journal_puts(directory: Path) -> list[Put]:
    """What the journal file holds on disk (read independently of the Outbox object)."""
    with (directory / JOURNAL).open("rb") as f:
        return list(replay(f, keep_per_key=1).pending.values())


def started(node: str, attempt: str) -> tuple[str, AttemptStarted, str]:
    msg = AttemptStarted(namespace=NS, attempt=attempt, node=node, time="2025-01-01T00:00:00Z")
    return subject(node, NS, attempt), msg, f"{NS}/{attempt}:started"


def progress(node: str, attempt: str, n: int) -> tuple[str, AttemptProgress, str]:
    msg = AttemptProgress(namespace=NS, attempt=attempt, node=node, units_per_second=str(n))
    return subject(node, NS, attempt), msg, f"{NS}/{attempt}:progress:{n}"


def finished(node: str, attempt: str) -> tuple[str, AttemptFinished, str]:
    msg = AttemptFinished(
        namespace=NS,
        attempt=attempt,
        node=node,
        time="2025-01-01T00:01:00Z",
        exit_code=0,
        wall_millis=60_000,
        reason="Completed",
    )
    return subject(node, NS, attempt), msg, f"{NS}/{attempt}:finished"


def start_msg(node: str, attempt: str) -> StartAttempt:
    command = [sys.executable, "-c", WAIT_FOR_GO]
    return StartAttempt(
        namespace=NS, job="train", attempt=attempt, index=0, attempt_no=1, node=node, command=command
    )


def report_rate(adir: AttemptDir, rate: int) -> None:
    with adir.report.open("a") as f:
        f.write(f'{{"unitsPerSecond": {rate}}}\n')


def pending_has(box: Outbox, kind: type[Report], attempt: str, detail: str = "") -> bool:
    for e in box.pending:
        r = _decoder.decode(e.data)
        same_rate = not isinstance(r, AttemptProgress) or r.units_per_second == detail
        if isinstance(r, kind) and r.attempt == attempt and same_rate:
            return True
    return False


# -- a 30 s outage ------------------------------------------------------------------------------------------
@pytest.mark.slow
async def test_a_30s_nats_outage_during_a_run_loses_no_report(tmp_path: Path, unique: str) -> None:
    """The server is down for 30 s while attempts start, report throughput and finish: every report
    made during the outage is delivered after it, in the order made (progress coalesced to the latest)."""
    (tmp_path / "nats").mkdir()
    server = NatsServer(tmp_path / "nats", tie_to_parent=True)
    await asyncio.to_thread(server.start)
    nc = await connect(server.url, "outbox-outage-test", nkey_seed=server.harness_seed)
    box: Outbox | None = None
    runner: Runner | None = None
    try:
        js = nc.jetstream()
        await declaring.ensure(js)
        settings = AgentSettings.from_env(
            {
                "NODUS_AGENT_NODE": unique,
                "NODUS_AGENT_WORKDIR": str(tmp_path / "work"),
                "NODUS_AGENT_FAKE_GPUS": "true",
                "NODUS_AGENT_STOP_GRACE_S": "2",
            }
        )
        box = (await Outbox.open(outbox_dir(settings.workdir))).start(nc)
        runner = Runner(settings, Reporter(js, unique, box))
        a, b = f"{unique}-a", f"{unique}-b"
        dir_a, dir_b = (AttemptDir(settings.workdir, NS, x) for x in (a, b))
        mine = f"nodus.report.{unique}.>"

        async def delivered(*expected: tuple[str, str, str]) -> bool:
            return summary(await stored(js, mine)) == list(expected)

        await runner.start(start_msg(unique, a))
        report_rate(dir_a, 10)
        before = [("Started", a, ""), ("Progress", a, "10")]
        await eventually(lambda: delivered(*before), message="reports before the outage")

        began = time.monotonic()
        await asyncio.to_thread(server.kill)  # SIGKILL: a crash, not a goodbye
        report_rate(dir_a, 20)
        await eventually(lambda: pending_has(box, AttemptProgress, a, "20"), message="progress 20 journalled")
        await runner.start(start_msg(unique, b))
        await eventually(lambda: pending_has(box, AttemptStarted, b), message="b's start journalled")
        report_rate(dir_a, 30)
        await eventually(lambda: pending_has(box, AttemptProgress, a, "30"), message="progress 30 journalled")
        (dir_a.state / "go").touch()
        await eventually(lambda: pending_has(box, AttemptFinished, a), message="a's finish journalled")

        # On disk, in order, progress 20 replaced by 30: what a restarted agent would send.
        on_disk = [_decoder.decode(p.data) for p in journal_puts(box.directory)]
        assert summary([("", r) for r in on_disk]) == [
            ("Started", b, ""),
            ("Progress", a, "30"),
            ("Finished", a, "Completed"),
        ]
        assert not nc.is_connected

        # The outage is real: 30 s without a server (not a synchronisation; the length of the scenario).
        await asyncio.sleep(max(0.0, OUTAGE_S - (time.monotonic() - began)))
        await asyncio.to_thread(server.start)
        outage = time.monotonic() - began
        assert outage >= OUTAGE_S

        (dir_b.state / "go").touch()
        after = [
            ("Started", b, ""),
            ("Progress", a, "30"),
            ("Finished", a, "Completed"),
            ("Finished", b, "Completed"),
        ]
        await eventually(
            lambda: delivered(*before, *after), deadline_s=20, message="reports after the outage"
        )
        await eventually(lambda: not box.pending, message="the outbox emptied")
        ids = [msg_id for msg_id, _ in await stored(js, mine)]
        assert len(ids) == len(set(ids)), "no report was stored twice"
        print(f"outage {outage:.1f}s; {box.sent} reports acknowledged by the stream")
    finally:
        if runner is not None:
            await runner.shutdown()
        if box is not None:
            await box.close()
        await nc.close()
        await asyncio.to_thread(server.close)


# -- restart ------------------------------------------------------------------------------------------------
CHILD = textwrap.dedent("""
    import asyncio, os, sys
    from pathlib import Path
    import msgspec
    from nodus_agent.outbox import Outbox
    from nodus_schema.messages import Report

    async def main(directory: str, entries: str) -> None:
        box = await Outbox.open(Path(directory))
        for subject, msg_id, key, data in msgspec.json.decode(entries):
            await box.append(subject, msgspec.json.decode(data.encode(), type=Report), msg_id=msg_id, key=key)
        os._exit(0)  # killed: no close, nothing flushed but what append made durable

    asyncio.run(main(*sys.argv[1:]))
""")


@pytest.mark.slow  # a second Python process (about 3 s to import the agent on a busy machine)
async def test_an_agent_restart_sends_what_the_outbox_holds(nc: NATS, unique: str, tmp_path: Path) -> None:
    directory = tmp_path / "outbox"
    a = f"{unique}-a"
    made = [started(unique, a), *(progress(unique, a, n) for n in (1, 2, 3)), finished(unique, a)]
    entries = [
        (
            subj,
            msg_id,
            progress_key(NS, a) if isinstance(msg, AttemptProgress) else None,
            msgspec.json.encode(msg).decode(),
        )
        for subj, msg, msg_id in made
    ]
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, str(directory), msgspec.json.encode(entries).decode()
    )
    assert await child.wait() == 0
    with (directory / JOURNAL).open("ab") as f:
        f.write(b'{"op":"put","seq":99,"subject":"nodus.rep')  # torn by a kill mid-write: never acknowledged

    box = await Outbox.open(directory)
    try:
        assert [p.msg_id for p in box.pending] == [
            f"{NS}/{a}:started",
            f"{NS}/{a}:progress:3",
            f"{NS}/{a}:finished",
        ]
        box.start(nc)
        mine = f"nodus.report.{unique}.>"
        expected = [("Started", a, ""), ("Progress", a, "3"), ("Finished", a, "Completed")]
        await eventually(
            lambda: _summary_is(nc.jetstream(), mine, expected), message="the outbox was re-sent"
        )
        await eventually(lambda: not box.pending, message="the outbox emptied")
        assert journal_puts(directory) == []
    finally:
        await box.close()


async def _summary_is(js: JetStreamContext, subjects: str, expected: list[tuple[str, str, str]]) -> bool:
    return summary(await stored(js, subjects)) == expected


# -- ids ----------------------------------------------------------------------------------------------------
async def test_a_report_sent_again_is_dropped_by_its_id(nc: NATS, unique: str, tmp_path: Path) -> None:
    box = await Outbox.open(tmp_path / "outbox")
    try:
        subj, msg, msg_id = finished(unique, f"{unique}-a")
        first = await box.append(subj, msg, msg_id=msg_id)
        assert await box.append(subj, msg, msg_id=msg_id) == first  # pending already: not journalled twice
        assert len(box.pending) == 1
        box.start(nc)
        await asyncio.wait_for(box.wait_sent(first), 10)
        # An agent that restarts before it recorded "reported" journals the same report again.
        again = await box.append(subj, msg, msg_id=msg_id)
        assert again > first
        await asyncio.wait_for(box.wait_sent(again), 10)
        assert box.sent == 2  # both acknowledged by the stream ...
        assert [i for i, _ in await stored(nc.jetstream(), subj)] == [msg_id]  # ... which kept one
    finally:
        await box.close()


# -- coalescing ---------------------------------------------------------------------------------------------
async def test_progress_is_coalesced_and_the_journal_stays_small(
    nc: NATS, unique: str, tmp_path: Path
) -> None:
    directory = tmp_path / "outbox"
    a, b = f"{unique}-a", f"{unique}-b"
    box = await Outbox.open(directory, compact_after=32)
    try:
        for subj, msg, msg_id in (started(unique, a), started(unique, b)):
            await box.append(subj, msg, msg_id=msg_id)
        for n in range(1, 151):  # a long outage: one progress report a second per attempt
            for attempt in (a, b):
                subj, msg, msg_id = progress(unique, attempt, n)
                await box.append(subj, msg, msg_id=msg_id, key=progress_key(NS, attempt))
        for subj, msg, msg_id in (finished(unique, a), finished(unique, b)):
            await box.append(subj, msg, msg_id=msg_id)
        lines = (directory / JOURNAL).read_bytes().count(b"\n")
        assert lines <= 32 + 6, f"the journal was not compacted: {lines} lines for 6 pending reports"
        expected = [
            ("Started", a, ""),
            ("Started", b, ""),
            ("Progress", a, "150"),
            ("Progress", b, "150"),
            ("Finished", a, "Completed"),
            ("Finished", b, "Completed"),
        ]
        assert summary([("", _decoder.decode(p.data)) for p in box.pending]) == expected
        assert [p.msg_id for p in journal_puts(directory)] == [p.msg_id for p in box.pending]
        box.start(nc)
        await eventually(lambda: _summary_is(nc.jetstream(), f"nodus.report.{unique}.>", expected))
    finally:
        await box.close()


# -- the Reporter -------------------------------------------------------------------------------------------
async def test_the_reporter_returns_once_journalled_or_once_delivered(
    nc: NATS, unique: str, tmp_path: Path
) -> None:
    box = await Outbox.open(tmp_path / "outbox")
    try:
        reporter = Reporter(nc.jetstream(), unique, box)
        _, msg, _ = finished(unique, f"{unique}-a")
        await reporter.finished(msg)  # the sender is not started: durable on disk, not sent
        assert [p.msg_id for p in journal_puts(box.directory)] == [f"{NS}/{unique}-a:finished"]
        box.start(nc)
        _, msg_b, _ = finished(unique, f"{unique}-b")
        await asyncio.wait_for(reporter.finished(msg_b, delivered=True), 10)
        assert [r.attempt for _, r in await stored(nc.jetstream(), f"nodus.report.{unique}.>")] == [
            f"{unique}-a",
            f"{unique}-b",
        ]
        # Without an outbox (the simulated fleet) a report is published directly.
        await Reporter(nc.jetstream(), unique).started(NS, f"{unique}-c", "2025-01-01T00:00:00Z")
        assert len(await stored(nc.jetstream(), f"nodus.report.{unique}.>")) == 3
        # Any other report about an attempt goes the same way, in order (here a throughput sample).
        _, sample, _ = progress(unique, f"{unique}-b", 7)
        await asyncio.wait_for(reporter.send(sample, f"{NS}/{unique}-b:sample:1", delivered=True), 10)
        assert [i for i, _ in await stored(nc.jetstream(), f"nodus.report.{unique}.>")][-1].endswith(
            ":sample:1"
        )
    finally:
        await box.close()


async def test_two_agents_cannot_share_an_outbox(tmp_path: Path) -> None:
    box = await Outbox.open(tmp_path / "outbox")
    try:
        with pytest.raises(OutboxBusy, match="NODUS_AGENT_WORKDIR"):
            await Outbox.open(tmp_path / "outbox")
    finally:
        await box.close()
    await (await Outbox.open(tmp_path / "outbox")).close()  # free again once closed


def test_a_journal_replays_puts_less_acks_and_skips_torn_lines() -> None:
    lines = [
        b'{"op":"put","seq":1,"subject":"s","msgId":"x","data":{}}\n',
        b'{"op":"put","seq":2,"subject":"s","msgId":"p1","key":"k","data":{}}\n',
        b'{"op":"ack","seq":1}\n',
        b"not json\n",
        b'{"op":"put","seq":3,"subject":"s","msgId":"p2","key":"k","data":{}}\n',
        b'{"op":"put","seq":4,"subject":"s","msgId":"y","data":{}',  # torn
    ]
    state = replay(lines, keep_per_key=1)
    assert [p.msg_id for p in state.pending.values()] == ["p2"]
    assert state.next_seq == 4
