"""What of an object's metadata only Nodus sets: the ``nodus.dev/`` labels and a Sweep's controller
reference.

The sweep controller writes both onto the cell Jobs it creates, straight into the store (``nodus.dev/sweep``
and ``nodus.dev/cell`` labels, a ``controller: true`` ownerReference to the Sweep), and the rest of Nodus
trusts them: deletion propagates along the reference, billing rolls a cell's cost up into its Sweep's and
charges it against the Sweep's shared cap, label selectors (``kubectl get jobs -l nodus.dev/sweep=lr``,
Budgets) find the cells by them. A user who could write them could adopt a Job into someone's Sweep, or
pass one Job off as another's cell, so the gateway refuses them in what users write (422 on the field),
rather than dropping them without a word:

* a create may set none of them;
* an update (PUT, every patch, apply) may keep the values the stored object has, unchanged, as Kubernetes
  lets a client PUT back what it read; it may not add, change or remove a ``nodus.dev/`` label, nor add or
  change a controller reference to a Sweep. Removing the reference is allowed: it orphans the Job, as
  ``propagationPolicy=Orphan`` does.
"""

from __future__ import annotations

from typing import Final

from nodus_schema.fielding import ErrorList, FieldError, Path
from nodus_schema.meta import ObjectMeta, OwnerReference

__all__ = ["SERVER_LABEL_PREFIX", "is_server_label", "server_owned_errors"]

SERVER_LABEL_PREFIX: Final = "nodus.dev/"
"""Labels under this prefix are Nodus' (Kubernetes reserves kubernetes.io/ and k8s.io/ the same way)."""

_METADATA: Final = Path("metadata")


def is_server_label(key: str) -> bool:
    """Whether the label ``key`` is one only Nodus sets (``nodus.dev/...``, also ``x.nodus.dev/...``)."""
    prefix, slash, _ = key.rpartition("/")
    return bool(slash) and (prefix == "nodus.dev" or prefix.endswith(".nodus.dev"))


CONTROLLING_KINDS: Final = ("Sweep", "Pipeline")
"""Kinds whose controller ownerReference only Nodus sets: a Sweep's cells, a Pipeline's stages (#22)."""


def _controls_a_sweep(ref: OwnerReference) -> bool:
    return bool(ref.controller) and ref.kind in CONTROLLING_KINDS


def _only_nodus(ref: OwnerReference) -> str:
    if ref.kind == "Sweep":
        return (
            f"only the sweep controller makes a Job a cell of Sweep {ref.name!r} (controller: true): it "
            "creates every cell from the Sweep's matrix; remove this reference"
        )
    return (
        f"only the sweep controller makes an object a stage of Pipeline {ref.name!r} (controller: true): "
        "it creates every stage from the Pipeline's spec; remove this reference"
    )


def server_owned_errors(meta: ObjectMeta, old: ObjectMeta | None = None) -> list[FieldError]:
    """What ``meta`` sets of the server-owned metadata that ``old`` (the stored object's, for an update;
    None for a create) does not have as it is: each a Forbidden cause on the field, with what to do."""
    if not meta.labels and not meta.owner_references and (old is None or not old.labels):
        return []  # the common create: nothing to look at
    errs = ErrorList()
    labels = _METADATA.child("labels")
    kept = old.labels if old is not None else {}
    for key, value in meta.labels.items():
        if not is_server_label(key) or kept.get(key) == value:
            continue
        if key in kept:
            errs.forbidden(
                labels.key(key),
                f"{key} is set by Nodus and cannot change: keep {kept[key]!r}, as the object you read has it",
            )
        else:
            errs.forbidden(
                labels.key(key),
                f"labels under {SERVER_LABEL_PREFIX} are set by Nodus only (a Sweep's cells carry "
                f"{SERVER_LABEL_PREFIX}sweep and {SERVER_LABEL_PREFIX}cell); remove it, or use a label of "
                f"your own, such as example.com/{key.rpartition('/')[2]}",
            )
    for key, value in kept.items():
        if is_server_label(key) and key not in meta.labels:
            errs.forbidden(
                labels.key(key),
                f"{key} is set by Nodus and cannot be removed: keep {key}: {value!r}, as the object you read "
                "has it (a merge patch that leaves metadata.labels out keeps it)",
            )
    before = old.owner_references if old is not None else []
    refs = _METADATA.child("ownerReferences")
    for i, ref in enumerate(meta.owner_references):
        if _controls_a_sweep(ref) and ref not in before:
            errs.forbidden(
                refs.index(i).child("controller"),
                _only_nodus(ref)
                + (
                    ", or keep the one the object has, unchanged"
                    if any(map(_controls_a_sweep, before))
                    else ""
                ),
            )
    return errs.as_list()
