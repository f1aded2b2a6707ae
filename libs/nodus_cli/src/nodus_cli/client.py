"""The CLI's client of the nodus.dev/v1 API: JSON in and out, errors as the server's Status.

Built on the SDK (:mod:`nodus_sdk`): the requests, retries of GETs, TLS and error decoding are the SDK's;
this module keeps the CLI's own interface (plain dicts by plural and namespace, :class:`ApiError`,
:class:`Unreachable`, :class:`BadCA`) that the commands are written against.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final

import httpx

from nodus_schema import Status, status_for
from nodus_sdk import Client as SdkClient
from nodus_sdk import Config as SdkConfig
from nodus_sdk import NodusError
from nodus_sdk import errors as sdk_errors
from nodus_sdk.requesting import Call, collection_path, item_path, text
from nodus_sdk.requesting import project_path as sdk_project_path
from nodus_sdk.requesting import tls_context as sdk_tls_context

USER_AGENT: Final = "nodus-cli/0.1.0"
TIMEOUT_S: Final = 15.0
_REASONS: Final = sdk_errors.HTTP_REASONS
"""The reason a bare HTTP code stands for, when something other than the gateway answered (a proxy)."""
LOCAL_CA_HINT: Final = (
    "pass the CA that signed it with --ca or NODUS_CA "
    "(the local stack's is .nodus/ca.crt, named in .nodus/local.env)"
)


class ApiError(Exception):
    """The gateway answered with an error; ``status`` is its metav1.Status."""

    def __init__(self, status: Status) -> None:
        super().__init__(status.message)
        self.status = status

    @property
    def reason(self) -> str | None:
        return self.status.reason


class Unreachable(Exception):
    """No answer from the gateway at all (not running, wrong address, timeout)."""

    def __init__(self, server: str, detail: str, *, refused: bool) -> None:
        super().__init__(detail)
        self.server, self.detail, self.refused = server, detail, refused


class BadCA(Exception):
    """The CA file given to trust (--ca, NODUS_CA) cannot be read as PEM certificates."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(f"cannot use the CA file {path!r} (--ca or NODUS_CA): {detail}")
        self.path, self.detail = path, detail


def tls_context(ca: str | None) -> ssl.SSLContext:
    """The system's CAs, and those in ``ca`` (a PEM file) as well: a local CA never stops other servers
    from verifying."""
    with _translated(""):
        return sdk_tls_context(ca)


@contextmanager
def _translated(server: str) -> Iterator[None]:
    """The SDK's errors as the CLI's: Unreachable, BadCA, and every other NodusError as an ApiError."""
    try:
        yield
    except sdk_errors.Unreachable as e:
        detail = f"{e.detail}; {LOCAL_CA_HINT}" if e.tls and "not trusted" in e.detail else e.detail
        raise Unreachable(e.server or server, detail, refused=e.refused) from None
    except sdk_errors.BadCA as e:
        raise BadCA(e.path, e.detail) from None
    except NodusError as e:
        raise ApiError(e.status) from None


def _json_object(resp: httpx.Response) -> dict[str, Any]:
    body: Any = resp.json()
    if not isinstance(body, dict):
        raise NodusError(status_for("InternalError", f"the server sent {type(body).__name__}, not an object"))
    return body


class Client:
    def __init__(
        self,
        server: str,
        token: str | None,
        *,
        ca: str | None = None,
        timeout: float = TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.server = server
        config = SdkConfig(server=server.rstrip("/"), token=token, ca=ca)
        with _translated(server):
            self._sdk = SdkClient(config, timeout=timeout, transport=transport, user_agent=USER_AGENT)
        self._http = self._sdk._http

    def close(self) -> None:
        self._sdk.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @property
    def sdk(self) -> SdkClient:
        """The SDK client underneath: typed objects, watches, waits (nodus_sdk)."""
        return self._sdk

    @staticmethod
    def path(plural: str, namespace: str, name: str | None = None) -> str:
        return item_path(plural, namespace, name) if name else collection_path(plural, namespace)

    def create(self, plural: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._json("POST", self.path(plural, namespace), body=body)

    def get(self, plural: str, namespace: str, name: str) -> dict[str, Any]:
        return self._json("GET", self.path(plural, namespace, name))

    def list(self, plural: str, namespace: str, *, selector: str | None = None) -> dict[str, Any]:
        params = {"labelSelector": selector} if selector else {}
        return self._json("GET", self.path(plural, namespace), params=params)

    def delete(self, plural: str, namespace: str, name: str) -> dict[str, Any]:
        return self._json("DELETE", self.path(plural, namespace, name))

    # -- billing: a project's account, credits, usage and invoices ------------------------------------------
    @staticmethod
    def project_path(namespace: str, *rest: str) -> str:
        return sdk_project_path(namespace, *rest)

    def account(self, namespace: str) -> dict[str, Any]:
        return self._json("GET", self.project_path(namespace, "account"))

    def grant(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Grant (or revoke) credits; the body's id makes a retry the same grant."""
        return self._json("POST", self.project_path(namespace, "account", "grants"), body=body)

    def usage(self, namespace: str, month: str | None) -> dict[str, Any]:
        params = {"month": month} if month else {}
        return self._json("GET", self.project_path(namespace, "usage"), params=params)

    def invoice(self, namespace: str, month: str) -> dict[str, Any]:
        return self._json("GET", self.project_path(namespace, "invoices", month))

    # -- a Sweep's results (issue #8) --------------------------------------------------------------------
    def sweep_results(self, namespace: str, name: str) -> dict[str, Any]:
        """``GET .../sweeps/<name>/results``: the SweepResults of one Sweep, as JSON."""
        return self._json("GET", f"{self.path('sweeps', namespace, name)}/results")

    def csv(self, path: str, params: dict[str, str] | None = None) -> str:
        """The CSV form of a usage or invoice path (``format=csv``), as the server wrote it."""
        call = Call("GET", path, text, {**(params or {}), "format": "csv"}, headers={"Accept": "text/csv"})
        with _translated(self.server):
            return self._sdk.send(call)

    def log(self, namespace: str, job: str, params: dict[str, str], *, follow: bool) -> Iterator[bytes]:
        """A Job's log as it arrives (``GET .../jobs/<job>/log``); with ``follow`` no read timeout, since a
        quiet program may print nothing for minutes."""
        path = f"{self.path('jobs', namespace, job)}/log"
        call = Call("GET", path, text, params, headers={"Accept": "text/plain"})
        read = None if follow else self._http.timeout.read
        with _translated(self.server), self._sdk.stream(call, read_timeout=read) as resp:
            try:
                yield from resp.iter_bytes()
            except httpx.TransportError as e:
                raise sdk_errors.Unreachable(self.server, str(e) or type(e).__name__, refused=False) from None

    def _json(
        self, method: str, path: str, *, body: Any = None, params: dict[str, str] | None = None
    ) -> dict[str, Any]:
        read: Callable[[httpx.Response], dict[str, Any]] = _json_object
        if body is None:
            call = Call(method, path, read, params or {})
        else:
            headers = {"Content-Type": "application/json"}
            call = Call(method, path, read, params or {}, _json_bytes(body), headers)
        with _translated(self.server):
            return self._sdk.send(call)


def _json_bytes(body: Any) -> bytes:
    """A request body as JSON, as httpx's ``json=`` would write it."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def _status_of(resp: httpx.Response) -> Status:
    """The Status in an error response, or one made up from the HTTP code when the body is not one."""
    return sdk_errors.status_of(resp.status_code, resp.content, resp.reason_phrase)
