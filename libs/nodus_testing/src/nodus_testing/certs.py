"""A local certificate authority and the gateway's HTTPS certificate, made with the ``openssl`` command.

kubectl (client-go) sends a kubeconfig's bearer token only over TLS, so the local stack serves the
gateway over HTTPS with a certificate for ``127.0.0.1`` and ``localhost``, signed by a CA of its own whose
certificate goes into the kubeconfig (``certificate-authority-data``) and into local.env (``NODUS_CA``).

Files in the stack's root: ``ca.crt``, ``ca.key``, ``gateway.crt``, ``gateway.key`` (keys mode 0600). They
are reused while they still verify: a CA people already pass around keeps working across ``make up``s, and
only the gateway's certificate is renewed when it alone is missing, expiring or wrong. EC P-256 keys: made
in milliseconds.
"""

from __future__ import annotations

import os
import secrets
import shutil
import ssl
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

CA_DAYS: Final = 3650
SERVER_DAYS: Final = 397
"""The longest a browser accepts for a server certificate; renewed well before it ends."""
RENEW_BEFORE_S: Final = 30 * 24 * 3600
HOSTS: Final = ("127.0.0.1", "localhost")

# Only what a strict verifier (Go's crypto/x509, OpenSSL's X509_STRICT) wants, and nothing from the
# system's openssl.cnf.
_OPENSSL_CNF: Final = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = Nodus local CA
[ca]
basicConstraints = critical, CA:TRUE, pathlen:0
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
"""


class CertError(RuntimeError):
    """openssl is missing or failed; the message has its output."""


@dataclass(frozen=True, slots=True)
class Certs:
    ca: Path
    ca_key: Path
    cert: Path
    key: Path

    @classmethod
    def at(cls, root: Path) -> Certs:
        return cls(root / "ca.crt", root / "ca.key", root / "gateway.crt", root / "gateway.key")


def ensure(root: Path) -> Certs:
    """The local CA and the gateway's certificate in ``root``: the ones there if they verify, else new."""
    root.mkdir(parents=True, exist_ok=True)
    certs = Certs.at(root)
    if _server_ok(certs):
        _private(certs)
        return certs
    if shutil.which("openssl") is None:
        raise CertError("the openssl command is not on the PATH; it makes the local stack's certificates")
    # Made in a private directory next to the files, then moved into place: never half-written.
    with tempfile.TemporaryDirectory(prefix=".certs-", dir=root) as tmp:
        work = Certs.at(Path(tmp))
        cnf = Path(tmp) / "openssl.cnf"
        cnf.write_text(_OPENSSL_CNF)
        keep_ca = _ca_ok(certs)
        if keep_ca:
            shutil.copyfile(certs.ca, work.ca)
            shutil.copyfile(certs.ca_key, work.ca_key)
        else:
            _make_ca(work, cnf)
        _make_server(work, cnf)
        if not _server_ok(work):
            raise CertError(f"the certificate openssl made in {tmp} does not verify against its CA")
        os.chmod(work.ca_key, 0o600)
        os.chmod(work.key, 0o600)
        moves = [(work.key, certs.key), (work.cert, certs.cert)]
        if not keep_ca:
            moves = [(work.ca_key, certs.ca_key), (work.ca, certs.ca), *moves]
        for src, dst in moves:
            os.replace(src, dst)
    return certs


def _make_ca(c: Certs, cnf: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", c.ca_key)
    _openssl(
        "req", "-x509", "-new", "-config", cnf, "-extensions", "ca", "-key", c.ca_key, "-sha256",
        "-days", str(CA_DAYS), "-subj", f"/O=Nodus/CN=Nodus local CA {secrets.token_hex(4)}", "-out", c.ca,
    )  # fmt: skip


def _make_server(c: Certs, cnf: Path) -> None:
    csr = c.cert.with_suffix(".csr")
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", c.key)
    _openssl("req", "-new", "-config", cnf, "-key", c.key, "-subj", "/O=Nodus/CN=127.0.0.1", "-out", csr)
    _openssl(
        "x509", "-req", "-in", csr, "-CA", c.ca, "-CAkey", c.ca_key, "-out", c.cert,
        "-set_serial", f"0x{secrets.token_hex(16)}", "-extfile", cnf, "-extensions", "server",
        "-sha256", "-days", str(SERVER_DAYS),
    )  # fmt: skip


def _openssl(*args: str | Path) -> None:
    argv = ["openssl", *map(str, args)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise CertError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")


def _ca_ok(c: Certs) -> bool:
    """The CA's certificate and key load and belong together."""
    if not (c.ca.is_file() and c.ca_key.is_file()):
        return False
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(c.ca, c.ca_key)
        ssl.create_default_context(cafile=str(c.ca))
    except (OSError, ValueError):
        return False
    return True


def _server_ok(c: Certs) -> bool:
    """A TLS handshake in memory, as a client trusting only the CA would make it to 127.0.0.1: the chain,
    the key, the names and the dates all verify, and the certificate is not about to expire."""
    if not all(p.is_file() for p in (c.ca, c.ca_key, c.cert, c.key)) or not _ca_ok(c):
        return False
    try:
        server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_ctx.load_cert_chain(c.cert, c.key)
        client_ctx = ssl.create_default_context(cafile=str(c.ca))
        client_ctx.verify_flags |= ssl.VERIFY_X509_STRICT
        peer = _handshake(client_ctx, server_ctx, HOSTS[0])
    except (OSError, ValueError):  # ssl.SSLError, and a certificate that does not verify, are OSErrors
        return False
    names = {value for _, value in peer.get("subjectAltName", ())}
    not_after = ssl.cert_time_to_seconds(str(peer["notAfter"]))
    return names >= set(HOSTS) and not_after - time.time() > RENEW_BEFORE_S


def _handshake(client_ctx: ssl.SSLContext, server_ctx: ssl.SSLContext, host: str) -> dict[str, Any]:
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_ctx.wrap_bio(to_client, to_server, server_hostname=host)
    server = server_ctx.wrap_bio(to_server, to_client, server_side=True)
    pending = [client, server]
    for _ in range(10):
        for end in list(pending):
            try:
                end.do_handshake()
                pending.remove(end)
            except ssl.SSLWantReadError:
                pass
        if not pending:
            break
    else:
        raise ssl.SSLError("the in-memory TLS handshake did not finish")
    peer = client.getpeercert()
    assert peer is not None
    return dict(peer)


def _private(c: Certs) -> None:
    for key in (c.ca_key, c.key):
        if key.stat().st_mode & 0o077:
            os.chmod(key, 0o600)
