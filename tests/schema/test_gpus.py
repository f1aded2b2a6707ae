"""The GPU request string form ("H100:1") and its normalisation."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodus_schema import Resources, SweepMatrix
from nodus_schema.gpus import (
    GPURequest,
    as_gpu_request,
    format_gpu,
    format_topology,
    has_string_form,
    parse_gpu,
    parse_topology,
)


@pytest.mark.parametrize(
    ("text", "req"),
    [
        ("H100:1", GPURequest(count=1, type=["H100"])),
        ("H100", GPURequest(count=1, type=["H100"])),
        ("H100:8", GPURequest(count=8, type=["H100"])),
        ("H100,A100:2", GPURequest(count=2, type=["H100", "A100"])),
        ("h100-sxm-80g:4", GPURequest(count=4, type=["h100-sxm-80g"])),
        ("L40S", GPURequest(count=1, type=["L40S"])),
    ],
)
def test_parse_gpu(text: str, req: GPURequest) -> None:
    assert parse_gpu(text) == req


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty GPU request"),
        ("H100 :1", "spaces"),
        ("H100:", "TYPE"),
        (":2", "TYPE"),
        ("H100:two", "TYPE"),
        ("H100:-1", "TYPE"),
        ("H100,,A100", "TYPE"),
        ("H100:0", "at least 1"),
    ],
)
def test_parse_gpu_rejects(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        parse_gpu(text)


def test_format_gpu() -> None:
    assert format_gpu(GPURequest(count=1, type=["H100"])) == "H100:1"
    assert format_gpu(GPURequest(type=["H100"])) == "H100"
    assert format_gpu(GPURequest(count=2, type=["H100", "A100"])) == "H100,A100:2"


@pytest.mark.parametrize(
    "req",
    [
        GPURequest(count=1, type=["H100"], exact=True),
        GPURequest(count=1, type=["H100"], interconnect="NVLink"),
        GPURequest(count=1, type=["H100"], min_memory="80Gi"),
        GPURequest(count=1),
    ],
)
def test_requests_without_string_form(req: GPURequest) -> None:
    assert not has_string_form(req)
    with pytest.raises(ValueError, match="no string form"):
        format_gpu(req)


def test_exact_false_still_has_a_string_form() -> None:
    assert format_gpu(GPURequest(count=4, type=["A100"], exact=False)) == "A100:4"


_types = st.lists(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,11}", fullmatch=True), min_size=1, max_size=4)


@given(_types, st.integers(min_value=1, max_value=64))
def test_round_trip(types: list[str], count: int) -> None:
    req = GPURequest(count=count, type=types)
    assert parse_gpu(format_gpu(req)) == req
    text = format_gpu(req)
    assert format_gpu(parse_gpu(text)) == text


def test_as_gpu_request() -> None:
    req = GPURequest(count=8, type=["H100"], interconnect="NVLink")
    assert as_gpu_request(req) is req
    assert as_gpu_request("H100:8") == GPURequest(count=8, type=["H100"])
    with pytest.raises(ValueError, match="TYPE"):
        as_gpu_request("H100:x")


def test_fields_accept_both_forms_on_the_wire() -> None:
    r = msgspec.json.decode(b'{"gpu": "H100:1"}', type=Resources)
    assert r.gpu == "H100:1"
    r = msgspec.json.decode(b'{"gpu": {"count": 2, "type": ["A100"]}}', type=Resources)
    assert r.gpu == GPURequest(count=2, type=["A100"])
    m = msgspec.json.decode(
        b'{"gpu": ["H100:1", {"count": 8, "type": ["H100"], "exact": true}]}', type=SweepMatrix
    )
    assert [as_gpu_request(g) for g in m.gpu] == [
        GPURequest(count=1, type=["H100"]),
        GPURequest(count=8, type=["H100"], exact=True),
    ]
    assert msgspec.json.encode(Resources(gpu="H100:1")) == b'{"gpu":"H100:1"}'


def test_topology() -> None:
    assert format_topology(2, 8) == "2x8"
    assert parse_topology("2x8") == (2, 8)
    with pytest.raises(ValueError, match="NODESxGPUS"):
        parse_topology("2*8")
