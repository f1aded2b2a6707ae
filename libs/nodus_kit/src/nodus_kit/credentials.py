"""A process's bus credential: its nkey seed, the public key it proves it holds, and the inbox prefix its
permissions allow it (ADR-0026).

A leaf under :mod:`nodus_kit.connecting` (which reads a seed to connect) and :mod:`nodus_kit.permitting`
(which makes seeds and writes the permissions of their public keys): neither imports the other for it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Final

INBOX_PREFIX: Final = "_INBOX_"
SEED_SUFFIX: Final = ".nk"
"""A seed's file is ``<user>.nk``."""


def _nkeys() -> Any:
    # Imported on first use, not with the module: nkeys loads libsodium (~0.2 s), which a process
    # without a seed (the CLI against an open bus, most tests) never needs.
    import nkeys  # type: ignore[import-untyped]  # nats-py's own dependency for nkey auth; no stubs

    return nkeys


def inbox_prefix(public_key: str) -> str:
    """The inbox prefix of the credential with this public key: its replies, and only its."""
    return INBOX_PREFIX + public_key


def new_seed() -> bytes:
    nkeys = _nkeys()
    return bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))


def public_key(seed: bytes) -> str:
    """The public key (``U...``) of a user seed (``SU...``); ValueError for anything else."""
    nkeys = _nkeys()
    try:
        kp = nkeys.from_seed(bytearray(seed.strip()))
    except Exception as e:
        raise ValueError(f"not an nkey seed: {type(e).__name__}") from None
    try:
        key = kp.public_key.decode()
    finally:
        kp.wipe()
    if not key.startswith("U"):
        raise ValueError("not a user nkey seed (a user seed starts with SU)")
    return str(key)


def seed_public_key(path: str | Path) -> str:
    """The public key of the seed in the file ``path`` (what a process proves it holds)."""
    try:
        return public_key(Path(path).read_bytes())
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def inbox_of_seed(path: str | Path) -> str:
    """The inbox prefix a process with the seed file ``path`` must use (its permissions allow no other)."""
    return inbox_prefix(seed_public_key(path))
