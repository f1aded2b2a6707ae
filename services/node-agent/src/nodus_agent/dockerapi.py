"""A small async client of the Docker Engine API over a unix socket (Docker, or podman's compatible service).

Only what the container runtime (:mod:`nodus_agent.containers`) needs: ping and version, image exists and
pull (with registry credentials), container create / start / wait / inspect / stop / kill / remove / list,
and logs demultiplexed into lines. Written on aiohttp (a pinned dependency of the agent) rather than
docker-py (synchronous: every call would need a thread, and ``wait`` holds one for the whole run) or
aiodocker (not a pinned dependency); ADR-0018 has the reasons.

Errors form a small hierarchy, so callers decide by type rather than by status code:

* :class:`NotFound` (404), :class:`Conflict` (409, and podman's 500s that mean the same: a name in use, a
  container in the wrong state);
* :class:`EngineUnavailable`: no engine answers at the socket (missing, refused, or it went away
  mid-request); the message names the socket and how to start an engine;
* :class:`DockerError`: any other refusal, with the engine's status and message.

The engine answers the same routes under every API version prefix it supports; ``v1.41`` (Docker 20.10,
podman 4) is the default because it is what both engines here speak, and the runtime uses nothing newer.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import re
import struct
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp

DEFAULT_API_VERSION = "v1.41"
DEFAULT_SOCKET = "/var/run/docker.sock"

STDOUT, STDERR = "stdout", "stderr"
# Frame stream ids: 0 stdin (written back by some engines for a TTY-less attach), 1 stdout, 2 stderr,
# 3 the engine's own "systemerr" (Docker writes it when it cannot read the log).
_STREAMS = {0: STDOUT, 1: STDOUT, 2: STDERR, 3: STDERR}
_HEADER = struct.Struct(">BxxxL")
_CLIENT_BOUND = -1.0  # "the client's own timeout", as a request's timeout_s (None means unbounded)
# The engine is not there (refused, no socket) or went away mid-answer (a truncated body).
_GONE = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)

# podman answers some conflicts with 500 and the reason in the message; Docker says 409.
_CONFLICT_HINTS = ("already in use", "container state improper", "is not running", "is already")


# -- errors -----------------------------------------------------------------------------------------------
class DockerError(Exception):
    """The engine refused a request: ``status`` (HTTP; 0 when no answer came) and its ``message``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"container engine: {message} (HTTP {status})" if status else message)
        self.status, self.message = status, message


class NotFound(DockerError):
    """No such container or image."""


class Conflict(DockerError):
    """A name already in use, or a container in a state the request does not fit."""


class EngineUnavailable(DockerError):
    """No engine answers at the socket: it is missing, refuses connections, or went away mid-request."""

    def __init__(self, socket_path: str, cause: BaseException | str) -> None:
        super().__init__(
            0,
            f"no container engine answers at unix://{socket_path} ({cause}). Start one: "
            f"`systemctl start docker`, or podman's Docker-compatible service: "
            f"`podman --runtime runc system service --time=0 unix://{socket_path}`; "
            "or point the agent at the right socket (DOCKER_HOST)",
        )
        self.socket_path = socket_path


INSPECT_TRIES: Final = 5


def _error(status: int, body: bytes) -> DockerError:
    try:
        message = str(json.loads(body).get("message") or "")
    except (ValueError, AttributeError):
        message = ""
    message = message or body.decode(errors="replace").strip() or f"HTTP {status}"
    # podman answers a wait on a container removed meanwhile with 500 "... no such container"
    if status == 404 or (status == 500 and "no such container" in message):
        return NotFound(status, message)
    if status == 409 or (status == 500 and any(h in message for h in _CONFLICT_HINTS)):
        return Conflict(status, message)
    return DockerError(status, message)


# -- registry credentials ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class RegistryAuth:
    """Credentials for one registry (from an image pull secret), sent as ``X-Registry-Auth``."""

    username: str
    password: str = field(repr=False)
    server_address: str = ""

    def header(self) -> str:
        """The header value the Engine API wants: base64url of a JSON object."""
        doc = {"username": self.username, "password": self.password, "serveraddress": self.server_address}
        return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode()


def split_image(ref: str) -> tuple[str, str]:
    """``(fromImage, tag)`` for ``POST /images/create``: the engine pulls *every* tag of a repository
    when the tag is empty, so a reference without one is pinned to ``latest`` as ``docker pull`` does.
    A digest (``repo@sha256:...``) goes whole in ``fromImage`` with no tag."""
    if "@" in ref:
        return ref, ""
    name, _, last = ref.rpartition("/")
    if ":" in last:  # a ':' before the last '/' is a registry port, not a tag
        repo, _, tag = last.partition(":")
        return f"{name}/{repo}" if name else repo, tag
    return ref, "latest"


# -- logs -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LogLine:
    """One line of a container's output: ``stream`` stdout or stderr, ``time`` (RFC 3339, nine fraction
    digits, UTC; None without timestamps) and ``text`` without its newline."""

    stream: str
    time: str | None
    text: str


_TS = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)")


def normalize_time(stamp: str) -> str:
    """An engine timestamp as fixed-width UTC RFC 3339 with nanoseconds (``…T13:27:14.602733152Z``).

    Docker writes RFC3339Nano with trailing zeros trimmed, podman whole seconds (``…T13:27:14Z``); one
    width for both keeps a log file's lines sorted as text and comparable as strings.
    """
    m = _TS.fullmatch(stamp)
    if m is None:
        raise ValueError(f"not an RFC 3339 timestamp: {stamp!r}")
    base, fraction, zone = m.group(1), (m.group(2) or "").ljust(9, "0"), m.group(3)
    if zone not in ("Z", "+00:00", "-00:00"):
        parsed = dt.datetime.fromisoformat(base + zone).astimezone(dt.UTC)
        base = parsed.strftime("%Y-%m-%dT%H:%M:%S")
    return f"{base}.{fraction}Z"


def unix_time(stamp: str) -> str:
    """A normalized timestamp as the ``seconds.nanoseconds`` form the logs ``since`` parameter takes."""
    norm = normalize_time(stamp)
    base, fraction = norm[:19], norm[20:29]
    seconds = int(dt.datetime.fromisoformat(base).replace(tzinfo=dt.UTC).timestamp())
    return f"{seconds}.{fraction}"


class LogDemuxer:
    """Turns the multiplexed log stream into lines, fed with whatever chunks the connection delivers.

    The stream is frames: an 8-byte header (stream id, three zero bytes, big-endian payload size) and the
    payload. A chunk may end inside a header or a payload, so bytes are buffered until a frame is whole.
    Engines split long lines into several frames (podman at 8 KiB), and with timestamps every frame,
    continuation or not, starts with its own ``<time> ``: a frame whose payload does not end in a newline
    is held per stream and the next frame of that stream continues it, its timestamp dropped (a line's
    time is the time of its first part).
    """

    def __init__(self, timestamps: bool) -> None:
        self.timestamps = timestamps
        self._buf = bytearray()
        self._partial: dict[str, tuple[str | None, bytearray]] = {}

    def feed(self, data: bytes) -> list[LogLine]:
        """The lines completed by ``data``."""
        self._buf += data
        lines: list[LogLine] = []
        while len(self._buf) >= _HEADER.size:
            stream_id, size = _HEADER.unpack_from(self._buf)
            end = _HEADER.size + size
            if len(self._buf) < end:
                break
            payload = bytes(self._buf[_HEADER.size : end])
            del self._buf[:end]
            self._frame(_STREAMS.get(stream_id, STDERR), payload, lines)
        return lines

    def close(self) -> list[LogLine]:
        """At the end of the stream: a last line without its newline still counts."""
        lines = [self._line(stream, stamp, bytes(text)) for stream, (stamp, text) in self._partial.items()]
        self._partial.clear()
        return lines

    def _frame(self, stream: str, payload: bytes, out: list[LogLine]) -> None:
        stamp: str | None = None
        if self.timestamps:
            head, sep, rest = payload.partition(b" ")
            if sep:
                try:
                    stamp, payload = normalize_time(head.decode()), rest
                except (ValueError, UnicodeDecodeError):
                    stamp = None  # not a timestamp after all: keep the payload whole
        pending = self._partial.pop(stream, None)
        if pending is not None:
            stamp, payload = pending[0], bytes(pending[1]) + payload
        *complete, tail = payload.split(b"\n")
        out.extend(self._line(stream, stamp, text) for text in complete)
        if tail:
            self._partial[stream] = (stamp, bytearray(tail))

    @staticmethod
    def _line(stream: str, stamp: str | None, text: bytes) -> LogLine:
        return LogLine(stream=stream, time=stamp, text=text.decode("utf-8", errors="replace"))


# -- the client -------------------------------------------------------------------------------------------
def socket_from_docker_host(docker_host: str | None) -> str:
    """The socket path of a ``DOCKER_HOST`` value (``unix:///run/docker.sock``); the default when unset."""
    if not docker_host:
        return DEFAULT_SOCKET
    if not docker_host.startswith("unix://"):
        raise ValueError(
            f"DOCKER_HOST={docker_host!r}: the node agent speaks to its engine over a unix socket only "
            "(unix:///var/run/docker.sock); TCP engines are not supported"
        )
    return docker_host.removeprefix("unix://")


class DockerAPI:
    """One engine at ``socket_path``. Use as ``async with DockerAPI(path) as api`` or call :meth:`close`.

    ``timeout_s`` bounds ordinary requests; ``wait`` and followed logs are unbounded (they last as long as
    the container runs) and ``stop`` allows its grace period on top.
    """

    def __init__(
        self, socket_path: str | Path, api_version: str = DEFAULT_API_VERSION, timeout_s: float = 60.0
    ) -> None:
        self.socket_path = str(socket_path)
        self.prefix = "/" + api_version.strip("/")
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> DockerAPI:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        # Created on first use: an aiohttp session belongs to the running event loop.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=self.socket_path),
                base_url="http://docker",  # the host is ignored over a unix socket; the header must exist
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            )
        return self._session

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = _CLIENT_BOUND,
        ok: Sequence[int] = (200, 201, 204, 304),
    ) -> tuple[int, bytes]:
        """One request; ``timeout_s`` None means unbounded, the default the client's own bound."""
        timeout = aiohttp.ClientTimeout(total=self.timeout_s if timeout_s == _CLIENT_BOUND else timeout_s)
        try:
            async with self._http().request(
                method,
                self.prefix + path,
                params=params,
                json=body,
                headers=headers,
                timeout=timeout,
            ) as response:
                data = await response.read()
                status = response.status
        except _GONE as e:
            raise EngineUnavailable(self.socket_path, e) from e
        except TimeoutError as e:  # aiohttp's own bound (a cancellation from outside is not one)
            raise EngineUnavailable(self.socket_path, f"no answer within {timeout.total}s") from e
        if status not in ok:
            raise _error(status, data)
        return status, data

    async def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        _, data = await self._request(method, path, **kwargs)
        return json.loads(data) if data else None

    # -- engine -------------------------------------------------------------------------------------------
    async def ping(self) -> bool:
        """True when the engine answers; False (never an error) when none does."""
        try:
            await self._request("GET", "/_ping", timeout_s=5.0)
        except DockerError:
            return False
        return True

    async def version(self) -> dict[str, Any]:
        """The engine's ``/version`` (``ApiVersion``, ``Version``, ``Components``: podman names itself)."""
        result: dict[str, Any] = await self._json("GET", "/version")
        return result

    # -- images -------------------------------------------------------------------------------------------
    async def image_exists(self, ref: str) -> bool:
        try:
            await self._request("GET", f"/images/{ref}/json")
        except NotFound:
            return False
        return True

    async def pull(self, ref: str, auth: RegistryAuth | None = None, timeout_s: float | None = None) -> None:
        """Pull ``ref``; DockerError with the registry's reason if it fails.

        The engine answers 200 at once and reports progress, and failure, as a JSON stream: a pull has
        failed only if a line of that stream carries ``error``.
        """
        image, tag = split_image(ref)
        params = {"fromImage": image, **({"tag": tag} if tag else {})}
        headers = {"X-Registry-Auth": auth.header()} if auth else None
        try:
            _, data = await self._request(
                "POST", "/images/create", params=params, headers=headers, timeout_s=timeout_s
            )
        except EngineUnavailable as e:
            if isinstance(e.__cause__, TimeoutError):  # a slow registry, not a missing engine
                raise DockerError(0, f"pulling {ref}: not done within {timeout_s}s") from e
            raise
        for raw in data.splitlines():
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("error"):
                detail = event.get("errorDetail") or {}
                message = str(detail.get("message") or event["error"])
                raise DockerError(500, f"pulling {ref}: {message}")

    # -- containers ---------------------------------------------------------------------------------------
    async def create(self, name: str, body: Mapping[str, Any]) -> str:
        """Create container ``name``; its id. Conflict if the name is taken."""
        result = await self._json("POST", "/containers/create", params={"name": name}, body=dict(body))
        return str(result["Id"])

    async def start(self, cid: str) -> bool:
        """Start; False if it already ran (304)."""
        status, _ = await self._request("POST", f"/containers/{cid}/start")
        return status != 304

    async def wait(self, cid: str) -> int:
        """Block until the container is not running (at once if it is not); its exit code.

        NotFound when it is removed meanwhile: podman then answers 200 with a made-up ``StatusCode`` 0
        and the removal in ``Error``, which must not pass for a clean exit.
        """
        result = await self._json("POST", f"/containers/{cid}/wait", timeout_s=None)
        error = (result.get("Error") or {}).get("Message") if isinstance(result, dict) else None
        if error:
            if any(hint in error for hint in ("no such container", "does not exist", "been removed")):
                raise NotFound(404, error)
            raise DockerError(500, f"waiting for {cid}: {error}")
        return int(result["StatusCode"])

    async def inspect(self, cid: str) -> dict[str, Any]:
        """``/containers/{id}/json``; NotFound when there is no such container.

        podman answers 500 "read /proc/<pid>/cgroup: no such process" when the inspect lands while the
        container's process exits: asked again a moment later it answers."""
        for attempt in range(INSPECT_TRIES):
            try:
                result: dict[str, Any] = await self._json("GET", f"/containers/{cid}/json")
                return result
            except DockerError as e:
                if (
                    type(e) is not DockerError
                    or "no such process" not in e.message
                    or attempt == INSPECT_TRIES - 1
                ):
                    raise
                await asyncio.sleep(0.05 * (attempt + 1))
        raise AssertionError("unreachable")

    async def stop(self, cid: str, grace_s: float) -> bool:
        """SIGTERM (the image's StopSignal), SIGKILL after ``grace_s``; False if it was not running."""
        grace = max(0, round(grace_s))
        status, _ = await self._request(
            "POST", f"/containers/{cid}/stop", params={"t": str(grace)}, timeout_s=self.timeout_s + grace
        )
        return status != 304

    async def kill(self, cid: str, signal: str = "SIGKILL") -> bool:
        """Send ``signal`` to the container's main process; False if it is not running."""
        try:
            await self._request("POST", f"/containers/{cid}/kill", params={"signal": signal})
        except Conflict:
            return False
        return True

    async def remove(self, cid: str, force: bool = True, volumes: bool = True) -> bool:
        """Remove (``force`` kills it first, ``volumes`` drops its anonymous volumes); False if absent."""
        params = {"force": _flag(force), "v": _flag(volumes)}
        try:
            await self._request("DELETE", f"/containers/{cid}", params=params)
        except NotFound:
            return False
        return True

    async def list_containers(self, labels: Mapping[str, str], all: bool = True) -> list[dict[str, Any]]:
        """Containers carrying every one of ``labels`` (running only unless ``all``)."""
        filters = json.dumps({"label": [f"{k}={v}" for k, v in labels.items()]})
        result = await self._json("GET", "/containers/json", params={"all": _flag(all), "filters": filters})
        return list(result or [])

    async def logs(
        self,
        cid: str,
        *,
        follow: bool = False,
        timestamps: bool = True,
        since: str | None = None,
        tail: int | None = None,
    ) -> AsyncGenerator[list[LogLine], None]:
        """The container's stdout and stderr as batches of lines (one batch per chunk received).

        ``follow`` keeps the stream open until the container stops; ``since`` is a ``seconds.nanos``
        Unix time (see :func:`unix_time`) from which lines are returned, ``tail`` the number of last
        lines to return. The container must have been
        created without a TTY (the runtime never asks for one): only then is the stream multiplexed.
        """
        params = {"stdout": "1", "stderr": "1", "follow": _flag(follow), "timestamps": _flag(timestamps)}
        if since is not None:
            params["since"] = since
        if tail is not None:
            params["tail"] = str(tail)
        demux = LogDemuxer(timestamps)
        # A whole log may take long to read, and a followed quiet program says nothing for hours: bound
        # the silence of a plain read, never the total.
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None if follow else self.timeout_s)
        try:
            async with self._http().get(
                f"{self.prefix}/containers/{cid}/logs", params=params, timeout=timeout
            ) as response:
                if response.status != 200:
                    raise _error(response.status, await response.read())
                async for chunk in response.content.iter_any():
                    lines = demux.feed(chunk)
                    if lines:
                        yield lines
        except _GONE as e:
            raise EngineUnavailable(self.socket_path, e) from e
        except TimeoutError as e:
            raise EngineUnavailable(self.socket_path, f"logs silent for {self.timeout_s}s") from e
        rest = demux.close()
        if rest:
            yield rest


def _flag(value: bool) -> str:
    return "1" if value else "0"
