"""Secret values for one attempt: env variables with ``valueFrom.secretKeyRef`` and ``spec.secrets`` mounts.

Values travel only from the ``secrets`` bucket to the program: the StartAttempt carries references (the
scheduler never reads a value), the agent reads the Secret itself, hands the values to the program as
env variables or as files (``/nodus/secrets/<name>/<key>``, mode 0400), and gives the runner the list of
values so the log shipper can mask them. Nothing here logs a value, and no error message quotes one.
"""

from __future__ import annotations

import base64
import binascii
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from nodus_kit.errors import NotFound
from nodus_schema.configs import Secret
from nodus_schema.jobs import SecretMount
from nodus_schema.messages import StartAttempt

FIX = "Create the Secret in the Job's project (kubectl apply / nodus apply), or fix the reference in the Job."


class SecretError(Exception):
    """A reference that cannot be resolved: the customer's to fix (the attempt fails as an Error)."""


class SecretReader(Protocol):
    async def get(self, namespace: str | None, name: str) -> Secret: ...


@dataclass
class Resolved:
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, dict[str, bytes]] = field(default_factory=dict)
    """Secret name -> key -> value, for the mounts."""

    def values(self) -> list[str]:
        """Every value (as text) the program was given, longest first: what log lines must not show."""
        out = set(self.env.values())
        for keys in self.files.values():
            out.update(v.decode("utf-8", errors="replace") for v in keys.values())
        return sorted((v for v in out if len(v) >= 4), key=len, reverse=True)


async def resolve(reader: SecretReader, msg: StartAttempt) -> Resolved:
    """The values ``msg`` refers to; SecretError naming the Secret and key (never the value)."""
    cache: dict[str, Secret] = {}
    resolved = Resolved()
    for var in msg.env:
        ref = var.value_from.secret_key_ref if var.value_from else None
        if ref is None or not var.name:
            continue
        if not ref.name or not ref.key:
            raise SecretError(f"env {var.name}: valueFrom.secretKeyRef needs both name and key")
        secret = await _secret(reader, msg.namespace, ref.name, cache)
        resolved.env[var.name] = _value(secret, ref.key, f"env {var.name}").decode("utf-8", errors="replace")
    for mount in msg.secrets:
        name = mount.name if isinstance(mount, SecretMount) else str(mount)
        if not name:
            continue
        secret = await _secret(reader, msg.namespace, name, cache)
        _check_version(secret, mount)
        resolved.files[name] = {key: _value(secret, key, f"secret {name}") for key in secret.data}
    return resolved


def write_files(resolved: Resolved, root: Path) -> dict[str, Path]:
    """The mounted Secrets as files under ``root/<name>/<key>`` (0400, the directory 0500)."""
    out: dict[str, Path] = {}
    for name, keys in resolved.files.items():
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for key, value in keys.items():
            path = folder / key
            # O_EXCL-free rewrite: a replacement attempt on the same node writes the same values again.
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400)
            with os.fdopen(fd, "wb") as f:
                f.write(value)
            path.chmod(0o400)
        folder.chmod(0o500)
        out[name] = folder
    return out


async def _secret(reader: SecretReader, namespace: str, name: str, cache: dict[str, Secret]) -> Secret:
    if name not in cache:
        try:
            cache[name] = await reader.get(namespace, name)
        except NotFound:
            raise SecretError(f"Secret {namespace}/{name} does not exist. {FIX}") from None
    return cache[name]


def _value(secret: Secret, key: str, where: str) -> bytes:
    name = secret.metadata.name
    if key not in secret.data:
        keys = ", ".join(sorted(secret.data)) or "none"
        raise SecretError(f"{where}: Secret {name} has no key {key!r} (its keys: {keys}). {FIX}")
    try:
        return base64.b64decode(secret.data[key], validate=True)
    except (binascii.Error, ValueError):
        raise SecretError(f"{where}: Secret {name} key {key!r} is not valid base64 (not shown)") from None


def _check_version(secret: Secret, mount: SecretMount | str) -> None:
    if not isinstance(mount, SecretMount) or mount.version is None:
        return
    have = secret.metadata.generation
    if have != mount.version:
        raise SecretError(
            f"Secret {secret.metadata.name} is at version {have}, the Job pins version {mount.version}; "
            "only the latest version is kept: update the pin (spec.secrets[].version) or leave it unset"
        )
