"""``nodus volume push NAME DIR`` and ``nodus volume ls``: Volumes, a project's revisioned datasets
(ADR-0036); and what the commands that move bytes share (the SDK's errors as the CLI's, sizes).

A push packs the directory as ``nodus apply`` packs ``source.dir`` (deterministic, ``.gitignore`` and
``.nodusignore`` honoured), uploads it unless the project has those bytes already, and makes it the
Volume's next revision (the Volume is created first when missing).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from nodus_cli import exiting, printing
from nodus_cli.client import ApiError, Client, Unreachable
from nodus_cli.config import Config
from nodus_cli.kinds import VOLUME
from nodus_cli.reporting import status_text
from nodus_cli.tables import short_digest, size_text
from nodus_sdk import NodusError, PackError
from nodus_sdk import Unreachable as SdkUnreachable
from nodus_sdk.uploading import Uploaded


def _out(text: str) -> None:
    print(text, file=sys.stdout, flush=True)


def err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@contextmanager
def sdk_errors(server: str) -> Iterator[None]:
    """The SDK's errors as the CLI's: not reaching the gateway is :class:`Unreachable` (the CLI prints
    it and exits 4), every other answer an :class:`ApiError` with the server's Status."""
    try:
        yield
    except SdkUnreachable as e:
        raise Unreachable(e.server or server, e.detail, refused=e.refused) from None
    except NodusError as e:
        raise ApiError(e.status) from None


def upload_text(done: Uploaded) -> str:
    """``packed 12 files, 3.4 MiB, sha256:0123456789ab… (uploaded)``, or ``(unchanged, not sent)``."""
    state = "uploaded" if done.uploaded else "unchanged, not sent"
    files = f"packed {done.files} files, " if done.files is not None else ""
    return f"{files}{size_text(done.size_bytes)}, {short_digest(done.digest)} ({state})"


def warn_skipped(skipped: list[str]) -> None:
    for line in skipped:
        err(f"warning: left out {line}")


def push(client: Client, config: Config, name: str, directory: str) -> int:
    """Pack ``directory`` and make it the next revision of the Volume ``name``."""
    root = Path(directory)
    if not root.is_dir():
        err(f"error: {directory} is not a directory\nfix: name the folder whose content the Volume holds")
        return exiting.FAILED
    try:
        with sdk_errors(config.server):
            volume, done = client.sdk.volumes.push(name, root, namespace=config.namespace)
    except PackError as e:
        err(f"error: cannot pack {directory}: {e}")
        return exiting.FAILED
    except ApiError as e:
        err(status_text(e.status))
        return exiting.FAILED
    warn_skipped(done.skipped)
    err(f"volume: {upload_text(done)}")
    files = f", {done.files:,} files" if done.files is not None else ""
    where = f"{short_digest(done.digest)}, {size_text(done.size_bytes)}{files}"
    _out(f"volume {name}: revision {volume.status.latest} ({where})")
    return exiting.OK


def ls(client: Client, config: Config, *, output: str = "table") -> int:
    """The project's Volumes, as ``nodus get volumes`` lists them."""
    try:
        with sdk_errors(config.server):
            volumes = list(client.sdk.volumes.list(namespace=config.namespace))
    except ApiError as e:
        err(status_text(e.status))
        return exiting.FAILED
    if not volumes:
        err(f"No volumes found in {config.namespace} namespace.")
        return exiting.OK
    _out(printing.list_table(VOLUME, volumes, wide=output == "wide"))
    return exiting.OK
