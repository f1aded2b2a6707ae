"""What a run sees besides its attempt folders: the checkout of spec.source and its Volume mounts (ADR-0036).

:mod:`nodus_agent.sourcing` and :mod:`nodus_agent.mounting` fill a :class:`MountPlan` before the program
starts; the runtimes turn each :class:`Mount` into what they can do: a bind mount in a container, a
symbolic link under ``NODUS_MOUNTS`` for a local process (which has no mount namespace of its own).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgspec

from nodus_schema.attempts import MountRecord, SourceRecord


@dataclass(frozen=True)
class Mount:
    """``host`` (a folder on this node) at ``target`` (an absolute path the program sees)."""

    host: Path
    target: str
    read_only: bool = True


@dataclass
class WritableMount:
    """A writable Volume mount: its private copy, committed as the next revision when the index succeeds."""

    volume: str
    host: Path
    target: str
    record: MountRecord


@dataclass
class MountPlan:
    mounts: list[Mount] = field(default_factory=list)
    """Bind mounts (containers) or links (processes), in order: outer paths before inner ones."""
    working_dir: str | None = None
    """The program's working directory when spec.workingDir does not set it: the checkout."""
    source_host: Path | None = None
    """The checkout on this host (the process runtime's working directory)."""
    source_path: str | None = None
    """Where the program sees the checkout (NODUS_SRC in a container)."""
    source: SourceRecord | None = None
    records: list[MountRecord] = field(default_factory=list)
    writable: list[WritableMount] = field(default_factory=list)
    leases: list[Any] = field(default_factory=list)
    """The node cache's leases (:class:`nodus_agent.volumecache.CacheLease`) of the read-only mounts: held
    until the run is over (:func:`nodus_agent.mounting.release`), so no entry a run reads is evicted."""


def _enc(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    raise NotImplementedError(f"{type(obj).__name__} is not part of a mount plan")


def _dec(typ: type, obj: Any) -> Any:
    if typ is Path:
        return Path(obj)
    raise NotImplementedError(f"{typ} is not part of a mount plan")


_encoder = msgspec.json.Encoder(enc_hook=_enc)
_decoder = msgspec.json.Decoder(MountPlan, dec_hook=_dec)


def to_json(plan: MountPlan) -> bytes:
    """The plan as the attempt directory keeps it (``plan.json``): a re-adopted run has no plan in memory."""
    return _encoder.encode(replace(plan, leases=[]))  # leases are this process's locks: never stored


def from_json(data: bytes) -> MountPlan:
    return _decoder.decode(data)
