"""The StartAttempt of a run: what the agent needs of the Job's spec, built from the Job and its Attempt
(pure; :mod:`nodus_scheduler.lifecycle` publishes it). Secret values are never in it, only references.
"""

from __future__ import annotations

import msgspec

from nodus_scheduler.cataloging import catalog_for
from nodus_scheduler.ganging import Shape, shape_of
from nodus_schema.attempts import GANG_LABEL, Attempt
from nodus_schema.catalog import Catalog
from nodus_schema.jobs import Job, Resources, SecretMount
from nodus_schema.messages import StartAttempt


def start_message(
    job: Job, attempt: Attempt, *, timeout: int | None, continuity: str, restore_from: str | None
) -> StartAttempt:
    """The StartAttempt of ``attempt``: ``timeout`` is what is left of the Job's timeout (the Job's clock,
    not the run's), ``restore_from`` the earlier Attempt whose state the run restores."""
    spec = job.spec
    return StartAttempt(
        namespace=attempt.metadata.namespace or "",
        job=job.metadata.name or "",
        attempt=attempt.metadata.name or "",
        index=attempt.spec.index,
        attempt_no=attempt.spec.attempt,
        node=attempt.spec.node,
        image=spec.image,
        command=list(spec.command),
        args=list(spec.args),
        env=list(spec.env),
        working_dir=spec.working_dir,
        completions=spec.completions or 1,
        timeout_seconds=timeout,
        continuity=continuity,
        restore_from=restore_from,
        job_uid=job.metadata.uid,
        inputs=list(spec.inputs),
        outputs=list(spec.outputs),
        checkpoint=spec.recovery.checkpoint if spec.recovery else None,
        resources=spec.resources if isinstance(spec.resources, Resources) else None,
        secrets=[m if isinstance(m, SecretMount) else SecretMount(name=m) for m in spec.secrets],
        sidecars=list(spec.sidecars),
        init_command=spec.init_command,
        network=spec.network,
        image_pull_secrets=list(spec.image_pull_secrets),
        source=spec.source,
        volumes=list(spec.volumes),
        warm_reuse=attempt.spec.warm_from is not None,
        complete_by_time=spec.complete_by_time,  # the agent's auto checkpoint cadence shortens toward it
    )


def with_gang(job: Job, attempt: Attempt, message: StartAttempt, catalog: Catalog) -> StartAttempt:
    """The launcher's view of the gang: ranks, sizes, the master's address and port (ADR-0016)."""
    spec = attempt.spec
    shape = shape_of(job.spec) or Shape(nodes=spec.gang_size or 1, gpus_per_node=None)
    offering = catalog_for(job, catalog).offering(spec.offering)
    per_node = shape.gpus_per_node or (offering.gpus_per_node if offering is not None else None) or 1
    nodes = spec.gang_size or shape.nodes
    rank = spec.rank or 0
    return msgspec.structs.replace(
        message,
        gang=attempt.metadata.labels.get(GANG_LABEL),
        node_rank=rank,
        nodes=nodes,
        gpus_per_node=per_node,
        rank=rank * per_node,
        world_size=nodes * per_node,
        master_addr=spec.master_node,
        master_port=shape.master_port,
        launcher=shape.launcher,
    )
