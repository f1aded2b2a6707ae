"""The requests the newer commands need that :class:`nodus_cli.client.Client` does not make (yet): paths of
cluster-scoped kinds, dry-run creates, patches, watch streams, a login check.

Kept apart from client.py on purpose: client.py is being re-implemented on the SDK with its public surface
unchanged, so this module uses only that surface (ApiError, Unreachable, tls_context) and its own httpx
client. When the SDK offers these calls, the commands switch to it and this module goes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final

import httpx

from nodus_cli.client import USER_AGENT, ApiError, Unreachable, tls_context
from nodus_cli.config import Config
from nodus_cli.kinds import Kind
from nodus_schema import API_VERSION, Status, status_for
from nodus_sdk import errors as sdk_errors

TIMEOUT_S: Final = 15.0
PATCH_TYPES: Final = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
}
"""``--type`` of ``nodus patch`` to the Content-Type the gateway reads (patching.py). The gateway applies a
strategic merge patch as a merge patch: Nodus kinds have no patch-merge keys, so every list is replaced."""


class Requests:
    """One httpx client for the server of ``config``; every method raises ApiError or Unreachable."""

    def __init__(self, config: Config, *, transport: httpx.BaseTransport | None = None) -> None:
        self.server = config.server
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if config.token:
            headers["Authorization"] = f"Bearer {config.token}"
        verify = tls_context(config.ca) if config.server.startswith("https:") else True
        self._http = httpx.Client(
            base_url=config.server, headers=headers, timeout=TIMEOUT_S, transport=transport, verify=verify
        )

    def __enter__(self) -> Requests:
        return self

    def __exit__(self, *_: object) -> None:
        self._http.close()

    @staticmethod
    def path(kind: Kind, namespace: str, name: str | None = None) -> str:
        """A namespaced kind's path in ``namespace``; a cluster-scoped kind's (offerings, nodes) without."""
        scope = f"/apis/{API_VERSION}/namespaces/{namespace}" if kind.namespaced else f"/apis/{API_VERSION}"
        base = f"{scope}/{kind.plural}"
        return f"{base}/{name}" if name else base

    # -- reads --------------------------------------------------------------------------------------------
    def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any]:
        return self.call("GET", self.path(kind, namespace, name))

    def list(self, kind: Kind, namespace: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        return self.call("GET", self.path(kind, namespace), params=dict(params or {}))

    def watch(self, kind: Kind, namespace: str, params: Mapping[str, str]) -> Iterator[dict[str, Any]]:
        """The events of ``?watch=true`` (newline-delimited JSON) as they arrive, until the server ends
        the stream. No read timeout: a quiet namespace sends nothing for minutes."""
        timeout = httpx.Timeout(TIMEOUT_S, read=None)
        query = {**params, "watch": "true"}
        with (
            transport_errors(self.server),
            self._http.stream("GET", self.path(kind, namespace), params=query, timeout=timeout) as resp,
        ):
            if not resp.is_success:
                resp.read()
                raise ApiError(status_of(resp))
            for line in resp.iter_lines():
                if line.strip():
                    event = json.loads(line)
                    if isinstance(event, dict):
                        yield event

    # -- writes -------------------------------------------------------------------------------------------
    def dry_run_create(self, kind: Kind, namespace: str, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """``POST ...?dryRun=All``: the object as it would be stored, with ``status.estimate``, and the
        ETag that binds a later create to this estimate (If-Match)."""
        with transport_errors(self.server):
            resp = self._http.post(self.path(kind, namespace), params={"dryRun": "All"}, json=body)
        return _body(resp), resp.headers.get("etag", "")

    def patch(self, kind: Kind, namespace: str, name: str, patch: Any, patch_type: str) -> dict[str, Any]:
        content = json.dumps(patch).encode()
        headers = {"Content-Type": PATCH_TYPES[patch_type]}
        return self.call("PATCH", self.path(kind, namespace, name), content=content, headers=headers)

    def call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        with transport_errors(self.server):
            resp = self._http.request(method, path, **kwargs)
        return _body(resp)


def _body(resp: httpx.Response) -> dict[str, Any]:
    if not resp.is_success:
        raise ApiError(status_of(resp))
    body: Any = resp.json()
    if not isinstance(body, dict):
        raise ApiError(status_for("InternalError", f"the server sent {type(body).__name__}, not an object"))
    return body


@contextmanager
def transport_errors(server: str) -> Iterator[None]:
    """httpx's errors as :class:`Unreachable`, with why the gateway did not answer."""
    try:
        yield
    except httpx.ConnectError as e:
        text = str(e)
        if "CERTIFICATE_VERIFY_FAILED" in text:
            detail = (
                f"its TLS certificate is not trusted ({text}); pass the CA that signed it with --ca or "
                "NODUS_CA (the local stack's is .nodus/ca.crt, named in .nodus/local.env)"
            )
            raise Unreachable(server, detail, refused=False) from None
        if "SSL" in text or "TLS" in text:
            raise Unreachable(server, f"the TLS handshake failed ({text})", refused=False) from None
        raise Unreachable(server, text or "connection refused", refused=True) from None
    except httpx.TimeoutException:
        raise Unreachable(server, "it did not answer in time", refused=False) from None
    except httpx.TransportError as e:
        raise Unreachable(server, str(e) or type(e).__name__, refused=False) from None


def status_of(resp: httpx.Response) -> Status:
    """The Status in an error response, or one made from the HTTP code when something else answered."""
    return sdk_errors.status_of(resp.status_code, resp.content, resp.reason_phrase)
