"""Typed objects from YAML or JSON manifests (``kubectl apply -f`` files): one per document, by kind."""

from __future__ import annotations

from typing import Any

import msgspec
import yaml

from nodus_sdk.resources import KINDS


def load_objects(text: str) -> list[Any]:
    """The objects of a YAML (or JSON) text, each decoded into its kind's type (``Sweep``, ``Job``, ...).
    ValueError for a document that is not an object of a known kind, or does not fit its type."""
    by_kind = {k.kind: k.type for k in KINDS}
    out: list[Any] = []
    for i, doc in enumerate(d for d in yaml.safe_load_all(text) if d is not None):
        kind = doc.get("kind") if isinstance(doc, dict) else None
        if kind not in by_kind:
            raise ValueError(f"document {i + 1}: kind {kind!r} is not one of {', '.join(sorted(by_kind))}")
        try:
            out.append(msgspec.convert(doc, by_kind[kind]))
        except msgspec.ValidationError as e:
            raise ValueError(f"document {i + 1} ({kind}): {e}") from None
    return out
