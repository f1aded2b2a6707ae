"""The code of a run (``spec.source``, ADR-0036): a git checkout or an uploaded blob, in ``src/``.

:func:`checkout` runs before the program (and before ``initCommand``, which runs in the checkout), on
every Attempt: a replacement gets the same ref's newest commit (a branch is followed), and each Attempt
records the commit it ran in :class:`~nodus_schema.attempts.SourceRecord`.

**git**: ``owner/name`` resolves against the cluster's git host (``NODUS_GIT_HOST``); an ``https://`` URL
is taken as it is. ``git init``, a shallow ``fetch`` of the ref (a commit id too: protocol v2 servers
serve one), a full fetch when a commit id is not served that way, ``checkout --detach``. git runs with
no user or system configuration, no prompt, https only, and a deadline. A private repository's token
(a Git Connection, :class:`GitCredential`) reaches git only as an ``http.extraHeader`` in git's own
environment: never in an argument (``ps`` shows those), the URL, a file, a log line or a message; git's
error output is masked with it before it is quoted.

**blob**: the project's ``_nodus/blobs/<ns>/<hex>.tar.zst`` from the agent's store, its sha256 checked at
the end of the stream and extracted all or nothing by the checkpoints' extractor
(:func:`nodus_agent.unpacking.unpack_tree`: no member leaves ``src/``).

A fetch that fails is ``SourceUnavailable`` (the repository, ref or blob is gone or unreachable, with git's
masked error and what to fix); this node's own faults (no git, no store, a full disk) are ``Lost``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import posixpath
import re
import shutil
import signal
import ssl
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from botocore.exceptions import BotoCoreError, ClientError

from nodus_agent import archiving, unpacking, uploading
from nodus_agent.attemptdir import AttemptDir
from nodus_agent.configuring import DEFAULT_GIT_HOST
from nodus_agent.mountplan import Mount, MountPlan
from nodus_schema.attempts import SourceRecord
from nodus_schema.jobs import GitSource
from nodus_schema.messages import StartAttempt
from nodus_schema.volumes import blob_key, digest_hex

log = logging.getLogger(__name__)

DEFAULT_PATH: Final = "/nodus/src"
"""Where the program sees the checkout when neither ``git.path`` nor ``workingDir`` says otherwise."""
DEFAULT_USERNAME: Final = "x-access-token"
"""Sent with a Git Connection's token when it names no username (GitHub, Gitea and GitLab accept it)."""
SOURCE_UNAVAILABLE: Final = "SourceUnavailable"
LOST: Final = "Lost"
MASK: Final = "***"
_ABBREVIATED_COMMIT = re.compile(r"[0-9a-f]{7,40}")
_STDERR_TAIL = 1500


class SourceError(Exception):
    """The checkout failed: ``reason`` SourceUnavailable (the repository, ref or blob) or Lost (this node);
    ``tried`` is the record of what was asked for, for the finish report."""

    def __init__(self, reason: str, message: str, tried: SourceRecord | None = None) -> None:
        super().__init__(message)
        self.reason, self.message, self.tried = reason, message, tried


@dataclass(frozen=True)
class GitCredential:
    """A Git Connection resolved for one fetch: its token is never in a repr, so never in a log line."""

    connection: str
    url: str
    username: str
    token: str = field(repr=False)

    def header(self) -> str:
        basic = base64.b64encode(f"{self.username}:{self.token}".encode()).decode()
        return f"Authorization: Basic {basic}"

    def forms(self) -> list[str]:
        """Every form of the token git's output could show: what a message is masked with."""
        return [
            self.token,
            base64.b64encode(f"{self.username}:{self.token}".encode()).decode(),
            base64.b64encode(self.token.encode()).decode(),
        ]


@dataclass(frozen=True)
class SourceContext:
    """What a checkout needs of this agent: its settings, the store of blobs, a Git Connection's token."""

    git_host: str = DEFAULT_GIT_HOST
    timeout_s: float = 600.0
    ca_bundle: Path | None = None
    """Extra CAs trusted for the git host (a private one, the tests'), beside the system's."""
    credential: GitCredential | None = None
    s3: Any | None = None
    bucket: str | None = None
    max_bytes: int | None = None
    """The most an uploaded blob may hold once extracted."""


# -- where things are ---------------------------------------------------------------------------------------
def repo_url(repo: str, git_host: str = DEFAULT_GIT_HOST) -> str:
    """``owner/name`` -> ``<host>/owner/name.git``; an ``https://`` URL as it is. ValueError for anything
    else, and for a URL with credentials in it (a token belongs in a Git Connection)."""
    if "://" not in repo:
        if repo.count("/") != 1 or repo.startswith(("-", "/", ".")) or repo.endswith("/"):
            raise ValueError(f"spec.source.git.repo {repo!r}: write owner/name or an https:// URL")
        return f"{git_host.rstrip('/')}/{repo}.git"
    parts = urlsplit(repo)
    if parts.scheme != "https" or not parts.hostname:
        raise ValueError(f"spec.source.git.repo {repo!r}: only https:// URLs are fetched")
    if "@" in parts.netloc:
        raise ValueError(
            "spec.source.git.repo has credentials in its URL: remove them and put the token in a Git "
            "Connection listed in spec.connections"
        )
    if any(c.isspace() for c in repo):
        raise ValueError(f"spec.source.git.repo {repo!r}: a URL has no spaces")
    return repo


def prefixes(prefix: str, url: str) -> bool:
    """Whether the Git Connection ``prefix`` applies to the repository ``url``: both https, the same host
    and port, and the prefix's path a whole-segment prefix of the URL's (``/team`` is not ``/teamx``)."""
    p, u = urlsplit(prefix), urlsplit(url)
    if p.scheme != "https" or u.scheme != "https" or not p.hostname:
        return False
    if (p.hostname.lower(), p.port or 443) != ((u.hostname or "").lower(), u.port or 443):
        return False
    path = p.path.rstrip("/")
    return not path or u.path == path or u.path.startswith(path + "/")


def program_path(msg: StartAttempt) -> str:
    """Where the program sees the checkout: an absolute ``git.path``; else ``workingDir`` (default
    ``/nodus/src``) joined with a relative ``git.path``, or alone."""
    git = msg.source.git if msg.source is not None else None
    path = git.path if git is not None else None
    if path and path.startswith("/"):
        return posixpath.normpath(path)
    base = msg.working_dir or DEFAULT_PATH
    return posixpath.normpath(posixpath.join(base, path)) if path else base


def tried(msg: StartAttempt, git_host: str = DEFAULT_GIT_HOST) -> SourceRecord | None:
    """The record of what ``msg`` asks for, before anything is fetched (repo, ref or blob; no commit)."""
    src = msg.source
    if src is None:
        return None
    if src.git is not None:
        try:
            return SourceRecord(repo=repo_url(src.git.repo or "", git_host), ref=src.git.ref)
        except ValueError:
            return SourceRecord(repo=src.git.repo, ref=src.git.ref)
    return SourceRecord(blob=src.blob)


# -- the checkout -------------------------------------------------------------------------------------------
async def checkout(ctx: SourceContext, msg: StartAttempt, adir: AttemptDir, plan: MountPlan) -> None:
    """Fetch ``msg.source`` into ``adir.src`` (from a clean folder) and add it to ``plan``, first among the
    mounts; SourceError on a failure. Nothing to do without a source."""
    src = msg.source
    if src is None or (src.git is None and src.blob is None):
        return
    began = time.monotonic()
    try:
        await asyncio.to_thread(_fresh, adir.src)
    except OSError as e:
        why = f"could not prepare {adir.src} for the checkout: {e}"
        raise SourceError(LOST, why, tried(msg, ctx.git_host)) from None
    if src.git is not None:
        record = await _git(ctx, src.git, adir.src)
    else:
        assert src.blob is not None
        record = await _blob(ctx, msg.namespace, src.blob, adir.src)
    record.millis = int((time.monotonic() - began) * 1000)
    target = program_path(msg)
    plan.mounts.insert(0, Mount(host=adir.src, target=target, read_only=False))
    if msg.working_dir is None:
        plan.working_dir = target
    plan.source_host, plan.source_path, plan.source = adir.src, target, record
    log.info(
        "source checked out",
        extra={"attempt": msg.attempt, "commit": record.commit, "blob": record.blob, "ms": record.millis},
    )


def _fresh(folder: Path) -> None:
    """An empty ``folder``: a checkout again (an agent restarted mid-way) starts from nothing."""
    if folder.is_symlink() or folder.is_file():
        folder.unlink()
    elif folder.exists():
        # Read-only folders (a blob's, git's packs) would stop rmtree: open them up first.
        for dirpath, dirnames, _ in os.walk(folder):
            for d in dirnames:
                p = os.path.join(dirpath, d)
                if not os.path.islink(p):
                    os.chmod(p, 0o700)
        shutil.rmtree(folder)
    folder.mkdir(parents=True)


# -- git ----------------------------------------------------------------------------------------------------
class _Timeout(Exception):
    pass


@dataclass
class _Git:
    """git in one folder, with a clean environment and one deadline for all its commands."""

    cwd: Path
    env: dict[str, str]
    deadline: float
    masks: list[str]

    async def run(self, *args: str) -> tuple[int, str]:
        """(exit code, masked stderr and stdout); _Timeout past the deadline."""
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise _Timeout
        try:
            proc = await asyncio.create_subprocess_exec(
                "git",
                *args,
                cwd=self.cwd,
                env=self.env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # its remote helper too is killed at the deadline
            )
        except FileNotFoundError:
            raise SourceError(LOST, "this node has no git command: install git on the node") from None
        try:
            out, err = await asyncio.wait_for(proc.communicate(), remaining)
        except TimeoutError:
            raise _Timeout from None
        finally:
            if proc.returncode is None:  # the deadline, or a stop that cancelled the preparation
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
        text = (err + out).decode("utf-8", errors="replace")
        return proc.returncode or 0, mask(text, self.masks)


def mask(text: str, secrets: Iterable[str]) -> str:
    for value in sorted((s for s in secrets if len(s) >= 4), key=len, reverse=True):
        text = text.replace(value, MASK)
    return text


def git_env(home: Path, ca_file: Path | None, credential: GitCredential | None) -> dict[str, str]:
    """git's whole environment: nothing of the agent's (no proxy, trace or askpass variables, no config
    of the user or the system), no prompt, https only, and the token as an extra header if any."""
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(home),
        "LC_ALL": "C",  # git's messages in English: the hints below read them
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_ALLOW_PROTOCOL": "https",
    }
    if ca_file is not None:
        env["GIT_SSL_CAINFO"] = str(ca_file)
    if credential is not None:
        env.update(
            GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="http.extraHeader", GIT_CONFIG_VALUE_0=credential.header()
        )
    return env


def _ca_file(extra: Path, home: Path) -> Path:
    """The system's CAs and ``extra`` in one file: GIT_SSL_CAINFO replaces the system's bundle, and the
    git host may well be a public one while the private CA is for something else."""
    paths = ssl.get_default_verify_paths()
    system = paths.cafile or paths.openssl_cafile
    parts = [Path(system).read_bytes()] if system and os.path.isfile(system) else []
    parts.append(extra.read_bytes())
    out = home / "ca.pem"
    out.write_bytes(b"\n".join(parts))
    return out


async def _git(ctx: SourceContext, git: GitSource, dest: Path) -> SourceRecord:
    ref = git.ref
    record = SourceRecord(ref=ref)
    try:
        record.repo = url = repo_url(git.repo or "", ctx.git_host)
    except ValueError as e:
        raise SourceError(SOURCE_UNAVAILABLE, str(e), SourceRecord(repo=git.repo, ref=ref)) from None
    if ref is not None and (ref.startswith("-") or ":" in ref or not ref.strip()):
        # Admission refuses these already; git must never read a ref as an option or a refspec.
        why = f"spec.source.git.ref {ref!r}: name a branch, tag or commit"
        raise SourceError(SOURCE_UNAVAILABLE, why, record)
    masks = ctx.credential.forms() if ctx.credential is not None else []
    with tempfile.TemporaryDirectory(prefix="nodus-git-") as home:
        try:
            ca = await asyncio.to_thread(_ca_file, ctx.ca_bundle, Path(home)) if ctx.ca_bundle else None
        except OSError as e:
            raise SourceError(LOST, f"cannot read the CA bundle {ctx.ca_bundle}: {e}", record) from None
        runner = _Git(dest, git_env(Path(home), ca, ctx.credential), time.monotonic() + ctx.timeout_s, masks)
        try:
            record.commit = await _fetch(runner, url, ref, ctx.credential)
        except SourceError as e:
            e.tried = e.tried or record
            raise
        except _Timeout:
            raise SourceError(
                SOURCE_UNAVAILABLE,
                f"fetching {ref or 'HEAD'} of {url} took longer than {ctx.timeout_s:g}s: the git host is "
                "slow or unreachable from this node; retry, or raise the agents' git.timeout_s for a large "
                "repository",
                record,
            ) from None
    return record


async def _fetch(git: _Git, url: str, ref: str | None, credential: GitCredential | None) -> str:
    """init, fetch, checkout; the commit checked out. SourceError with git's error and a fix."""
    await _must(git, url, ref, credential, "init", "-q", "--template=", ".")
    await _must(git, url, ref, credential, "remote", "add", "origin", url)
    code, err = await git.run("fetch", "--depth", "1", "--no-tags", "origin", ref or "HEAD")
    if code == 0:
        await _must(git, url, ref, credential, "checkout", "-q", "--detach", "FETCH_HEAD")
    elif ref is not None and _ABBREVIATED_COMMIT.fullmatch(ref):
        # A server that serves no commit by id (protocol v0, or v2 without allowAnySHA1InWant): fetch
        # every branch and tag, then the commit from among them.
        refspecs = ("+refs/heads/*:refs/remotes/origin/*", "+refs/tags/*:refs/tags/*")
        await _must(git, url, ref, credential, "fetch", "--no-tags", "origin", *refspecs)
        code, found = await git.run("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
        if code != 0 or not found.strip():
            raise SourceError(
                SOURCE_UNAVAILABLE,
                f"commit {ref} is not in {url} (on no branch or tag of it). Fix: push it, or set "
                "spec.source.git.ref to a commit, branch or tag of the repository",
            )
        await _must(git, url, ref, credential, "checkout", "-q", "--detach", found.split()[-1])
    else:
        raise SourceError(SOURCE_UNAVAILABLE, fetch_error(url, ref, err, credential))
    code, out = await git.run("rev-parse", "HEAD")
    commit = out.strip().splitlines()[-1] if code == 0 and out.strip() else ""
    if not re.fullmatch(r"[0-9a-f]{40}([0-9a-f]{24})?", commit):
        raise SourceError(LOST, f"git rev-parse HEAD in the checkout of {url} failed: {_tail(out)}")
    return commit


async def _must(git: _Git, url: str, ref: str | None, credential: GitCredential | None, *args: str) -> None:
    code, err = await git.run(*args)
    if code != 0:
        raise SourceError(SOURCE_UNAVAILABLE, fetch_error(url, ref, err, credential))


def fetch_error(url: str, ref: str | None, stderr: str, credential: GitCredential | None) -> str:
    """What failed (git's own words, already masked) and what to do about it."""
    lower = stderr.lower()
    if "couldn't find remote ref" in lower or "not our ref" in lower or "unadvertised object" in lower:
        fix = (
            f"the ref {ref!r} is not in {url}: push it, or set spec.source.git.ref to an existing "
            "branch, tag or commit"
        )
    elif any(s in lower for s in ("authentication failed", "could not read username", " 401", " 403")):
        fix = (
            f"the token of Git Connection {credential.connection!r} was refused: update the token in its "
            "Secret (tokenRef), or check that it may read the repository"
            if credential is not None
            else f"{url} asks for credentials: create a Git Connection whose url starts the repository's "
            "URL, with the token in a Secret (tokenRef), and list it in spec.connections"
        )
    elif "not found" in lower or " 404" in lower or "does not appear to be a git repository" in lower:
        fix = (
            f"the repository {url} does not exist (or it is private and the Job lists no Git Connection "
            "for it): check spec.source.git.repo"
        )
    else:
        fix = "check spec.source.git.repo and .ref, and that the git host is reachable from the nodes"
    return f"could not fetch {ref or 'HEAD'} of {url}: {_tail(stderr)}. Fix: {fix}"


def _tail(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _STDERR_TAIL else "..." + text[-_STDERR_TAIL:]


# -- blob ---------------------------------------------------------------------------------------------------
async def _blob(ctx: SourceContext, namespace: str, digest: str, dest: Path) -> SourceRecord:
    record = SourceRecord(blob=digest)
    if ctx.s3 is None or ctx.bucket is None:
        raise SourceError(
            LOST,
            "this node has no store configured (NODUS_AGENT_S3_BUCKET): it cannot read uploaded blobs",
            record,
        )
    try:
        hex_digest, key = digest_hex(digest), blob_key(namespace, digest)
    except ValueError as e:
        raise SourceError(SOURCE_UNAVAILABLE, f"spec.source.blob: {e}", record) from None
    upload = "upload the directory again (nodus apply with spec.source.dir, or PUT .../blobs/" + digest + ")"
    chunks = uploading.download(ctx.s3, ctx.bucket, key)
    try:
        async with contextlib.aclosing(chunks):
            await unpacking.unpack_tree(chunks, dest, sha256=hex_digest, max_bytes=ctx.max_bytes)
    except archiving.DigestMismatch as e:
        raise SourceError(
            SOURCE_UNAVAILABLE, f"blob {digest} is not what was uploaded: {e}. Fix: {upload}", record
        ) from None
    except archiving.ArchiveError as e:  # unsafe members, or more than the node takes
        raise SourceError(
            SOURCE_UNAVAILABLE, f"blob {digest} was refused: {e}. Fix: pack it with nodus apply", record
        ) from None
    except ClientError as e:
        if uploading.not_found(e):
            why = f"blob {digest} is not in project {namespace}'s store. Fix: {upload}"
            raise SourceError(SOURCE_UNAVAILABLE, why, record) from None
        raise SourceError(LOST, f"could not read blob {digest} from the store: {e}", record) from None
    except (BotoCoreError, OSError) as e:
        raise SourceError(LOST, f"could not read blob {digest} into {dest}: {e}", record) from None
    return record
