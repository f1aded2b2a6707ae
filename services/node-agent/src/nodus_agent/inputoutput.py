"""``output`` inputs (:mod:`nodus_agent.inputs`): another Job's committed output from the agent's own output
store, a file, or a directory archived as ``.tar.zst`` and extracted here, safely."""

from __future__ import annotations

import asyncio
import posixpath
import shutil
import tarfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import zstandard
from botocore.exceptions import BotoCoreError, ClientError

from nodus_agent.inputbucket import NO_SUCH_KEY, get_object, s3_error
from nodus_agent.inputcontext import InputContext, InputError, InputRecord, InputSettings, container_path
from nodus_agent.inputstaging import Budget, Interrupted, Layout, Materialisation, offload
from nodus_schema.jobs import JobInput

__all__ = ["extract_tar_zst", "fetch_output", "output_keys"]


def output_keys(namespace: str, job: str, index: int, output: str, root: str = "") -> tuple[str, str]:
    """The S3 keys of a committed output: (as a file, as a directory's ``.tar.zst``).

    The outputs module writes them; this is the same layout (``<root><namespace>/<job>/<index>/outputs/``),
    restated rather than imported so that reading never depends on the writer's internals."""
    key = f"{root}{namespace}/{job}/{index}/outputs/{output}"
    return key, f"{key}.tar.zst"


async def fetch_output(inp: JobInput, run: Materialisation, ctx: InputContext) -> InputRecord:
    assert inp.output is not None and inp.name is not None
    name, out = inp.name, inp.output
    job, output, index = out.job or "", out.name or "", out.index or 0
    if ctx.outputs is None:
        raise InputError(name, "this node has no output store configured; set the agent's output bucket")
    bucket = ctx.outputs.bucket
    file_key, tar_key = output_keys(ctx.namespace, job, index, output, ctx.outputs_root)
    try:
        client = await run.clients.get(ctx.outputs)
        found = await _first_existing(client, bucket, (file_key, tar_key))
        if found is None:
            listed = await client.list_objects_v2(Bucket=bucket, Prefix=f"{file_key}/", MaxKeys=1)
            if listed.get("KeyCount", 0):
                raise InputError(
                    name,
                    f"output {output!r} of Job {job!r} was stored per rank (fromRanks All); reading one "
                    "is not supported yet: declare it with fromRanks Zero",
                )
            raise InputError(
                name,
                f"Job {job!r} has no committed output {output!r} at index {index} (looked for "
                f"s3://{bucket}/{file_key} and .tar.zst); check that the Job succeeded and declares it",
            )
        if found == file_key:
            return await _output_file(client, name, bucket, file_key, run.layout, ctx.settings)
        return await _output_directory(client, name, output, bucket, tar_key, run.layout, ctx.settings)
    except (ClientError, BotoCoreError) as e:
        raise s3_error(name, f"s3://{bucket}/{file_key}", e, None) from None


async def _output_file(
    client: Any, name: str, bucket: str, key: str, layout: Layout, settings: InputSettings
) -> InputRecord:
    staged = layout.temp()
    size, digest = await get_object(client, name, bucket, key, staged, Budget(name, settings.max_bytes), None)
    await asyncio.to_thread(layout.place, name, staged)
    source = f"s3://{bucket}/{key}"
    return InputRecord(
        name=name, kind="output", source=source, path=container_path(name), bytes=size, sha256=digest
    )


async def _output_directory(
    client: Any, name: str, output: str, bucket: str, key: str, layout: Layout, settings: InputSettings
) -> InputRecord:
    archive, staged = layout.temp(".tar.zst"), layout.temp(".d")
    try:
        # The cap is on what the archive holds; the download itself gets twice that, for tar's headers
        # and padding around many small files, and still cannot fill the disk.
        archive_budget = Budget(name, 2 * settings.max_bytes)
        await get_object(client, name, bucket, key, archive, archive_budget, None)
        # Its members are <output>/...: the input's directory is that directory, not its parent.
        size, files = await extract_tar_zst(archive, staged, name, settings.max_bytes, strip=output)
    finally:
        await asyncio.to_thread(archive.unlink, True)
    await asyncio.to_thread(layout.place, name, staged)
    return InputRecord(
        name=name,
        kind="output",
        source=f"s3://{bucket}/{key}",
        path=container_path(name),
        directory=True,
        bytes=size,
        files=files,
    )


async def _first_existing(client: Any, bucket: str, keys: Sequence[str]) -> str | None:
    for key in keys:
        try:
            await client.head_object(Bucket=bucket, Key=key)
            return key
        except ClientError as e:
            if str(e.response.get("Error", {}).get("Code", "")) not in NO_SUCH_KEY:
                raise
    return None


async def extract_tar_zst(
    archive: Path, dest: Path, name: str, max_bytes: int, *, strip: str | None = None
) -> tuple[int, int]:
    """Extract a ``.tar.zst`` into the new directory ``dest`` in a worker thread; (bytes, files).

    ``strip``: members under ``<strip>/`` land in ``dest`` itself (and a member ``<strip>`` is ``dest``).
    Refuses (InputError for input ``name``) absolute or '..' paths, links leading outside ``dest``,
    special files, and more than ``max_bytes`` of content. On any failure, or when cancelled (it stops at
    the next member), ``dest`` is removed."""
    budget = Budget(name, max_bytes)
    stop = threading.Event()
    try:
        return await offload(_extract_sync, archive, dest, budget, strip, stop, stop=stop)
    except BaseException:
        await asyncio.to_thread(shutil.rmtree, dest, True)
        raise


def _extract_sync(
    archive: Path, dest: Path, budget: Budget, strip: str | None, stop: threading.Event
) -> tuple[int, int]:
    dest.mkdir()
    files = 0
    with (
        archive.open("rb") as raw,
        zstandard.ZstdDecompressor().stream_reader(raw) as reader,
        tarfile.open(fileobj=reader, mode="r|") as tar,
    ):
        for member in tar:
            if stop.is_set():
                raise Interrupted
            if strip is not None and not _strip(member, strip):
                continue
            _check_member(budget.name, member)
            if member.isfile():
                budget.take(member.size)  # before extracting: a bomb is refused, not written
                files += 1
            # Our checks above, and Python's "data" filter as a second line: no device files, no
            # set-uid bits, no owner taken from the archive.
            tar.extract(member, dest, set_attrs=True, filter="data")
    return budget.used, files


def _strip(member: tarfile.TarInfo, top: str) -> bool:
    """Re-root a member from ``<top>/x`` to ``x`` (a hard link's target too); False for ``<top>`` itself."""
    path = member.name.rstrip("/")
    if path == top:
        return False
    prefix = f"{top}/"
    if path.startswith(prefix):
        member.name = path[len(prefix) :]
    if member.islnk() and member.linkname.startswith(prefix):
        member.linkname = member.linkname[len(prefix) :]
    return True


def _check_member(name: str, member: tarfile.TarInfo) -> None:
    """Refuse what could write outside the directory: absolute or '..' paths, links that escape, devices."""
    what = f"archive member {member.name!r}"
    path = member.name.rstrip("/")
    if path.startswith("/") or ".." in path.split("/") or "\x00" in path:
        raise InputError(name, f"{what} has an absolute or '..' path; the archive is unsafe")
    if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        raise InputError(name, f"{what} is a device, fifo or other special file; only files are accepted")
    if member.issym():
        target = posixpath.normpath(posixpath.join(posixpath.dirname(path), member.linkname))
        if member.linkname.startswith("/") or target == ".." or target.startswith("../"):
            raise InputError(name, f"{what} is a link to {member.linkname!r}, outside the output")
    if member.islnk():
        target = posixpath.normpath(member.linkname)
        if member.linkname.startswith("/") or target == ".." or target.startswith("../"):
            raise InputError(name, f"{what} is a hard link to {member.linkname!r}, outside the output")
