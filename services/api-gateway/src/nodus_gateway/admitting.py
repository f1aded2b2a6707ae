"""Admission of a create: decode strictly, set what the server owns, default, validate, as Kubernetes does.

Every problem of one kind is reported at once, with its field path: all type errors and unknown fields
together (Kubernetes' ``fieldValidation=Strict``, with "did you mean"), then all rule violations.
Decoding problems come first because the rules need a typed object to run on.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from nodus_gateway.resources import Resource
from nodus_gateway.responding import ApiError, invalid
from nodus_schema import API_VERSION, decode

# The alphabet Kubernetes uses for generateName suffixes: no vowels (no words), no look-alikes (0/o, 1/l).
_SUFFIX_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"
_SUFFIX_LEN: Final = 5


def admit_create(res: Resource, data: Any, namespace: str) -> Any:
    """The object to store for a create of ``data`` (parsed JSON) in ``namespace``; raises ApiError."""
    if not isinstance(data, Mapping):
        raise ApiError.of(
            "BadRequest", f"the request body must be a JSON object (a {res.kind}), not {_json_kind(data)}"
        )
    _check_type_meta(res, data)
    metadata = data.get("metadata")
    name = _str_or_none(metadata.get("name")) if isinstance(metadata, Mapping) else None
    body_ns = metadata.get("namespace") if isinstance(metadata, Mapping) else None
    if body_ns not in (None, "") and body_ns != namespace:
        raise ApiError.of(
            "BadRequest",
            f'the namespace of the provided object ("{body_ns}") does not match the namespace sent on '
            f'the request ("{namespace}")',
            name=name,
            kind=res.kind,
            fix=f"Drop metadata.namespace from the object, or send it to /namespaces/{body_ns}/.",
        )
    # Users never write status: it is the controllers'. Dropped before decoding, so a status in the body
    # (say, from `nodus get -o yaml`) is neither stored nor able to fail the request.
    decoded = decode({k: v for k, v in data.items() if k != "status"}, res.object_type)
    causes = decoded.errors + decoded.unknown_errors()
    if causes or decoded.value is None:
        raise invalid(res, name, causes)
    obj = res.default(_server_owned(decoded.value, namespace))
    errors = res.validate(obj)
    if errors:
        raise invalid(res, name, errors)
    return obj


def _check_type_meta(res: Resource, data: Mapping[str, Any]) -> None:
    """apiVersion and kind may be left out (the URL says them), but must not say something else."""
    api_version, kind = data.get("apiVersion"), data.get("kind")
    if api_version is not None and api_version != API_VERSION:
        raise ApiError.of(
            "BadRequest",
            f"the API version in the data ({api_version}) does not match the expected API version "
            f"({API_VERSION})",
        )
    if kind is not None and kind != res.kind:
        raise ApiError.of(
            "BadRequest",
            f"the kind in the data ({kind}) does not match the expected kind ({res.kind})",
            fix=f"Send a {kind} to its own path, or set kind: {res.kind}.",
        )


def _server_owned(obj: Any, namespace: str) -> Any:
    """Reset what only the server writes, as Kubernetes' BeforeCreate does: identity, versions, status."""
    meta = msgspec.structs.replace(
        obj.metadata,
        namespace=namespace,
        uid=None,
        resource_version=None,
        creation_timestamp=None,
        deletion_timestamp=None,
        deletion_grace_period_seconds=None,
        generation=1,
        self_link=None,
        managed_fields=[],
    )
    return msgspec.structs.replace(obj, metadata=meta, status=type(obj.status)())


def with_generated_name(obj: Any) -> Any:
    """``metadata.generateName`` plus a random suffix, when no name was given (the suffix is Kubernetes')."""
    meta = obj.metadata
    if meta.name or not meta.generate_name:
        return obj
    suffix = "".join(secrets.choice(_SUFFIX_ALPHABET) for _ in range(_SUFFIX_LEN))
    named = msgspec.structs.replace(meta, name=meta.generate_name + suffix)
    return msgspec.structs.replace(obj, metadata=named)


def _str_or_none(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


def _json_kind(v: Any) -> str:
    if isinstance(v, list):
        return "an array"
    if v is None:
        return "null"
    if isinstance(v, str):
        return "a string"
    return "a number or boolean"
