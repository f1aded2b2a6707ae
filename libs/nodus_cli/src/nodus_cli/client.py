"""A small synchronous client of the nodus.dev/v1 API: JSON in and out, errors as the server's Status."""

from __future__ import annotations

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


class Client:
    def __init__(
        self,
        server: str,
        token: str | None,
        *,
        timeout: float = TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.server = server
        self._http = httpx.Client(base_url=server, headers=headers, timeout=timeout, transport=transport)

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

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            resp = self._http.request(method, path, **kwargs)
        except httpx.ConnectError as e:
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
