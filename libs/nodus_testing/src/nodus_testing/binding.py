"""What the scheduler writes before it assigns a run, for tests that drive a node agent by hand.

A node agent runs a StartAttempt only for an Attempt that exists and is bound to it, and reads a run's
Secrets and Connections only through the gateway's Node authorizer, which reads the Attempt and its Job
(nodus_gateway.noding, ADR-0026). A test that publishes StartAttempts itself therefore writes the Job
and the Attempt first, as the scheduler would: :func:`bind`. (tests/conftest.py's ``node_access`` runs
the gateway's real endpoints.)
"""

from __future__ import annotations

import uuid

import msgspec
from nats.aio.client import Client as NATS

from nodus_kit.errors import AlreadyExists, NotFound
from nodus_kit.storing import ObjectStore
from nodus_schema.attempts import ATTEMPT_TERMINAL, JOB_LABEL, JOB_UID_LABEL, Attempt, AttemptSpec
from nodus_schema.jobs import Job, JobSpec
from nodus_schema.messages import StartAttempt
from nodus_schema.meta import ObjectMeta


def job_of(msg: StartAttempt, uid: str) -> Job:
    """The Job a StartAttempt was made from: what the Node authorizer lets the run read follows it."""
    spec = JobSpec(
        image=msg.image,
        command=list(msg.command),
        env=list(msg.env),
        secrets=list(msg.secrets),
        image_pull_secrets=list(msg.image_pull_secrets),
        inputs=list(msg.inputs),
        outputs=list(msg.outputs),
        sidecars=list(msg.sidecars),
        completions=msg.completions,
        connections=sorted(
            {i.bucket.connection for i in msg.inputs if i.bucket and i.bucket.connection}
            | {o.sink.connection for o in msg.outputs if o.sink and o.sink.connection}
        ),
    )
    return Job(metadata=ObjectMeta(name=msg.job, namespace=msg.namespace, uid=uid), spec=spec)


async def bind(nc: NATS, msg: StartAttempt, *, node: str | None = None) -> Attempt:
    """Write ``msg``'s Job (once) and its Attempt, bound to ``node`` (default: the message's). An
    Attempt already there is rebound (a test may reuse a name on purpose)."""
    jobs: ObjectStore[Job] = ObjectStore(nc, "jobs", Job)
    try:
        job = await jobs.get(msg.namespace, msg.job)
    except NotFound:
        try:
            job = await jobs.create(job_of(msg, msg.job_uid or str(uuid.uuid4())))
        except AlreadyExists:
            job = await jobs.get(msg.namespace, msg.job)
    return await bind_attempt(
        nc, msg.namespace, msg.attempt, job, node or msg.node, index=msg.index, attempt_no=msg.attempt_no
    )


async def bind_attempt(
    nc: NATS, namespace: str, attempt: str, job: Job, node: str, *, index: int = 0, attempt_no: int = 1
) -> Attempt:
    """Write Attempt ``attempt`` of ``job``, bound to ``node`` (rebound if it is there already)."""
    attempts: ObjectStore[Attempt] = ObjectStore(nc, "attempts", Attempt)
    name = job.metadata.name or ""
    labels = {JOB_LABEL: name, JOB_UID_LABEL: job.metadata.uid or ""}
    spec = AttemptSpec(
        job=name,
        index=index,
        attempt=attempt_no,
        node=node,
        offering="test",
        region_class="us",
        rate_micros_per_hour=1,
        pricebook_version="test",
    )
    meta = ObjectMeta(name=attempt, namespace=namespace, labels=labels)
    try:
        return await attempts.create(Attempt(metadata=meta, spec=spec))
    except AlreadyExists:

        def rebind(a: Attempt) -> Attempt | None:
            if a.spec.node == spec.node and a.status.phase not in ATTEMPT_TERMINAL:
                return None
            return Attempt(metadata=a.metadata, spec=spec)

        return await attempts.mutate(namespace, attempt, rebind)


async def finish(nc: NATS, namespace: str, attempt: str, phase: str = "Succeeded") -> None:
    """Mark an Attempt finished, as the scheduler does once its AttemptFinished arrived."""
    attempts: ObjectStore[Attempt] = ObjectStore(nc, "attempts", Attempt)

    def done(a: Attempt) -> Attempt:
        return msgspec.structs.replace(a, status=msgspec.structs.replace(a.status, phase=phase))

    await attempts.mutate(namespace, attempt, done)
