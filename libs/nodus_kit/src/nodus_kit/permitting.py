"""Least-privilege bus credentials: one nkey user per service and per node agent (ADR-0026).

The table below says, in the bus's own terms (docs/bus.md), what each kind of credential does: which
buckets it writes, lists or only reads key by key, which single keys it owns (a lease, its own Node),
which subjects it publishes, which durable consumers it pulls from, which request/reply subjects it asks
and serves. :func:`permissions` turns one row into the nats-server ``publish``/``subscribe`` allow lists;
bucket and stream names are checked against ``declaring.BUCKETS``/``STREAMS``, and every stream subject
against the declared streams' subjects, so the table cannot name what does not exist.

Only the ``admin`` credential creates or updates streams (``python -m nodus_kit.permitting declare``);
a service started with a credential checks that the streams it uses are there and declares nothing.

Replies: each credential subscribes only to its own inbox prefix, ``_INBOX_<public key>`` (nats-py's
``inbox_prefix``, set by :func:`nodus_kit.connecting.connect` from the seed), so nobody reads another's
replies; request/reply servers answer through nats-server's ``allow_responses`` (one reply per request
received), never through a publish right on somebody's inbox.

CLI::

    python -m nodus_kit.permitting generate --out DIR --node n1 --node n2   # seeds + DIR/accounts.conf
    python -m nodus_kit.permitting declare --url nats://... --seed DIR/admin.nk [--replicas 3]
    python -m nodus_kit.permitting table                                      # the rights, as Markdown
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from nodus_kit import credentials, declaring
from nodus_kit.connecting import connect
from nodus_schema.billing import ACCOUNT_SUBJECT, FUNDING_BUCKET, GRANT_SUBJECT, HOLD_SUBJECT, USAGE_SUBJECT
from nodus_schema.estimating import ESTIMATE_SUBJECT, QUOTE_SUBJECT
from nodus_schema.messages import beat_subject
from nodus_schema.noding import commit_subject, retention_subject, secrets_subject

log = logging.getLogger(__name__)

ACCOUNT: Final = "NODUS"
API: Final = "$JS.API"
RESPONSE_EXPIRES: Final = "1m"
"""How long a server may take to answer a request it received (the callers give up after 5 to 30 s)."""
ACCOUNTS_FILE: Final = "accounts.conf"
NODE_NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
"""A node agent's name: one subject token (the agent's own rule, nodus_agent.configuring)."""

ASSIGNMENTS: Final = "NODUS_ASSIGNMENTS"
REPORTS: Final = "NODUS_REPORTS"
LOGS: Final = "NODUS_LOGS"
DEAD_PREFIX: Final = "nodus.dead"
RETENTION_LEASE: Final = "agent-retention"
"""The one lease every node agent competes for (nodus_agent.retaining)."""
OPERATOR_HIDDEN: Final = ("secrets", "tokens")
"""Buckets even an operator does not read: Secret values and the records of bearer tokens."""


# -- the table --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Durable:
    """A durable pull consumer a credential creates, pulls from, acknowledges and dead-letters for."""

    stream: str
    name: str
    filter: str


@dataclass(frozen=True)
class Access:
    """What one kind of credential does on the bus (every field lists names, not raw subjects)."""

    summary: str
    writes: tuple[str, ...] = ()
    """Buckets it writes, any key (``$KV.<b>.>``), and reads key by key."""
    lists: tuple[str, ...] = ()
    """Buckets it reads whole: key by key, list and watch (ordered consumers)."""
    gets: tuple[str, ...] = ()
    """Buckets it reads key by key only (direct get of a key it names): no listing, no scan."""
    keys: tuple[tuple[str, str], ...] = ()
    """(bucket, key) it reads and writes, and no other key of that bucket (unless it lists the bucket): a
    lease, its own Node; a key may be a pattern (``_.*``: every cluster-scoped key, none of ``_meta``)."""
    publishes: tuple[str, ...] = ()
    """Stream subjects it publishes to (each inside a declared stream)."""
    signals: tuple[str, ...] = ()
    """Core subjects it publishes to that no stream keeps (a node's liveness beats, ADR-0042)."""
    durables: tuple[Durable, ...] = ()
    reads: tuple[str, ...] = ()
    """Streams (not buckets) it reads with ordered consumers and last-message gets."""
    consumers: tuple[str, ...] = ()
    """Streams on which it manages consumers of any name and filter (the simulated fleet only)."""
    requests: tuple[str, ...] = ()
    """Request/reply subjects it asks."""
    serves: tuple[str, ...] = ()
    """Request/reply subjects it answers (replies through ``allow_responses``)."""
    taps: tuple[str, ...] = ()
    """Core subjects it subscribes to: as a bystander (the operator's ``nodus tail``), or to hear what
    no stream keeps (the scheduler's liveness beats)."""
    declares: bool = False
    """Creates and updates every declared stream and bucket (the bootstrap)."""


BILLING_RPC: Final = (QUOTE_SUBJECT, HOLD_SUBJECT, ACCOUNT_SUBJECT, GRANT_SUBJECT, USAGE_SUBJECT)

GATEWAY = Access(
    "the nodus.dev/v1 API: spec and metadata of user objects, auth, logs, estimates and accounts (asks); "
    "deletes Nodes (the cluster admin's)",
    writes=(
        "sweeps",
        "jobs",
        "secrets",
        "connections",
        "budgets",
        "tokens",
        "projects",
        "volumes",
        "workspaces",
        "blobs",
        "serviceaccounts",
        "pipelines",
    ),
    lists=(
        "sweeps",
        "jobs",
        "attempts",
        "secrets",
        "connections",
        "budgets",
        "tokens",
        "projects",
        "nodes",
        "offerings",
        "volumes",
        "workspaces",
        "blobs",
        "serviceaccounts",
        "pipelines",
    ),
    # Nodes: the cluster admin's delete of a record its agent left behind (nodus_gateway.clusterrouting).
    # A delete is a write on the bus (a KV delete marker), so the right is the write of the Node keys.
    keys=(("nodes", "_.*"),),
    reads=(LOGS,),
    # Billing's quote is not among them: the scheduler passes a priced estimate on to billing, which
    # answers the gateway's inbox (ADR-0031).
    requests=(ESTIMATE_SUBJECT, ACCOUNT_SUBJECT, GRANT_SUBJECT, USAGE_SUBJECT),
    # The Node authorizer (nodus_gateway.noding): a run's Secrets, Connections and Volume revisions for the
    # node it is bound to, writable mounts' commits, and retention verdicts; the node is the fourth token.
    serves=(secrets_subject("*"), commit_subject("*"), retention_subject("*")),
)
SWEEPS = Access(
    "cell Jobs of each Sweep, Sweep status, Sweep events",
    writes=("sweeps", "jobs", "pipelines"),
    lists=("sweeps", "jobs", "pipelines"),
    keys=(("leases", "sweep-controller"),),
    publishes=("nodus.events.>",),  # CellNameTaken and the like (nodus_kit.eventing)
)
SCHEDULER = Access(
    "Job status, Attempts, placement, the published price book, assignments, events, estimates (serves)",
    writes=("jobs", "attempts", "nodes", "offerings"),
    lists=("jobs", "attempts", "nodes", "offerings", FUNDING_BUCKET),
    keys=(("leases", "scheduler"),),
    publishes=("nodus.assign.>", "nodus.events.>"),
    durables=(Durable(REPORTS, "scheduler", "nodus.report.>"),),
    requests=(HOLD_SUBJECT, QUOTE_SUBJECT),  # the quote: a priced estimate passed on (ADR-0031)
    serves=(ESTIMATE_SUBJECT,),
    taps=(beat_subject("*"),),  # every node's liveness beats (nodus_scheduler.beating)
)
BILLING = Access(
    "books, holds, funding, Budget status, status.cost of Jobs; quotes, holds and accounts (serves)",
    writes=("accounts", "history", FUNDING_BUCKET, "budgets", "jobs"),
    lists=("accounts", "history", FUNDING_BUCKET, "budgets", "jobs", "sweeps", "attempts", "pipelines"),
    keys=(("leases", "billing"),),
    durables=(Durable(REPORTS, "billing", "nodus.report.>"),),
    publishes=("nodus.events.>",),  # BookRepaired (nodus_billing.repairing)
    serves=BILLING_RPC,
)
FLEET = Access(
    "SIMULATION ONLY: a simulated fleet acts as every node agent (any node's Node, assignments, reports)",
    keys=(("nodes", "_.*"),),
    publishes=("nodus.report.>", "nodus.logs.>"),
    signals=(beat_subject("*"),),
    consumers=(ASSIGNMENTS,),
)
ADMIN = Access(
    "bootstrap: creates and updates the declared streams and buckets, reads no data", declares=True
)


def agent(node: str) -> Access:
    """The credential of the node agent on ``node``: its own Node, assignments and reports only."""
    if not NODE_NAME.fullmatch(node):
        raise ValueError(f"node name {node!r} must be a DNS label (a-z, 0-9, '-'; at most 63 characters)")
    return _agent(node)


def _agent(node: str) -> Access:
    durable = f"agent-{node}"
    return Access(
        f"the node agent of {node}: its Node, its assignments, its own reports and logs; asks for its runs",
        # Node restriction (the model: Kubernetes' Node authorizer): no bucket of tenants' data, not even
        # key by key. A run's Secrets and Connections come from the gateway, which answers only for
        # Attempts bound to this node (nodus_schema.noding); reports and logs name this node.
        keys=(("nodes", f"_.{node}"), ("leases", RETENTION_LEASE)),
        publishes=(f"nodus.report.{node}.>", f"nodus.logs.{node}.>"),
        signals=(beat_subject(node),),  # its own node's liveness only
        durables=(Durable(ASSIGNMENTS, durable, f"nodus.assign.{node}"),),
        requests=(secrets_subject(node), commit_subject(node), retention_subject(node)),
    )


def operator() -> Access:
    """``nodus tail``: subscribes to every subject, reads every stream and bucket but Secrets and
    tokens, and publishes nothing but the JetStream API calls an ordered consumer needs."""
    buckets = tuple(b.name for b in declaring.BUCKETS if b.name not in OPERATOR_HIDDEN)
    # NODUS_ASSIGNMENTS is a work queue: a consumer of it could hold an agent's subject; operators
    # see new assignments on the subject itself.
    streams = tuple(s.name for s in declaring.STREAMS if s.name != ASSIGNMENTS)
    return Access(
        "nodus tail: reads everything but Secrets and tokens; publishes nothing",
        lists=buckets,
        reads=streams,
        taps=("nodus.>", *(f"$KV.{b}.>" for b in buckets)),
    )


KINDS: Final[dict[str, str]] = {
    "gateway": "api-gateway (nodus_gateway)",
    "sweeps": "sweep-controller (nodus_sweeps)",
    "scheduler": "scheduler (nodus_scheduler)",
    "billing": "billing (nodus_billing)",
    "agent": "node-agent (nodus_agent), one per node: agent-<node>",
    "fleet": "simulated fleet (python -m nodus_agent.simulating)",
    "operator": "operators (nodus tail)",
    "admin": "bootstrap (python -m nodus_kit.permitting declare)",
}
"""Credential kinds; the user (file) name is the kind, ``agent-<node>`` for node agents."""

SERVICE_KINDS: Final[dict[str, str]] = {
    "nodus-gateway": "gateway",
    "nodus-sweeps": "sweeps",
    "nodus-scheduler": "scheduler",
    "nodus-billing": "billing",
    "nodus-agent": "agent",
    "nodus-sim-fleet": "fleet",
}
"""``Service.name`` -> credential kind, for the start-up check of the streams a service uses."""


def access_of(user: str) -> Access:
    """The row of a credential by its user name (``gateway``, ``agent-n1``, ...)."""
    fixed = {
        "gateway": GATEWAY,
        "sweeps": SWEEPS,
        "scheduler": SCHEDULER,
        "billing": BILLING,
        "fleet": FLEET,
        "admin": ADMIN,
    }
    if user in fixed:
        return fixed[user]
    if user == "operator":
        return operator()
    if user.startswith("agent-"):
        return agent(user.removeprefix("agent-"))
    raise KeyError(f"no credential kind for user {user!r}: one of {', '.join(KINDS)} (agent-<node>)")


def users(nodes: Iterable[str]) -> list[str]:
    """Every credential of a deployment with these node agents, in a stable order."""
    names = ["gateway", "sweeps", "scheduler", "billing", "fleet", "operator", "admin"]
    for node in sorted(set(nodes)):
        agent(node)  # validates the name
        names.append(f"agent-{node}")
    return names


# -- from the table to nats-server permissions ------------------------------------------------------
@dataclass(frozen=True)
class Permissions:
    """One user's nats-server permissions (subscribe includes its inbox)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: bool


def permissions(access: Access, public_key: str) -> Permissions:
    pub: list[str] = []
    sub: list[str] = [f"{credentials.inbox_prefix(public_key)}.>"]
    for b in access.writes:
        pub += [f"$KV.{_bucket(b)}.>", *_kv_read(b, ">")]
    for b in access.gets:
        pub += _kv_read(b, ">", leader=False)
    for b in access.lists:
        stream = declaring.bucket(b).stream
        pub += [*_kv_read(b, ">"), f"{API}.DIRECT.GET.{stream}", *_ordered(stream), f"{API}.STREAM.NAMES"]
    for b, key in access.keys:
        pub += [f"$KV.{_bucket(b)}.{key}", *_kv_read(b, key, leader=False)]
    for subject in access.publishes:
        pub.append(_stream_subject(subject))
    for d in access.durables:
        _stream(d.stream)
        pub += [
            f"{API}.CONSUMER.INFO.{d.stream}.{d.name}",
            # The filtered form names the filter in the subject (the server checks the body against
            # it), so this right cannot create the same durable over another node's subject.
            f"{API}.CONSUMER.CREATE.{d.stream}.{d.name}.{_stream_subject(d.filter)}",
            f"{API}.CONSUMER.MSG.NEXT.{d.stream}.{d.name}",
            f"$JS.ACK.{d.stream}.{d.name}.>",
            f"{DEAD_PREFIX}.{d.stream}.{d.name}",
        ]
    for s in access.reads:
        pub += [*_ordered(_stream(s)), f"{API}.STREAM.MSG.GET.{s}", f"{API}.DIRECT.GET.{s}"]
    for s in access.consumers:
        _stream(s)
        pub += [
            f"{API}.CONSUMER.CREATE.{s}.>",
            f"{API}.CONSUMER.INFO.{s}.*",
            f"{API}.CONSUMER.DELETE.{s}.*",
            f"{API}.CONSUMER.LIST.{s}",
            f"{API}.CONSUMER.NAMES.{s}",
            f"{API}.CONSUMER.MSG.NEXT.{s}.*",
            f"$JS.ACK.{s}.>",
            f"{DEAD_PREFIX}.{s}.*",
        ]
    pub += access.signals
    pub += access.requests
    sub += access.serves
    sub += access.taps
    if access.declares:
        for name in _stream_names():
            pub += [f"{API}.STREAM.{op}.{name}" for op in ("INFO", "CREATE", "UPDATE")]
    return Permissions(tuple(_unique(pub)), tuple(_unique(sub)), bool(access.serves))


def info_streams(access: Access) -> list[str]:
    """The streams a credential may ask ``STREAM.INFO`` of: every bucket it reads (the kit asks each
    once, for its replicas) and every stream it reads whole."""
    buckets = [*access.writes, *access.gets, *access.lists, *(b for b, _ in access.keys)]
    return _unique([declaring.bucket(b).stream for b in buckets] + list(access.reads))


def _kv_read(b: str, key: str, *, leader: bool = True) -> list[str]:
    """What ``ObjectStore`` and ``Lease`` ask to read ``key`` (a wildcard: any key) of bucket ``b``.

    ``leader=False`` for a credential that may read only keys it names: its stores read with key-scoped
    direct gets only (``ObjectStore(direct_reads=True)``, the node agent's and the fleet's), because the
    leader read has no per-key form and would let it read every key of the bucket by sequence."""
    stream = declaring.bucket(b).stream
    # The direct get with the key in the subject: the server answers with that key's last message and
    # refuses a body, so this right reads only keys it can name, never by sequence. The stream's info
    # (its config and counts, no contents): a store asks it once for the replicas, a service with a
    # credential to see that its streams exist (await_declared).
    direct = [f"{API}.DIRECT.GET.{stream}.$KV.{b}.{key}", f"{API}.STREAM.INFO.{stream}"]
    if not leader:
        return direct
    # A store reads a replicated bucket through its stream leader (storing._get_last: a follower's
    # direct get may be stale).
    return [*direct, f"{API}.STREAM.MSG.GET.{stream}"]


def _ordered(stream: str) -> list[str]:
    """What an ordered consumer (a list, a watch, a log read) asks of the JetStream API."""
    return [
        f"{API}.STREAM.INFO.{stream}",
        f"{API}.CONSUMER.CREATE.{stream}",  # the ephemeral form: the server refuses a durable name here
        f"{API}.CONSUMER.INFO.{stream}.*",
        f"$JS.FC.{stream}.>",  # flow control replies
    ]


def _bucket(name: str) -> str:
    return declaring.bucket(name).name


def _stream(name: str) -> str:
    if name not in _stream_names():
        raise KeyError(f"no stream {name!r} is declared in nodus_kit.declaring")
    return name


def _stream_names() -> list[str]:
    return [b.stream for b in declaring.BUCKETS] + [s.name for s in declaring.STREAMS]


def _stream_subject(subject: str) -> str:
    """``subject``, once it is sure to fall inside a declared stream (a typo would silently allow
    nothing, or something else)."""
    for s in declaring.STREAMS:
        if any(subject_within(subject, pattern) for pattern in s.subjects):
            return subject
    raise KeyError(f"subject {subject!r} is in no stream declared in nodus_kit.declaring.STREAMS")


def subject_within(subject: str, pattern: str) -> bool:
    """Whether every subject ``subject`` (itself possibly a wildcard) matches is matched by
    ``pattern``, with NATS's token wildcards ``*`` (one token) and ``>`` (one or more, last)."""
    s, p = subject.split("."), pattern.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or s[i] == ">" or (token != "*" and token != s[i]):
            return False
    return len(s) == len(p)


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


# -- the nats-server configuration ------------------------------------------------------------------
def render_accounts(entries: Sequence[tuple[str, str]]) -> str:
    """The ``accounts`` block for (user, public key) pairs: one nkey user each, with its permissions.

    No timestamp or seed goes in, so the same keys give the same file (config management sees no
    change)."""
    out = [
        "# Generated by `python -m nodus_kit.permitting generate` from nodus_kit/permitting.py;",
        "# regenerate instead of editing (deploy/nats/README.md). Public keys only: the seeds stay in",
        "# <user>.nk beside this file, mode 0600, each on the one host or pod that runs that user.",
        "accounts {",
        f"  {ACCOUNT}: {{",
        "    jetstream: enabled",
        "    users: [",
    ]
    for user, public_key in entries:
        perms = permissions(access_of(user), public_key)
        out += [
            f"      # {user}: {access_of(user).summary}",
            "      {",
            f"        nkey: {public_key}",
            "        permissions: {",
            *_allow_block("publish", perms.publish),
            *_allow_block("subscribe", perms.subscribe),
        ]
        if perms.allow_responses:
            out.append(f'          allow_responses: {{ max: 1, expires: "{RESPONSE_EXPIRES}" }}')
        out += ["        }", "      }"]
    out += ["    ]", "  }", "}", ""]
    return "\n".join(out)


def _allow_block(verb: str, subjects: Sequence[str]) -> list[str]:
    if not subjects:
        # No allow list would mean "everything": an empty one must be said as a deny of everything.
        return [f'          {verb}: {{ deny: [">"] }}']
    # JSON strings are NATS config strings; quoted, so "$KV..." is never read as a variable.
    return [
        f"          {verb}: {{ allow: [",
        *(f"            {json.dumps(s)}" for s in subjects),
        "          ] }",
    ]


# -- seeds ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Generated:
    """What :func:`generate` wrote: ``DIR/<user>.nk`` per user and ``DIR/accounts.conf``."""

    directory: Path
    public_keys: dict[str, str] = field(default_factory=dict)
    stale: tuple[str, ...] = ()
    """Seed files of users no longer generated (revoked): delete them."""

    @property
    def accounts(self) -> Path:
        return self.directory / ACCOUNTS_FILE

    def seed(self, user: str) -> Path:
        if user not in self.public_keys:
            raise KeyError(f"no credential {user!r} was generated in {self.directory}")
        return self.directory / f"{user}{credentials.SEED_SUFFIX}"


def generate(directory: str | Path, nodes: Iterable[str] = ()) -> Generated:
    """Seeds for every user (kept if there already, created otherwise) and the accounts file."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    keys = {user: _ensure_seed(out / f"{user}{credentials.SEED_SUFFIX}") for user in users(nodes)}
    _write_atomically(out / ACCOUNTS_FILE, render_accounts(list(keys.items())), mode=0o644)
    stale = tuple(sorted(p.stem for p in out.glob(f"*{credentials.SEED_SUFFIX}") if p.stem not in keys))
    return Generated(out, keys, stale)


def _ensure_seed(path: Path) -> str:
    if path.exists():
        os.chmod(path, 0o600)  # a seed readable by others is a leaked seed
        return credentials.seed_public_key(path)
    seed = credentials.new_seed()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.write(fd, seed + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    return credentials.public_key(seed)


def _write_atomically(path: Path, text: str, *, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


# -- start-up: the bootstrap declares, services check -----------------------------------------------
async def declare(url: str, seed: str | Path, *, replicas: int | None = None) -> None:
    """Create or update every declared stream and bucket with the ``admin`` credential."""
    nc = await connect(url, "nodus-declare", nkey_seed=seed)
    try:
        # Unset, as the services without a credential: 3 on a cluster of three or more, never lower.
        count = declaring.replicas_for(getattr(nc, "_server_info", {}), replicas)
        await declaring.ensure(nc.jetstream(), replicas=count, lower=replicas is not None)
    finally:
        await nc.close()


async def await_declared(js: JetStreamContext, service: str, *, deadline_s: float = 60.0) -> None:
    """Wait until the streams ``service`` reads whole exist (the bootstrap may still be running); a
    service with a credential declares nothing itself. Services not in the table check nothing."""
    kind = SERVICE_KINDS.get(service)
    if kind is None:
        return
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    # The node's name does not change which streams an agent uses.
    for stream in info_streams(_agent("node") if kind == "agent" else access_of(kind)):
        while True:
            try:
                await js.stream_info(stream)
                break
            except NotFoundError:
                if loop.time() >= end:
                    raise RuntimeError(
                        f"stream {stream} does not exist: run `python -m nodus_kit.permitting declare` "
                        "with the admin credential first (deploy/nats/README.md)"
                    ) from None
                log.warning("waiting for stream %s: the bootstrap (permitting declare) has not run", stream)
                await asyncio.sleep(1.0)  # a pause between looks, not a synchronisation


# -- the table as Markdown (docs/bus.md) ------------------------------------------------------------
def table(node: str = "<node>") -> str:
    """The rights of each kind, one row each, for people."""
    rows = ["| credential | for | writes | reads | publishes | consumes | asks | serves |", "|---" * 8 + "|"]
    for user in ["gateway", "sweeps", "scheduler", "billing", f"agent-{node}", "fleet", "operator", "admin"]:
        a = _agent(node) if user.startswith("agent-") else access_of(user)
        reads = [*(f"{b}" for b in a.lists), *(f"{b} (by key)" for b in a.gets), *a.reads]
        rows.append(
            "| "
            + " | ".join(
                [
                    f"`{user}`",
                    a.summary,
                    _cell([*a.writes, *(f"{b} `{k}`" for b, k in a.keys)]),
                    _cell(reads) if user != "admin" else "stream configs",
                    _cell([f"`{s}`" for s in (*a.publishes, *a.signals)]),
                    _cell(
                        [f"`{d.name}` on {d.stream}" for d in a.durables]
                        + [f"any on {s}" for s in a.consumers]
                        + [f"`{s}` (core)" for s in a.taps]
                    ),
                    _cell([f"`{s}`" for s in a.requests]),
                    _cell([f"`{s}`" for s in a.serves]),
                ]
            )
            + " |"
        )
    return "\n".join(rows)


def _cell(items: Sequence[str]) -> str:
    return ", ".join(items) if items else "-"


# -- CLI --------------------------------------------------------------------------------------------
DESCRIPTION: Final = (
    "Least-privilege NATS credentials of Nodus: generate seeds and accounts, declare streams."
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nodus_kit.permitting", description=DESCRIPTION)
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="nkey seeds (kept when present) and accounts.conf")
    gen.add_argument("--out", required=True, type=Path, help="directory for <user>.nk and accounts.conf")
    gen.add_argument("--node", action="append", default=[], help="a node agent's name (repeat)")
    dec = commands.add_parser("declare", help="create or update every stream and bucket (admin seed)")
    dec.add_argument("--url", default=os.environ.get("NODUS_NATS_URL", "nats://127.0.0.1:4222"))
    dec.add_argument("--seed", required=True, type=Path, help="the admin credential's seed file")
    env_replicas = os.environ.get("NODUS_STREAM_REPLICAS")
    dec.add_argument("--replicas", type=int, default=int(env_replicas) if env_replicas else None)
    commands.add_parser("table", help="print the rights of each credential kind as Markdown")
    args = parser.parse_args(argv)
    if args.command == "generate":
        try:
            done = generate(args.out, args.node)
        except ValueError as e:
            parser.error(str(e))
        for user, key in done.public_keys.items():
            print(f"{done.seed(user)}  {key}")
        print(f"{done.accounts}  (include it in the nats-server config, then reload the servers)")
        for user in done.stale:
            stale_seed = args.out / f"{user}{credentials.SEED_SUFFIX}"
            print(f"revoked: {user} is in no accounts.conf any more; delete {stale_seed}")
        return 0
    if args.command == "declare":
        asyncio.run(declare(args.url, args.seed, replicas=args.replicas))
        print(f"declared {len(_stream_names())} streams and buckets on {args.url}")
        return 0
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
