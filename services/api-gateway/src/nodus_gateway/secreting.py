"""Secrets: create, get, list, update (PUT), patch and delete, with values that are write-only.

The wire form is Kubernetes' (``type``, base64 ``data``, plain ``stringData``). What differs, on purpose:

* **Values never leave the gateway.** Every response (create, get, list, update, patch, delete) carries
  the keys with each value replaced by ``""`` and the annotation ``nodus.dev/redacted: data``; no list, no
  error message and no log line carries a value (type errors about a value say "(not shown)"). Only the
  services that run Jobs will read values, from the store, never through the API.
* **"" writes back as "unchanged".** On an update, a ``data`` key whose value is ``""`` keeps the stored
  value, so a read-modify-write (``kubectl edit``, applying a fetched object, a merge patch of labels)
  changes what it means to and wipes nothing. To store an empty value, send it in ``stringData``. To
  remove a key, leave it out of ``data`` (or patch it to null).
* **Versions.** ``metadata.generation`` is 1 at create and grows by one with every write that changes
  the values or the type (not with label or annotation changes); ``SecretMount.version`` pins it.
  Only the latest version is kept for now (bucket history 1), so a pin can say which version a Job
  expects, not fetch an older one.

Storage: the objects, values included, live in the ``secrets`` KV bucket, which only the gateway reads.
They are **not encrypted by Nodus** (no crypto dependency is taken for it): encryption at rest is the
NATS server's job, set with ``jetstream { cipher: chachapoly, key: ... }`` in its config, and every
operator deployment must set it. Anyone with read access to the bucket (or the server's disk without
that setting) can read the values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

import msgspec
from fastapi import APIRouter, Request
from starlette.responses import Response

from nodus_gateway import bodies, patching
from nodus_gateway.admitting import admit_create, check_resource_version
from nodus_gateway.authorizing import authorize, principal_of
from nodus_gateway.clusterrouting import check_name, check_namespace, list_response, serve_list
from nodus_gateway.querying import ContinueQ, LabelSelectorQ, LimitQ, PageQ
from nodus_gateway.resources import Resource, Stores, resource
from nodus_gateway.responding import ApiError, already_exists, invalid, object_response, store_errors
from nodus_gateway.routing import API_PREFIX
from nodus_kit import errors as kit
from nodus_kit.storing import ObjectStore
from nodus_schema import CauseType, FieldError, status_for, to_builtins
from nodus_schema.configs import REDACTED_ANNOTATION, Secret, secret_values_equal

VALUE_FIELDS: Final = ("data", "stringData")
MERGE_PATCH_TYPES: Final = ("application/merge-patch+json", "application/strategic-merge-patch+json")
JSON_PATCH_TYPE: Final = "application/json-patch+json"


# ---------------------------------------------------------------------------------------------------------
# Admission
# ---------------------------------------------------------------------------------------------------------


def _value_errors(data: Mapping[str, Any]) -> list[FieldError]:
    """Type errors of ``data`` and ``stringData``, checked before the generic decoding, whose messages
    quote the bad value: here a value is never quoted."""
    errors: list[FieldError] = []
    for field in VALUE_FIELDS:
        values = data.get(field)
        if values is None:
            continue
        if not isinstance(values, Mapping):
            errors.append(FieldError(field, CauseType.TYPE_INVALID, "Invalid value: must be an object"))
            continue
        for key, value in values.items():
            if not isinstance(value, str):
                message = "Invalid value: (not shown): must be a string"
                errors.append(FieldError(f"{field}[{key}]", CauseType.TYPE_INVALID, message))
    return errors


def _without_redaction(data: Mapping[str, Any]) -> dict[str, Any]:
    """The body without the annotation the server sets on what it returns (sending it back is normal)."""
    out = dict(data)
    meta = out.get("metadata")
    if isinstance(meta, Mapping) and isinstance(meta.get("annotations"), Mapping):
        annotations = {k: v for k, v in meta["annotations"].items() if k != REDACTED_ANNOTATION}
        out["metadata"] = {**meta, "annotations": annotations}
    return out


def admit_secret(res: Resource, data: Any, namespace: str) -> Secret:
    """The Secret to store for a create: value types first (without quoting values), then the generic
    admission (type meta, strict decoding, server-owned fields, stringData folded in, the rules)."""
    if isinstance(data, Mapping):
        name = data.get("metadata", {}).get("name") if isinstance(data.get("metadata"), Mapping) else None
        errors = _value_errors(data)
        if errors:
            raise invalid(res, name if isinstance(name, str) else None, errors)
        data = _without_redaction(data)
    secret: Secret = admit_create(res, data, namespace)
    return secret


def _kept_values(data: Mapping[str, Any], old: Secret) -> dict[str, Any]:
    """The body with every ``""`` in ``data`` replaced by the stored value of that key (see module doc)."""
    values = data.get("data")
    if not isinstance(values, Mapping):
        return dict(data)
    kept = {k: (old.data.get(k, v) if v == "" else v) for k, v in values.items()}
    return {**data, "data": kept}


def admit_secret_update(res: Resource, data: Any, old: Secret) -> Secret:
    """The Secret to store for an update of ``old``: admitted as a create would be, then given back the
    identity of ``old``, the body's resourceVersion (a precondition, when sent) and the next version
    when the values changed."""
    name, namespace = old.metadata.name or "", old.metadata.namespace or ""
    if isinstance(data, Mapping):
        meta = data.get("metadata")
        body_name = meta.get("name") if isinstance(meta, Mapping) else None
        if body_name not in (None, "", name):
            raise ApiError.of(
                "BadRequest",
                f'the name of the object ("{body_name}") does not match the name on the URL ("{name}")',
                name=name,
                kind=res.kind,
                fix="A name cannot change: create a Secret with the new name, then delete the old one.",
            )
        rv = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
        check_resource_version(res, name, rv)
        if meta is None or isinstance(meta, Mapping):  # any other metadata is admission's to refuse
            data = _kept_values({**data, "metadata": {**(meta or {}), "name": name}}, old)
    else:
        rv = None
    new = admit_secret(res, data, namespace)
    generation = (old.metadata.generation or 1) + (0 if secret_values_equal(new, old) else 1)
    meta = msgspec.structs.replace(
        new.metadata,
        uid=old.metadata.uid,
        creation_timestamp=old.metadata.creation_timestamp,
        generation=generation,
        resource_version=str(rv) if rv else old.metadata.resource_version,
    )
    return msgspec.structs.replace(new, metadata=meta)


# ---------------------------------------------------------------------------------------------------------
# Patches
# ---------------------------------------------------------------------------------------------------------


def patched(res: Resource, old: Secret, body: bytes, content_type: str) -> Any:
    """The object a patch makes of what the caller can see (the redacted Secret): values the patch does
    not touch stay "" and so keep their stored values."""
    visible = to_builtins(res.redact(old))
    operation: Callable[[Any, Any], Any]
    if content_type in MERGE_PATCH_TYPES:
        # A Secret has maps and scalars only, where a strategic merge is a JSON merge.
        operation = patching.merge_patch
    elif content_type == JSON_PATCH_TYPE:
        operation = patching.json_patch
    else:
        raise ApiError.of(
            "UnsupportedMediaType",
            f'the patch type "{content_type}" is not supported for secrets',
            fix=f"Send the patch as {MERGE_PATCH_TYPES[0]} or {JSON_PATCH_TYPE}.",
        )
    try:
        return operation(visible, bodies.parse(body, content_type))
    except patching.PatchError as e:
        raise ApiError.of("BadRequest", f"the patch cannot be applied: {e}") from None


# ---------------------------------------------------------------------------------------------------------
# Routes
# ---------------------------------------------------------------------------------------------------------


async def _update(res: Resource, store: ObjectStore[Any], new: Secret) -> Response:
    name, namespace = new.metadata.name or "", new.metadata.namespace or ""
    with store_errors(res, namespace, name):
        stored = await store.update(new)
    return object_response(res.redact(stored))


def secret_router(stores: Stores, *, max_body_bytes: int) -> APIRouter:
    res = resource("secrets")
    store = stores[res.plural]
    collection = f"{API_PREFIX}/namespaces/{{namespace}}/{res.plural}"
    item = f"{collection}/{{name}}"
    router = APIRouter(tags=[res.plural])

    async def _get(request: Request, verb: str, namespace: str, name: str) -> Secret:
        check_namespace(namespace)
        await authorize(request, verb, res.plural, namespace)
        check_name(res, name, namespace)
        with store_errors(res, namespace, name):
            secret: Secret = await store.get(namespace, name)
        return secret

    @router.post(collection, status_code=201, name="create secret")
    async def create(namespace: str, request: Request) -> Response:
        check_namespace(namespace)
        await authorize(request, "create", res.plural, namespace)
        body = await bodies.read_body(request, max_body_bytes)
        secret = admit_secret(res, bodies.parse(body, bodies.media_type(request)), namespace)
        if not secret.metadata.name:
            # generateName is not offered: a Secret is referred to by name, so it needs a known one.
            raise invalid(res, None, [FieldError("metadata.name", CauseType.REQUIRED, "Required value")])
        try:
            created = await store.create(secret)
        except kit.AlreadyExists:
            raise already_exists(res, secret.metadata.name, namespace) from None
        return object_response(res.redact(created), 201)

    @router.get(collection, name="list secrets")
    async def list_(namespace: str, request: Request, query: PageQ) -> Response:
        check_namespace(namespace)
        return await serve_list(request, res, store, namespace, query)

    @router.get(f"{API_PREFIX}/{res.plural}", name="list secrets in all namespaces")
    async def list_all(
        request: Request,
        label_selector: LabelSelectorQ = None,
        limit: LimitQ = None,
        continue_: ContinueQ = None,
    ) -> Response:
        await authorize(request, "list", res.plural, None)
        if not principal_of(request).admin:
            # Filtering a page by project would break limit/continue; project members list per project.
            raise ApiError(
                status_for(
                    "Forbidden",
                    "secrets are listed across projects by the cluster admin only",
                    fix="List the secrets of one project: `nodus get secrets -n <project>`.",
                )
            )
        return await list_response(
            res, store, None, label_selector=label_selector, limit=limit, continue_=continue_
        )

    @router.get(item, name="get secret")
    async def get(namespace: str, name: str, request: Request) -> Response:
        return object_response(res.redact(await _get(request, "get", namespace, name)))

    @router.put(item, name="update secret")
    async def update(namespace: str, name: str, request: Request) -> Response:
        old = await _get(request, "update", namespace, name)
        body = await bodies.read_body(request, max_body_bytes)
        data = bodies.parse(body, bodies.media_type(request))
        return await _update(res, store, admit_secret_update(res, data, old))

    @router.patch(item, name="patch secret")
    async def patch(namespace: str, name: str, request: Request) -> Response:
        old = await _get(request, "patch", namespace, name)
        body = await bodies.read_body(request, max_body_bytes)
        data = patched(res, old, body, bodies.media_type(request))
        return await _update(res, store, admit_secret_update(res, data, old))

    @router.delete(item, name="delete secret")
    async def delete(namespace: str, name: str, request: Request) -> Response:
        check_namespace(namespace)
        await authorize(request, "delete", res.plural, namespace)
        check_name(res, name, namespace)
        with store_errors(res, namespace, name):
            deleted = await store.delete(namespace, name)
        return object_response(res.redact(deleted))

    return router
