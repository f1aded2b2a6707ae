"""schemathesis against the gateway: no server error, and every response as the served OpenAPI says.

The issue asks for "OpenAPI served and accurate for every path and type; a schemathesis run in CI finds no
server error and no response that violates the schema". This is that run:

* the gateway app, built as tests/gateway/conftest.py builds it (plus ``Principals``, so that the
  projects and tokens endpoints are served and documented too), on uvicorn on a free port in the
  session's loop, against the session's nats-server; schemathesis runs in a worker thread, because its
  requests block;
* the schemas are the documents the gateway serves itself: every /openapi/v3 document (the one of
  nodus.dev/v1 holds the resources), then /openapi/v2;
* every operation gets positive and negative cases with generated values, then positive cases aimed at
  objects that exist (a Sweep, a Job, a Secret, a Connection, an Attempt, a Node, an Offering, a project
  and a token, seeded before the run), so that the answers with objects in them are checked too, not only
  the errors of names that exist nowhere;
* the checks: ``not_a_server_error``, ``status_code_conformance``, ``content_type_conformance``,
  ``response_headers_conformance`` and ``response_schema_conformance``; and here, on top of them, that
  every error is a metav1.Status (ADR-028).

Watches are handled apart. A watch streams until the client goes or its ``timeoutSeconds`` passes, and
its body is newline-delimited WatchEvents under ``Content-Type: application/json``, as the kube-apiserver
sends them (and documents them: the 200 of a watch is a WatchEvent, one per line); schemathesis would wait
for the stream to end and then read the whole body as one JSON document. So:

* the list operations get ``watch=false`` in the generated passes (any other value but "0" and "" starts
  a watch: see routing._truthy), and the /watch/ operations are left out of them;
* a watch pass then calls every list operation with ``watch=true`` and every /watch/ operation, always
  with ``timeoutSeconds=1`` so that each stream ends, the operations in parallel threads (each waits about
  a second), and checks every line as the response schema of its operation (a WatchEvent) and the object
  of each event as its resource's schema (a Status for an ERROR event).

Hypothesis runs derandomized, without a database and without shrinking: a failure is collected with its
curl command rather than raised, so one run reports every operation that fails. More examples for a
deeper local run: ``NODUS_SCHEMATHESIS_EXAMPLES=100``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from nats.aio.client import Client as NATS
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from nodus_gateway import estimating
from nodus_gateway.app import build_app
from nodus_gateway.principals import Principals
from nodus_gateway.resources import stores_for
from nodus_gateway.server import ApiServer
from nodus_gateway.storeaccess import StoreAccess, StoreSettings
from nodus_kit.storing import ObjectStore
from nodus_schema import ObjectMeta
from nodus_schema.attempts import Attempt, AttemptSpec
from nodus_schema.catalog import Offering as CatalogOffering
from nodus_schema.nodes import Node, NodeSpec
from nodus_schema.offerings import Offering, offering_object
from nodus_testing.seaweed import SeaweedS3

pytestmark = pytest.mark.slow

API = "/apis/nodus.dev/v1"
ADMIN_TOKEN = "test-admin-token-0123456789"  # conftest.py's
EXAMPLES = int(os.environ.get("NODUS_SCHEMATHESIS_EXAMPLES", "8"))
"""Examples per operation and pass; the v2 passes take a third of them (the same routes again)."""
WATCH_EXAMPLES = 2
WATCH_TIMEOUT_S = 1
REQUEST_TIMEOUT_S = 10.0
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
SEED = "seed"

Case = Any  # schemathesis.Case; its generated attributes are untyped


@dataclass
class Seeds:
    """The objects that exist before the run, by the plural of their path (what ``{name}`` is)."""

    namespace: str
    names: dict[str, str]
    bodies: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The body each API-written seed is created with, to create it again after a DELETE took it."""

    def path_parameters(self, path: str) -> dict[str, str] | None:
        params = set(re.findall(r"\{(\w+)\}", path))
        if not params:
            return None
        out: dict[str, str] = {}
        if "namespace" in params:
            out["namespace"] = self.namespace
        if "key" in params:
            out["key"] = "apis/nodus.dev/v1"
        if "name" in params:
            plural = path.split("/{name}")[0].rsplit("/", 1)[-1]
            if plural not in self.names:
                return None
            out["name"] = self.names[plural]
        return out if set(out) == params else None


@dataclass
class Run:
    base_url: str
    headers: dict[str, str]
    seeds: Seeds
    failures: list[str] = field(default_factory=list)
    calls: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, case: Case, what: str) -> None:
        curl = case.as_curl_command(headers=self.headers, base_url=self.base_url)
        with self.lock:
            self.failures.append(f"{case.operation.label}\n{what.strip()}\n{curl}")

    def call(self, case: Case, **kwargs: Any) -> requests.Response | None:
        with self.lock:
            self.calls += 1
        try:
            return case.call(
                base_url=self.base_url, headers=self.headers, timeout=REQUEST_TIMEOUT_S, **kwargs
            )
        except requests.RequestException as e:
            self.record(case, f"no answer: {e!r}")
            return None

    def reseed(self) -> None:
        """Create again the seeds a DELETE (of one, or of the collection) took; 409 means still there."""
        for path, body in self.seeds.bodies.items():
            resp = requests.post(self.base_url + path, json=body, headers=self.headers, timeout=10)
            assert resp.status_code in (201, 409), resp.text


def hypothesis_settings(examples: int) -> settings:
    # derandomize: the same cases on every run (CI is repeatable); no database, no shrinking: failures
    # are collected, not raised (see the module docstring).
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )


def is_watch(op: Any) -> bool:
    return "/watch/" in op.path


def takes_watch(op: Any) -> bool:
    return any(p.name == "watch" for p in op.query)


def takes_follow(op: Any) -> bool:
    return any(p.name == "follow" for p in op.query)


def strategy(op: Any, mode: GenerationMode, **fixed: Any) -> st.SearchStrategy[Case]:
    # A watch, or a followed log of a Job that never finishes, streams until the client goes: the
    # generated passes read lists and logs once (watches have a pass of their own, below).
    query = {"watch": "false"} if takes_watch(op) else {"follow": "false"} if takes_follow(op) else None
    return op.as_strategy(mode, query=query, **fixed)


def fuzz(run: Run, op: Any, cases: st.SearchStrategy[Case], examples: int) -> None:
    @hypothesis_settings(examples)
    @given(case=cases)
    def each(case: Case) -> None:
        response = run.call(case)
        if response is None:
            return
        check(run, case, response, CHECKS)
        if case.method.upper() == "DELETE" and response.status_code in (200, 202):
            run.reseed()

    each()


def check(run: Run, case: Case, response: requests.Response, checks: list[Callable[..., Any]]) -> None:
    try:
        case.validate_response(response, checks=checks, headers=run.headers)
    except schemathesis.errors.FailureGroup as e:
        run.record(case, str(e))
    if response.status_code >= 400:
        # ADR-028, beyond what the document can say: every error is a metav1.Status with its code.
        try:
            body = response.json()
        except ValueError:
            body = None
        if not (
            isinstance(body, dict)
            and body.get("kind") == "Status"
            and body.get("code") == response.status_code
        ):
            run.record(case, f"{response.status_code} is not a metav1.Status: {response.text[:300]}")


# ---------------------------------------------------------------------------------------------------------
# Watches
# ---------------------------------------------------------------------------------------------------------


def watch_pass(run: Run, schema: Any, ops: list[Any]) -> None:
    """Every watch once or twice, each stream ended by timeoutSeconds, the operations side by side."""
    watches = [op for op in ops if is_watch(op) or takes_watch(op)]
    with ThreadPoolExecutor(max_workers=len(watches) or 1) as pool:
        for future in [pool.submit(_watch_operation, run, schema, op) for op in watches]:
            future.result()


def _watch_operation(run: Run, schema: Any, op: Any) -> None:
    query: dict[str, Any] = {"timeoutSeconds": WATCH_TIMEOUT_S}
    if takes_watch(op):
        query["watch"] = "true"
    fixed = run.seeds.path_parameters(op.path)
    cases = op.as_strategy(GenerationMode.POSITIVE, query=query, path_parameters=fixed)

    @hypothesis_settings(WATCH_EXAMPLES)
    @given(case=cases)
    def each(case: Case) -> None:
        response = run.call(case)
        if response is None:
            return
        if response.status_code != 200:
            check(run, case, response, CHECKS)
            return
        # The stream as a whole: status code, content type, headers; then each event on its own.
        check(run, case, response, [c for c in CHECKS if c is not response_schema_conformance])
        for line in response.content.splitlines():
            if line.strip():
                _check_event(run, schema, case, response, line)

    each()


def _check_event(run: Run, schema: Any, case: Case, response: requests.Response, line: bytes) -> None:
    one = _as_response(response, 200, line)
    try:
        case.validate_response(one, checks=[response_schema_conformance])
        event = json.loads(line)
        # The object: as its resource's GET answers it (a Status: as any error of that GET).
        item = schema[_item_path(case.operation.path)]["GET"]
        code = event["object"].get("code", 500) if event["type"] == "ERROR" else 200
        obj = json.dumps(event["object"]).encode()
        item.Case().validate_response(_as_response(response, code, obj), checks=[response_schema_conformance])
    except schemathesis.errors.FailureGroup as e:
        run.record(case, f"watch event {line[:300]!r}:\n{e}")
    except (ValueError, KeyError, TypeError) as e:
        run.record(case, f"watch event {line[:300]!r} is not a WatchEvent: {e!r}")


def _item_path(path: str) -> str:
    """``/apis/nodus.dev/v1[/watch][/namespaces/{namespace}]/sweeps`` → the path of one Sweep."""
    plural = path.rstrip("/").rsplit("/", 1)[-1]
    return f"{API}/namespaces/{{namespace}}/{plural}/{{name}}"


def _as_response(like: requests.Response, code: int, content: bytes) -> schemathesis.Response:
    return schemathesis.Response(
        status_code=code,
        headers={"content-type": ["application/json"]},
        content=content,
        request=like.request,
        elapsed=0.0,
        verify=True,
    )


# ---------------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------------


def operations(schema: Any) -> Iterator[Any]:
    for result in schema.get_all_operations():
        yield result.ok()  # an operation schemathesis cannot read is a broken document: raise


def run_document(run: Run, url: str, examples: int) -> list[Any]:
    """The generated passes over one document; returns its operations."""
    schema = schemathesis.openapi.from_url(url, headers=run.headers, config=schemathesis.Config())
    ops = list(operations(schema))
    for op in ops:
        if is_watch(op):
            continue  # the watch pass's
        fuzz(run, op, strategy(op, GenerationMode.POSITIVE), examples)
        try:
            fuzz(run, op, strategy(op, GenerationMode.NEGATIVE), examples)
        except Unsatisfiable:
            pass  # nothing of the operation can be made invalid (no parameters, no body)
        fixed = run.seeds.path_parameters(op.path)
        if fixed:
            fuzz(run, op, strategy(op, GenerationMode.POSITIVE, path_parameters=fixed), examples)
    if any(is_watch(op) or takes_watch(op) for op in ops):
        watch_pass(run, schema, ops)
    return ops


def run_all(run: Run) -> int:
    index = requests.get(f"{run.base_url}/openapi/v3", headers=run.headers, timeout=10).json()
    keys = sorted(index["paths"], key=lambda k: k != "apis/nodus.dev/v1")  # the resources first
    count = 0
    for key in keys:
        count += len(run_document(run, run.base_url + index["paths"][key]["serverRelativeURL"], EXAMPLES))
    # Swagger 2.0: the same routes again, through the v2 dialect of the same schemas (no anyOf, no
    # nullable), with fewer examples. Its watches were streamed already.
    schema = schemathesis.openapi.from_url(
        f"{run.base_url}/openapi/v2", headers=run.headers, config=schemathesis.Config()
    )
    for op in operations(schema):
        if not is_watch(op):
            fuzz(run, op, strategy(op, GenerationMode.POSITIVE), max(1, EXAMPLES // 3))
            fixed = run.seeds.path_parameters(op.path)
            if fixed:
                fuzz(
                    run,
                    op,
                    strategy(op, GenerationMode.POSITIVE, path_parameters=fixed),
                    max(1, EXAMPLES // 3),
                )
    return count


async def seed(client: httpx.AsyncClient, nc: NATS, unique: str) -> Seeds:
    namespace = f"st-{unique}"
    job_spec = {
        "image": "ghcr.io/acme/train:1.0",
        "command": ["python", "train.py"],
        "resources": {"gpu": "H100:1"},
    }
    bodies = {
        f"{API}/projects": {"metadata": {"name": namespace}, "spec": {"description": "schemathesis"}},
        f"{API}/namespaces/{namespace}/sweeps": {
            "apiVersion": "nodus.dev/v1",
            "kind": "Sweep",
            "metadata": {"name": SEED, "labels": {"app": "schemathesis"}},
            "spec": {"matrix": {"params": {"LR": ["0.1", "0.01"]}}, "template": {"spec": job_spec}},
        },
        f"{API}/namespaces/{namespace}/jobs": {
            "apiVersion": "nodus.dev/v1",
            "kind": "Job",
            "metadata": {"name": SEED},
            "spec": job_spec,
        },
        f"{API}/namespaces/{namespace}/secrets": {
            "apiVersion": "nodus.dev/v1",
            "kind": "Secret",
            "metadata": {"name": SEED},
            "stringData": {"token": "do-not-show"},
        },
        f"{API}/namespaces/{namespace}/connections": {
            "apiVersion": "nodus.dev/v1",
            "kind": "Connection",
            "metadata": {"name": SEED},
            "spec": {"type": "S3", "s3": {"endpoint": "http://127.0.0.1:8333", "bucket": "local"}},
        },
    }
    for path, body in bodies.items():
        resp = await client.post(path, json=body)
        assert resp.status_code == 201, resp.text
    token = await client.post(
        f"{API}/tokens", json={"spec": {"principal": "fuzz", "roles": {namespace: "viewer"}}}
    )
    assert token.status_code == 201, token.text
    # What services write, written as they write it.
    attempt = Attempt(
        metadata=ObjectMeta(name=f"{SEED}-0-a1", namespace=namespace),
        spec=AttemptSpec(
            job=SEED,
            index=0,
            attempt=1,
            node=unique,
            offering=f"{unique}-h100",
            region_class="us",
            rate_micros_per_hour=2_500_000,
            pricebook_version="v1",
        ),
    )
    await ObjectStore(nc, "attempts", Attempt).create(attempt)
    node = Node(metadata=ObjectMeta(name=unique), spec=NodeSpec(offering=f"{unique}-h100", region_class="us"))
    await ObjectStore(nc, "nodes", Node).create(node)
    offering = CatalogOffering(
        id=f"{unique}-h100",
        variant="H100-SXM-80G",
        gpus_per_node=8,
        region_class="us",
        rate_micros_per_hour=31_920_000,
    )
    await ObjectStore(nc, "offerings", Offering).create(offering_object(offering, "v1"))
    names = {p: SEED for p in ("sweeps", "jobs", "secrets", "connections")}
    names |= {
        "attempts": attempt.metadata.name or "",
        "nodes": unique,
        "offerings": f"{unique}-h100",
        "projects": namespace,
        "tokens": token.json()["metadata"]["name"],
    }
    return Seeds(namespace, names, bodies)


async def test_the_checks_catch_what_they_are_for(nc: NATS) -> None:
    """The run below passes only if the checks bite: a body off the schema, an undocumented content type
    and a server error are each caught, for a document the gateway serves."""
    app = build_app(stores_for(nc), admin_token=ADMIN_TOKEN)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://gateway",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    ) as client:
        index = (await client.get("/openapi/v3")).json()
        doc = (await client.get(index["paths"]["apis/nodus.dev/v1"]["serverRelativeURL"])).json()
    schema = schemathesis.openapi.from_dict(doc, config=schemathesis.Config())
    case = schema[f"{API}/namespaces/{{namespace}}/sweeps/{{name}}"]["GET"].Case(
        path_parameters={"namespace": "p", "name": "s"}
    )
    request = requests.Request("GET", f"http://gateway{API}/namespaces/p/sweeps/s").prepare()

    def answer(code: int, body: Any, content_type: str = "application/json") -> schemathesis.Response:
        content = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        return schemathesis.Response(code, {"content-type": [content_type]}, content, request, 0.0, True)

    status = {
        "apiVersion": "v1",
        "kind": "Status",
        "code": 500,
        "reason": "InternalError",
        "status": "Failure",
    }
    wrong = [
        answer(200, {"kind": "Sweep", "metadata": {"name": 5}}),
        answer(200, "<html></html>", "text/html"),
        answer(500, status),
    ]
    for response in wrong:
        with pytest.raises(schemathesis.errors.FailureGroup):
            case.validate_response(response, checks=CHECKS)
    case.validate_response(answer(200, {"kind": "Sweep", "metadata": {"name": "s"}}), checks=CHECKS)


async def test_schemathesis_finds_no_server_error_and_no_response_off_the_schema(
    nc: NATS, unique: str, seaweed: SeaweedS3
) -> None:
    estimating.resume(nc)
    principals = Principals(nc, pepper=b"schemathesis-pepper", cache_ttl_s=0.2)
    # A real store: without one, the blob and file routes answer 503 to every well-formed request.
    store = StoreAccess(
        StoreSettings(
            bucket=f"fuzz-{unique}",
            endpoint=seaweed.endpoint_url,
            access_key=seaweed.access_key,
            secret_key=seaweed.secret_key,
        )
    )
    await (await store.client()).create_bucket(Bucket=f"fuzz-{unique}")
    app = build_app(
        stores_for(nc),
        admin_token=ADMIN_TOKEN,
        ready=lambda: nc.is_connected,
        principals=principals,
        store=store,
    )
    server = ApiServer(app, "127.0.0.1", 0)
    await server.start()
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    try:
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=10) as client:
            seeds = await seed(client, nc, unique)
        run = Run(server.url, headers, seeds)
        operation_count = await asyncio.to_thread(run_all, run)
    finally:
        await server.stop()
        await store.close()
    assert operation_count > 60 and run.calls > operation_count * EXAMPLES
    assert not run.failures, f"{len(run.failures)} failures:\n\n" + "\n\n".join(run.failures[:30])
