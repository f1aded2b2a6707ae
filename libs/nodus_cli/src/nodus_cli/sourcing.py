"""``spec.source.dir`` in ``nodus apply``: a field of the CLI only (ADR-0036). A Job's ``spec.source.dir``,
or a Sweep's ``spec.template.spec.source.dir``, names a local folder (relative to the manifest's folder);
apply packs it (``nodus_sdk.packing``: deterministic, ``.gitignore``/``.nodusignore`` honoured), uploads it
unless the project has the same bytes already, and sends the object with ``source: {blob: <digest>}``
instead. ``nodus apply --source-dir DIR`` does the same for every Job and Sweep of the files that has no
source of its own. The server never sees ``dir``.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from pathlib import Path
from typing import Any, Final

from nodus_cli.client import Client
from nodus_cli.kinds import JOB, SWEEP, Kind
from nodus_cli.manifests import Document
from nodus_cli.volumes import err, sdk_errors, upload_text, warn_skipped
from nodus_sdk import PackError
from nodus_sdk.uploading import Uploaded

SOURCE_PATHS: Final[dict[str, tuple[str, ...]]] = {
    JOB.kind: ("spec", "source"),
    SWEEP.kind: ("spec", "template", "spec", "source"),
}


class SourceError(Exception):
    """A ``source.dir`` that cannot be used; the message names the field and says how to fix it."""


class SourceDirs:
    """Resolves ``source.dir`` of the documents of one apply; a folder named several times is packed
    and uploaded once per project."""

    def __init__(self, client: Client, server: str, flag: str | None = None) -> None:
        self.client, self.server = client, server
        self.flag = Path(flag) if flag else None
        self.done: dict[tuple[str, str], Uploaded] = {}

    def resolve(self, kind: Kind, doc: Document, namespace: str) -> Document:
        """The document to send: with ``source: {blob: ...}`` in place of a ``source.dir`` (or of no
        source at all, under ``--source-dir``); as it was when neither applies. Raises SourceError, or the
        CLI's ApiError when the upload is refused."""
        where = SOURCE_PATHS.get(kind.kind)
        if where is None:
            return doc
        field = ".".join(where)
        source = _at(doc.data, where)
        if isinstance(source, dict) and "dir" in source:
            folder = _dir_of(source, field, doc.base)
        elif source is None and self.flag is not None and isinstance(_at(doc.data, where[:-1]), dict):
            folder = self.flag
        else:
            return doc
        done = self._upload(folder, namespace, field)
        data = copy.deepcopy(doc.data)
        _put(data, where, {"blob": done.digest})
        return dataclasses.replace(doc, data=data)

    def _upload(self, folder: Path, namespace: str, field: str) -> Uploaded:
        if not folder.is_dir():
            raise SourceError(
                f"{field}.dir: {folder} is not a directory\n"
                "fix: name the folder of the code, relative to the manifest's folder (or absolute)"
            )
        key = (namespace, os.path.realpath(folder))
        if key not in self.done:
            try:
                with sdk_errors(self.server):
                    done = self.client.sdk.upload_dir(folder, project=namespace)
            except PackError as e:
                raise SourceError(f"{field}.dir: cannot pack {folder}: {e}") from None
            warn_skipped(done.skipped)
            err(f"source: {upload_text(done)}")
            self.done[key] = done
        return self.done[key]


def _dir_of(source: dict[str, Any], field: str, base: Path) -> Path:
    others = [k for k in ("git", "blob") if source.get(k) is not None]
    if others:
        raise SourceError(
            f"{field}: set one of dir, git and blob, not dir and {' and '.join(others)}\n"
            f"fix: drop {field}.{others[0]}, or drop {field}.dir"
        )
    value = source["dir"]
    if not isinstance(value, str) or not value.strip():
        raise SourceError(
            f"{field}.dir: must be a folder's path, not {value!r}\n"
            "fix: name the folder of the code, relative to the manifest's folder"
        )
    return Path(value) if os.path.isabs(value) else base / value


def _at(data: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = data
    for key in path:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def _put(data: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = data
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
