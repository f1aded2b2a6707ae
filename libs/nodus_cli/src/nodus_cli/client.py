"""A small synchronous client of the nodus.dev/v1 API: JSON in and out, errors as the server's Status."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

import httpx
import msgspec

from nodus_schema import API_VERSION, Status, status_for

USER_AGENT: Final = "nodus-cli/0.1.0"
TIMEOUT_S: Final = 15.0

# The reason a bare HTTP code stands for, when something other than the gateway answered (a proxy).
_REASONS: Final = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    413: "RequestEntityTooLarge",
    422: "Invalid",
    429: "TooManyRequests",
    503: "ServiceUnavailable",
    504: "Timeout",
}


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
    ctx = ssl.create_default_context()
    if ca:
        try:
            ctx.load_verify_locations(cafile=ca)
        except (OSError, ValueError) as e:  # ssl.SSLError is an OSError
            raise BadCA(ca, getattr(e, "strerror", None) or str(e)) from None
    return ctx


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
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.server = server
        verify = tls_context(ca) if server.startswith("https:") else True
        self._http = httpx.Client(
            base_url=server, headers=headers, timeout=timeout, transport=transport, verify=verify
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @staticmethod
    def path(plural: str, namespace: str, name: str | None = None) -> str:
        base = f"/apis/{API_VERSION}/namespaces/{namespace}/{plural}"
        return f"{base}/{name}" if name else base

    def create(self, plural: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", self.path(plural, namespace), json=body)

    def get(self, plural: str, namespace: str, name: str) -> dict[str, Any]:
        return self._call("GET", self.path(plural, namespace, name))

    def list(self, plural: str, namespace: str, *, selector: str | None = None) -> dict[str, Any]:
        params = {"labelSelector": selector} if selector else None
        return self._call("GET", self.path(plural, namespace), params=params)

    def delete(self, plural: str, namespace: str, name: str) -> dict[str, Any]:
        return self._call("DELETE", self.path(plural, namespace, name))

    # -- billing: a project's account, credits, usage and invoices ------------------------------------------
    @staticmethod
    def project_path(namespace: str, *rest: str) -> str:
        return "/".join([f"/apis/{API_VERSION}/namespaces/{namespace}", *rest])

    def account(self, namespace: str) -> dict[str, Any]:
        return self._call("GET", self.project_path(namespace, "account"))

    def grant(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Grant (or revoke) credits; the body's id makes a retry the same grant."""
        return self._call("POST", self.project_path(namespace, "account", "grants"), json=body)

    def usage(self, namespace: str, month: str | None) -> dict[str, Any]:
        return self._call("GET", self.project_path(namespace, "usage"), params=_month(month))

    def invoice(self, namespace: str, month: str) -> dict[str, Any]:
        return self._call("GET", self.project_path(namespace, "invoices", month))

    # -- a Sweep's results (issue #8) --------------------------------------------------------------------
    def sweep_results(self, namespace: str, name: str) -> dict[str, Any]:
        """``GET .../sweeps/<name>/results``: the SweepResults of one Sweep, as JSON."""
        return self._call("GET", f"{self.path('sweeps', namespace, name)}/results")

    def csv(self, path: str, params: dict[str, str] | None = None) -> str:
        """The CSV form of a usage or invoice path (``format=csv``), as the server wrote it."""
        with _transport_errors(self.server):
            resp = self._http.get(
                path, params={**(params or {}), "format": "csv"}, headers={"Accept": "text/csv"}
            )
        if not resp.is_success:
            raise ApiError(_status_of(resp))
        return resp.text

    def log(self, namespace: str, job: str, params: dict[str, str], *, follow: bool) -> Iterator[bytes]:
        """A Job's log as it arrives (``GET .../jobs/<job>/log``); with ``follow`` no read timeout, since a
        quiet program may print nothing for minutes."""
        timeout = httpx.Timeout(self._http.timeout.connect, read=None) if follow else self._http.timeout
        path = f"{self.path('jobs', namespace, job)}/log"
        with (
            _transport_errors(self.server),
            self._http.stream(
                "GET", path, params=params, timeout=timeout, headers={"Accept": "text/plain"}
            ) as resp,
        ):
            if not resp.is_success:
                resp.read()
                raise ApiError(_status_of(resp))
            yield from resp.iter_bytes()

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            resp = self._http.request(method, path, **kwargs)
        except httpx.ConnectError as e:
            if _tls_failure(e):
                raise Unreachable(self.server, _tls_detail(e), refused=False) from None
            raise Unreachable(self.server, str(e) or "connection refused", refused=True) from None
        except httpx.TimeoutException:
            raise Unreachable(self.server, "it did not answer in time", refused=False) from None
        except httpx.TransportError as e:
            raise Unreachable(self.server, str(e) or type(e).__name__, refused=False) from None
        if resp.is_success:
            body: Any = resp.json()
            if not isinstance(body, dict):
                raise ApiError(
                    status_for("InternalError", f"the server sent {type(body).__name__}, not an object")
                )
            return body
        raise ApiError(_status_of(resp))


def _month(month: str | None) -> dict[str, str] | None:
    return {"month": month} if month else None


@contextmanager
def _transport_errors(server: str) -> Iterator[None]:
    """httpx's errors as :class:`Unreachable`, saying why the gateway did not answer (as ``_call`` does)."""
    try:
        yield
    except httpx.ConnectError as e:
        if _tls_failure(e):
            raise Unreachable(server, _tls_detail(e), refused=False) from None
        raise Unreachable(server, str(e) or "connection refused", refused=True) from None
    except httpx.TimeoutException:
        raise Unreachable(server, "it did not answer in time", refused=False) from None
    except httpx.TransportError as e:
        raise Unreachable(server, str(e) or type(e).__name__, refused=False) from None


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
        return (
            f"its TLS certificate is not trusted ({text}); pass the CA that signed it with --ca or NODUS_CA "
            "(the local stack's is .nodus/ca.crt, named in .nodus/local.env)"
        )
    return f"the TLS handshake failed ({text})"


def _status_of(resp: httpx.Response) -> Status:
    """The Status in an error response, or one made up from the HTTP code when the body is not one."""
    try:
        status = msgspec.json.decode(resp.content, type=Status)
    except (msgspec.DecodeError, msgspec.ValidationError):
        status = None
    if status is not None and status.kind == "Status" and status.reason:
        return status
    reason = _REASONS.get(resp.status_code, "InternalError")
    text = resp.text.strip()[:200] or resp.reason_phrase
    return status_for(reason, f"the server answered {resp.status_code}: {text}")
