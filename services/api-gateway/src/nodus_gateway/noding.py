"""The Node authorizer: what a node agent may read, answered over the bus (nodus_schema.noding).

An agent's credential reads no bucket of tenants' data; it asks here. The node that asks is the one its
request subject names: the bus lets each agent publish only on its own ``nodus.rpc.node.<node>.*``
(ADR-0026), so the subject is proof of identity, as a kubelet's client certificate is to Kubernetes' Node
authorizer. An Attempt's Secrets and Connections are given only while that Attempt is bound to the asking
node and not finished, and only those its Job names; anything else is NotFound (no answer says whether
another project's Attempt or Secret exists). Every refusal is counted and logged once per node.

Volumes (ADR-0036): the same answer grants the blob of each Volume revision the run mounts (the agent
reads no Volume), and ``nodus.rpc.node.<node>.commit`` makes a writable mount's uploaded content the
Volume's next revision, under the same checks plus: the Job mounts that Volume writable, holds its writer
claim (referencing.py), and the blob is in the store with the size the agent says. A repeated commit (same
Attempt, same digest) answers the revision it made.

ServiceAccounts (ADR-0037): for a Job with ``spec.serviceAccountName`` the answer carries the run's API
token, URL and CA (minting.py): derived now from the Attempt and the account, the same again when asked
again, stored nowhere. A missing account (or a gateway with no URL for runs) is named in ``missing``.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from nats.aio.client import Client as NATS

from nodus_gateway.blobbing import blob_exists, record_blob
from nodus_gateway.minting import Issuer
from nodus_gateway.referencing import writable
from nodus_gateway.resources import Stores
from nodus_gateway.storeaccess import StoreAccess, is_store_error
from nodus_gateway.volumeapi import append_revision
from nodus_kit import errors, messaging
from nodus_kit.storing import ObjectStore
from nodus_kit.vouching import Forgeries
from nodus_schema.attempts import ATTEMPT_TERMINAL, JOB_UID_LABEL, Attempt
from nodus_schema.configs import Connection, Secret
from nodus_schema.jobs import Job, JobSpec
from nodus_schema.noding import (
    MAX_FOLDERS,
    NODE_RPC_PREFIX,
    GrantedRevision,
    RetentionReply,
    RetentionRequest,
    RunSecrets,
    RunSecretsRequest,
    VolumeCommitReply,
    VolumeCommitRequest,
    commit_subject,
    connection_secrets,
    expired,
    needs,
    node_of_subject,
)
from nodus_schema.serviceaccounts import ServiceAccount
from nodus_schema.volumes import Volume, VolumeWriter, blob_key, revision_of

log = logging.getLogger(__name__)

QUEUE = "gateway-nodes"
SECRETS_SUBJECT = f"{NODE_RPC_PREFIX}.*.secrets"
RETENTION_SUBJECT = f"{NODE_RPC_PREFIX}.*.retention"
COMMIT_SUBJECT = commit_subject("*")
_RunRequest = RunSecretsRequest | VolumeCommitRequest


class NodeAccess:
    """The answers; ``stores`` are the gateway's (by plural), ``access`` its S3 store (commits HEAD the
    uploaded blob there; without one, the blob's record must exist), ``issuer`` mints runs' ServiceAccount
    tokens (without one, a Job's ServiceAccount is reported missing)."""

    def __init__(
        self, stores: Stores, access: StoreAccess | None = None, issuer: Issuer | None = None
    ) -> None:
        self.stores = stores
        self.attempts: ObjectStore[Attempt] = stores["attempts"]
        self.jobs: ObjectStore[Job] = stores["jobs"]
        self.secrets: ObjectStore[Secret] = stores["secrets"]
        self.connections: ObjectStore[Connection] = stores["connections"]
        self.volumes: ObjectStore[Volume] = stores["volumes"]
        self.accounts: ObjectStore[ServiceAccount] = stores["serviceaccounts"]
        self.access = access
        self.issuer = issuer
        self.refused = Forgeries("gateway", "node-access")

    async def run_secrets(self, req: RunSecretsRequest, subject: str) -> RunSecrets:
        node = node_of_subject(subject) or ""
        attempt, job = await self._bound(node, req, "the secrets")
        secret_names, connection_names = needs(job.spec)
        out = RunSecrets(job=job.metadata.name or "", job_uid=job.metadata.uid or "")
        for name in sorted(connection_names):
            try:
                conn = await self.connections.get(req.namespace, name)
            except errors.NotFound:
                out.missing.append(f"Connection/{name}")
                continue
            out.connections.append(conn)
            secret_names |= connection_secrets(conn)
        for name in sorted(secret_names):
            try:
                out.secrets.append(await self.secrets.get(req.namespace, name))
            except errors.NotFound:
                out.missing.append(f"Secret/{name}")
        await self._grant_revisions(req.namespace, job.spec, out)
        await self._grant_account(req.namespace, attempt, job.spec.service_account_name, out)
        return out

    async def _grant_account(
        self, namespace: str, attempt: Attempt, name: str | None, out: RunSecrets
    ) -> None:
        """The run's ServiceAccount token (never logged): the account must exist and the gateway have a URL
        for runs; else ``ServiceAccount/<name>`` is missing, and the agent fails the run saying so."""
        if name is None:
            return
        try:
            account = await self.accounts.get(namespace, name)
        except errors.NotFound:
            out.missing.append(f"ServiceAccount/{name}")
            return
        grant = self.issuer.grant(namespace, attempt, account) if self.issuer is not None else None
        if grant is None:
            log.warning("no URL for runs (NODUS_PUBLIC_URL): ServiceAccount %s/%s not given", namespace, name)
            out.missing.append(f"ServiceAccount/{name}")
        out.service_account = grant

    async def _grant_revisions(self, namespace: str, spec: JobSpec, out: RunSecrets) -> None:
        """Each Volume revision the run mounts: the pinned one (admission pinned every read-only use), or
        for a writable mount the latest (none and no digest for a Volume without revisions)."""
        for name, number, writes in _volume_uses(spec):
            try:
                vol = await self.volumes.get(namespace, name)
            except errors.NotFound:
                vol = None
            rev = revision_of(vol, None if writes else number) if vol is not None else None
            if vol is None or (rev is None and not writes):
                if f"Volume/{name}" not in out.missing:
                    out.missing.append(f"Volume/{name}")
            elif rev is None:
                out.revisions.append(GrantedRevision(volume=name))
            else:
                out.revisions.append(
                    GrantedRevision(
                        volume=name, revision=rev.revision, digest=rev.digest, size_bytes=rev.size_bytes
                    )
                )

    async def commit(self, req: VolumeCommitRequest, subject: str) -> VolumeCommitReply:
        """A writable mount's uploaded content becomes the Volume's next revision (the same one again for
        a repeated request): only for the claimant's unfinished Attempt on the asking node."""
        node = node_of_subject(subject) or ""
        what = f"a commit of Volume {req.volume!r}"
        job = await self._run(node, req, what)
        if req.volume not in writable(job.spec):
            raise self._refuse(node, req, what, "its Job does not mount that Volume writable")
        try:
            vol = await self.volumes.get(req.namespace, req.volume)
        except errors.NotFound:
            raise self._refuse(node, req, what, "no such Volume") from None
        me = VolumeWriter(job=job.metadata.name or "", uid=job.metadata.uid or "")
        if vol.status.writer != me:
            raise self._refuse(
                node, req, what, f"its Job does not hold the writer claim ({vol.status.writer})"
            )
        for rev in vol.status.revisions:
            if rev.attempt == req.attempt and rev.digest == req.digest:
                return VolumeCommitReply(revision=rev.revision)  # a repeat: the answer it had
        latest = vol.status.revisions[-1] if vol.status.revisions else None
        if latest is not None and latest.digest == req.digest:
            # The program changed nothing: its content is the latest revision already, and a copy of it
            # under a new number would only make readers download the same bytes as "news".
            return VolumeCommitReply(revision=latest.revision)
        if not await self._uploaded(req):
            raise self._refuse(
                node, req, what, f"no blob {req.digest} of {req.size_bytes} bytes in the store"
            )
        creator = f"job:{me.job}"
        await record_blob(self.stores, req.namespace, req.digest, req.size_bytes, creator)
        rev = await append_revision(
            self.stores, req.namespace, req.volume, req.digest, req.size_bytes, creator, attempt=req.attempt
        )
        return VolumeCommitReply(revision=rev.revision)

    async def _uploaded(self, req: VolumeCommitRequest) -> bool:
        """Whether the agent's upload is there, with the size it says: the store's object when the gateway
        has a store, else the blob's record."""
        try:
            key = blob_key(req.namespace, req.digest)
        except ValueError:
            return False
        if self.access is None or not self.access.settings.bucket:
            blob = await blob_exists(self.stores, req.namespace, req.digest)
            return blob is not None and blob.spec.size_bytes == req.size_bytes
        try:
            size = await self.access.head(key)
        except Exception as e:
            if is_store_error(e):
                raise errors.Unavailable(
                    f"the store did not answer a HEAD of the blob: {type(e).__name__}"
                ) from None
            raise
        return size == req.size_bytes

    async def _run(self, node: str, req: _RunRequest, what: str) -> Job:
        return (await self._bound(node, req, what))[1]

    async def _bound(self, node: str, req: _RunRequest, what: str) -> tuple[Attempt, Job]:
        """The request's Attempt and its Job: the Attempt must be bound to ``node``, unfinished, and of that
        Job (not of an earlier one of the same name); else the refusal."""
        try:
            attempt = await self.attempts.get(req.namespace, req.attempt)
        except errors.NotFound:
            raise self._refuse(node, req, what, "no such Attempt") from None
        if not node or attempt.spec.node != node:
            raise self._refuse(node, req, what, f"the Attempt is bound to {attempt.spec.node!r}")
        if attempt.status.phase in ATTEMPT_TERMINAL:
            raise self._refuse(node, req, what, f"the Attempt is {attempt.status.phase}")
        try:
            job = await self.jobs.get(req.namespace, attempt.spec.job)
        except errors.NotFound:
            raise self._refuse(node, req, what, "its Job is gone") from None
        uid = attempt.metadata.labels.get(JOB_UID_LABEL)
        if uid is not None and job.metadata.uid != uid:
            raise self._refuse(node, req, what, "its Job was re-created")
        return attempt, job

    def _refuse(self, node: str, req: _RunRequest, what: str, why: str) -> errors.NotFound:
        self.refused.count(node, f"asked for {what} of {req.namespace}/{req.attempt}: {why}")
        # One answer for every refusal: whether the Attempt exists elsewhere is not the asker's to know.
        return errors.NotFound(f"attempt {req.namespace}/{req.attempt} is not bound to node {node}")

    async def retention(self, req: RetentionRequest, subject: str) -> RetentionReply:
        if len(req.folders) > MAX_FOLDERS:
            raise errors.Invalid(f"at most {MAX_FOLDERS} folders per request, not {len(req.folders)}")
        now = datetime.now(UTC)
        out = RetentionReply()
        for folder in req.folders:
            try:
                job: Job | None = await self.jobs.get(folder.namespace, folder.name)
            except (errors.NotFound, errors.Invalid, ValueError):  # a name no key can have: no Job
                job = None
            out.expired.append(expired(job, folder.uid8, now))
        return out


def _volume_uses(spec: JobSpec) -> list[tuple[str, int | None, bool]]:
    """(Volume, revision, writable) of each mount and volume input, each use once."""
    uses = [(m.volume, m.revision, not m.read_only) for m in spec.volumes if m.volume]
    uses += [(i.volume.name, i.volume.revision, False) for i in spec.inputs if i.volume and i.volume.name]
    return list(dict.fromkeys(uses))


async def serve_nodes(
    nc: NATS, stores: Stores, store_access: StoreAccess | None = None, issuer: Issuer | None = None
) -> list[Any]:
    """Subscribe the endpoints (a queue group: every gateway replica answers its share)."""
    access = NodeAccess(stores, store_access, issuer)
    return [
        await messaging.serve_subject(
            nc, SECRETS_SUBJECT, RunSecretsRequest, access.run_secrets, queue=QUEUE, concurrency=16
        ),
        await messaging.serve_subject(
            nc, COMMIT_SUBJECT, VolumeCommitRequest, access.commit, queue=QUEUE, concurrency=8
        ),
        await messaging.serve_subject(
            nc, RETENTION_SUBJECT, RetentionRequest, access.retention, queue=QUEUE, concurrency=4
        ),
    ]
