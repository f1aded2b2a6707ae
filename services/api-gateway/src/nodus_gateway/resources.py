"""The resource table: what the API serves, and for each resource its bucket, types and admission rules.

Adding a resource (Workspaces, Volumes, ...) is one row here; routing, admission, discovery (later) and
the error messages all read the row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client as NATS

from nodus_kit.storing import ObjectStore
from nodus_schema import API_GROUP, FieldError, Job, JobList, Sweep, SweepList
from nodus_schema.defaulting import default_job, default_sweep
from nodus_schema.validating import MAX_JOB_NAME, MAX_SWEEP_NAME, validate_job, validate_sweep


@dataclass(frozen=True, slots=True)
class Resource:
    plural: str
    """The URL segment and, as in Kubernetes, the name used in NotFound/AlreadyExists messages."""
    singular: str
    kind: str
    bucket: str
    """The JetStream KV bucket that holds the objects (declared by nodus_kit.declaring)."""
    object_type: type[Any]
    list_type: type[Any]
    default: Callable[[Any], Any]
    validate: Callable[[Any], list[FieldError]]
    max_name: int
    short_names: tuple[str, ...] = ()

    @property
    def group_resource(self) -> str:
        """``sweeps.nodus.dev``: how Kubernetes names a resource in error messages."""
        return f"{self.plural}.{API_GROUP}"

    @property
    def group_kind(self) -> str:
        """``Sweep.nodus.dev``: how Kubernetes names a kind in Invalid messages."""
        return f"{self.kind}.{API_GROUP}"


RESOURCES: tuple[Resource, ...] = (
    Resource(
        plural="sweeps",
        singular="sweep",
        kind="Sweep",
        bucket="sweeps",
        object_type=Sweep,
        list_type=SweepList,
        default=default_sweep,
        validate=validate_sweep,
        # Shorter than a Job's: cell Jobs are named <sweep>-<index> and must still fit.
        max_name=MAX_SWEEP_NAME,
        short_names=("sw",),
    ),
    Resource(
        plural="jobs",
        singular="job",
        kind="Job",
        bucket="jobs",
        object_type=Job,
        list_type=JobList,
        default=default_job,
        validate=validate_job,
        max_name=MAX_JOB_NAME,
    ),
)

Stores = Mapping[str, ObjectStore[Any]]
"""One ObjectStore per resource, by plural."""


def stores_for(nc: NATS) -> dict[str, ObjectStore[Any]]:
    return {r.plural: ObjectStore(nc, r.bucket, r.object_type) for r in RESOURCES}
