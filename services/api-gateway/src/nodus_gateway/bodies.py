"""Reading a request body: the size limit, and JSON or YAML by Content-Type, as Kubernetes accepts both.

Every route that reads a body reads it here, so the limits on what a body may be hold for all of them
(creates, updates, every patch, DeleteOptions, Secrets, tokens, projects, credit grants), each refused
with a 400 BadRequest before anything recursive runs on it:

* UTF-8 only: the message names the byte offset of the first byte that is not;
* at most :data:`~nodus_schema.parsing.MAX_DEPTH` levels of arrays and objects (mappings and sequences
  in YAML), checked without recursion;
* no lone UTF-16 surrogate (``"\\ud800"``): it is no character, and no UTF-8 encoder downstream (the
  store, the bus) could write it;
* YAML: one document, no anchors or aliases.

A field repeated within one object is treated as Kubernetes' apiserver treats it, by the request's
``fieldValidation``: ``Strict`` (the gateway's default, see admitting.field_validation) refuses the body
with ``strict decoding error: duplicate field "spec.paused"``, ``Warn`` accepts it (the last value wins)
with a ``Warning: 299 - "duplicate field ..."`` header, ``Ignore`` accepts it silently. In YAML the
wording is Kubernetes' YAML decoder's: ``line 5: key "name" already set in map``. A route without the
parameter (tokens, projects, grants) is Strict.

The request's parameter and its warnings travel in a context variable that the request-context middleware
(requesting.py) sets for each request and reads when the response starts, so no route has to pass them.
"""

from __future__ import annotations

import re
from contextvars import ContextVar, Token
from typing import Any, Final

import yaml
from starlette.datastructures import QueryParams
from starlette.requests import Request

from nodus_gateway.admitting import FieldValidation, field_validation
from nodus_gateway.responding import ApiError
from nodus_schema import CauseType, FieldError
from nodus_schema.fielding import Path
from nodus_schema.parsing import MAX_DEPTH, MalformedJSON, parse_json

JSON_TYPES: Final = ("application/json",)
YAML_TYPES: Final = ("application/yaml", "application/x-yaml", "text/yaml")

# A body of 1 MiB can repeat a field 100,000 times, and a name can be most of it: an answer names the
# first few, each cut short, and counts the rest (Kubernetes also caps the warnings it sends).
_MAX_NAMED: Final = 50
_MAX_NAME_CHARS: Final = 200
_DUPLICATE_FIX: Final = (
    "Write each field once per object (only the last one would be used), or send fieldValidation=Warn "
    "to have the body accepted with a warning."
)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB ({n} bytes)"


def too_large(limit: int) -> ApiError:
    return ApiError.of("RequestEntityTooLarge", f"the request body is larger than the limit of {_mib(limit)}")


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, or 413 as soon as it passes ``limit`` (without reading the rest into memory)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";", 1)[0].strip().lower()


def is_json(content_type: str) -> bool:
    """Whether a body of this type is read as JSON. No Content-Type is, which is what curl users mean."""
    return content_type in ("", *JSON_TYPES) or content_type.endswith("+json")


def parse(body: bytes, content_type: str) -> Any:
    """The body as plain data: JSON (see :func:`is_json`) or YAML, within the limits of the module's doc."""
    if is_json(content_type):
        return _parse_json(body)
    if content_type in YAML_TYPES:
        return _parse_yaml(body)
    raise ApiError.of(
        "UnsupportedMediaType",
        f'the content type "{content_type}" is not supported for this request',
        fix="Send the object with Content-Type: application/json (or application/yaml).",
    )


# ---------------------------------------------------------------------------------------------------------
# The request's fieldValidation and warnings
# ---------------------------------------------------------------------------------------------------------


class BodyContext:
    """What reading a body needs from its request (the query string, for ``fieldValidation``), and the
    warnings reading it gave, for the response's ``Warning`` headers."""

    __slots__ = ("query", "warnings")

    def __init__(self, query: bytes) -> None:
        self.query = query
        self.warnings: list[str] = []

    def validation(self) -> FieldValidation:
        """The request's ``fieldValidation``; Strict when absent, and also when not a valid value: the
        routes that take it have refused such a value before reading the body."""
        if b"fieldValidation" not in self.query:  # nearly every request: no parsing
            return FieldValidation.STRICT
        try:
            return field_validation(QueryParams(self.query).get("fieldValidation"))
        except ApiError:
            return FieldValidation.STRICT


_CONTEXT: Final[ContextVar[BodyContext | None]] = ContextVar("nodus_gateway.bodies", default=None)


def enter(query: bytes) -> tuple[BodyContext, Token[BodyContext | None]]:
    """Start a request's body context (the request-context middleware does, for every request)."""
    context = BodyContext(query)
    return context, _CONTEXT.set(context)


def leave(token: Token[BodyContext | None]) -> None:
    _CONTEXT.reset(token)


def warning_header(text: str) -> str:
    """``299 - "text"``, the text a quoted-string: quotes and backslashes escaped, anything outside
    printable ASCII (field names are the caller's) escaped too, so that it cannot split the header."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    if not (escaped.isascii() and escaped.isprintable()):
        escaped = "".join(c if " " <= c <= "~" else _escape(c) for c in escaped)
    return f'299 - "{escaped}"'


def _escape(c: str) -> str:
    return c.encode("unicode_escape").decode("ascii")


def _short(name: str) -> str:
    return name if len(name) <= _MAX_NAME_CHARS else name[: _MAX_NAME_CHARS - 3] + "..."


def _validation() -> FieldValidation:
    context = _CONTEXT.get()
    return FieldValidation.STRICT if context is None else context.validation()


def _duplicates(found: list[tuple[str, str]], validation: FieldValidation) -> None:
    """Repeated fields (path, message) by ``validation``: refused, warned about, or let through."""
    if not found or validation is FieldValidation.IGNORE:
        return
    named = found[:_MAX_NAMED]
    messages = [message for _, message in named]
    if len(found) > len(named):
        messages.append(f"and {len(found) - len(named)} more repeated fields")
    if validation is FieldValidation.WARN:
        context = _CONTEXT.get()
        if context is not None:
            context.warnings.extend(messages)
        return
    raise ApiError.of(
        "BadRequest",
        "strict decoding error: " + ", ".join(messages),
        causes=[FieldError(path, CauseType.DUPLICATE, message) for path, message in named],
        fix=_DUPLICATE_FIX,
    )


# ---------------------------------------------------------------------------------------------------------
# JSON
# ---------------------------------------------------------------------------------------------------------


def _parse_json(body: bytes) -> Any:
    validation = _validation()
    try:
        parsed = parse_json(body, find_duplicates=validation is not FieldValidation.IGNORE)
    except MalformedJSON as e:
        raise ApiError.of("BadRequest", f"the request body is not valid JSON: {e}") from None
    if parsed.duplicates:
        found = [(_short(path), f'duplicate field "{_short(path)}"') for path in parsed.duplicates]
        _duplicates(found, validation)
    return parsed.value


# ---------------------------------------------------------------------------------------------------------
# YAML
# ---------------------------------------------------------------------------------------------------------

# What PyYAML raises beyond YAMLError for text it cannot construct: an integer past Python's digit
# limit or a "\UFFFFFFFF" escape (ValueError, OverflowError), a bad !!timestamp (ValueError), ...
_YAML_ERRORS: Final = (yaml.YAMLError, ValueError, OverflowError, TypeError, RecursionError)
_SURROGATE: Final = re.compile("[\ud800-\udfff]")
# YAML's 0x.., 0b.. and sexagesimal (1:30:00) integers have no digit limit; past ~4,300 decimal digits
# Python cannot write one (the JSON encoder raises), so bigger ones are refused as a JSON body's are.
_MAX_INT_BITS: Final = 14_000


def _parse_yaml(body: bytes) -> Any:
    text = _yaml_text(body)
    try:
        found = _check_yaml_events(text)
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except _YAML_ERRORS as e:
        raise ApiError.of("BadRequest", f"the request body is not valid YAML: {e}") from None
    if len(docs) != 1:
        raise ApiError.of(
            "BadRequest", f"the request body must hold one object, not {len(docs)} YAML documents"
        )
    _check_integers(docs[0])
    _duplicates(found, _validation())
    return docs[0]


def _check_integers(doc: Any) -> None:
    """Refuse integers too long to write as JSON; iterative (the document may be MAX_DEPTH deep)."""
    stack = [doc]
    while stack:
        value = stack.pop()
        if isinstance(value, int):
            if value.bit_length() > _MAX_INT_BITS:
                raise ApiError.of(
                    "BadRequest",
                    "the request body is not valid YAML here: it holds an integer of more than 4,000 digits",
                )
        elif isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list | tuple | set | frozenset):
            stack.extend(value)


def _yaml_text(body: bytes) -> str:
    try:
        text = body.decode()
    except UnicodeDecodeError as e:
        raise ApiError.of(
            "BadRequest",
            f"the request body is not valid YAML: it is not UTF-8: byte {e.start} (0x{body[e.start]:02x}) "
            f"{e.reason}",
        ) from None
    return text.removeprefix("\ufeff")  # YAML allows a byte order mark; Kubernetes' decoder drops it


class _Node:
    """A mapping or sequence being read: its path, and its keys so far (None for a sequence)."""

    __slots__ = ("expect_key", "index", "key", "keys", "path")

    def __init__(self, path: Path, keys: set[str] | None) -> None:
        self.path, self.keys = path, keys
        self.index, self.key, self.expect_key = 0, "", keys is not None

    def child(self) -> Path:
        return self.path.index(self.index) if self.keys is None else self.path.child(self.key)

    def completed(self) -> None:
        """One of its nodes was read: a key (then its value comes), a value or an item."""
        if self.keys is None:
            self.index += 1
        elif self.expect_key:  # a complex key (a mapping or sequence as key)
            self.expect_key = False
        else:
            self.expect_key = True


def _check_yaml_events(text: str) -> list[tuple[str, str]]:
    """Walk the parser's events (PyYAML's parser is iterative; its composer is not) before anything
    builds the document: refuse aliases, nesting past MAX_DEPTH and lone surrogates; return the keys
    repeated in a mapping as (path, Kubernetes' message)."""
    found: list[tuple[str, str]] = []
    stack: list[_Node] = []
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.ScalarEvent):
            _check_scalar(event)
            top = stack[-1] if stack else None
            if top is not None and top.expect_key:
                _key(top, event, found)
            elif top is not None:
                top.completed()
        elif isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent):
            if len(stack) >= MAX_DEPTH:
                raise ApiError.of(
                    "BadRequest",
                    f"the request body is not valid YAML: it is nested deeper than the limit of "
                    f"{MAX_DEPTH} levels of mappings and sequences (line {_line(event)})",
                )
            path = stack[-1].child() if stack else Path()
            stack.append(_Node(path, set() if isinstance(event, yaml.MappingStartEvent) else None))
        elif isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
            stack.pop()
            if stack:
                stack[-1].completed()
        elif isinstance(event, yaml.AliasEvent):
            # A few hundred bytes of nested aliases (a "billion laughs") expand into gigabytes once the
            # object is re-encoded as JSON, and no manifest needs them.
            raise ApiError.of("BadRequest", "YAML anchors and aliases are not accepted in a request body")
    return found


def _check_scalar(event: yaml.ScalarEvent) -> None:
    # Only a double-quoted scalar's escapes ("\ud800") can make one: the text itself is valid UTF-8.
    if event.style == '"' and _SURROGATE.search(event.value):
        raise ApiError.of(
            "BadRequest",
            f"the request body is not valid YAML: line {_line(event)}: the string holds half "
            "of a UTF-16 surrogate pair (an escape \\uD800-\\uDFFF alone), which is not a character",
        )


def _line(event: yaml.Event) -> int:
    """The 1-based line an event starts on (the parser always marks it; 0 if it did not)."""
    mark = event.start_mark
    return 0 if mark is None else mark.line + 1


def _key(top: _Node, event: yaml.ScalarEvent, found: list[tuple[str, str]]) -> None:
    assert top.keys is not None
    key = event.value
    if key in top.keys:
        path = _short(str(top.path.child(key)))
        found.append((path, f'line {_line(event)}: key "{_short(key)}" already set in map'))
    top.keys.add(key)
    top.key, top.expect_key = key, False
