"""Admission of a write: decode, set what the server owns, default, validate, as Kubernetes does.

Every problem of one kind is reported at once, with its field path: all type errors and unknown fields
together (``fieldValidation=Strict``, with "did you mean"), then all rule violations. Decoding problems
come first because the rules need a typed object to run on. An update (PUT, every patch, an apply) also
runs the update rules (immutable fields, raise-only caps), keeps the stored status and identity, and
moves metadata.generation on a spec change only.

The rate ceiling annotation (``nodus.dev/rate-ceiling-micros-per-hour``, ADR-031) is the server's: a
create sets it only when bound to a dry-run's estimate by ``If-Match`` (:func:`bind`), an update keeps the
stored value, and a value a user sends is dropped. So is the trace annotation (``nodus.dev/traceparent``,
ADR-0032), which the create path sets from the request's span.

The ``nodus.dev/`` labels and a controller ownerReference to a Sweep are the sweep controller's, which
writes them onto the cells it creates straight into the store: they are refused, not dropped, with a 422 on
the field (``nodus_schema.owning``). A create may set none; an update may keep the stored values as read.

An update is held to every rule for what it sets, but not for what the stored object already had
(:func:`_ratcheted`, Kubernetes' validation ratcheting): an object admitted before a rule was tightened can
still be cancelled or suspended.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

import msgspec

from nodus_gateway import referencing, versions
from nodus_gateway.estimating import COMPUTE_KINDS
from nodus_gateway.resources import Resource
from nodus_gateway.responding import ApiError, invalid
from nodus_kit.tracing import TRACEPARENT_ANNOTATION, with_traceparent
from nodus_schema import API_VERSION, CauseType, Decoded, FieldError, Job, Sweep, decode, to_builtins
from nodus_schema.estimating import (
    RATE_CEILING_ANNOTATION,
    EstimateBinding,
    bind_estimate,
    rate_ceiling_micros,
)
from nodus_schema.meta import ManagedFieldsEntry, now_rfc3339
from nodus_schema.owning import server_owned_errors
from nodus_schema.pipelines import Pipeline
from nodus_schema.updating import validate_update

# The alphabet Kubernetes uses for generateName suffixes: no vowels (no words), no look-alikes (0/o, 1/l).
_SUFFIX_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"
_SUFFIX_LEN: Final = 5
# What a spec change is compared on: everything but these (Kubernetes bumps a custom resource's
# generation on any change outside metadata and status).
_NOT_SPEC: Final = frozenset({"apiVersion", "kind", "metadata", "status"})


class FieldValidation(StrEnum):
    """``?fieldValidation=``: what an unknown field in a body does, as in Kubernetes."""

    STRICT = "Strict"
    """422 Invalid, every unknown field listed with its "did you mean"."""
    WARN = "Warn"
    """Accepted; each unknown field comes back as a ``Warning: 299`` header."""
    IGNORE = "Ignore"
    """Accepted silently."""


def field_validation(value: str | None) -> FieldValidation:
    """The parameter's value. Absent means Strict here, where Kubernetes' server default is Warn: kubectl
    sends Strict anyway (``--validate=strict``), and the nodus CLI and curl users get the typo caught."""
    if value is None or value == "":
        return FieldValidation.STRICT
    try:
        return FieldValidation(value)
    except ValueError:
        allowed = ", ".join(v.value for v in FieldValidation)
        raise ApiError.of(
            "BadRequest",
            f'fieldValidation "{value}" is not supported: it must be one of {allowed}',
            fix="Send fieldValidation=Strict (the default), Warn or Ignore.",
        ) from None


@dataclass(frozen=True, slots=True)
class Admitted:
    """The object to store, and the warnings to send back with it (``Warning: 299`` headers)."""

    obj: Any
    warnings: tuple[str, ...] = ()


def admit_create(res: Resource, data: Any, namespace: str | None) -> Any:
    """The object to store for a create of ``data`` (parsed JSON) in ``namespace``; raises ApiError."""
    return admit(res, data, namespace).obj


def admit(
    res: Resource,
    data: Any,
    namespace: str | None,
    validation: FieldValidation = FieldValidation.STRICT,
    *,
    json_body: bytes | None = None,
) -> Admitted:
    """Admission of a create: :func:`admit_create`, with unknown fields treated per ``validation``.
    ``json_body``: the JSON ``data`` was parsed from, if it was (decoded as it is, see decoding.decode)."""
    name = _check_body(res, data, namespace)
    decoded = _decode(res, data, name, validation, json_body)
    obj = (res.default_fresh or res.default)(_server_owned(decoded.value, namespace))
    errors = res.validate(obj) + server_owned_errors(obj.metadata)
    if errors:
        raise invalid(res, name, errors)
    return Admitted(obj, _warnings(decoded, validation))


def admit_update(
    res: Resource,
    data: Any,
    old: Any,
    *,
    validation: FieldValidation = FieldValidation.STRICT,
    require_resource_version: bool = True,
) -> Admitted:
    """Admission of an update of ``old`` into ``data`` (a PUT body, or the stored object with a patch
    applied), as Kubernetes' update path runs it: decode, keep what the server owns, default, validate
    the object and the change, and bump metadata.generation when the spec changed. The result carries
    the body's resourceVersion, so storing it is a compare-and-set against what the caller read."""
    namespace, name = old.metadata.namespace, old.metadata.name
    body_name = _check_body(res, data, namespace)
    if body_name not in (None, name):
        raise ApiError.of(
            "BadRequest",
            f'the name of the object ("{body_name}") does not match the name on the URL ("{name}")',
            name=name,
            kind=res.kind,
            fix="A name cannot change: create an object with the new name, then delete the old one.",
        )
    meta = data.get("metadata")
    rv = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    if require_resource_version and not rv:
        raise invalid(
            res,
            name,
            [
                FieldError(
                    "metadata.resourceVersion",
                    CauseType.INVALID,
                    "Invalid value: 0x0: must be specified for an update",
                )
            ],
        )
    check_resource_version(res, name, rv)
    decoded = _decode(res, data, name, validation)
    _check_uid(res, decoded.value, old)
    # Revisions admission pinned are the server's too (ADR-0036): a manifest that leaves them out keeps them.
    new = referencing.kept_pins(res.default(_kept_from(decoded.value, old)), old)
    errors = (
        _ratcheted(res, old, res.validate(new))
        + server_owned_errors(new.metadata, old.metadata)
        + update_errors(res, old, new)
    )
    if errors:
        raise invalid(res, name, errors)
    return Admitted(_with_generation(new, old, res), _warnings(decoded, validation))


def _ratcheted(res: Resource, old: Any, errors: list[FieldError]) -> list[FieldError]:
    """``errors`` less those the stored object has too, exactly (the same field, reason and message, so the
    same value): Kubernetes' validation ratcheting. An object admitted before a rule was tightened (a
    completeByTime, an out-of-range ttlSecondsAfterFinished) can still be suspended, cancelled or have its
    cap raised; a value an update sets or changes is held to every rule."""
    if not errors:
        return errors
    before = set(res.validate(res.default(old)))
    return [e for e in errors if e not in before]


def check_resource_version(res: Resource, name: str | None, rv: Any) -> None:
    """A resourceVersion in an update's body is a compare-and-set on the stored revision: 422 if it is a
    string this server never issued (versions.py), before it reaches the store. Other types are left to
    decoding, which names the type."""
    if isinstance(rv, str) and rv and versions.parse_resource_version(rv) is None:
        message = (
            f"Invalid value: {json.dumps(rv)}: must be the resourceVersion of the object as it was read "
            "(a decimal revision this server issued)"
        )
        raise invalid(res, name, [FieldError("metadata.resourceVersion", CauseType.INVALID, message)])


def update_errors(res: Resource, old: Any, new: Any) -> list[FieldError]:
    """What is wrong with the change itself: immutable fields, raise-only caps (the reference's rules).

    A resource row may bring its own rules (a ``validate_update`` attribute); Sweeps and Jobs have
    nodus_schema's, and so do Pipelines (their stages never change); a kind with neither has no rules beyond
    its identity (checked by the caller)."""
    own = getattr(res, "validate_update", None)
    if callable(own):
        return list(own(old, new))
    if isinstance(old, Sweep | Job | Pipeline):
        return validate_update(old, new)
    return []


def with_apply_manager(obj: Any, manager: str, patch: Mapping[str, Any]) -> Any:
    """``obj`` with ``manager``'s Apply entry in metadata.managedFields (replacing its previous one), as
    server-side apply records it: the fields the manager set, in Kubernetes' FieldsV1 form."""
    entry = ManagedFieldsEntry(
        manager=manager,
        operation="Apply",
        api_version=API_VERSION,
        time=now_rfc3339(),
        fields_type="FieldsV1",
        fields_v1=_fields_v1({k: v for k, v in patch.items() if k not in ("apiVersion", "kind")}),
    )
    others = [m for m in obj.metadata.managed_fields if not (m.manager == manager and m.operation == "Apply")]
    meta = msgspec.structs.replace(obj.metadata, managed_fields=[*others, entry])
    return msgspec.structs.replace(obj, metadata=meta)


def _fields_v1(data: Mapping[str, Any]) -> dict[str, Any]:
    """``{"spec": {"maxParallel": 3}}`` → ``{"f:spec": {"f:maxParallel": {}}}`` (lists are leaves: a
    Nodus list is owned whole, as an atomic list is in Kubernetes)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key == "metadata" and isinstance(value, Mapping):
            # Identity and versions are the server's; a manager owns labels, annotations and the like.
            value = {k: v for k, v in value.items() if k not in ("name", "namespace", "resourceVersion")}
        out[f"f:{key}"] = _fields_v1(value) if isinstance(value, Mapping) else {}
    return out


def _check_body(res: Resource, data: Any, namespace: str | None) -> str | None:
    """The body is an object of this kind in this namespace; returns its metadata.name, if any."""
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
    return name


def _decode(
    res: Resource,
    data: Mapping[str, Any],
    name: str | None,
    validation: FieldValidation,
    json_body: bytes | None = None,
) -> Decoded[Any]:
    """The typed object, or 422 with every type error (and, under Strict, every unknown field) at once."""
    # Users never write status: it is the controllers'. Dropped before decoding, so a status in the body
    # (say, from `nodus get -o yaml`) is neither stored nor able to fail the request.
    if "status" in data:
        decoded = decode({k: v for k, v in data.items() if k != "status"}, res.object_type)
    else:
        decoded = decode(data, res.object_type, json_source=json_body)
    causes = decoded.errors + (decoded.unknown_errors() if validation is FieldValidation.STRICT else [])
    causes += _missing(res, data)
    if causes or decoded.value is None:
        raise invalid(res, name, causes)
    return decoded


def _missing(res: Resource, data: Mapping[str, Any]) -> list[FieldError]:
    """The row's required top-level fields the body leaves out (or sends as null)."""
    return [
        FieldError(f, CauseType.REQUIRED, f"Required value: a {res.kind} needs its {f}")
        for f in res.required
        if data.get(f) is None
    ]


def _warnings(decoded: Decoded[Any], validation: FieldValidation) -> tuple[str, ...]:
    """Kubernetes' wording for an unknown field under fieldValidation=Warn: the whole path."""
    if validation is not FieldValidation.WARN:
        return ()
    out = []
    for path in decoded.unknown:
        hint = decoded.suggestion(path)
        out.append(f'unknown field "{path}"' + (f'; did you mean "{hint}"?' if hint else ""))
    return tuple(out)


def _check_uid(res: Resource, new: Any, old: Any) -> None:
    """A uid in the body is a precondition, as in Kubernetes: a different one means the object was
    deleted and created again since the caller read it."""
    if new.metadata.uid and new.metadata.uid != old.metadata.uid:
        raise ApiError.of(
            "Conflict",
            f"Precondition failed: UID in precondition: {new.metadata.uid}, UID in object meta: "
            f"{old.metadata.uid}",
            name=old.metadata.name,
            kind=res.plural,
            fix="The object was deleted and created again: get it again and reapply your change.",
        )


def _kept_from(new: Any, old: Any) -> Any:
    """``new`` with what only the server writes taken from ``old``: identity, timestamps, managed fields
    and the status (users never write status; the update path keeps the stored one, as Kubernetes' does
    for a resource with a status subresource)."""
    meta = msgspec.structs.replace(
        new.metadata,
        name=old.metadata.name,
        namespace=old.metadata.namespace,
        uid=old.metadata.uid,
        creation_timestamp=old.metadata.creation_timestamp,
        deletion_timestamp=old.metadata.deletion_timestamp,
        deletion_grace_period_seconds=old.metadata.deletion_grace_period_seconds,
        generation=old.metadata.generation,
        managed_fields=old.metadata.managed_fields,
        annotations=with_traceparent(
            _with_ceiling(new.metadata.annotations, old.metadata.annotations.get(RATE_CEILING_ANNOTATION)),
            old.metadata.annotations.get(TRACEPARENT_ANNOTATION),
        ),
        self_link=None,
    )
    kept = msgspec.structs.replace(new, metadata=meta)
    if "status" in type(old).__struct_fields__:
        kept = msgspec.structs.replace(kept, status=old.status)
    return kept


def _with_generation(new: Any, old: Any, res: Resource) -> Any:
    """metadata.generation + 1 when anything outside metadata and status changed (never on a status or
    metadata-only change), as Kubernetes does; the controllers answer with status.observedGeneration."""
    generation = old.metadata.generation or 1
    if _spec_of(new) != _spec_of(res.default(old)):
        generation += 1
    meta = msgspec.structs.replace(new.metadata, generation=generation)
    return msgspec.structs.replace(new, metadata=meta)


def _spec_of(obj: Any) -> dict[str, Any]:
    return {k: v for k, v in to_builtins(obj).items() if k not in _NOT_SPEC}


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


def _server_owned(obj: Any, namespace: str | None) -> Any:
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
        annotations=with_traceparent(_with_ceiling(obj.metadata.annotations, None), None),
    )
    if "status" not in type(obj).__struct_fields__:
        return msgspec.structs.replace(obj, metadata=meta)
    return msgspec.structs.replace(obj, metadata=meta, status=type(obj.status)())


def _with_ceiling(annotations: dict[str, str], ceiling: str | None) -> dict[str, str]:
    """``annotations`` with the rate ceiling set to ``ceiling`` (removed when None), whatever they said."""
    out = {k: v for k, v in annotations.items() if k != RATE_CEILING_ANNOTATION}
    if ceiling is not None:
        out[RATE_CEILING_ANNOTATION] = ceiling
    return out


def binding_of(if_match: str, spec: Any) -> EstimateBinding | None:
    """The estimate an If-Match header binds ``spec`` to: the first of its entity tags that does."""
    for tag in if_match.split(","):
        binding = bind_estimate(tag, spec)
        if binding is not None:
            return binding
    return None


def bind(res: Resource, admitted: Admitted, if_match: str | None) -> Admitted:
    """A create bound by ``If-Match`` to a dry-run's estimate (ADR-031): admitted whatever the time (the
    estimate's validUntil is not compared), and never placed above the bound rate + 10 %, which the rate
    ceiling annotation carries to the scheduler. A tag made for another spec (or none of the dry-run's):
    412 PreconditionFailed. Kinds without an estimate ignore If-Match on create, as Kubernetes does."""
    if not if_match or not if_match.strip() or res.kind not in COMPUTE_KINDS:
        return admitted
    obj = admitted.obj
    binding = binding_of(if_match, obj.spec)
    if binding is None:
        name = obj.metadata.name or obj.metadata.generate_name
        raise ApiError.of(
            "PreconditionFailed",
            f"the estimate this create is bound to no longer matches: If-Match {if_match.strip()} is not the "
            f"ETag of a dry-run of this {res.kind} (the spec changed since, or it is not a dry-run's ETag); "
            "dry-run again",
            name=name,
            kind=res.kind,
        )
    if binding.rate_micros_per_hour is None:
        return admitted  # the estimate had no rate (nothing matched): there is no ceiling to carry
    ceiling = str(rate_ceiling_micros(binding.rate_micros_per_hour))
    meta = msgspec.structs.replace(obj.metadata, annotations=_with_ceiling(obj.metadata.annotations, ceiling))
    return Admitted(msgspec.structs.replace(obj, metadata=meta), admitted.warnings)


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
