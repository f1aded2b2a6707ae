"""Whether a git repository and ref exist, asked with ``git ls-remote`` (ADR-0036, admission of
``spec.source.git``).

The gateway runs git as a subprocess with an environment of its own making: no user or system config
(``GIT_CONFIG_GLOBAL``/``GIT_CONFIG_SYSTEM`` point at /dev/null), no prompt (``GIT_TERMINAL_PROMPT=0``),
https only (``GIT_ALLOW_PROTOCOL``), the CA bundle of ``NODUS_GATEWAY_GIT_CA_BUNDLE`` when set, and a
deadline (``NODUS_GATEWAY_GIT_TIMEOUT_S``, 10 s). A private repository's token goes to git only as an
``http.extraHeader`` given through ``GIT_CONFIG_COUNT``/``KEY``/``VALUE`` in the environment: never in the
URL, an argument or a file, and git's stderr is masked with it before anything quotes it. With a token,
redirects are not followed, so the header never reaches a host the Connection does not name.

Answers are kept for ``NODUS_GATEWAY_GIT_CACHE_S`` (30 s) per (URL, ref, credential), and concurrent asks
of one key share one git process: a burst of creates of one Sweep runs git once.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import re
import signal
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Final
from urllib.parse import urlsplit

import msgspec

from nodus_kit.configuring import Env

DEFAULT_GIT_HOST: Final = "https://github.com"
DEFAULT_TIMEOUT_S: Final = 10.0
DEFAULT_CACHE_S: Final = 30.0
DEFAULT_USERNAME: Final = "x-access-token"
"""The user name GitHub, Gitea and GitLab accept with a token as the password."""
COMMIT_ID: Final = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_ABBREVIATED: Final = re.compile(r"[0-9a-f]{7,39}")
_CACHE_MAX: Final = 4096
_STDERR_MAX: Final = 400


PUBLIC_FORGES: Final = ("github.com", "gitlab.com", "bitbucket.org", "codeberg.org", "huggingface.co")
"""The hosts an https:// repository may name when ``NODUS_GIT_ALLOWED_HOSTS`` is not set, besides the
cluster's own git host."""
ANY_HOST: Final = "*"


def _https_base(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme != "https" or not parts.hostname or parts.username or parts.query or parts.fragment:
        raise ValueError("give the https:// URL of a git host, such as https://github.com")
    return text.rstrip("/")


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError("give a number of seconds above 0")
    return value


def _hosts(text: str) -> tuple[str, ...]:
    hosts = tuple(h.strip().lower() for h in text.split(",") if h.strip())
    for h in hosts:
        if h != ANY_HOST and ("/" in h or "@" in h or " " in h):
            raise ValueError(
                f"{h!r} is not a host: give host names (host or host:port), comma-separated, or *"
            )
    return hosts


class GitSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Read once at the gateway's start (nodus_gateway.config), like every setting of a service."""

    host: Annotated[str, Env("NODUS_GIT_HOST", parse=_https_base)] = DEFAULT_GIT_HOST
    """Where ``owner/name`` repositories live (the agents' setting too)."""
    ca_bundle: Annotated[str | None, Env("NODUS_GATEWAY_GIT_CA_BUNDLE")] = None
    timeout_s: Annotated[float, Env("NODUS_GATEWAY_GIT_TIMEOUT_S", parse=_seconds)] = DEFAULT_TIMEOUT_S
    cache_s: Annotated[float, Env("NODUS_GATEWAY_GIT_CACHE_S", unit="seconds")] = DEFAULT_CACHE_S
    allowed_hosts: Annotated[tuple[str, ...], Env("NODUS_GIT_ALLOWED_HOSTS", parse=_hosts)] = ()
    """The hosts (``host`` or ``host:port``) an https:// repository may name; empty: the git host's and
    :data:`PUBLIC_FORGES`; ``*``: any. Admission runs git against the URL a user sends, from inside the
    cluster: without a list anyone could make the gateway (and the agents) knock on internal addresses."""

    def allows(self, url: str) -> bool:
        """Whether admission may ask ``url``'s host (the cluster's own git host always)."""
        if ANY_HOST in self.allowed_hosts:
            return True
        netloc = urlsplit(url).netloc.lower()
        own = urlsplit(self.host).netloc.lower()
        return netloc == own or netloc in (self.allowed_hosts or PUBLIC_FORGES)

    def allowed(self) -> str:
        """The allowed hosts, for a refusal's message."""
        return ", ".join((urlsplit(self.host).netloc, *(self.allowed_hosts or PUBLIC_FORGES)))


@dataclass(frozen=True, slots=True)
class GitAuth:
    """HTTP basic auth for one host; ``repr`` never shows the token."""

    username: str
    token: str = field(repr=False)

    def header(self) -> str:
        pair = f"{self.username}:{self.token}".encode()
        return "Authorization: Basic " + base64.b64encode(pair).decode()

    def fingerprint(self) -> str:
        """What the cache keys on: a digest, so the token itself is not a key of a long-lived dict."""
        return hashlib.sha256(f"{self.username}\0{self.token}".encode()).hexdigest()[:32]


class Outcome(StrEnum):
    FOUND = "Found"
    NO_REPO = "NoRepository"
    """The host answered: no such repository, or one the credential may not read."""
    NO_REF = "NoRef"
    UNREACHABLE = "Unreachable"
    """The host did not answer in time, or git could not talk to it."""


@dataclass(frozen=True, slots=True)
class Listing:
    outcome: Outcome
    detail: str = ""
    """git's message (masked), for the refusals."""


def repo_url(repo: str, host: str) -> str:
    """The URL git fetches: ``repo`` as given when it is a URL, else ``<host>/<owner>/<name>.git``."""
    if "://" in repo:
        return repo
    return f"{host.rstrip('/')}/{repo}.git"


def covers(prefix: str, url: str) -> bool:
    """Whether a Git Connection's ``url`` applies to the repository ``url``: equal, or a prefix that ends at
    a path boundary (``https://github.com`` must not send its token to ``https://github.com.evil.io``)."""
    base = prefix.rstrip("/")
    return bool(base) and (url == base or url.startswith(base + "/"))


def is_commit(ref: str) -> bool:
    """A full commit id: servers do not list commits, so only the repository is checked."""
    return COMMIT_ID.fullmatch(ref) is not None


def looks_abbreviated(ref: str) -> bool:
    return _ABBREVIATED.fullmatch(ref) is not None


def mask(text: str, auth: GitAuth | None) -> str:
    """``text`` with the token (and the header it is sent in) replaced by ``***``."""
    if auth is None or not auth.token:
        return text
    for secret in (auth.header().removeprefix("Authorization: Basic "), auth.token):
        text = text.replace(secret, "***")
    return text


def _wanted(ref: str | None) -> tuple[str, frozenset[str]]:
    """The pattern to list and the ref names that satisfy ``ref`` the way ``git fetch origin <ref>``
    resolves it (git's DWIM rules), so ``main`` is not satisfied by ``refs/heads/team/main``."""
    if ref is None or is_commit(ref):
        return "HEAD", frozenset({"HEAD"})
    names = {ref, f"refs/{ref}", f"refs/tags/{ref}", f"refs/heads/{ref}", f"refs/remotes/{ref}"}
    return ref, frozenset(names | {f"refs/remotes/{ref}/HEAD"})


def _environment(settings: GitSettings, auth: GitAuth | None) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": "/nonexistent",
        "LANG": "C",
        "LC_ALL": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_SYSTEM": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ALLOW_PROTOCOL": "https",
    }
    if settings.ca_bundle:
        env["GIT_SSL_CAINFO"] = settings.ca_bundle
    config: list[tuple[str, str]] = []
    if auth is not None:
        config = [("http.extraHeader", auth.header()), ("http.followRedirects", "false")]
    env["GIT_CONFIG_COUNT"] = str(len(config))
    for i, (key, value) in enumerate(config):
        env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = key, value
    return env


def _classify(code: int, stdout: str, stderr: str, names: frozenset[str]) -> Listing:
    if code in (0, 2):
        listed = {line.split("\t", 1)[1] for line in stdout.splitlines() if "\t" in line}
        return Listing(Outcome.FOUND) if listed & names else Listing(Outcome.NO_REF)
    detail = " ".join(stderr.split())[:_STDERR_MAX]
    lowered = detail.lower()
    if "not found" in lowered or "terminal prompts disabled" in lowered or "authentication failed" in lowered:
        return Listing(Outcome.NO_REPO, detail)
    if "does not appear to be a git repository" in lowered or "http 403" in lowered or " 403" in lowered:
        return Listing(Outcome.NO_REPO, detail)
    return Listing(Outcome.UNREACHABLE, detail or f"git exited with status {code}")


async def _run(url: str, ref: str | None, settings: GitSettings, auth: GitAuth | None) -> Listing:
    pattern, names = _wanted(ref)
    proc = await asyncio.create_subprocess_exec(
        "git",
        "ls-remote",
        "--exit-code",
        "--",
        url,
        pattern,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_environment(settings, auth),
        # A group of its own: git runs git-remote-https as a child, and a timeout ends both.
        start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), settings.timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        return Listing(Outcome.UNREACHABLE, f"no answer within {settings.timeout_s:g} s")
    stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
    listing = _classify(proc.returncode or 0, stdout, stderr, names)
    return Listing(listing.outcome, mask(listing.detail, auth))


class RefCache:
    """ls-remote answers for a short while, and one git process per key at a time."""

    def __init__(self) -> None:
        self._answers: dict[tuple[str, ...], tuple[float, Listing]] = {}
        self._running: dict[tuple[str, ...], asyncio.Future[Listing]] = {}

    async def ls_remote(
        self, url: str, ref: str | None, settings: GitSettings, auth: GitAuth | None = None
    ) -> Listing:
        key = (url, ref or "", auth.fingerprint() if auth else "")
        now = time.monotonic()
        kept = self._answers.get(key)
        if kept is not None and kept[0] > now:
            return kept[1]
        loop = asyncio.get_running_loop()
        # A future belongs to its event loop: concurrent asks share one only within a loop.
        flight = (*key, str(id(loop)))
        running = self._running.get(flight)
        if running is not None:
            return await asyncio.shield(running)
        future: asyncio.Future[Listing] = loop.create_future()
        self._running[flight] = future
        try:
            listing = await _run(url, ref, settings, auth)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except Exception as e:
            future.set_exception(e)
            future.exception()  # retrieved here, so a future nobody else awaits does not warn
            raise
        finally:
            self._running.pop(flight, None)
        future.set_result(listing)
        self._keep(key, listing, now + settings.cache_s)
        return listing

    def _keep(self, key: tuple[str, ...], listing: Listing, until: float) -> None:
        if len(self._answers) >= _CACHE_MAX:
            now = time.monotonic()
            self._answers = {k: v for k, v in self._answers.items() if v[0] > now}
            if len(self._answers) >= _CACHE_MAX:
                self._answers.clear()
        self._answers[key] = (until, listing)

    def clear(self) -> None:
        self._answers.clear()


REFS: Final = RefCache()
"""The gateway process's cache."""
