"""Output sinks against the machine's real PostgreSQL (127.0.0.1:5432), in a database made for this run.

Connection settings come from the usual libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD), defaulting
to the local server's ``postgres`` superuser over loopback, which is what these machines and CI run.
"""

from __future__ import annotations

import base64
import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio

from nodus_agent.sinking import PostgresTarget, SinkError, TableName, infer_csv, load
from nodus_schema.configs import Connection, ConnectionSpec, PostgresConnection, Secret
from nodus_schema.jobs import SecretKeySelector
from nodus_schema.meta import ObjectMeta

CSV = """step,loss,ok,at,day,note,code
1,0.5,true,2026-01-01T10:00:00Z,2026-01-01,"first, with a comma",007
2,0.25,false,2026-01-01T10:05:00+02:00,2026-01-02,,010
3,,TRUE,,2026-01-03,"",011
"""


def admin() -> PostgresTarget:
    return PostgresTarget(
        host=os.environ.get("PGHOST", "127.0.0.1"),
        port=int(os.environ.get("PGPORT", "5432")),
        user=os.environ.get("PGUSER", "postgres"),
        password=os.environ.get("PGPASSWORD"),
        database=os.environ.get("PGDATABASE", "postgres"),
        ssl_mode="disable",
    )


async def connect(target: PostgresTarget) -> asyncpg.Connection:
    return await asyncpg.connect(
        host=target.host,
        port=target.port,
        user=target.user,
        password=target.password,
        database=target.database,
        ssl=False,
    )


@pytest_asyncio.fixture(scope="module")
async def pg() -> AsyncIterator[PostgresTarget]:
    """A database of its own for this module, dropped at the end."""
    base = admin()
    try:
        conn = await connect(base)
    except (OSError, asyncpg.PostgresError) as e:
        pytest.fail(
            f"PostgreSQL at {base.host}:{base.port} as {base.user}: {e} -- start it "
            "(pg_ctlcluster <version> main start) or set PGHOST/PGPORT/PGUSER/PGPASSWORD",
            pytrace=False,
        )
    name = f"nodus_sink_{secrets.token_hex(4)}"
    await conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield PostgresTarget(
            host=base.host,
            port=base.port,
            user=base.user,
            password=base.password,
            database=name,
            ssl_mode="disable",
        )
    finally:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.close()


@pytest_asyncio.fixture
async def db(pg: PostgresTarget) -> AsyncIterator[asyncpg.Connection]:
    conn = await connect(pg)
    yield conn
    await conn.close()


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


async def column_types(db: asyncpg.Connection, table: str) -> dict[str, str]:
    rows = await db.fetch(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = $1 "
        "ORDER BY ordinal_position",
        table,
    )
    return {r["column_name"]: r["data_type"] for r in rows}


async def test_append_twice_doubles_the_rows_with_inferred_types(
    pg: PostgresTarget, db: asyncpg.Connection, tmp_path: Path
) -> None:
    path = write(tmp_path, "metrics.csv", CSV)
    assert await load(path, pg, "public.Metrics") == 3  # folded to lower case, as PostgreSQL folds
    assert await load(path, pg, "metrics", mode="Append") == 3
    assert await db.fetchval("SELECT count(*) FROM metrics") == 6
    assert await column_types(db, "metrics") == {
        "step": "bigint",
        "loss": "numeric",
        "ok": "boolean",
        "at": "timestamp with time zone",
        "day": "date",
        "note": "text",
        "code": "text",  # leading zeros: an identifier, not the number 7
    }
    row = await db.fetchrow("SELECT * FROM metrics WHERE step = 2 LIMIT 1")
    assert str(row["loss"]) == "0.25"
    assert row["note"] is None  # an unquoted empty field is NULL
    assert row["code"] == "010"
    third = await db.fetchrow("SELECT * FROM metrics WHERE step = 3 LIMIT 1")
    assert (third["loss"], third["at"], third["note"]) == (None, None, "")  # "" stays "" in text


async def test_replace_replaces_content_and_columns(
    pg: PostgresTarget, db: asyncpg.Connection, tmp_path: Path
) -> None:
    await load(write(tmp_path, "a.csv", CSV), pg, "runs", mode="Append")
    rows = await load(write(tmp_path, "b.csv", "name,score\nx,1\ny,2\n"), pg, "runs", mode="Replace")
    assert rows == 2
    assert await column_types(db, "runs") == {"name": "text", "score": "bigint"}
    assert [tuple(r) for r in await db.fetch("SELECT name, score FROM runs ORDER BY name")] == [
        ("x", 1),
        ("y", 2),
    ]
    # Nothing of the staging table is left behind.
    assert await db.fetchval("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'nodus_load_%'") == 0


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("bad.jsonl", '{"step": 1}\n{"step": 2}\n{"step": \n'),  # fails mid-COPY, in our reader
        ("bad.csv", "name,score\nz,1\nx\x00y,2\n"),  # fails inside PostgreSQL's COPY (NUL in text)
    ],
    ids=["jsonl-bad-line", "csv-rejected-by-postgres"],
)
async def test_a_failed_replace_leaves_the_old_table_intact(
    pg: PostgresTarget, db: asyncpg.Connection, tmp_path: Path, name: str, text: str
) -> None:
    table = f"keep_{secrets.token_hex(3)}"
    fmt = "jsonl" if name.endswith(".jsonl") else "csv"
    good = "name,score\nold,1\nold,2\n" if fmt == "csv" else '{"old": true}\n{"old": true}\n'
    await load(write(tmp_path, f"good.{fmt}", good), pg, table, mode="Replace")
    with pytest.raises(SinkError):
        await load(write(tmp_path, name, text), pg, table, mode="Replace")
    assert await db.fetchval(f'SELECT count(*) FROM "{table}"') == 2
    assert await db.fetchval("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'nodus_load_%'") == 0


async def test_replace_refuses_to_drop_a_table_others_depend_on(
    pg: PostgresTarget, db: asyncpg.Connection, tmp_path: Path
) -> None:
    await load(write(tmp_path, "a.csv", "k,v\na,1\n"), pg, "viewed", mode="Replace")
    await db.execute("CREATE VIEW viewed_v AS SELECT * FROM viewed")
    with pytest.raises(SinkError, match="depend on viewed"):
        await load(write(tmp_path, "b.csv", "k,v\nb,2\nc,3\n"), pg, "viewed", mode="Replace")
    assert await db.fetchval("SELECT count(*) FROM viewed_v") == 1


async def test_json_lines_become_line_and_jsonb_doc(
    pg: PostgresTarget, db: asyncpg.Connection, tmp_path: Path
) -> None:
    text = '{"step": 1, "loss": 0.5}\n\n{"step": 2, "loss": 0.25, "tags": ["a\\\\b", "é"]}\n'
    assert await load(write(tmp_path, "events.jsonl", text), pg, "events") == 2
    assert await column_types(db, "events") == {"line": "bigint", "doc": "jsonb"}
    rows = await db.fetch(
        "SELECT line, doc->>'loss' AS loss, doc->'tags'->>0 AS tag FROM events ORDER BY line"
    )
    assert [tuple(r) for r in rows] == [(1, "0.5", None), (3, "0.25", "a\\b")]
    # An explicit format wins over the extension.
    assert await load(write(tmp_path, "events.out", '{"x": 1}\n'), pg, "events", format="jsonl") == 1


@pytest.mark.parametrize(
    "table",
    ['x"; DROP TABLE victim; --', "victim; DROP TABLE victim", "a.b.c", "pg_catalog.pg_class", "1abc", ""],
)
async def test_a_hostile_table_name_is_refused(
    pg: PostgresTarget, db: asyncpg.Connection, tmp_path: Path, table: str
) -> None:
    await db.execute("CREATE TABLE IF NOT EXISTS victim (x int)")
    with pytest.raises(SinkError, match="table"):
        await load(write(tmp_path, "a.csv", "x\n1\n"), pg, table)
    assert await db.fetchval("SELECT to_regclass('victim') IS NOT NULL")


async def test_a_load_id_loads_once(pg: PostgresTarget, db: asyncpg.Connection, tmp_path: Path) -> None:
    path = write(tmp_path, "a.csv", "k\na\nb\n")
    assert await load(path, pg, "once", load_id="attempt-1/metrics.csv") == 2
    assert await load(path, pg, "once", load_id="attempt-1/metrics.csv") == 2  # redelivered: no-op
    assert await db.fetchval("SELECT count(*) FROM once") == 2
    assert await load(path, pg, "once", load_id="attempt-2/metrics.csv") == 2
    assert await db.fetchval("SELECT count(*) FROM once") == 4


async def test_append_to_a_table_without_the_columns_says_which(
    pg: PostgresTarget, db: asyncpg.Connection, tmp_path: Path
) -> None:
    await db.execute("CREATE TABLE narrow (k text, n bigint)")
    with pytest.raises(SinkError, match="no column 'extra'"):
        await load(write(tmp_path, "a.csv", "k,extra\na,1\n"), pg, "narrow")
    # Existing types decide: an empty field in a bigint column loads as NULL.
    assert await load(write(tmp_path, "b.csv", "n,k\n,a\n5,b\n"), pg, "narrow") == 2
    assert [tuple(r) for r in await db.fetch("SELECT k, n FROM narrow ORDER BY k")] == [("a", None), ("b", 5)]


# ---------------------------------------------------------------------------------------------------------
# Pure parts: inference, names, resolving a Connection
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (["1", "-2", "+3"], "bigint"),
        (["1", "9223372036854775808"], "numeric"),  # past bigint
        (["1", "2.5", "1e3"], "numeric"),
        (["007", "8"], "text"),
        (["1.", ".5"], "text"),
        (["true", "False"], "boolean"),
        (["1", "0", "true"], "text"),
        (["2026-01-01", "2026-02-30"], "text"),  # no such day
        (["2026-01-01T00:00:00Z", "2026-01-01 01:00:00.123+05:30"], "timestamptz"),
        (["2026-01-01T00:00:00", "2026-01-01 01:00"], "timestamp"),
        (["2026-01-01T00:00:00Z", "2026-01-01T00:00:00"], "text"),  # zones mixed
        (["2026-01-01", "2026-01-01T00:00:00"], "text"),
        (["", ""], "text"),
        (["NULL", "1"], "text"),
        ([" 1"], "text"),
    ],
)
def test_inference(tmp_path: Path, values: list[str], expected: str) -> None:
    path = write(tmp_path, "x.csv", "c\n" + "".join(f'"{v}"\n' for v in values))
    shape = infer_csv(path)
    assert (shape.header, shape.types, shape.rows) == (["c"], [expected], len(values))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("a,a\n1,2\n", "twice"),
        ("a,\n1,2\n", "header field 2"),
        ("a,b\n1,2\n3\n", "line 3 has 1 fields"),
        ('a\n"unclosed\n', "not valid CSV"),
    ],
)
def test_malformed_csv_is_refused_before_connecting(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(SinkError, match=message):
        infer_csv(write(tmp_path, "x.csv", text))


def test_table_names_fold_and_qualify() -> None:
    assert TableName.parse("public.Metrics") == TableName(table="metrics", schema="public")
    assert TableName.parse("runs") == TableName(table="runs")
    assert TableName.parse("Select").qualified("s") == '"s"."select"'


def test_target_from_a_connection_and_its_secret() -> None:
    conn = Connection(
        metadata=ObjectMeta(name="acme-pg"),
        spec=ConnectionSpec(
            type="Postgres",
            postgres=PostgresConnection(
                host="db.example.com",
                database="analytics",
                user="loader",
                password_ref=SecretKeySelector(name="pg", key="password"),
                ssl_mode="verify-full",
            ),
        ),
    )
    secret = Secret(metadata=ObjectMeta(name="pg"), data={"password": base64.b64encode(b"hunter2").decode()})
    target = PostgresTarget.from_connection(conn, {"pg": secret})
    assert (target.host, target.port, target.database, target.user, target.password, target.ssl_mode) == (
        "db.example.com",
        5432,
        "analytics",
        "loader",
        "hunter2",
        "verify-full",
    )
    assert "hunter2" not in repr(target)
