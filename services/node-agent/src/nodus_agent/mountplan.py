"""What a run sees besides its attempt folders: the checkout of spec.source and its Volume mounts (ADR-0036).

:mod:`nodus_agent.sourcing` and :mod:`nodus_agent.mounting` fill a :class:`MountPlan` before the program
starts; the runtimes turn each :class:`Mount` into what they can do: a bind mount in a container, a
symbolic link under ``NODUS_MOUNTS`` for a local process (which has no mount namespace of its own).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

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
    source: SourceRecord | None = None
    records: list[MountRecord] = field(default_factory=list)
    writable: list[WritableMount] = field(default_factory=list)
