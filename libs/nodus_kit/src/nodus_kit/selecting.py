"""Kubernetes label selectors: ``app=x,tier!=db,env in (a,b),gpu notin (L4),has-key,!no-key``."""

from __future__ import annotations

import re
from dataclasses import dataclass

from nodus_kit.errors import Invalid

_SET = re.compile(r"^\s*([A-Za-z0-9._/-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ = re.compile(r"^\s*([A-Za-z0-9._/-]+)\s*(==|=|!=)\s*([A-Za-z0-9._-]*)\s*$")
_EXISTS = re.compile(r"^\s*(!?)\s*([A-Za-z0-9._/-]+)\s*$")


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    op: str  # "in", "notin", "exists", "!exists"
    values: frozenset[str] = frozenset()

    def matches(self, labels: dict[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "!exists":
            return self.key not in labels
        if self.op == "in":
            return labels.get(self.key) in self.values
        return labels.get(self.key) not in self.values


@dataclass(frozen=True, slots=True)
class Selector:
    requirements: tuple[Requirement, ...]

    def matches(self, labels: dict[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    @classmethod
    def parse(cls, text: str | None) -> Selector | None:
        if not text or not text.strip():
            return None
        return cls(tuple(_parse_one(part) for part in _split(text)))

    @classmethod
    def equals(cls, labels: dict[str, str]) -> Selector:
        return cls(tuple(Requirement(k, "in", frozenset([v])) for k, v in sorted(labels.items())))


def _split(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


def _parse_one(part: str) -> Requirement:
    if m := _SET.match(part):
        values = frozenset(v.strip() for v in m.group(3).split(",") if v.strip())
        return Requirement(m.group(1), m.group(2), values)
    if m := _EQ.match(part):
        op = "notin" if m.group(2) == "!=" else "in"
        return Requirement(m.group(1), op, frozenset([m.group(3)]))
    if m := _EXISTS.match(part):
        return Requirement(m.group(2), "!exists" if m.group(1) else "exists")
    raise Invalid(
        f"label selector part {part.strip()!r} is not valid: use key=value, key!=value, "
        "key in (a,b), key notin (a,b), key or !key"
    )
