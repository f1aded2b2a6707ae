"""How runs reach the API: the gateway's URL and CA as a program sees them (ADR-0037).

A Job with ``spec.serviceAccountName`` gets a token, and with it the URL to send it to and the CA bundle
to trust there. Both are settings of the gateway, read once at its start (nodus_gateway.config):

* ``NODUS_PUBLIC_URL``: the gateway as runs reach it (``https://nodus.example.com``). Unset: the URL the
  gateway serves on, when that is one a run can dial (not a wildcard address such as ``0.0.0.0``, not port
  0). A run on a node whose runtime has a network of its own (the docker runtime's bridge) needs an address
  routable from there: set it.
* ``NODUS_PUBLIC_CA``: a PEM file of the CA certificates that sign the gateway's certificate, for a
  private CA (the local stack's). Unset: runs trust their system's CAs.

Without a URL to give, admission refuses every Job and Sweep that names a ServiceAccount (referencing.py):
a token with nowhere to go would only fail later, inside the run.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Final
from urllib.parse import urlsplit

import msgspec

from nodus_kit.configuring import Env

URL_VARIABLE: Final = "NODUS_PUBLIC_URL"
CA_VARIABLE: Final = "NODUS_PUBLIC_CA"
MAX_CA_BYTES: Final = 1 << 20
_PEM_CERT: Final = "-----BEGIN CERTIFICATE-----"


def _public_url(text: str) -> str:
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - parsing the port is the check
    except ValueError:
        parts = None
    if (
        parts is None
        or parts.scheme not in ("https", "http")
        or not parts.hostname
        or parts.username is not None
        or parts.query
        or parts.fragment
    ):
        raise ValueError("give the gateway's URL as runs reach it, such as https://nodus.example.com")
    return text.rstrip("/")


def _ca_file(text: str) -> str:
    """The file's PEM text (read now, once): a path that is missing or holds no certificate stops the start
    instead of handing runs a CA they cannot use."""
    path = Path(text)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ValueError(f"give a PEM file of CA certificates that exists ({e.strerror})") from None
    if len(data) > MAX_CA_BYTES or _PEM_CERT.encode() not in data:
        raise ValueError("give a PEM file of CA certificates (-----BEGIN CERTIFICATE-----), at most 1 MiB")
    return data.decode("ascii", errors="replace")


class PublicSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The variables; :func:`run_access` completes them with what the gateway serves on."""

    url: Annotated[str | None, Env(URL_VARIABLE, parse=_public_url)] = None
    ca_pem: Annotated[str | None, Env(CA_VARIABLE, parse=_ca_file)] = None
    """The PEM text of the file NODUS_PUBLIC_CA names (its content, not its path)."""


@dataclass(frozen=True, slots=True)
class RunAccess:
    """What a run is told to reach the API with; ``url`` None: there is nothing to tell it."""

    url: str | None = None
    ca_pem: str | None = None


def run_access(public: PublicSettings, *, host: str, port: int, tls: bool) -> RunAccess:
    """NODUS_PUBLIC_URL, or else the URL the gateway serves on when a run can dial it."""
    return RunAccess(public.url or served_url(host, port, tls=tls), public.ca_pem)


def served_url(host: str, port: int, *, tls: bool) -> str | None:
    """``https://127.0.0.1:8440``: where the gateway listens, or None for an address no client dials (a
    wildcard, port 0)."""
    if not host or port == 0:
        return None
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        address = None
    if address is not None and address.is_unspecified:
        return None
    shown = f"[{address}]" if address is not None and address.version == 6 else host
    return f"{'https' if tls else 'http'}://{shown}:{port}"
