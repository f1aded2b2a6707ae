"""The commands: apply, get, describe, delete, logs; account, credits, usage, invoice. Each returns an exit
code and prints to stdout/stderr."""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Final

import msgspec
import yaml

from nodus_cli import manifests
from nodus_cli.client import ApiError, Client
from nodus_cli.config import Config
from nodus_cli.describing import describe_budget, describe_job, describe_sweep
from nodus_cli.kinds import BUDGET, JOB, KINDS, SWEEP, Kind, by_manifest_kind
from nodus_cli.reporting import status_text
from nodus_cli.tables import (
    account_view,
    budgets_table,
    invoice_table,
    jobs_table,
    sweep_view,
    sweeps_table,
    usage_table,
)
from nodus_schema import TERMINAL_PHASES, Sweep, decode, to_builtins
from nodus_schema.billing import Account, Invoice, UsageList
from nodus_schema.defaulting import default_job, default_sweep
from nodus_schema.quantities import micros_to_usd, usd_to_micros

WATCH_INTERVAL_S: Final = 1.0
CLEAR_SCREEN: Final = "\x1b[H\x1b[2J"


def _out(text: str) -> None:
    print(text, file=sys.stdout, flush=True)


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _typed(kind: Kind, raw: dict[str, Any]) -> Any:
    # Lenient on purpose: fields a newer server adds must not break an older CLI.
    return msgspec.convert(raw, kind.object_type)


# How each kind prints: a list, and one object (a Sweep's own view has its cells).
LIST_VIEWS: Final[dict[str, Callable[[Sequence[Any]], str]]] = {
    SWEEP.kind: sweeps_table,
    JOB.kind: jobs_table,
    BUDGET.kind: budgets_table,
}
DESCRIBE: Final[dict[str, Callable[[Any], str]]] = {
    SWEEP.kind: describe_sweep,
    JOB.kind: describe_job,
    BUDGET.kind: describe_budget,
}


def _one_view(kind: Kind, obj: Any) -> str:
    return sweep_view(obj) if kind is SWEEP else LIST_VIEWS[kind.kind]([obj])


def _defaulted(kind: Kind, obj: Any) -> Any:
    """The object as the server stores it: Sweeps and Jobs defaulted, other kinds as written."""
    if kind is SWEEP:
        return default_sweep(obj)
    if kind is JOB:
        return default_job(obj)
    return obj


# ---------------------------------------------------------------------------------------------------------
# apply
# ---------------------------------------------------------------------------------------------------------


def apply(client: Client, config: Config, files: list[str]) -> int:
    """Create every object in the files; an existing one is "unchanged" when its spec is the same."""
    docs: list[manifests.Document] = []
    for path in files:
        try:
            docs += manifests.load(path)
        except manifests.ManifestError as e:
            _err(f"error: {e}")
            return 1
    failed = 0
    for doc in docs:
        if not _apply_one(client, config, doc):
            failed += 1
    return 1 if failed else 0


def _apply_one(client: Client, config: Config, doc: manifests.Document) -> bool:
    kind = by_manifest_kind(doc.data.get("kind"))
    if kind is None:
        known = ", ".join(k.kind for k in KINDS)
        _err(f'error: {doc.source}: kind "{doc.data.get("kind")}" is not a Nodus kind ({known})')
        return False
    metadata = doc.data.get("metadata")
    meta: dict[str, Any] = metadata if isinstance(metadata, dict) else {}
    namespace = meta.get("namespace") or config.namespace
    if config.namespace_given and meta.get("namespace") not in (None, config.namespace):
        _err(
            f'error: {doc.source}: the namespace in the file ("{meta["namespace"]}") does not match '
            f"-n {config.namespace}; drop one of them"
        )
        return False
    try:
        created = client.create(kind.plural, namespace, doc.data)
    except ApiError as e:
        if e.reason == "AlreadyExists" and meta.get("name"):
            return _already_there(client, kind, namespace, meta["name"], doc)
        _err(status_text(e.status))
        return False
    _out(f"{kind.ref(created['metadata']['name'])} created")
    return True


def _already_there(client: Client, kind: Kind, namespace: str, name: str, doc: manifests.Document) -> bool:
    try:
        existing = _typed(kind, client.get(kind.plural, namespace, name))
    except ApiError as e:
        _err(status_text(e.status))
        return False
    # The server stores specs defaulted: default the file's the same way before comparing.
    wanted = decode({k: v for k, v in doc.data.items() if k != "status"}, kind.object_type).value
    if wanted is not None and to_builtins(_defaulted(kind, wanted).spec) == to_builtins(existing.spec):
        _out(f"{kind.ref(name)} unchanged")
        return True
    _err(
        f"error: {kind.ref(name)} already exists with a different spec and was not changed: updates "
        "come with the full API. To replace it, delete it first: "
        f"nodus delete {kind.singular} {name} -n {namespace}"
    )
    return False


# ---------------------------------------------------------------------------------------------------------
# get
# ---------------------------------------------------------------------------------------------------------


def get(
    client: Client,
    config: Config,
    kind: Kind,
    name: str | None,
    *,
    output: str,
    selector: str | None,
    watch: bool,
) -> int:
    ns = config.namespace
    if watch:
        if kind is not SWEEP or not name:
            _err("error: --watch follows one Sweep: nodus get sweep NAME --watch")
            return 1
        return _watch_sweep(client, ns, name)
    try:
        raw = client.get(kind.plural, ns, name) if name else client.list(kind.plural, ns, selector=selector)
    except ApiError as e:
        _err(status_text(e.status))
        return 1
    if output == "json":
        _out(json.dumps(raw, indent=2))
    elif output == "yaml":
        _out(yaml.safe_dump(raw, sort_keys=False, allow_unicode=True).rstrip())
    elif name:
        _out(_one_view(kind, _typed(kind, raw)))
    else:
        items = [_typed(kind, item) for item in raw.get("items", [])]
        if not items:
            _err(f"No {kind.plural} found in {ns} namespace.")
        else:
            _out(LIST_VIEWS[kind.kind](items))
    return 0


FINAL_COST_WAIT_S = 10.0


def _watch_sweep(client: Client, namespace: str, name: str) -> int:
    """Redraw the Sweep every second until it reaches a terminal phase; then print it once more.

    Polling: watch (a stream of changes) comes with the full API. On a terminal the screen is redrawn in
    place; into a pipe or file only frames that changed are written, one after the other.
    """
    tty = sys.stdout.isatty()
    last = ""
    settle_until: float | None = None
    while True:
        try:
            sweep: Sweep = _typed(SWEEP, client.get(SWEEP.plural, namespace, name))
        except ApiError as e:
            _err(status_text(e.status))
            return 1
        frame = sweep_view(sweep)
        finished = sweep.status.phase in TERMINAL_PHASES
        if finished and settle_until is None:
            settle_until = time.monotonic() + FINAL_COST_WAIT_S
        # The last charges post a moment after the last cell ends: wait (a bounded time) for the final cost.
        final_cost = bool(sweep.status.cost and sweep.status.cost.final)
        if finished and (final_cost or time.monotonic() >= (settle_until or 0)):
            # Printed without clearing, so the final table stays on the screen and in the scrollback.
            if tty or frame != last:
                _out(frame)
            return 0
        if tty:
            _out(CLEAR_SCREEN + frame)
        elif frame != last:
            _out(frame + "\n")
        last = frame
        time.sleep(WATCH_INTERVAL_S)


# ---------------------------------------------------------------------------------------------------------
# describe, delete
# ---------------------------------------------------------------------------------------------------------


def describe(client: Client, config: Config, kind: Kind, name: str) -> int:
    try:
        raw = client.get(kind.plural, config.namespace, name)
    except ApiError as e:
        _err(status_text(e.status))
        return 1
    _out(DESCRIBE[kind.kind](_typed(kind, raw)))
    return 0


def delete(client: Client, config: Config, kind: Kind, name: str) -> int:
    try:
        client.delete(kind.plural, config.namespace, name)
    except ApiError as e:
        _err(status_text(e.status))
        return 1
    cells = " (its cell Jobs go with it)" if kind is SWEEP else ""
    _out(f"{kind.ref(name)} deleted{cells}")
    return 0


# ---------------------------------------------------------------------------------------------------------
# logs
# ---------------------------------------------------------------------------------------------------------


def logs(
    client: Client,
    config: Config,
    name: str,
    *,
    follow: bool,
    index: int | None,
    tail: int | None,
    attempt: int | None = None,
    timestamps: bool = False,
) -> int:
    """Print a Job's log (one index, every attempt of it unless ``attempt``); ``follow`` streams it until
    the Job finishes, as ``kubectl logs -f``."""
    params = {"follow": "true"} if follow else {}
    for key, value in (("index", index), ("tailLines", tail), ("attempt", attempt)):
        if value is not None:
            params[key] = str(value)
    if timestamps:
        params["timestamps"] = "true"
    out = sys.stdout.buffer
    try:
        for chunk in client.log(config.namespace, name, params, follow=follow):
            out.write(chunk)
            out.flush()  # as it arrives: a followed log is read while the program runs
    except ApiError as e:
        _err(status_text(e.status))
        return 1
    return 0


# ---------------------------------------------------------------------------------------------------------
# account, credits, usage, invoice (issue #7)
# ---------------------------------------------------------------------------------------------------------


def _print(raw: dict[str, Any], output: str, table: Callable[[], str]) -> None:
    if output == "json":
        _out(json.dumps(raw, indent=2))
    elif output == "yaml":
        _out(yaml.safe_dump(raw, sort_keys=False, allow_unicode=True).rstrip())
    else:
        _out(table())


def account(client: Client, config: Config, *, output: str = "table") -> int:
    """The project's balances: granted = available + held + spent."""
    try:
        raw = client.account(config.namespace)
    except ApiError as e:
        _err(status_text(e.status))
        return 1
    _print(raw, output, lambda: account_view(msgspec.convert(raw, Account)))
    return 0


def _canonical_usd(amount: str) -> str:
    """``$100`` → ``100.00``; what does not parse is sent as typed, for the server to say what is wrong."""
    text = amount.strip().removeprefix("$")
    try:
        return micros_to_usd(usd_to_micros(text))
    except ValueError:
        return text


def credits(
    client: Client, config: Config, action: str, amount: str, *, grant_id: str | None, note: str = ""
) -> int:
    """Grant (or revoke) credits (the cluster admin only). The id is made here when not given, and printed,
    so that running the command again with ``--id`` after a lost answer counts once."""
    revoke = action == "revoke"
    gid = grant_id or str(uuid.uuid4())
    usd = _canonical_usd(amount)
    body: dict[str, Any] = {"amountUSD": usd, "id": gid, "revoke": revoke}
    if note:
        body["note"] = note
    try:
        raw = client.grant(config.namespace, body)
    except ApiError as e:
        _err(status_text(e.status))
        return 1
    done = f"revoked ${usd} from" if revoke else f"granted ${usd} to"
    _out(f"{done} project {config.namespace} (id {gid}; the same --id again counts once)\n")
    _out(account_view(msgspec.convert(raw, Account)))
    return 0


def usage(client: Client, config: Config, *, month: str | None, output: str = "table") -> int:
    """The project's charges, one row per Attempt (one month, or every month)."""
    ns = config.namespace
    try:
        if output == "csv":
            params = {"month": month} if month else None
            sys.stdout.write(client.csv(client.project_path(ns, "usage"), params))
            return 0
        raw = client.usage(ns, month)
    except ApiError as e:
        _err(status_text(e.status))
        return 1
    listed = msgspec.convert(raw, UsageList)
    if output == "table" and not listed.items:
        when = f" in {month}" if month else ""
        _err(f"No usage found in {ns} namespace{when}.")
        return 0
    _print(raw, output, lambda: usage_table(listed))
    return 0


def invoice(client: Client, config: Config, month: str, *, output: str = "table") -> int:
    """The project's invoice of a month: a line per Sweep (or Job), offering and rate, then the total."""
    ns = config.namespace
    try:
        if output == "csv":
            sys.stdout.write(client.csv(client.project_path(ns, "invoices", month)))
            return 0
        raw = client.invoice(ns, month)
    except ApiError as e:
        _err(status_text(e.status))
        return 1
    _print(raw, output, lambda: invoice_table(msgspec.convert(raw, Invoice)))
    return 0
