"""``nodus tail SUBJECT``: every message on a bus subject, decoded, as it arrives (docs/bus.md).

Subjects a stream stores (reports, logs, events, dead letters, buckets) are read with an ordered
consumer, from now, from ``--since`` or from the start (``--all``), so what is printed has the stream's
time and order; anything else (``nodus.rpc.*`` requests, the assignments work queue, a filter wider than
one stream) with a plain subscription, live. nodus_schema.subjects says what each subject carries.

Talks to NATS directly, not to the gateway: it is an operator's tool, for whoever can reach the bus.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import os
import re
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TextIO

import msgspec
import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from nodus_cli.config import find_local_env, read_env_file
from nodus_kit import credentials
from nodus_schema import subjects

DEFAULT_NATS: Final = "nats://127.0.0.1:4222"
RAW_LIMIT: Final = 200
"""How much of a payload nodus_schema has no type for is printed (human output)."""
REDACTED: Final = "***"
_DURATION: Final = re.compile(r"(\d+)(ms|s|m|h|d)")
_UNITS: Final = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_TOKEN: Final = re.compile(r"[^\s.*>]+|\*|>")


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "tail",
        help="print every message on a bus subject, decoded, as it arrives (for operators)",
        description="Subscribe to SUBJECT (wildcards * and > allowed) on NATS and print each message "
        "decoded: one line each (a batch of log lines: one per line), or -o json, one object per line. "
        "Subjects a stream stores start from now unless --since or --all says otherwise. Ctrl-C stops.",
    )
    p.add_argument("subject", metavar="SUBJECT", type=_subject, help="e.g. 'nodus.report.>', '$KV.jobs.>'")
    p.add_argument(
        "--server",
        dest="nats_server",
        metavar="URL",
        help=f"NATS (default: NODUS_NATS_URL, then .nodus/local.env, then {DEFAULT_NATS})",
    )
    p.add_argument(
        "--nkey-seed",
        metavar="FILE",
        help="authenticate with this NKey seed file (default: NODUS_NATS_OPERATOR_SEED, then "
        ".nodus/local.env's, which `make up` writes: the read-only operator credential)",
    )
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    when = p.add_mutually_exclusive_group()
    when.add_argument(
        "--since", metavar="DURATION", type=duration, help="start that far back, e.g. 30s, 5m, 1h30m"
    )
    when.add_argument("--all", action="store_true", help="start with the oldest message the stream holds")


def _subject(value: str) -> str:
    tokens = value.split(".")
    if not value or any(not _TOKEN.fullmatch(t) for t in tokens) or ">" in tokens[:-1]:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a NATS subject: dot-separated tokens, * for one token, > only last"
        )
    return value


def duration(value: str) -> dt.timedelta:
    """``30s``, ``5m``, ``1h30m``, ``2d``, ``500ms``."""
    parts = _DURATION.findall(value)
    if not parts or "".join(n + u for n, u in parts) != value:
        raise argparse.ArgumentTypeError(f"{value!r} is not a duration such as 30s, 5m or 1h30m")
    return dt.timedelta(seconds=sum(int(n) * _UNITS[u] for n, u in parts))


def nats_url(given: str | None, environ: Mapping[str, str], cwd: Path) -> str:
    """The flag, then NODUS_NATS_URL, then ``.nodus/local.env`` (as the other commands find theirs)."""
    if given:
        return given
    if environ.get("NODUS_NATS_URL"):
        return environ["NODUS_NATS_URL"]
    local = find_local_env(cwd)
    return (read_env_file(local).get("NODUS_NATS_URL") if local else None) or DEFAULT_NATS


def nkey_seed(given: str | None, environ: Mapping[str, str], cwd: Path) -> str | None:
    """The flag, then NODUS_NATS_OPERATOR_SEED, then ``.nodus/local.env``'s: the bus refuses anonymous
    clients, and the operator credential reads everything but Secrets and tokens (docs/bus.md)."""
    if given:
        return given
    if environ.get("NODUS_NATS_OPERATOR_SEED"):
        return environ["NODUS_NATS_OPERATOR_SEED"]
    local = find_local_env(cwd)
    return read_env_file(local).get("NODUS_NATS_OPERATOR_SEED") if local else None


# -- decoding and rendering (pure) ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Decoded:
    subject: str
    type: str
    headers: dict[str, str]
    data: Any
    """The payload as JSON values (secrets redacted); a string if it is not JSON; None if empty."""
    time: dt.datetime


def decode(subject: str, headers: Mapping[str, str], payload: bytes, time: dt.datetime) -> Decoded:
    row = subjects.subject_type(subject)
    data = _json(payload)
    name = subjects.UNKNOWN
    if row is not None:
        name = row.type_name
        if row.type is not None and payload:
            try:
                typed = msgspec.json.decode(payload, type=row.type)
            except msgspec.DecodeError:
                name = subjects.UNKNOWN  # on a known subject, but not what it should carry
            else:
                # A union's member names itself; a plain int (a compacted revision) keeps the row's name.
                if isinstance(typed, msgspec.Struct):
                    name = type(typed).__name__
        if row.secret:
            data = _redact(data)
    return Decoded(subject, name, dict(headers), data, time)


def _json(payload: bytes) -> Any:
    if not payload:
        return None
    try:
        return msgspec.json.decode(payload)
    except msgspec.DecodeError:
        return payload.decode(errors="replace")


def _redact(data: Any) -> Any:
    if not isinstance(data, dict):
        return REDACTED if data is not None else None
    out = dict(data)
    for key in ("data", "stringData"):
        if isinstance(out.get(key), dict):
            out[key] = dict.fromkeys(out[key], REDACTED)
    return out


_encoder = msgspec.json.Encoder()


def render_json(d: Decoded) -> str:
    return _encoder.encode(
        {
            "time": _rfc3339(d.time),
            "subject": d.subject,
            "type": d.type,
            "headers": d.headers,
            "data": d.data,
        }
    ).decode()


def render_text(d: Decoded) -> list[str]:
    """One line: time, subject, type and a short summary; a batch of log lines gives one per line."""
    head = f"{d.time.strftime('%H:%M:%S.%f')[:12]} {d.subject} {d.type}"
    if d.type == "LogLines" and isinstance(d.data, dict):
        where = f"{d.data.get('namespace')}/{d.data.get('attempt')}"
        lines = d.data.get("lines") or []
        if not lines:
            return [f"{head} {where} (no lines)"]
        return [f"{head} {where} {line.get('stream') or 'log'}: {line.get('text', '')}" for line in lines]
    summary = summarize(d)
    return [f"{head} {summary}".rstrip()]


def summarize(d: Decoded) -> str:
    data, headers = d.data, d.headers
    dead = headers.get("Nodus-Dead-Reason")
    suffix = f" dead: {dead}" if dead else ""
    if d.type == subjects.UNKNOWN or not isinstance(data, dict):
        return _raw(data) + suffix
    for summary in _SUMMARIES:
        text = summary(d.type, data, headers)
        if text is not None:
            return text + suffix
    return _raw(data) + suffix


def _raw(data: Any) -> str:
    if data is None:
        return "(empty)"
    text = data if isinstance(data, str) else _encoder.encode(data).decode()
    return text if len(text) <= RAW_LIMIT else text[:RAW_LIMIT] + "…"


def _object(_: str, data: dict[str, Any], headers: Mapping[str, str]) -> str | None:
    meta = data.get("metadata")
    if not isinstance(meta, dict):
        return None
    ns = meta.get("namespace")
    name = f"{ns}/{meta.get('name')}" if ns and ns != "_" else str(meta.get("name"))
    op = {"create": "ADDED", "update": "MODIFIED", "delete": "DELETED"}.get(headers.get("Nodus-Op", ""), "")
    if headers.get("KV-Operation") in ("DEL", "PURGE"):
        op = "DELETED"
    status: dict[str, Any] = data["status"] if isinstance(data.get("status"), dict) else {}
    phase = f" phase={status['phase']}" if status.get("phase") else ""
    reason = f" reason={status['reason']}" if status.get("reason") else ""
    return f"{op + ' ' if op else ''}{data.get('kind', '')} {name}{phase}{reason}".strip()


def _event(kind: str, data: dict[str, Any], _: Mapping[str, str]) -> str | None:
    if kind != "ObjectEvent":
        return None
    warn = " WARNING" if data.get("severity") == "Warning" else ""
    return (
        f"{data.get('kind')} {data.get('namespace')}/{data.get('name')} {data.get('reason')}{warn}: "
        + str(data.get("message", ""))
    )


def _about_attempt(kind: str, data: dict[str, Any], _: Mapping[str, str]) -> str | None:
    if "attempt" not in data:
        return None
    parts = [f"attempt={data.get('namespace')}/{data['attempt']}"]
    for key in ("node", "reason", "exitCode", "unitsPerSecond", "image"):
        if data.get(key) is not None:
            parts.append(f"{key}={data[key]}")
    if isinstance(data.get("checkpoint"), dict):
        parts.append(f"checkpoint={data['checkpoint'].get('sequence')}")
    return " ".join(parts)


def _lease(kind: str, data: dict[str, Any], _: Mapping[str, str]) -> str | None:
    return f"holder={data.get('holder')}" if kind == "LeaseRecord" else None


def _request(kind: str, data: dict[str, Any], _: Mapping[str, str]) -> str | None:
    # RPC requests and anything else with a namespace or project: who it is about, then the rest raw.
    keys = [k for k in ("namespace", "project", "job") if data.get(k)]
    if not keys:
        return None
    return " ".join(f"{k}={data[k]}" for k in keys) + " " + _raw(data)


_SUMMARIES: Final[tuple[Callable[[str, dict[str, Any], Mapping[str, str]], str | None], ...]] = (
    _event,
    _object,
    _about_attempt,
    _lease,
    _request,
)


def _rfc3339(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# -- the subscription -----------------------------------------------------------------------------------
class CannotConnect(Exception):
    pass


@dataclass
class Tail:
    subject: str
    url: str
    output: str = "text"
    since: dt.timedelta | None = None
    everything: bool = False
    nkey_seed: str | None = None
    out: TextIO = sys.stdout
    err: TextIO = sys.stderr

    broken: bool = False
    """The reader of the output went away (``| head``)."""
    _error: Exception | None = None

    async def run(self, stop: asyncio.Event) -> None:
        self._stop = stop
        nc = await self._connect()
        try:
            await self._subscribe(nc)
            await stop.wait()
        finally:
            with contextlib.suppress(Exception):
                await nc.close()

    async def _connect(self) -> NATS:
        async def quiet(e: Exception) -> None:
            self._error = e

        async def disconnected() -> None:
            print("nodus tail: disconnected from NATS; reconnecting", file=self.err, flush=True)

        async def reconnected() -> None:
            print("nodus tail: reconnected", file=self.err, flush=True)

        self._error = None
        # With a credential, replies may only come to its own inbox prefix (ADR-0026): JetStream's
        # answers to the ordered consumer's requests go there.
        try:
            inbox = {"inbox_prefix": credentials.inbox_of_seed(self.nkey_seed)} if self.nkey_seed else {}
        except (OSError, ValueError) as e:
            raise CannotConnect(f"--nkey-seed {self.nkey_seed}: {e}") from None
        try:
            nc = await nats.connect(
                servers=[u.strip() for u in self.url.split(",")],
                name="nodus-tail",
                connect_timeout=3,
                # Fail fast on the first connect (a wrong URL should not hang); reconnect for ever after.
                max_reconnect_attempts=2,
                reconnect_time_wait=0.5,
                nkeys_seed=self.nkey_seed,
                error_cb=quiet,
                disconnected_cb=disconnected,
                reconnected_cb=reconnected,
                **inbox,
            )
        except ImportError as e:
            raise CannotConnect(f"--nkey-seed needs the nkeys package: {e}") from None
        except Exception as e:
            raise CannotConnect(f"{type(self._error or e).__name__}: {self._error or e}") from None
        # nats-py reads its options on each reconnect: from here on, a server restart is waited out.
        nc.options["max_reconnect_attempts"] = -1
        nc.options["reconnect_time_wait"] = 1.0
        return nc

    async def _subscribe(self, nc: NATS) -> None:
        stream = subjects.stream_for(self.subject)
        replay = self.since is not None or self.everything
        if stream is not None and not stream.work_queue:
            try:
                await nc.jetstream().subscribe(
                    self.subject,
                    stream=stream.name,
                    ordered_consumer=True,
                    config=self._consumer_config(),
                    cb=self._on_message,
                )
                start = "the start" if self.everything else f"{self.since} ago" if self.since else "now"
                self._note(f"following {self.subject} in stream {stream.name} from {start}")
                return
            except NotFoundError:
                self._note(f"stream {stream.name} does not exist (yet): showing new messages only")
        elif replay:
            why = (
                f"{stream.name} is a work queue: what agents took is gone"
                if stream is not None
                else "no stream stores it"
            )
            self._note(f"{self.subject}: {why}; showing new messages only")
        await nc.subscribe(self.subject, cb=self._on_message)
        await nc.flush()  # the server has the subscription: what is published from here on is seen
        self._note(f"following {self.subject} live")

    def _consumer_config(self) -> ConsumerConfig:
        if self.everything:
            return ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
        if self.since is not None:
            start = dt.datetime.now(dt.UTC) - self.since
            return ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME, opt_start_time=start)
        return ConsumerConfig(deliver_policy=DeliverPolicy.NEW)

    async def _on_message(self, msg: Msg) -> None:
        when = dt.datetime.now(dt.UTC)
        if msg.reply and msg.reply.startswith("$JS.ACK."):
            with contextlib.suppress(Exception):
                when = msg.metadata.timestamp
        d = decode(msg.subject, msg.headers or {}, msg.data, when)
        lines = [render_json(d)] if self.output == "json" else render_text(d)
        try:
            self.out.write("".join(line + "\n" for line in lines))
            self.out.flush()
        except BrokenPipeError:
            # The reader went away (| head): that ends the tail, as it ends any Unix filter.
            self.broken = True
            self._stop.set()

    def _note(self, text: str) -> None:
        print(f"nodus tail: {text}", file=self.err, flush=True)


def run(args: argparse.Namespace, environ: Mapping[str, str], cwd: Path) -> int:
    """The command: 0 when stopped (Ctrl-C, SIGTERM, a closed pipe), 1 if NATS cannot be reached."""
    url = nats_url(args.nats_server, environ, cwd)
    tail = Tail(
        args.subject,
        url,
        output=args.output,
        since=args.since,
        everything=args.all,
        nkey_seed=nkey_seed(args.nkey_seed, environ, cwd),
    )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await tail.run(stop)

    try:
        asyncio.run(main())
    except CannotConnect as e:
        print(
            f"error: cannot connect to NATS at {url}: {e}\n"
            "fix: start the stack (make up), or point --server (or NODUS_NATS_URL) at a running "
            "nats-server, e.g. --server nats://127.0.0.1:4222",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        return 0
    if tail.broken:
        # What is left in stdout's buffer can never be written: drop it, so exiting raises nothing.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
