"""A Sweep's results (issue #8): its cells as rows, the best cells marked, as JSON or CSV.

==========================================================  =====================  ==========================
route                                                       who                    answer
==========================================================  =====================  ==========================
GET  .../namespaces/{ns}/sweeps/{name}/results?format=      viewer of the project  SweepResults, or CSV
==========================================================  =====================  ==========================

The sweep controller writes ``status.cells`` and ``status.best``; this route reads the Sweep from the
``sweeps`` bucket and answers :func:`nodus_schema.results.results_of` of it (every cell in index order,
``costPerMillionUnits``, the best cells), or :func:`~nodus_schema.results.results_csv` of that. Nothing is
stored: the results are always the Sweep's current status, and the CLI's ``nodus sweep results`` writes
its CSV with the same function, so both give the same bytes.

Authorization is that of a get of the Sweep (a viewer may read): without a role in the project the Sweep
is hidden, a 404 like a missing one, as for every named object. A missing Sweep is 404 NotFound with the
command that lists Sweeps as its fix. CSV is chosen by ``format=csv`` or by an ``Accept`` header that lists
``text/csv`` before JSON, as for usage and invoices (:mod:`nodus_gateway.billingapi`).
"""

from __future__ import annotations

from typing import Final

from fastapi import APIRouter, Request
from starlette.responses import Response

from nodus_gateway.authorizing import authorize
from nodus_gateway.billingapi import FormatQ, csv_response, wants_csv
from nodus_gateway.clusterrouting import check_name, check_namespace
from nodus_gateway.resources import Stores, resource
from nodus_gateway.responding import object_response, store_errors
from nodus_gateway.routing import API_PREFIX
from nodus_kit.storing import ObjectStore
from nodus_schema import Sweep
from nodus_schema.results import results_csv, results_of

SUBRESOURCE: Final = "results"
RESULTS_PATH: Final = f"{API_PREFIX}/namespaces/{{namespace}}/sweeps/{{name}}/{SUBRESOURCE}"


def results_router(stores: Stores) -> APIRouter:
    """The results subresource of Sweeps."""
    res = resource("sweeps")
    store: ObjectStore[Sweep] = stores[res.plural]
    router = APIRouter(tags=[res.plural])

    @router.get(RESULTS_PATH, name="read results of sweeps")
    async def read_results(namespace: str, name: str, request: Request, format_: FormatQ = None) -> Response:
        check_namespace(namespace)
        await authorize(request, "get", res.plural, namespace)
        check_name(res, name, namespace)
        # Before the read: a format nobody serves is the caller's mistake, whether the Sweep exists or not.
        csv = wants_csv(request, format_)
        with store_errors(res, namespace, name):
            sweep = await store.get(namespace, name)
        results = results_of(sweep)
        if csv:
            return csv_response(results_csv(results), f"{name}-results.csv")
        return object_response(results)

    return router
