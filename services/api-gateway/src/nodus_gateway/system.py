"""Health and version endpoints, open without a token: /healthz, /livez, /readyz, /version."""

from __future__ import annotations

import platform
import sys
from collections.abc import Callable
from typing import Final

from fastapi import APIRouter
from starlette.responses import PlainTextResponse, Response

from nodus_gateway.responding import ApiError, object_response

VERSION: Final = "v0.1.0-nodus"
ROOT_PATHS: Final = (
    "/api",
    "/apis",
    "/apis/nodus.dev",
    "/apis/nodus.dev/v1",
    "/healthz",
    "/livez",
    "/openapi/v2",
    "/openapi/v3",
    "/readyz",
    "/ui/",
    "/version",
)
"""What ``GET /`` lists, as Kubernetes' root does (``kubectl get --raw /``)."""

_ARCH: Final = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def version_info() -> dict[str, str]:
    """Kubernetes' version.Info, which ``kubectl version`` reads (gitVersion above all)."""
    machine = platform.machine().lower()
    return {
        "major": "0",
        "minor": "1",
        "gitVersion": VERSION,
        "gitCommit": "",
        "gitTreeState": "",
        "buildDate": "",
        "goVersion": f"python{sys.version_info.major}.{sys.version_info.minor}",
        "compiler": sys.implementation.name,
        "platform": f"{sys.platform}/{_ARCH.get(machine, machine)}",
    }


def system_router(ready: Callable[[], bool]) -> APIRouter:
    router = APIRouter(tags=["system"])

    @router.get("/healthz")
    @router.get("/livez")
    async def healthz() -> Response:
        # Plain "ok", as Kubernetes answers (`kubectl get --raw /healthz`).
        return PlainTextResponse("ok")

    @router.get("/readyz")
    async def readyz() -> Response:
        if not ready():
            raise ApiError.of(
                "ServiceUnavailable", "not ready: the gateway is not connected to NATS", retry_after=1
            )
        return PlainTextResponse("ok")

    @router.get("/version")
    async def version() -> Response:
        return object_response(version_info())

    @router.get("/")
    async def root() -> Response:
        # Kubernetes' root: the paths this server serves (a browser is sent to the web view before this).
        return object_response({"paths": list(ROOT_PATHS)})

    return router
