"""Volumes, Workspaces and uploaded blobs: code and data that live in Nodus's own store (ADR-0036).

A **blob** is a tar.zst archive uploaded into a project and named by the sha256 of its bytes
(``sha256:<hex>``): the code of ``spec.source.blob``, and the content of every Volume revision. Blobs are
content-addressed per project, so an unchanged directory is uploaded once.

A **Volume** is a named, revisioned dataset of a project. Each revision is one blob; ``status.revisions``
lists them (number, digest, size, who made it, when). Revisions are made by ``nodus volume push`` (an
upload, then ``POST .../volumes/<name>/revisions``) or by a Job with a writable mount that succeeds. A
Volume has at most one writer Job at a time: the claim (``status.writer``) is taken at the Job's admission.

A **Workspace** is a project's persistent home directory: plain files under one prefix of the store, moved
in and out with ``nodus workspace push/pull/ls``, mounted read-only by ``inputs[].fromWorkspace``.

Pure: types, rules and the store's key layout. The gateway writes these objects; agents read blobs and
workspace files from the store with their own keys and learn revision digests from the gateway.
"""

from __future__ import annotations

import posixpath
import re
from typing import Final

import msgspec

from nodus_schema.fielding import ErrorList, FieldError, Path
from nodus_schema.meta import ListMeta, ObjectMeta
from nodus_schema.validating import validate_object_meta
from nodus_schema.wire import API_VERSION, Wire

__all__ = [
    "BLOB_PATTERN",
    "MAX_REVISIONS",
    "MAX_VOLUME_NAME",
    "STORE_PREFIX",
    "Blob",
    "BlobSpec",
    "BlobStatus",
    "Volume",
    "VolumeList",
    "VolumeRevision",
    "VolumeRevisionRequest",
    "VolumeSpec",
    "VolumeStatus",
    "VolumeWriter",
    "Workspace",
    "WorkspaceList",
    "WorkspaceSpec",
    "WorkspaceStatus",
    "blob_key",
    "digest_hex",
    "revision_of",
    "validate_volume",
    "validate_workspace",
    "workspace_key",
    "workspace_path",
    "workspace_prefix",
]

MAX_VOLUME_NAME: Final = 63
MAX_REVISIONS: Final = 1000
"""Revisions kept in ``status.revisions`` (the oldest beyond are dropped from the list; a Job that pins
one of them is refused at admission)."""
BLOB_PATTERN: Final = re.compile(r"sha256:[0-9a-f]{64}")
STORE_PREFIX: Final = "_nodus/"
"""Where Nodus keeps its own objects in the store's bucket, beside the ``<namespace>/<job>-<uid8>/``
folders of checkpoints and outputs (a namespace never starts with ``_``, so the two never meet)."""


class BlobSpec(Wire):
    size_bytes: int
    creator: str
    """Who uploaded it (a user), or ``job:<name>`` for a writable mount's commit."""


class BlobStatus(Wire):
    last_used_time: str | None = None
    """The last admission of a Job or Sweep that named it, or the revision it became (expiry counts from
    here)."""
    uses: int = 0
    """How often it was touched so: every touch is a new revision of the record, even within the second of
    the last, which is what makes the reaper's compare-and-set see it (nodus_gateway.blobreaping)."""


class Blob(Wire):
    """The gateway's record of an uploaded blob (bucket ``blobs``, key ``<ns>.<hex>``; the name is the hex
    digest). Not served as a resource: ``HEAD``/``GET .../blobs/sha256:<hex>`` answer from it."""

    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "Blob")
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: BlobSpec = msgspec.field(default_factory=lambda: BlobSpec(size_bytes=0, creator=""))
    status: BlobStatus = msgspec.field(default_factory=BlobStatus)


class VolumeSpec(Wire):
    description: str | None = None


class VolumeRevision(Wire):
    """One revision: a blob of the project, and who made it."""

    revision: int
    digest: str
    """sha256:<hex> of the revision's tar.zst archive (the blob)."""
    size_bytes: int
    """The archive's size in bytes (what a cold mount downloads)."""
    creator: str
    """The user who pushed it, or ``job:<name>`` for a writable mount's commit."""
    time: str
    attempt: str | None = None
    """The Attempt whose writable mount committed it."""


class VolumeWriter(Wire):
    """The one Job that may commit the next revision (a writable mount), claimed at its admission."""

    job: str
    uid: str


class VolumeStatus(Wire):
    revisions: list[VolumeRevision] = msgspec.field(default_factory=list)
    latest: int | None = None
    """The newest revision's number (None before the first)."""
    writer: VolumeWriter | None = None


class Volume(Wire):
    """Volume is a named, revisioned dataset of a project, stored in Nodus's store."""

    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "Volume")
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: VolumeSpec = msgspec.field(default_factory=VolumeSpec)
    status: VolumeStatus = msgspec.field(default_factory=VolumeStatus)


class VolumeList(Wire, omit_defaults=False):
    """A list of Volumes."""

    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "VolumeList")
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[Volume] = msgspec.field(default_factory=list)


class VolumeRevisionRequest(Wire):
    """The body of ``POST .../volumes/<name>/revisions``: an uploaded blob becomes the next revision."""

    digest: str


class WorkspaceSpec(Wire):
    description: str | None = None


class WorkspaceStatus(Wire):
    files: int = 0
    size_bytes: int = 0
    update_time: str | None = None


class Workspace(Wire):
    """Workspace is a persistent home directory of a project, for the files people keep between runs."""

    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "Workspace")
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: WorkspaceSpec = msgspec.field(default_factory=WorkspaceSpec)
    status: WorkspaceStatus = msgspec.field(default_factory=WorkspaceStatus)


class WorkspaceList(Wire, omit_defaults=False):
    """A list of Workspaces."""

    api_version: str = msgspec.field(default_factory=lambda: API_VERSION)
    kind: str = msgspec.field(default_factory=lambda: "WorkspaceList")
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[Workspace] = msgspec.field(default_factory=list)


# -- rules --------------------------------------------------------------------------------------------------
def _type_meta(errs: ErrorList, api_version: str, kind: str, want: str) -> None:
    if api_version != API_VERSION:
        errs.invalid(Path("apiVersion"), api_version, f"must be {API_VERSION}")
    if kind != want:
        errs.invalid(Path("kind"), kind, f"must be {want}")


def _description(errs: ErrorList, value: str | None) -> None:
    if value is not None and len(value) > 1024:
        errs.invalid(Path("spec").child("description"), value[:32] + "...", "must be at most 1024 characters")


def validate_volume(vol: Volume) -> list[FieldError]:
    """A Volume's own fields; its status (revisions, writer) is the gateway's and is not the caller's."""
    errs = ErrorList()
    _type_meta(errs, vol.api_version, vol.kind, "Volume")
    errs.extend(validate_object_meta(vol.metadata, max_name=MAX_VOLUME_NAME))
    _description(errs, vol.spec.description)
    return errs.as_list()


def validate_workspace(ws: Workspace) -> list[FieldError]:
    errs = ErrorList()
    _type_meta(errs, ws.api_version, ws.kind, "Workspace")
    errs.extend(validate_object_meta(ws.metadata, max_name=MAX_VOLUME_NAME))
    _description(errs, ws.spec.description)
    return errs.as_list()


def revision_of(vol: Volume, number: int | None) -> VolumeRevision | None:
    """Revision ``number`` of ``vol`` (the latest for None); None when it has no such revision."""
    if not vol.status.revisions:
        return None
    if number is None:
        return vol.status.revisions[-1]
    for rev in vol.status.revisions:
        if rev.revision == number:
            return rev
    return None


# -- the store's layout -------------------------------------------------------------------------------------
def digest_hex(digest: str) -> str:
    """``sha256:<hex>`` -> ``<hex>``; ValueError for anything else."""
    if BLOB_PATTERN.fullmatch(digest) is None:
        raise ValueError(f"{digest!r} is not a blob digest (sha256:<64 lower case hex digits>)")
    return digest.removeprefix("sha256:")


def blob_key(namespace: str, digest: str) -> str:
    """The store key of a project's blob."""
    return f"{STORE_PREFIX}blobs/{namespace}/{digest_hex(digest)}.tar.zst"


def workspace_prefix(namespace: str, name: str) -> str:
    """The store prefix of a Workspace's home (ends with ``/``)."""
    return f"{STORE_PREFIX}workspaces/{namespace}/{name}/"


def workspace_path(path: str) -> str:
    """A path in a home, normalised (no leading ``/``, no ``.`` segments); ValueError for one that leaves
    the home (``..``), is empty where a file is meant, or holds a control character."""
    clean = path.strip("/")
    if any(ord(c) < 32 or ord(c) == 127 for c in clean):
        raise ValueError(f"{path!r}: control characters are not allowed in a path")
    parts = [p for p in clean.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"{path!r}: '..' would leave the home")
    return posixpath.join(*parts) if parts else ""


def workspace_key(namespace: str, name: str, path: str) -> str:
    """The store key of one file of a Workspace's home."""
    rel = workspace_path(path)
    if not rel:
        raise ValueError("a file path in the home is required")
    return workspace_prefix(namespace, name) + rel
