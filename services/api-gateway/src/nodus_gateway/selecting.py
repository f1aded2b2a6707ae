"""Field selectors (``?fieldSelector=status.phase=Running,metadata.name!=x``), as Kubernetes parses them.

Kubernetes serves a few fields per resource, each with ``=``/``==`` and ``!=``, joined by commas (AND);
any other field is a 400 that lists the supported ones. A field that is not set reads as the empty
string, so ``status.phase=`` selects objects no controller has reported on yet, as in Kubernetes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from nodus_gateway.responding import ApiError


def _name(obj: Any) -> str | None:
    return obj.metadata.name  # type: ignore[no-any-return]


def _namespace(obj: Any) -> str | None:
    return obj.metadata.namespace  # type: ignore[no-any-return]


def _phase(obj: Any) -> str | None:
    # Not every kind has a status (or a phase in it): such an object has the empty phase.
    return getattr(getattr(obj, "status", None), "phase", None)


FIELDS: Final[dict[str, Callable[[Any], str | None]]] = {
    "metadata.name": _name,
    "metadata.namespace": _namespace,
    "status.phase": _phase,
}
"""The selectable fields and how to read each from a typed object."""


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    field: str
    equal: bool
    """True for ``=``/``==``, False for ``!=``."""
    value: str

    def matches(self, obj: Any) -> bool:
        return ((FIELDS[self.field](obj) or "") == self.value) == self.equal


@dataclass(frozen=True, slots=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...]

    def matches(self, obj: Any) -> bool:
        return all(r.matches(obj) for r in self.requirements)

    def exact_name(self) -> str | None:
        """The name this selector pins (``metadata.name=X``), or None: ``kubectl get sweep X -w`` sends
        that, and a watch of one name can subscribe to that one key instead of filtering every event."""
        names = {r.value for r in self.requirements if r.field == "metadata.name" and r.equal}
        return next(iter(names)) if len(names) == 1 else None


def parse_field_selector(text: str | None) -> FieldSelector | None:
    """The selector, or None for none; an unsupported field or a malformed term is a 400 BadRequest."""
    if text is None or not text.strip():
        return None
    return FieldSelector(tuple(_parse_term(term) for term in _split_terms(text)))


def _split_terms(text: str) -> list[str]:
    """Split on commas that are not escaped (Kubernetes lets a value carry ``\\,``)."""
    terms, current, escaped = [], "", False
    for ch in text:
        if escaped:
            current += "\\" + ch
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == ",":
            terms.append(current)
            current = ""
        else:
            current += ch
    terms.append(current)
    return [t for t in terms if t.strip()]


def _parse_term(term: str) -> FieldRequirement:
    # "!=" before "==" before "=": the longest operator that occurs first wins, as in Kubernetes.
    for op, equal in (("!=", False), ("==", True), ("=", True)):
        field, sep, value = term.partition(op)
        if sep:
            return _requirement(field.strip(), equal, _unescape(value.strip()))
    raise ApiError.of(
        "BadRequest",
        f'invalid field selector "{term}": a term is field=value, field==value or field!=value',
        fix=_supported_fix(),
    )


def _requirement(field: str, equal: bool, value: str) -> FieldRequirement:
    if field not in FIELDS:
        raise ApiError.of(
            "BadRequest",
            f'field label not supported: "{field}"; supported fields: {", ".join(FIELDS)}',
            fix=_supported_fix(),
        )
    return FieldRequirement(field, equal, value)


def _unescape(value: str) -> str:
    out, escaped = "", False
    for ch in value:
        if escaped or ch != "\\":
            out += ch
            escaped = False
        else:
            escaped = True
    return out


def _supported_fix() -> str:
    return f"Select on {', '.join(FIELDS)} (for example fieldSelector=status.phase=Running)."
