"""``nodus workspace push/pull/ls``: the files of a Workspace, a project's persistent home (ADR-0036).

- ``push NAME PATH [--to DIR]``: a file goes to ``DIR/<its name>``, a folder's files (after its
  ``.gitignore``/``.nodusignore``, as a pack takes them) under ``DIR/``; the Workspace is created first
  when missing.
- ``pull NAME PATH [--to LOCAL]``: the file ``PATH`` into the folder ``LOCAL`` (default ``.``), or the
  folder ``PATH`` with everything under it; ``""`` or ``/`` is the whole home.
- ``ls NAME [PATH]``: the files under a folder of the home.
"""

from __future__ import annotations

import sys
from pathlib import Path

from nodus_cli import exiting
from nodus_cli.client import ApiError, Client
from nodus_cli.config import Config
from nodus_cli.kinds import WORKSPACE
from nodus_cli.reporting import status_text
from nodus_cli.tables import NONE, age, size_text, table
from nodus_cli.volumes import err, sdk_errors, warn_skipped
from nodus_sdk import PackError
from nodus_sdk.uploading import Transfer


def _out(text: str) -> None:
    print(text, file=sys.stdout, flush=True)


def _where(name: str, path: str) -> str:
    clean = path.strip("/")
    return f"{WORKSPACE.ref(name)}:/{clean}"


def _moved(done: Transfer) -> str:
    return f"{len(done.paths)} file(s), {size_text(done.bytes)}"


def push(client: Client, config: Config, name: str, local: str, *, to: str = "") -> int:
    source = Path(local)
    if not source.exists():
        err(f"error: {local} does not exist\nfix: name a local file or folder to push")
        return exiting.FAILED
    try:
        with sdk_errors(config.server):
            done = client.sdk.workspaces.push(name, source, to=to, namespace=config.namespace)
    except (PackError, ValueError) as e:
        err(f"error: cannot push {local}: {e}")
        return exiting.FAILED
    except ApiError as e:
        err(status_text(e.status))
        return exiting.FAILED
    warn_skipped(done.skipped)
    _out(f"pushed {_moved(done)} to {_where(name, to)}")
    return exiting.OK


def pull(client: Client, config: Config, name: str, path: str, *, to: str = ".") -> int:
    try:
        with sdk_errors(config.server):
            done = client.sdk.workspaces.pull(name, path, Path(to), namespace=config.namespace)
    except ValueError as e:
        err(f"error: refusing to pull {path!r}: {e}\nfix: fix or delete that file in the Workspace")
        return exiting.FAILED
    except OSError as e:
        err(f"error: cannot write into {to}: {e.strerror or e}\nfix: pull into a folder you can write")
        return exiting.FAILED
    except ApiError as e:
        err(status_text(e.status))
        return exiting.FAILED
    _out(f"pulled {_moved(done)} from {_where(name, path)} into {to}")
    return exiting.OK


def ls(client: Client, config: Config, name: str, path: str = "") -> int:
    try:
        with sdk_errors(config.server):
            files = list(client.sdk.workspaces.ls(name, path, namespace=config.namespace))
    except ValueError as e:
        err(f"error: {e}\nfix: name a folder inside the home, e.g. data/train")
        return exiting.FAILED
    except ApiError as e:
        err(status_text(e.status))
        return exiting.FAILED
    if not files:
        err(f"No files under {_where(name, path)}.")
        return exiting.OK
    rows = [
        [f.path, size_text(f.size_bytes), age(f.last_modified) if f.last_modified else NONE] for f in files
    ]
    _out(table(("PATH", "SIZE", "AGE"), rows))
    return exiting.OK
