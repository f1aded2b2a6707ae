"""Property: for every wire struct, encode then decode gives an equal object.

Values are generated from ``msgspec.inspect.type_info`` of each struct (not ``st.from_type``), so every
field of every type is exercised with values msgspec can carry: 64-bit ints, text, nested structs, the
``GPURequest | str`` unions, free maps and ``Any`` JSON (never a float).
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec import inspect as mi

import nodus_schema
from nodus_schema import Job, ObjectList, Sweep, WatchEvent, Wire, decode, encode

_json_scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=6)
_json = st.recursive(
    _json_scalars,
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=4), inner, max_size=2),
    max_leaves=4,
)


def strategy(t: mi.Type) -> st.SearchStrategy[Any]:
    if isinstance(t, mi.StrType):
        return st.text(max_size=8)
    if isinstance(t, mi.IntType):
        return st.integers(-(2**63), 2**63 - 1)
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.NoneType):
        return st.none()
    if isinstance(t, mi.AnyType):
        return _json
    if isinstance(t, mi.RawType):
        return _json.map(lambda v: msgspec.Raw(msgspec.json.encode(v)))
    if isinstance(t, mi.LiteralType):
        return st.sampled_from(t.values)
    if isinstance(t, mi.ListType):
        return st.lists(strategy(t.item_type), max_size=2)
    if isinstance(t, mi.DictType):
        return st.dictionaries(st.text(max_size=5), strategy(t.value_type), max_size=2)
    if isinstance(t, mi.UnionType):
        return st.one_of([strategy(m) for m in t.types])
    if isinstance(t, mi.StructType):
        required = {f.name: strategy(f.type) for f in t.fields if f.required}
        optional = {f.name: strategy(f.type) for f in t.fields if not f.required}
        cls = t.cls
        return st.fixed_dictionaries(required, optional=optional).map(lambda kw: cls(**kw))
    raise AssertionError(f"no strategy for {t!r}: add one")


def _wire_classes() -> list[type[Wire]]:
    seen: list[type[Wire]] = []
    todo: list[type[Wire]] = [Wire]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub.__module__.startswith("nodus_schema.") and sub not in seen:
                seen.append(sub)
                todo.append(sub)
    return sorted(seen, key=lambda c: (c.__module__, c.__name__))


_GENERIC = {WatchEvent, ObjectList}
TYPES: list[Any] = [c for c in _wire_classes() if c not in _GENERIC] + [
    WatchEvent[Sweep],
    WatchEvent[msgspec.Raw],
    ObjectList[Job],
]


def test_every_exported_struct_is_covered() -> None:
    exported = {
        v
        for v in vars(nodus_schema).values()
        if isinstance(v, type) and issubclass(v, Wire) and v is not Wire and v not in _GENERIC
    }
    assert exported <= set(TYPES)
    assert len(TYPES) >= 60


@pytest.mark.parametrize("typ", TYPES, ids=lambda t: getattr(t, "__name__", str(t)))
@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(data=st.data())
def test_encode_decode_round_trip(typ: Any, data: st.DataObject) -> None:
    value = data.draw(strategy(mi.type_info(typ)))
    raw = encode(value)
    assert msgspec.json.decode(raw, type=typ) == value
    d = decode(raw, typ)
    assert d.errors == []
    assert d.unknown == []
    assert d.value == value
