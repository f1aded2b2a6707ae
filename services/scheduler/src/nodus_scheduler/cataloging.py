"""The accelerator catalog and price book, loaded from the versioned data file shipped with the scheduler."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import msgspec

from nodus_schema.catalog import Catalog


def load_catalog(path: str | Path | None = None) -> Catalog:
    """The price book at ``path`` (NODUS_CATALOG), else the one shipped in ``nodus_scheduler/data``."""
    if path:
        data = Path(path).read_bytes()
    else:
        data = resources.files("nodus_scheduler").joinpath("data/catalog.json").read_bytes()
    return msgspec.json.decode(data, type=Catalog)
