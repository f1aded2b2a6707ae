"""The commands: apply, get, describe, delete, logs. Each returns an exit code and prints to stdout/stderr."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Final

import msgspec
import yaml

from nodus_cli import manifests
from nodus_cli.client import ApiError, Client
from nodus_cli.config import Config
from nodus_cli.describing import describe_job, describe_sweep
from nodus_cli.kinds import SWEEP, Kind, by_manifest_kind
from nodus_cli.reporting import status_text
from nodus_cli.tables import jobs_table, sweep_view, sweeps_table
from nodus_schema import TERMINAL_PHASES, Sweep, decode, to_builtins
from nodus_schema.defaulting import default_job, default_sweep

WATCH_INTERVAL_S: Final = 1.0
CLEAR_SCREEN: Final = "\x1b[H\x1b[2J"


def _out(text: str) -> None:
    print(text, file=sys.stdout, flush=True)


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _typed(kind: Kind, raw: dict[str, Any]) -> Any:
    # Lenient on purpose: fields a newer server adds must not break an older CLI.
    return msgspec.convert(raw, kind.object_type)


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
        _err(f'error: {doc.source}: kind "{doc.data.get("kind")}" is not a Nodus kind (Sweep or Job)')
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
    if wanted is not None:
        defaulted = default_sweep(wanted) if kind is SWEEP else default_job(wanted)
        if to_builtins(defaulted.spec) == to_builtins(existing.spec):
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
        obj = _typed(kind, raw)
        _out(sweep_view(obj) if kind is SWEEP else jobs_table([obj]))
    else:
        items = [_typed(kind, item) for item in raw.get("items", [])]
        if not items:
            _err(f"No {kind.plural} found in {ns} namespace.")
        else:
            _out(sweeps_table(items) if kind is SWEEP else jobs_table(items))
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
    obj = _typed(kind, raw)
    _out(describe_sweep(obj) if kind is SWEEP else describe_job(obj))
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
