"""A run's Volumes and Workspaces (ADR-0036): mounted before its program starts, committed when it succeeds.

:func:`prepare_mounts` fills the run's :class:`~nodus_agent.mountplan.MountPlan`:

* ``spec.volumes[]`` read-only: the revision from the node's cache (:mod:`nodus_agent.volumecache`),
  downloaded once per node, its sha256 checked and extracted safely, mounted read-only at ``mountPath``;
* ``spec.volumes[]`` writable (``readOnly: false``): a private copy of the granted revision (or an empty
  folder for a Volume without one) under ``<attempt dir>/volumes/<volume>/``, mounted read-write;
* ``inputs[].volume``: the cached revision, read-only at ``/nodus/inputs/<input>``;
* ``inputs[].fromWorkspace``: every file under the Workspace's prefix (and ``path``) copied into
  ``<attempt dir>/inputs/<input>``: a snapshot, so later pushes do not change a running Job. Copied as a
  bucket input is (:mod:`nodus_agent.inputbucket`): staged, capped, keys checked, renamed into place.

Which revision a Volume is, and which blob holds it, is the gateway's word (the grant's
:class:`~nodus_schema.noding.GrantedRevision`): the agent reads no Volume itself (ADR-0026). The leases of
cached revisions are kept on the plan until :func:`release`, so nothing a run reads is evicted under it;
a restarted agent that re-adopts a running program takes them again with :func:`retain`.

:func:`commit_mounts` packs each writable copy into a tar.zst, uploads it as a blob of the project (named
by its sha256) and asks the gateway to make it the Volume's next revision (:mod:`nodus_agent.volumecommit`).
The archive is packed to a file beside the copy first: the blob's key is its digest, which exists only
once the archive is whole, and a file costs one disk pass where an upload to a temporary key would cost a
server-side copy (multipart beyond 5 GiB) and a second object to clean up. A blob already in the store
(the same content committed before, a retried commit) is not uploaded again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import msgspec
from botocore.exceptions import BotoCoreError, ClientError

from nodus_agent import packing, unpacking, uploading
from nodus_agent.archiving import ArchiveError, DigestMismatch, UnsafeArchive
from nodus_agent.attemptdir import AttemptDir, valid_name
from nodus_agent.inputbucket import get_object, s3_error
from nodus_agent.inputcontext import InputError, InputRecord, container_path
from nodus_agent.inputs import INPUT_NAME
from nodus_agent.inputstaging import Budget, Layout, offload
from nodus_agent.mountplan import Mount, MountPlan, WritableMount
from nodus_agent.volumecache import BUDGET_SETTING, CacheLease, MountError, VolumeCache
from nodus_agent.volumecommit import VolumeCommitter
from nodus_kit import errors
from nodus_schema.attempts import MountRecord
from nodus_schema.jobs import JobInput, VolumeMount
from nodus_schema.messages import StartAttempt
from nodus_schema.noding import GrantedRevision, VolumeCommitRequest
from nodus_schema.volumes import blob_key, digest_hex, workspace_path, workspace_prefix

__all__ = ["MountContext", "MountError", "commit_mounts", "prepare_mounts", "release", "retain"]

log = logging.getLogger(__name__)

GiB: Final = 1 << 30


@dataclass(frozen=True)
class MountContext:
    """What mounting needs: the agent's store (where blobs and Workspaces live), the node's cache, and the
    gateway's commit endpoint (None where the agent has no bus, e.g. a test of mounts alone)."""

    s3: Any
    """An S3 client (:func:`nodus_agent.s3.client`) of the agent's own store."""
    bucket: str
    cache: VolumeCache
    committer: VolumeCommitter | None = None
    max_input_bytes: int = 50 * GiB
    """The cap on one Workspace input (``NODUS_AGENT_INPUT_MAX_BYTES``, as for other inputs)."""


async def prepare_mounts(
    ctx: MountContext, msg: StartAttempt, adir: AttemptDir, revisions: list[GrantedRevision], plan: MountPlan
) -> None:
    """Mount ``msg.volumes`` and put the volume and Workspace inputs of ``msg.inputs`` in place, adding to
    ``plan`` (mounts, records, writable copies, leases) in the order of the spec.

    Raises :class:`MountError` naming the Volume, Workspace or input to fix; the leases taken before are
    released then. Idempotent for a repeated call on a new plan: writable copies and Workspace snapshots
    already made are kept (a restarted agent must not reset what a program wrote)."""
    granted = list(revisions)
    try:
        for vm in msg.volumes:
            await _mount_volume(ctx, msg, adir, granted, vm, plan)
        for inp in msg.inputs:
            if inp.volume is not None:
                await _volume_input(ctx, msg, granted, inp, plan)
            elif inp.from_workspace is not None:
                await _workspace_input(ctx, msg, adir, inp, plan)
    except BaseException:
        release(plan)
        raise


async def retain(ctx: MountContext, plan: MountPlan) -> None:
    """Take the leases of a re-adopted run again (a restarted agent's died with its process), so the cache
    entries its program still reads are not evicted. An entry already gone is not fetched again: the
    program's mount of it is what it is."""

    async def gone(_: Path) -> None:
        raise _Gone

    for record in plan.records:
        if record.kind != "Volume" or not record.read_only or record.digest is None:
            continue
        if not await asyncio.to_thread(ctx.cache.entry(record.digest).is_dir):
            continue
        with contextlib.suppress(_Gone):  # evicted in between: nothing left to keep
            plan.leases.append(await ctx.cache.acquire(record.digest, record.size_bytes or 0, gone))


class _Gone(Exception):
    pass


def release(plan: MountPlan) -> None:
    """Give back the cache leases of a run that is over (idempotent): its entries may be evicted now."""
    leases, plan.leases = plan.leases, []
    for lease in leases:
        if isinstance(lease, CacheLease):
            lease.release()


async def commit_mounts(ctx: MountContext, msg: StartAttempt, plan: MountPlan) -> None:
    """Make each writable mount's content its Volume's next revision, and record which in
    ``record.committed_revision``. Idempotent: a mount already committed is skipped, and the gateway
    answers a repeated request with the same revision. Raises :class:`MountError`."""
    for mount in plan.writable:
        if mount.record.committed_revision is None:
            mount.record.committed_revision = await _commit(ctx, msg, mount)


# -- Volumes ---------------------------------------------------------------------------------------------
async def _mount_volume(
    ctx: MountContext,
    msg: StartAttempt,
    adir: AttemptDir,
    granted: list[GrantedRevision],
    vm: VolumeMount,
    plan: MountPlan,
) -> None:
    name, target = vm.volume or "", _mount_path(vm)
    if vm.read_only is False:  # only an explicit readOnly: false writes (unset is read-only)
        rev = _granted(granted, name, None, f"mounted at {target}")
        await _writable(ctx, msg, adir, name, target, rev, plan)
        return
    rev = _granted(granted, name, vm.revision, f"mounted at {target}")
    await _mount_cached(ctx, msg, name, target, rev, plan)


async def _volume_input(
    ctx: MountContext, msg: StartAttempt, granted: list[GrantedRevision], inp: JobInput, plan: MountPlan
) -> None:
    assert inp.volume is not None
    input_name = _input_name(inp)
    name, target = inp.volume.name or "", container_path(input_name)
    rev = _granted(granted, name, inp.volume.revision, f"input {input_name!r}")
    await _mount_cached(ctx, msg, name, target, rev, plan)


async def _mount_cached(
    ctx: MountContext, msg: StartAttempt, name: str, target: str, rev: GrantedRevision, plan: MountPlan
) -> None:
    """A revision from the node's cache, read-only at ``target``, held until the run is over."""
    lease = await _acquire(ctx, msg.namespace, name, rev)
    plan.leases.append(lease)
    plan.mounts.append(Mount(host=lease.path, target=target, read_only=True))
    plan.records.append(_record(name, target, rev, lease))


async def _writable(
    ctx: MountContext,
    msg: StartAttempt,
    adir: AttemptDir,
    name: str,
    target: str,
    rev: GrantedRevision,
    plan: MountPlan,
) -> None:
    """A private copy of the granted revision (an empty folder for a Volume without one yet). The copy is
    made beside its final name and renamed, so an existing folder is always a whole copy: kept as it is
    when the run is prepared again, with whatever the program has written into it since."""
    began = time.monotonic()
    host = adir.root / "volumes" / name
    hit: bool | None = None
    if not await asyncio.to_thread(host.is_dir):
        staged = host.parent / f".{name}.copy"
        await offload(_remove, staged)
        await offload(_mkdirs, host.parent)
        if rev.digest is None:
            await offload(staged.mkdir)
        else:
            lease = await _acquire(ctx, msg.namespace, name, rev)
            hit = lease.hit
            try:
                await offload(_copy_writable, lease.path, staged)
            finally:
                lease.release()  # the copy is the run's own: the entry may go
        await offload(os.replace, staged, host)
    record = _record(name, target, rev, None, read_only=False, millis=_millis(began), cache_hit=hit)
    plan.mounts.append(Mount(host=host, target=target, read_only=False))
    plan.records.append(record)
    plan.writable.append(WritableMount(volume=name, host=host, target=target, record=record))


async def _acquire(ctx: MountContext, namespace: str, volume: str, rev: GrantedRevision) -> CacheLease:
    """The granted revision from the cache, fetched from the store when missing; errors name the Volume."""
    what = f"Volume {volume!r} revision {rev.revision}"
    if rev.digest is None:
        raise MountError(
            f"{what}: the Volume has no revision to mount; push one (nodus volume push {volume} DIR)",
            retryable=False,
        )
    try:
        key, hexdigest = blob_key(namespace, rev.digest), digest_hex(rev.digest)
    except ValueError as e:
        raise MountError(f"{what}: {e}", retryable=False) from None
    uri = f"s3://{ctx.bucket}/{key}"

    async def fetch(into: Path) -> None:
        chunks = uploading.download_pieces(ctx.s3, ctx.bucket, key)
        async with contextlib.aclosing(chunks):
            await unpacking.unpack_tree(
                chunks, into, sha256=hexdigest, size=rev.size_bytes or None, max_bytes=ctx.cache.budget_bytes
            )

    try:
        return await ctx.cache.acquire(rev.digest, rev.size_bytes, fetch)
    except MountError as e:
        raise MountError(f"{what}: {e}", e.retryable) from None
    except DigestMismatch as e:
        raise MountError(f"{what}: {uri} is not the revision's blob ({e}); push the data again", False) from e
    except UnsafeArchive as e:
        raise MountError(f"{what}: {uri} is refused ({e}); push the data again without it", False) from e
    except ArchiveError as e:
        raise MountError(f"{what}: {e}; raise {BUDGET_SETTING} on the node", retryable=False) from e
    except ClientError as e:
        if uploading.not_found(e):
            raise MountError(f"{what}: {uri} is missing from the store; push the data again", False) from e
        raise MountError(f"{what}: reading {uri} failed: {e}", retryable=True) from e
    except (BotoCoreError, uploading.UploadError, OSError) as e:
        raise MountError(f"{what}: reading {uri} failed: {e}", retryable=True) from e


def _granted(granted: list[GrantedRevision], name: str, revision: int | None, where: str) -> GrantedRevision:
    """The grant of Volume ``name`` at the pinned ``revision`` (admission pins every read-only one); for a
    writable mount (None) the newest granted, which is the Volume's latest. One Job may read a Volume at
    two revisions (a mount and an input), so the grants are told apart by revision, not by name alone."""
    if not valid_name(name):
        raise MountError(f"Volume {name!r} ({where}) is not a valid Volume name", retryable=False)
    of_volume = [r for r in granted if r.volume == name]
    if revision is not None:
        of_volume = [r for r in of_volume if r.revision == revision]
    if not of_volume:
        pinned = f" revision {revision}" if revision is not None else ""
        raise MountError(
            f"Volume {name!r}{pinned} ({where}): the gateway granted no such revision to this run; create "
            f"the Volume in the Job's project and push a revision (nodus volume push {name} DIR)",
            retryable=False,
        )
    return max(of_volume, key=lambda r: r.revision or 0)


def _mount_path(vm: VolumeMount) -> str:
    """The mount path as admission allows it, checked again: the process runtime makes a link under the
    attempt folder at this path, which must not climb out of it."""
    path = vm.mount_path or ""
    parts = path.split("/")[1:]
    if not path.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\x00" in path:
        raise MountError(
            f"Volume {vm.volume!r}: mountPath {path!r} must be an absolute path without '.', '..' or empty "
            "parts, such as /data",
            retryable=False,
        )
    return path


def _input_name(inp: JobInput) -> str:
    name = inp.name or ""
    if not INPUT_NAME.fullmatch(name):
        raise MountError(f"input {name!r}: a name is a letter, then up to 63 letters, digits or '_'", False)
    return name


def _record(
    name: str,
    target: str,
    rev: GrantedRevision,
    lease: CacheLease | None,
    *,
    read_only: bool = True,
    millis: int | None = None,
    cache_hit: bool | None = None,
) -> MountRecord:
    return MountRecord(
        name=name,
        kind="Volume",
        mount_path=target,
        revision=rev.revision,
        digest=rev.digest,
        read_only=read_only,
        cache_hit=lease.hit if lease is not None else cache_hit,
        size_bytes=rev.size_bytes if rev.digest is not None else None,
        millis=lease.millis if lease is not None else millis,
    )


# -- Workspace inputs ------------------------------------------------------------------------------------
async def _workspace_input(
    ctx: MountContext, msg: StartAttempt, adir: AttemptDir, inp: JobInput, plan: MountPlan
) -> None:
    """A snapshot of the Workspace's files (under ``path``) at ``inputs/<input>``; kept when the run is
    prepared again (its marker says it is whole and from the same spec)."""
    assert inp.from_workspace is not None
    began = time.monotonic()
    name, workspace = _input_name(inp), inp.from_workspace.name or ""
    if not valid_name(workspace):
        raise MountError(f"input {name!r}: {workspace!r} is not a valid Workspace name", retryable=False)
    try:
        sub = workspace_path(inp.from_workspace.path or "")
    except ValueError as e:
        raise MountError(f"input {name!r}: fromWorkspace.path {e}", retryable=False) from None
    prefix = workspace_prefix(msg.namespace, workspace) + (f"{sub}/" if sub else "")
    layout = await asyncio.to_thread(Layout.prepare, adir.inputs)
    fingerprint = hashlib.sha256(msgspec.json.encode([inp, ctx.bucket, prefix])).hexdigest()
    record = await asyncio.to_thread(layout.kept, name, fingerprint)
    if record is None:
        try:
            record = await _snapshot(ctx, name, workspace, sub, prefix, layout)
        except InputError as e:
            raise MountError(str(e), e.retryable) from None
        await asyncio.to_thread(layout.mark, name, fingerprint, record)
    plan.records.append(
        MountRecord(
            name=workspace,
            kind="Workspace",
            mount_path=container_path(name),
            read_only=True,
            size_bytes=record.bytes,
            millis=_millis(began),
        )
    )


async def _snapshot(
    ctx: MountContext, name: str, workspace: str, sub: str, prefix: str, layout: Layout
) -> InputRecord:
    uri = f"s3://{ctx.bucket}/{prefix}"
    budget = Budget(name, ctx.max_input_bytes)
    staged = layout.temp(".d")
    await offload(staged.mkdir)
    try:
        files = await _copy_prefix(ctx, name, prefix, staged, budget)
        if files == 0 and sub:
            # Nothing under <path>/: the path may name one file, which is the input then.
            await offload(_remove, staged)
            staged = layout.temp()
            await get_object(ctx.s3, name, ctx.bucket, prefix.rstrip("/"), staged, budget, None)
            files, directory = 1, False
        else:
            directory = True
        await offload(layout.place, name, staged)
    except ClientError as e:
        if uploading.not_found(e) and sub:
            raise InputError(
                name, f"Workspace {workspace!r} has no file or folder {sub!r}; push it (nodus workspace push)"
            ) from None
        raise s3_error(name, uri, e, None) from None
    except BotoCoreError as e:
        raise s3_error(name, uri, e, None) from None
    finally:
        await asyncio.shield(offload(_remove, staged))
    return InputRecord(
        name=name,
        kind="fromWorkspace",
        source=uri,
        path=container_path(name),
        directory=directory,
        bytes=budget.used,
        files=files,
    )


async def _copy_prefix(ctx: MountContext, name: str, prefix: str, staged: Path, budget: Budget) -> int:
    """Every object under ``prefix`` into ``staged``, keys relative to the prefix as paths; how many."""
    files = 0
    async for page in ctx.s3.get_paginator("list_objects_v2").paginate(Bucket=ctx.bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            rel = obj["Key"][len(prefix) :]
            if not rel or rel.endswith("/"):
                continue  # a "folder" marker: no content of its own
            target = staged / _safe_relative(name, rel)
            try:
                await offload(_mkdirs, target.parent)
                await get_object(ctx.s3, name, ctx.bucket, obj["Key"], target, budget, None)
            except (FileExistsError, NotADirectoryError, IsADirectoryError):
                raise InputError(
                    name, f"the Workspace holds both a file and a folder at {rel!r}; delete one of them"
                ) from None
            files += 1
    return files


def _safe_relative(name: str, rel: str) -> str:
    """A key below the prefix as a relative path; refused when it could leave the input's folder."""
    parts = rel.split("/")
    bad = any(p in ("", ".", "..") for p in parts) or any(ord(c) < 32 or c == "\\" for c in rel)
    if rel.startswith("/") or bad:
        raise InputError(name, f"Workspace file {rel!r} is not a safe relative path; rename or delete it")
    return rel


# -- commits ---------------------------------------------------------------------------------------------
async def _commit(ctx: MountContext, msg: StartAttempt, mount: WritableMount) -> int:
    what = f"Volume {mount.volume!r} (mounted writable at {mount.target})"
    if ctx.committer is None:
        raise MountError(f"{what}: this agent cannot commit revisions (it has no commit client)", True)
    archive = mount.host.parent / f".{mount.volume}.commit.tar.zst"
    try:
        hexdigest, size = await _pack_to_file(mount.host, archive)
        digest = f"sha256:{hexdigest}"
        await _store_blob(ctx, msg, blob_key(msg.namespace, digest), archive, hexdigest, size)
    except ArchiveError as e:
        raise MountError(f"{what}: its content could not be packed: {e}", retryable=False) from e
    except (ClientError, BotoCoreError, uploading.UploadError, OSError) as e:
        raise MountError(f"{what}: uploading its content failed: {e}", retryable=True) from e
    finally:
        await asyncio.shield(offload(_remove, archive))
    request = VolumeCommitRequest(
        namespace=msg.namespace, attempt=msg.attempt, volume=mount.volume, digest=digest, size_bytes=size
    )
    try:
        reply = await ctx.committer.commit(request)
    except errors.NodusError as e:
        raise MountError(f"{what}: the gateway did not commit {digest}: {e}", e.retryable) from e
    log.info(
        "committed %s as revision %d of Volume %s",
        digest,
        reply.revision,
        mount.volume,
        extra={"attempt": msg.attempt},
    )
    return reply.revision


async def _pack_to_file(folder: Path, archive: Path) -> tuple[str, int]:
    """The folder as a tar.zst file (members at its root, as uploaded blobs are); (hex sha256, size)."""
    out = await offload(archive.open, "wb")
    try:
        async with packing.pack_tree(folder) as stream:
            async for chunk in stream:
                await offload(out.write, chunk)
        await offload(out.flush)
    finally:
        await offload(out.close)
    if stream.stats.skipped:
        log.warning("left out of the commit of %s: %s", folder.name, "; ".join(stream.stats.skipped[:10]))
    return stream.stats.sha256, stream.stats.size


async def _store_blob(
    ctx: MountContext, msg: StartAttempt, key: str, archive: Path, hexdigest: str, size: int
) -> None:
    """Upload the archive to ``key`` unless the store has it already (blobs are named by content)."""
    try:
        head = await ctx.s3.head_object(Bucket=ctx.bucket, Key=key)
        if int(head["ContentLength"]) == size:
            return
    except ClientError as e:
        if not uploading.not_found(e):
            raise
    async with packing.file_stream(archive) as stream:
        up = await uploading.upload(
            ctx.s3,
            ctx.bucket,
            key,
            stream,
            metadata={"nodus-attempt": msg.attempt},
            content_type="application/zstd",
        )
    await uploading.verify(ctx.s3, ctx.bucket, key, size=up.size, sha256=hexdigest)


# -- files -----------------------------------------------------------------------------------------------
def _copy_writable(entry: Path, dest: Path) -> None:
    """Copy a (sealed, read-only) cache entry and give the owner back the write bit everywhere."""
    shutil.copytree(entry, dest, symlinks=True)
    for dirpath, dirs, files in os.walk(dest):
        for name in [*dirs, *files]:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if not stat.S_ISLNK(st.st_mode):
                os.chmod(path, stat.S_IMODE(st.st_mode) | 0o200)
    os.chmod(dest, 0o755)


def _mkdirs(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _millis(began: float) -> int:
    return int((time.monotonic() - began) * 1000)
