"""Reading a request body: the size limit, and JSON or YAML by Content-Type, as Kubernetes accepts both."""

from __future__ import annotations

from typing import Any, Final

import msgspec
import yaml
from starlette.requests import Request

from nodus_gateway.responding import ApiError

JSON_TYPES: Final = ("application/json",)
YAML_TYPES: Final = ("application/yaml", "application/x-yaml", "text/yaml")


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB ({n} bytes)"


def too_large(limit: int) -> ApiError:
    return ApiError.of("RequestEntityTooLarge", f"the request body is larger than the limit of {_mib(limit)}")


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, or 413 as soon as it passes ``limit`` (without reading the rest into memory)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";", 1)[0].strip().lower()


def is_json(content_type: str) -> bool:
    """Whether a body of this type is read as JSON. No Content-Type is, which is what curl users mean."""
    return content_type in ("", *JSON_TYPES) or content_type.endswith("+json")


def parse(body: bytes, content_type: str) -> Any:
    """The body as plain data: JSON (see :func:`is_json`) or YAML."""
    if is_json(content_type):
        try:
            return msgspec.json.decode(body)
        except msgspec.DecodeError as e:
            raise ApiError.of("BadRequest", f"the request body is not valid JSON: {e}") from None
    if content_type in YAML_TYPES:
        return _parse_yaml(body)
    raise ApiError.of(
        "UnsupportedMediaType",
        f'the content type "{content_type}" is not supported for this request',
        fix="Send the object with Content-Type: application/json (or application/yaml).",
    )


def _parse_yaml(body: bytes) -> Any:
    try:
        text = body.decode()
        # Aliases are refused: a few hundred bytes of nested aliases (a "billion laughs") expand into
        # gigabytes once the object is re-encoded as JSON, and no manifest needs them.
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                raise ApiError.of("BadRequest", "YAML anchors and aliases are not accepted in a request body")
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except (UnicodeDecodeError, yaml.YAMLError) as e:
        raise ApiError.of("BadRequest", f"the request body is not valid YAML: {e}") from None
    if len(docs) != 1:
        raise ApiError.of(
            "BadRequest", f"the request body must hold one object, not {len(docs)} YAML documents"
        )
    return docs[0]
