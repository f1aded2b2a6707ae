"""Field errors: one problem with one field, in the shape of a Kubernetes StatusCause.

Validation never stops at the first problem: every rule appends to an :class:`ErrorList`, and the API
returns them all at once, each with its field path (``spec.template.spec.inputs[2].name``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class CauseType(StrEnum):
    """The ``reason`` of a metav1.StatusCause, as Kubernetes spells them."""

    NOT_FOUND = "FieldValueNotFound"
    REQUIRED = "FieldValueRequired"
    DUPLICATE = "FieldValueDuplicate"
    INVALID = "FieldValueInvalid"
    NOT_SUPPORTED = "FieldValueNotSupported"
    FORBIDDEN = "FieldValueForbidden"
    TOO_LONG = "FieldValueTooLong"
    TOO_MANY = "FieldValueTooMany"
    TYPE_INVALID = "FieldValueTypeInvalid"
    UNKNOWN = "FieldValueUnknown"


@dataclass(frozen=True, slots=True)
class FieldError:
    field: str
    reason: CauseType
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


_ROOT, _CHILD, _INDEX, _KEY = 0, 1, 2, 3


class Path:
    """A field path that renders as Kubernetes does: ``spec.inputs[2].name``, ``metadata.labels[a/b]``.

    Cheap to extend: validation builds a path for nearly every field it looks at and needs the text only
    for the few fields with an error, so a path is its parent and its last segment, and the text is put
    together only when asked for (``str(path)``, ``path.text``). A path is never changed once made (its
    attributes are private); paths compare and hash by their text.
    """

    __slots__ = ("_kind", "_parent", "_segment")

    _parent: Path | None
    _kind: int
    _segment: Any

    def __init__(self, text: str = "") -> None:
        self._parent, self._kind, self._segment = None, _ROOT, text

    # Not through __init__: a path is made per field looked at, so three attribute stores are all.
    def child(self, name: str) -> Path:
        p = _new_path(Path)
        p._parent, p._kind, p._segment = self, _CHILD, name
        return p

    def index(self, i: int) -> Path:
        p = _new_path(Path)
        p._parent, p._kind, p._segment = self, _INDEX, i
        return p

    def key(self, k: str) -> Path:
        p = _new_path(Path)
        p._parent, p._kind, p._segment = self, _KEY, k
        return p

    @property
    def text(self) -> str:
        segments: list[Path] = []
        path = self
        while path._parent is not None:
            segments.append(path)
            path = path._parent
        text: str = path._segment
        for p in reversed(segments):
            if p._kind == _CHILD:
                text = f"{text}.{p._segment}" if text else p._segment
            else:
                text = f"{text}[{p._segment}]"
        return text

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"Path(text={self.text!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Path):
            return self.text == other.text
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.text)


_new_path = object.__new__


class ErrorList:
    """Collects field errors; helpers name the Kubernetes cause types."""

    def __init__(self) -> None:
        self._errors: list[FieldError] = []

    def add(self, path: Path | str, reason: CauseType, message: str) -> None:
        self._errors.append(FieldError(str(path), reason, message))

    def required(self, path: Path | str, message: str = "Required value") -> None:
        self.add(path, CauseType.REQUIRED, message)

    def invalid(self, path: Path | str, value: object, message: str) -> None:
        self.add(path, CauseType.INVALID, f"Invalid value: {value!r}: {message}")

    def not_supported(self, path: Path | str, value: object, allowed: list[str] | tuple[str, ...]) -> None:
        supported = ", ".join(f'"{a}"' for a in allowed)
        self.add(
            path, CauseType.NOT_SUPPORTED, f"Unsupported value: {value!r}: supported values: {supported}"
        )

    def forbidden(self, path: Path | str, message: str) -> None:
        self.add(path, CauseType.FORBIDDEN, f"Forbidden: {message}")

    def duplicate(self, path: Path | str, value: object) -> None:
        self.add(path, CauseType.DUPLICATE, f"Duplicate value: {value!r}")

    def too_many(self, path: Path | str, actual: int, limit: int) -> None:
        self.add(path, CauseType.TOO_MANY, f"Too many: {actual}: must have at most {limit} items")

    def extend(self, other: ErrorList | Iterable[FieldError]) -> None:
        self._errors.extend(other)

    def __iter__(self) -> Iterator[FieldError]:
        return iter(self._errors)

    def __len__(self) -> int:
        return len(self._errors)

    def __bool__(self) -> bool:
        return bool(self._errors)

    def as_list(self) -> list[FieldError]:
        return list(self._errors)
