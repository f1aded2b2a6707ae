"""Generate ``nodus_sdk/syncclient.py`` from ``nodus_sdk/asyncclient.py`` with unasync.

    .venv/bin/python libs/nodus_sdk/scripts/generate_sync.py            # rewrite syncclient.py
    .venv/bin/python libs/nodus_sdk/scripts/generate_sync.py --out DIR  # write DIR/syncclient.py instead

unasync drops ``async`` and ``await`` and renames tokens (its defaults: ``__aenter__``, ``AsyncIterator``,
``asynccontextmanager``, ...; ours: :data:`REPLACEMENTS`). Ruff then sorts the imports, turns the
``for x in y: yield x`` an async generator has to write into ``yield from y``, and formats the file as the
rest of the tree, so the output is what a person would have written.

A script rather than a module of the package: unasync and ruff are development dependencies, and the
SDK's runtime needs neither. ``tests/sdk/test_generated.py`` regenerates into a temporary directory and
compares, so a hand edit of syncclient.py, or an async change not regenerated, fails the tests.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Final

from unasync import Rule, unasync_files

PACKAGE: Final = Path(__file__).resolve().parents[1] / "src" / "nodus_sdk"
SOURCE: Final = PACKAGE / "asyncclient.py"
TARGET: Final = PACKAGE / "syncclient.py"
SCRIPT: Final = "libs/nodus_sdk/scripts/generate_sync.py"

REPLACEMENTS: Final = {
    "AsyncClient": "Client",  # ours and httpx's; unasync's default rule would say SyncClient
    "AsyncBaseTransport": "BaseTransport",  # httpx
    "aclose": "close",
    "aread": "read",
    "aiter_lines": "iter_lines",
    "aiter_bytes": "iter_bytes",
    "anext": "next",
    "asyncio": "time",  # for asyncio.sleep only, which check_source holds the async client to
    "asyncwatch": "syncwatch",  # the watch is written by hand on both sides (syncwatch.py says why)
}

HEADER: Final = f"""\
# Generated from asyncclient.py by {SCRIPT} (unasync); do not edit.
# Edit asyncclient.py, then run: .venv/bin/python {SCRIPT}
"""

DOCSTRING: Final = '''\
"""The synchronous client: ``Client().sweeps.get("lr")`` returns a :class:`nodus_schema.Sweep`.

Every accessor builds its request with :mod:`nodus_sdk.resources` and :mod:`nodus_sdk.accessing`, the same
calls the async client sends; this module only carries them over ``httpx.Client``. Lists, watches and logs
are iterators; the watch is :mod:`nodus_sdk.syncwatch`.
"""
'''


def check_source(source: str) -> None:
    """Refuse what the replacements would translate wrongly: ``asyncio`` becomes ``time``, so the async
    client may use ``asyncio.sleep`` and nothing else of asyncio."""
    others = sorted(set(re.findall(r"\basyncio\.(\w+)", source)) - {"sleep"})
    if others:
        raise SystemExit(f"asyncclient.py uses asyncio.{', asyncio.'.join(others)}: no sync counterpart")


def unasynced(source: Path) -> str:
    """The source with unasync's rules and ours applied."""
    with tempfile.TemporaryDirectory() as work:
        rule = Rule(fromdir=f"{source.parent}/", todir=f"{work}/", additional_replacements=REPLACEMENTS)
        unasync_files([str(source)], rules=[rule])
        return (Path(work) / source.name).read_text(encoding="utf-8")


def with_docstring(source: str, docstring: str) -> str:
    """The module with its docstring (the async client's) replaced by ``docstring``."""
    first = ast.parse(source).body[0]
    is_docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    if not is_docstring or first.end_lineno is None:
        raise SystemExit("asyncclient.py must start with its docstring")
    return docstring + "".join(source.splitlines(keepends=True)[first.end_lineno :])


def ruff(args: list[str], source: str) -> str:
    """``ruff <args>`` over ``source`` on stdin, as if it were TARGET (whose path picks the config)."""
    command = [sys.executable, "-m", "ruff", *args, "--stdin-filename", str(TARGET), "-"]
    done = subprocess.run(command, input=source, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"ruff {' '.join(args)} failed:\n{done.stderr}")
    return done.stdout


def generate(source: Path = SOURCE) -> str:
    """The text of syncclient.py."""
    text = source.read_text(encoding="utf-8")
    check_source(text)
    sync = HEADER + with_docstring(unasynced(source), DOCSTRING)
    # Unsafe fixes, but only these two rules: UP028 (``yield from``) is unsafe where callers send() into
    # the generator, and nothing sends into these.
    sync = ruff(["check", "--fix", "--unsafe-fixes", "--select", "I,UP028", "--quiet"], sync)
    return ruff(["format", "--quiet"], sync)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate nodus_sdk/syncclient.py from asyncclient.py.")
    parser.add_argument("--out", type=Path, help="write DIR/syncclient.py instead of the package's")
    args = parser.parse_args(argv)
    target = args.out / TARGET.name if args.out else TARGET
    target.write_text(generate(), encoding="utf-8")
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
