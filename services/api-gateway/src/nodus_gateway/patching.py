"""Patches on plain JSON data: JSON merge patch (RFC 7386) and JSON patch (RFC 6902). Pure functions.

The gateway applies a patch to the stored object's JSON (its wire form) and admits the result like a PUT.
Errors say which of the two went wrong, as Kubernetes tells them apart: a patch that cannot be read is
:class:`PatchDecodeError` (400 BadRequest), one that cannot be applied (a failed ``test``, a missing path)
is :class:`PatchApplyError` (422).

Both functions recurse over their values, so neither takes one nested deeper than
:data:`~nodus_schema.parsing.MAX_DEPTH` (checked without recursion), and a JSON patch never builds one:
an operation that would put a value deeper is refused. A JSON patch has at most :data:`MAX_OPERATIONS`
operations (Kubernetes' limit), and its ``copy`` operations copy at most :data:`MAX_COPIED_VALUES`
values in all: each copy can double the document, so thirty of them would take a small object past any
memory.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any, Final

from nodus_schema.parsing import MAX_DEPTH

JSON_PATCH_OPS: Final = ("add", "remove", "replace", "move", "copy", "test")
MAX_OPERATIONS: Final = 10_000
"""The most operations one JSON patch may have, as in Kubernetes' apiserver (maxJSONPatchOperations)."""
MAX_COPIED_VALUES: Final = 100_000
"""The most values (objects, arrays and scalars) the ``copy`` operations of one JSON patch may copy in
all: far more than copying whole specs needs, far less than what a chain of doubling copies reaches."""


class PatchError(Exception):
    """A patch that cannot be used."""


class PatchDecodeError(PatchError):
    """The patch document itself is malformed."""


class PatchApplyError(PatchError):
    """The patch is well formed but does not apply to this document."""


# ---------------------------------------------------------------------------------------------------------
# RFC 7386: JSON merge patch
# ---------------------------------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """``target`` with ``patch`` merged in (RFC 7386): objects merge key by key, null removes a key, and
    anything else (arrays included) replaces. Neither argument is modified. The result is no deeper
    than the deeper of the two, so a patch within MAX_DEPTH keeps a document within it."""
    if _shape(patch)[1] > MAX_DEPTH:
        raise PatchDecodeError(f"the patch is nested deeper than the limit of {MAX_DEPTH} levels")
    return _merge(target, patch)


def _merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result: dict[str, Any] = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value)
    return result


def _shape(value: Any) -> tuple[int, int]:
    """How many values ``value`` holds (itself included) and how deep its arrays and objects nest (a
    scalar 0, ``[]`` 1, ``[[1]]`` 2); iterative, so any depth is safe to measure."""
    count, deepest = 0, 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        count += 1
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        stack.extend((child, depth) for child in children)
    return count, deepest


# ---------------------------------------------------------------------------------------------------------
# RFC 6902: JSON patch, with RFC 6901 JSON pointers
# ---------------------------------------------------------------------------------------------------------


def json_patch(doc: Any, operations: Any) -> Any:
    """``doc`` with the ``operations`` applied in order (RFC 6902); ``doc`` is not modified. All or
    nothing: a failing operation (a ``test`` included) raises and nothing is applied."""
    if not isinstance(operations, list):
        raise PatchDecodeError("a JSON patch must be an array of operations")
    if len(operations) > MAX_OPERATIONS:
        raise PatchDecodeError(
            f"the allowed maximum operations in a JSON patch is {MAX_OPERATIONS}, got {len(operations)}"
        )
    if _shape(operations)[1] > MAX_DEPTH:
        raise PatchDecodeError(f"the patch is nested deeper than the limit of {MAX_DEPTH} levels")
    result = copy.deepcopy(doc)
    budget = _CopyBudget()
    for i, op in enumerate(operations):
        result = _apply(result, _operation(i, op), budget)
    return result


class _CopyBudget:
    """What the ``copy`` operations of one patch may still copy (MAX_COPIED_VALUES in all)."""

    __slots__ = ("left",)

    def __init__(self) -> None:
        self.left = MAX_COPIED_VALUES

    def spend(self, count: int) -> None:
        self.left -= count
        if self.left < 0:
            raise PatchApplyError(
                f"the copy operations of this patch copy more than {MAX_COPIED_VALUES} values in all"
            )


def _operation(i: int, op: Any) -> dict[str, Any]:
    """Check one operation's shape before anything is applied to the document."""
    if not isinstance(op, Mapping):
        raise PatchDecodeError(f"operation {i} is not an object")
    name = op.get("op")
    if name not in JSON_PATCH_OPS:
        raise PatchDecodeError(
            f"operation {i}: unknown op {name!r}; JSON patch ops are {', '.join(JSON_PATCH_OPS)}"
        )
    required = ["path"]
    if name in ("add", "replace", "test"):
        required.append("value")
    if name in ("move", "copy"):
        required.append("from")
    for field in required:
        if field not in op:
            raise PatchDecodeError(f'operation {i} ({name}): "{field}" is missing')
        if field != "value" and not isinstance(op[field], str):
            raise PatchDecodeError(f'operation {i} ({name}): "{field}" must be a string (a JSON pointer)')
    return dict(op)


def _apply(doc: Any, op: dict[str, Any], budget: _CopyBudget) -> Any:
    name, path = op["op"], op["path"]
    if name == "add":
        return _add(doc, _pointer(path), copy.deepcopy(op["value"]))
    if name == "remove":
        return _remove(doc, _pointer(path))[0]
    if name == "replace":
        doc, _ = _remove(doc, _pointer(path))
        return _add(doc, _pointer(path), copy.deepcopy(op["value"]))
    if name == "test":
        if not _json_equal(_get(doc, _pointer(path)), op["value"]):
            raise PatchApplyError(f'test failed: the value at "{path}" is not {_short(op["value"])}')
        return doc
    source = _pointer(op["from"])
    if name == "move":
        if _is_prefix(source, _pointer(path)) and source != _pointer(path):
            raise PatchApplyError(f'cannot move "{op["from"]}" into its own child "{path}"')
        doc, value = _remove(doc, source)
        return _add(doc, _pointer(path), value)
    value = _get(doc, source)  # copy: measured (iteratively) before deepcopy recurses over it
    count, depth = _shape(value)
    budget.spend(count)
    tokens = _pointer(path)
    _check_depth(tokens, depth)
    return _add(doc, tokens, copy.deepcopy(value))


def _check_depth(tokens: list[str], depth: int) -> None:
    """A value ``depth`` deep put at ``tokens`` sits inside one array or object per token."""
    if len(tokens) + depth > MAX_DEPTH:
        raise PatchApplyError(
            f'a value at "{_render(tokens)}" would nest the object deeper than the limit of {MAX_DEPTH} '
            "levels"
        )


def _pointer(text: str) -> list[str]:
    """RFC 6901: "" is the whole document; "/a/b~1c/~0d" is ["a", "b/c", "~d"]."""
    if text == "":
        return []
    if not text.startswith("/"):
        raise PatchDecodeError(f'"{text}" is not a JSON pointer: it must be empty or start with "/"')
    return [part.replace("~1", "/").replace("~0", "~") for part in text[1:].split("/")]


def _render(tokens: list[str]) -> str:
    return "".join("/" + t.replace("~", "~0").replace("/", "~1") for t in tokens)


def _is_prefix(prefix: list[str], tokens: list[str]) -> bool:
    return tokens[: len(prefix)] == prefix


def _index(container: list[Any], token: str, tokens: list[str], *, adding: bool) -> int:
    """An array index: digits without a leading zero, up to len (for add) or len - 1."""
    if adding and token == "-":
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise PatchApplyError(f'"{token}" in "{_render(tokens)}" is not an array index')
    i = int(token)
    if i > len(container) or (i == len(container) and not adding):
        raise PatchApplyError(f'index {i} in "{_render(tokens)}" is out of range')
    return i


def _get(doc: Any, tokens: list[str]) -> Any:
    current = doc
    for n, token in enumerate(tokens):
        if isinstance(current, dict):
            if token not in current:
                raise PatchApplyError(f'"{_render(tokens[: n + 1])}" does not exist')
            current = current[token]
        elif isinstance(current, list):
            current = current[_index(current, token, tokens[: n + 1], adding=False)]
        else:
            raise PatchApplyError(f'"{_render(tokens[:n])}" is not an object or array')
    return current


def _add(doc: Any, tokens: list[str], value: Any) -> Any:
    _check_depth(tokens, _shape(value)[1])
    if not tokens:
        return value  # "add" at the root replaces the document
    parent = _get(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, tokens, adding=True), value)
    else:
        raise PatchApplyError(f'"{_render(tokens[:-1])}" is not an object or array')
    return doc


def _remove(doc: Any, tokens: list[str]) -> tuple[Any, Any]:
    """The document without the value at ``tokens``, and that value."""
    if not tokens:
        return None, doc
    parent = _get(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchApplyError(f'"{_render(tokens)}" does not exist')
        return doc, parent.pop(last)
    if isinstance(parent, list):
        return doc, parent.pop(_index(parent, last, tokens, adding=False))
    raise PatchApplyError(f'"{_render(tokens[:-1])}" is not an object or array')


def _json_equal(a: Any, b: Any) -> bool:
    """JSON equality: 1 and 1.0 are equal, but true is not 1 (Python's == says it is)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
