"""nodus_sdk.packing: a directory into a deterministic tar.zst (ADR-0036), and the local side of Workspace
pushes and pulls (nodus_sdk.uploading). Pure: files in a temporary folder, no server."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import zstandard

from nodus_sdk.packing import PackError, pack_dir, walk
from nodus_sdk.uploading import file_digest, local_files, local_target, pulled_rel

MiB = 1 << 20


def write(root: Path, rel: str, text: str = "x") -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@contextmanager
def reading(archive: Path) -> Iterator[tarfile.TarFile]:
    with (
        open(archive, "rb") as f,
        zstandard.ZstdDecompressor().stream_reader(f) as z,
        tarfile.open(fileobj=z, mode="r|") as tar,
    ):
        yield tar


def members(archive: Path) -> list[tarfile.TarInfo]:
    with reading(archive) as tar:
        return list(tar)


def names(root: Path) -> list[str]:
    with pack_dir(root) as packed:
        return [m.name for m in members(packed.path)]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    write(root, "train.py", "print('hi')\n")
    write(root, "pkg/__init__.py", "")
    write(root, "pkg/model.py", "W = 1\n")
    run = write(root, "run.sh", "#!/bin/sh\n")
    run.chmod(0o750)
    return root


def test_equal_trees_give_byte_identical_archives(tree: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(tree, copy)
    # Other times, other permission bits that mean the same (not executable / executable), another order
    # of creation: none of it may change the archive.
    for i, path in enumerate(sorted(copy.rglob("*"))):
        os.utime(path, (1_000_000 + i, 2_000_000 + i))
    (copy / "train.py").chmod(0o600)
    (copy / "run.sh").chmod(0o700)
    if os.geteuid() == 0:
        os.chown(copy / "train.py", 1234, 1234)
    with pack_dir(tree) as a, pack_dir(copy) as b:
        assert a.digest == b.digest
        assert a.path.read_bytes() == b.path.read_bytes()
        assert a.digest == file_digest(a.path)[0]
        assert a.size_bytes == a.path.stat().st_size
        assert a.files == 4


def test_a_changed_byte_changes_the_digest(tree: Path) -> None:
    with pack_dir(tree) as before:
        first = before.digest
    write(tree, "pkg/model.py", "W = 2\n")
    with pack_dir(tree) as after:
        assert after.digest != first


def test_members_are_sorted_with_fixed_metadata(tree: Path) -> None:
    with pack_dir(tree) as packed:
        got = members(packed.path)
    assert [m.name for m in got] == ["pkg", "pkg/__init__.py", "pkg/model.py", "run.sh", "train.py"]
    for m in got:
        assert (m.mtime, m.uid, m.gid, m.uname, m.gname) == (0, 0, 0, "", "")
    modes = {m.name: m.mode for m in got}
    assert modes == {
        "pkg": 0o755,
        "pkg/__init__.py": 0o644,
        "pkg/model.py": 0o644,
        "run.sh": 0o755,
        "train.py": 0o644,
    }


def test_the_archive_is_pax_and_zstd_with_a_checksum(tree: Path) -> None:
    with pack_dir(tree) as packed:
        raw = packed.path.read_bytes()
    assert raw[:4] == b"\x28\xb5\x2f\xfd"
    params = zstandard.get_frame_parameters(raw)
    assert params.has_checksum and params.content_size == zstandard.CONTENTSIZE_UNKNOWN
    data = zstandard.ZstdDecompressor().decompressobj().decompress(raw)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        assert tar.extractfile("pkg/model.py").read() == b"W = 1\n"  # type: ignore[union-attr]


def test_git_is_always_left_out(tree: Path) -> None:
    write(tree, ".git/HEAD", "ref: refs/heads/main\n")
    write(tree, "vendor/lib/.git", "gitdir: ../../.git/modules/lib\n")  # a submodule's .git file
    write(tree, "vendor/lib/code.py")
    got = names(tree)
    assert not [n for n in got if ".git" in n.split("/")]
    assert "vendor/lib/code.py" in got


def test_gitignore_rules_negation_directories_and_anchors(tree: Path) -> None:
    write(tree, ".gitignore", "*.log\n!keep.log\nbuild/\n/top.txt\n")
    for rel in ("a.log", "keep.log", "sub/b.log", "sub/keep.log", "top.txt", "sub/top.txt"):
        write(tree, rel)
    write(tree, "build/out.bin")
    write(tree, "sub/build/out.bin")
    write(tree, "notes/build", "a file named build: directory-only patterns leave it alone")
    got = set(names(tree))
    assert {"keep.log", "sub/keep.log", "sub/top.txt", "notes/build"} <= got
    assert not got & {"a.log", "sub/b.log", "top.txt", "build", "build/out.bin", "sub/build"}


def test_nested_gitignore_applies_below_its_folder_and_overrides(tree: Path) -> None:
    write(tree, ".gitignore", "*.csv\n")
    write(tree, "data/.gitignore", "!wanted.csv\n/local.txt\n")
    for rel in ("a.csv", "data/b.csv", "data/wanted.csv", "local.txt", "data/local.txt", "data/x/local.txt"):
        write(tree, rel)
    got = set(names(tree))
    assert {"data/wanted.csv", "local.txt", "data/x/local.txt", "data/.gitignore", ".gitignore"} <= got
    assert not got & {"a.csv", "data/b.csv", "data/local.txt"}


def test_nothing_under_an_ignored_directory_comes_back(tree: Path) -> None:
    write(tree, ".gitignore", "build/\n!build/keep.txt\n")
    write(tree, "build/keep.txt")
    assert not [n for n in names(tree) if n.startswith("build")]


def test_nodusignore_overrides_gitignore_both_ways(tree: Path) -> None:
    write(tree, ".gitignore", "*.bin\n")
    write(tree, ".nodusignore", "data/\n!weights.bin\n")
    write(tree, "weights.bin")
    write(tree, "other.bin")
    write(tree, "data/train.csv")
    got = set(names(tree))
    assert "weights.bin" in got and "other.bin" not in got
    assert not [n for n in got if n.startswith("data")]


def test_a_link_inside_the_tree_is_kept_as_a_link(tree: Path) -> None:
    (tree / "latest.py").symlink_to("pkg/model.py")
    (tree / "pkg" / "up").symlink_to("..")
    with pack_dir(tree) as packed:
        got = {m.name: m for m in members(packed.path)}
    assert got["latest.py"].issym() and got["latest.py"].linkname == "pkg/model.py"
    assert got["pkg/up"].issym() and got["pkg/up"].linkname == ".."


def test_a_link_out_of_the_tree_is_refused_and_no_archive_is_left(tree: Path, tmp_path: Path) -> None:
    outside = write(tmp_path, "secret.txt", "not yours")
    (tree / "escape").symlink_to(os.path.relpath(outside, tree))
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(PackError, match=r"escape is a link to .*outside the packed directory.*\.nodusignore"):
        pack_dir(tree, tmp_dir=work)
    assert list(work.iterdir()) == []


def test_an_absolute_link_is_refused_even_into_the_tree(tree: Path) -> None:
    (tree / "abs").symlink_to(tree / "train.py")
    with pytest.raises(PackError, match="abs is a link"):
        pack_dir(tree)


def test_an_ignored_link_out_of_the_tree_is_fine(tree: Path) -> None:
    (tree / "escape").symlink_to("/etc/passwd")
    write(tree, ".nodusignore", "/escape\n")
    assert "escape" not in names(tree)


def test_special_files_are_skipped_and_named(tree: Path) -> None:
    os.mkfifo(tree / "pipe")
    with pack_dir(tree) as packed:
        assert "pipe" not in [m.name for m in members(packed.path)]
        assert packed.skipped == ["pipe: not a regular file, directory or link"]


def test_not_a_directory_says_so(tmp_path: Path) -> None:
    with pytest.raises(PackError, match="is not a directory"):
        pack_dir(tmp_path / "missing")


def test_a_large_file_is_streamed_not_held_in_memory(tmp_path: Path) -> None:
    root = tmp_path / "big"
    root.mkdir()
    sha = hashlib.sha256()
    with open(root / "weights.bin", "wb") as f:
        for i in range(48):
            block = os.urandom(MiB // 2) + bytes([i]) * (MiB // 2)  # half incompressible, half not
            sha.update(block)
            f.write(block)
    tracemalloc.start()
    try:
        packed = pack_dir(root, tmp_dir=tmp_path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    with packed:
        assert peak < 12 * MiB, f"packing 48 MiB held {peak / MiB:.1f} MiB at its peak"
        assert packed.raw_bytes == 48 * MiB
        with reading(packed.path) as tar:
            member = tar.next()
            assert member is not None and member.name == "weights.bin"
            got = hashlib.sha256()
            src = tar.extractfile(member)
            assert src is not None
            while chunk := src.read(MiB):
                got.update(chunk)
        assert got.hexdigest() == sha.hexdigest()


def test_the_archive_itself_is_never_packed(tree: Path) -> None:
    # A temporary folder inside the tree: the growing archive must not become one of its members.
    with pack_dir(tree, tmp_dir=tree) as packed:
        assert not [n for n in (m.name for m in members(packed.path)) if n.startswith("nodus-pack-")]


# -- the local side of Workspace pushes and pulls ------------------------------------------------------------
def test_push_sends_what_a_pack_takes(tree: Path) -> None:
    write(tree, ".gitignore", "*.log\n")
    write(tree, "out.log")
    (tree / "latest.py").symlink_to("train.py")
    sent = {path: local for path, local, _ in local_files(tree, "proj/")}
    assert set(sent) == {f"proj/{e.rel}" for e in walk(tree) if e.kind == "file"}
    assert "proj/out.log" not in sent and "proj/latest.py" not in sent
    assert sent["proj/pkg/model.py"] == tree / "pkg" / "model.py"
    assert [p for p, _, _ in local_files(tree / "train.py", "")] == ["train.py"]


def test_pull_places_files_under_the_folder_asked_for() -> None:
    assert pulled_rel("data/a/b.csv", "data") == "a/b.csv"
    assert pulled_rel("data/a/b.csv", "data/a/b.csv") == "b.csv"
    assert pulled_rel("database.csv", "data") is None
    assert pulled_rel("x/y", "") == "x/y"


def test_pull_refuses_paths_that_leave_the_folder(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(ValueError, match="leave the home"):
        pulled_rel("data/../../etc/passwd", "data")
    with pytest.raises(ValueError, match="leave the home"):
        local_target(dest, "../x")
    (dest / "link").symlink_to(tmp_path)
    with pytest.raises(ValueError, match="outside"):
        local_target(dest, "link/x")
    assert local_target(dest, "a/b.txt") == Path(os.path.realpath(dest), "a", "b.txt")
