"""The commands: apply, get, describe, delete, logs; account, credits, usage, invoice. Each returns an exit
code (exiting.py) and prints to stdout/stderr."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Callable
from typing import Any, Final

import msgspec
import yaml

from nodus_cli import exiting, manifests, printing, waiting, watching
from nodus_cli.client import ApiError, Client
from nodus_cli.config import Config
from nodus_cli.describing import (
    describe_attempt,
    describe_budget,
    describe_job,
    describe_pipeline,
    describe_sweep,
    describe_volume,
    describe_workspace,
)
from nodus_cli.kinds import (
    ATTEMPT,
    BUDGET,
    COMPUTE_KINDS,
    JOB,
    KINDS,
    PIPELINE,
    SWEEP,
    VOLUME,
    WORKSPACE,
    Kind,
    by_manifest_kind,
)
from nodus_cli.reporting import status_text
from nodus_cli.requesting import Requests
from nodus_cli.sourcing import SourceDirs, SourceError
from nodus_cli.tables import account_view, invoice_table, sweep_view, usage_table
from nodus_schema import decode, to_builtins
from nodus_schema.attempts import JOB_LABEL
from nodus_schema.billing import Account, Invoice, UsageList
from nodus_schema.defaulting import default_job, default_sweep
from nodus_schema.quantities import micros_to_usd, usd_to_micros

WATCH_INTERVAL_S: float = 1.0
"""``get -w`` of a kind the gateway does not watch (secrets, nodes, offerings) lists it this often."""


def _out(text: str) -> None:
    print(text, file=sys.stdout, flush=True)


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _typed(kind: Kind, raw: dict[str, Any]) -> Any:
    # Lenient on purpose: fields a newer server adds must not break an older CLI.
    return msgspec.convert(raw, kind.object_type)


DESCRIBE: Final[dict[str, Callable[[Any], str]]] = {
    BUDGET.kind: describe_budget,
    ATTEMPT.kind: describe_attempt,
    VOLUME.kind: describe_volume,
    WORKSPACE.kind: describe_workspace,
    PIPELINE.kind: describe_pipeline,
}
ATTEMPTS_PER_SELECTOR: Final = 50
"""Cell Jobs named in one ``nodus.dev/job in (...)`` selector when describe lists a Sweep's Attempts."""


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


Applied = tuple[Kind, str, str, dict[str, Any] | None]
"""What apply created or found unchanged: kind, namespace, name, and the object as the create returned it
(None when it was already there), which ``--wait`` follows from."""


def apply(
    client: Client,
    config: Config,
    files: list[str],
    *,
    wait: bool = False,
    api: Requests | None = None,
    source_dir: str | None = None,
) -> int:
    """Create every object in the files; an existing one is "unchanged" when its spec is the same. With
    ``wait`` (and ``api``), then wait for each Sweep, Job and Pipeline to finish, showing its progress. A
    Job's or Sweep's ``source.dir`` (or ``source_dir`` for those without a source) is packed and uploaded
    first, and sent as ``source.blob`` (sourcing.py)."""
    docs: list[manifests.Document] = []
    for path in files:
        try:
            docs += manifests.load(path)
        except manifests.ManifestError as e:
            _err(f"error: {e}\n{manifests.FIX}")
            return exiting.FAILED
    failed = 0
    applied: list[Applied] = []
    sources = SourceDirs(client, config.server, source_dir)
    for doc in docs:
        done = _apply_one(client, config, doc, sources)
        if done is None:
            failed += 1
        else:
            applied.append(done)
    if wait and api is not None:
        for kind, namespace, name, created in applied:
            if kind not in COMPUTE_KINDS:
                continue
            if waiting.wait(api, kind, namespace, name, start=created) != exiting.OK:
                failed += 1
    return exiting.FAILED if failed else exiting.OK


def _apply_one(
    client: Client, config: Config, doc: manifests.Document, sources: SourceDirs
) -> Applied | None:
    kind = by_manifest_kind(doc.data.get("kind"))
    if kind is None:
        known = ", ".join(k.kind for k in KINDS if k.writable)
        _err(f'error: {doc.source}: kind "{doc.data.get("kind")}" is not a Nodus kind ({known})')
        return None
    if not kind.writable:
        _err(
            f"error: {doc.source}: {kind.plural} are written by Nodus' services, not applied\n"
            f"fix: read them with `nodus get {kind.plural}`; apply Sweeps and Jobs instead"
        )
        return None
    metadata = doc.data.get("metadata")
    meta: dict[str, Any] = metadata if isinstance(metadata, dict) else {}
    namespace = meta.get("namespace") or config.namespace
    if config.namespace_given and meta.get("namespace") not in (None, config.namespace):
        _err(
            f'error: {doc.source}: the namespace in the file ("{meta["namespace"]}") does not match '
            f"-n {config.namespace}\nfix: drop one of them"
        )
        return None
    try:
        doc = sources.resolve(kind, doc, namespace)
    except SourceError as e:
        _err(f"error: {doc.source}: {e}")
        return None
    except ApiError as e:
        _err(status_text(e.status))
        return None
    try:
        created = client.create(kind.plural, namespace, doc.data)
    except ApiError as e:
        if e.reason == "AlreadyExists" and meta.get("name"):
            same = _already_there(client, kind, namespace, meta["name"], doc)
            return (kind, namespace, meta["name"], None) if same else None
        _err(status_text(e.status))
        return None
    name = created["metadata"]["name"]
    _out(f"{kind.ref(name)} created")
    return (kind, namespace, name, created)


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
        "come with the full API.\n"
        f"fix: change it with `nodus patch {kind.singular} {name} -n {namespace} -p '{{\"spec\": ...}}'`, "
        f"or replace it: `nodus delete {kind.singular} {name} -n {namespace}`, then apply again"
    )
    return False


# ---------------------------------------------------------------------------------------------------------
# get
# ---------------------------------------------------------------------------------------------------------


def get(
    api: Requests,
    config: Config,
    kind: Kind,
    name: str | None,
    *,
    output: str,
    selector: str | None,
    watch: bool,
) -> int:
    """List the objects of a kind, or show one; with ``watch``, keep the view current (watching.py)."""
    if watch:
        return _watch(api, config, kind, name, output=output, selector=selector)
    ns = config.namespace
    try:
        if name:
            raw = api.get(kind, ns, name)
        else:
            raw = api.list(kind, ns, {"labelSelector": selector} if selector else None)
    except ApiError as e:
        _err(status_text(e.status))
        return exiting.FAILED
    if output in ("json", "yaml"):
        _out(_dumped(raw, output))
        return exiting.OK
    objects = [_typed(kind, raw)] if name else [_typed(kind, item) for item in raw.get("items", [])]
    if not objects:
        where = f" in {ns} namespace" if kind.namespaced else ""
        _err(f"No {kind.plural} found{where}.")
    elif output == "name":
        _out(printing.names(kind, objects))
    elif name and kind is SWEEP and output == "table":
        _out(sweep_view(objects[0]))
    else:
        _out(printing.list_table(kind, objects, wide=output == "wide"))
    return exiting.OK


def _dumped(raw: dict[str, Any], output: str) -> str:
    if output == "json":
        return json.dumps(raw, indent=2)
    return yaml.safe_dump(raw, sort_keys=False, allow_unicode=True).rstrip()


class SweepFrames:
    """``get sweep NAME -w``: the Sweep's whole view (header, cells, best cells), redrawn in place on a
    terminal; into a pipe or a file each frame that changed, after a blank line."""

    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self.screen = watching.Screen(sys.stdout)
        self.last = ""

    def apply(self, change: watching.Change) -> None:
        if change.type not in ("ADDED", "MODIFIED"):
            return
        frame = sweep_view(_typed(SWEEP, change.obj))
        if frame == self.last:
            return
        if self.tty:
            self.screen.draw(frame)
        else:
            _out(("\n" if self.last else "") + frame)
        self.last = frame


class ObjectStream:
    """``get -w -o json|yaml|name``: each object as it changes (JSON one a line, YAML documents, names)."""

    def __init__(self, kind: Kind, output: str) -> None:
        self.kind, self.output = kind, output

    def apply(self, change: watching.Change) -> None:
        if change.type not in ("ADDED", "MODIFIED", "DELETED"):
            return
        if self.output == "json":
            _out(json.dumps(change.obj, separators=(",", ":")))
        elif self.output == "yaml":
            _out("---\n" + _dumped(change.obj, "yaml"))
        else:
            _out(self.kind.ref(change.key[1]))


def _watch(
    api: Requests, config: Config, kind: Kind, name: str | None, *, output: str, selector: str | None
) -> int:
    """``get -w``: follow the objects until Ctrl-C (exit 0); one Sweep until it ends (0 if it Succeeded,
    1 if it Failed or was Cancelled or deleted)."""
    view: Any
    if output in ("json", "yaml", "name"):
        view = ObjectStream(kind, output)
    elif kind is SWEEP and name and output == "table":
        view = SweepFrames()
    else:
        view = watching.LiveTable(kind, wide=output == "wide")
    ending = waiting.Ending(kind) if kind is SWEEP and name else None
    timeout = ending.remaining if ending else (lambda: None)
    try:
        for change in watching.changes(
            api,
            kind,
            config.namespace,
            name=name,
            selector=selector,
            timeout_s=timeout,
            poll_s=WATCH_INTERVAL_S,
        ):
            view.apply(change)
            if ending is not None and ending.update(change) is not None:
                if ending.deleted:
                    _err(f"{kind.ref(name or '')} was deleted")
                return ending.code or exiting.OK
    except KeyboardInterrupt:
        return exiting.OK  # Ctrl-C is how a watch ends
    except ApiError as e:
        _err(status_text(e.status))
        return exiting.FAILED
    return exiting.OK


# ---------------------------------------------------------------------------------------------------------
# describe, delete
# ---------------------------------------------------------------------------------------------------------


def describe(api: Requests, config: Config, kind: Kind, name: str) -> int:
    try:
        raw = api.get(kind, config.namespace, name)
    except ApiError as e:
        _err(status_text(e.status))
        return exiting.FAILED
    obj = _typed(kind, raw)
    try:
        if kind is JOB:
            _out(describe_job(obj, _attempts_of(api, config.namespace, [name])))
            return exiting.OK
        if kind is SWEEP:
            cells = [c.object or f"{name}-{c.index}" for c in obj.status.cells]
            _out(describe_sweep(obj, _attempts_of(api, config.namespace, cells)))
            return exiting.OK
    except ApiError as e:
        _err(status_text(e.status))
        return exiting.FAILED
    view = DESCRIBE.get(kind.kind)
    # Kinds without a view of their own (Nodes, Offerings ...) print as YAML, the whole object.
    _out(view(obj) if view else _dumped(raw, "yaml"))
    return exiting.OK


def _attempts_of(api: Requests, namespace: str, jobs: list[str]) -> list[Any]:
    """The Attempts of these Jobs (what each ran: its source and mounts), a few selectors' worth."""
    found: list[Any] = []
    for i in range(0, len(jobs), ATTEMPTS_PER_SELECTOR):
        names = ",".join(jobs[i : i + ATTEMPTS_PER_SELECTOR])
        raw = api.list(ATTEMPT, namespace, {"labelSelector": f"{JOB_LABEL} in ({names})"})
        found += [_typed(ATTEMPT, item) for item in raw.get("items", [])]
    return found


def delete(api: Requests, config: Config, kind: Kind, name: str) -> int:
    try:
        api.call("DELETE", api.path(kind, config.namespace, name))
    except ApiError as e:
        _err(status_text(e.status))
        return exiting.FAILED
    cells = " (its cell Jobs go with it)" if kind is SWEEP else ""
    _out(f"{kind.ref(name)} deleted{cells}")
    return exiting.OK


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
