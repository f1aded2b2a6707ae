"""Reading manifests: YAML or JSON files with one or more documents (``---``), or ``-`` for stdin."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

FIX = (
    "fix: pass YAML or JSON files (- for stdin) of Nodus objects, each with apiVersion: nodus.dev/v1, kind, "
    "metadata.name and spec; `nodus apply --help` has examples"
)


class ManifestError(Exception):
    pass


class _Loader(yaml.SafeLoader):
    """YAML 1.1 without timestamps: the API's times are RFC 3339 strings, and a loader that turned them
    into datetimes would send back another spelling (``2026-11-30 05:00:00+00:00``)."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


@dataclass(frozen=True, slots=True)
class Document:
    source: str
    """``sweep.yaml#2``: the file and the document's position, for messages."""
    data: dict[str, Any]
    base: Path = Path(".")
    """The folder of the file (the working directory for stdin): what paths in it (``source.dir``) are
    relative to."""


def load(path: str) -> list[Document]:
    """Every object in the file; ``kind: List`` (and ``SweepList`` ...) contribute their items."""
    name = "stdin" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as e:
        raise ManifestError(f"cannot read {name}: {e.strerror or e}") from None
    raw = _parse(text, name, as_json=path.endswith(".json"))
    base = Path(".") if path == "-" else Path(path).parent
    docs: list[Document] = []
    for i, doc in enumerate(raw, start=1):
        source = f"{name}#{i}" if len(raw) > 1 else name
        if not isinstance(doc, Mapping):
            raise ManifestError(f"{source}: a manifest document must be an object, not {type(doc).__name__}")
        items = doc.get("items")
        if str(doc.get("kind", "")).endswith("List") and isinstance(items, list):
            for j, item in enumerate(items):
                if not isinstance(item, Mapping):
                    raise ManifestError(f"{source}: items[{j}] must be an object")
                docs.append(Document(f"{source} items[{j}]", dict(item), base))
        else:
            docs.append(Document(source, dict(doc), base))
    if not docs:
        raise ManifestError(f"{name} holds no objects")
    return docs


def _parse(text: str, name: str, *, as_json: bool) -> list[Any]:
    if as_json:
        try:
            return [json.loads(text)]
        except json.JSONDecodeError as e:
            raise ManifestError(f"{name} is not valid JSON: {e}") from None
    try:
        return [d for d in yaml.load_all(text, Loader=_Loader) if d is not None]
    except yaml.YAMLError as e:
        raise ManifestError(f"{name} is not valid YAML: {e}") from None
