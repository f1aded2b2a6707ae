"""The resource table: what the API serves, and for each resource its bucket, types and admission rules.

Adding a resource (Workspaces, Volumes, ...) is one row here; routing, admission, discovery and the error
messages all read the row. Besides the types and rules, a row says what discovery advertises and what
the routes must honour:

* ``namespaced``: objects live in a project (``/namespaces/{ns}/<plural>``) or at the cluster scope
  (``/<plural>``, stored under the key ``_.<name>``);
* ``verbs``: the Kubernetes verbs the resource supports; ``read_only`` rows are written by a service
  (``written_by``), never created or changed through the API: they support reading, and a row may add
  ``delete`` for the cluster admin (a Node its agent left behind, as ``kubectl delete node``);
* ``redact``: removes write-only fields (a Secret's values) from an object before it leaves the API; every
  response and watch event of the row must pass its objects through it;
* ``served_by``: the module whose routes serve the row. The generic routes (routing.py) serve the rows
  of ``"routing"``; the others have routes of their own and the generic ones must skip them;
* ``required``: top-level fields a written body must carry where the type's default would say what the
  caller did not (a Budget without a spec would be a $0 Budget, which stops every run of the project).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from nats.aio.client import Client as NATS

from nodus_kit.storing import ObjectStore
from nodus_schema import API_GROUP, CauseType, FieldError, Job, JobList, Sweep, SweepList
from nodus_schema.attempts import Attempt
from nodus_schema.billing import Budget, BudgetList
from nodus_schema.configs import (
    Connection,
    ConnectionList,
    Secret,
    SecretList,
    default_connection,
    default_secret,
    redact_secret,
    validate_connection,
    validate_secret,
)
from nodus_schema.defaulting import default_job, default_sweep
from nodus_schema.listing import AttemptList, NodeList
from nodus_schema.nodes import Node
from nodus_schema.offerings import Offering, OfferingList
from nodus_schema.pipelinerules import MAX_PIPELINE_NAME, validate_pipeline
from nodus_schema.pipelines import Pipeline, PipelineList
from nodus_schema.serviceaccounts import (
    MAX_SERVICE_ACCOUNT_NAME,
    ServiceAccount,
    ServiceAccountList,
    validate_service_account,
)
from nodus_schema.validating import (
    MAX_BUDGET_NAME,
    MAX_JOB_NAME,
    MAX_SWEEP_NAME,
    validate_budget,
    validate_job,
    validate_sweep,
)
from nodus_schema.volumes import (
    MAX_VOLUME_NAME,
    Blob,
    Volume,
    VolumeList,
    Workspace,
    WorkspaceList,
    validate_volume,
    validate_workspace,
)

ALL_VERBS: Final = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
READ_VERBS: Final = ("get", "list", "watch")
CATEGORIES: Final = ("all", "nodus")
"""``kubectl get all`` lists the rows in "all"; Secrets, Connections and the cluster-scoped catalog are
left out of it, as Kubernetes leaves Secrets out."""
NODUS_ONLY: Final = ("nodus",)
# Names the scheduler derives (``<job>-<index>-a<attempt>``) can pass 63 characters; still one NATS token.
MAX_DERIVED_NAME: Final = 253


# The generic routes (routing.py) serve namespaced rows only: cluster-scoped read-only rows are
# clusterrouting.py's, which serves get and list (watch joins when the generic routes serve them), and
# delete where the row allows it.
_CLUSTER_SERVED: Final = ("get", "list")
READ_ONLY_VERBS: Final = (*READ_VERBS, "delete")
"""What a read-only row may support: reading, and deleting (never create, update or patch)."""


def _unchanged(obj: Any) -> Any:
    return obj


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
    namespaced: bool = True
    verbs: tuple[str, ...] = ALL_VERBS
    read_only: bool = False
    """Written by a service: never created, updated or patched through the API (deleted, if verbs say so)."""
    written_by: str | None = None
    """Who writes a read-only resource (for the fix of a 405): "the scheduler", "node agents"."""
    categories: tuple[str, ...] = CATEGORIES
    subresources: tuple[str, ...] = ()
    redact: Callable[[Any], Any] = _unchanged
    """Write-only fields out: applied to every object of the row before it is returned."""
    default_fresh: Callable[[Any], Any] | None = None
    """``default`` for an object the caller owns and drops (a create's just-decoded body): may share parts
    with it instead of copying it first. None: ``default``."""
    served_by: str = "routing"
    required: tuple[str, ...] = ()
    """Top-level fields a create or update body must carry (its type's default is no answer for them)."""

    def __post_init__(self) -> None:
        unknown = set(self.verbs) - set(ALL_VERBS)
        if unknown:
            raise ValueError(f"{self.plural}: unknown verbs {sorted(unknown)}")
        if self.read_only and not set(self.verbs) <= set(READ_ONLY_VERBS):
            raise ValueError(f"{self.plural}: a read-only resource supports only {READ_ONLY_VERBS}")

    @property
    def group_resource(self) -> str:
        """``sweeps.nodus.dev``: how Kubernetes names a resource in error messages."""
        return f"{self.plural}.{API_GROUP}"

    @property
    def group_kind(self) -> str:
        """``Sweep.nodus.dev``: how Kubernetes names a kind in Invalid messages."""
        return f"{self.kind}.{API_GROUP}"


def _written_by(plural: str, who: str) -> Callable[[Any], list[FieldError]]:
    """The rules of a read-only row: every object is refused. A net under the routes, which already answer
    405 to writes, in case a generic write path reaches the row."""

    def refuse(_: Any) -> list[FieldError]:
        message = f"Forbidden: {plural} are written by {who}, not through the API"
        return [FieldError("", CauseType.FORBIDDEN, message)]

    return refuse


def _read_only(
    plural: str,
    singular: str,
    kind: str,
    obj: type[Any],
    lst: type[Any],
    who: str,
    *,
    deletable: bool = False,
    **kw: Any,
) -> Resource:
    """A row written by a service: the generic routes serve it when namespaced, clusterrouting.py when
    cluster-scoped; clusterrouting.py answers every write with 405 and who writes it, in both cases.
    ``deletable`` (cluster-scoped rows): clusterrouting.py serves delete too, which only the cluster admin
    may do (authorizing.py)."""
    namespaced = kw.get("namespaced", True)
    verbs = READ_VERBS if namespaced else _CLUSTER_SERVED
    return Resource(
        plural=plural,
        singular=singular,
        kind=kind,
        bucket=plural,
        object_type=obj,
        list_type=lst,
        default=_unchanged,
        validate=_written_by(plural, who),
        verbs=(*verbs, "delete") if deletable else verbs,
        read_only=True,
        written_by=who,
        served_by="routing" if namespaced else "clusterrouting",
        **kw,
    )


RESOURCES: tuple[Resource, ...] = (
    Resource(
        plural="sweeps",
        singular="sweep",
        kind="Sweep",
        bucket="sweeps",
        object_type=Sweep,
        list_type=SweepList,
        default=default_sweep,
        default_fresh=functools.partial(default_sweep, copy=False),
        validate=validate_sweep,
        # Shorter than a Job's: cell Jobs are named <sweep>-<index> and must still fit.
        max_name=MAX_SWEEP_NAME,
        short_names=("sw",),
        # results: the cell table with the best cells, JSON or CSV (resultsapi.py); read-only.
        subresources=("status", "results"),
    ),
    Resource(
        plural="jobs",
        singular="job",
        kind="Job",
        bucket="jobs",
        object_type=Job,
        list_type=JobList,
        default=default_job,
        default_fresh=functools.partial(default_job, copy=False),
        validate=validate_job,
        max_name=MAX_JOB_NAME,
        subresources=("status",),
    ),
    Resource(
        plural="pipelines",
        singular="pipeline",
        kind="Pipeline",
        bucket="pipelines",
        object_type=Pipeline,
        list_type=PipelineList,
        # Stored as sent (issue #22): the sweep controller defaults each stage's child when it creates it,
        # as it builds cells from a Sweep's template. Admission pins what the stages read (referencing.py).
        default=_unchanged,
        validate=validate_pipeline,
        # Shorter than a Sweep's: a stage's child is named <pipeline>-<stage> and must still fit.
        max_name=MAX_PIPELINE_NAME,
        short_names=("pl",),
        subresources=("status",),
    ),
    _read_only(
        "attempts", "attempt", "Attempt", Attempt, AttemptList, "the scheduler", max_name=MAX_DERIVED_NAME
    ),
    Resource(
        plural="secrets",
        singular="secret",
        kind="Secret",
        bucket="secrets",
        object_type=Secret,
        list_type=SecretList,
        default=default_secret,
        validate=validate_secret,
        max_name=63,
        categories=NODUS_ONLY,
        # No watch (a watch would have to redact every event) and no deletecollection yet.
        verbs=("create", "delete", "get", "list", "patch", "update"),
        redact=redact_secret,
        # Values are write-only and versioned: admission and responses of their own (secreting.py).
        served_by="secreting",
    ),
    Resource(
        plural="connections",
        singular="connection",
        kind="Connection",
        bucket="connections",
        object_type=Connection,
        list_type=ConnectionList,
        default=default_connection,
        validate=validate_connection,
        max_name=63,
        short_names=("conn",),
        categories=NODUS_ONLY,
    ),
    Resource(
        plural="budgets",
        singular="budget",
        kind="Budget",
        bucket="budgets",
        object_type=Budget,
        list_type=BudgetList,
        # Written as sent: billing reads spec.monthlyUSD and spec.selector as they are (ADR-0023).
        default=_unchanged,
        validate=validate_budget,
        max_name=MAX_BUDGET_NAME,
        short_names=("bud",),
        # In no category: `kubectl get all` (and `get nodus`) list what runs, not the limits on it.
        categories=(),
        required=("spec",),
    ),
    Resource(
        plural="volumes",
        singular="volume",
        kind="Volume",
        bucket="volumes",
        object_type=Volume,
        list_type=VolumeList,
        # Written as sent: a Volume's spec is a description; its status is the gateway's (admission resets
        # it on create and keeps the stored one on update, as for every row with a status).
        default=_unchanged,
        validate=validate_volume,
        max_name=MAX_VOLUME_NAME,
        short_names=("vol",),
        categories=NODUS_ONLY,
        # No deletecollection: each delete checks that no unfinished Job or Sweep mounts the Volume.
        verbs=("create", "delete", "get", "list", "patch", "update", "watch"),
        # revisions: POST an uploaded blob as the next revision (volumeapi.py).
        subresources=("revisions",),
    ),
    Resource(
        plural="workspaces",
        singular="workspace",
        kind="Workspace",
        bucket="workspaces",
        object_type=Workspace,
        list_type=WorkspaceList,
        default=_unchanged,
        validate=validate_workspace,
        max_name=MAX_VOLUME_NAME,
        short_names=("ws",),
        categories=NODUS_ONLY,
        verbs=("create", "delete", "get", "list", "patch", "update", "watch"),
        # files: the home's files, listed, written, read and deleted (volumeapi.py).
        subresources=("files",),
    ),
    Resource(
        plural="serviceaccounts",
        singular="serviceaccount",
        kind="ServiceAccount",
        bucket="serviceaccounts",
        object_type=ServiceAccount,
        list_type=ServiceAccountList,
        # Written as sent: a role, and no secret (a run's token is derived when its grant is asked for,
        # nodus_gateway.minting; ADR-0037). No status: its creationTimestamp is all there is to say.
        default=_unchanged,
        validate=validate_service_account,
        max_name=MAX_SERVICE_ACCOUNT_NAME,
        short_names=("sa",),
        categories=NODUS_ONLY,
    ),
    _read_only(
        "nodes",
        "node",
        "Node",
        Node,
        NodeList,
        "node agents",
        max_name=MAX_DERIVED_NAME,
        namespaced=False,
        categories=NODUS_ONLY,
        # The cluster admin deletes the record of an agent gone for good (the scheduler does so itself
        # after NODUS_NODE_DELETE_AFTER_S); an agent that comes back registers it again.
        deletable=True,
    ),
    _read_only(
        "offerings",
        "offering",
        "Offering",
        Offering,
        OfferingList,
        "the scheduler (from its price book)",
        max_name=MAX_DERIVED_NAME,
        namespaced=False,
        categories=NODUS_ONLY,
    ),
)

BLOBS: Final = "blobs"
"""The gateway's records of uploaded blobs (bucket ``blobs``, ADR-0036): no resource of the API (blobbing.py
answers HEAD and GET of one), but a store beside the rows' in :func:`stores_for`."""

Stores = Mapping[str, ObjectStore[Any]]
"""One ObjectStore per resource, by plural, and the blob records' under ``BLOBS``."""


def stores_for(nc: NATS) -> dict[str, ObjectStore[Any]]:
    stores: dict[str, ObjectStore[Any]] = {
        r.plural: ObjectStore(nc, r.bucket, r.object_type) for r in RESOURCES
    }
    stores[BLOBS] = ObjectStore(nc, BLOBS, Blob)
    return stores


def resource(plural: str) -> Resource:
    """The row of ``plural``; KeyError for a resource the table does not have."""
    for r in RESOURCES:
        if r.plural == plural:
            return r
    raise KeyError(f"no resource {plural!r} in nodus_gateway.resources.RESOURCES")
