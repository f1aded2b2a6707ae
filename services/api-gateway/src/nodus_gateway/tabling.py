"""Server-side printing: meta.k8s.io/v1 Tables, which ``kubectl get`` asks for and prints as they come.

kubectl sends ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io, ...`` and prints the columns the
server chose, so the columns that matter for a resource (a Sweep's cells done and money spent) are decided
here, once, for kubectl and every other client alike. Rows carry the object's metadata
(PartialObjectMetadata) by default, or the whole object with ``includeObject=Object`` (kubectl asks for it
when it sorts), as the kube-apiserver does.

Everything works on plain JSON data (what the store's objects encode to), so the same code serves a list,
a get and each event of a watch.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import parse_qs

import msgspec
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nodus_gateway.resources import RESOURCES
from nodus_schema import API_VERSION, TERMINAL_PHASES, SweepSpec, parse_time, to_builtins
from nodus_schema.validating import count_cells

TABLE_GROUP: Final = "meta.k8s.io"
TABLE_VERSIONS: Final = ("v1", "v1beta1")
INCLUDE_OBJECT: Final = ("None", "Metadata", "Object")
NONE: Final = "-"

Cell = str | int | bool | None
JSONObject = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str
    description: str
    cell: Callable[[JSONObject, datetime], Cell]
    format: str = ""
    priority: int = 0

    def definition(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "type": self.type,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        }
        return out


# ---------------------------------------------------------------------------------------------------------
# Accept negotiation
# ---------------------------------------------------------------------------------------------------------


def _media_ranges(accept: str) -> Iterable[tuple[str, dict[str, str]]]:
    for part in accept.split(","):
        mime, *params = (p.strip() for p in part.split(";"))
        values = {}
        for p in params:
            key, _, value = p.partition("=")
            values[key.strip().lower()] = value.strip().strip('"')
        yield mime.lower(), values


def table_version(headers: Headers | Mapping[str, str]) -> str | None:
    """The meta.k8s.io version of Table the Accept header asks for first, or None for a plain object.

    Media ranges are taken in the order given (kubectl lists Table v1, Table v1beta1, then JSON): the
    first one the gateway can serve decides, as the kube-apiserver decides.
    """
    for mime, params in _media_ranges(headers.get("accept", "") or ""):
        if params.get("as") == "Table":
            if (
                mime == "application/json"
                and params.get("g") == TABLE_GROUP
                and params.get("v") in TABLE_VERSIONS
            ):
                return params["v"]
            continue  # a Table in a form the gateway does not write: look further
        if mime in ("application/json", "application/*", "*/*") and "as" not in params:
            return None
    return None


def negotiate_table(request: Request) -> bool:
    """Whether the caller asked for a Table (kubectl get does) rather than the object or list."""
    return table_version(request.headers) is not None


def include_object(value: str | None) -> str:
    """``includeObject``: None, Metadata (the default) or Object; anything else reads as the default."""
    return value if value in INCLUDE_OBJECT else "Metadata"


# ---------------------------------------------------------------------------------------------------------
# Cells
# ---------------------------------------------------------------------------------------------------------


def _get(obj: JSONObject, *path: str) -> Any:
    value: Any = obj
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def human_duration(seconds: float) -> str:
    """Kubernetes' HumanDuration (``45s``, ``3m20s``, ``12m``, ``5h10m``, ``3d``): what AGE columns show."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"  # a second of clock skew between writer and reader
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = s // 3600
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    if h < 24 * 8:
        return f"{h // 24}d{h % 24}h" if h % 24 else f"{h // 24}d"
    if h < 24 * 365 * 2:
        return f"{h // 24}d"
    if h < 24 * 365 * 8:
        years = h // (24 * 365)
        days = (h // 24) % 365
        return f"{years}y{days}d" if days else f"{years}y"
    return f"{h // (24 * 365)}y"


def age(obj: JSONObject, now: datetime) -> Cell:
    stamp = _get(obj, "metadata", "creationTimestamp")
    if not isinstance(stamp, str):
        return "<unknown>"
    try:
        return human_duration((now - parse_time(stamp)).total_seconds())
    except ValueError:
        return "<unknown>"


def name(obj: JSONObject, _: datetime) -> Cell:
    value = _get(obj, "metadata", "name")
    return value if isinstance(value, str) else ""


def phase(obj: JSONObject, _: datetime) -> Cell:
    # No phase yet means the controllers have not seen the object: Pending, as the CLI shows it.
    value = _get(obj, "status", "phase")
    return value if isinstance(value, str) and value else "Pending"


def reason(obj: JSONObject, _: datetime) -> Cell:
    value = _get(obj, "status", "reason")
    return value if isinstance(value, str) and value else NONE


def spent(obj: JSONObject, _: datetime) -> Cell:
    # The API's decimal string as it is: a float could print 0.30000000000000004.
    total = _get(obj, "status", "cost", "totalUSD")
    return f"${total}" if isinstance(total, str) and total else NONE


def sweep_cells(obj: JSONObject, _: datetime) -> Cell:
    """``done/total``: cells in a terminal phase over all cells (the matrix's count before any exists)."""
    cells = _get(obj, "status", "cells")
    cells = cells if isinstance(cells, list) else []
    done = sum(1 for c in cells if isinstance(c, Mapping) and c.get("phase") in TERMINAL_PHASES)
    return f"{done}/{len(cells) or _matrix_cells(obj)}"


def _matrix_cells(obj: JSONObject) -> int | str:
    try:
        spec = msgspec.convert(_get(obj, "spec") or {}, SweepSpec)
    except msgspec.ValidationError:
        return "?"
    return count_cells(spec)


def pipeline_stages(obj: JSONObject, _: datetime) -> Cell:
    """``succeeded/total``: stages whose status says Succeeded over the stages of the spec."""
    stages = _get(obj, "spec", "stages")
    seen = _get(obj, "status", "stages")
    seen = seen if isinstance(seen, list) else []
    done = sum(1 for s in seen if isinstance(s, Mapping) and s.get("phase") == "Succeeded")
    return f"{done}/{len(stages) if isinstance(stages, list) else 0}"


def _best(which: str) -> Callable[[JSONObject, datetime], Cell]:
    def cell(obj: JSONObject, _: datetime) -> Cell:
        index = _get(obj, "status", "best", which)
        return index if isinstance(index, int) and not isinstance(index, bool) else None

    return cell


def job_completions(obj: JSONObject, _: datetime) -> Cell:
    """``succeeded/completions``, as Kubernetes' Job prints it (completions defaults to 1)."""
    succeeded = _get(obj, "status", "succeeded")
    completions = _get(obj, "spec", "completions")
    return f"{succeeded if isinstance(succeeded, int) else 0}/{completions or 1}"


def throughput(obj: JSONObject, _: datetime) -> Cell:
    value = _get(obj, "status", "unitsPerSecond")
    return value if isinstance(value, str) and value else NONE


def budget_monthly(obj: JSONObject, _: datetime) -> Cell:
    amount = _get(obj, "spec", "monthlyUSD")
    return f"${amount}" if isinstance(amount, str) and amount else NONE


def budget_used(obj: JSONObject, _: datetime) -> Cell:
    # Billing's figure for status.month; none until billing has seen the Budget.
    used = _get(obj, "status", "usedUSD")
    return f"${used}" if isinstance(used, str) and used else NONE


def budget_month(obj: JSONObject, _: datetime) -> Cell:
    month = _get(obj, "status", "month")
    return month if isinstance(month, str) and month else NONE


def human_bytes(n: int) -> str:
    """``1536`` → ``1.5Ki``: binary units, three significant digits at most (what a SIZE column shows)."""
    value, unit = float(n), ""
    for next_unit in ("Ki", "Mi", "Gi", "Ti", "Pi"):
        if value < 1024:
            break
        value, unit = value / 1024, next_unit
    if not unit:
        return str(n)
    return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"


def _size(value: Any) -> Cell:
    return human_bytes(value) if isinstance(value, int) and not isinstance(value, bool) else NONE


def _latest_revision(obj: JSONObject) -> JSONObject | None:
    revisions = _get(obj, "status", "revisions")
    last = revisions[-1] if isinstance(revisions, list) and revisions else None
    return last if isinstance(last, Mapping) else None


def volume_latest(obj: JSONObject, _: datetime) -> Cell:
    # None, as an integer column without a value is (kubectl prints <none>): no revision yet.
    latest = _get(obj, "status", "latest")
    return latest if isinstance(latest, int) and not isinstance(latest, bool) else None


def volume_size(obj: JSONObject, _: datetime) -> Cell:
    last = _latest_revision(obj)
    return _size(last.get("sizeBytes")) if last is not None else NONE


def volume_writer(obj: JSONObject, _: datetime) -> Cell:
    job = _get(obj, "status", "writer", "job")
    return f"job/{job}" if isinstance(job, str) and job else NONE


def account_role(obj: JSONObject, _: datetime) -> Cell:
    role = _get(obj, "spec", "role")
    return role if isinstance(role, str) and role else NONE


def workspace_files(obj: JSONObject, _: datetime) -> Cell:
    files = _get(obj, "status", "files")
    return files if isinstance(files, int) and not isinstance(files, bool) else 0


def workspace_size(obj: JSONObject, _: datetime) -> Cell:
    return _size(_get(obj, "status", "sizeBytes") or 0)


# ---------------------------------------------------------------------------------------------------------
# Columns per kind
# ---------------------------------------------------------------------------------------------------------

NAME: Final = Column(
    "Name",
    "string",
    "Name must be unique within a namespace (a project). Cannot be updated.",
    name,
    format="name",
)
AGE: Final = Column(
    "Age",
    "string",
    "How long ago the object was created (from metadata.creationTimestamp).",
    age,
)
PHASE: Final = Column("Phase", "string", "The lifecycle phase (status.phase).", phase)
SPENT: Final = Column("Spent", "string", "What has been charged so far (status.cost.totalUSD).", spent)
REASON: Final = Column("Reason", "string", "Why the phase is what it is (status.reason).", reason, priority=1)

COLUMNS: Final[dict[str, tuple[Column, ...]]] = {
    "Sweep": (
        NAME,
        PHASE,
        Column("Cells", "string", "Cells in a terminal phase / all cells of the matrix.", sweep_cells),
        SPENT,
        Column("Best-Cost", "integer", "The index of the cheapest succeeded cell.", _best("byCost")),
        Column(
            "Best-Throughput",
            "integer",
            "The index of the succeeded cell with the most units per second.",
            _best("byThroughput"),
        ),
        AGE,
        REASON,
    ),
    "Pipeline": (
        NAME,
        Column("Stages", "string", "Stages that succeeded / all stages of the Pipeline.", pipeline_stages),
        PHASE,
        Column("Cost", "string", "What its stages have been charged so far (status.cost.totalUSD).", spent),
        AGE,
        REASON,
    ),
    "Job": (
        NAME,
        PHASE,
        Column("Completions", "string", "Succeeded indexes / indexes that must succeed.", job_completions),
        SPENT,
        AGE,
        REASON,
        Column("Throughput", "string", "Units per second the program reported.", throughput, priority=1),
    ),
    "Budget": (
        NAME,
        Column(
            "Monthly", "string", "What the project may spend per UTC month (spec.monthlyUSD).", budget_monthly
        ),
        Column(
            "Used",
            "string",
            "Held and charged in status.month, as billing counts it (status.usedUSD).",
            budget_used,
        ),
        Column("Month", "string", "The UTC month billing counted usedUSD for (status.month).", budget_month),
        AGE,
    ),
    "Volume": (
        NAME,
        Column("Latest", "integer", "The newest revision's number (status.latest).", volume_latest),
        Column(
            "Size", "string", "The newest revision's archive size (what a cold mount downloads).", volume_size
        ),
        Column(
            "Writer", "string", "The Job that may commit the next revision (status.writer).", volume_writer
        ),
        AGE,
    ),
    "ServiceAccount": (
        NAME,
        Column("Role", "string", "What the project's runs may do with it (spec.role).", account_role),
        AGE,
    ),
    "Workspace": (
        NAME,
        Column("Files", "integer", "Files in the home (status.files).", workspace_files),
        Column("Size", "string", "The home's size (status.sizeBytes).", workspace_size),
        AGE,
    ),
}
DEFAULT_COLUMNS: Final = (NAME, AGE)
"""What Kubernetes prints for a custom resource without printer columns."""


def columns_for(kind: str) -> tuple[Column, ...]:
    return COLUMNS.get(kind, DEFAULT_COLUMNS)


# ---------------------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------------------


def _row(obj: JSONObject, columns: tuple[Column, ...], include: str, now: datetime) -> dict[str, Any]:
    row: dict[str, Any] = {"cells": [c.cell(obj, now) for c in columns]}
    if include == "Object":
        row["object"] = dict(obj)
    elif include == "Metadata":
        row["object"] = {
            "kind": "PartialObjectMetadata",
            "apiVersion": f"{TABLE_GROUP}/v1",
            "metadata": obj.get("metadata") or {},
        }
    return row


def to_table(
    resource: Any,
    objects: Iterable[Any],
    *,
    list_meta: Any = None,
    include: str = "Metadata",
    version: str = "v1",
    with_columns: bool = True,
    now: datetime | None = None,
) -> dict[str, Any]:
    """A meta.k8s.io Table of ``objects`` (wire structs or their JSON data) of ``resource``.

    ``resource`` is a row of the resource table (its ``kind`` picks the columns) or a kind name.
    ``list_meta`` (ListMeta or its JSON) becomes the table's metadata: kubectl reads its resourceVersion
    to start ``get -w`` where the list ended. ``with_columns=False`` leaves the column definitions out,
    as a watch may after its first event (kubectl keeps the last ones it saw).
    """
    kind = resource if isinstance(resource, str) else str(getattr(resource, "kind", ""))
    columns = columns_for(kind)
    now = now or datetime.now(UTC)
    rows = [_row(_plain(o), columns, include_object(include), now) for o in objects]
    table: dict[str, Any] = {
        "kind": "Table",
        "apiVersion": f"{TABLE_GROUP}/{version}",
        "metadata": _plain(list_meta) if list_meta is not None else {},
    }
    if with_columns:
        table["columnDefinitions"] = [c.definition() for c in columns]
    table["rows"] = rows
    return table


def _plain(value: Any) -> dict[str, Any]:
    data = value if isinstance(value, Mapping) else to_builtins(value)
    return dict(data) if isinstance(data, Mapping) else {}


def table_of_payload(
    kind: str, payload: JSONObject, *, is_list: bool, include: str = "Metadata", version: str = "v1"
) -> dict[str, Any]:
    """The Table for a response body: a list's items, or one object (the table's resourceVersion is the
    object's, as the kube-apiserver sets it for a get)."""
    if is_list:
        items = payload.get("items") or []
        return to_table(
            kind, items, list_meta=payload.get("metadata") or {}, include=include, version=version
        )
    rv = _get(payload, "metadata", "resourceVersion")
    meta = {"resourceVersion": rv} if isinstance(rv, str) else {}
    return to_table(kind, [payload], list_meta=meta, include=include, version=version)


def table_of_event(
    kind: str, event: JSONObject, *, include: str = "Metadata", version: str = "v1"
) -> dict[str, Any]:
    """One watch event with its object as a one-row Table; an ERROR (a Status) stays as it is.

    A BOOKMARK carries only a resourceVersion, so it becomes a Table with no rows and that version.
    """
    obj = event.get("object")
    if event.get("type") == "ERROR" or not isinstance(obj, Mapping) or obj.get("kind") == "Table":
        return dict(event)
    if event.get("type") == "BOOKMARK":
        rv = _get(obj, "metadata", "resourceVersion")
        table = to_table(kind, [], list_meta={"resourceVersion": rv} if rv else {}, version=version)
        return {**event, "object": table}
    return {**event, "object": table_of_payload(kind, obj, is_list=False, include=include, version=version)}


# ---------------------------------------------------------------------------------------------------------
# Tables for responses the routes wrote as objects
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TableTarget:
    kind: str
    is_list: bool
    watch: bool


def table_target(path: str) -> TableTarget | None:
    """The resource a GET path reads, when a Table of it makes sense (a collection or one object).

    ``/apis/nodus.dev/v1[/watch][/namespaces/<ns>]/<plural>[/<name>]``; subresources are not tabled.
    """
    prefix = f"/apis/{API_VERSION}/"
    if not path.startswith(prefix):
        return None
    segments = [s for s in path[len(prefix) :].split("/") if s]
    watch = bool(segments) and segments[0] == "watch"
    if watch:
        segments = segments[1:]
    if len(segments) >= 3 and segments[0] == "namespaces":
        segments = segments[2:]
    kinds = {r.plural: r.kind for r in RESOURCES}
    if not segments or len(segments) > 2 or segments[0] not in kinds:
        return None
    return TableTarget(kinds[segments[0]], is_list=len(segments) == 1, watch=watch)


def _truthy(values: list[str] | None) -> bool:
    return values is not None and len(values) > 0 and values[-1].lower() not in ("", "0", "false")


class TableResponses:
    """ASGI middleware: a GET of a resource that asked for a Table gets one, whatever the route wrote.

    The routes write objects and lists; rather than teach every route (owned and changed elsewhere) about
    Tables, the response is rewritten on its way out: a list or object becomes a Table, and each event of
    a watch becomes an event of a one-row Table. A response that already is a Table (a route that called
    ``responding.render`` or ``to_table`` itself) and every error pass through untouched.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        target = table_target(scope["path"]) if scope["type"] == "http" and scope["method"] == "GET" else None
        version = table_version(Headers(scope=scope)) if target else None
        if target is None or version is None:
            await self.app(scope, receive, send)
            return
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        include = include_object((query.get("includeObject") or [None])[-1])
        if target.watch or _truthy(query.get("watch")):
            await self.app(scope, receive, _WatchRewriter(send, target.kind, include, version).send)
        else:
            await self.app(scope, receive, _BodyRewriter(send, target, include, version).send)


def _is_json(start: Message) -> bool:
    headers = Headers(raw=start.get("headers", []))
    return headers.get("content-type", "").split(";")[0].strip() == "application/json"


def _without_length(start: Message) -> Message:
    raw = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
    return {**start, "headers": raw}


class _BodyRewriter:
    """Holds back a 200 JSON response until its body is whole, then sends it as a Table."""

    def __init__(self, send: Send, target: TableTarget, include: str, version: str) -> None:
        self._send, self._target, self._include, self._version = send, target, include, version
        self._start: Message | None = None
        self._chunks: list[bytes] = []

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            if message["status"] == 200 and _is_json(message):
                self._start = message
                return
        elif message["type"] == "http.response.body" and self._start is not None:
            self._chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                await self._flush()
            return
        await self._send(message)

    async def _flush(self) -> None:
        assert self._start is not None
        body = b"".join(self._chunks)
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        if isinstance(data, dict) and data.get("kind") not in ("Table", "Status"):
            table = table_of_payload(
                self._target.kind,
                data,
                is_list=self._target.is_list,
                include=self._include,
                version=self._version,
            )
            body = json.dumps(table, separators=(",", ":")).encode()
        start = _without_length(self._start)
        start["headers"] = [*start["headers"], (b"content-length", str(len(body)).encode())]
        await self._send(start)
        await self._send({"type": "http.response.body", "body": body, "more_body": False})


class _WatchRewriter:
    """Turns each newline-delimited event of a 200 watch stream into an event of a one-row Table."""

    def __init__(self, send: Send, kind: str, include: str, version: str) -> None:
        self._send, self._kind, self._include, self._version = send, kind, include, version
        self._active = False
        self._pending = b""

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self._active = message["status"] == 200
            await self._send(_without_length(message) if self._active else message)
            return
        if message["type"] != "http.response.body" or not self._active:
            await self._send(message)
            return
        more = message.get("more_body", False)
        # An event may be split across chunks: only whole lines are rewritten, the rest waits.
        *lines, self._pending = (self._pending + message.get("body", b"")).split(b"\n")
        if not more and self._pending:
            lines, self._pending = [*lines, self._pending], b""
        body = b"".join(self._event(line) + b"\n" for line in lines if line.strip())
        await self._send({**message, "body": body})

    def _event(self, line: bytes) -> bytes:
        try:
            event = json.loads(line)
        except ValueError:
            return line.rstrip(b"\r")
        if not isinstance(event, dict):
            return line
        out = table_of_event(self._kind, event, include=self._include, version=self._version)
        return json.dumps(out, separators=(",", ":")).encode()
