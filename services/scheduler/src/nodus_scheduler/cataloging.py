"""The accelerator catalog and the versioned price book, loaded from the data file shipped with the scheduler.

The file (``data/catalog.json``, or the one ``NODUS_CATALOG`` names) holds the variants and every price book
version::

    {"variants": [...],
     "pricebooks": [{"version": "2026-11-30.1", "effectiveTime": "...", "offerings": [...]},
                    {"version": "2026-09-01.1", ...}]}

The older single-book form (``{"pricebookVersion": ..., "variants": [...], "offerings": [...]}``) is still
read. :func:`load_catalog` answers the newest version, or the one asked for; either knows every version
(:meth:`Catalog.at`).

"A new price book version applies to new admissions only" (ADR-0014): a Job is placed and priced at the
version it was admitted under, ``status.estimate.pricebookVersion`` (the gateway records it with the
estimate of a create). A Job without one is pinned to the newest version when the scheduler first sees it:
:func:`pin_pricebook` says what to record, :func:`catalog_for` which catalog to place it with.
"""

from __future__ import annotations

import logging
from importlib import resources
from pathlib import Path

import msgspec

from nodus_schema.catalog import Catalog, Offering, PriceBook, UnknownPricebook, Variant, catalog_errors
from nodus_schema.costs import Estimate
from nodus_schema.jobs import Job, JobStatus
from nodus_schema.wire import Wire

log = logging.getLogger(__name__)


class CatalogFile(Wire):
    """The data file: the variants and every price book (or, in the older form, one book inline)."""

    variants: list[Variant] = msgspec.field(default_factory=list)
    pricebooks: list[PriceBook] = msgspec.field(default_factory=list)
    pricebook_version: str | None = None
    offerings: list[Offering] = msgspec.field(default_factory=list)


def parse_catalog(data: bytes, version: str | None = None) -> Catalog:
    """The catalog in ``data`` at ``version`` (default: the newest); raises ValueError when the file is
    unsound (a duplicate id, an unknown variant, a bad rate or quantity, …) or the version is unknown."""
    file = msgspec.json.decode(data, type=CatalogFile)
    books = list(file.pricebooks)
    if file.pricebook_version is not None:
        books.append(PriceBook(version=file.pricebook_version, offerings=file.offerings))
    if not books:
        raise ValueError("the catalog file has no price book")
    first = books[0]
    newest = Catalog(
        pricebook_version=first.version, variants=file.variants, offerings=first.offerings, pricebooks=books
    ).latest()
    errors = catalog_errors(newest)
    if errors:
        raise ValueError("the catalog file is not sound: " + "; ".join(errors))
    if version is None:
        return newest
    try:
        return newest.at(version)
    except UnknownPricebook:
        raise ValueError(f"no price book {version!r}; known: {', '.join(newest.versions())}") from None


def load_catalog(path: str | Path | None = None, version: str | None = None) -> Catalog:
    """The price book at ``path`` (NODUS_CATALOG), else the one shipped in ``nodus_scheduler/data``, at
    ``version`` (default: the newest). The answer knows every version of the file (``catalog.at(v)``)."""
    if path:
        data = Path(path).read_bytes()
    else:
        data = resources.files("nodus_scheduler").joinpath("data/catalog.json").read_bytes()
    return parse_catalog(data, version)


# ---------------------------------------------------------------------------------------------------------
# Which version a Job is placed and priced at
# ---------------------------------------------------------------------------------------------------------


def recorded_pricebook(job: Job) -> str | None:
    """The price book version recorded on the Job (``status.estimate.pricebookVersion``), if any."""
    estimate = job.status.estimate
    return estimate.pricebook_version if estimate is not None else None


def pricebook_version_of(job: Job, catalog: Catalog) -> str:
    """The version the Job is placed and priced at: the one recorded on it when this catalog knows it, else
    the newest (a Job admitted without an estimate, or under a version this scheduler does not ship)."""
    recorded = recorded_pricebook(job)
    if recorded is not None:
        try:
            return catalog.at(recorded).pricebook_version
        except UnknownPricebook:
            log.warning(
                "unknown price book; placing at the newest",
                extra={
                    "job": job.metadata.name,
                    "recorded": recorded,
                    "newest": catalog.latest().pricebook_version,
                },
            )
    return catalog.latest().pricebook_version


def catalog_for(job: Job, catalog: Catalog) -> Catalog:
    """The catalog to place and price ``job`` with: ``catalog.at(pricebook_version_of(job, catalog))``."""
    return catalog.at(pricebook_version_of(job, catalog))


def pin_pricebook(status: JobStatus, catalog: Catalog) -> JobStatus:
    """``status`` with ``estimate.pricebookVersion`` set to the newest version when none is recorded yet (the
    scheduler's first look at a Job admitted without one); unchanged otherwise. A recorded version is never
    replaced, not even an unknown one: the record says what the Job was admitted under."""
    estimate = status.estimate
    if estimate is not None and estimate.pricebook_version is not None:
        return status
    version = catalog.latest().pricebook_version
    pinned = (
        Estimate(pricebook_version=version)
        if estimate is None
        else msgspec.structs.replace(estimate, pricebook_version=version)
    )
    return msgspec.structs.replace(status, estimate=pinned)
