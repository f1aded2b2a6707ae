"""Field errors: one problem with one field, in the shape of a Kubernetes StatusCause.

Validation never stops at the first problem: every rule appends to an :class:`ErrorList`, and the API
returns them all at once, each with its field path (``spec.template.spec.inputs[2].name``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum


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


@dataclass(frozen=True, slots=True)
class Path:
    """A field path that renders as Kubernetes does: ``spec.inputs[2].name``, ``metadata.labels[a/b]``."""

    text: str = ""

    def child(self, name: str) -> Path:
        return Path(f"{self.text}.{name}" if self.text else name)

    def index(self, i: int) -> Path:
        return Path(f"{self.text}[{i}]")

    def key(self, k: str) -> Path:
        return Path(f"{self.text}[{k}]")

    def __str__(self) -> str:
        return self.text


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

    def extend(self, other: ErrorList | list[FieldError]) -> None:
        self._errors.extend(other)

    def __iter__(self) -> Iterator[FieldError]:
        return iter(self._errors)

    def __len__(self) -> int:
        return len(self._errors)

    def __bool__(self) -> bool:
        return bool(self._errors)

    def as_list(self) -> list[FieldError]:
        return list(self._errors)
