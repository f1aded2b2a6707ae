"""JSON text from outside (nodus_schema.parsing.parse_json): UTF-8 with the offending byte named, the
nesting limit checked without recursion before msgspec sees the text, lone surrogates refused, and the
paths of duplicate fields, exact against an independent model (hypothesis), including the texts that
could fool the cheap no-duplicates check (colons in strings, escapes)."""

from __future__ import annotations

import json
import sys
from pathlib import Path as FilePath
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodus_schema import decode
from nodus_schema.fielding import Path
from nodus_schema.jobs import Job
from nodus_schema.parsing import MAX_DEPTH, MalformedJSON, parse_json

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DOCS = FilePath(__file__).resolve().parents[2] / "docs" / "errors" / "BadRequest.md"


def arrays(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def objects(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


def mixed(depth: int) -> bytes:
    opens = b"".join(b'[{"k": ' if i % 2 else b"[" for i in range(depth // 2))
    return opens + b"0" + b"".join(b"]}" if i % 2 else b"]" for i in reversed(range(depth // 2)))


def too_deep(data: bytes) -> bool:
    try:
        parse_json(data)
    except MalformedJSON as e:
        return f"limit of {MAX_DEPTH} levels" in str(e)
    return False


# -- nesting --------------------------------------------------------------------------------------------


def test_the_limit_is_exact_for_arrays_objects_and_both() -> None:
    assert MAX_DEPTH == 100
    for make in (arrays, objects):
        assert not too_deep(make(MAX_DEPTH))
        assert too_deep(make(MAX_DEPTH + 1))
    assert not too_deep(b'{"spec": ' + arrays(MAX_DEPTH - 1) + b"}")
    assert too_deep(b'{"spec": ' + arrays(MAX_DEPTH) + b"}")
    assert too_deep(mixed(4 * MAX_DEPTH))
    assert too_deep(b"[" * 50_000)  # not even valid: still refused for its depth, not read


def test_the_check_runs_before_msgspec_and_without_recursion(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("msgspec's decoder was given a body past the limit")

    monkeypatch.setattr(msgspec.json, "decode", refuse)
    deep = arrays(1 << 19)  # 1 MiB: the largest body the gateway reads

    def nearly_out_of_stack(frames: int) -> None:
        # With ~20 frames left any recursion over the body's 500,000 levels would raise RecursionError.
        if frames > 20:
            nearly_out_of_stack(frames - 1)
        else:
            with pytest.raises(MalformedJSON, match="nested deeper"):
                parse_json(deep)

    nearly_out_of_stack(sys.getrecursionlimit() - len(_stack()) - 10)


def _stack() -> list[Any]:
    frame, frames = sys._getframe(), []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back  # type: ignore[assignment]
    return frames


def test_brackets_in_strings_neither_count_nor_hide_depth() -> None:
    assert not too_deep(b'{"a": "' + b"[{" * 5000 + b'", "b": "' + b"]}" * 5000 + b'"}')
    hidden = b'["]",' * (MAX_DEPTH + 1) + b"1" + b"]" * (MAX_DEPTH + 1)  # strings that would close them
    assert too_deep(hidden)
    # An escaped quote does not end a string; an escaped backslash before a quote does.
    assert not too_deep(b'["\\"' + b"[" * 500 + b'"]')
    assert too_deep(b'["\\\\",' + b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1) + b"]")
    assert not too_deep(b'["\\\\\\"' + b"[" * 500 + b'"]')


def test_a_decode_of_json_bytes_is_an_error_not_a_crash() -> None:
    for data in (arrays(50_000), b'{"metadata": ' + objects(5_000) + b"}"):
        decoded = decode(data, Job)
        assert decoded.value is None and "nested deeper" in decoded.errors[0].message
    # An integer Python cannot write as JSON (YAML's 0x... forms make them): an error, not a ValueError.
    decoded = decode({"spec": {"parallelism": 1 << 20_000}}, Job)
    assert decoded.value is None and decoded.errors[0].field == ""


# -- bytes and characters -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "where"),
    [
        (b'{"a": "\xff"}', "byte 7 (0xff)"),
        (b'{"name": "caf\xe9"}', "byte 13 (0xe9)"),
        (b'{"a": "\xed\xa0\x80"}', "byte 7 (0xed)"),  # a surrogate written as UTF-8 (CESU)
        (b'{"a": "\xc0\xaf"}', "byte 7 (0xc0)"),  # an overlong "/"
        (b'{"a": "\xe2\x82"}', "byte 7 (0xe2)"),  # cut short
    ],
)
def test_invalid_utf8_names_the_byte(data: bytes, where: str) -> None:
    with pytest.raises(MalformedJSON) as raised:
        parse_json(data)
    assert f"not UTF-8: {where}" in str(raised.value)


def test_lone_surrogates_are_refused_and_pairs_kept() -> None:
    for text in (b'"\\ud800"', b'"\\udfff"', b'"\\ud800x"', b'"\\udc00\\ud800"', b'{"\\ud83d": 1}'):
        with pytest.raises(MalformedJSON, match="half of a UTF-16 surrogate pair"):
            parse_json(text)
    assert parse_json(b'"\\ud83d\\ude00"').value == "\U0001f600"
    assert parse_json(b'"\\\\ud800"').value == "\\ud800"  # an escaped backslash, then text


def test_nul_and_other_escapes_are_characters() -> None:
    assert parse_json(b'{"a\\u0000": "b\\u0000"}').value == {"a\x00": "b\x00"}
    assert parse_json('{"é": "€"}'.encode()).value == {"é": "€"}


def test_empty_bom_and_raw_control_bytes_are_named() -> None:
    for data, said in ((b"", "empty"), (b"  \n", "empty"), (b"\xef\xbb\xbf{}", "byte order mark")):
        with pytest.raises(MalformedJSON, match=said):
            parse_json(data)
    with pytest.raises(MalformedJSON):
        parse_json(b'{"a": "\x00"}')


# -- duplicate fields -----------------------------------------------------------------------------------


def duplicates(data: bytes) -> tuple[str, ...]:
    return parse_json(data, find_duplicates=True).duplicates


def test_duplicates_at_any_depth_with_kubernetes_paths() -> None:
    assert duplicates(b'{"a": 1, "a": 2}') == ("a",)
    text = b'{"spec": {"template": {"spec": {"x": [{"y": 1}, {"y": 1, "y": 2}], "x": 0}}}}'
    assert duplicates(text) == ("spec.template.spec.x[1].y", "spec.template.spec.x")
    assert duplicates(b'[{"op": "add", "path": "/a", "path": "/b"}]') == ("[0].path",)
    assert duplicates(b'{"metadata": {"labels": {"a.b/c": "1", "a.b/c": "2"}}}') == ("metadata.labels.a.b/c",)
    # The same name in two objects, or as a value, is no duplicate.
    assert duplicates(b'{"a": {"a": "a"}, "b": {"a": 1}, "c": [{"a": 1}, {"a": 2}]}') == ()


def test_duplicates_the_cheap_check_could_miss() -> None:
    assert duplicates(b'{"a": ":", "a": 1}') == ("a",)  # the dropped value had a colon
    assert duplicates(b'{"k": 1, "\\u006b": 2}') == ("k",)  # the same name, escaped
    assert duplicates(b'{"a\\u003a": 1, "a:": 2, "b": 3}') == ("a:",)  # an escaped colon
    assert duplicates(b'{"a" : 1 , "a" : 2}') == ("a",)
    assert duplicates(b'{"q\\"": 1, "q\\"": 2}') == ('q"',)
    assert duplicates(b'{"a": "x\\\\", "a": "y"}') == ("a",)
    assert duplicates(b'{"a\\u003a": 1, "b": 2}') == ()


def test_duplicates_are_not_looked_for_unless_asked() -> None:
    assert parse_json(b'{"a": 1, "a": 2}').duplicates == ()


# A JSON object as the list of its fields, so that a name may repeat.
_names = st.sampled_from(["a", "b", ":", 'q"', "\\", "a:b", "é", "\u0000", "[", "}"])
_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.sampled_from(["", ":", "::", '"', "x:y", "]"])
)


def _objects(children: Any) -> Any:
    return st.lists(st.tuples(_names, children), max_size=4).map(lambda fields: ("object", fields))


_values = st.recursive(
    _scalars, lambda children: st.one_of(st.lists(children, max_size=3), _objects(children))
)


def _text(value: Any, ascii_only: bool, spaced: bool) -> str:
    sep = " " if spaced else ""
    if isinstance(value, tuple):
        fields = (
            f"{json.dumps(k, ensure_ascii=ascii_only)}{sep}:{sep}{_text(v, ascii_only, spaced)}"
            for k, v in value[1]
        )
        return "{" + f",{sep}".join(fields) + "}"
    if isinstance(value, list):
        return "[" + f",{sep}".join(_text(v, ascii_only, spaced) for v in value) + "]"
    return json.dumps(value, ensure_ascii=ascii_only)


def _expected(value: Any, path: Path, found: list[str]) -> None:
    if isinstance(value, tuple):
        seen: set[str] = set()
        for name, child in value[1]:
            if name in seen:
                found.append(str(path.child(name)))
            seen.add(name)
            _expected(child, path.child(name), found)
    elif isinstance(value, list):
        for i, child in enumerate(value):
            _expected(child, path.index(i), found)


@PROPERTY
@given(_values, st.booleans(), st.booleans())
def test_duplicates_match_a_model_of_the_text(value: Any, ascii_only: bool, spaced: bool) -> None:
    text = _text(value, ascii_only, spaced).encode()
    found: list[str] = []
    _expected(value, Path(), found)
    assert duplicates(text) == tuple(dict.fromkeys(found)), text  # each path once


@PROPERTY
@given(_values, st.integers(MAX_DEPTH - 8, MAX_DEPTH + 2))
def test_the_depth_verdict_matches_the_value(value: Any, wrap: int) -> None:
    text = b"[" * wrap + _text(value, True, False).encode() + b"]" * wrap

    def depth(v: Any) -> int:
        children = [c for _, c in v[1]] if isinstance(v, tuple) else v if isinstance(v, list) else None
        return 0 if children is None else 1 + max(map(depth, children), default=0)

    assert too_deep(text) == (wrap + depth(value) > MAX_DEPTH)


def test_the_limit_is_documented() -> None:
    text = DOCS.read_text()
    assert f"{MAX_DEPTH} levels" in text and "duplicate field" in text and "UTF-8" in text
