"""Service-account tokens: minted for a run, checked for its program, never stored (ADR-0037).

A run's token is ``nodus-sa.<namespace>.<attempt>.<mac>``, where ``mac`` is HMAC-SHA256 over the
namespace, the Attempt's name and uid, and the ServiceAccount's name and uid, keyed by a key derived from
the gateway's token pepper under a label of its own (:func:`token_key`: a token digest and a run's MAC
never share a key). So:

* **minting is stateless and idempotent**: the gateway computes the token when the node agent asks for
  the run's grant (nodus_gateway.noding); a repeated ask (an agent restart) gives the same token, and
  nothing is written anywhere;
* **checking reads what the token stands for**: the Attempt (named in the token), its Job's
  ``serviceAccountName``, and the ServiceAccount (its uid and role); the MAC is recomputed and compared in
  constant time. It authenticates only while the Attempt has not finished, as
  ``system:serviceaccount:<namespace>:<name>`` with the account's role in that namespace alone. A deleted
  ServiceAccount (or one deleted and created again: another uid), a finished Attempt, a re-created Job or
  a changed serviceAccountName all make the MAC or the checks fail;
* **a failure says nothing**: :meth:`ServiceAccountTokens.authenticate` answers None, which the
  middleware turns into the same 401 as an unknown token.

The caller (principals.py) caches an answer for at most :data:`LIVENESS_TTL_S`, so a deleted account or a
finished run stops working within a second on every replica.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Final

from nats.aio.client import Client as NATS

from nodus_gateway.authorizing import Principal
from nodus_gateway.reaching import RunAccess
from nodus_kit import errors as kit
from nodus_kit.storing import ObjectStore
from nodus_schema.attempts import ATTEMPT_TERMINAL, JOB_UID_LABEL, Attempt
from nodus_schema.jobs import Job
from nodus_schema.noding import ServiceAccountGrant
from nodus_schema.serviceaccounts import (
    SERVICE_ACCOUNT_ROLES,
    SERVICE_ACCOUNT_TOKEN_PREFIX,
    ServiceAccount,
    principal_name,
    token_parts,
)

KEY_LABEL: Final = b"nodus.dev/service-account-token/v1"
"""What the pepper signs to make the MAC key: a label of its own, so no other HMAC of the gateway (token
digests are HMACs of secrets under the pepper itself) can ever equal a run's MAC."""
LIVENESS_TTL_S: Final = 1.0
"""The longest an answer about a run's token may be cached: a finished run's or a deleted account's token
stops working within this on every replica."""


def token_key(pepper: bytes) -> bytes:
    """The MAC key of run tokens, derived from the gateway's token pepper (NODUS_TOKEN_PEPPER)."""
    if not pepper:
        raise ValueError("a run token key needs a non-empty pepper")
    return hmac.new(pepper, KEY_LABEL, hashlib.sha256).digest()


def run_mac(key: bytes, namespace: str, attempt: Attempt, account: ServiceAccount) -> str:
    """HMAC-SHA256 over (namespace, Attempt name, Attempt uid, account name, account uid), unpadded
    url-safe base64. Names and uids never hold a NUL, so the fields cannot run into each other."""
    fields = (
        namespace,
        attempt.metadata.name or "",
        attempt.metadata.uid or "",
        account.metadata.name or "",
        account.metadata.uid or "",
    )
    digest = hmac.new(key, "\0".join(fields).encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def run_token(key: bytes, namespace: str, attempt: Attempt, account: ServiceAccount) -> str:
    """The run's token: the same one every time it is asked for (nothing is stored)."""
    mac = run_mac(key, namespace, attempt, account)
    return f"{SERVICE_ACCOUNT_TOKEN_PREFIX}{namespace}.{attempt.metadata.name or ''}.{mac}"


class Issuer:
    """What the Node authorizer hands a run whose Job names a ServiceAccount (noding.py)."""

    def __init__(self, key: bytes, access: RunAccess) -> None:
        self.key, self.access = key, access

    def grant(self, namespace: str, attempt: Attempt, account: ServiceAccount) -> ServiceAccountGrant | None:
        """The token, URL and CA; None when the gateway has no URL to give (nothing a run could use)."""
        if self.access.url is None:
            return None
        return ServiceAccountGrant(
            name=account.metadata.name or "",
            token=run_token(self.key, namespace, attempt, account),
            url=self.access.url,
            ca_pem=self.access.ca_pem,
        )


class ServiceAccountTokens:
    """Checks run tokens against the store (no cache here: principals.py keeps a short one)."""

    def __init__(self, nc: NATS, key: bytes) -> None:
        self.key = key
        self.attempts: ObjectStore[Attempt] = ObjectStore(nc, "attempts", Attempt)
        self.jobs: ObjectStore[Job] = ObjectStore(nc, "jobs", Job)
        self.accounts: ObjectStore[ServiceAccount] = ObjectStore(nc, "serviceaccounts", ServiceAccount)

    async def authenticate(self, token: str) -> Principal | None:
        """The principal of a live run's token; None for anything else (the same 401 as an unknown token).
        Bus errors propagate (the middleware answers 503 and the caller retries)."""
        parts = token_parts(token)
        if parts is None:
            return None
        try:
            attempt = await self.attempts.get(parts.namespace, parts.attempt)
            if attempt.status.phase in ATTEMPT_TERMINAL:
                return None
            job = await self.jobs.get(parts.namespace, attempt.spec.job)
            name = job.spec.service_account_name
            if name is None or attempt.metadata.labels.get(JOB_UID_LABEL) not in (None, job.metadata.uid):
                return None  # no account (any more), or the Job was re-created under the same name
            account = await self.accounts.get(parts.namespace, name)
        except (kit.NotFound, kit.Invalid, ValueError):
            return None
        if not hmac.compare_digest(run_mac(self.key, parts.namespace, attempt, account), parts.mac):
            return None
        role = account.spec.role
        if role not in SERVICE_ACCOUNT_ROLES:  # never stored so (admission), but a run is never an admin
            return None
        return Principal(name=principal_name(parts.namespace, name), roles={parts.namespace: role or ""})


def is_run_token(token: str) -> bool:
    return token.startswith(SERVICE_ACCOUNT_TOKEN_PREFIX)
