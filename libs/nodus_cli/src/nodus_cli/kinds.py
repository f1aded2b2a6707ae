"""The kinds the CLI knows, and the names people type for them (``sweep``, ``sweeps``, ``sw``, ``Sweep``).

A static table rather than API discovery: the CLI prints each kind its own way (a Sweep's cells, a Job's
completions, a Budget's month), so a kind it has no view for would not print well anyway. ``watchable``
says whether the gateway serves ``?watch=true`` for it; ``get -w`` polls the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nodus_schema import API_GROUP, Job, Sweep
from nodus_schema.attempts import Attempt
from nodus_schema.billing import Budget
from nodus_schema.configs import Connection, Secret
from nodus_schema.nodes import Node
from nodus_schema.offerings import Offering
from nodus_schema.pipelines import Pipeline
from nodus_schema.serviceaccounts import ServiceAccount
from nodus_schema.volumes import Volume, Workspace


@dataclass(frozen=True, slots=True)
class Kind:
    kind: str
    singular: str
    plural: str
    object_type: type[Any]
    short_names: tuple[str, ...] = ()
    namespaced: bool = True
    """False: cluster-scoped (``/apis/nodus.dev/v1/<plural>``), -n does not apply."""
    watchable: bool = True
    """Whether the gateway serves a watch of it (secrets: no; the cluster-scoped catalog: not yet)."""
    writable: bool = True
    """False: services write it (Attempts, Nodes, Offerings); the API only reads it."""

    def ref(self, name: str) -> str:
        """``sweep.nodus.dev/lr``: how kubectl names an object in what it prints."""
        return f"{self.singular}.{API_GROUP}/{name}"


SWEEP = Kind("Sweep", "sweep", "sweeps", Sweep, ("sw",))
JOB = Kind("Job", "job", "jobs", Job)
BUDGET = Kind("Budget", "budget", "budgets", Budget, ("bud",))
ATTEMPT = Kind("Attempt", "attempt", "attempts", Attempt, ("at",), writable=False)
CONNECTION = Kind("Connection", "connection", "connections", Connection, ("conn",))
SECRET = Kind("Secret", "secret", "secrets", Secret, watchable=False)
NODE = Kind("Node", "node", "nodes", Node, ("no",), namespaced=False, watchable=False, writable=False)
OFFERING = Kind(
    "Offering", "offering", "offerings", Offering, ("of",), namespaced=False, watchable=False, writable=False
)
VOLUME = Kind("Volume", "volume", "volumes", Volume, ("vol",))
WORKSPACE = Kind("Workspace", "workspace", "workspaces", Workspace, ("ws",))
SERVICE_ACCOUNT = Kind("ServiceAccount", "serviceaccount", "serviceaccounts", ServiceAccount, ("sa",))
PIPELINE = Kind("Pipeline", "pipeline", "pipelines", Pipeline, ("pl",))
KINDS: tuple[Kind, ...] = (
    SWEEP,
    JOB,
    BUDGET,
    ATTEMPT,
    CONNECTION,
    SECRET,
    NODE,
    OFFERING,
    VOLUME,
    WORKSPACE,
    SERVICE_ACCOUNT,
    PIPELINE,
)
COMPUTE_KINDS: tuple[Kind, ...] = (SWEEP, JOB, PIPELINE)
"""The kinds with a spec to estimate and a run to wait for."""


class UnknownKind(ValueError):
    pass


def resolve(text: str) -> Kind:
    """A kind from what was typed on the command line, case-insensitively."""
    wanted = text.lower().removesuffix(f".{API_GROUP}")
    for k in KINDS:
        if wanted in (k.singular, k.plural, k.kind.lower(), *k.short_names):
            return k
    known = ", ".join(k.plural for k in KINDS)
    raise UnknownKind(f'the server doesn\'t have a resource type "{text}" (Nodus serves: {known})')


def by_manifest_kind(kind: object) -> Kind | None:
    """The kind a manifest's ``kind:`` names (exactly, as the API compares it)."""
    return next((k for k in KINDS if k.kind == kind), None)
