"""The small checks every validation rule is made of: enums, ranges, patterns, names, durations, amounts,
quantities and paths, each appending to one :class:`~nodus_schema.fielding.ErrorList`.

Every number, duration, quantity and amount check has an upper bound (``ranges.py``): by default Kubernetes'
int32 for integers, :data:`~nodus_schema.quantities.MAX_DURATION` for durations and
:data:`~nodus_schema.quantities.MAX_USD` for amounts, so nothing admitted can overflow a timer, a
datetime or a book downstream. A value that does not even parse (``"99999999999999h"`` is past what a
timedelta holds) is a field error like any other, never an exception.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Sequence
from datetime import timedelta
from decimal import Decimal
from typing import Final
from urllib.parse import urlsplit

from nodus_schema.fielding import CauseType, ErrorList, Path
from nodus_schema.quantities import (
    MAX_DURATION,
    MAX_INT32,
    MAX_USD,
    parse_bytes,
    parse_cpu_millis,
    parse_duration,
    parse_usd,
)
from nodus_schema.ranges import MAX_BYTES, MAX_CPU_MILLIS, MAX_DURATION_TEXT, MAX_PATH_LEN, MAX_USD_TEXT

# ---------------------------------------------------------------------------------------------------------
# Paths. Four lists, because "system path" means different things for different fields:
# ---------------------------------------------------------------------------------------------------------

PSEUDO_FS_PATHS: Final = ("/proc", "/sys", "/dev", "/run", "/var/run")
"""Kernel and runtime file systems: refused, with everything beneath them, for every path field."""
OS_PATHS: Final = (
    "/",
    "/bin",
    "/boot",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/sbin",
    "/usr",
    "/usr/bin",
    "/usr/lib",
    "/usr/lib64",
    "/usr/local",
    "/usr/sbin",
    "/var",
)
"""The image's OS trees: mounting *onto* one hides the OS, so they are refused as mount points and checkout
paths. Paths beneath them stay allowed there (``/usr/src/app`` and ``/etc/myapp`` are common)."""
NODUS_MANAGED_PATHS: Final = ("/nodus",)
"""The agent mounts /nodus/inputs, /nodus/outputs and /nodus/state; a volume may not mount at or beneath."""
READ_ONLY_PATHS: Final = ("/nodus/inputs",)
"""Inputs are mounted read-only: nothing may be restored (checkpoints) or checked out (git) there."""
COLLECTED_PATHS: Final = ("/nodus/outputs", "/nodus/state")
"""What the node agent reaches of a program's file system (``nodus_agent.preparing.to_host``): the attempt's
own folders, mounted at these two paths. Declared outputs and checkpoint paths must lie at or beneath one
of them (or, once Volumes exist, beneath a mount the Job declares): anything else the agent cannot collect,
and the run would fail only when it ends."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

# ---------------------------------------------------------------------------------------------------------
# Patterns
# ---------------------------------------------------------------------------------------------------------

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
DNS_LABEL_HINT: Final = "lower case letters, digits and '-', starting and ending with a letter or digit"

# ---------------------------------------------------------------------------------------------------------
# Enums, integers, patterns, names, lists
# ---------------------------------------------------------------------------------------------------------


def enum(errs: ErrorList, path: Path, value: str | None, allowed: Sequence[str]) -> None:
    if value is not None and value not in allowed:
        errs.not_supported(path, value, tuple(allowed))


def int_range(errs: ErrorList, path: Path, value: int | None, lo: int, hi: int = MAX_INT32) -> None:
    """``lo <= value <= hi``; ``hi`` is Kubernetes' int32 unless the field has a range of its own."""
    if value is not None and not lo <= value <= hi:
        errs.invalid(path, value, f"must be between {lo} and {hi}")


def pattern(errs: ErrorList, path: Path, value: str, regex: re.Pattern[str], hint: str) -> bool:
    if regex.fullmatch(value) is None:
        errs.invalid(path, value, f"must be {hint}")
        return False
    return True


def required(errs: ErrorList, path: Path, value: object, what: str) -> bool:
    """Report a missing (None or empty) value; True when present."""
    if value is None or value == "" or value == []:
        errs.required(path, f"Required value: {what}")
        return False
    return True


def dns_label(errs: ErrorList, path: Path, value: str | None, max_len: int = 63) -> None:
    if value is None:
        return
    if len(value) > max_len:
        errs.invalid(path, value, f"must be no more than {max_len} characters")
    pattern(errs, path, value, DNS_LABEL, f"a DNS-1123 label: {DNS_LABEL_HINT}")


def object_name(errs: ErrorList, path: Path, value: str | None) -> None:
    """A reference to another object (Secret, Volume, Connection, ...): a DNS-1123 subdomain."""
    if value is None:
        return
    if len(value) > 253:
        errs.invalid(path, value, "must be no more than 253 characters")
    pattern(errs, path, value, DNS_SUBDOMAIN, "a DNS-1123 subdomain: lower case letters, digits, '-' and '.'")


def is_object_name(value: str) -> bool:
    """Whether ``value`` is a valid name for a referenced object (a DNS-1123 subdomain)."""
    return len(value) <= 253 and DNS_SUBDOMAIN.fullmatch(value) is not None


def sha256(errs: ErrorList, path: Path, value: str | None) -> None:
    if value is not None:
        pattern(errs, path, value, _SHA256_HEX, "a SHA-256 digest: 64 lower case hex digits")


def unique(errs: ErrorList, items: Iterable[tuple[Path, str | None]]) -> None:
    """Report the second and later occurrences of a value (the first one is the one that stays)."""
    seen: set[str] = set()
    for path, value in items:
        if value is None:
            continue
        if value in seen:
            errs.duplicate(path, value)
        seen.add(value)


def unique_at(errs: ErrorList, path: Path, values: Sequence[str | None], field: str | None = None) -> None:
    """:func:`unique` for ``values[i]`` at ``path[i]`` (or ``path[i].field``); paths built only for a
    duplicate."""
    if len(values) < 2:
        return
    seen: set[str] = set()
    for i, value in enumerate(values):
        if value is None:
            continue
        if value in seen:
            at = path.index(i)
            errs.duplicate(at if field is None else at.child(field), value)
        seen.add(value)


def max_items(errs: ErrorList, path: Path, items: Sequence[object], limit: int) -> None:
    if len(items) > limit:
        errs.too_many(path, len(items), limit)


# ---------------------------------------------------------------------------------------------------------
# Durations, amounts, quantities
# ---------------------------------------------------------------------------------------------------------

_TOO_LONG_DURATION: Final = f"must be at most {MAX_DURATION_TEXT} (2^31 - 1 seconds)"


def read_duration(value: str) -> timedelta | str:
    """The duration, or why it is not one: a sentence for a field error (never an exception, even for a
    duration no timedelta can hold)."""
    try:
        d = parse_duration(value)
    except ValueError as e:
        return str(e)
    except OverflowError:
        return _TOO_LONG_DURATION
    return _TOO_LONG_DURATION if d > MAX_DURATION else d


def duration(
    errs: ErrorList,
    path: Path,
    value: str | None,
    lo: str = "0s",
    hi: str | None = None,
    *,
    positive: bool = False,
) -> timedelta | None:
    """Parse a Go duration and check it against [lo, hi] (``hi`` unset: :data:`MAX_DURATION`);
    ``positive`` refuses zero. None when absent or refused."""
    if value is None:
        return None
    d = read_duration(value)
    if isinstance(d, str):
        errs.invalid(path, value, d)
        return None
    if positive and d <= timedelta(0):
        errs.invalid(path, value, "must be greater than 0s")
        return None
    if hi is not None and not parse_duration(lo) <= d <= parse_duration(hi):
        errs.invalid(path, value, f"must be between {lo} and {hi}")
        return None
    if d < parse_duration(lo):
        errs.invalid(path, value, f"must be at least {lo}")
        return None
    return d


def usd(errs: ErrorList, path: Path, value: str | None) -> Decimal | None:
    """A USD amount: a decimal string with at most 6 places (never a JSON number) in [0, MAX_USD]."""
    if value is None:
        return None
    try:
        amount = parse_usd(value)
    except ValueError as e:
        errs.invalid(path, value, str(e))
        return None
    if amount > MAX_USD:
        errs.invalid(path, value, f"must be at most {MAX_USD_TEXT} (one billion USD)")
        return None
    return amount


def byte_quantity(errs: ErrorList, path: Path, value: str | None, hi: str | None = None) -> None:
    """A quantity of bytes above 0, at most ``hi`` (unset: :data:`~nodus_schema.ranges.MAX_BYTES`)."""
    if value is None:
        return
    try:
        n = parse_bytes(value)
    except ValueError as e:
        errs.invalid(path, value, str(e))
        return
    if n <= 0:
        errs.invalid(path, value, "must be greater than 0")
    elif hi is not None and n > parse_bytes(hi):
        errs.invalid(path, value, f"must be at most {hi}")
    elif n > MAX_BYTES:
        errs.invalid(path, value, f"must be at most {MAX_BYTES} bytes (an int64; 8Ei less one byte)")


def cpu(errs: ErrorList, path: Path, value: str | None) -> None:
    if value is None:
        return
    try:
        millis = parse_cpu_millis(value)
    except ValueError as e:
        errs.invalid(path, value, str(e))
        return
    if millis <= 0:
        errs.invalid(path, value, "must be greater than 0")
    elif millis > MAX_CPU_MILLIS:
        errs.invalid(path, value, f"must be at most {MAX_CPU_MILLIS}m")


# ---------------------------------------------------------------------------------------------------------
# Paths
# ---------------------------------------------------------------------------------------------------------


def under(path: str, roots: Iterable[str]) -> str | None:
    """The first root that ``path`` equals or lies beneath."""
    for root in roots:
        if path == root or path.startswith(root.rstrip("/") + "/"):
            return root
    return None


def path_text(errs: ErrorList, path: Path, value: str) -> bool:
    """No control characters (NUL included) and at most :data:`MAX_PATH_LEN` characters."""
    if len(value) > MAX_PATH_LEN:
        errs.add(path, CauseType.TOO_LONG, f"Too long: must have at most {MAX_PATH_LEN} characters")
        return False
    bad = _CONTROL.search(value)
    if bad is not None:
        errs.invalid(
            path, value, f"must not contain control characters (found {bad.group()!r} at {bad.start()})"
        )
        return False
    return True


def abs_path(errs: ErrorList, path: Path, value: str | None) -> bool:
    """An absolute, normalised path outside the kernel file systems; True when usable for more checks."""
    if value is None or not path_text(errs, path, value):
        return False
    if not value.startswith("/"):
        errs.invalid(path, value, "must be an absolute path (starting with '/')")
        return False
    if ".." in value.split("/"):
        errs.invalid(path, value, "must not contain '..' segments")
        return False
    # normpath keeps a leading "//" (POSIX allows it a meaning), so refuse it explicitly: "//proc" is /proc.
    if value.startswith("//") or (posixpath.normpath(value) != value and value != "/"):
        errs.invalid(
            path, value, f"must be a normalised path, such as {posixpath.normpath('/' + value.lstrip('/'))!r}"
        )
        return False
    root = under(value, PSEUDO_FS_PATHS)
    if root is not None:
        errs.forbidden(path, f"{value!r} is under the system path {root!r}; choose a path of your own")
        return False
    return True


def target_path(errs: ErrorList, path: Path, value: str | None, *, extra: Sequence[str]) -> None:
    """A path Nodus writes to (a mount point, a checkout): not onto an OS tree, not under ``extra``
    (managed or read-only paths)."""
    if not abs_path(errs, path, value):
        return
    assert value is not None
    if value in OS_PATHS:
        errs.forbidden(path, f"{value!r} is a system path and would hide the image's files; choose another")
        return
    root = under(value, extra)
    if root is not None:
        errs.forbidden(path, f"{value!r} is under {root!r}, which Nodus manages; choose another path")


def collected_path(errs: ErrorList, path: Path, value: str | None, what: str) -> None:
    """A path the node agent collects (an output, a checkpoint path): at or beneath
    :data:`COLLECTED_PATHS`, exactly as the agent maps them."""
    if not abs_path(errs, path, value):
        return
    assert value is not None
    if under(value, COLLECTED_PATHS) is not None:
        return
    inputs = under(value, READ_ONLY_PATHS)
    if inputs is not None:
        errs.forbidden(
            path, f"{value!r} is under {inputs!r}, which is mounted read-only; choose another path"
        )
        return
    base = posixpath.basename(value.rstrip("/")) or "data"
    errs.forbidden(
        path,
        f"the node agent can only collect {what} under {' or '.join(COLLECTED_PATHS)} (it reaches nothing "
        f"else of the container's file system); write it there, e.g. '/nodus/outputs/{base}'",
    )


def https_url(errs: ErrorList, path: Path, value: str) -> None:
    try:
        parts = urlsplit(value)
        parts.hostname  # noqa: B018 - reading it parses the host
    except ValueError as e:
        errs.invalid(path, value, f"is not a URL: {e}")
        return
    if parts.scheme != "https" or not parts.hostname:
        errs.invalid(path, value, "must be an https:// URL with a host")
    elif parts.username is not None or parts.password is not None:
        errs.forbidden(path, "credentials in a URL end up in logs; put them in a Secret instead")
