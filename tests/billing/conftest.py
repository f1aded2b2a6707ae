"""The scheduler's rig (``tests/scheduler/conftest.py``: its own nats-server, the real scheduler, a scripted
fleet) for billing's end-to-end tests, loaded from that file so both directories run the same rig."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parents[1] / "scheduler" / "conftest.py"
_NAME = "nodus_tests_scheduler_rig"


def _load() -> object:
    if _NAME in sys.modules:
        return sys.modules[_NAME]
    spec = importlib.util.spec_from_file_location(_NAME, _PATH)
    assert spec is not None and spec.loader is not None, _PATH
    module = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = module
    spec.loader.exec_module(module)
    return module


make_rig = _load().make_rig  # type: ignore[attr-defined]
