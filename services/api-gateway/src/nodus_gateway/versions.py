"""resourceVersions as the gateway issues them, and which of them it takes back.

A resourceVersion is the KV revision of an object (its bucket stream's sequence) in decimal. Clients
treat it as opaque and send back what they read: in a PUT or patch body (a compare-and-set), and as a
watch's starting point. Anything else was never issued: "abc", "1.5", " 1", "1_0" and "١" (which
Python's ``int`` would take), or a number beyond what a revision can be. Such a value is the caller's
mistake and answered as one (400 for the query parameter, 422 for the body field), never handed to the
store, where it used to fail as a 500 (an update) or a 503 "the object store did not answer" (a watch
from beyond 2**64).
"""

from __future__ import annotations

from typing import Final

MAX_RESOURCE_VERSION: Final = 2**63 - 1
"""The largest resourceVersion taken back: Kubernetes' are etcd revisions, an int64. A JetStream sequence
is a uint64 that never comes near it, and a watch, which starts after the given revision, stays in range."""


def parse_resource_version(value: str) -> int | None:
    """The revision ``value`` stands for, or None if it is not a resourceVersion this server issued
    (ASCII decimal digits, at most :data:`MAX_RESOURCE_VERSION`)."""
    if not (value.isascii() and value.isdigit()):
        return None
    revision = int(value)
    return revision if revision <= MAX_RESOURCE_VERSION else None
