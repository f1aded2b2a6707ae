"""Admission checks that read other objects: the code and data a Job, Sweep or Pipeline names (ADR-0036).

:func:`resolve` runs on a create after the pure rules passed and before the write (and before an
``If-Match`` binding, so a dry run's ETag covers the spec as it will be stored). For a Job's spec, a
Sweep's ``spec.template.spec``, or each stage's of a Pipeline (``spec.stages[i].template.job``,
``spec.stages[i].template.sweep.template.spec``; issue #22), it checks:

* ``source.blob``: the project uploaded that blob;
* ``source.git``: the repository answers ``git ls-remote`` and has the ref (gitrefs.py);
* ``volumes[i]`` and ``inputs[i].volume``: the Volume exists and has the pinned revision; a read-only
  mount or a volume input without a revision gets the latest one **written into the returned object**
  (pinning: a restart never switches data under a running Job, and every cell of a Sweep reads the same);
* ``inputs[i].fromWorkspace``: the Workspace exists;
* ``serviceAccountName``: the ServiceAccount exists, and the gateway has a URL to give runs (ADR-0037);

and answers one 422 listing every problem at its wire path. A writable mount's Volume held by another
unfinished Job is a 409 Conflict naming it (a Job's create only: a Sweep's cells and a Pipeline's children
are created later by the sweep controller). A stage's ``fromStage`` inputs name what another stage will
write: nothing to read here (``nodus_schema.pipelinerules`` checks what they name).

**The writer claim** (``Volume.status.writer``: the Job's name and uid). The store stamps the uid at the
write, so the claim is taken just after it (:func:`claim_writers`, by compare-and-set on the Volume):
a claim held by a Job that is finished, gone, or re-created under the same name (another uid) is taken
over; one held by an unfinished Job refuses the create: the Job just written is deleted again and the
answer is 409. Claiming after the write, not before, is what makes two concurrent creates safe: a
claimant always exists when another create looks at it, so "not found" can only mean gone. A dry run
checks the claim and takes nothing.

Updates: spec.source, spec.volumes and spec.inputs are immutable (nodus_schema.updating; a Pipeline's
stages as a whole), so an update is not checked again; :func:`kept_pins` carries the pinned revisions of the
stored spec into an update that leaves them out (re-applying the manifest a Job was created from is not a
change; a Pipeline's stage keeps its own stored stage's, by name).

Blob records read here are the project's own (keyed by namespace): a digest of another project's upload is
"not found" here too, so probing digests learns nothing.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
from collections.abc import Awaitable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import msgspec

from nodus_gateway.gitrefs import (
    DEFAULT_USERNAME,
    REFS,
    GitAuth,
    GitSettings,
    Outcome,
    covers,
    is_commit,
    looks_abbreviated,
    repo_url,
)
from nodus_gateway.resources import Stores, resource
from nodus_gateway.responding import ApiError, invalid
from nodus_kit import errors as kit
from nodus_schema import CauseType, FieldError, Job, Sweep
from nodus_schema.configs import Connection, GitConnection, Secret
from nodus_schema.fielding import Path
from nodus_schema.jobs import TERMINAL_PHASES, GitSource, JobInput, JobSpec, VolumeMount
from nodus_schema.pipelinerules import stage_spec
from nodus_schema.pipelines import Pipeline, Stage, StageTemplate
from nodus_schema.volumes import Volume, VolumeRevision, VolumeWriter, revision_of

BLOB_FIX: Final = (
    "upload it: nodus apply with source.dir, or PUT /apis/nodus.dev/v1/namespaces/{ns}/blobs/{digest}"
)
TOUCH_EVERY: Final = timedelta(hours=1)
"""A blob's lastUsedTime is moved at most this often: expiry counts in days, and a burst of creates naming
one blob must not write its record each time."""
_LISTED_REVISIONS: Final = 10
ACCOUNT_FIX: Final = (
    "create it: kind ServiceAccount, metadata.name {name}, spec.role viewer or editor, in project {ns} "
    "(`nodus apply -f` a manifest, or POST /apis/nodus.dev/v1/namespaces/{ns}/serviceaccounts); or drop "
    "serviceAccountName"
)
NO_URL_FIX: Final = (
    "this gateway has no URL to give runs: its operator sets NODUS_PUBLIC_URL (and NODUS_PUBLIC_CA for a "
    "private CA); until then leave serviceAccountName out"
)


@dataclass(frozen=True, slots=True)
class ReferenceSettings:
    """What admission's reads of other objects need besides the stores: how to ask git hosts, and the URL
    runs reach the API at (None: Jobs that name a ServiceAccount are refused; nodus_gateway.reaching)."""

    git: GitSettings = field(default_factory=GitSettings)
    run_url: str | None = None


# -- where the JobSpec is ------------------------------------------------------------------------------------
def spec_at(obj: Any) -> tuple[JobSpec, Path] | None:
    """The JobSpec a Job or Sweep runs, and its wire path; None for other kinds."""
    if isinstance(obj, Job):
        return obj.spec, Path("spec")
    if isinstance(obj, Sweep):
        return obj.spec.template.spec, Path("spec").child("template").child("spec")
    return None


def with_spec(obj: Any, spec: JobSpec) -> Any:
    if isinstance(obj, Job):
        return msgspec.structs.replace(obj, spec=spec)
    template = msgspec.structs.replace(obj.spec.template, spec=spec)
    return msgspec.structs.replace(obj, spec=msgspec.structs.replace(obj.spec, template=template))


def specs_at(obj: Any) -> list[tuple[JobSpec, Path]]:
    """Every JobSpec ``obj`` runs, with its wire path: a Job's or Sweep's one, a Pipeline's stages' in order
    (a stage without a template has none); none for other kinds."""
    if not isinstance(obj, Pipeline):
        one = spec_at(obj)
        return [one] if one is not None else []
    out: list[tuple[JobSpec, Path]] = []
    for i, stage in enumerate(obj.spec.stages):
        spec, tp = stage_spec(stage), Path("spec").child("stages").index(i).child("template")
        if spec is None:
            continue
        if stage.template.job is not None:
            out.append((spec, tp.child("job")))
        else:
            out.append((spec, tp.child("sweep").child("template").child("spec")))
    return out


def _withstage_spec(stage: Stage, spec: JobSpec) -> Stage:
    t = stage.template
    if t.job is not None:
        return msgspec.structs.replace(stage, template=StageTemplate(job=spec))
    assert t.sweep is not None
    template = msgspec.structs.replace(t.sweep.template, spec=spec)
    return msgspec.structs.replace(
        stage, template=StageTemplate(sweep=msgspec.structs.replace(t.sweep, template=template))
    )


def with_specs(obj: Any, specs: list[JobSpec]) -> Any:
    """``obj`` with the JobSpecs :func:`specs_at` found replaced by ``specs``, in the same order."""
    if not isinstance(obj, Pipeline):
        return with_spec(obj, specs[0]) if specs else obj
    left = iter(specs)
    stages = [s if stage_spec(s) is None else _withstage_spec(s, next(left)) for s in obj.spec.stages]
    return msgspec.structs.replace(obj, spec=msgspec.structs.replace(obj.spec, stages=stages))


# -- the checks ----------------------------------------------------------------------------------------------
@dataclass(slots=True)
class _Check:
    """One resolve: the Volumes read so far (None: not found) and the causes found."""

    stores: Stores
    namespace: str
    causes: list[FieldError] = field(default_factory=list)
    volumes: dict[str, Volume | None] = field(default_factory=dict)

    async def volume(self, name: str) -> Volume | None:
        if name not in self.volumes:
            try:
                self.volumes[name] = await self.stores["volumes"].get(self.namespace, name)
            except kit.NotFound:
                self.volumes[name] = None
        return self.volumes[name]

    def add(self, path: Path, reason: CauseType, message: str) -> None:
        self.causes.append(FieldError(str(path), reason, message))


def _revisions_text(vol: Volume) -> str:
    numbers = [r.revision for r in vol.status.revisions]
    if not numbers:
        return "has no revisions yet"
    if len(numbers) <= _LISTED_REVISIONS:
        return "has revisions " + ", ".join(str(n) for n in numbers)
    return f"has revisions {numbers[0]} to {numbers[-1]} ({len(numbers)} kept)"


def _no_volume(check: _Check, path: Path, name: str) -> None:
    check.add(
        path,
        CauseType.NOT_FOUND,
        f"Not found: {name!r}: the project has no Volume {name!r}; create it with "
        f"`nodus volume push {name} DIR`, or check the name (`nodus get volumes`)",
    )


async def _pinned(
    check: _Check, name: str, number: int | None, *, name_path: Path, rev_path: Path
) -> VolumeRevision | None:
    """The revision a read-only use of Volume ``name`` reads: ``number``, or the latest; None (with a
    cause) when there is none."""
    vol = await check.volume(name)
    if vol is None:
        _no_volume(check, name_path, name)
        return None
    rev = revision_of(vol, number)
    if rev is not None:
        return rev
    if number is not None:
        check.add(
            rev_path,
            CauseType.NOT_FOUND,
            f"Not found: {number}: Volume {name!r} {_revisions_text(vol)}; pin one of those, or leave "
            "revision out for the latest",
        )
    else:
        check.add(
            name_path,
            CauseType.INVALID,
            f"Invalid value: {name!r}: Volume {name!r} has no revision yet, so a read-only mount would be "
            f"empty; push one first with `nodus volume push {name} DIR`",
        )
    return None


async def _mount(check: _Check, path: Path, mount: VolumeMount) -> VolumeMount:
    if mount.volume is None:
        return mount
    if not mount.read_only:
        # Writable: the writer claim decides; the Volume must exist (it starts from its latest, or empty).
        if await check.volume(mount.volume) is None:
            _no_volume(check, path.child("volume"), mount.volume)
        return mount
    rev = await _pinned(
        check,
        mount.volume,
        mount.revision,
        name_path=path.child("volume"),
        rev_path=path.child("revision"),
    )
    return mount if rev is None else msgspec.structs.replace(mount, revision=rev.revision)


async def _input(check: _Check, path: Path, inp: JobInput) -> JobInput:
    if inp.volume is not None and inp.volume.name is not None:
        vp = path.child("volume")
        rev = await _pinned(
            check,
            inp.volume.name,
            inp.volume.revision,
            name_path=vp.child("name"),
            rev_path=vp.child("revision"),
        )
        if rev is not None:
            return msgspec.structs.replace(
                inp, volume=msgspec.structs.replace(inp.volume, revision=rev.revision)
            )
    ws = inp.from_workspace
    if ws is not None and ws.name is not None:
        try:
            await check.stores["workspaces"].get(check.namespace, ws.name)
        except kit.NotFound:
            check.add(
                path.child("fromWorkspace").child("name"),
                CauseType.NOT_FOUND,
                f"Not found: {ws.name!r}: the project has no Workspace {ws.name!r}; create it with "
                f"`nodus workspace push {ws.name} DIR`, or check the name (`nodus get workspaces`)",
            )
    return inp


async def _blob(check: _Check, path: Path, digest: str) -> None:
    # Imported here: blobbing's router imports routing, which imports this module (admission's hook).
    from nodus_gateway.blobbing import blob_exists

    if await blob_exists(check.stores, check.namespace, digest) is None:
        check.add(
            path,
            CauseType.NOT_FOUND,
            f"Not found: {digest!r}: the project has no such blob; "
            + BLOB_FIX.format(ns=check.namespace, digest=digest),
        )


async def _account(check: _Check, path: Path, name: str, run_url: str | None) -> str | None:
    """The fix of a cause on ``serviceAccountName`` (the account is missing, or runs could not reach the
    API with it), None when it is fine."""
    if run_url is None:
        check.add(path, CauseType.FORBIDDEN, f"Forbidden: {name!r}: {NO_URL_FIX}")
        return NO_URL_FIX
    try:
        await check.stores["serviceaccounts"].get(check.namespace, name)
    except kit.NotFound:
        message = f"Not found: {name!r}: the project has no ServiceAccount {name!r}"
        check.add(path, CauseType.NOT_FOUND, message)
        return ACCOUNT_FIX.format(name=name, ns=check.namespace)
    return None


# -- git -----------------------------------------------------------------------------------------------------
async def git_auth(stores: Stores, namespace: str, connections: list[str], url: str) -> GitAuth | None:
    """The token of the Git Connection listed in ``connections`` whose url covers ``url`` (the longest, if
    several do); None when none does or its Secret cannot be read (the check then runs without one)."""
    best: GitConnection | None = None
    for name in connections:
        try:
            conn: Connection = await stores["connections"].get(namespace, name)
        except (kit.NotFound, ValueError):
            continue
        git = conn.spec.git
        if conn.spec.type != "Git" or git is None or not git.url or not covers(git.url, url):
            continue
        if best is None or len(git.url) > len(best.url or ""):
            best = git
    ref = best.token_ref if best is not None else None
    if best is None or ref is None or not ref.name or not ref.key:
        return None
    try:
        secret: Secret = await stores["secrets"].get(namespace, ref.name)
        token = base64.b64decode(secret.data.get(ref.key, ""), validate=True).decode().strip()
    except (kit.NotFound, binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return GitAuth(best.username or DEFAULT_USERNAME, token) if token else None


async def _git(
    check: _Check, path: Path, git: GitSource, connections: list[str], settings: GitSettings
) -> None:
    if git.repo is None:
        return
    url = repo_url(git.repo, settings.host)
    if not settings.allows(url):
        check.add(
            path.child("repo"),
            CauseType.FORBIDDEN,
            f"Forbidden: {git.repo!r}: this cluster fetches code only from {settings.allowed()}; use a "
            "repository there, or ask the operator to add the host to NODUS_GIT_ALLOWED_HOSTS",
        )
        return
    auth = await git_auth(check.stores, check.namespace, connections, url)
    ref = git.ref
    listing = await REFS.ls_remote(url, None if ref is None or is_commit(ref) else ref, settings, auth)
    if listing.outcome is Outcome.NO_REPO:
        check.add(
            path.child("repo"),
            CauseType.NOT_FOUND,
            f"Not found: {git.repo!r}: {url} has no such repository, or it is private and no Git Connection "
            f"in spec.connections gives a token for it (git: {listing.detail})",
        )
    elif listing.outcome is Outcome.UNREACHABLE:
        check.add(
            path.child("repo"),
            CauseType.INVALID,
            f"Invalid value: {git.repo!r}: {url} could not be reached (git: {listing.detail}); check the "
            "URL, or retry when the host answers",
        )
    elif listing.outcome is Outcome.NO_REF:
        hint = "; give the full 40-character commit id" if ref and looks_abbreviated(ref) else ""
        check.add(
            path.child("ref"),
            CauseType.NOT_FOUND,
            f"Not found: {ref!r}: {url} has no branch or tag {ref!r}{hint}",
        )


# -- the writer claim ----------------------------------------------------------------------------------------
def writable(spec: JobSpec) -> list[str]:
    """The Volumes ``spec`` mounts writable (``readOnly: false``; unset is read-only, defaulting.py)."""
    return [m.volume for m in spec.volumes if m.volume and m.read_only is False]


async def live_writer(stores: Stores, namespace: str, writer: VolumeWriter | None) -> bool:
    """Whether ``writer`` is a Job that exists (the same uid) and has not finished: its claim holds."""
    if writer is None:
        return False
    try:
        job: Job = await stores["jobs"].get(namespace, writer.job)
    except kit.NotFound:
        return False
    return job.metadata.uid == writer.uid and job.status.phase not in TERMINAL_PHASES


def writer_conflict(job: str | None, volume: str, holder: VolumeWriter) -> ApiError:
    return ApiError.of(
        "Conflict",
        f'Volume "{volume}" is being written by Job "{holder.job}", which has not finished: a Volume has '
        "one writer at a time",
        name=job,
        kind="jobs",
        fix=f"Wait for Job {holder.job} to finish (`nodus get job {holder.job}`) or cancel it, or mount "
        f"Volume {volume} with readOnly: true to read its latest revision.",
    )


async def _check_writers(check: _Check, job: str | None, spec: JobSpec) -> None:
    for name in writable(spec):
        vol = await check.volume(name)
        holder = vol.status.writer if vol is not None else None
        if (
            holder is not None
            and holder.job != job
            and await live_writer(check.stores, check.namespace, holder)
        ):
            raise writer_conflict(job, name, holder)


async def claim_writers(stores: Stores, created: Any) -> None:
    """Take the writer claim of each Volume the just-created Job ``created`` mounts writable. When another
    unfinished Job holds one, ``created`` is deleted again and the 409 is raised (see the module's notes)."""
    if not isinstance(created, Job):
        return
    meta = created.metadata
    namespace, me = meta.namespace or "", VolumeWriter(job=meta.name or "", uid=meta.uid or "")
    for name in writable(created.spec):
        try:
            await _claim(stores, namespace, name, me)
        except ApiError:
            with contextlib.suppress(kit.NotFound):
                await stores["jobs"].delete(namespace, me.job)
            raise


async def _claim(stores: Stores, namespace: str, volume: str, me: VolumeWriter) -> None:
    volumes = stores["volumes"]
    while True:
        vol: Volume = await volumes.get(namespace, volume)
        holder = vol.status.writer
        if holder == me:
            return
        if holder is not None and await live_writer(stores, namespace, holder):
            raise writer_conflict(me.job, volume, holder)
        status = msgspec.structs.replace(vol.status, writer=me)
        try:
            await volumes.update(msgspec.structs.replace(vol, status=status))
            return
        except kit.Conflict:
            continue  # the Volume changed (a revision, another claim): judge again on a fresh read


# -- blob use ------------------------------------------------------------------------------------------------
async def _touch(stores: Stores, namespace: str, spec: JobSpec, path: Path) -> list[FieldError]:
    """The source blob's lastUsedTime, when it is older than :data:`TOUCH_EVERY` (a Volume's revisions keep
    their blobs by being listed). Strict: a blob the reaper took between the check and now is refused
    (blobreaping.py), so a Job is never admitted with code that is about to vanish."""
    from nodus_gateway.blobbing import blob_exists, touch_blob  # see _blob

    digest = spec.source.blob if spec.source is not None else None
    if digest is None:
        return []
    blob = await blob_exists(stores, namespace, digest)
    last = blob.status.last_used_time if blob is not None else None
    if blob is None or last is None or _older(last, datetime.now(UTC) - TOUCH_EVERY):
        try:
            await touch_blob(stores, namespace, digest, strict=True)
        except ApiError:
            why = f"blob {digest} expired while this object was admitted: upload it again"
            return [FieldError(str(path), CauseType.NOT_FOUND, why)]
    return []


def _older(stamp: str, than: datetime) -> bool:
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")) < than
    except ValueError:
        return True


# -- the entry points ----------------------------------------------------------------------------------------
async def _resolve_spec(
    check: _Check, settings: ReferenceSettings, spec: JobSpec, path: Path
) -> tuple[JobSpec, str | None]:
    """``spec`` with its Volume revisions pinned, and the fix of a cause on its ``serviceAccountName`` (None
    when there is none); every problem is added to ``check``."""
    git = spec.source.git if spec.source is not None else None
    git_check: Awaitable[None] | None = None
    if git is not None:
        # Started first: the ls-remote runs while the store is read.
        gp = path.child("source").child("git")
        git_check = asyncio.ensure_future(_git(check, gp, git, spec.connections, settings.git))
    fix = None
    try:
        if spec.source is not None and spec.source.blob is not None:
            await _blob(check, path.child("source").child("blob"), spec.source.blob)
        mounts = [await _mount(check, path.child("volumes").index(i), m) for i, m in enumerate(spec.volumes)]
        inputs = [await _input(check, path.child("inputs").index(i), x) for i, x in enumerate(spec.inputs)]
        if spec.service_account_name is not None:
            account_path = path.child("serviceAccountName")
            fix = await _account(check, account_path, spec.service_account_name, settings.run_url)
    finally:
        if git_check is not None:
            await git_check
    return msgspec.structs.replace(spec, volumes=mounts, inputs=inputs), fix


def _plural(obj: Any) -> str:
    if isinstance(obj, Pipeline):
        return "pipelines"
    return "jobs" if isinstance(obj, Job) else "sweeps"


async def resolve(
    stores: Stores, settings: ReferenceSettings, namespace: str, obj: Any, *, dry_run: bool = False
) -> Any:
    """``obj`` (an admitted Job, Sweep or Pipeline; anything else is returned as it is) with its Volume
    revisions pinned; raises 422 Invalid with every problem, or 409 Conflict for a Volume another Job
    writes. ``settings``: how to ask git hosts, and the URL runs reach the API at. A dry run touches no blob
    record."""
    where = specs_at(obj)
    if not where:
        return obj
    check = _Check(stores, namespace)
    resolved: list[JobSpec] = []
    fixes: list[str] = []
    for spec, path in where:  # one spec after the other: the causes come in the order of their fields
        pinned, fix = await _resolve_spec(check, settings, spec, path)
        resolved.append(pinned)
        if fix is not None and fix not in fixes:
            fixes.append(fix)
    name = obj.metadata.name or obj.metadata.generate_name
    res = resource(_plural(obj))
    if check.causes:
        err = invalid(res, name, check.causes)
        if fixes:  # the account's own fix, where Invalid's general one would say less
            err = ApiError(msgspec.structs.replace(err.status, fix="; ".join(fixes)))
        raise err
    if isinstance(obj, Job):
        await _check_writers(check, obj.metadata.name, where[0][0])
    if not dry_run:
        expired: list[FieldError] = []
        for spec, path in where:
            expired += await _touch(stores, namespace, spec, path.child("source").child("blob"))
        if expired:
            raise invalid(res, name, expired)
    return with_specs(obj, resolved)


def _kept_spec(spec: JobSpec, before: JobSpec) -> JobSpec:
    """``spec`` with the revisions ``before`` pinned where ``spec`` leaves them out, for the same Volume
    mount (by Volume) or input (by name); ``spec`` itself when there is nothing to carry."""
    pinned_mounts = {m.volume: m.revision for m in before.volumes if m.revision is not None}
    mounts = [
        msgspec.structs.replace(m, revision=pinned_mounts[m.volume])
        if m.revision is None and m.volume in pinned_mounts and m.read_only
        else m
        for m in spec.volumes
    ]
    pinned_inputs = {
        (i.name, i.volume.name): i.volume.revision
        for i in before.inputs
        if i.volume is not None and i.volume.revision is not None
    }
    inputs = [_kept_input(i, pinned_inputs) for i in spec.inputs]
    if mounts == spec.volumes and inputs == spec.inputs:
        return spec
    return msgspec.structs.replace(spec, volumes=mounts, inputs=inputs)


def _kept_stage(stage: Stage, before: Stage | None) -> Stage:
    """A stage of an update with the pins of the stored stage of its name, when both are of one kind."""
    if before is None or (stage.template.job is None) != (before.template.job is None):
        return stage
    spec, old = stage_spec(stage), stage_spec(before)
    if spec is None or old is None:
        return stage
    kept = _kept_spec(spec, old)
    return stage if kept is spec else _withstage_spec(stage, kept)


def kept_pins(new: Any, old: Any) -> Any:
    """``new`` (an update of ``old``) with the revisions ``old`` pinned where ``new`` leaves them out (each
    stage of a Pipeline from the stored stage of its name). Pure; other kinds come back as they are."""
    if type(new) is not type(old):
        return new
    if isinstance(new, Pipeline):
        by_name = {s.name: s for s in old.spec.stages}
        stages = [_kept_stage(s, by_name.get(s.name)) for s in new.spec.stages]
        if all(a is b for a, b in zip(stages, new.spec.stages, strict=True)):
            return new
        return msgspec.structs.replace(new, spec=msgspec.structs.replace(new.spec, stages=stages))
    where_new, where_old = spec_at(new), spec_at(old)
    if where_new is None or where_old is None:
        return new
    kept = _kept_spec(where_new[0], where_old[0])
    return new if kept is where_new[0] else with_spec(new, kept)


def _kept_input(inp: JobInput, pinned: dict[tuple[str | None, str | None], int]) -> JobInput:
    vol = inp.volume
    if vol is None or vol.revision is not None or (inp.name, vol.name) not in pinned:
        return inp
    return msgspec.structs.replace(
        inp, volume=msgspec.structs.replace(vol, revision=pinned[(inp.name, vol.name)])
    )
