"""Checkpoints of one index, streamed to S3 as tar.zst, and restored by whichever Attempt runs it next.

Layout (docs/checkpoints.md), keyed by the index and not the Attempt, because a replacement Attempt
restores its predecessor's progress::

    s3://<bucket>/<root><namespace>/<job>/<index>/checkpoints/[rank-<n>/]
        ckpt-00000007.tar.zst   the archive (program paths without their leading '/': nodus/state/...)
        ckpt-00000007.json      its manifest: a CheckpointInfo, written once the archive is verified
        latest                  a copy of the newest manifest, written last

The order of :meth:`Checkpointer.take` is what makes a kill at any line harmless: the archive is uploaded
and verified (size by HEAD) before its manifest and ``latest`` are written. An upload killed half-way is
aborted (or swept by the next take), and ``latest`` still names the previous checkpoint, whose sha256 it
carries, so a restore verifies every byte it reads.

The program contract (how a program makes its state consistent before a snapshot) is in
docs/checkpoints.md and :meth:`Checkpointer._quiesce`; the choice of ``interval: auto`` is ADR-0019 and
:func:`checkpoint_interval`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final

import msgspec
from botocore.exceptions import BotoCoreError, ClientError

from nodus_agent import archiving, packing, unpacking, uploading
from nodus_schema.meta import now_rfc3339
from nodus_schema.quantities import format_bytes, parse_bytes, parse_duration

log = logging.getLogger(__name__)

REASONS: Final = ("Interval", "Suspend", "Preemption", "CapReached", "Final")
"""Why a checkpoint was taken: the policy's interval, a suspension, a reclaim notice of interruptible
capacity, the Job's cost cap reached (it is about to be suspended), the program's successful end."""
DEFAULT_PATHS: Final = ("/nodus/state",)
DEFAULT_MAX_SIZE: Final = parse_bytes("1Ti")
LARGEST_MAX_SIZE: Final = parse_bytes("2Ti")
DEFAULT_KEEP: Final = 2
"""Checkpoints kept per index while a Job runs (the newest, and one before it)."""
READY_TIMEOUT_S: Final = 60.0
"""How long a take waits for the program to acknowledge a checkpoint request."""
READY_POLL_S: Final = 0.1

CONTROL_DIR: Final = ".nodus"
REQUEST_FILE: Final = "checkpoint-request"
READY_FILE: Final = "checkpoint-ready"
DONE_FILE: Final = "checkpoint-done"

Notify = Callable[[], Awaitable[None]]
"""Tells the program a checkpoint request is waiting: SIGUSR1 to its main process (the runner supplies
it: ``os.kill`` for a process, the Docker API's kill with ``signal=SIGUSR1`` for a container)."""

_SEQ = re.compile(r"ckpt-(\d{8,})\.(tar\.zst|json)")
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


class CheckpointInfo(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel"):
    """One stored checkpoint: the manifest beside its archive, the ``latest`` pointer, and the event the
    runner publishes when a checkpoint is taken or restored."""

    namespace: str
    job: str
    index: int
    attempt: str
    """The Attempt that took it."""
    sequence: int
    """1, 2, 3, ... per index (and rank), across Attempts."""
    reason: str
    """Interval, Suspend, Preemption, CapReached or Final."""
    uri: str
    key: str
    size_bytes: int
    """Compressed bytes stored (the tar.zst)."""
    raw_bytes: int
    """Bytes of the files covered, uncompressed."""
    files: int
    sha256: str
    """Of the stored tar.zst; every restore checks it."""
    paths: list[str]
    """The program paths covered (``/nodus/state`` by default)."""
    consistent: bool
    """The program acknowledged the request before the snapshot (docs/checkpoints.md); False when it did
    not opt in, or did not answer within the wait."""
    duration_millis: int
    """From the request until the archive was stored and verified: what the checkpoint cost the run
    (moving ``latest`` adds one small PUT)."""
    quiesce_millis: int = 0
    """Of which waiting for the program's acknowledgement."""
    time: str
    """When it was stored (RFC 3339)."""
    rank: int | None = None
    skipped: list[str] = msgspec.field(default_factory=list)
    """Members left out, with the reason (links leaving their path, sockets, files removed meanwhile)."""
    changed: list[str] = msgspec.field(default_factory=list)
    """Files that changed size while read: the program wrote during the snapshot."""


_encode = msgspec.json.Encoder().encode
_decode_info = msgspec.json.Decoder(CheckpointInfo).decode


class CheckpointError(Exception):
    """A checkpoint could not be taken or restored; ``latest`` is unchanged."""


class CheckpointTooLarge(CheckpointError):
    """Over ``recovery.checkpoint.maxSize``: refused before (or while) uploading, or before restoring."""


class CheckpointCorrupt(CheckpointError):
    """The stored checkpoint is not what was written (sha256 or size differ, or it does not decompress)."""


def index_prefix(namespace: str, job: str, index: int, root: str = "") -> str:
    """``<root><namespace>/<job>/<index>/``: everything Nodus stores for one index (checkpoints, outputs)."""
    for what, name in (("namespace", namespace), ("job", job)):
        if not _NAME.fullmatch(name):
            raise ValueError(f"{what} {name!r} is not a valid object name (lowercase DNS subdomain)")
    if index < 0:
        raise ValueError(f"index {index} must not be negative")
    if root and not root.endswith("/"):
        raise ValueError(f"key prefix {root!r} must end with '/'")
    return f"{root}{namespace}/{job}/{index}/"


def checkpoint_prefix(namespace: str, job: str, index: int, rank: int | None = None, root: str = "") -> str:
    """Where one index's (and, in a gang, one rank's) checkpoints live."""
    ranked = f"rank-{rank}/" if rank is not None else ""
    return f"{index_prefix(namespace, job, index, root)}checkpoints/{ranked}"


def archive_name(program_path: str) -> str:
    """The archive name of a program path: ``/nodus/state`` is stored as ``nodus/state/...``."""
    norm = os.path.normpath(program_path)
    if not program_path.startswith("/") or norm != program_path.rstrip("/") or norm == "/":
        raise ValueError(f"checkpoint path {program_path!r} must be an absolute, normalised path below /")
    return archiving.check_name(norm.lstrip("/"))


def parse_max_size(value: str | None) -> int:
    """``recovery.checkpoint.maxSize`` in bytes (default 1Ti, at most 2Ti)."""
    size = DEFAULT_MAX_SIZE if value is None else parse_bytes(value)
    if not 0 < size <= LARGEST_MAX_SIZE:
        raise ValueError(f"maxSize {value!r} must be above 0 and at most 2Ti")
    return size


class Checkpointer:
    """Takes and restores the checkpoints of one index (one rank of it, in a gang) for one Attempt.

    ``client`` is an aiobotocore S3 client (:func:`nodus_agent.s3.client`). ``control_dir`` is the host
    path of ``/nodus/state/.nodus`` (the program contract's files; never archived); ``notify`` signals the
    program that a request waits. Takes are serialised: a Suspend arriving during an Interval checkpoint
    waits for it.
    """

    def __init__(
        self,
        client: Any,
        bucket: str,
        *,
        namespace: str,
        job: str,
        index: int,
        attempt: str,
        rank: int | None = None,
        root: str = "",
        max_size: int = DEFAULT_MAX_SIZE,
        control_dir: Path | None = None,
        notify: Notify | None = None,
        ready_timeout_s: float = READY_TIMEOUT_S,
        keep: int | None = DEFAULT_KEEP,
        level: int = archiving.LEVEL,
        threads: int = archiving.THREADS,
        part_size: int = uploading.PART_SIZE,
        in_flight: int = uploading.IN_FLIGHT,
        on_part: uploading.OnPart | None = None,
    ) -> None:
        self.client, self.bucket = client, bucket
        self.namespace, self.job, self.index, self.attempt, self.rank = namespace, job, index, attempt, rank
        self.root = root
        self.prefix = checkpoint_prefix(namespace, job, index, rank, root)
        if not 0 < max_size <= LARGEST_MAX_SIZE:
            raise ValueError(f"max_size {max_size} must be above 0 and at most 2Ti")
        if keep is not None and keep < 1:
            raise ValueError(f"keep {keep} must be at least 1 (or None to keep every checkpoint)")
        self.max_size, self.keep = max_size, keep
        self.control_dir, self.notify, self.ready_timeout_s = control_dir, notify, ready_timeout_s
        self.level, self.threads = level, threads
        self.part_size, self.in_flight, self.on_part = part_size, in_flight, on_part
        self._sequence: int | None = None  # the last stored, once known
        self._lock = asyncio.Lock()

    # -- keys ---------------------------------------------------------------------------------------------
    def archive_key(self, sequence: int) -> str:
        return f"{self.prefix}ckpt-{sequence:08d}.{archiving.ARCHIVE_SUFFIX}"

    def manifest_key(self, sequence: int) -> str:
        return f"{self.prefix}ckpt-{sequence:08d}.json"

    @property
    def latest_key(self) -> str:
        return f"{self.prefix}latest"

    # -- reading ------------------------------------------------------------------------------------------
    async def latest(self) -> CheckpointInfo | None:
        """The checkpoint ``latest`` names, or None before the first one."""
        data = await uploading.get_bytes(self.client, self.bucket, self.latest_key)
        if data is None:
            return None
        try:
            return _decode_info(data)
        except msgspec.DecodeError as e:
            raise CheckpointCorrupt(
                f"s3://{self.bucket}/{self.latest_key} is not a checkpoint manifest ({e}): delete it to start"
                " this index afresh, or copy an older ckpt-<n>.json over it"
            ) from e

    # -- taking -------------------------------------------------------------------------------------------
    async def take(
        self, paths: Mapping[str, Path], reason: str, *, ready_timeout_s: float | None = None
    ) -> CheckpointInfo:
        """Snapshot ``paths`` (program path -> host path, e.g. ``{"/nodus/state": attempt_dir.state}``)
        as the next checkpoint; ``latest`` moves to it only once it is stored and verified.

        Raises :class:`CheckpointTooLarge` over ``max_size`` (nothing uploaded, or the upload aborted),
        :class:`CheckpointError` for anything else; ``latest`` is then unchanged.
        """
        if reason not in REASONS:
            raise ValueError(f"reason {reason!r} is not one of {', '.join(REASONS)}")
        sources = {archive_name(p): Path(h) for p, h in paths.items()}
        if not sources:
            raise ValueError("a checkpoint needs at least one path")
        async with self._lock:
            began = time.monotonic()
            sequence = await self._next_sequence()
            try:
                consistent, quiesce_ms = await self._quiesce(sequence, reason, ready_timeout_s)
                info = await self._store(sources, sorted(paths), sequence, reason, consistent, began)
            except BaseException as e:
                await self._done(sequence, None, e)
                raise
            info = msgspec.structs.replace(info, quiesce_millis=quiesce_ms)
            # With two or more kept, what pruning deletes is older than what ``latest`` names now, so it
            # may run beside the pointer's move; keeping one, it must wait for the move.
            overlap = self.keep is not None and self.keep >= 2
            await asyncio.gather(self._publish(info), *([self._prune(sequence)] if overlap else []))
            self._sequence = sequence
            await self._done(sequence, info, None)
        if not overlap:
            await self._prune(sequence)
        return info

    async def _next_sequence(self) -> int:
        if self._sequence is None:
            current = await self.latest()
            self._sequence = current.sequence if current else 0
        return self._sequence + 1

    async def _store(
        self,
        sources: dict[str, Path],
        program_paths: list[str],
        sequence: int,
        reason: str,
        consistent: bool,
        began: float,
    ) -> CheckpointInfo:
        exclude = [self.control_dir] if self.control_dir else []
        # Anything left open under this prefix belongs to a predecessor killed mid-upload (only one
        # Attempt of an index runs at a time, and takes here are serialised): swept while we measure.
        raw, _ = await asyncio.gather(
            asyncio.to_thread(packing.measure, sources, exclude),
            uploading.abort_open_uploads(self.client, self.bucket, self.prefix),
        )
        if raw > self.max_size:
            raise CheckpointTooLarge(self._too_large(program_paths, raw, "holds"))
        key = self.archive_key(sequence)
        meta = {"nodus-attempt": self.attempt, "nodus-sequence": str(sequence), "nodus-reason": reason}
        try:
            # Chunks of exactly one part: the uploader passes each on as a part without copying it.
            archive = packing.pack(
                sources, exclude=exclude, level=self.level, threads=self.threads, chunk_size=self.part_size
            )
            async with archive as s:
                up = await uploading.upload(
                    self.client,
                    self.bucket,
                    key,
                    s,
                    max_size=self.max_size,
                    part_size=self.part_size,
                    in_flight=self.in_flight,
                    metadata=meta,
                    content_type="application/zstd",
                    on_part=self.on_part,
                )
            await uploading.verify(self.client, self.bucket, key, size=up.size, sha256=s.stats.sha256)
        except uploading.SizeLimitExceeded:
            raise CheckpointTooLarge(self._too_large(program_paths, None, "grew past")) from None
        except archiving.ArchiveError as e:
            raise CheckpointError(f"checkpoint {sequence} not taken: {e}") from e
        except (ClientError, BotoCoreError, uploading.UploadError, OSError) as e:
            raise CheckpointError(
                f"checkpoint {sequence} not stored at s3://{self.bucket}/{key}: {e}; the previous checkpoint "
                "stays the latest, and the next take tries again (check the store's endpoint and keys)"
            ) from e
        return CheckpointInfo(
            namespace=self.namespace,
            job=self.job,
            index=self.index,
            rank=self.rank,
            attempt=self.attempt,
            sequence=sequence,
            reason=reason,
            uri=up.uri,
            key=key,
            size_bytes=up.size,
            raw_bytes=s.stats.raw_bytes,
            files=s.stats.files,
            sha256=s.stats.sha256,
            paths=program_paths,
            consistent=consistent,
            duration_millis=int((time.monotonic() - began) * 1000),
            time=now_rfc3339(),
            skipped=s.stats.skipped,
            changed=s.stats.changed,
        )

    def _too_large(self, paths: list[str], raw: int | None, verb: str) -> str:
        size = f" {_human(raw)}" if raw is not None else ""
        return (
            f"checkpoint of {', '.join(paths)} {verb}{size} over recovery.checkpoint.maxSize "
            f"{format_bytes(self.max_size)}: raise maxSize (at most 2Ti) or keep less under those paths; "
            "the previous checkpoint stays the latest"
        )

    async def _publish(self, info: CheckpointInfo) -> None:
        """The manifest and ``latest`` (at once: ``latest`` names the archive, verified before this, and
        carries everything the manifest does, so neither needs the other first)."""
        body = _encode(info)
        await asyncio.gather(
            uploading.put_bytes(self.client, self.bucket, self.manifest_key(info.sequence), body),
            uploading.put_bytes(self.client, self.bucket, self.latest_key, body),
        )

    async def _prune(self, sequence: int) -> None:
        """Delete this index's checkpoints older than the ``keep`` newest (never the one ``latest`` names).
        Best effort: a failure here costs storage, not progress."""
        if self.keep is None or sequence <= self.keep:
            return
        try:
            objects = await uploading.list_objects(self.client, self.bucket, self.prefix)
            old = [
                o["Key"]
                for o in objects
                if (m := _SEQ.fullmatch(o["Key"][len(self.prefix) :])) and int(m[1]) <= sequence - self.keep
            ]
            await uploading.delete_keys(self.client, self.bucket, old)
        except Exception as e:
            log.warning("old checkpoints under %s not pruned: %s", self.prefix, e)

    # -- the program contract -----------------------------------------------------------------------------
    async def _quiesce(self, sequence: int, reason: str, timeout_s: float | None) -> tuple[bool, int]:
        """Ask the program to make its state consistent; (acknowledged, millis waited).

        Only a program that opted in (created ``.nodus/checkpoint-ready``) is asked: SIGUSR1's default
        action ends a process, so a program that never said it handles the signal is never sent one.
        """
        ctl = self.control_dir
        if ctl is None or not (ctl / READY_FILE).exists():
            return False, 0
        began = time.monotonic()
        wait_s = self.ready_timeout_s if timeout_s is None else timeout_s
        request = {"sequence": sequence, "reason": reason, "timeoutSeconds": wait_s}
        await asyncio.to_thread(_write_atomic, ctl / REQUEST_FILE, json.dumps(request) + "\n")
        if self.notify is not None:
            try:
                await self.notify()
            except Exception as e:  # the program may still be polling the request file
                log.warning("could not signal the program for checkpoint %d: %s", sequence, e)
        deadline = began + wait_s
        while True:
            if _read_sequence(ctl / READY_FILE) == sequence:
                return True, int((time.monotonic() - began) * 1000)
            if time.monotonic() >= deadline:
                log.warning("program did not acknowledge checkpoint %d within %.0fs", sequence, wait_s)
                return False, int((time.monotonic() - began) * 1000)
            await asyncio.sleep(READY_POLL_S)  # polling a file the program writes: nothing to await

    async def _done(self, sequence: int, info: CheckpointInfo | None, error: BaseException | None) -> None:
        """Tell the program the snapshot is over (stored or not), so it may write its paths again."""
        ctl = self.control_dir
        if ctl is None or not (ctl / READY_FILE).exists():
            return
        done: dict[str, object] = {"sequence": sequence, "stored": info is not None}
        if info is not None:
            done["uri"] = info.uri
        else:
            done["error"] = str(error) or type(error).__name__
        with contextlib.suppress(OSError):
            await asyncio.to_thread(_write_atomic, ctl / DONE_FILE, json.dumps(done) + "\n")

    # -- restoring ----------------------------------------------------------------------------------------
    async def restore(self, into: Path | Mapping[str, Path]) -> CheckpointInfo | None:
        """Restore the latest checkpoint of this index; None if there is none yet (a first run).

        ``into``: program path -> host path (what :meth:`take` was given, for the new Attempt), or one
        directory that receives the whole tree (``into/nodus/state/...``). Every byte is checked against
        the recorded sha256 before anything replaces what the targets hold. Uploads left open under this
        index (a predecessor killed mid-checkpoint) are aborted first: only the new Attempt restores.
        Raises :class:`CheckpointTooLarge` over ``max_size``, :class:`CheckpointCorrupt` for a damaged one.
        """
        async with self._lock:
            info = await self.latest()
            if info is None:
                return None
            if info.size_bytes > self.max_size:
                raise CheckpointTooLarge(
                    f"checkpoint {info.sequence} at {info.uri} is {_human(info.size_bytes)}, over "
                    f"recovery.checkpoint.maxSize {format_bytes(self.max_size)}: raise maxSize to restore it"
                )
            await uploading.abort_open_uploads(self.client, self.bucket, self.prefix)
            targets = self._targets(info, into)
            chunks = uploading.download_pieces(
                self.client, self.bucket, info.key, chunk_size=self.part_size, in_flight=self.in_flight
            )
            try:
                async with contextlib.aclosing(chunks):
                    await unpacking.unpack(chunks, targets, sha256=info.sha256, size=info.size_bytes)
            except archiving.DigestMismatch as e:
                raise CheckpointCorrupt(f"checkpoint {info.sequence} at {info.uri} is damaged: {e}") from e
            except archiving.UnsafeArchive as e:
                raise CheckpointCorrupt(f"checkpoint {info.sequence} at {info.uri} refused: {e}") from e
            except ClientError as e:
                if not uploading.not_found(e):
                    raise
                raise CheckpointCorrupt(
                    f"latest names checkpoint {info.sequence} at {info.uri}, which is gone: delete "
                    f"s3://{self.bucket}/{self.latest_key} to start the index afresh"
                ) from e
            self._sequence = max(self._sequence or 0, info.sequence)
            return info

    def _targets(self, info: CheckpointInfo, into: Path | Mapping[str, Path]) -> dict[str, Path]:
        if isinstance(into, Mapping):
            return {archive_name(p): Path(h) for p, h in into.items()}
        return {archive_name(p): Path(into) / archive_name(p) for p in info.paths}

    # -- retention ----------------------------------------------------------------------------------------
    async def cleanup(self, before: datetime) -> int:
        """Delete this Job's checkpoints (every index and rank) stored before ``before``: the Job's
        ``retainAfterFinish``. Returns how many objects were deleted."""
        return await delete_checkpoints(self.client, self.bucket, self.namespace, self.job, before, self.root)


async def delete_checkpoints(
    client: Any, bucket: str, namespace: str, job: str, before: datetime, root: str = ""
) -> int:
    """Delete every checkpoint object of a Job last written before ``before`` (aware datetime), and abort
    uploads left open before it. A ``latest`` pointer goes first whenever what it names goes, so no
    reader ever follows it to a missing archive. Idempotent; returns how many objects were deleted."""
    if before.tzinfo is None:
        raise ValueError("before must be timezone-aware (UTC)")
    prefix = f"{root}{namespace}/{job}/"
    index_prefix(namespace, job, 0, root)  # validates the names
    objects = [
        o for o in await uploading.list_objects(client, bucket, prefix) if _is_checkpoint(prefix, o["Key"])
    ]
    old = {o["Key"] for o in objects if o["LastModified"] < before}
    pointers = [o["Key"] for o in objects if o["Key"].endswith("/latest")]
    first: list[str] = []
    for pointer in pointers:
        if pointer in old:
            first.append(pointer)
            continue
        data = await uploading.get_bytes(client, bucket, pointer)
        named = _named_key(data)
        if named is None or named in old:
            first.append(pointer)
    await uploading.delete_keys(client, bucket, first)
    rest = sorted(old - set(first))
    await uploading.delete_keys(client, bucket, rest)
    await uploading.abort_open_uploads(client, bucket, prefix, before=before)
    return len(first) + len(rest)


def _is_checkpoint(prefix: str, key: str) -> bool:
    parts = key[len(prefix) :].split("/")
    return len(parts) >= 3 and parts[1] == "checkpoints"


def _named_key(data: bytes | None) -> str | None:
    if data is None:
        return None
    try:
        return _decode_info(data).key
    except msgspec.DecodeError:
        return None


# -- the schedule ------------------------------------------------------------------------------------------
AUTO: Final = "auto"
AUTO_FIRST: Final = timedelta(minutes=30)
"""``auto`` before any checkpoint of this index has been measured."""
AUTO_FLOOR: Final = timedelta(minutes=10)
AUTO_CEILING: Final = timedelta(hours=2)
MEAN_TIME_TO_INTERRUPT: Final = {True: timedelta(hours=4), False: timedelta(hours=24)}
"""Assumed mean time between losses of capacity: interruptible (reclaimed) vs on-demand (failures)."""
SHORTEST: Final = timedelta(minutes=1)
LONGEST: Final = timedelta(hours=6)
DEADLINE_FLOOR: Final = timedelta(minutes=2)
"""``auto`` never checkpoints more often than this for a deadline (nor more often than twice the last
checkpoint's cost): a checkpoint asks the program to quiesce (up to 60 s) and streams its state, so at two
minutes, or twice the cost, the run still spends at least two thirds of its time working."""
DEADLINE_SHARE: Final = 4
"""Under ``auto``, an interval is at most 1/4 of the time left to ``completeByTime``."""


def toward_deadline(
    interval: timedelta, *, deadline: datetime, now: datetime, last_cost: timedelta | None = None
) -> timedelta:
    """``interval`` shortened for a deadline (``spec.completeByTime``): at most a quarter of the time left,
    never below the floor (:data:`DEADLINE_FLOOR`, or twice ``last_cost`` when larger); past the deadline,
    the floor. It only ever shortens: the deadline never makes ``interval`` longer.

    Recomputed after every checkpoint, it shrinks as the deadline nears, so a loss close to the deadline
    costs at most a quarter of what was left (a replacement restores and has that much to redo)."""
    floor = max(DEADLINE_FLOOR, 2 * last_cost) if last_cost is not None else DEADLINE_FLOOR
    left = deadline - now
    cap = max(left / DEADLINE_SHARE, floor) if left > timedelta(0) else floor
    return min(interval, cap)


def checkpoint_interval(
    policy: str | None,
    *,
    last_cost: timedelta | None = None,
    interruptible: bool = False,
    deadline: datetime | None = None,
    now: datetime | None = None,
) -> timedelta:
    """The time between checkpoints for ``recovery.checkpoint.interval`` (None means ``auto``).

    ``auto`` (ADR-0019): 30m until a checkpoint's cost has been measured, then Young's interval
    sqrt(2 x cost x mean time to interruption) (4h on interruptible capacity, 24h otherwise), held to
    [10m, 2h]; with a ``deadline`` (and the time ``now``), shortened by :func:`toward_deadline`. A duration
    is used as given (1m to 6h), deadline or not.
    """
    if policy is None or policy == AUTO:
        if last_cost is None:
            interval = AUTO_FIRST
        else:
            mtti = MEAN_TIME_TO_INTERRUPT[interruptible].total_seconds()
            young = timedelta(seconds=math.sqrt(2 * max(last_cost.total_seconds(), 0.0) * mtti))
            interval = min(max(young, AUTO_FLOOR), AUTO_CEILING)
        if deadline is None or now is None:
            return interval
        return toward_deadline(interval, deadline=deadline, now=now, last_cost=last_cost)
    interval = parse_duration(policy)
    if not SHORTEST <= interval <= LONGEST:
        raise ValueError(f"checkpoint interval {policy!r} must be 'auto' or a duration from 1m to 6h")
    return interval


def next_due(
    last: datetime,
    policy: str | None,
    *,
    last_cost: timedelta | None = None,
    interruptible: bool = False,
    deadline: datetime | None = None,
) -> datetime:
    """When the next Interval checkpoint is due: ``last`` (the previous checkpoint's end, or the
    program's start) plus :func:`checkpoint_interval` (with a ``deadline``, as of ``last``)."""
    return last + checkpoint_interval(
        policy, last_cost=last_cost, interruptible=interruptible, deadline=deadline, now=last
    )


def _write_atomic(path: Path, text: str) -> None:
    """Write-then-rename: the program never reads half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _read_sequence(path: Path) -> int | None:
    """The number in the ready file (``7``, or JSON with ``sequence``); None if absent or unreadable."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text.isdigit():
        return int(text)
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        value = json.loads(text).get("sequence")
        return int(value) if isinstance(value, int) else None
    return None


def _human(n: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
