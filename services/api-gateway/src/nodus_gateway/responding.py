"""Responses: objects as JSON, and every error as a metav1.Status with docs, fix and requestId (ADR-028).

Handlers raise :class:`ApiError`; the app turns it (and Starlette's 404/405, FastAPI's parameter errors,
store and bus errors, and anything unexpected) into a Status response, so no error leaves the gateway in
another shape.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Final

import msgspec
import nats.errors
from starlette.requests import Request
from starlette.responses import Response

from nodus_gateway import tabling
from nodus_gateway.resources import Resource
from nodus_kit import errors as kit
from nodus_kit.tracing import current_request_id
from nodus_schema import FieldError, Status, encode, status_for, to_builtins

JSON: Final = "application/json"


class ApiError(Exception):
    """An error response: raise it anywhere in a handler."""

    def __init__(self, status: Status, headers: dict[str, str] | None = None) -> None:
        super().__init__(status.message)
        self.status = status
        self.headers = headers or {}

    @classmethod
    def of(cls, reason: str, message: str, **kwargs: Any) -> ApiError:
        return cls(status_for(reason, message, **kwargs))


def object_response(obj: Any, status_code: int = 200) -> Response:
    return Response(encode(obj), status_code=status_code, media_type=JSON)


def render(
    request: Request, res: Resource, payload: Any, *, is_list: bool, status_code: int = 200
) -> Response:
    """An object or list as the caller asked for it: as it is, or as a meta.k8s.io Table when the Accept
    header asks for one (``kubectl get`` does); ``includeObject`` picks what each row carries."""
    version = tabling.table_version(request.headers)
    if version is None:
        return object_response(payload, status_code)
    table = tabling.table_of_payload(
        res.kind,
        to_builtins(payload),
        is_list=is_list,
        include=tabling.include_object(request.query_params.get("includeObject")),
        version=version,
    )
    return object_response(table, status_code)


def status_response(status: Status, headers: dict[str, str] | None = None) -> Response:
    """The Status as a response, stamped with the current request id (the X-Request-Id header is set by
    the request-context middleware for every response)."""
    status = msgspec.structs.replace(status, request_id=status.request_id or current_request_id())
    return Response(encode(status), status_code=status.code or 500, media_type=JSON, headers=headers)


# ---------------------------------------------------------------------------------------------------------
# The errors of one resource, worded as Kubernetes words them (clients and people both know the phrasing)
# ---------------------------------------------------------------------------------------------------------


def not_found(res: Resource, name: str, namespace: str) -> ApiError:
    return ApiError.of(
        "NotFound",
        f'{res.group_resource} "{name}" not found',
        name=name,
        kind=res.plural,
        fix=f"Check the name and the project: `nodus get {res.plural} -n {namespace}` lists them.",
    )


def already_exists(res: Resource, name: str, namespace: str) -> ApiError:
    return ApiError.of(
        "AlreadyExists",
        f'{res.group_resource} "{name}" already exists',
        name=name,
        kind=res.plural,
        fix=(
            f"Pick another name (or set metadata.generateName), or delete the existing one first: "
            f"`nodus delete {res.singular} {name} -n {namespace}`."
        ),
    )


def invalid(res: Resource, name: str | None, causes: Iterable[FieldError]) -> ApiError:
    causes = list(causes)
    listed = ", ".join(str(c) for c in causes)
    subject = f'{res.group_kind} "{name}"' if name else res.group_kind
    message = f"{subject} is invalid: " + (listed if len(causes) == 1 else f"[{listed}]")
    return ApiError.of("Invalid", message, name=name, kind=res.kind, causes=causes)


@contextmanager
def store_errors(res: Resource, namespace: str, name: str | None = None) -> Iterator[None]:
    """Turn the object store's errors into API errors about this resource and name."""
    try:
        yield
    except kit.NotFound:
        raise not_found(res, name or "", namespace) from None
    except kit.AlreadyExists:
        raise already_exists(res, name or "", namespace) from None
    except kit.Conflict:
        raise ApiError.of(
            "Conflict",
            f'Operation cannot be fulfilled on {res.group_resource} "{name}": the object has been '
            "modified; please apply your changes to the latest version and try again",
            name=name,
            kind=res.plural,
        ) from None
    except kit.Expired as e:
        raise ApiError.of("Expired", str(e)) from None
    except kit.Invalid as e:
        # From a request parameter (a label selector, a continue token), never from an object.
        raise ApiError.of("BadRequest", str(e)) from None


def bus_unavailable(err: nats.errors.Error) -> ApiError:
    """NATS holds every object: when it does not answer, the caller should retry, not give up."""
    detail = str(err) or type(err).__name__
    return ApiError.of(
        "ServiceUnavailable",
        f"the object store (NATS JetStream) did not answer: {detail}",
        retry_after=1,
    )
