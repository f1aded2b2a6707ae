"""GPURequest and its string form.

GPURequest asks for accelerators. A family (``H100``) matches any of its variants and never another family.
Wherever the API takes a GPU request (``resources.gpu``, ``matrix.gpu``) it takes either the object or the
short string form, typed ``GPURequest | str``; :func:`as_gpu_request` normalises.

String grammar (whitespace is not allowed)::

    gpu    = types [ ":" count ]
    types  = type *( "," type )
    type   = ALNUM *( ALNUM / "." / "_" / "-" )     ; an accelerator id or family from the catalog
    count  = 1*DIGIT                                ; GPUs per node, a positive integer; default 1

So ``"H100"`` is one H100-family GPU, ``"H100:8"`` eight, ``"H100,A100:2"`` two of either family (the
count applies to every listed type). ``exact``, ``interconnect`` and ``minMemory`` have no string form:
requests that set them are only written as objects.
"""

from __future__ import annotations

import functools
import re

import msgspec

from nodus_schema.wire import Wire

__all__ = [
    "GPURequest",
    "as_gpu_request",
    "format_gpu",
    "format_topology",
    "has_string_form",
    "parse_gpu",
    "parse_gpu_parts",
    "parse_topology",
]


class GPURequest(Wire):
    """GPURequest asks for accelerators. A family (H100) matches any of its variants, never another family."""

    count: int | None = None
    """Count is the GPUs per node: 1, 2, 4 or 8."""
    exact: bool | None = None
    """Exact pins the exact variant instead of matching the family."""
    interconnect: str | None = None
    """Interconnect is Any or NVLink."""
    min_memory: str | None = None
    """MinMemory is the per-GPU memory floor (a quantity, e.g. "80Gi")."""
    type: list[str] = msgspec.field(default_factory=list)
    """Type lists 1-8 accelerator ids or families from the catalog."""


_TYPE = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_GPU_RE = re.compile(rf"(?P<types>{_TYPE}(?:,{_TYPE})*)(?::(?P<count>[0-9]+))?")


def parse_gpu(text: str) -> GPURequest:
    """Parse the string form (``"H100:1"``, ``"H100"``, ``"H100,A100:2"``); see the module docstring."""
    count, types = parse_gpu_parts(text)
    return GPURequest(count=count, type=list(types))


# A GPU string is short; longer ones are parsed every time rather than kept (a body may hold megabytes).
_CACHED_LEN = 64


def parse_gpu_parts(text: str) -> tuple[int, tuple[str, ...]]:
    """The count and the types of the string form, as :func:`parse_gpu` reads them (raises ValueError).

    Kept per string: validation and defaulting read the same few strings over and over. The answer is a
    tuple, so that no caller can change what the next one gets (a GPURequest could be changed)."""
    if not isinstance(text, str):
        raise ValueError(f"a GPU request string must be a string, not {type(text).__name__}")
    if len(text) <= _CACHED_LEN:
        return _cached_parts(text)
    return _parse_parts(text)


def _parse_parts(text: str) -> tuple[int, tuple[str, ...]]:
    m = _GPU_RE.fullmatch(text)
    if m is None:
        if not text:
            raise ValueError('empty GPU request: write a type and a count, such as "H100:1"')
        if " " in text:
            raise ValueError(f'GPU request {text!r} must not contain spaces; write it like "H100,A100:2"')
        raise ValueError(
            f"GPU request {text!r} is not of the form TYPE[,TYPE...][:COUNT], "
            'such as "H100:1" or "H100,A100:2"'
        )
    count_text = m["count"]
    count = int(count_text) if count_text is not None else 1
    if count < 1:
        raise ValueError(f"GPU request {text!r} asks for {count} GPUs; the count must be at least 1")
    return count, tuple(m["types"].split(","))


_cached_parts = functools.lru_cache(maxsize=1024)(_parse_parts)


def has_string_form(req: GPURequest) -> bool:
    """Whether ``req`` can be written in the string form (only types and a count are set)."""
    return (
        not req.exact
        and req.interconnect is None
        and req.min_memory is None
        and bool(req.type)
        and all(re.fullmatch(_TYPE, t) for t in req.type)
        and (req.count is None or req.count >= 1)
    )


def format_gpu(req: GPURequest) -> str:
    """The string form of ``req`` (``"H100:1"``); raises ValueError if it has none (see has_string_form).

    The count is always written when set, so ``parse_gpu(format_gpu(r)) == r`` for every ``r`` with a string
    form and a count; an unset count is written without ``:COUNT`` and reads back as count 1.
    """
    if not has_string_form(req):
        raise ValueError(
            "this GPU request has no string form: exact, interconnect and minMemory can only be written "
            "as an object, and it needs at least one valid type"
        )
    types = ",".join(req.type)
    return types if req.count is None else f"{types}:{req.count}"


def as_gpu_request(value: GPURequest | str) -> GPURequest:
    """Normalise a ``GPURequest | str`` field to a GPURequest (raises ValueError for a bad string)."""
    if isinstance(value, GPURequest):
        return value
    return parse_gpu(value)


def format_topology(nodes: int, gpus_per_node: int) -> str:
    """The resolved topology of a gang (``status.topology``): ``"<nodes>x<gpusPerNode>"``, e.g. ``"2x8"``."""
    return f"{nodes}x{gpus_per_node}"


def parse_topology(text: str) -> tuple[int, int]:
    """Read ``"2x8"`` back as ``(nodes, gpus_per_node)``."""
    m = re.fullmatch(r"([1-9][0-9]*)x([1-9][0-9]*)", text)
    if m is None:
        raise ValueError(f'topology {text!r} is not of the form NODESxGPUS, such as "2x8"')
    return int(m[1]), int(m[2])
