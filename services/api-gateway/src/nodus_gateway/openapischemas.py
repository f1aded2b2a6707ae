"""The component schemas of the OpenAPI documents (openapi.py renders them, openapipaths.py's operations
refer to them), generated from the msgspec wire types the gateway encodes, so a field added to a type is
documented by the same change: every kind, list and subresource view, the admin kinds, and the field docs
read from the types' attribute docstrings.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import json
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import msgspec
import msgspec.inspect

from nodus_gateway import discovery
from nodus_gateway.resources import RESOURCES
from nodus_schema import API_GROUP, Status, Table, list_kind
from nodus_schema.access import Project, ProjectList, Token, TokenList
from nodus_schema.billing import Account, CreditGrant, Invoice, UsageList
from nodus_schema.results import SweepResults

Schema = dict[str, Any]
GROUP_VERSION_KIND: Final = "x-kubernetes-group-version-kind"
JSON: Final = "application/json"
CSV: Final = "text/csv"


# ---------------------------------------------------------------------------------------------------------
# Component schemas, from the wire types
# ---------------------------------------------------------------------------------------------------------


# The admin endpoints (admin.py): cluster-scoped kinds of nodus.dev/v1 with routes of their own, outside
# the resource table, by the segment of their path; each is (object type, list type).
ADMIN_KINDS: Final[dict[str, tuple[type[Any], type[Any]]]] = {
    "projects": (Project, ProjectList),
    "tokens": (Token, TokenList),
}


@dataclass(frozen=True, slots=True)
class View:
    """A route that answers a type of its own (billingapi.py's project routes, resultsapi.py's Sweep
    results): the type it answers as JSON, the body it takes (if any), and whether it answers CSV too."""

    reply: type[Any]
    body: type[Any] | None = None
    csv: bool = False


# By the path after /namespaces/{namespace}/.
PROJECT_VIEWS: Final[dict[str, View]] = {
    "account": View(Account),
    "account/grants": View(Account, body=CreditGrant),
    "usage": View(UsageList, csv=True),
    "invoices/{month}": View(Invoice, csv=True),
}
# Subresources served by modules of their own that answer another type than their resource's, by
# (plural, subresource): resultsapi.py serves a Sweep's results as SweepResults (or CSV).
SUBRESOURCE_VIEWS: Final[dict[tuple[str, str], View]] = {
    ("sweeps", "results"): View(SweepResults, csv=True),
}
VIEW_KINDS: Final = (Account, UsageList, Invoice, SweepResults)
"""The kinds the project views and subresource views answer (nodus.dev/v1, read-only: no list, no watch)."""
BODY_TYPES: Final = (CreditGrant,)
"""Request bodies that are not objects of a kind."""


def _typed() -> list[tuple[type[Any], tuple[str, str, str]]]:
    """Every type a response or request body can be, with the group, version and kind it stands for."""
    out: list[tuple[type[Any], tuple[str, str, str]]] = []
    for res in RESOURCES:
        out.append((res.object_type, (API_GROUP, discovery.VERSION, res.kind)))
        out.append((res.list_type, (API_GROUP, discovery.VERSION, list_kind(res.kind))))
    for obj, lst in ADMIN_KINDS.values():
        out.append((obj, (API_GROUP, discovery.VERSION, obj.__name__)))
        out.append((lst, (API_GROUP, discovery.VERSION, lst.__name__)))
    for view in VIEW_KINDS:
        out.append((view, (API_GROUP, discovery.VERSION, view.__name__)))
    out.append((Status, ("", "v1", "Status")))
    out.append((Table, ("meta.k8s.io", "v1", "Table")))
    for t in discovery.DISCOVERY_TYPES:
        out.append((t, ("", "v1", t.__name__)))
    return out


# Hand-written: what no wire type describes (version.Info is a plain dict in system.py).
EXTRA_SCHEMAS: Final[dict[str, Schema]] = {
    "Info": {
        "description": "The server's version (Kubernetes' version.Info), as `kubectl version` reads it.",
        "type": "object",
        "required": ["major", "minor", "gitVersion", "gitCommit", "gitTreeState", "buildDate", "goVersion"],
        "properties": {
            k: {"type": "string"}
            for k in (
                "major",
                "minor",
                "gitVersion",
                "gitCommit",
                "gitTreeState",
                "buildDate",
                "goVersion",
                "compiler",
                "platform",
            )
        },
    },
    "WatchEvent": {
        "description": "One event of a watch stream: ADDED, MODIFIED, DELETED, BOOKMARK or ERROR (a Status).",
        "type": "object",
        "required": ["type", "object"],
        "properties": {
            "type": {"type": "string", "enum": ["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"]},
            "object": {"type": "object", "description": "The object, a Table of it, or a Status."},
        },
    },
    "Namespace": {
        "description": "A project, as a core/v1 Namespace: every valid name is one (they exist implicitly).",
        "type": "object",
        "required": ["apiVersion", "kind", "metadata"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object", "properties": {"name": {"type": "string"}}},
            "spec": {"type": "object"},
            "status": {"type": "object", "properties": {"phase": {"type": "string"}}},
        },
        GROUP_VERSION_KIND: [{"group": "", "kind": "Namespace", "version": "v1"}],
    },
    "Patch": {
        "description": "A JSON merge patch, a JSON patch (an array of operations) or an apply configuration.",
    },
    "DeleteOptions": {
        "description": "Options of a delete (kubectl sends them as the body).",
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "gracePeriodSeconds": {"type": "integer"},
            "propagationPolicy": {"type": "string", "enum": ["Orphan", "Background", "Foreground"]},
            "dryRun": {"type": "array", "items": {"type": "string"}},
            "preconditions": {
                "type": "object",
                "properties": {"uid": {"type": "string"}, "resourceVersion": {"type": "string"}},
            },
        },
    },
}


@dataclass(frozen=True, slots=True)
class Components:
    schemas: dict[str, Schema]
    names: dict[type[Any], str]
    """The schema name of each wire type (msgspec's, which stays unique when titles clash)."""


def components(ref_template: str, *, v2: bool) -> Components:
    """The component schemas of every wire type, converted to the dialect (OpenAPI 3.0 or Swagger 2.0)."""
    typed = _typed()
    types = [t for t, _ in typed] + list(BODY_TYPES)
    refs, schemas = msgspec.json.schema_components(types, ref_template=ref_template)
    names = {t: str(ref["$ref"]).rsplit("/", 1)[-1] for t, ref in zip(types, refs, strict=True)}
    _describe_fields(schemas, types)
    for s in schemas.values():
        if isinstance(s.get("description"), str):
            s["description"] = inspect.cleandoc(s["description"])  # a class docstring keeps its indent
    converted = {name: _convert(s, v2=v2) for name, s in schemas.items()}
    for t, (group, version, kind) in typed:
        converted[names[t]][GROUP_VERSION_KIND] = [{"group": group, "kind": kind, "version": version}]
    for name, s in EXTRA_SCHEMAS.items():
        converted.setdefault(name, json.loads(json.dumps(s)))
    return Components(converted, names)


# What Kubernetes says of the fields every object has (kubectl explain prints it).
COMMON_FIELDS: Final = {
    "apiVersion": "APIVersion defines the versioned schema of this representation of an object.",
    "kind": "Kind is a string value representing the REST resource this object represents.",
    "metadata": "Standard object's metadata: name, namespace (the project), labels, versions.",
}


def _describe_fields(schemas: dict[str, Schema], roots: list[type[Any]]) -> None:
    """Give each property the docstring its field has in the source.

    The wire types document fields with attribute docstrings (a string under the field), which Python
    keeps only in the source; msgspec therefore leaves them out, and ``kubectl explain`` would print
    "<empty>" for every field. They are read back from the source here.
    """
    for info in msgspec.inspect.multi_type_info(roots):
        for cls in _struct_classes(info):
            schema = schemas.get(cls.__name__)
            if schema is None or schema.get("title") != cls.__name__:
                continue  # a clashing name msgspec renamed: leave it undescribed rather than guess
            docs = _attribute_docs(cls)
            for f in msgspec.structs.fields(cls):
                prop = schema.get("properties", {}).get(f.encode_name)
                text = docs.get(f.name) or COMMON_FIELDS.get(f.encode_name)
                if isinstance(prop, dict) and text and "description" not in prop:
                    prop["description"] = text


def _struct_classes(info: Any) -> Iterator[type[Any]]:
    """Every Struct class under a msgspec type info, once (types nest through lists, dicts, unions)."""
    seen: set[type[Any]] = set()
    stack = [info]
    while stack:
        node = stack.pop()
        if isinstance(node, msgspec.inspect.StructType):
            if node.cls in seen:
                continue
            seen.add(node.cls)
            yield node.cls
            stack.extend(f.type for f in node.fields)
        for attr in ("item_type", "key_type", "value_type"):
            if (child := getattr(node, attr, None)) is not None:
                stack.append(child)
        stack.extend(getattr(node, "types", None) or ())
        stack.extend(getattr(node, "item_types", None) or ())


_ATTRIBUTE_DOCS: dict[type[Any], dict[str, str]] = {}


def _attribute_docs(cls: type[Any]) -> dict[str, str]:
    """``field → docstring`` for the string literals that follow annotated fields in ``cls``'s source."""
    if cls not in _ATTRIBUTE_DOCS:
        _ATTRIBUTE_DOCS[cls] = _read_attribute_docs(cls)
    return _ATTRIBUTE_DOCS[cls]


def _read_attribute_docs(cls: type[Any]) -> dict[str, str]:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for field_node, doc_node in itertools.pairwise(body):
        if (
            isinstance(field_node, ast.AnnAssign)
            and isinstance(field_node.target, ast.Name)
            and isinstance(doc_node, ast.Expr)
            and isinstance(doc_node.value, ast.Constant)
            and isinstance(doc_node.value.value, str)
        ):
            docs[field_node.target.id] = inspect.cleandoc(doc_node.value.value)
    return docs


def _convert(node: Any, *, v2: bool) -> Any:
    """JSON Schema (2020-12, as msgspec writes it) to the OpenAPI dialect: OpenAPI 3.0 has no ``null``
    type (``nullable`` instead) and ``$ref`` takes no siblings; Swagger 2.0 has neither anyOf nor null."""
    if isinstance(node, list):
        return [_convert(n, v2=v2) for n in node]
    if not isinstance(node, dict):
        return node
    out: Schema = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {k: _convert(v, v2=v2) for k, v in value.items()}
        elif (key == "default" and value is None) or (key == "required" and not value):
            continue  # null defaults say nothing; an empty required list is not allowed in 3.0
        elif key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "prefixItems":
            out.setdefault("items", {})
        else:
            out[key] = _convert(value, v2=v2)
    if "anyOf" in out:
        out = _union(out, v2=v2)
    if out.get("type") == "null":
        out.pop("type")
        if not v2:
            out["nullable"] = True
    if "$ref" in out and len(out) > 1:
        out = {**{k: v for k, v in out.items() if k != "$ref"}, "allOf": [{"$ref": out["$ref"]}]}
    return out


def _union(node: Schema, *, v2: bool) -> Schema:
    variants = node.pop("anyOf")
    present = [v for v in variants if v not in ({"type": "null"}, {"nullable": True})]
    nullable = len(present) < len(variants)
    if len(present) == 1:
        node = {**node, **present[0]}  # a $ref with siblings is wrapped in allOf by the caller
    elif present and not v2:
        node = {**node, "anyOf": present}
    # Swagger 2.0 cannot say "one of": the field is left untyped, its description says what it takes.
    if nullable and not v2:
        node["nullable"] = True
    return node
