"""Outputs of an index, uploaded when it succeeds: the Job's declared outputs (``spec.outputs``) and
everything under ``/nodus/outputs`` as the output named ``outputs``.

Layout (docs/checkpoints.md), beside the index's checkpoints::

    s3://<bucket>/<root><namespace>/<job>/<index>/outputs/
        <name>                  a file output: the file's bytes as they are
        <name>.tar.zst          a directory output: tar.zst, its members under <name>/
        <name>/rank-<n>[.tar.zst]   fromRanks All: one object per rank (rank 0 for a Job that is no gang)
        outputs.tar.zst         /nodus/outputs (outputs/rank-<n>.tar.zst from each rank of a gang)

An empty ``/nodus/outputs`` makes no object and no record. Uploading again writes the same keys, so a
retried upload (an agent that restarted after the program's success) is harmless.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import msgspec

from nodus_agent import archiving, packing, uploading
from nodus_agent.checkpointing import index_prefix

log = logging.getLogger(__name__)

IMPLICIT: Final = "outputs"
"""The output made of everything under /nodus/outputs."""
ZERO, ALL = "Zero", "All"
_OUTPUT_NAME = re.compile(r"[a-z0-9._-]{1,64}")


@dataclass(frozen=True)
class DeclaredOutput:
    """One ``spec.outputs`` entry, with its path already resolved to this host (the runner's job)."""

    name: str
    path: Path
    from_ranks: str = ZERO
    """Zero (rank 0 only) or All (every rank, under rank-<n>)."""


class OutputRecord(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel"):
    """One stored output, for the Job's status and for a later Job's ``inputs[].output``."""

    name: str
    uri: str
    key: str
    format: str
    """``file`` (the bytes as they are) or ``tar.zst`` (a directory)."""
    size_bytes: int
    sha256: str
    """Of the stored object's bytes."""
    rank: int | None = None
    """Set for fromRanks All (and for /nodus/outputs of a gang)."""
    files: int = 0
    raw_bytes: int = 0
    skipped: list[str] = msgspec.field(default_factory=list)


class OutputsMissing(Exception):
    """Declared outputs whose path did not exist; the others were uploaded and are in ``records``."""

    def __init__(self, missing: list[DeclaredOutput], records: list[OutputRecord]) -> None:
        self.missing, self.records = missing, records
        names = ", ".join(f"{o.name} ({o.path})" for o in missing)
        super().__init__(
            f"declared outputs not found when the index succeeded: {names}; write them before exiting, "
            "or remove them from spec.outputs"
        )


def check_output_name(name: str) -> str:
    """An output name: ^[a-z0-9._-]{1,64}$, not ``.``/``..``, without the reserved ``nodus.`` prefix."""
    if not _OUTPUT_NAME.fullmatch(name) or name in (".", "..") or name.startswith("nodus."):
        raise ValueError(f"output name {name!r} must match ^[a-z0-9._-]{{1,64}}$ and not start with 'nodus.'")
    return name


def output_key(
    namespace: str,
    job: str,
    index: int,
    name: str,
    *,
    directory: bool,
    rank: int | None = None,
    root: str = "",
) -> str:
    """The key of one output (``rank`` set for fromRanks All)."""
    base = f"{index_prefix(namespace, job, index, root)}outputs/{check_output_name(name)}"
    if rank is not None:
        base = f"{base}/rank-{rank}"
    return f"{base}.{archiving.ARCHIVE_SUFFIX}" if directory else base


async def upload_outputs(
    client: Any,
    bucket: str,
    *,
    namespace: str,
    job: str,
    index: int,
    declared: Sequence[DeclaredOutput],
    outputs_dir: Path | None,
    rank: int | None = None,
    root: str = "",
    level: int = archiving.LEVEL,
    part_size: int = uploading.PART_SIZE,
    in_flight: int = uploading.IN_FLIGHT,
) -> list[OutputRecord]:
    """Upload this index's outputs (this rank's share, in a gang: ``rank`` is the member's node rank,
    None for a Job that is no gang) and return their records, declared outputs first.

    Raises :class:`OutputsMissing` (carrying the records of what was uploaded) when declared paths do
    not exist; any upload error propagates (that upload aborted, the earlier ones stored).
    """
    names = [check_output_name(o.name) for o in declared]
    if IMPLICIT in names or len(set(names)) != len(names):
        raise ValueError(f"output names must be unique and not {IMPLICIT!r} (reserved for /nodus/outputs)")
    uploader = _Uploader(client, bucket, namespace, job, index, root, level, part_size, in_flight)
    records: list[OutputRecord] = []
    missing: list[DeclaredOutput] = []
    for out in declared:
        if out.from_ranks not in (ZERO, ALL):
            raise ValueError(f"output {out.name}: fromRanks {out.from_ranks!r} is not Zero or All")
        if out.from_ranks == ZERO and rank not in (None, 0):
            continue  # rank 0 uploads it
        path, kind = await asyncio.to_thread(_resolve, out.path)
        if kind is None:
            missing.append(out)
            continue
        ranked = (rank or 0) if out.from_ranks == ALL else None
        records.append(await uploader.one(out.name, path, ranked, directory=kind == "dir"))
    if outputs_dir is not None and await asyncio.to_thread(_has_entries, outputs_dir):
        records.append(await uploader.one(IMPLICIT, Path(outputs_dir), rank, directory=True))
    if missing:
        raise OutputsMissing(missing, records)
    return records


def _resolve(path: Path) -> tuple[Path, str | None]:
    """The declared path with links resolved (the path itself may be a link; links inside a directory are
    archived as links), and ``dir``, ``file`` or None when there is nothing there."""
    real = Path(os.path.realpath(path))
    if real.is_dir():
        return real, "dir"
    return real, "file" if real.is_file() else None


def _has_entries(path: Path) -> bool:
    try:
        with os.scandir(path) as it:
            return any(True for _ in it)
    except FileNotFoundError:
        return False


@dataclass
class _Uploader:
    client: Any
    bucket: str
    namespace: str
    job: str
    index: int
    root: str
    level: int
    part_size: int
    in_flight: int

    async def one(self, name: str, path: Path, rank: int | None, *, directory: bool) -> OutputRecord:
        is_dir = directory
        key = output_key(
            self.namespace, self.job, self.index, name, directory=is_dir, rank=rank, root=self.root
        )
        size = self.part_size  # chunks of one part each: passed on to the upload without a copy
        stream = (
            packing.pack({name: path}, level=self.level, chunk_size=size)
            if is_dir
            else packing.file_stream(path, chunk_size=size)
        )
        async with stream:
            up = await uploading.upload(
                self.client,
                self.bucket,
                key,
                stream,
                part_size=self.part_size,
                in_flight=self.in_flight,
                metadata={"nodus-output": name},
                content_type="application/zstd" if is_dir else "application/octet-stream",
            )
        await uploading.verify(self.client, self.bucket, key, size=up.size, sha256=stream.stats.sha256)
        log.info("output %s stored at %s (%d bytes)", name, up.uri, up.size)
        return OutputRecord(
            name=name,
            uri=up.uri,
            key=key,
            format=archiving.ARCHIVE_SUFFIX if is_dir else "file",
            size_bytes=up.size,
            sha256=stream.stats.sha256,
            rank=rank,
            files=stream.stats.files,
            raw_bytes=stream.stats.raw_bytes,
            skipped=stream.stats.skipped,
        )
