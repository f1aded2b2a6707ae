"""The sync client is generated from the async one (libs/nodus_sdk/scripts/generate_sync.py, unasync).

CI checks it here: the generator, run into a temporary directory, writes exactly the checked-in
syncclient.py, so a hand edit of it, or a change to asyncclient.py not regenerated, fails. The two clients
then offer the same methods with the same parameters, the watch (hand-written on both sides) included.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nodus_sdk import asyncclient, asyncwatch, syncclient, syncwatch

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "libs" / "nodus_sdk" / "scripts" / "generate_sync.py"
CHECKED_IN = ROOT / "libs" / "nodus_sdk" / "src" / "nodus_sdk" / "syncclient.py"
REGENERATE = f"regenerate it: .venv/bin/python {GENERATOR.relative_to(ROOT)}"

# The async names of the methods whose sync names differ.
SYNC_NAME = {
    "aclose": "close",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "__aiter__": "__iter__",
    "__anext__": "__next__",
}
PROTOCOL = {"__init__", *SYNC_NAME, *SYNC_NAME.values()}


def test_the_checked_in_sync_client_is_what_the_generator_writes(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(GENERATOR), "--out", str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    generated = (tmp_path / "syncclient.py").read_text(encoding="utf-8")
    assert generated.startswith("# Generated from asyncclient.py by ")
    assert CHECKED_IN.read_text(encoding="utf-8") == generated, f"syncclient.py is out of date: {REGENERATE}"


def methods(cls: type) -> dict[str, list[tuple[str, Any, Any]]]:
    """The public methods (and the context and iterator protocol) of a class: name -> its parameters."""
    return {
        SYNC_NAME.get(name, name): [
            (p.name, p.kind, p.default) for p in inspect.signature(member).parameters.values()
        ]
        for name, member in inspect.getmembers(cls, callable)
        if not name.startswith("_") or name in PROTOCOL
    }


@pytest.mark.parametrize(
    ("async_class", "sync_class"),
    [
        (asyncclient.AsyncClient, syncclient.Client),
        (asyncclient.ReadResource, syncclient.ReadResource),
        (asyncclient.Resource, syncclient.Resource),
        (asyncclient.SweepResource, syncclient.SweepResource),
        (asyncclient.JobResource, syncclient.JobResource),
        (asyncwatch.Watch, syncwatch.Watch),
    ],
)
def test_both_clients_offer_the_same_methods(async_class: type, sync_class: type) -> None:
    assert methods(async_class) == methods(sync_class)


def test_the_sync_client_is_synchronous() -> None:
    for cls in (syncclient.Client, syncclient.Resource, syncclient.JobResource, syncwatch.Watch):
        for name, member in inspect.getmembers(cls, inspect.isfunction):
            assert not inspect.iscoroutinefunction(member), f"{cls.__name__}.{name}"
            assert not inspect.isasyncgenfunction(member), f"{cls.__name__}.{name}"
    assert syncclient.Watch is syncwatch.Watch
