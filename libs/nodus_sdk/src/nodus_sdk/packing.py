"""A directory packed into a deterministic tar.zst: the blob of ``spec.source.blob`` and of a Volume
revision (ADR-0036).

The same tree always gives the same bytes, so its sha256 names its content and an unchanged directory is
never uploaded twice. What makes it so:

- members in a fixed order: depth first, the entries of each directory by their names' bytes, a directory
  before what is in it; names are relative POSIX paths with no top folder and no ``./`` (``train.py``,
  ``pkg/``, ``pkg/model.py``), so ``tar --zstd -xf`` of a blob gives the directory's content itself;
- every member's metadata fixed: mtime 0, uid/gid 0, no user or group names, mode 0755 for directories
  and for files anyone may execute, 0644 for the others; PAX format;
- zstd level 3 with fixed parameters, one thread, a checksum and no content size in the frame.

What goes in: regular files and directories, and symbolic links that stay inside the tree (kept as links,
never followed: the agent's extractor accepts exactly those). A link that leads out of the tree, or is
absolute, is refused with :class:`PackError` naming it (packing what it points to would silently copy a
file from outside, leaving it out would silently drop one): replace it by the file, or ignore it.
Sockets, FIFOs and devices are left out and listed in :attr:`Packed.skipped`.

What is left out: ``.git`` (directory or file) at any depth, and what the ignore files say, with git's
rules (negation with ``!``, ``dir/`` for directories only, a leading or inner ``/`` anchors the pattern to
the file's folder, ``**``): every ``.gitignore`` applies to its own folder and below, a deeper one
overriding a shallower one; ``.nodusignore`` at the root (same syntax) overrides them all, so it can
leave out what git keeps (``data/``) and take in what git ignores (``!weights.bin``). As in git, nothing
under an ignored directory can be taken back in.

The archive is written to a temporary file while it is hashed, never held in memory: a dataset can be
many GiB. :func:`walk` is the same traversal for callers that send files one by one (a Workspace push).
"""

from __future__ import annotations

import hashlib
import os
import stat
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Final, Literal, cast

import pathspec
import zstandard

__all__ = ["IGNORE_FILES", "Entry", "PackError", "Packed", "pack_dir", "walk"]

GITIGNORE: Final = ".gitignore"
NODUSIGNORE: Final = ".nodusignore"
IGNORE_FILES: Final = (GITIGNORE, NODUSIGNORE)
ALWAYS_LEFT_OUT: Final = frozenset({".git"})
LEVEL: Final = 3
COPY_SIZE: Final = 1 << 20
_SPECIAL: Final = "not a regular file, directory or link"


class PackError(Exception):
    """The directory cannot be packed; the message names the path and says how to fix it."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One path of a walk: ``rel`` is its POSIX path inside the root (no leading ``./``)."""

    rel: str
    path: Path
    kind: Literal["dir", "file", "link", "special"]
    st: os.stat_result


@dataclass
class Packed:
    """A packed directory: the archive in a temporary file (``path``; remove it, or use ``with``), its
    digest (``sha256:<hex>``), its size in bytes, and what is in it."""

    path: Path
    digest: str
    size_bytes: int
    files: int
    raw_bytes: int
    """The files' contents, uncompressed."""
    skipped: list[str] = field(default_factory=list)
    """Paths left out because they are not files, directories or links (sockets, FIFOs, devices)."""

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> Packed:
        return self

    def __exit__(self, *_: object) -> None:
        self.remove()


# -- ignore rules --------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Rules:
    """The patterns of one ignore file, and the folder (relative to the root) they are relative to."""

    base: str
    spec: pathspec.GitIgnoreSpec

    def decide(self, rel: str, is_dir: bool) -> bool | None:
        """True ignored, False taken back in (``!``), None when no pattern of this file matches."""
        inner = rel[len(self.base) + 1 :] if self.base else rel
        result = self.spec.check_file(inner + "/" if is_dir else inner)
        return result.include


def _read_rules(folder: Path, base: str, name: str) -> _Rules | None:
    path = folder / name
    if not path.is_file():
        return None
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as e:
        raise PackError(f"cannot read {path}: {e.strerror or e}; make it readable") from None
    return _Rules(base, pathspec.GitIgnoreSpec.from_lines(lines))


def _ignored(rel: str, is_dir: bool, chain: list[_Rules], top: _Rules | None) -> bool:
    # .nodusignore first, then the deepest .gitignore first: the first file with a matching pattern decides.
    for rules in ([top] if top else []) + chain[::-1]:
        decided = rules.decide(rel, is_dir)
        if decided is not None:
            return decided
    return False


# -- the walk ------------------------------------------------------------------------------------------------
def walk(root: Path) -> Iterator[Entry]:
    """Every path of ``root`` that is packed, in archive order (``root`` itself not included), after the
    ignore rules and ``.git``; links and special files are yielded as such, never followed."""
    root = Path(root)
    if not root.is_dir():
        raise PackError(f"{root} is not a directory: name the folder to pack")
    top = _read_rules(root, "", NODUSIGNORE)
    yield from _walk_dir(root, "", [], top)


def _walk_dir(folder: Path, rel: str, chain: list[_Rules], top: _Rules | None) -> Iterator[Entry]:
    here = _read_rules(folder, rel, GITIGNORE)
    rules = [*chain, here] if here else chain
    try:
        names = sorted(os.listdir(folder), key=os.fsencode)
    except OSError as e:
        raise PackError(f"cannot list {folder}: {e.strerror or e}; make it readable or ignore it") from None
    for name in names:
        if name in ALWAYS_LEFT_OUT:
            continue
        path = folder / name
        child = f"{rel}/{name}" if rel else name
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue  # removed while we walked
        is_dir = stat.S_ISDIR(st.st_mode)
        if _ignored(child, is_dir, rules, top):
            continue
        if is_dir:
            yield Entry(child, path, "dir", st)
            yield from _walk_dir(path, child, rules, top)
        elif stat.S_ISREG(st.st_mode):
            yield Entry(child, path, "file", st)
        elif stat.S_ISLNK(st.st_mode):
            yield Entry(child, path, "link", st)
        else:
            yield Entry(child, path, "special", st)


# -- the archive ---------------------------------------------------------------------------------------------
class _HashingFile:
    """The temporary file under zstd: hashes and counts every compressed byte as it is written."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f = f
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


class _Forward:
    """A never-seeking file over zstd's writer for tarfile's plain "w" mode, which asks ``tell()`` once
    (its stream mode "w|" copies its buffer again on every write)."""

    def __init__(self, z: zstandard.ZstdCompressionWriter) -> None:
        self.z = z
        self.written = 0

    def write(self, data: bytes) -> int:
        self.z.write(data)
        self.written += len(data)
        return len(data)

    def tell(self) -> int:
        return self.written


class _Exact:
    """A file read as exactly the ``size`` bytes its header says; a file that changes size while it is
    read fails the pack (the archive would not be the tree that was walked)."""

    def __init__(self, f: IO[bytes], size: int, rel: str) -> None:
        self.f, self.left, self.rel = f, size, rel

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        data = self.f.read(n) if n > 0 else b""
        self.left -= len(data)
        if len(data) < n or (self.left == 0 and self.f.read(1)):
            raise PackError(f"{self.rel} changed while it was packed: pack again once nothing writes to it")
        return data


def _compressor() -> zstandard.ZstdCompressor:
    # Fixed parameters, not "level 3 for this input size": zstd tunes a level to a known source size, and
    # one thread, so the same tree gives the same bytes whatever the machine.
    params = zstandard.ZstdCompressionParameters.from_level(
        LEVEL, source_size=0, threads=0, write_checksum=1, write_content_size=0, write_dict_id=0
    )
    return zstandard.ZstdCompressor(compression_params=params)


def _info(rel: str, kind: str, st: os.stat_result) -> tarfile.TarInfo:
    info = tarfile.TarInfo(rel)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    executable = kind == "dir" or (kind == "file" and st.st_mode & 0o111)
    info.mode = 0o755 if executable else 0o644
    return info


class _Packer:
    def __init__(self, root: Path, tar: tarfile.TarFile, own: tuple[int, int]) -> None:
        self.root, self.tar, self.own = root, tar, own
        self.real_root = os.path.realpath(root)
        self.files = 0
        self.raw_bytes = 0
        self.skipped: list[str] = []

    def add(self, e: Entry) -> None:
        if (e.st.st_dev, e.st.st_ino) == self.own:
            return  # the archive itself, when the temporary folder is inside the tree
        info = _info(e.rel, e.kind, e.st)
        if e.kind == "dir":
            info.type = tarfile.DIRTYPE
            self.tar.addfile(info)
        elif e.kind == "file":
            self._add_file(info, e)
        elif e.kind == "link":
            self._add_link(info, e)
        else:
            self.skipped.append(f"{e.rel}: {_SPECIAL}")

    def _add_file(self, info: tarfile.TarInfo, e: Entry) -> None:
        try:
            f = open(e.path, "rb")  # noqa: SIM115 -- closed by the with below
        except FileNotFoundError:
            raise PackError(f"{e.rel} was removed while the directory was packed: pack again") from None
        except OSError as err:
            raise PackError(
                f"cannot read {e.path}: {err.strerror or err}; make it readable or ignore it"
            ) from None
        with f:
            info.size = e.st.st_size
            self.tar.addfile(info, cast(IO[bytes], _Exact(f, info.size, e.rel)))
        self.files += 1
        self.raw_bytes += info.size

    def _add_link(self, info: tarfile.TarInfo, e: Entry) -> None:
        target = os.readlink(e.path)
        real = os.path.realpath(e.path)
        inside = real == self.real_root or real.startswith(self.real_root.rstrip("/") + "/")
        if os.path.isabs(target) or not inside:
            raise PackError(
                f"{e.rel} is a link to {target!r}, outside the packed directory: replace it by the file "
                f"it points to, or leave it out with a line '/{e.rel}' in {self.root / NODUSIGNORE}"
            )
        info.type = tarfile.SYMTYPE
        info.linkname = target
        self.tar.addfile(info)


def pack_dir(root: Path, *, tmp_dir: Path | None = None) -> Packed:
    """Pack ``root`` (a directory) into a deterministic tar.zst in a temporary file (in ``tmp_dir``, or
    the system's); raises :class:`PackError` naming what cannot be packed. The caller removes the file
    (``Packed.remove()``, or ``with pack_dir(...) as packed:``)."""
    root = Path(root)
    if not root.is_dir():
        raise PackError(f"{root} is not a directory: name the folder to pack")
    fd, name = tempfile.mkstemp(prefix="nodus-pack-", suffix=".tar.zst", dir=tmp_dir)
    out_path = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            st = os.fstat(f.fileno())
            hashing = _HashingFile(f)
            packer = _write(root, hashing, (st.st_dev, st.st_ino))
    except BaseException:
        out_path.unlink(missing_ok=True)
        raise
    digest = "sha256:" + hashing.sha.hexdigest()
    return Packed(out_path, digest, hashing.size, packer.files, packer.raw_bytes, packer.skipped)


def _write(root: Path, out: _HashingFile, own: tuple[int, int]) -> _Packer:
    with _compressor().stream_writer(cast(IO[bytes], out), write_size=COPY_SIZE, closefd=False) as z:
        sink = cast(IO[bytes], _Forward(z))
        with tarfile.TarFile(fileobj=sink, mode="w", format=tarfile.PAX_FORMAT, copybufsize=COPY_SIZE) as tar:
            packer = _Packer(root, tar, own)
            for entry in walk(root):
                packer.add(entry)
    return packer
