"""A Job's inputs, materialised under the attempt directory before its program starts (ADR-0020).

Each input ``<name>`` ends up at ``<attempt dir>/inputs/<name>`` (the program sees ``/nodus/inputs/<name>``):

* ``url``: one file over **https only**, streamed to disk under a size cap, its sha256 checked when given;
* ``bucket``: one S3 object (``s3://bucket/key``) or every object under a prefix (``s3://bucket/dir/``,
  a directory), read with the endpoint and keys of a Connection
  (:class:`~nodus_agent.inputcontext.S3Credentials`);
* ``output``: another Job's committed output from the agent's own output store: a file, or a directory
  archived as ``.tar.zst`` and extracted safely here.

``volume`` and ``fromWorkspace`` inputs are checked here with the others but put in place by
:mod:`nodus_agent.mounting` (a Volume revision from the node's cache, a Workspace's snapshot), which knows
the grant's revisions and the node's cache; ``fromStage`` is refused: the Pipeline controller rewrites it
into an ``output`` input naming the producing Job before the stage's Job exists, so a StartAttempt never
carries one (ADR-0039).

Safe to kill at any line, and idempotent: everything is fetched into a private staging directory beside
``inputs/`` and renamed into place only once complete and verified, so the final name never holds a partial
file; a small marker written after the rename lets a second :func:`materialise` (a duplicate StartAttempt,
an agent restarted mid-way) keep what is already there instead of fetching it again.

The work is split by concern: :mod:`nodus_agent.inputcontext` (settings, credentials, records, errors),
:mod:`nodus_agent.inputstaging` (staging, markers, capped and hashed writes), and one module per kind:
:mod:`nodus_agent.inputurl`, :mod:`nodus_agent.inputbucket`, :mod:`nodus_agent.inputoutput`.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Final

import msgspec

from nodus_agent.inputbucket import fetch_bucket
from nodus_agent.inputcontext import InputContext, InputError, InputRecord
from nodus_agent.inputoutput import fetch_output
from nodus_agent.inputstaging import Clients, Layout, Materialisation
from nodus_agent.inputurl import fetch_url
from nodus_schema.jobs import JobInput

__all__ = ["INPUT_NAME", "MOUNTED_KINDS", "materialise"]

INPUT_NAME: Final = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
REFUSED_KINDS: Final = {
    "fromStage": (
        "a fromStage input is resolved by the Pipeline before the run (into an output input naming the "
        "producing Job), so a StartAttempt never carries one"
    )
}
MOUNTED_KINDS: Final = frozenset({"volume", "fromWorkspace"})
"""Kinds :func:`nodus_agent.mounting.prepare_mounts` puts in place (:func:`materialise` skips them)."""
_SHA256: Final = re.compile(r"[0-9a-f]{64}")


async def materialise(inputs: Sequence[JobInput], dir: Path, ctx: InputContext) -> list[InputRecord]:
    """Put every input under ``dir`` (the attempt's ``inputs/``), in order of ``inputs``; one record each,
    but for the :data:`MOUNTED_KINDS`, which are checked with the others and left to the mounts.

    Checks every input before fetching any. Raises :class:`InputError` on the first input that fails; the
    others are cancelled, and nothing partial is left under a final name. One call per ``dir`` at a time
    (the runner never prepares one attempt twice at once: a duplicate StartAttempt meanwhile is ignored)."""
    for inp in inputs:
        _check(inp)
    names = [inp.name for inp in inputs]
    for name in names:
        if names.count(name) > 1:
            raise InputError(str(name), "two inputs have this name; names must be unique")
    inputs = [inp for inp in inputs if _kind_of(inp) not in MOUNTED_KINDS]
    run = Materialisation(await asyncio.to_thread(Layout.prepare, dir), Clients())
    gate = asyncio.Semaphore(ctx.settings.parallel)

    async def one(inp: JobInput) -> InputRecord:
        async with gate:
            return await _materialise_one(inp, run, ctx)

    tasks = [asyncio.ensure_future(one(inp)) for inp in inputs]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # every staging file is cleaned up first
        raise
    finally:
        await run.clients.aclose()


def _kind_of(inp: JobInput) -> str:
    """The one source an input names (``url``, ``bucket``, ``output``, a mounted or a refused kind); "" for
    none."""
    kinds = _kinds(inp)
    return kinds[0] if len(kinds) == 1 else ""


def _kinds(inp: JobInput) -> list[str]:
    candidates = (
        ("url", inp.url),
        ("bucket", inp.bucket),
        ("output", inp.output),
        ("volume", inp.volume),
        ("fromWorkspace", inp.from_workspace),
        ("fromStage", inp.from_stage),
    )
    return [kind for kind, value in candidates if value is not None]


def _check(inp: JobInput) -> None:
    """Admission's rules again, as the agent needs them: a bad name would escape ``inputs/``."""
    name = inp.name or ""
    if not INPUT_NAME.fullmatch(name):
        raise InputError(name, "a name is a letter, then up to 63 letters, digits or '_'")
    kinds = _kinds(inp)
    if len(kinds) != 1:
        raise InputError(
            name,
            f"an input has exactly one of url, bucket, output, volume or fromWorkspace; this one has {kinds}",
        )
    if kinds[0] in REFUSED_KINDS:
        raise InputError(name, f"{REFUSED_KINDS[kinds[0]]}; use url, bucket, output, volume or fromWorkspace")
    digest = inp.url.sha256 if inp.url else inp.bucket.sha256 if inp.bucket else None
    if digest is not None and not _SHA256.fullmatch(digest):
        raise InputError(name, f"sha256 {digest!r} is not 64 lower case hex digits")


async def _materialise_one(inp: JobInput, run: Materialisation, ctx: InputContext) -> InputRecord:
    name, kind = inp.name or "", _kind_of(inp)
    fingerprint = _fingerprint(inp, ctx)
    kept = await asyncio.to_thread(run.layout.kept, name, fingerprint)
    if kept is not None:
        return msgspec.structs.replace(kept, fetched=False)
    record = await _FETCHERS[kind](inp, run, ctx)
    await asyncio.to_thread(run.layout.mark, name, fingerprint, record)
    return record


def _fingerprint(inp: JobInput, ctx: InputContext) -> str:
    """Same spec from the same place: what an existing marker must match to be kept."""
    where: Any = None
    if inp.bucket is not None:
        creds = ctx.connections.get(inp.bucket.connection or "")
        where = creds and [creds.endpoint, creds.bucket]
    elif inp.output is not None:
        where = ctx.outputs and [ctx.outputs.endpoint, ctx.outputs.bucket, ctx.outputs_root, ctx.namespace]
    return hashlib.sha256(msgspec.json.encode([inp, where])).hexdigest()


_FETCHERS: Final[dict[str, Callable[[JobInput, Materialisation, InputContext], Awaitable[InputRecord]]]] = {
    "url": fetch_url,
    "bucket": fetch_bucket,
    "output": fetch_output,
}
