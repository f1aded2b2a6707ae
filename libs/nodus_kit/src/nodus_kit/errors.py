"""The kit's small error hierarchy, and how each maps to a retry (as kopf maps handler errors).

Controllers look only at :attr:`NodusError.retryable`: a retryable error requeues the key with backoff,
a permanent one is logged and dropped until the object changes again. The gateway maps each class to
its metav1.Status reason and HTTP code.
"""

from __future__ import annotations


class NodusError(Exception):
    """Base of every error the kit raises on purpose."""

    reason = "InternalError"
    retryable = True


class NotFound(NodusError):
    reason = "NotFound"
    retryable = False


class AlreadyExists(NodusError):
    reason = "AlreadyExists"
    retryable = False


class Conflict(NodusError):
    """A compare-and-set lost the race: re-read and try again (a 409 for users)."""

    reason = "Conflict"
    retryable = True


class Expired(NodusError):
    """A resourceVersion older than what the store keeps (410 Gone): list again, then watch."""

    reason = "Expired"
    retryable = False


class Timeout(NodusError):
    reason = "Timeout"
    retryable = True


class Unavailable(NodusError):
    """The bus or a peer service is not answering right now."""

    reason = "ServiceUnavailable"
    retryable = True


class Invalid(NodusError):
    reason = "Invalid"
    retryable = False


class PermanentError(NodusError):
    """A handler's way to say: retrying cannot help (the message goes to the dead-letter subject)."""

    retryable = False


class TemporaryError(NodusError):
    """A handler's way to say: try again after ``delay`` seconds."""

    def __init__(self, message: str = "", delay: float = 1.0) -> None:
        super().__init__(message)
        self.delay = delay
