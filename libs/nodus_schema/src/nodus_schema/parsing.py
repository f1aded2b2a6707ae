"""JSON text from outside, read without recursion before anything recursive sees it: it must be UTF-8,
nested at most :data:`MAX_DEPTH` levels (msgspec's decoder, the decoding walk, patches and
``copy.deepcopy`` recurse once per level), and :func:`parse_json` can list the fields it repeats within
one object (which a parser silently collapses to the last). The gateway's body reader (``bodies.py``) and
:func:`nodus_schema.decoding.decode` read through it. Pure: no I/O.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from nodus_schema.fielding import Path

__all__ = ["MAX_DEPTH", "MalformedJSON", "ParsedJSON", "parse_json"]

_ENCODER = msgspec.json.Encoder()


MAX_DEPTH: Final = 100
"""The deepest nesting of arrays and objects a JSON (or YAML) body may have: ``[[1]]`` is 2 levels.

Kubernetes' decoders stop at 10,000 levels (Go's encoding/json). Python code recurses once per level
(msgspec's decoder and encoder, the decoding walk, patches, ``copy.deepcopy``), a few frames each, and the
interpreter stops at 1,000 frames: 10,000 would turn every deep body into a crash. The deepest Nodus
object, a full Sweep with its status (tests/schema/data/sweep-full.json), is 12 levels; 100 is eight
times that, and keeps the recursion a body causes well inside the interpreter's limit."""


class MalformedJSON(ValueError):
    """JSON text that is not parsed: not UTF-8, nested deeper than :data:`MAX_DEPTH`, or not JSON."""


@dataclass(frozen=True, slots=True)
class ParsedJSON:
    """The outcome of :func:`parse_json`: the value, and the paths of fields its text repeats in an
    object (``spec.paused``, ``[1].path``), each once, in the order they first repeat; the value holds
    the last of each."""

    value: Any
    duplicates: tuple[str, ...] = ()


def parse_json(data: bytes, *, find_duplicates: bool = False) -> ParsedJSON:
    """``data`` parsed, once it is known to be UTF-8 and at most :data:`MAX_DEPTH` deep (both checked
    without recursion, before msgspec's recursive decoder sees it); raises :class:`MalformedJSON`.

    ``find_duplicates``: also list the fields repeated within one object. A body without any costs a
    re-encoding of the value and two counts (see :func:`_may_repeat`); the paths are looked for only
    when there are some."""
    _check_utf8(data)
    structure = _structure(data)
    if _too_deep(structure):
        raise MalformedJSON(f"it is nested deeper than the limit of {MAX_DEPTH} levels of arrays and objects")
    try:
        value = msgspec.json.decode(data)
    except msgspec.DecodeError as e:
        raise MalformedJSON(_explain(data, e)) from None
    except RecursionError:  # only if the caller's own stack is nearly full: the depth was checked
        raise MalformedJSON(f"it is nested deeper than this server can read ({MAX_DEPTH} levels)") from None
    if find_duplicates and _may_repeat(data, structure, value):
        return ParsedJSON(value, tuple(dict.fromkeys(_duplicate_paths(data))))  # each path once
    return ParsedJSON(value)


def _check_utf8(data: bytes) -> None:
    if data.isascii():  # nearly every body, and ~20x cheaper than decoding
        return
    try:
        data.decode()
    except UnicodeDecodeError as e:
        raise MalformedJSON(f"it is not UTF-8: byte {e.start} (0x{data[e.start]:02x}) {e.reason}") from None


# The bytes that give JSON text its structure; everything else is deleted before looking at it.
_NOT_STRUCTURE: Final = bytes(b for b in range(256) if b not in b'[]{}":')
# What each byte adds to the nesting level (a list: map(_STEP.__getitem__, ...) runs in C).
_STEP: Final = [1 if b in b"[{" else -1 if b in b"]}" else 0 for b in range(256)]


def _structure(data: bytes) -> bytes:
    """The brackets, quotes and colons of ``data``, after removing escaped backslashes and then escaped
    quotes (an escaped quote is no string boundary; runs of backslashes pair up from the left, as JSON
    reads them). Every other escape leaves its backslash alone, which the deletion then drops."""
    if b"\\" in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    return data.translate(None, _NOT_STRUCTURE)


def _too_deep(structure: bytes) -> bool:
    """Whether brackets outside strings nest deeper than MAX_DEPTH. Iterative, and mostly C."""
    if structure.count(b"[") + structure.count(b"{") <= MAX_DEPTH:
        return False  # no more containers than the limit (strings' brackets counted too): cannot be deeper
    # Quotes alternate between opening and closing a string, so removing two adjacent ones (an empty
    # string, or the end of one string and the start of the next) changes nothing outside strings.
    parts = structure.replace(b'""', b"").split(b'"')
    outside = b"".join(parts[::2])  # what lies between a closing quote and the next opening one
    return max(itertools.accumulate(map(_STEP.__getitem__, outside)), default=0) > MAX_DEPTH


_LONE_SURROGATE: Final = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)


def _explain(data: bytes, e: msgspec.DecodeError) -> str:
    """msgspec's reason, or a plainer one for three mistakes it words confusingly ("Input data was
    truncated" for a lone surrogate, "invalid character (byte 0)" for a byte order mark)."""
    if not data.strip():
        return "it is empty"
    if data.startswith(b"\xef\xbb\xbf"):
        return "it starts with a byte order mark (EF BB BF): send UTF-8 without one"
    lone = _LONE_SURROGATE.search(data)
    if lone is not None:
        escape = lone.group().decode()
        return (
            f"the escape {escape} at byte {lone.start()} is half of a UTF-16 surrogate pair, not a character"
        )
    return str(e)


def _may_repeat(data: bytes, structure: bytes, value: Any) -> bool:
    """Whether the text of ``value`` may repeat a field in an object; False only when it certainly
    does not.

    Outside strings, a colon ends each field's name, so the colons of ``data`` are its fields plus the
    colons inside its strings; the colons of the value re-encoded are the fields it kept plus the
    colons of the strings it kept. A repeated field is dropped (key, value and their colons), so the
    two counts differ exactly when a field was repeated, as long as no escape in ``data`` spells a colon
    (``\\u003a``): then the exact search runs anyway."""
    if b":" not in structure:
        return False  # no object has a field
    if b"\\" in data and b"\\u" in data:
        return True
    try:
        encoded = _ENCODER.encode(value)
    except (TypeError, msgspec.EncodeError):  # pragma: no cover - decoded JSON always encodes
        return True
    return structure.count(b":") != encoded.count(b":")


# Strings, brackets and commas: enough to tell a field's name from a value in text already known valid.
_TOKEN: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{},]', re.DOTALL)


class _Open:
    """An array or object being read: its path, and its fields' names so far (None for an array)."""

    __slots__ = ("expect_name", "index", "name", "names", "path")

    def __init__(self, path: Path, names: set[str] | None) -> None:
        self.path, self.names = path, names
        self.index, self.name, self.expect_name = 0, "", names is not None

    def child(self) -> Path:
        return self.path.index(self.index) if self.names is None else self.path.child(self.name)


def _duplicate_paths(data: bytes) -> list[str]:
    """The paths of repeated fields in valid JSON text, in document order, found with a stack (no
    recursion). Every object key is a child segment, as Kubernetes names them (``metadata.labels.a``)."""
    found: list[str] = []
    stack: list[_Open] = []
    for match in _TOKEN.finditer(data):
        token = match.group()
        first = token[0]
        if first == 0x22:  # '"'
            top = stack[-1] if stack else None
            if top is not None and top.expect_name:
                _named(top, msgspec.json.decode(token), found)
        elif first in b"[{":
            path = stack[-1].child() if stack else Path()
            stack.append(_Open(path, set() if first == 0x7B else None))
        elif first in b"]}":
            stack.pop()
        else:  # a comma: the next field's name, or the next item
            top = stack[-1]
            if top.names is None:
                top.index += 1
            else:
                top.expect_name = True
    return found


def _named(top: _Open, name: str, found: list[str]) -> None:
    assert top.names is not None
    if name in top.names:
        found.append(str(top.path.child(name)))
    top.names.add(name)
    top.name, top.expect_name = name, False
