"""The HTTP server under the API: uvicorn, run as a task inside the service's own event loop.

The service process already owns the loop, the NATS connection and the signals, so uvicorn is started
with ``serve(sockets=...)`` rather than ``uvicorn.run``: it must not install its own SIGTERM handler (the
service stops it, in order, after it has stopped taking requests), and binding the socket here turns a
busy port into an ordinary ``OSError`` instead of uvicorn's ``sys.exit`` from inside a task.

Given a certificate and key it serves HTTPS: kubectl (client-go) sends a kubeconfig's bearer token only
over TLS, so the local stack runs the gateway this way with a certificate from its own local CA.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator, Sequence
from typing import Any

import uvicorn

GRACEFUL_SHUTDOWN_S = 10.0


TICK_S = 1.0
"""How often the server's own loop wakes (the Date header, a request limit): uvicorn's wakes every 0.1 s,
ten wakeups a second that were most of an idle gateway's CPU (issue #23)."""


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._exit = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # The Service's loop handles SIGTERM/SIGINT and calls ApiServer.stop.
        yield

    def exit(self) -> None:
        """Stop serving now (what uvicorn's signal handler would do), without waiting for the next tick."""
        self.should_exit = True
        self._exit.set()

    async def main_loop(self) -> None:
        """uvicorn's loop, woken once a second and at once by :meth:`exit`. ``on_tick`` refreshes the Date
        header on ticks that are multiples of ten (once a second at uvicorn's 0.1 s): counting in tens
        keeps it fresh on every tick."""
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 10) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exit.wait(), TICK_S)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket; port 0 takes a free one (tests read it back from ``ApiServer.port``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


class ApiServer:
    """Serve an ASGI app on ``host:port`` until :meth:`stop`; over HTTPS when given a certificate and key."""

    def __init__(
        self,
        app: Any,
        host: str,
        port: int,
        *,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
        trusted_proxies: Sequence[str] = (),
    ) -> None:
        """``trusted_proxies``: addresses or CIDRs whose X-Forwarded-For and X-Forwarded-Proto are believed
        (the client is then the rightmost forwarded address that is not a trusted proxy). None by default,
        not even 127.0.0.1 as uvicorn's own default would: the client address is what failed
        authentications are limited by (authlimits.py), and a header any caller can send must not choose
        it."""
        if (ssl_certfile is None) != (ssl_keyfile is None):
            raise ValueError("HTTPS needs both ssl_certfile and ssl_keyfile")
        self.app, self.host, self.port = app, host, port
        self.ssl_certfile, self.ssl_keyfile = ssl_certfile, ssl_keyfile
        self.trusted_proxies = tuple(trusted_proxies)
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "https" if self.ssl_certfile else "http"
        return f"{scheme}://{host}:{self.port}"

    @property
    def serving(self) -> bool:
        return (
            self._server is not None
            and self._server.started
            and self._task is not None
            and not self._task.done()
        )

    async def start(self, deadline_s: float = 10.0) -> None:
        try:
            sock = bind(self.host, self.port)
        except OSError as e:
            raise OSError(e.errno, f"cannot listen on {self.host}:{self.port}: {e.strerror}") from e
        self.port = int(sock.getsockname()[1])
        config = uvicorn.Config(
            self.app,
            lifespan="off",
            log_config=None,  # keep the service's JSON logging
            access_log=False,  # the app logs each request itself, with its request id
            server_header=False,
            timeout_graceful_shutdown=int(GRACEFUL_SHUTDOWN_S),
            ssl_certfile=self.ssl_certfile,
            ssl_keyfile=self.ssl_keyfile,
            proxy_headers=bool(self.trusted_proxies),
            forwarded_allow_ips=list(self.trusted_proxies) or None,
        )
        # Loaded here rather than inside the serving task, so that a bad certificate or key fails the start
        # with its own error, before anything is served.
        try:
            config.load()
        except BaseException:
            sock.close()
            raise
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="nodus-gateway-http")
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline_s
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise RuntimeError("the HTTP server stopped before it started")
            if loop.time() > end:
                raise TimeoutError(f"the HTTP server did not start within {deadline_s}s")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self._server is None or self._task is None:
            return
        self._server.exit()
        try:
            await asyncio.wait_for(self._task, GRACEFUL_SHUTDOWN_S + 5)
        finally:
            self._server = self._task = None
