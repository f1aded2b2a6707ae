"""Names a spec gives that the catalog does not know: GPU types and families, region classes, offerings.

An unknown name is the spec's mistake, not a lack of capacity: ``resources.gpu.type: ["NOSUCHGPU"]`` or
``placement.regions: ["mars"]`` can never be placed, however long a client waits and retries. So it is a
422 Invalid with the cause on the exact field and the closest known names, while a *known* name that no
offering sells (B200 where the price book has none, MI300X in eu) stays what it is: CapacityUnavailable,
with a fix that says what would match.

Only the scheduler knows the catalog (the one it was started with, ``NODUS_CATALOG``), so these rules run
there, on the estimate a create or dry run asks for (``nodus_scheduler.estimating``), and travel back to
the gateway as field errors. Pure: the catalog and the nodes are arguments.

What is known:

* a GPU type is a variant id or a family of the catalog, compared without case, as matching compares them;
  with ``exact: true`` it must be a variant id (a family pins nothing);
* a region class is one an offering of any price book version has, or one a registered node is in;
* an offering is an offering id of any price book version, or one a registered node is a node of.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from nodus_schema.catalog import Catalog
from nodus_schema.decoding import suggest
from nodus_schema.fielding import CauseType, ErrorList, FieldError, Path
from nodus_schema.gpus import GPURequest, parse_gpu_parts
from nodus_schema.jobs import JobSpec
from nodus_schema.nodes import Node
from nodus_schema.sweeps import SweepSpec

__all__ = ["KnownNames", "known_names", "unknown_job_names", "unknown_sweep_names"]

_SHOWN = 8
"""Known names listed in a message when nothing is close: the first ones, sorted."""


@dataclass(frozen=True, slots=True)
class KnownNames:
    """The names a spec may use: variant ids and families (upper case), region classes, offering ids."""

    variants: frozenset[str]
    families: dict[str, tuple[str, ...]]
    """Family (upper case) -> its variant ids."""
    spelled: tuple[str, ...]
    """Every variant id and family as the catalog spells them, for suggestions."""
    regions: frozenset[str]
    offerings: frozenset[str]


def known_names(catalog: Catalog, nodes: Iterable[Node] = ()) -> KnownNames:
    """The names of ``catalog`` (every price book version it knows) and of the registered ``nodes``."""
    families: dict[str, list[str]] = {}
    for v in catalog.variants:
        families.setdefault(v.family.upper(), []).append(v.id)
    offerings = list(catalog.offerings)
    for book in catalog.pricebooks:
        offerings.extend(book.offerings)
    node_list = list(nodes)
    spelled = sorted({v.id for v in catalog.variants} | {v.family for v in catalog.variants})
    return KnownNames(
        variants=frozenset(v.id.upper() for v in catalog.variants),
        families={f: tuple(ids) for f, ids in families.items()},
        spelled=tuple(spelled),
        regions=frozenset(o.region_class for o in offerings) | {n.spec.region_class for n in node_list},
        offerings=frozenset(o.id for o in offerings) | {n.spec.offering for n in node_list},
    )


def _unknown(errs: ErrorList, path: Path, value: str, what: str, known: Iterable[str]) -> None:
    names = sorted(known)
    close = suggest(value, names)
    if close is not None:
        hint = f'did you mean "{close}"?'
    else:
        listed = ", ".join(names[:_SHOWN]) + (", ..." if len(names) > _SHOWN else "")
        hint = f"known: {listed}" if names else "none is known"
    errs.add(path, CauseType.NOT_SUPPORTED, f"Unsupported value: {value!r}: not a known {what}; {hint}")


def _gpu(errs: ErrorList, path: Path, value: GPURequest | str, names: KnownNames) -> None:
    """The type list of one GPU request; causes at ``<path>.type[i]`` (also for the "H100:1" form)."""
    if isinstance(value, str):
        try:
            types: Iterable[str] = parse_gpu_parts(value)[1]
        except ValueError:
            return  # validation reports the string
        exact = False
    else:
        types, exact = value.type, bool(value.exact)
    tp = path.child("type")
    for i, t in enumerate(types):
        upper = t.upper()
        if upper in names.variants:
            continue
        if upper not in names.families:
            _unknown(errs, tp.index(i), t, "accelerator id or family in the catalog", names.spelled)
        elif exact:
            variants = ", ".join(names.families[upper])
            errs.add(
                tp.index(i),
                CauseType.INVALID,
                f"Invalid value: {t!r}: is a family, and exact: true pins a variant: name one of {variants}, "
                "or drop exact to match any of them",
            )


def _placement(errs: ErrorList, path: Path, spec: JobSpec, names: KnownNames) -> None:
    p = spec.placement
    if p is None:
        return
    for i, region in enumerate(p.regions):
        if region not in names.regions:
            _unknown(errs, path.child("regions").index(i), region, "region class", names.regions)
    for i, offering in enumerate(p.offerings):
        if offering not in names.offerings:
            _unknown(errs, path.child("offerings").index(i), offering, "offering", names.offerings)


def _job_spec(errs: ErrorList, path: Path, spec: JobSpec, names: KnownNames) -> None:
    gpu = spec.resources.gpu if spec.resources is not None else None
    if gpu is not None:
        _gpu(errs, path.child("resources").child("gpu"), gpu, names)
    _placement(errs, path.child("placement"), spec, names)


def unknown_job_names(spec: JobSpec, names: KnownNames, path: str = "spec") -> list[FieldError]:
    """The names of a Job's spec the catalog does not know, each a cause on its field."""
    errs = ErrorList()
    _job_spec(errs, Path(path), spec, names)
    return errs.as_list()


def unknown_sweep_names(spec: SweepSpec, names: KnownNames) -> list[FieldError]:
    """The names of a Sweep's spec the catalog does not know: the template's and the matrix's."""
    errs = ErrorList()
    root = Path("spec")
    _job_spec(errs, root.child("template").child("spec"), spec.template.spec, names)
    matrix = root.child("matrix")
    for i, g in enumerate(spec.matrix.gpu):
        _gpu(errs, matrix.child("gpu").index(i), g, names)
    for i, region in enumerate(spec.matrix.regions):
        if region not in names.regions:
            _unknown(errs, matrix.child("regions").index(i), region, "region class", names.regions)
    return errs.as_list()
