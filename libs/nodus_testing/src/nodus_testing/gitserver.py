"""A git host for tests: git's smart HTTP protocol over https, from ``git http-backend`` run as CGI.

What agents and the gateway fetch ``spec.source.git`` from (ADR-0036) without reaching the internet: a
``ThreadingHTTPServer`` on 127.0.0.1 with a certificate of the local CA (:mod:`nodus_testing.certs`),
serving bare repositories under ``<root>/<owner>/<name>.git`` (protocol v2 included: the ``Git-Protocol``
header is passed on). Repositories of the owner ``private`` ask for HTTP basic auth with the server's
token (any username, as GitHub takes ``x-access-token``): 401 with ``WWW-Authenticate`` without it, 403
with a wrong one. Every request is kept in :attr:`GitServer.requests`, so a test can see what a client
sent (the Authorization header included, to check that a token went there and nowhere else).

Repositories are made and changed with the ``git`` command (:meth:`GitServer.create_repo`,
:class:`Repo`), commits dated and signed the same way every time.
"""

from __future__ import annotations

import base64
import hmac
import os
import secrets
import shutil
import ssl
import subprocess
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

from nodus_testing import certs

PRIVATE_OWNER: Final = "private"
"""Repositories under this owner need the server's token."""
_BACKEND_TIMEOUT_S: Final = 60
_IDENTITY: Final = {
    "GIT_AUTHOR_NAME": "Nodus Tests",
    "GIT_AUTHOR_EMAIL": "tests@nodus.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
    "GIT_COMMITTER_NAME": "Nodus Tests",
    "GIT_COMMITTER_EMAIL": "tests@nodus.invalid",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
}


def git(*args: str | Path, cwd: Path | None = None) -> str:
    """Run git with no user or system configuration; its stdout. CalledProcessError with stderr."""
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(cwd or Path(tempfile.gettempdir())),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "LC_ALL": "C",
        **_IDENTITY,
    }
    done = subprocess.run(
        ["git", *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
    return done.stdout


@dataclass(frozen=True)
class Seen:
    """One request the server answered."""

    method: str
    path: str
    status: int
    authorization: str | None


@dataclass
class Repo:
    """A repository on the server, with a work tree of its own to make commits in."""

    name: str
    """``owner/name``."""
    bare: Path
    work: Path
    url: str

    def commit(self, files: Mapping[str, str | bytes], message: str = "change", branch: str = "main") -> str:
        """Write ``files`` (path -> content) on ``branch``, commit and push; the new commit's id."""
        git("checkout", "-q", "-B", branch, cwd=self.work)
        for path, content in files.items():
            target = self.work / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content.encode() if isinstance(content, str) else content)
        git("add", "-A", cwd=self.work)
        git("commit", "-q", "--allow-empty", "-m", message, cwd=self.work)
        git("push", "-q", "origin", f"{branch}:refs/heads/{branch}", cwd=self.work)
        return git("rev-parse", "HEAD", cwd=self.work).strip()

    def tag(self, name: str, commit: str) -> None:
        git("tag", "-f", name, commit, cwd=self.work)
        git("push", "-q", "-f", "origin", f"refs/tags/{name}", cwd=self.work)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def log_message(self, format: str, *args: object) -> None:
        pass  # requests are kept in GitServer.requests, not printed

    def _serve(self) -> None:
        parts = urlsplit(self.path)
        auth = self.headers.get("Authorization")
        status = self._refusal(parts.path, auth)
        if status is None:
            status = self._backend(parts.path, parts.query, self._body())
        self.server.owner.requests.append(Seen(self.command, parts.path, status, auth))

    def _refusal(self, path: str, auth: str | None) -> int | None:
        if not path.startswith(f"/{PRIVATE_OWNER}/"):
            return None
        if auth is None:
            self._reply(401, b"authentication required\n", {"WWW-Authenticate": 'Basic realm="nodus-tests"'})
            return 401
        if not self.server.owner.accepts(auth):
            self._reply(403, b"token refused\n", {})
            return 403
        return None

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _backend(self, path: str, query: str, body: bytes) -> int:
        env = {
            "PATH": os.environ.get("PATH", os.defpath),
            "GIT_PROJECT_ROOT": str(self.server.owner.root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "REQUEST_METHOD": self.command,
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_ADDR": self.client_address[0],
            "REMOTE_USER": "tests",
        }
        for header, var in (("Git-Protocol", "GIT_PROTOCOL"), ("Content-Encoding", "HTTP_CONTENT_ENCODING")):
            if self.headers.get(header):
                env[var] = env[f"HTTP_{header.upper().replace('-', '_')}"] = self.headers[header]
        done = subprocess.run(
            ["git", "http-backend"], input=body, env=env, capture_output=True, timeout=_BACKEND_TIMEOUT_S
        )
        head, sep, payload = done.stdout.partition(b"\r\n\r\n")
        if not sep:
            head, _, payload = done.stdout.partition(b"\n\n")
        headers: dict[str, str] = {}
        status = 200 if done.returncode == 0 else 500
        for line in head.decode("latin-1").splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.strip().split()[0])
            elif name:
                headers[name.strip()] = value.strip()
        self._reply(status, payload, headers)
        return status

    def _reply(self, status: int, payload: bytes, headers: Mapping[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            if name.lower() != "content-length":
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: GitServer


@dataclass
class GitServer:
    """Bare repositories under ``root``, served over https on 127.0.0.1 (``base``: ``https://127.0.0.1:N``)."""

    root: Path
    tls: certs.Certs
    token: str = field(default_factory=lambda: f"tok-{secrets.token_hex(12)}", repr=False)
    requests: list[Seen] = field(default_factory=list)
    base: str = ""
    _server: _Server | None = None
    _thread: threading.Thread | None = None

    @property
    def ca(self) -> Path:
        """The CA a client must trust (``NODUS_AGENT_CA_BUNDLE``, ``GIT_SSL_CAINFO``)."""
        return self.tls.ca

    def accepts(self, authorization: str) -> bool:
        scheme, _, encoded = authorization.partition(" ")
        try:
            _, _, token = base64.b64decode(encoded, validate=True).decode().partition(":")
        except ValueError:
            return False
        return scheme.lower() == "basic" and hmac.compare_digest(token.encode(), self.token.encode())

    def start(self) -> GitServer:
        server = _Server(("127.0.0.1", 0), _Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.tls.cert, self.tls.key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        server.owner = self
        self._server = server
        self.base = f"https://127.0.0.1:{server.server_address[1]}"
        self._thread = threading.Thread(target=server.serve_forever, name="git-server", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def url(self, name: str) -> str:
        """The https URL of ``owner/name``."""
        return f"{self.base}/{name}.git"

    def create_repo(
        self, name: str, files: Mapping[str, str | bytes], *, branch: str = "main", any_commit: bool = True
    ) -> tuple[Repo, str]:
        """A new repository ``owner/name`` whose ``branch`` (also its HEAD) holds ``files`` in one commit;
        the repository and that commit's id. ``any_commit``: serve a commit by its id though no branch or
        tag ends there (uploadpack.allowAnySHA1InWant, as GitHub does); False for a stricter server."""
        owner, _, short = name.partition("/")
        if not owner or not short or "/" in short or ".." in name:
            raise ValueError(f"{name!r}: name a repository owner/name")
        bare = self.root / owner / f"{short}.git"
        git("init", "-q", "--bare", f"--initial-branch={branch}", bare)
        git("config", "uploadpack.allowAnySHA1InWant", str(any_commit).lower(), cwd=bare)
        work = self.root.parent / "work" / owner / short
        work.mkdir(parents=True)
        git("init", "-q", f"--initial-branch={branch}", cwd=work)
        git("remote", "add", "origin", bare, cwd=work)
        repo = Repo(name, bare, work, self.url(name))
        return repo, repo.commit(files, "first", branch)

    def delete_repo(self, name: str) -> None:
        """The repository is gone: a fetch of it is a 404."""
        owner, _, short = name.partition("/")
        shutil.rmtree(self.root / owner / f"{short}.git")
