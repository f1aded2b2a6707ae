"""``url`` inputs (:mod:`nodus_agent.inputs`): one file over **https only**, streamed to disk under the size
cap, its sha256 checked when given; redirects are followed by hand so that none leads to plain http."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Final
from urllib.parse import urljoin, urlsplit

import aiohttp

from nodus_agent.inputcontext import InputContext, InputError, InputRecord, InputSettings, container_path
from nodus_agent.inputstaging import CHUNK, Budget, Materialisation, stream_to
from nodus_schema.jobs import JobInput

__all__ = ["fetch_url"]

MAX_REDIRECTS: Final = 5
_REDIRECTS: Final = (301, 302, 303, 307, 308)


def _redact(url: str) -> str:
    """The URL without credentials or query: signed URLs carry their keys in the query string."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}" + ("?…" if parts.query else "")


def _https_only(name: str, url: str) -> None:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parsing the port is the check
    except ValueError as e:
        raise InputError(name, f"{url!r} is not a URL: {e}") from None
    if parts.scheme != "https" or not parts.hostname:
        raise InputError(
            name,
            f"only https:// URLs are fetched, not {_redact(url)!r}: plain http can be altered on the way; "
            "serve it over https, or put it in a bucket",
        )


def _ssl_context(bundle: Path | None) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if bundle is not None:
        context.load_verify_locations(cafile=str(bundle))
    return context


async def fetch_url(inp: JobInput, run: Materialisation, ctx: InputContext) -> InputRecord:
    assert inp.url is not None and inp.name is not None
    name, url, expect = inp.name, inp.url.url or "", inp.url.sha256
    _https_only(name, url)
    settings = ctx.settings
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=settings.connect_timeout_s, sock_read=settings.read_timeout_s
    )
    staged = run.layout.temp()
    budget = Budget(name, settings.max_bytes)
    try:
        async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as session:
            size, digest = await _download(session, name, url, staged, budget, expect, settings)
    except aiohttp.ClientConnectorCertificateError as e:
        raise InputError(
            name,
            f"the certificate of {_redact(url)} did not verify ({e.certificate_error}); "
            "if a private CA signs it, give the node NODUS_AGENT_CA_BUNDLE",
        ) from None
    except (aiohttp.ClientError, TimeoutError) as e:
        raise InputError(
            name, f"downloading {_redact(url)} failed: {e or type(e).__name__}", retryable=True
        ) from None
    await asyncio.to_thread(run.layout.place, name, staged)
    return InputRecord(
        name=name, kind="url", source=_redact(url), path=container_path(name), bytes=size, sha256=digest
    )


async def _download(
    session: aiohttp.ClientSession,
    name: str,
    url: str,
    staged: Path,
    budget: Budget,
    expect: str | None,
    settings: InputSettings,
) -> tuple[int, str]:
    """GET with redirects followed by hand: each hop must stay https (aiohttp would follow one to http)."""
    context = _ssl_context(settings.ca_bundle)
    # identity: the digest is of the bytes as served, not of a transfer encoding's unpacking.
    headers = {"Accept-Encoding": "identity"}
    for _ in range(MAX_REDIRECTS + 1):
        async with session.get(url, ssl=context, allow_redirects=False, headers=headers) as resp:
            if resp.status in _REDIRECTS and "Location" in resp.headers:
                url = urljoin(url, resp.headers["Location"])
                _https_only(name, url)
                continue
            if resp.status != 200:
                raise InputError(
                    name,
                    f"GET {_redact(url)} answered {resp.status} {resp.reason or ''}".rstrip()
                    + ("; check the URL" if resp.status < 500 else ""),
                    retryable=resp.status >= 500 or resp.status in (408, 429),
                )
            if resp.content_length is not None and resp.content_length > budget.limit:
                budget.take(resp.content_length)  # raises: refused before a byte is written
            return await stream_to(staged, name, budget, resp.content.iter_chunked(CHUNK), expect)
    raise InputError(name, f"more than {MAX_REDIRECTS} redirects from {_redact(url)}")
