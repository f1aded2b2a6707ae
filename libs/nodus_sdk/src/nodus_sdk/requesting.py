"""The request/response layer both clients share: a :class:`Call` says what to send and how to read the
answer; the sync and async clients only carry it over httpx (and retry it when it is safe to).

Everything here is free of I/O: building paths and bodies, turning a response into a typed object or the
right :class:`~nodus_sdk.errors.NodusError`, turning httpx's transport errors into
:class:`~nodus_sdk.errors.Unreachable`, and the retry policy.
"""

from __future__ import annotations

import logging
import random
import re
import ssl
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar

import httpx
import msgspec

from nodus_schema import API_VERSION, encode, status_for
from nodus_sdk.configuring import Config
from nodus_sdk.errors import BadCA, NodusError, Unreachable, error_for, status_of

log = logging.getLogger("nodus_sdk")

T = TypeVar("T")

USER_AGENT: Final = "nodus-sdk/0.1.0"
TIMEOUT_S: Final = 15.0
API_PREFIX: Final = f"/apis/{API_VERSION}"
JSON: Final = "application/json"
_WARNING: Final = re.compile(r'^\s*299\s+\S+\s+"(.*)"\s*$')


@dataclass(frozen=True, slots=True)
class Retry:
    """How idempotent requests (GETs, and a watch reconnecting) are retried: on a connection error or a
    503, up to ``attempts`` tries in all, waiting ``backoff_s`` doubled each time (with jitter), at most
    ``max_backoff_s``. Writes are never retried: a POST that timed out may have been stored."""

    attempts: int = 4
    backoff_s: float = 0.2
    max_backoff_s: float = 5.0

    def delays(self) -> Iterator[float]:
        """The waits before the 2nd, 3rd, ... try."""
        delay = self.backoff_s
        for _ in range(self.attempts - 1):
            yield min(delay, self.max_backoff_s) * (0.5 + random.random() / 2)
            delay *= 2


NO_RETRY: Final = Retry(attempts=1)


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request and how to read its answer."""

    method: str
    path: str
    read: Callable[[httpx.Response], T]
    params: Mapping[str, str] = field(default_factory=dict)
    body: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def idempotent(self) -> bool:
        return self.method in ("GET", "HEAD")

    def request_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"params": dict(self.params) or None, "headers": dict(self.headers)}
        if self.body is not None:
            kwargs["content"] = self.body
        return kwargs


def body_of(obj: Any) -> bytes:
    """A request body: a wire Struct or plain dicts and lists, as JSON."""
    return encode(obj)


def typed(kind: type[T]) -> Callable[[httpx.Response], T]:
    """A reader that decodes a successful JSON body into ``kind`` (wire names are camelCase)."""

    def read(resp: httpx.Response) -> T:
        return decode_body(resp.content, kind)

    return read


def decode_body(content: bytes, kind: type[T]) -> T:
    try:
        return msgspec.json.decode(content, type=kind)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        message = f"the server's answer is not a {_name(kind)}: {e}"
        raise NodusError(status_for("InternalError", message)) from None


def text(resp: httpx.Response) -> str:
    return resp.text


def _name(kind: Any) -> str:
    return getattr(kind, "__name__", str(kind))


def answer(call: Call[T], resp: httpx.Response) -> T:
    """The typed result of a complete response, or its error raised."""
    warn(resp)
    if not resp.is_success:
        raise error_of(resp)
    return call.read(resp)


def error_of(resp: httpx.Response) -> NodusError:
    """The NodusError of an error response (its body read)."""
    status = status_of(resp.status_code, resp.content, resp.reason_phrase)
    if status.request_id is None and resp.headers.get("x-request-id"):
        status = msgspec.structs.replace(status, request_id=resp.headers["x-request-id"])
    return error_for(status)


def warn(resp: httpx.Response) -> None:
    """Kubernetes-style ``Warning: 299 - "..."`` headers (an unknown field, no estimate), logged."""
    for value in resp.headers.get_list("warning"):
        match = _WARNING.match(value)
        log.warning("%s", match.group(1) if match else value)


def retryable(resp: httpx.Response) -> bool:
    return resp.status_code == 503


def retry_after(resp: httpx.Response, default: float) -> float:
    """A 503's Retry-After (seconds), bounded, or the policy's own delay."""
    value = resp.headers.get("retry-after", "")
    return min(float(value), 30.0) if value.isdigit() else default


# -- paths -------------------------------------------------------------------------------------------------


def collection_path(plural: str, namespace: str | None) -> str:
    """``/apis/nodus.dev/v1/namespaces/{ns}/{plural}``, or ``/apis/nodus.dev/v1/{plural}`` without one
    (cluster-scoped kinds, or every project the caller may see)."""
    if namespace is None:
        return f"{API_PREFIX}/{plural}"
    return f"{API_PREFIX}/namespaces/{namespace}/{plural}"


def item_path(plural: str, namespace: str | None, name: str, *sub: str) -> str:
    return "/".join([collection_path(plural, namespace), name, *sub])


def project_path(namespace: str, *rest: str) -> str:
    return "/".join([f"{API_PREFIX}/namespaces/{namespace}", *rest])


def query(**values: str | int | bool | None) -> dict[str, str]:
    """Query parameters under their wire names, the unset ones left out (booleans as true/false)."""
    out: dict[str, str] = {}
    for key, value in values.items():
        if value is None:
            continue
        out[key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return out


# -- transport ---------------------------------------------------------------------------------------------


def tls_context(ca: str | None) -> ssl.SSLContext:
    """The system's CAs, and those in ``ca`` (a PEM file) as well: a local CA never stops other servers
    from verifying."""
    ctx = ssl.create_default_context()
    if ca:
        try:
            ctx.load_verify_locations(cafile=ca)
        except (OSError, ValueError) as e:  # ssl.SSLError is an OSError
            raise BadCA(ca, getattr(e, "strerror", None) or str(e)) from None
    return ctx


def client_options(config: Config, timeout: float, user_agent: str | None = None) -> dict[str, Any]:
    """The keyword arguments of an httpx client for ``config``: base URL, headers, timeout, TLS."""
    headers = {"User-Agent": user_agent or USER_AGENT, "Accept": JSON}
    if config.token:
        headers["Authorization"] = f"Bearer {config.token}"
    verify: ssl.SSLContext | bool = tls_context(config.ca) if config.server.startswith("https:") else True
    return {"base_url": config.server, "headers": headers, "timeout": timeout, "verify": verify}


def unreachable(server: str, e: httpx.TransportError) -> Unreachable:
    """httpx's transport error as :class:`Unreachable`, saying why the gateway did not answer."""
    if isinstance(e, httpx.ConnectError):
        if _tls_failure(e):
            return Unreachable(server, _tls_detail(e), refused=False, tls=True)
        return Unreachable(server, str(e) or "connection refused", refused=True)
    if isinstance(e, httpx.TimeoutException):
        return Unreachable(server, "it did not answer in time", refused=False)
    return Unreachable(server, str(e) or type(e).__name__, refused=False)


def _tls_failure(e: BaseException) -> bool:
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _tls_detail(e: httpx.ConnectError) -> str:
    text = str(e)
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return f"its TLS certificate is not trusted ({text})"
    return f"the TLS handshake failed ({text})"
