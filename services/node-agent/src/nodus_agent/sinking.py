"""Output sinks: one output file loaded into a PostgreSQL table (ADR-0020).

* **CSV** with a header line: one column per header name (kept exactly, quoted), each typed by looking at
  *every* value of the file first (:func:`infer_csv`): boolean, bigint, numeric, date, timestamp or
  timestamptz when every non-empty value is one, text otherwise. Loaded with PostgreSQL's own COPY parser.
* **JSON lines**: a table ``(line bigint, doc jsonb)``: the line number in the file (a table has no order
  of its own) and the document. Every line is checked to be JSON before it is sent.

Modes: ``Append`` adds rows (creating the table when missing) and ``Replace`` builds the new content in a
staging table and swaps it in, all in one transaction: a failure anywhere leaves the old table as it was.
With a ``load_id`` a load happens at most once (a redelivered sink request returns the first count).
"""

from __future__ import annotations

import asyncio
import csv
import re
import secrets
import ssl
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Final

import asyncpg
import msgspec

from nodus_agent.inputcontext import secret_value
from nodus_schema.configs import Connection, Secret

__all__ = [
    "FORMATS",
    "MODES",
    "PostgresTarget",
    "SinkError",
    "TableName",
    "format_of",
    "infer_csv",
    "load",
]

MODES: Final = ("Append", "Replace")
FORMATS: Final = ("csv", "jsonl")
EXTENSIONS: Final = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
LEDGER: Final = "nodus_sink_loads"
"""The table (in the target's schema) that remembers loads made with a load_id."""
MAX_IDENTIFIER: Final = 63
"""PostgreSQL cuts identifiers at NAMEDATALEN - 1 bytes: a longer name would silently become another."""
SWAP_LOCK_TIMEOUT: Final = "60s"
"""How long a Replace waits for readers of the old table before giving up (and leaving it intact)."""
_BATCH: Final = 5000
_IDENT: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_RESERVED_SCHEMAS: Final = re.compile(r"pg_.*|information_schema")

# Inference. Deliberately narrow: a value PostgreSQL might read differently than intended (" 1", "1.",
# "007", "yes", "1/2/2024") makes its column text, which loses nothing.
_INT = re.compile(r"[+-]?(0|[1-9][0-9]*)")
_NUM = re.compile(r"[+-]?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]{1,3})?")
_BOOL = re.compile(r"(?i:true|false)")
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_TS = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,6})?)?")
_ZONE = re.compile(r"Z|[+-][0-9]{2}(:?[0-9]{2})?")
_INT64 = 1 << 63
TYPES: Final = ("boolean", "bigint", "numeric", "date", "timestamp", "timestamptz")
"""The order in which a column's remaining candidate types are preferred; none left means text."""


class SinkError(Exception):
    """The output could not be loaded; the message says what to change. The table is as it was."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


# ---------------------------------------------------------------------------------------------------------
# Where: the database and the table
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PostgresTarget:
    """A Postgres Connection resolved for use: where, as whom, and how strictly TLS is checked."""

    host: str
    database: str
    user: str
    password: str | None = field(default=None, repr=False)  # never in a repr, so never in a log line
    port: int = 5432
    ssl_mode: str = "require"
    """libpq's sslmode: disable, allow, prefer, require, verify-ca or verify-full."""
    ssl_root_cert: Path | None = None
    """CA certificates (PEM) for verify-ca and verify-full; the system's when None."""

    @classmethod
    def from_connection(cls, conn: Connection, secrets: Mapping[str, Secret]) -> PostgresTarget:
        """Resolve a (defaulted) Postgres Connection with the Secret its ``passwordRef`` names."""
        pg, name = conn.spec.postgres, conn.metadata.name
        if conn.spec.type != "Postgres" or pg is None or not (pg.host and pg.database and pg.user):
            raise ValueError(f"Connection {name!r} is not a Postgres Connection with host, database and user")
        password = None
        if pg.password_ref is not None:
            password = secret_value(secrets, pg.password_ref, f"Connection {name!r} passwordRef")
        return cls(
            host=pg.host,
            port=pg.port or 5432,
            database=pg.database,
            user=pg.user,
            password=password,
            ssl_mode=pg.ssl_mode or "require",
        )

    def ssl(self) -> str | ssl.SSLContext:
        """What asyncpg's ``ssl=`` takes: the mode itself, or a context trusting ``ssl_root_cert``."""
        if self.ssl_root_cert is None or self.ssl_mode not in ("verify-ca", "verify-full"):
            return self.ssl_mode
        context = ssl.create_default_context(cafile=str(self.ssl_root_cert))
        context.check_hostname = self.ssl_mode == "verify-full"
        return context


@dataclass(frozen=True)
class TableName:
    """``table`` or ``schema.table``: unquoted SQL identifiers, folded to lower case as PostgreSQL folds
    them, so ``public.Metrics`` is the table a plain ``SELECT * FROM public.Metrics`` reads."""

    table: str
    schema: str | None = None

    @classmethod
    def parse(cls, text: str) -> TableName:
        """Refuses anything but one or two identifiers (letters, digits, '_'): never spliced into SQL raw."""
        parts = text.split(".")
        if len(parts) > 2 or not all(_IDENT.fullmatch(p) for p in parts):
            raise SinkError(
                f"table {text!r} is not a table name: letters, digits and '_' (not first), at most "
                f"{MAX_IDENTIFIER}, optionally schema.table"
            )
        parts = [p.lower() for p in parts]
        if len(parts) == 2 and _RESERVED_SCHEMAS.fullmatch(parts[0]):
            raise SinkError(f"table {text!r} is in a system schema; use a schema of your own, e.g. public")
        if parts[-1] == LEDGER:
            raise SinkError(f"table {text!r} is where Nodus records loads; choose another name")
        return cls(table=parts[-1], schema=parts[0] if len(parts) == 2 else None)

    def qualified(self, schema: str) -> str:
        return f"{quote(schema)}.{quote(self.table)}"


def quote(identifier: str) -> str:
    """A quoted SQL identifier: the only way a name from a spec or a CSV header reaches SQL text."""
    if "\x00" in identifier:
        raise SinkError("a name contains a NUL character")
    return '"' + identifier.replace('"', '""') + '"'


def format_of(path: Path, format: str | None = None) -> str:
    """``format`` if given, else from the file's extension (.csv, .jsonl, .ndjson)."""
    if format is not None:
        if format not in FORMATS:
            raise SinkError(f"format {format!r} is not one of {', '.join(FORMATS)}")
        return format
    found = EXTENSIONS.get(path.suffix.lower())
    if found is None:
        raise SinkError(
            f"cannot tell the format of {path.name!r} from its extension; name it .csv or .jsonl, "
            f"or give the format ({', '.join(FORMATS)})"
        )
    return found


# ---------------------------------------------------------------------------------------------------------
# Load
# ---------------------------------------------------------------------------------------------------------


async def load(
    path: Path,
    target: PostgresTarget,
    table: str,
    *,
    mode: str = "Append",
    format: str | None = None,
    load_id: str | None = None,
) -> int:
    """Load the output file at ``path`` into ``table``; the number of rows loaded.

    ``load_id`` (say ``<attempt>/<output>``) makes the load happen at most once: a second call with the same
    id loads nothing and returns the first call's count. Raises :class:`SinkError`."""
    if mode not in MODES:
        raise SinkError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    name = TableName.parse(table)
    fmt = format_of(path, format)
    shape = await asyncio.to_thread(infer_csv, path) if fmt == "csv" else None
    try:
        conn = await asyncpg.connect(
            host=target.host,
            port=target.port,
            user=target.user,
            password=target.password,
            database=target.database,
            ssl=target.ssl(),
            timeout=30,
        )
    except (asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError) as e:
        raise SinkError(
            f"PostgreSQL refused the Connection's credentials: {e}; check user and password"
        ) from None
    except asyncpg.InvalidCatalogNameError as e:
        raise SinkError(f"{e}; check the Connection's database") from None
    except (OSError, TimeoutError, asyncpg.PostgresError) as e:
        raise SinkError(f"could not connect to {target.host}:{target.port}: {e}", retryable=True) from None
    try:
        return await _load(conn, path, name, mode, fmt, shape, load_id)
    except asyncpg.PostgresError as e:
        raise _sql_error(e, table) from None
    except (OSError, asyncpg.InterfaceError) as e:
        raise SinkError(f"loading into {table} failed: {e}", retryable=True) from None
    finally:
        await conn.close()


async def _load(
    conn: asyncpg.Connection,
    path: Path,
    name: TableName,
    mode: str,
    fmt: str,
    shape: CsvShape | None,
    load_id: str | None,
) -> int:
    schema = name.schema or await conn.fetchval("SELECT current_schema()")
    if schema is None:
        raise SinkError("the database user has no current schema (search_path); name the table schema.table")
    if load_id is not None:
        await _ensure_ledger(conn, schema)
    target = name.qualified(schema)
    async with conn.transaction():
        # Two loads into one table (a retried sink, two indexes) take turns instead of racing CREATE.
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", target)
        if load_id is not None:
            done = await conn.fetchval(
                f"SELECT rows FROM {quote(schema)}.{quote(LEDGER)} WHERE load_id = $1", load_id
            )
            if done is not None:
                return int(done)
        if mode == "Replace":
            rows = await _replace(conn, path, schema, name.table, fmt, shape)
        else:
            rows = await _append(conn, path, schema, name.table, fmt, shape)
        if load_id is not None:
            await conn.execute(
                f"INSERT INTO {quote(schema)}.{quote(LEDGER)} (load_id, table_name, rows) "
                "VALUES ($1, $2, $3)",
                load_id,
                f"{schema}.{name.table}",
                rows,
            )
        return rows


async def _ensure_ledger(conn: asyncpg.Connection, schema: str) -> None:
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", f"{schema}.{LEDGER}")
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {quote(schema)}.{quote(LEDGER)} ("
            "load_id text PRIMARY KEY, table_name text NOT NULL, rows bigint NOT NULL, "
            "loaded_at timestamptz NOT NULL DEFAULT now())"
        )


async def _replace(
    conn: asyncpg.Connection, path: Path, schema: str, table: str, fmt: str, shape: CsvShape | None
) -> int:
    """New content into a staging table, then drop the old and rename: readers are locked out only for
    the swap, not for the whole COPY, and a failure before commit leaves the old table untouched."""
    staging = f"nodus_load_{secrets.token_hex(6)}"
    await conn.execute(f"CREATE TABLE {quote(schema)}.{quote(staging)} ({_columns_sql(fmt, shape)})")
    rows = await _copy(conn, path, schema, staging, fmt, shape, _typed(shape))
    await conn.execute(f"SET LOCAL lock_timeout = '{SWAP_LOCK_TIMEOUT}'")
    await conn.execute(f"DROP TABLE IF EXISTS {quote(schema)}.{quote(table)}")
    await conn.execute(f"ALTER TABLE {quote(schema)}.{quote(staging)} RENAME TO {quote(table)}")
    return rows


async def _append(
    conn: asyncpg.Connection, path: Path, schema: str, table: str, fmt: str, shape: CsvShape | None
) -> int:
    existing = await _existing_columns(conn, schema, table)
    if existing is None:
        await conn.execute(f"CREATE TABLE {quote(schema)}.{quote(table)} ({_columns_sql(fmt, shape)})")
        return await _copy(conn, path, schema, table, fmt, shape, _typed(shape))
    wanted = shape.header if shape is not None else ["line", "doc"]
    missing = [c for c in wanted if c not in existing]
    if missing:
        raise SinkError(
            f"table {schema}.{table} has no column {', '.join(map(repr, missing))}; "
            "add the columns, or use mode Replace to recreate the table"
        )
    # The existing table's types decide: empty fields of its non-text columns load as NULL.
    typed = [c for c in wanted if existing[c] != "S"]
    return await _copy(conn, path, schema, table, fmt, shape, typed)


async def _existing_columns(conn: asyncpg.Connection, schema: str, table: str) -> dict[str, str] | None:
    """Column name to its type's category ('S' for strings) of an existing table; None when there is none."""
    oid = await conn.fetchval("SELECT to_regclass($1)::oid", f"{quote(schema)}.{quote(table)}")
    if oid is None:
        return None
    rows = await conn.fetch(
        """SELECT a.attname, t.typcategory FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
           WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped""",
        oid,
    )
    return {r["attname"]: str(r["typcategory"]) for r in rows}


def _columns_sql(fmt: str, shape: CsvShape | None) -> str:
    if shape is None:
        return "line bigint NOT NULL, doc jsonb NOT NULL"
    return ", ".join(f"{quote(c)} {t}" for c, t in zip(shape.header, shape.types, strict=True))


def _typed(shape: CsvShape | None) -> list[str]:
    if shape is None:
        return []
    return [c for c, t in zip(shape.header, shape.types, strict=True) if t != "text"]


async def _copy(
    conn: asyncpg.Connection,
    path: Path,
    schema: str,
    table: str,
    fmt: str,
    shape: CsvShape | None,
    typed: list[str],
) -> int:
    if shape is not None:
        # PostgreSQL parses the CSV itself (fast, exact): an unquoted empty field is NULL; FORCE_NULL
        # makes a quoted empty one NULL too in typed columns, where "" is no value of the type.
        status = await conn.copy_to_table(
            table,
            schema_name=schema,
            source=path,
            columns=shape.header,
            format="csv",
            header=True,
            encoding="UTF8",
            force_null=typed or None,
        )
    else:
        status = await conn.copy_records_to_table(
            table, schema_name=schema, columns=["line", "doc"], records=_jsonl_records(path)
        )
    return int(status.split()[-1])


def _sql_error(e: asyncpg.PostgresError, table: str) -> SinkError:
    where = f" ({e.context})" if getattr(e, "context", None) else ""
    state = e.sqlstate or ""
    if state == "2BP01":
        return SinkError(
            f"other objects (views, foreign keys) depend on {table}, so Replace cannot drop it: {e}; "
            "drop them first or use mode Append"
        )
    if state == "55P03":
        return SinkError(f"{table} stayed locked by other sessions: {e}; retry later", retryable=True)
    if state.startswith(("22", "23")):
        return SinkError(f"the data does not fit {table}: {e}{where}; fix the file or the table")
    if state.startswith("42"):
        return SinkError(f"PostgreSQL refused the load into {table}: {e}{where}")
    if state.startswith(("08", "53", "57", "40")):
        return SinkError(f"loading into {table} failed: {e}", retryable=True)
    return SinkError(f"loading into {table} failed: {e}{where}")


# ---------------------------------------------------------------------------------------------------------
# CSV: header and types
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CsvShape:
    header: list[str]
    types: list[str]
    """One SQL type per column: boolean, bigint, numeric, date, timestamp, timestamptz or text."""
    rows: int


class _Guess:
    """The types every non-empty value of one column seen so far could still be."""

    def __init__(self) -> None:
        self.left = set(TYPES)
        self.seen = False

    def see(self, value: str) -> None:
        if value == "" or not self.left:
            return  # empty is NULL in every type
        self.seen = True
        self.left = {t for t in self.left if _fits(t, value)}

    @property
    def type(self) -> str:
        if self.seen:
            for t in TYPES:
                if t in self.left:
                    return t
        return "text"


def _fits(sql_type: str, value: str) -> bool:
    if sql_type == "boolean":
        return _BOOL.fullmatch(value) is not None
    if sql_type == "bigint":
        return _INT.fullmatch(value) is not None and -_INT64 <= int(value) < _INT64
    if sql_type == "numeric":
        return _NUM.fullmatch(value) is not None
    if sql_type == "date":
        return _DATE.fullmatch(value) is not None and _valid(date.fromisoformat, value)
    zone = _zone_of(value)
    if zone is None:
        return False
    return (zone != "") == (sql_type == "timestamptz") and _valid(datetime.fromisoformat, value)


def _zone_of(value: str) -> str | None:
    """The time zone suffix of an ISO 8601 timestamp ("" when it has none); None if it is not one."""
    match = _TS.match(value)
    if match is None:
        return None
    zone = value[match.end() :]
    if zone and _ZONE.fullmatch(zone) is None:
        return None
    return zone


def _valid(parse: Callable[[str], object], value: str) -> bool:
    try:
        parse(value)
    except ValueError:
        return False
    return True


def infer_csv(path: Path) -> CsvShape:
    """Read the whole CSV once (blocking: call it in a thread): its header, a type per column, its rows.

    Every row must have as many fields as the header; the header's names must be unique, non-empty and
    at most 63 bytes. Only an empty field is NULL; any other value ("NULL", "NA") is text."""
    csv.field_size_limit(max(csv.field_size_limit(), 1 << 26))
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f, strict=True)
            header = next(reader, None)
            if not header:
                raise SinkError(f"{path.name} is empty: a CSV output starts with a header line")
            _check_header(header)
            guesses = [_Guess() for _ in header]
            rows = 0
            for row in reader:
                if len(row) != len(header):
                    raise SinkError(
                        f"{path.name} line {reader.line_num} has {len(row)} fields; the header has "
                        f"{len(header)}"
                    )
                for guess, value in zip(guesses, row, strict=True):
                    guess.see(value)
                rows += 1
    except csv.Error as e:
        raise SinkError(f"{path.name} is not valid CSV: {e}") from None
    except UnicodeDecodeError as e:
        raise SinkError(f"{path.name} is not UTF-8 text: {e}") from None
    return CsvShape(header=header, types=[g.type for g in guesses], rows=rows)


def _check_header(header: list[str]) -> None:
    seen: set[str] = set()
    for i, column in enumerate(header, start=1):
        if not column or "\x00" in column or len(column.encode()) > MAX_IDENTIFIER:
            raise SinkError(
                f"header field {i} ({column[:80]!r}) is not a column name: "
                f"1 to {MAX_IDENTIFIER} bytes, no NUL"
            )
        if column in seen:
            raise SinkError(f"header names column {column!r} twice; column names must be unique")
        seen.add(column)


# ---------------------------------------------------------------------------------------------------------
# JSON lines
# ---------------------------------------------------------------------------------------------------------


async def _jsonl_records(path: Path) -> AsyncIterator[tuple[int, str]]:
    """(line number, document) for every non-blank line, each checked to be JSON, read in a thread."""
    lines = _jsonl_batches(path)
    while True:
        batch = await asyncio.to_thread(next, lines, None)
        if batch is None:
            return
        for record in batch:
            yield record


def _jsonl_batches(path: Path) -> Iterator[list[tuple[int, str]]]:
    batch: list[tuple[int, str]] = []
    try:
        with path.open(encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                text = line.strip()
                if not text:
                    continue
                try:
                    msgspec.json.decode(text)
                except msgspec.DecodeError as e:
                    raise SinkError(f"{path.name} line {number} is not JSON: {e}") from None
                batch.append((number, text))
                if len(batch) >= _BATCH:
                    yield batch
                    batch = []
    except UnicodeDecodeError as e:
        raise SinkError(f"{path.name} is not UTF-8 text: {e}") from None
    if batch:
        yield batch
