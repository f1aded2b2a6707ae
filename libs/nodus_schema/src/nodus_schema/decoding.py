"""Decoding that reports every problem at once, each with its wire path.

``msgspec.json.decode(..., type=T)`` stops at the first bad value. An API should instead answer with every
type error in one 422 (``spec.template.spec.inputs[2].name: Invalid value: 7: must be a string, not an
integer``) and tell the caller about fields it ignored (``spec.template.spec.comand``, did you mean
``command``?), as ``kubectl --validate=strict`` does. So :func:`decode` first parses JSON without a type,
walks the result against ``msgspec.inspect.type_info(T)`` collecting every problem, and only when there is
none decodes it typed with ``strict=True``.

That walk is slow next to msgspec (tens of µs against a few for a Sweep), and almost every body is valid.
So the typed decode goes first: when it succeeds, the walk could not have found a type error (it is never
stricter than msgspec, except for the few checks the key walk below repeats), and only the unknown fields
are left to find, which a walk over the object keys does (:class:`_KeyPlan`, built once per type). The full
walk runs only when the typed decode fails, so every error is still reported, in the same words.

Unknown fields are not errors here (msgspec ignores them, like Kubernetes' default ``fieldValidation=Warn``);
:meth:`Decoded.unknown_errors` turns them into field errors for a strict caller.

Before any of that, JSON text from outside is read without recursion (:mod:`nodus_schema.parsing`): it
must be UTF-8 and nested at most ``MAX_DEPTH`` levels, since msgspec's decoder, this walk and everything
that handles the value later recurse once per level; the same reading finds duplicate fields (which a
decoder silently resolves to the last), for callers that report them as Kubernetes does.
"""

from __future__ import annotations

import datetime
import decimal
import difflib
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar

import msgspec
from msgspec import inspect as mi

from nodus_schema.fielding import CauseType, FieldError, Path
from nodus_schema.parsing import MalformedJSON, parse_json
from nodus_schema.remembering import SPEC_MEMO_SIZE, Memo

__all__ = [
    "Decoded",
    "decode",
    "encode",
    "suggest",
    "to_builtins",
]

T = TypeVar("T")

_ENCODER = msgspec.json.Encoder()


def encode(obj: Any) -> bytes:
    """Encode a wire object (or any msgspec-encodable value) as JSON bytes."""
    return _ENCODER.encode(obj)


def to_builtins(obj: Any) -> Any:
    """A wire object as plain dicts, lists and scalars, with wire (camelCase) names and defaults left out."""
    return msgspec.to_builtins(obj)


def suggest(name: str, candidates: list[str] | tuple[str, ...]) -> str | None:
    """The known field ``name`` was most likely meant to be, or None (``comand`` → ``command``).

    A case-insensitive match wins (``maxCostUsd`` → ``maxCostUSD``); otherwise difflib's closest match.
    """
    lowered = {c.lower(): c for c in candidates}
    if name.lower() in lowered:
        return lowered[name.lower()]
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return close[0] if close else None


@dataclass(slots=True)
class Decoded(Generic[T]):
    """The outcome of :func:`decode`.

    ``value`` is the decoded object, or None when there were errors. ``errors`` holds every type problem
    (``CauseType.TYPE_INVALID``, ``REQUIRED`` for a missing required field, ``NOT_SUPPORTED`` for a value
    outside a Literal); malformed JSON is a single error at path ``""``. ``unknown`` lists the paths of
    fields the type does not know; ``suggestions`` maps such a path to the field probably meant.
    """

    value: T | None
    errors: list[FieldError] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    suggestions: dict[str, str] = field(default_factory=dict)
    raw: Any = None
    """The parsed JSON (builtins) the value was converted from; None for malformed JSON."""

    @property
    def ok(self) -> bool:
        return not self.errors

    def suggestion(self, path: str) -> str | None:
        """The field probably meant by the unknown field at ``path``, or None."""
        return self.suggestions.get(path)

    def unknown_errors(self) -> list[FieldError]:
        """The unknown fields as field errors (``CauseType.UNKNOWN``), each with its "did you mean"."""
        out: list[FieldError] = []
        for path in self.unknown:
            name = _last_segment(path)
            hint = self.suggestions.get(path)
            message = f'unknown field "{name}"' + (f'; did you mean "{hint}"?' if hint else "")
            out.append(FieldError(path, CauseType.UNKNOWN, message))
        return out


def _last_segment(path: str) -> str:
    return path.rsplit(".", 1)[-1]


# ---------------------------------------------------------------------------------------------------------
# Describing values and types in messages
# ---------------------------------------------------------------------------------------------------------


def _json_kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, Mapping):
        return "an object"
    if isinstance(v, list | tuple):
        return "an array"
    return "a number"  # the only other JSON value: a number with a fraction or an exponent


def _show(v: Any) -> str:
    """A short JSON rendering of a bad value for a message."""
    try:
        text = msgspec.json.encode(v).decode()
    except (TypeError, msgspec.EncodeError):
        text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _describe(t: mi.Type) -> str:
    if isinstance(t, mi.StrType):
        return "a string"
    if isinstance(t, mi.IntType):
        return "an integer"
    if isinstance(t, mi.BoolType):
        return "a boolean"
    if isinstance(t, mi.NoneType):
        return "null"
    if isinstance(t, mi.StructType | mi.DictType | mi.TypedDictType | mi.DataclassType):
        return "an object"
    if isinstance(t, mi.ListType | mi.SetType | mi.FrozenSetType | mi.VarTupleType | mi.TupleType):
        return "an array"
    if isinstance(t, mi.LiteralType):
        return "one of " + ", ".join(_show(v) for v in t.values)
    if isinstance(t, mi.UnionType):
        parts = [_describe(m) for m in t.types if not isinstance(m, mi.NoneType)]
        return " or ".join(dict.fromkeys(parts))
    return "a valid value"


# ---------------------------------------------------------------------------------------------------------
# The walk
# ---------------------------------------------------------------------------------------------------------


_TYPE_INFO: dict[Any, mi.Type] = {}


def _type_info(typ: Any) -> mi.Type:
    # type_info walks the whole class tree; the wire types are few, so keep each answer.
    info = _TYPE_INFO.get(typ)
    if info is None:
        info = _TYPE_INFO[typ] = mi.type_info(typ)
    return info


class _Walker:
    def __init__(self) -> None:
        self.errors: list[FieldError] = []
        self.unknown: list[str] = []
        self.suggestions: dict[str, str] = {}

    def type_error(self, path: Path, v: Any, t: mi.Type) -> None:
        self.errors.append(
            FieldError(
                str(path),
                CauseType.TYPE_INVALID,
                f"Invalid value: {_show(v)}: must be {_describe(t)}, not {_json_kind(v)}",
            )
        )

    def walk(self, v: Any, t: mi.Type, path: Path) -> None:
        if isinstance(t, mi.AnyType | mi.RawType):
            return
        if isinstance(t, mi.UnionType):
            self.walk_union(v, t, path)
        elif isinstance(t, mi.NoneType):
            if v is not None:
                self.type_error(path, v, t)
        elif isinstance(t, mi.StrType):
            if not isinstance(v, str):
                self.type_error(path, v, t)
        elif isinstance(t, mi.BoolType):
            if not isinstance(v, bool):
                self.type_error(path, v, t)
        elif isinstance(t, mi.IntType):
            if not isinstance(v, int) or isinstance(v, bool):
                self.type_error(path, v, t)
            elif not -(2**63) <= v < 2**64:
                self.errors.append(
                    FieldError(str(path), CauseType.INVALID, f"Invalid value: {v}: integer out of range")
                )
        elif isinstance(t, mi.LiteralType):
            if v not in t.values or type(v) not in {type(x) for x in t.values}:
                supported = ", ".join(_show(x) for x in t.values)
                self.errors.append(
                    FieldError(
                        str(path),
                        CauseType.NOT_SUPPORTED,
                        f"Unsupported value: {_show(v)}: supported values: {supported}",
                    )
                )
        elif isinstance(t, mi.StructType):
            self.walk_struct(v, t, path)
        elif isinstance(t, mi.DictType):
            self.walk_dict(v, t, path)
        elif isinstance(t, mi.ListType | mi.SetType | mi.FrozenSetType | mi.VarTupleType):
            if not isinstance(v, list | tuple):
                self.type_error(path, v, t)
                return
            for i, item in enumerate(v):
                self.walk(item, t.item_type, path.index(i))
        elif isinstance(t, mi.TupleType):
            if not isinstance(v, list | tuple) or len(v) != len(t.item_types):
                self.type_error(path, v, t)
                return
            for i, (item, it) in enumerate(zip(v, t.item_types, strict=True)):
                self.walk(item, it, path.index(i))
        else:
            # A type the wire structs do not use (datetime, Decimal, ...): check it with msgspec itself.
            try:
                msgspec.convert(v, _python_type(t), strict=True)
            except (msgspec.ValidationError, TypeError) as e:
                self.errors.append(FieldError(str(path), CauseType.TYPE_INVALID, f"Invalid value: {e}"))

    def walk_union(self, v: Any, t: mi.UnionType, path: Path) -> None:
        # msgspec allows at most one member per JSON kind, so the JSON kind picks the member to check.
        for member in t.types:
            if _accepts_kind(member, v):
                self.walk(v, member, path)
                return
        self.type_error(path, v, t)

    def walk_struct(self, v: Any, t: mi.StructType, path: Path) -> None:
        if not isinstance(v, Mapping):
            self.type_error(path, v, t)
            return
        fields = {f.encode_name: f for f in t.fields}
        for key, item in v.items():
            if not isinstance(key, str):
                self.type_error(path, key, mi.StrType())
                continue
            f = fields.get(key)
            if f is None:
                if t.tag_field is not None and key == t.tag_field:
                    if item != t.tag:
                        self.errors.append(
                            FieldError(
                                str(path.child(key)),
                                CauseType.NOT_SUPPORTED,
                                f"Unsupported value: {_show(item)}: supported values: {_show(t.tag)}",
                            )
                        )
                    continue
                child = str(path.child(key))
                self.unknown.append(child)
                hint = suggest(key, list(fields))
                if hint is not None:
                    self.suggestions[child] = hint
                continue
            self.walk(item, f.type, path.child(key))
        for f in t.fields:
            if f.required and f.encode_name not in v:
                self.errors.append(
                    FieldError(str(path.child(f.encode_name)), CauseType.REQUIRED, "Required value")
                )

    def walk_dict(self, v: Any, t: mi.DictType, path: Path) -> None:
        if not isinstance(v, Mapping):
            self.type_error(path, v, t)
            return
        for key, item in v.items():
            if not isinstance(key, str):
                # JSON object keys are always strings; a Mapping handed in directly may not be.
                self.errors.append(
                    FieldError(
                        str(path.key(str(key))),
                        CauseType.TYPE_INVALID,
                        f"Invalid value: {key!r}: keys must be strings",
                    )
                )
                continue
            self.walk(key, t.key_type, path.key(key))
            self.walk(item, t.value_type, path.key(key))


def _accepts_kind(t: mi.Type, v: Any) -> bool:
    """Whether union member ``t`` is the one msgspec would pick for the JSON kind of ``v``."""
    if v is None:
        return isinstance(t, mi.NoneType)
    if isinstance(v, bool):
        return isinstance(t, mi.BoolType) or (isinstance(t, mi.LiteralType) and v in t.values)
    if isinstance(v, int):
        return isinstance(t, mi.IntType) or (
            isinstance(t, mi.LiteralType) and any(isinstance(x, int) for x in t.values)
        )
    if isinstance(v, str):
        return isinstance(t, mi.StrType) or (
            isinstance(t, mi.LiteralType) and any(isinstance(x, str) for x in t.values)
        )
    if isinstance(v, Mapping):
        return isinstance(t, mi.StructType | mi.DictType | mi.TypedDictType | mi.DataclassType)
    if isinstance(v, list | tuple):
        return isinstance(t, mi.ListType | mi.SetType | mi.FrozenSetType | mi.VarTupleType | mi.TupleType)
    return False


def _python_type(t: mi.Type) -> Any:
    """The Python type behind an inspect type, for the rare fallback conversion."""
    cls = getattr(t, "cls", None)
    if cls is not None:
        return cls
    return _SCALARS.get(type(t), Any)


_SCALARS: dict[type[mi.Type], Any] = {
    mi.DecimalType: decimal.Decimal,
    mi.DateTimeType: datetime.datetime,
    mi.DateType: datetime.date,
    mi.TimeType: datetime.time,
    mi.TimeDeltaType: datetime.timedelta,
    mi.UUIDType: uuid.UUID,
    mi.BytesType: bytes,
}


_MSGSPEC_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")


def _msgspec_error(e: msgspec.ValidationError) -> FieldError:
    """A ValidationError from convert as a FieldError, with ``$.spec.inputs[2]`` turned into a field path."""
    text = str(e)
    m = _MSGSPEC_PATH.search(text)
    path = ""
    if m is not None:
        path = m["path"].removeprefix(".")
        text = text[: m.start()]
    return FieldError(path, CauseType.TYPE_INVALID, f"Invalid value: {text}")


def decode(
    raw: bytes | str | Mapping[str, Any], typ: type[T], *, json_source: bytes | None = None
) -> Decoded[T]:
    """Decode JSON (bytes or str) or already-parsed builtins into ``typ``, reporting every problem.

    ``json_source``, with builtins: the JSON they were decoded from, unchanged (a server that parsed a
    request body already): it is decoded as it is, rather than the builtins encoded again and checked for
    values JSON does not have. See :class:`Decoded`. Never raises for bad input.
    """
    data: Any
    source: bytes | str | bytearray | memoryview
    plan = _key_plan(typ)
    if isinstance(raw, bytes | bytearray | memoryview | str):
        source = raw
        try:
            data = parse_json(raw.encode() if isinstance(raw, str) else bytes(raw)).value
        except (MalformedJSON, UnicodeEncodeError) as e:
            return Decoded(None, [FieldError("", CauseType.TYPE_INVALID, f"malformed JSON: {e}")])
    elif json_source is not None:
        data, source = raw, json_source
    else:
        data = raw
        try:
            # Through JSON rather than msgspec.convert, so that msgspec.Raw fields (WatchEvent[Raw]) work.
            source = _ENCODER.encode(raw)
        except (TypeError, ValueError, msgspec.EncodeError) as e:
            # ValueError: an integer past Python's 4,300-digit str() limit (YAML's 0x... can make one).
            return Decoded(None, [FieldError("", CauseType.TYPE_INVALID, f"not JSON data: {e}")])
        # Builtins that are not JSON's own (a date or an int key from YAML, a tuple) turn into something
        # else through JSON, which msgspec would take where the walk refuses them: the full walk judges.
        if plan is not _SLOW and msgspec.json.decode(source) != data:
            plan = _SLOW
    if plan is not _SLOW:
        # The fast path: a valid body needs no error walk, only the search for unknown fields.
        try:
            value = msgspec.json.decode(source, type=typ, strict=True)
        except msgspec.ValidationError:
            pass  # the full walk below reports it, with every other problem
        else:
            keys = _KeyWalker()
            try:
                keys.walk(data, plan, None)
            except _NeedsFullWalk:
                pass  # a value msgspec took but the walk refuses (an integer out of range)
            else:
                return Decoded(value, [], keys.unknown, keys.suggestions, data)
    walker = _Walker()
    walker.walk(data, _type_info(typ), Path())
    result: Decoded[T] = Decoded(None, walker.errors, walker.unknown, walker.suggestions, data)
    if result.errors:
        return result
    try:
        result.value = msgspec.json.decode(source, type=typ, strict=True)
    except msgspec.ValidationError as e:
        # The walk checks what the wire types use; anything it let through is caught here.
        result.errors.append(_msgspec_error(e))
    return result


# ---------------------------------------------------------------------------------------------------------
# The fast path: unknown fields of a value msgspec already accepted
# ---------------------------------------------------------------------------------------------------------


class _NeedsFullWalk(Exception):
    """The key walk met a value the full walk would refuse: run the full walk for the errors."""


class _Slow:
    """The plan of a type whose every value goes through the full walk (see :func:`_plan_of`)."""


_SLOW: Any = _Slow()
"""A type the key walk cannot vouch for: a dict with non-string keys or an array-like struct (the full
walk is stricter than msgspec there), or a scalar the full walk checks with msgspec.convert."""
_INT: Any = "int"
"""An integer: the full walk refuses values outside int64/uint64, which msgspec decodes."""

_INT64_MIN, _UINT64_END = -(2**63), 2**64


class _StructPlan:
    """A struct's fields by wire name, each with the plan of its value (None: nothing to look at)."""

    __slots__ = ("fields", "names", "plans", "tag_field")

    def __init__(self) -> None:
        self.fields: frozenset[str] = frozenset()
        self.names: list[str] = []
        self.plans: dict[str, Any] = {}
        self.tag_field: str | None = None


class _ListPlan:
    __slots__ = ("item",)

    def __init__(self, item: Any) -> None:
        self.item = item


class _TuplePlan:
    __slots__ = ("items",)

    def __init__(self, items: list[Any]) -> None:
        self.items = items


class _DictPlan:
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class _UnionPlan:
    """The members in order, each with its plan: the JSON kind of a value picks the member (walk_union)."""

    __slots__ = ("members",)

    def __init__(self, members: list[tuple[mi.Type, Any]]) -> None:
        self.members = members


_KEY_PLANS: dict[Any, Any] = {}
# Scalars msgspec decodes exactly as strictly as the full walk checks them.
_PLAIN: Final = (mi.StrType, mi.BoolType, mi.NoneType, mi.LiteralType, mi.AnyType, mi.RawType, mi.FloatType)


def _key_plan(typ: Any) -> Any:
    plan = _KEY_PLANS.get(typ, _MISSING)
    if plan is _MISSING:
        plan = _KEY_PLANS[typ] = _plan_of(_type_info(typ), {})
    return plan


_MISSING: Any = object()


def _plan_of(t: mi.Type, structs: dict[Any, _StructPlan]) -> Any:
    """What the key walk does with a value of type ``t``: None (nothing), _INT, _SLOW or a plan object."""
    if isinstance(t, _PLAIN):
        return None
    if isinstance(t, mi.IntType):
        return _INT
    if isinstance(t, mi.StructType):
        if t.array_like:
            return _SLOW
        plan = structs.get(t.cls)
        if plan is not None:
            return plan  # a recursive type: its plan is being filled in further up
        plan = structs[t.cls] = _StructPlan()
        plan.tag_field = t.tag_field
        plan.names = [f.encode_name for f in t.fields]
        plan.fields = frozenset(plan.names)
        for f in t.fields:
            sub = _plan_of(f.type, structs)
            if sub is _SLOW:
                return _SLOW
            if sub is not None:
                plan.plans[f.encode_name] = sub
        return plan
    if isinstance(t, mi.ListType | mi.SetType | mi.FrozenSetType | mi.VarTupleType):
        item = _plan_of(t.item_type, structs)
        return item if item is _SLOW else (None if item is None else _ListPlan(item))
    if isinstance(t, mi.TupleType):
        items = [_plan_of(it, structs) for it in t.item_types]
        if _SLOW in items:
            return _SLOW
        return None if all(i is None for i in items) else _TuplePlan(items)
    if isinstance(t, mi.DictType):
        if not isinstance(t.key_type, mi.StrType | mi.AnyType):
            return _SLOW
        value = _plan_of(t.value_type, structs)
        return value if value is _SLOW else (None if value is None else _DictPlan(value))
    if isinstance(t, mi.UnionType):
        members = [(m, _plan_of(m, structs)) for m in t.types]
        if any(p is _SLOW for _, p in members):
            return _SLOW
        return None if all(p is None for _, p in members) else _UnionPlan(members)
    return _SLOW


class _KeyWalker:
    """The unknown fields (and their suggestions) of a value msgspec decoded, found by walking its keys.

    Paths are built only for an unknown field: a walk carries ``(parent, segment)`` pairs instead."""

    __slots__ = ("suggestions", "unknown")

    def __init__(self) -> None:
        self.unknown: list[str] = []
        self.suggestions: dict[str, str] = {}

    def walk(self, v: Any, plan: Any, path: Any) -> None:
        cls = type(plan)
        if cls is _StructPlan:
            self.walk_struct(v, plan, path)
        elif plan is _INT:
            if type(v) is int and not _INT64_MIN <= v < _UINT64_END:
                raise _NeedsFullWalk
        elif cls is _ListPlan:
            item = plan.item
            for i, x in enumerate(v):
                self.walk(x, item, (path, i))
        elif cls is _DictPlan:
            value = plan.value
            for k, x in v.items():
                self.walk(x, value, (path, (k,)))
        elif cls is _UnionPlan:
            for member, sub in plan.members:
                if _accepts_kind(member, v):
                    if sub is not None:
                        self.walk(v, sub, path)
                    return
        elif cls is _TuplePlan:
            for i, (x, sub) in enumerate(zip(v, plan.items, strict=True)):
                if sub is not None:
                    self.walk(x, sub, (path, i))

    def walk_struct(self, v: Any, plan: _StructPlan, path: Any) -> None:
        fields, plans = plan.fields, plan.plans
        for key, item in v.items():
            if key in fields:
                sub = plans.get(key)
                if sub is not None:
                    if path is None and key == "spec" and type(item) is dict:
                        self.walk_spec(item, sub)
                    else:
                        self.walk(item, sub, (path, key))
            elif key != plan.tag_field:
                child = _render((path, key))
                self.unknown.append(child)
                hint = suggest(key, plan.names)
                if hint is not None:
                    self.suggestions[child] = hint

    def walk_spec(self, v: dict[str, Any], plan: Any) -> None:
        """The top-level ``spec``, whose findings are remembered per distinct spec: it is most of a body's
        keys, and the same spec comes back often (see nodus_schema.remembering). Encoding it to look it
        up costs a fraction of walking it (~2 µs against ~8 µs for examples/sweep.yaml)."""
        try:
            key = (id(plan), _memo_encoder.encode(v))
        except (TypeError, msgspec.EncodeError):  # not JSON's own values: no key, walk it as any value
            self.walk(v, plan, (None, "spec"))
            return

        def walked() -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
            inner = _KeyWalker()
            inner.walk(v, plan, (None, "spec"))  # _NeedsFullWalk propagates: nothing is remembered
            return tuple(inner.unknown), tuple(inner.suggestions.items())

        found = _spec_memo.get(key, walked)
        self.unknown.extend(found[0])
        self.suggestions.update(found[1])


_spec_memo: Memo[tuple[int, bytes], tuple[tuple[str, ...], tuple[tuple[str, str], ...]]] = Memo(
    SPEC_MEMO_SIZE
)
_memo_encoder: Final = msgspec.json.Encoder()


def _render(path: Any) -> str:
    """``(((None, "spec"), "inputs"), 2)`` → ``spec.inputs[2]``; a 1-tuple segment is a map key: ``[k]``."""
    segments: list[Any] = []
    while path is not None:
        path, segment = path
        segments.append(segment)
    out = Path()
    for segment in reversed(segments):
        if isinstance(segment, int):
            out = out.index(segment)
        elif isinstance(segment, tuple):
            out = out.key(segment[0])
        else:
            out = out.child(segment)
    return str(out)
