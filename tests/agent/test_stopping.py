"""Stops (#19): decided from StopAttempt's typed reason, and carried out per attempt, never behind another.

The runner tests run a real Runner (local processes, reports to the session's nats-server) whose inputs
come from an https server in this process: its ``/held`` answers only once the test sets an event, so an
attempt's download is blocked for exactly as long as a test needs it to be, and nothing here sleeps.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio
from aiohttp import web
from nats.aio.client import Client as NATS

from nodus_agent import processes
from nodus_agent.attemptdir import FINISHED, RUNNING, STARTING, AttemptDir, Record
from nodus_agent.inputcontext import InputSettings
from nodus_agent.keyedlocks import KeyedLocks
from nodus_agent.preparing import Toolkit
from nodus_agent.reporting import Reporter
from nodus_agent.running import AGENT_SHUTDOWN, Runner
from nodus_agent.settings import AgentSettings
from nodus_agent.stopping import CHECKPOINT_REASONS, checkpoint_reason, remember, remembered
from nodus_kit.messaging import Delivery
from nodus_schema.jobs import JobInput, URLInput
from nodus_schema.messages import Assignment, AttemptFinished, StartAttempt, StopAttempt, StopReason
from nodus_testing import certs
from nodus_testing.waiting import eventually

NAMESPACE = "team-a"
BODY = b"input bytes\n"
SIGTERM_EXIT = 128 + 15
FOREVER = [sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"]


# -- the reason on the wire --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("wire", "reason"),
    [
        ({"reason": "MaxCostReached"}, StopReason.MAX_COST_REACHED),
        ({"reason": "GangRestart"}, StopReason.GANG_RESTART),
        ({}, StopReason.UNKNOWN),  # a sender that sets none
        ({"reason": "SomethingNewer"}, StopReason.UNKNOWN),  # a newer scheduler's: still a stop
    ],
)
def test_every_scheduler_s_stop_decodes_to_a_reason(wire: dict[str, Any], reason: StopReason) -> None:
    raw = msgspec.json.encode({"type": "StopAttempt", "namespace": "ns", "attempt": "a1", **wire})
    msg = msgspec.json.decode(raw, type=Assignment)
    assert isinstance(msg, StopAttempt) and msg.reason is reason


def test_a_reason_goes_on_the_wire_as_its_name() -> None:
    msg = StopAttempt(namespace="ns", attempt="a1", reason=StopReason.DEADLINE_EXCEEDED, checkpoint=True)
    wire = msgspec.json.decode(msgspec.json.encode(msg))
    expected = {"type": "StopAttempt", "namespace": "ns", "attempt": "a1", "reason": "DeadlineExceeded"}
    assert wire == {**expected, "checkpoint": True}


def test_the_checkpoint_a_stop_takes_follows_its_reason() -> None:
    assert checkpoint_reason(StopReason.MAX_COST_REACHED) == "CapReached"
    assert checkpoint_reason(StopReason.PREEMPTED) == "Preemption"
    others = [r for r in StopReason if r not in CHECKPOINT_REASONS]
    assert others and {checkpoint_reason(r) for r in others} == {"Suspend"}


# -- locks per key -----------------------------------------------------------------------------------------
async def test_keyed_locks_order_one_key_never_block_another_and_are_dropped() -> None:
    locks: KeyedLocks[str] = KeyedLocks()
    order: list[str] = []
    release_a = asyncio.Event()

    async def first_a() -> None:
        async with locks.hold("a"):
            order.append("a1")
            await release_a.wait()

    async def second_a() -> None:
        async with locks.hold("a"):
            order.append("a2")

    async def only_b() -> None:
        async with locks.hold("b"):
            order.append("b")

    holder = asyncio.create_task(first_a())
    await eventually(lambda: order == ["a1"], message="a's first holder never ran")
    waiter = asyncio.create_task(second_a())
    await asyncio.wait_for(only_b(), 5)  # b never waits on a
    assert order == ["a1", "b"] and "a" in locks and "b" not in locks
    release_a.set()
    await asyncio.wait_for(asyncio.gather(holder, waiter), 5)
    assert order == ["a1", "b", "a2"] and len(locks) == 0


# -- a Runner whose inputs can be held -------------------------------------------------------------------
@dataclass
class Held:
    """An https server whose ``/held`` answers once ``release`` is set; ``asked`` counts the requests."""

    base: str
    ca: Path
    release: asyncio.Event = field(default_factory=asyncio.Event)
    asked: int = 0

    def input(self) -> JobInput:
        return JobInput(name="data", url=URLInput(url=f"{self.base}/held"))


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> certs.Certs:
    return certs.ensure(tmp_path_factory.mktemp("certs"))


@pytest_asyncio.fixture
async def held(tls: certs.Certs) -> AsyncIterator[Held]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls.cert, tls.key)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = Held(base=f"https://127.0.0.1:{sock.getsockname()[1]}", ca=tls.ca)

    async def answer(_: web.Request) -> web.Response:
        server.asked += 1
        await server.release.wait()
        return web.Response(body=BODY)

    app = web.Application()
    app.router.add_get("/held", answer)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    await web.SockSite(runner, sock, ssl_context=context).start()
    try:
        yield server
    finally:
        server.release.set()
        await runner.cleanup()


@pytest_asyncio.fixture
async def runner(nc: NATS, unique: str, tmp_path: Path, held: Held) -> AsyncIterator[Runner]:
    settings = AgentSettings.from_env(
        {
            "NODUS_AGENT_NODE": unique,
            "NODUS_AGENT_WORKDIR": str(tmp_path),
            "NODUS_AGENT_FAKE_GPUS": "true",
            "NODUS_AGENT_STOP_GRACE_S": "3",
        }
    )
    toolkit = Toolkit(nc=nc, inputs=InputSettings(ca_bundle=held.ca))
    running = Runner(settings, Reporter(nc.jetstream(), unique), toolkit=toolkit)
    try:
        yield running
    finally:
        held.release.set()  # a download still held would keep the shutdown waiting for its grace
        await asyncio.wait_for(running.shutdown(), 15)


def start(runner: Runner, attempt: str, command: list[str], **fields: Any) -> StartAttempt:
    node = runner.settings.node
    defaults: dict[str, Any] = {"namespace": NAMESPACE, "job": "train", "index": 0, "attempt_no": 1}
    return StartAttempt(**{**defaults, **fields}, attempt=attempt, node=node, command=command)


def stop(attempt: str, reason: StopReason = StopReason.CANCELLED) -> StopAttempt:
    return StopAttempt(namespace=NAMESPACE, attempt=attempt, reason=reason)


def handle(runner: Runner, msg: StartAttempt | StopAttempt) -> asyncio.Task[None]:
    """The consumer's call, as a task: a test sees whether it returned without waiting on it."""
    delivery: Delivery[Assignment] = Delivery(msg, f"nodus.assign.{runner.settings.node}", {}, 1)
    return asyncio.create_task(runner.handle(delivery))


def record_of(runner: Runner, attempt: str) -> Record | None:
    return AttemptDir(runner.settings.workdir, NAMESPACE, attempt).load()


async def reported(runner: Runner, attempt: str, what: str) -> AttemptFinished:
    """The attempt's AttemptFinished once it is recorded and handed to the bus."""

    def done() -> Record | None:
        record = record_of(runner, attempt)
        return record if record is not None and record.phase == FINISHED and record.reported else None

    record = await eventually(done, message=what)
    assert record is not None and record.report is not None
    return record.report


async def test_a_stop_is_carried_out_while_another_attempt_s_input_download_is_held(
    runner: Runner, held: Held, unique: str, tmp_path: Path
) -> None:
    a, b = f"{unique}-a", f"{unique}-b"
    await handle(runner, start(runner, a, FOREVER))
    await eventually(lambda: (r := record_of(runner, a)) and r.phase == RUNNING, message="a never ran")

    ran_b = tmp_path / "b-ran"
    program_b = [sys.executable, "-c", f"open({str(ran_b)!r}, 'w').close()"]
    started_b = handle(runner, start(runner, b, program_b, inputs=[held.input()]))
    await eventually(lambda: held.asked == 1, message="b's input download never began")
    # b's StartAttempt was acknowledged with its Starting record: its download goes on without the consumer.
    await eventually(started_b.done, message="handling b's StartAttempt waited for its download")
    started_b.result()

    stopping_a = handle(runner, stop(a))
    finished_a = await reported(runner, a, "a's stop waited behind b's download")
    assert (finished_a.reason, finished_a.exit_code) == ("Stopped", SIGTERM_EXIT)
    assert finished_a.message == "asked to stop (Cancelled)"
    await eventually(stopping_a.done, message="handling a's StopAttempt never returned")
    assert remembered(AttemptDir(runner.settings.workdir, NAMESPACE, a)) == stop(a)  # kept before the ack
    # All of that while b's download was still held: b has not run.
    record_b = record_of(runner, b)
    assert not held.release.is_set() and record_b is not None and record_b.phase == STARTING
    assert not ran_b.exists()

    held.release.set()
    finished_b = await reported(runner, b, "b never finished once its input came")
    assert finished_b.reason == "Completed", finished_b.message
    assert ran_b.exists()
    assert (tmp_path / NAMESPACE / b / "inputs" / "data").read_bytes() == BODY
    assert not runner.pending and len(runner.locks) == 0  # nothing kept for attempts that are done


async def test_a_stop_interrupts_its_own_attempt_s_download_and_nothing_runs(
    runner: Runner, held: Held, unique: str, tmp_path: Path
) -> None:
    b = f"{unique}-b"
    ran = tmp_path / "ran"
    msg = start(runner, b, [sys.executable, "-c", f"open({str(ran)!r}, 'w').close()"], inputs=[held.input()])
    await handle(runner, msg)
    await eventually(lambda: held.asked == 1, message="the input download never began")
    # A duplicate StartAttempt meanwhile is answered at once, and starts nothing more.
    await asyncio.wait_for(handle(runner, msg), 5)

    await handle(runner, stop(b, StopReason.JOB_DELETED))
    finished = await reported(runner, b, "the stop waited for the download")
    assert (finished.reason, finished.exit_code) == ("Stopped", None)
    assert finished.message == "asked to stop (JobDeleted)"
    assert not held.release.is_set() and held.asked == 1 and not ran.exists()
    staging = tmp_path / NAMESPACE / b / ".inputs.nodus" / "tmp"
    assert not list(staging.iterdir()), "the interrupted download left its staged file"
    assert not runner.pending


async def test_shutdown_stops_an_attempt_still_downloading_as_stopped(
    runner: Runner, held: Held, unique: str
) -> None:
    b = f"{unique}-b"
    await handle(runner, start(runner, b, FOREVER, inputs=[held.input()]))
    await eventually(lambda: held.asked == 1, message="the input download never began")
    await asyncio.wait_for(runner.shutdown(), 10)
    finished = await reported(runner, b, "the shutdown left the attempt unreported")
    assert (finished.reason, finished.message) == ("Stopped", AGENT_SHUTDOWN)


async def test_a_stop_kept_before_the_agent_died_is_what_the_next_agent_reports(
    runner: Runner, unique: str
) -> None:
    """What an agent killed between acknowledging a stop and carrying it out leaves: a program running and
    the stop on disk. The next agent stops the program and reports Stopped, not Lost."""
    attempt = f"{unique}-orphan"
    sleeper = "import time; time.sleep(60)"
    alive = await asyncio.create_subprocess_exec(sys.executable, "-c", sleeper, start_new_session=True)
    try:
        adir = AttemptDir(runner.settings.workdir, NAMESPACE, attempt)
        adir.create()
        ticks = processes.start_ticks(alive.pid)
        adir.save(Record(phase=RUNNING, pid=alive.pid, pid_start_ticks=ticks, started_epoch_ms=1))
        remember(adir, stop(attempt, StopReason.JOB_DELETED))
        await runner.recover()
        finished = await reported(runner, attempt, "the orphan was never reported")
        assert (finished.reason, finished.message) == ("Stopped", "asked to stop (JobDeleted)")
        assert await asyncio.wait_for(alive.wait(), 5) == -15  # stopped, not left running
    finally:
        if alive.returncode is None:
            alive.kill()
