"""Blobs, Volume revisions and Workspace files: the calls both clients send, and the local side of moving
files (ADR-0036). Free of network I/O; the clients carry the calls and stream the bytes.

- A blob is a tar.zst named by its sha256 (``sha256:<hex>``), per project: ``HEAD`` says whether the
  project has it, ``PUT`` uploads it (201 new, 200 already there).
- A Volume revision is an uploaded blob made the Volume's next revision (``POST .../revisions``).
- A Workspace's files are plain files under paths in its home: ``PUT``/``GET``/``DELETE`` one, list a
  prefix page by page.

Paths that come back from the server are distrusted as an archive's members are: a listed path that
would climb out of the folder a pull writes into is refused (:func:`local_target`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Final
from urllib.parse import quote

import httpx
import msgspec

from nodus_schema.volumes import Volume, VolumeRevisionRequest, digest_hex, workspace_path
from nodus_schema.wire import Wire
from nodus_sdk import packing
from nodus_sdk.requesting import Call, body_of, decode_body, project_path, query

CHUNK_SIZE: Final = 1 << 20
"""Bytes per read of a file being uploaded or written by a download."""
SIZE_HEADER: Final = "X-Nodus-Size"
"""The blob's size on a ``HEAD`` answer (which has no body)."""
OCTETS: Final = "application/octet-stream"


@dataclass(frozen=True, slots=True)
class Uploaded:
    """A blob the project has now: its digest and size, whether this call sent its bytes (False: it was
    there already), and for a packed directory how many files it holds."""

    digest: str
    size_bytes: int
    uploaded: bool
    files: int | None = None
    skipped: list[str] = field(default_factory=list)
    """Paths a packed directory left out (sockets, FIFOs, devices)."""


class WorkspaceFile(Wire):
    """One file of a Workspace's home, as listed."""

    path: str
    size_bytes: int = 0
    last_modified: str | None = None


class WorkspaceFiles(Wire):
    """A page of a Workspace listing; ``continue_`` asks for the next."""

    items: list[WorkspaceFile] = msgspec.field(default_factory=list)
    continue_: str | None = msgspec.field(default=None, name="continue")


@dataclass
class Transfer:
    """What a Workspace push or pull moved: the paths (in the home), their bytes, and what it left out."""

    paths: list[str] = field(default_factory=list)
    bytes: int = 0
    skipped: list[str] = field(default_factory=list)


# -- blobs ---------------------------------------------------------------------------------------------------
def blob_path(project: str, digest: str) -> str:
    digest_hex(digest)  # ValueError for anything that is not sha256:<64 hex>
    return project_path(project, "blobs", digest)


def _blob_size(resp: httpx.Response) -> int:
    value = resp.headers.get(SIZE_HEADER, "")
    return int(value) if value.isdigit() else -1


def head_blob(project: str, digest: str) -> Call[int]:
    """Whether the project has the blob: its size (-1 when the server does not say), NotFound if not."""
    return Call("HEAD", blob_path(project, digest), _blob_size)


def _put_answer(resp: httpx.Response) -> int:
    body = decode_body(resp.content, dict[str, object]) if resp.content else {}
    size = body.get("sizeBytes")
    return size if isinstance(size, int) else -1


def put_blob(project: str, digest: str, size: int) -> Call[int]:
    """The upload (its body streamed by the client); answers the size the server stored."""
    headers = {"Content-Type": OCTETS, "Content-Length": str(size)}
    return Call("PUT", blob_path(project, digest), _put_answer, headers=headers)


def file_size(path: Path) -> int:
    return Path(path).stat().st_size


def file_chunks(path: Path) -> Iterator[bytes]:
    """A file's bytes in chunks (blocking reads of 1 MiB: the client's upload body)."""
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_SIZE):
            yield chunk


def file_digest(path: Path) -> tuple[str, int]:
    """``sha256:<hex>`` and size of a file, read in chunks."""
    sha = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_SIZE):
            sha.update(chunk)
            size += len(chunk)
    return "sha256:" + sha.hexdigest(), size


# -- Volumes -------------------------------------------------------------------------------------------------
def add_revision(project: str, volume: str, digest: str) -> Call[Volume]:
    """Make an uploaded blob the Volume's next revision; answers the Volume."""
    body = body_of(VolumeRevisionRequest(digest=digest))
    path = project_path(project, "volumes", volume, "revisions")
    return Call("POST", path, _volume, body=body, headers={"Content-Type": "application/json"})


def _volume(resp: httpx.Response) -> Volume:
    return decode_body(resp.content, Volume)


def new_object(kind: str, name: str, description: str | None = None) -> dict[str, object]:
    """A Volume or Workspace to create: a name, and a description if given."""
    spec = {"description": description} if description else {}
    return {"apiVersion": "nodus.dev/v1", "kind": kind, "metadata": {"name": name}, "spec": spec}


# -- Workspace files -----------------------------------------------------------------------------------------
def file_path(project: str, workspace: str, path: str) -> str:
    """``.../workspaces/<name>/files/<path>``, each segment escaped; ValueError for a path that is empty
    or climbs out of the home."""
    rel = workspace_path(path)
    if not rel:
        raise ValueError(f"{path!r}: a file path in the home is required")
    segments = "/".join(quote(p, safe="") for p in rel.split("/"))
    return project_path(project, "workspaces", workspace, "files", segments)


def put_file(project: str, workspace: str, path: str, size: int) -> Call[None]:
    headers = {"Content-Type": OCTETS, "Content-Length": str(size)}
    return Call("PUT", file_path(project, workspace, path), _nothing, headers=headers)


def get_file(project: str, workspace: str, path: str) -> Call[None]:
    return Call("GET", file_path(project, workspace, path), _nothing, headers={"Accept": OCTETS})


def delete_file(project: str, workspace: str, path: str) -> Call[None]:
    return Call("DELETE", file_path(project, workspace, path), _nothing)


def list_files(project: str, workspace: str, prefix: str, continue_: str | None) -> Call[WorkspaceFiles]:
    path = project_path(project, "workspaces", workspace, "files")
    params = query(prefix=workspace_path(prefix) or None, **{"continue": continue_})
    return Call("GET", path, _files, params)


def _files(resp: httpx.Response) -> WorkspaceFiles:
    return decode_body(resp.content, WorkspaceFiles)


def _nothing(resp: httpx.Response) -> None:
    return None


# -- the local side ------------------------------------------------------------------------------------------
def local_files(source: Path, to: str = "") -> Iterator[tuple[str, Path, int]]:
    """(path in the home, local file, size) of what a push sends: a file to ``<to>/<its name>``, a
    directory's files (after its ignore rules, as a pack takes them) under ``<to>/``. Links and special
    files are not sent: :func:`skipped_locals` names them."""
    base = workspace_path(to)
    source = Path(source)
    if source.is_file():
        yield _joined(base, source.name), source, source.stat().st_size
        return
    for e in packing.walk(source):
        if e.kind == "file":
            yield _joined(base, e.rel), e.path, e.st.st_size


def skipped_locals(source: Path) -> list[str]:
    """What a push of the directory ``source`` leaves out although no ignore rule says so."""
    if not Path(source).is_dir():
        return []
    return [
        f"{e.rel}: a {e.kind}, not a file"
        for e in packing.walk(Path(source))
        if e.kind in ("link", "special")
    ]


def _joined(base: str, rel: str) -> str:
    return f"{base}/{rel}" if base else rel


def pulled_rel(listed: str, path: str) -> str | None:
    """Where a listed file goes relative to the pull's folder: the file itself when ``path`` names it, its
    path under ``path`` when ``path`` is a folder; None for a listed path that is neither (a sibling that
    merely starts with the same letters). ValueError for one that climbs out."""
    clean = workspace_path(listed)
    want = workspace_path(path)
    if not want:
        return clean
    if clean == want:
        return posix_name(clean)
    if clean.startswith(want + "/"):
        return clean[len(want) + 1 :]
    return None


def posix_name(path: str) -> str:
    return path.rsplit("/", 1)[-1]


class Partial:
    """A download written beside its target (``.<name>.nodus-partial``) and renamed onto it once complete:
    an interrupted pull never leaves a cut file under the real name, and the rename replaces a link at the
    target instead of writing through it."""

    def __init__(self, target: Path) -> None:
        self.target = Path(target)
        self.partial = self.target.with_name(f".{self.target.name}.nodus-partial")
        self.size = 0
        self._f: BinaryIO | None = None

    def __enter__(self) -> Partial:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.partial, "wb")  # closed by commit() or __exit__
        return self

    def write(self, chunk: bytes) -> None:
        assert self._f is not None
        self._f.write(chunk)
        self.size += len(chunk)

    def commit(self) -> None:
        assert self._f is not None
        self._f.close()
        os.replace(self.partial, self.target)

    def __exit__(self, *_: object) -> None:
        if self._f is not None:
            self._f.close()
        self.partial.unlink(missing_ok=True)


def local_target(dest: Path, rel: str) -> Path:
    """``dest/rel`` for a file a pull writes, refusing a path that would land outside ``dest`` (through
    ``..`` or through a link already in ``dest``)."""
    clean = workspace_path(rel)
    if not clean:
        raise ValueError(f"{rel!r}: no file name")
    root = os.path.realpath(dest)
    target = Path(root, *clean.split("/"))
    parent = os.path.realpath(target.parent)
    if parent != root and not parent.startswith(root.rstrip("/") + "/"):
        raise ValueError(f"{rel!r} would be written outside {dest} (through a link)")
    return target
