"""A run's own identity for the Nodus API: its Job's ServiceAccount token, URL and CA (ADR-0037).

When the gateway's grant for an Attempt carries a :class:`~nodus_schema.noding.ServiceAccountGrant`, the
program gets

* ``NODUS_TOKEN`` (the token), ``NODUS_URL`` (the gateway as runs reach it), ``NODUS_CA`` (a path to the CA
  bundle, when the gateway's certificate needs one) and ``NODUS_SA_DIR`` (the folder below);
* the files ``token`` and ``ca.crt`` (mode 0400, the folder 0500) in the attempt directory's
  ``serviceaccount/``: bound read-only at ``/nodus/serviceaccount`` in a container, or where
  ``NODUS_SA_DIR`` says for a local process (the runtimes set the paths, as they do ``NODUS_SRC``).

So ``nodus`` and the SDK work in the program with nothing configured: they read NODUS_URL, NODUS_TOKEN,
NODUS_CA and the project from NODUS_NAMESPACE. The token goes into the run's resolved secret values, so
the log shipper and the finish report's log tail mask it as they mask Secrets; the files are deleted when
the attempt ends (:func:`remove`). The token is never logged here, and no error quotes it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from nodus_agent.attemptdir import AttemptDir
from nodus_agent.granting import Grants, NotBound
from nodus_agent.secrets import Resolved
from nodus_schema.messages import StartAttempt
from nodus_schema.noding import ServiceAccountGrant

PROGRAM_PATH: Final = "/nodus/serviceaccount"
"""Where a container sees the folder."""
TOKEN_FILE: Final = "token"
CA_FILE: Final = "ca.crt"
TOKEN_VARIABLE: Final = "NODUS_TOKEN"
ACCOUNT_PREFIX: Final = "ServiceAccount/"


class IdentityError(Exception):
    """The run's ServiceAccount cannot be given to it: ``reason`` Error (deleted since the Job was
    admitted: the customer's to fix) or Lost (the run is no longer this node's)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


@dataclass(frozen=True)
class Identity:
    """What the runtime shows the program besides the token (which travels with the secret values)."""

    folder: Path
    """The attempt's ``serviceaccount/`` on this host."""
    url: str
    has_ca: bool

    def env(self, folder: str) -> dict[str, str]:
        """The variables, with the folder where the program sees it (``folder``)."""
        env = {"NODUS_URL": self.url, "NODUS_SA_DIR": folder}
        if self.has_ca:
            env["NODUS_CA"] = f"{folder}/{CA_FILE}"
        return env


async def provide(
    grants: Grants | None, msg: StartAttempt, adir: AttemptDir, secrets: Resolved
) -> Identity | None:
    """The run's identity, its files written and its token added to ``secrets`` (the program's env, and
    what logs are masked with); None when its Job names no ServiceAccount (or the agent asks no gateway:
    tests of the runner alone). IdentityError when the gateway could not grant the one it names."""
    if grants is None:
        return None
    try:
        granted = await grants.of(msg)  # kept since the StartAttempt was checked: no second request
    except NotBound as e:
        raise IdentityError("Lost", f"the run is no longer this node's: {e}") from None
    grant = granted.service_account
    if grant is None:
        missing = [m.removeprefix(ACCOUNT_PREFIX) for m in granted.missing if m.startswith(ACCOUNT_PREFIX)]
        if missing:
            raise IdentityError(
                "Error",
                f"ServiceAccount {missing[0]} could not be given to the run: it does not exist in project "
                f"{msg.namespace} (deleted after the Job was admitted?), or the gateway has no URL for runs "
                "(NODUS_PUBLIC_URL). Create the ServiceAccount again (kind ServiceAccount, spec.role) or ask "
                "the operator.",
            )
        return None
    remember(grant, secrets)
    return write(grant, adir)


def remember(grant: ServiceAccountGrant, secrets: Resolved) -> None:
    """The token among the run's secret values: in its env as NODUS_TOKEN, and masked in its logs."""
    secrets.env[TOKEN_VARIABLE] = grant.token


async def for_adoption(grants: Grants | None, msg: StartAttempt, secrets: Resolved) -> None:
    """A re-adopted run's token among its secret values again, so its log stays masked (best effort: the
    grant of a run that has meanwhile finished is refused, and there is nothing left to mask)."""
    if grants is None:
        return
    with contextlib.suppress(Exception):
        granted = await grants.of(msg)
        if granted.service_account is not None:
            remember(granted.service_account, secrets)


def write(grant: ServiceAccountGrant, adir: AttemptDir) -> Identity:
    """The token and CA files (0400, the folder 0500), written again from scratch for a relaunch."""
    folder = adir.serviceaccount
    remove(adir)
    folder.mkdir(parents=True)
    _write(folder / TOKEN_FILE, grant.token.encode())
    if grant.ca_pem:
        _write(folder / CA_FILE, grant.ca_pem.encode())
    folder.chmod(0o500)
    return Identity(folder=folder, url=grant.url, has_ca=bool(grant.ca_pem))


def remove(adir: AttemptDir) -> None:
    """The folder gone (when the attempt ends): the token must not outlive the run on the node's disk."""
    folder = adir.serviceaccount
    if not folder.exists():
        return
    with contextlib.suppress(OSError):
        folder.chmod(0o700)  # a 0500 folder's files cannot be unlinked otherwise
    shutil.rmtree(folder, ignore_errors=True)


def _write(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
