"""Rules of the parts of a JobSpec that say what runs: the container (image, env, secrets, source, init
command, sidecars), its inputs, outputs and volumes, and the fields Nodus accepts in the reference's shape
but cannot honour yet.

**Not supported yet.** The reference lists fields whose feature Nodus does not have (Volumes, Workspaces,
Pipelines, warm capacity, service accounts, ...). They are refused with a 422 on the field, never dropped or
stored unread: a Job that ran without what it asked for would fail late and cost money, or quietly compute
the wrong thing. Each refusal says what is missing and what to use instead, in one wording
(:func:`not_supported_yet`).
"""

from __future__ import annotations

import posixpath
import re
from typing import Final

from nodus_schema.checks import (
    NODUS_MANAGED_PATHS,
    abs_path,
    collected_path,
    dns_label,
    duration,
    enum,
    https_url,
    int_range,
    max_items,
    object_name,
    pattern,
    required,
    sha256,
    target_path,
    unique,
    unique_at,
)
from nodus_schema.fielding import ErrorList, Path
from nodus_schema.jobs import (
    FROM_RANKS,
    SINK_MODES,
    EnvVar,
    InitCommand,
    JobInput,
    JobOutput,
    JobSpec,
    SecretMount,
    Sidecar,
    Source,
    VolumeMount,
)
from nodus_schema.quantities import parse_duration
from nodus_schema.ranges import MAX_INIT_TIMEOUT

__all__ = [
    "MAX_COMPLETIONS",
    "MAX_OUTPUTS",
    "RESERVED_ENV",
    "RESERVED_OUTPUT_NAME",
    "container",
    "inputs",
    "not_supported_yet",
    "outputs",
    "unavailable",
    "volumes",
    "writers",
]

MAX_COMPLETIONS: Final = 10_000
"""A Job's completions (so its indexes) are 1 to 10000, as the reference says."""
MAX_OUTPUTS: Final = 32

RESERVED_OUTPUT_NAME: Final = "outputs"
"""Everything under /nodus/outputs is collected as the output named "outputs"; a declared one would clash."""
RESERVED_OUTPUT_PREFIX: Final = "nodus."
RESERVED_SIDECAR_NAME: Final = "main"
"""The Job's own container is "main" (logs, status); a sidecar of that name would be ambiguous."""

RESERVED_ENV: Final = frozenset(
    {
        "NODUS_INDEX",
        "JOB_COMPLETION_INDEX",
        "NODUS_JOB",
        "NODUS_NAMESPACE",
        "NODUS_ATTEMPT",
        "NODUS_REPORT",
        # A gang member's place in the gang (docs/gangs.md); the launchers' own variables (MASTER_ADDR,
        # RANK, ...) are set for gang Jobs only, and a Job's own value is overwritten there.
        "NODUS_GANG",
        "NODUS_RANK",
        "NODUS_WORLD_SIZE",
        "NODUS_GPUS_PER_NODE",
        "NODUS_MASTER_ADDR",
        "NODUS_MASTER_PORT",
        "NODUS_LAUNCHER",
        # Where the process runtime puts spec.source's checkout and Volume mounts (ADR-0036).
        "NODUS_SRC",
        "NODUS_MOUNTS",
    }
)
"""The env contract the agent sets at run time; a user value would be silently overwritten, so it is refused.
NODUS_PARAM_<NAME> is not reserved: it is how a Sweep's cell Job carries its parameters."""

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ENV_NAME_HINT = "a letter or underscore, then letters, digits and underscores (^[A-Za-z_][A-Za-z0-9_]*$)"
_INPUT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
_OUTPUT_NAME = re.compile(r"[a-z0-9._-]{1,64}")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]{1,253}")
_BLOB = re.compile(r"sha256:[0-9a-f]{64}")
_GIT_OWNER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]*/[A-Za-z0-9._-]+")
# A ref may not start with "-" (it would reach git as an option) and has no spaces or control characters.
_GIT_REF = re.compile(r"[A-Za-z0-9._/+@^~{}][A-Za-z0-9._/+@^~{}-]{0,254}")
_S3_URI = re.compile(r"s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/(?P<key>.+)")
_SQL_TABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?")

# ---------------------------------------------------------------------------------------------------------
# Not supported yet
# ---------------------------------------------------------------------------------------------------------

_INPUT_SOURCE_NAMES = "volume, output, bucket, url or fromWorkspace"
"""The input kinds the node agent materialises (ADR-0020, ADR-0036)."""
_INPUTS_INSTEAD = (
    f"use {_INPUT_SOURCE_NAMES} instead: an https:// file, an S3 object or prefix, or another Job's "
    "committed output"
)

_UNSUPPORTED_INPUTS: Final[dict[str, str]] = {}
"""Input kinds the reference lists whose objects Nodus does not have yet (none since Pipelines, #22)."""


def not_supported_yet(errs: ErrorList, path: Path, what: str, why: str, instead: str) -> None:
    """The refusal of a field whose feature Nodus does not have yet: ``<what> not supported yet (<why>);
    <instead>`` (``instead`` says what to use, as ``use ... instead``)."""
    errs.forbidden(path, f"{what} not supported yet ({why}); {instead}")


def unavailable(errs: ErrorList, path: Path, spec: JobSpec) -> None:
    """The JobSpec fields Nodus accepts the shape of but does not honour (yet). Parts checked elsewhere:
    input kinds (:func:`inputs`), sidecar startupTimeout and env valueFrom (:func:`container`), egress
    presets and checkpoint integration (``jobrules.py``). serviceAccountName is checked against the
    project's ServiceAccounts at admission (the gateway), completeByTime and scaledownWindow are honoured
    (issue #21)."""
    if spec.image_ref is not None:
        not_supported_yet(
            errs,
            path.child("imageRef"),
            "imageRef is",
            "nothing resolves image references",
            "use image instead, pinned by digest (name@sha256:...) if it must not change",
        )


# ---------------------------------------------------------------------------------------------------------
# The container: image, env, secrets, source, init command, sidecars
# ---------------------------------------------------------------------------------------------------------


def _env_var(errs: ErrorList, path: Path, e: EnvVar, *, sidecar: bool = False) -> None:
    if required(errs, path.child("name"), e.name, "an environment variable name"):
        assert e.name is not None
        if pattern(errs, path.child("name"), e.name, _ENV_NAME, _ENV_NAME_HINT) and e.name in RESERVED_ENV:
            errs.forbidden(path.child("name"), f"{e.name} is set by Nodus at run time")
    if e.value is not None and e.value_from is not None:
        errs.invalid(path.child("valueFrom"), "secretKeyRef", "set exactly one of value and valueFrom")
    elif e.value is None and e.value_from is None:
        errs.required(path, "Required value: set exactly one of value and valueFrom")
    if e.value_from is None:
        return
    if sidecar:
        not_supported_yet(
            errs,
            path.child("valueFrom"),
            "a sidecar's env valueFrom is",
            "the runtime gives a sidecar literal values only",
            "use the Job's own env instead (a sidecar gets the Job's environment, Secret values included), "
            "or a literal value",
        )
    ref = e.value_from.secret_key_ref
    rp = path.child("valueFrom").child("secretKeyRef")
    if not required(errs, rp, ref, "valueFrom needs a secretKeyRef with name and key"):
        return
    assert ref is not None
    if required(errs, rp.child("name"), ref.name, "the Secret's name"):
        object_name(errs, rp.child("name"), ref.name)
    if required(errs, rp.child("key"), ref.key, "the key within the Secret") and ref.key is not None:
        pattern(errs, rp.child("key"), ref.key, _SECRET_KEY, "letters, digits, '-', '_' or '.'")


def _env_list(errs: ErrorList, path: Path, env: list[EnvVar], *, sidecar: bool = False) -> None:
    for i, e in enumerate(env):
        _env_var(errs, path.index(i), e, sidecar=sidecar)
    unique_at(errs, path, [e.name for e in env], "name")


def _secrets(errs: ErrorList, path: Path, secrets: list[SecretMount | str]) -> None:
    names: list[tuple[Path, str | None]] = []
    for i, s in enumerate(secrets):
        sp = path.index(i)
        if isinstance(s, str):
            object_name(errs, sp, s)  # the bare form: the error names the item the user wrote
            names.append((sp, s))
            continue
        if required(errs, sp.child("name"), s.name, "the Secret's name"):
            object_name(errs, sp.child("name"), s.name)
        int_range(errs, sp.child("version"), s.version, 1)
        names.append((sp.child("name"), s.name))
    unique(errs, names)


def _git_path(errs: ErrorList, path: Path, value: str | None) -> None:
    if value is None:
        return
    if value.startswith("/"):
        target_path(errs, path, value, extra=NODUS_MANAGED_PATHS)
    elif ".." in value.split("/") or posixpath.normpath(value) != value:
        errs.invalid(path, value, "a relative checkout path must be normalised and stay below workingDir")


def _source(errs: ErrorList, path: Path, src: Source | None) -> None:
    """spec.source: exactly one of git and blob. Whether the blob was uploaded, and whether the repository
    and ref exist, the gateway checks at admission (ADR-0036)."""
    if src is None:
        return
    if src.git is not None and src.blob is not None:
        errs.invalid(path.child("blob"), src.blob, "set exactly one of git and blob")
    elif src.git is None and src.blob is None:
        errs.required(path, "Required value: exactly one of git and blob")
    if src.blob is not None:
        pattern(errs, path.child("blob"), src.blob, _BLOB, "sha256:<64 lower case hex digits>")
    git = src.git
    if git is None:
        return
    gp = path.child("git")
    if required(errs, gp.child("repo"), git.repo, "owner/name or an https:// URL") and git.repo is not None:
        if "://" in git.repo:
            https_url(errs, gp.child("repo"), git.repo)
        else:
            pattern(errs, gp.child("repo"), git.repo, _GIT_OWNER_NAME, "owner/name or an https:// URL")
    if git.ref is not None:
        pattern(errs, gp.child("ref"), git.ref, _GIT_REF, "a branch, tag or commit (no spaces, not '-...')")
    _git_path(errs, gp.child("path"), git.path)


def _init_command(errs: ErrorList, path: Path, init: InitCommand | None) -> None:
    if init is None:
        return
    required(errs, path.child("command"), init.command, "the preflight's argv")
    timeout = duration(errs, path.child("timeout"), init.timeout, positive=True)
    if timeout is not None and timeout > parse_duration(MAX_INIT_TIMEOUT):
        errs.invalid(path.child("timeout"), init.timeout, f"must be at most {MAX_INIT_TIMEOUT}")


def _sidecars(errs: ErrorList, path: Path, sidecars: list[Sidecar]) -> None:
    for i, s in enumerate(sidecars):
        sp = path.index(i)
        if required(errs, sp.child("name"), s.name, "a sidecar name"):
            dns_label(errs, sp.child("name"), s.name)
            if s.name == RESERVED_SIDECAR_NAME:
                errs.forbidden(sp.child("name"), f'"{RESERVED_SIDECAR_NAME}" is the Job\'s own container')
        if s.image is not None:
            required(errs, sp.child("image"), s.image, "an image, or leave it unset for the Job's image")
        _env_list(errs, sp.child("env"), s.env, sidecar=True)
        if s.startup_timeout is not None and duration(
            errs, sp.child("startupTimeout"), s.startup_timeout, positive=True
        ):
            not_supported_yet(
                errs,
                sp.child("startupTimeout"),
                "a sidecar startupTimeout is",
                "a sidecar has no readiness check: it starts before the program and nothing waits for it",
                "leave it unset instead",
            )
    unique_at(errs, path, [s.name for s in sidecars], "name")


def container(errs: ErrorList, path: Path, spec: JobSpec) -> None:
    # An image is always required: Nodus has no default runtime image, and Kubernetes requires one too.
    # (imageRef, a reference the platform would resolve, is refused: nothing resolves it yet.)
    if not spec.image and not spec.image_ref:
        errs.required(path.child("image"), "Required value: the container image")
    if spec.working_dir is not None:
        abs_path(errs, path.child("workingDir"), spec.working_dir)
    _env_list(errs, path.child("env"), spec.env)
    _secrets(errs, path.child("secrets"), spec.secrets)
    for field, names in (("imagePullSecrets", spec.image_pull_secrets), ("connections", spec.connections)):
        for i, n in enumerate(names):
            object_name(errs, path.child(field).index(i), n)
        unique_at(errs, path.child(field), names)
    object_name(errs, path.child("serviceAccountName"), spec.service_account_name)
    _source(errs, path.child("source"), spec.source)
    _init_command(errs, path.child("initCommand"), spec.init_command)
    _sidecars(errs, path.child("sidecars"), spec.sidecars)


# ---------------------------------------------------------------------------------------------------------
# Inputs, outputs, volumes
# ---------------------------------------------------------------------------------------------------------


def _input_sources(inp: JobInput) -> list[str]:
    candidates = (
        ("volume", inp.volume),
        ("output", inp.output),
        ("bucket", inp.bucket),
        ("url", inp.url),
        ("fromWorkspace", inp.from_workspace),
        ("fromStage", inp.from_stage),
    )
    return [name for name, value in candidates if value is not None]


def _input_source(errs: ErrorList, path: Path, inp: JobInput, *, in_pipeline: bool = False) -> None:
    sources = _input_sources(inp)
    if not sources:
        errs.required(path, f"Required value: exactly one of {_INPUT_SOURCE_NAMES}")
    for extra in sources[1:]:
        errs.forbidden(path.child(extra), f"an input has exactly one source, and {sources[0]} is set")
    if "fromStage" in sources and not in_pipeline:
        errs.forbidden(
            path.child("fromStage"),
            "fromStage inputs work only in a Pipeline's stage (kind Pipeline, spec.stages[].template); in a "
            "Job or Sweep use an output input naming the producing Job instead",
        )
    for kind in sources:
        if kind in _UNSUPPORTED_INPUTS:
            not_supported_yet(
                errs,
                path.child(kind),
                f"{kind} inputs are",
                f"Nodus has no {_UNSUPPORTED_INPUTS[kind]}",
                _INPUTS_INSTEAD,
            )
    if inp.volume is not None:
        vp = path.child("volume")
        if required(errs, vp.child("name"), inp.volume.name, "the Volume's name"):
            object_name(errs, vp.child("name"), inp.volume.name)
        int_range(errs, vp.child("revision"), inp.volume.revision, 1)
    if inp.output is not None:
        op = path.child("output")
        if required(errs, op.child("job"), inp.output.job, "the producing Job"):
            dns_label(errs, op.child("job"), inp.output.job)
        if required(errs, op.child("name"), inp.output.name, "the output's name") and inp.output.name:
            pattern(
                errs, op.child("name"), inp.output.name, _OUTPUT_NAME, "an output name (^[a-z0-9._-]{1,64}$)"
            )
        int_range(errs, op.child("index"), inp.output.index, 0, MAX_COMPLETIONS - 1)
    _remote_input(errs, path, inp)


def _remote_input(errs: ErrorList, path: Path, inp: JobInput) -> None:
    if inp.bucket is not None:
        bp = path.child("bucket")
        if required(errs, bp.child("uri"), inp.bucket.uri, "s3://bucket/key") and inp.bucket.uri:
            pattern(errs, bp.child("uri"), inp.bucket.uri, _S3_URI, "an object URI s3://bucket/key")
        object_name(errs, bp.child("connection"), inp.bucket.connection)
        sha256(errs, bp.child("sha256"), inp.bucket.sha256)
    if inp.url is not None:
        up = path.child("url")
        if required(errs, up.child("url"), inp.url.url, "an https:// URL") and inp.url.url:
            https_url(errs, up.child("url"), inp.url.url)
        sha256(errs, up.child("sha256"), inp.url.sha256)
    if inp.from_workspace is not None:
        wp = path.child("fromWorkspace")
        if required(errs, wp.child("name"), inp.from_workspace.name, "the Workspace's name"):
            object_name(errs, wp.child("name"), inp.from_workspace.name)
        sub = inp.from_workspace.path
        if sub is not None and (sub.startswith("/") or ".." in sub.split("/")):
            errs.invalid(wp.child("path"), sub, "must be a subdirectory of the home: relative, without '..'")
    if inp.from_stage is not None:
        sp = path.child("fromStage")
        required(errs, sp.child("stage"), inp.from_stage.stage, "the producing stage")
        required(errs, sp.child("output"), inp.from_stage.output, "the stage's output name")


def inputs(errs: ErrorList, path: Path, items: list[JobInput], *, in_pipeline: bool = False) -> None:
    """Every input's rules; ``in_pipeline``: the spec is a Pipeline stage's (``fromStage`` is allowed, and
    the Pipeline checks what it names: pipelinerules.py)."""
    for i, inp in enumerate(items):
        ip = path.index(i)
        if required(errs, ip.child("name"), inp.name, "an input name") and inp.name is not None:
            pattern(
                errs,
                ip.child("name"),
                inp.name,
                _INPUT_NAME,
                "a letter, then up to 63 letters, digits or '_'",
            )
        _input_source(errs, ip, inp, in_pipeline=in_pipeline)
    unique_at(errs, path, [inp.name for inp in items], "name")


def _output_name(errs: ErrorList, path: Path, name: str | None) -> None:
    if not required(errs, path, name, "an output name") or name is None:
        return
    if not pattern(errs, path, name, _OUTPUT_NAME, "1 to 64 of lower case letters, digits, '.', '_' or '-'"):
        return
    if name.startswith(RESERVED_OUTPUT_PREFIX):
        errs.forbidden(path, f'the "{RESERVED_OUTPUT_PREFIX}" prefix is reserved for Nodus')
    elif name == RESERVED_OUTPUT_NAME:
        errs.forbidden(path, '"outputs" is the implicit output of /nodus/outputs; choose another name')


def _output(errs: ErrorList, path: Path, out: JobOutput) -> None:
    _output_name(errs, path.child("name"), out.name)
    if required(errs, path.child("path"), out.path, "an absolute file or directory path"):
        collected_path(errs, path.child("path"), out.path, "outputs")
    enum(errs, path.child("fromRanks"), out.from_ranks, FROM_RANKS)
    if out.sink is not None:
        kp = path.child("sink")
        if required(
            errs, kp.child("connection"), out.sink.connection, "a Postgres, Neon or Supabase Connection"
        ):
            object_name(errs, kp.child("connection"), out.sink.connection)
        if required(errs, kp.child("table"), out.sink.table, "the destination table") and out.sink.table:
            pattern(
                errs, kp.child("table"), out.sink.table, _SQL_TABLE, "a table name, optionally schema.table"
            )
        enum(errs, kp.child("mode"), out.sink.mode, SINK_MODES)


def outputs(errs: ErrorList, path: Path, items: list[JobOutput]) -> None:
    max_items(errs, path, items, MAX_OUTPUTS)
    for i, out in enumerate(items):
        _output(errs, path.index(i), out)
    unique_at(errs, path, [o.name for o in items], "name")


def volumes(errs: ErrorList, path: Path, items: list[VolumeMount]) -> None:
    """spec.volumes: each a Volume at an absolute mount point outside the OS trees and /nodus, a pinned
    revision only read-only, no mount inside another, one mount per Volume (ADR-0036)."""
    for i, v in enumerate(items):
        vp = path.index(i)
        if required(errs, vp.child("volume"), v.volume, "the Volume's name"):
            object_name(errs, vp.child("volume"), v.volume)
        if required(errs, vp.child("mountPath"), v.mount_path, "an absolute mount point"):
            target_path(errs, vp.child("mountPath"), v.mount_path, extra=NODUS_MANAGED_PATHS)
        int_range(errs, vp.child("revision"), v.revision, 1)
        if v.revision is not None and v.read_only is False:
            errs.forbidden(vp.child("revision"), "a revision can only be pinned on a read-only mount")
    unique_at(errs, path, [v.mount_path for v in items], "mountPath")
    unique_at(errs, path, [v.volume for v in items], "volume")
    _not_nested(errs, path, [(i, v.mount_path) for i, v in enumerate(items) if v.mount_path])


def _not_nested(errs: ErrorList, path: Path, mounts: list[tuple[int, str]]) -> None:
    """No mount point inside another: the inner one would hide or be hidden by the outer's files."""
    for i, inner in mounts:
        for j, outer in mounts:
            if i != j and inner.startswith(outer.rstrip("/") + "/"):
                errs.forbidden(
                    path.index(i).child("mountPath"),
                    f"{inner!r} is inside spec.volumes[{j}].mountPath {outer!r}; mount them side by side",
                )


def writers(errs: ErrorList, path: Path, spec: JobSpec, *, in_sweep: bool = False) -> None:
    """A writable mount commits the next revision when its index succeeds: one index, one writer. Several
    indexes of a Job, or the cells of a Sweep, would write at once, so they are refused (ADR-0036)."""
    for i, v in enumerate(spec.volumes):
        if v.read_only is not False:  # unset is read-only (defaulting.py)
            continue
        vp = path.child("volumes").index(i).child("readOnly")
        if in_sweep:
            errs.forbidden(
                vp,
                "a Sweep's cells would write the same Volume at once; mount it readOnly: true, and write "
                "results as outputs (or run the writer as a Job of its own)",
            )
        elif (spec.completions or 1) > 1:
            errs.forbidden(
                vp,
                f"the {spec.completions} indexes of this Job would write the same Volume at once; mount it "
                "readOnly: true, or use completions: 1",
            )
    git = spec.source.git if spec.source is not None else None
    if git is not None and git.path and git.path.startswith("/"):
        for i, v in enumerate(spec.volumes):
            mp = (v.mount_path or "").rstrip("/")
            if mp and (git.path == mp or git.path.startswith(mp + "/") or mp.startswith(git.path + "/")):
                errs.forbidden(
                    path.child("source").child("git").child("path"),
                    f"{git.path!r} overlaps spec.volumes[{i}].mountPath {v.mount_path!r}; use another path",
                )
