"""The Node authorizer: what a node agent may read, answered over the bus (nodus_schema.noding).

An agent's credential reads no bucket of tenants' data; it asks here. The node that asks is the one its
request subject names: the bus lets each agent publish only on its own ``nodus.rpc.node.<node>.*``
(ADR-0026), so the subject is proof of identity, as a kubelet's client certificate is to Kubernetes' Node
authorizer. An Attempt's Secrets and Connections are given only while that Attempt is bound to the asking
node and not finished, and only those its Job names; anything else is NotFound (no answer says whether
another project's Attempt or Secret exists). Every refusal is counted and logged once per node.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from nats.aio.client import Client as NATS

from nodus_kit import errors, messaging
from nodus_kit.storing import ObjectStore
from nodus_kit.vouching import Forgeries
from nodus_schema.attempts import ATTEMPT_TERMINAL, JOB_UID_LABEL, Attempt
from nodus_schema.configs import Connection, Secret
from nodus_schema.jobs import Job
from nodus_schema.noding import (
    MAX_FOLDERS,
    NODE_RPC_PREFIX,
    RetentionReply,
    RetentionRequest,
    RunSecrets,
    RunSecretsRequest,
    connection_secrets,
    expired,
    needs,
    node_of_subject,
)

log = logging.getLogger(__name__)

QUEUE = "gateway-nodes"
SECRETS_SUBJECT = f"{NODE_RPC_PREFIX}.*.secrets"
RETENTION_SUBJECT = f"{NODE_RPC_PREFIX}.*.retention"


class NodeAccess:
    """The two answers; ``stores`` are the gateway's (by plural)."""

    def __init__(self, stores: Mapping[str, ObjectStore[Any]]) -> None:
        self.attempts: ObjectStore[Attempt] = stores["attempts"]
        self.jobs: ObjectStore[Job] = stores["jobs"]
        self.secrets: ObjectStore[Secret] = stores["secrets"]
        self.connections: ObjectStore[Connection] = stores["connections"]
        self.refused = Forgeries("gateway", "node-access")

    async def run_secrets(self, req: RunSecretsRequest, subject: str) -> RunSecrets:
        node = node_of_subject(subject) or ""
        attempt = await self._bound(node, req)
        try:
            job = await self.jobs.get(req.namespace, attempt.spec.job)
        except errors.NotFound:
            raise self._refuse(node, req, "its Job is gone") from None
        uid = attempt.metadata.labels.get(JOB_UID_LABEL)
        if uid is not None and job.metadata.uid != uid:
            raise self._refuse(node, req, "its Job was re-created")
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
        return out

    async def _bound(self, node: str, req: RunSecretsRequest) -> Attempt:
        try:
            attempt = await self.attempts.get(req.namespace, req.attempt)
        except errors.NotFound:
            raise self._refuse(node, req, "no such Attempt") from None
        if not node or attempt.spec.node != node:
            raise self._refuse(node, req, f"the Attempt is bound to {attempt.spec.node!r}")
        if attempt.status.phase in ATTEMPT_TERMINAL:
            raise self._refuse(node, req, f"the Attempt is {attempt.status.phase}")
        return attempt

    def _refuse(self, node: str, req: RunSecretsRequest, why: str) -> errors.NotFound:
        self.refused.count(node, f"asked for the secrets of {req.namespace}/{req.attempt}: {why}")
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


async def serve_nodes(nc: NATS, stores: Mapping[str, ObjectStore[Any]]) -> list[Any]:
    """Subscribe the two endpoints (a queue group: every gateway replica answers its share)."""
    access = NodeAccess(stores)
    return [
        await messaging.serve_subject(
            nc, SECRETS_SUBJECT, RunSecretsRequest, access.run_secrets, queue=QUEUE, concurrency=16
        ),
        await messaging.serve_subject(
            nc, RETENTION_SUBJECT, RetentionRequest, access.retention, queue=QUEUE, concurrency=4
        ),
    ]
