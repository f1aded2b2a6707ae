"""The resources beyond Sweeps and Jobs: attempts, nodes and offerings (read-only; the cluster admin may
delete a Node), secrets (write-only values) and connections; and the resource table's discovery-facing
fields."""

from __future__ import annotations

import base64
import logging
from typing import Any

import httpx
import pytest
from nats.aio.client import Client as NATS

from nodus_gateway.resources import RESOURCES, resource
from nodus_kit.storing import ObjectStore
from nodus_scheduler.publishing import publish_catalog
from nodus_schema import ObjectMeta
from nodus_schema.attempts import Attempt, AttemptSpec
from nodus_schema.catalog import Catalog, Offering, Variant
from nodus_schema.configs import Secret
from nodus_schema.nodes import Node, NodeSpec

API = "/apis/nodus.dev/v1"


def ns_path(namespace: str, plural: str, *rest: str) -> str:
    return "/".join([f"{API}/namespaces/{namespace}/{plural}", *rest])


def assert_status(resp: httpx.Response, code: int, reason: str) -> dict[str, Any]:
    assert resp.status_code == code, resp.text
    body: dict[str, Any] = resp.json()
    assert body["kind"] == "Status" and (body["code"], body["reason"]) == (code, reason)
    assert body["fix"] and body["requestId"] == resp.headers["x-request-id"]
    return body


def cause_fields(body: dict[str, Any]) -> set[str]:
    return {c["field"] for c in body["details"]["causes"]}


# ---------------------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------------------


def test_table_declares_scope_verbs_and_categories() -> None:
    by_plural = {r.plural: r for r in RESOURCES}
    assert {"sweeps", "jobs", "attempts", "secrets", "connections", "nodes", "offerings"} <= set(by_plural)
    assert [p for p, r in by_plural.items() if not r.namespaced] == ["nodes", "offerings"]
    for plural in ("attempts", "nodes", "offerings"):
        r = by_plural[plural]
        assert r.read_only and set(r.verbs) <= {"get", "list", "watch", "delete"} and r.written_by
        # Never created or changed through the API; only a Node may be deleted (the cluster admin's).
        assert ("delete" in r.verbs) == (plural == "nodes")
    for plural in ("sweeps", "jobs", "connections"):
        assert {"create", "get", "list", "update", "patch", "delete"} <= set(by_plural[plural].verbs)
    assert by_plural["sweeps"].subresources == ("status", "results")
    assert by_plural["jobs"].subresources == ("status",)
    # Secrets stay out of `kubectl get all`, as in Kubernetes.
    assert "all" not in by_plural["secrets"].categories and "all" in by_plural["sweeps"].categories
    assert "watch" not in by_plural["secrets"].verbs


def test_read_only_row_refuses_verbs_it_cannot_serve() -> None:
    r = resource("attempts")
    with pytest.raises(ValueError, match="read-only"):
        type(r)(**{**{f: getattr(r, f) for f in r.__dataclass_fields__}, "verbs": ("create",)})


# ---------------------------------------------------------------------------------------------------------
# Attempts, nodes, offerings: read-only
# ---------------------------------------------------------------------------------------------------------


def attempt(namespace: str, name: str) -> Attempt:
    spec = AttemptSpec(
        job="train",
        index=0,
        attempt=1,
        node="n1",
        offering="h100-x1",
        region_class="us",
        rate_micros_per_hour=2_500_000,
        pricebook_version="v1",
    )
    return Attempt(metadata=ObjectMeta(name=name, namespace=namespace), spec=spec)


async def test_attempts_list_and_get_and_refuse_writes(api: httpx.AsyncClient, nc: NATS, unique: str) -> None:
    await ObjectStore(nc, "attempts", Attempt).create(attempt(unique, "train-0-a1"))
    listed = await api.get(ns_path(unique, "attempts"))
    assert listed.status_code == 200, listed.text
    assert listed.json()["kind"] == "AttemptList"
    assert [i["metadata"]["name"] for i in listed.json()["items"]] == ["train-0-a1"]
    got = await api.get(ns_path(unique, "attempts", "train-0-a1"))
    assert got.status_code == 200 and got.json()["spec"]["job"] == "train"
    assert_status(await api.get(ns_path(unique, "attempts", "nope")), 404, "NotFound")

    writes = [
        api.post(ns_path(unique, "attempts"), json={"metadata": {"name": "x"}}),
        api.put(ns_path(unique, "attempts", "train-0-a1"), json={}),
        api.patch(ns_path(unique, "attempts", "train-0-a1"), json={}),
        api.delete(ns_path(unique, "attempts", "train-0-a1")),
    ]
    for write in writes:
        body = assert_status(await write, 405, "MethodNotAllowed")
        assert "written by the scheduler" in body["fix"]
    # Still there: the DELETE did nothing.
    assert (await api.get(ns_path(unique, "attempts", "train-0-a1"))).status_code == 200


async def test_nodes_are_listed_cluster_wide_after_an_agent_writes_one(
    api: httpx.AsyncClient, nc: NATS, unique: str
) -> None:
    node = Node(metadata=ObjectMeta(name=unique), spec=NodeSpec(offering="h100-x1", region_class="us"))
    await ObjectStore(nc, "nodes", Node).create(node)
    listed = await api.get(f"{API}/nodes")
    assert listed.status_code == 200, listed.text
    assert listed.json()["kind"] == "NodeList"
    assert unique in [i["metadata"]["name"] for i in listed.json()["items"]]
    got = await api.get(f"{API}/nodes/{unique}")
    assert got.status_code == 200 and got.json()["spec"]["offering"] == "h100-x1"
    assert "namespace" not in got.json()["metadata"]


async def test_the_admin_deletes_a_node_and_nothing_else_writes_one(
    api: httpx.AsyncClient, nc: NATS, unique: str
) -> None:
    # Issue #18: the record of an agent gone for good, removed by the operator (kubectl delete node).
    node = Node(metadata=ObjectMeta(name=unique), spec=NodeSpec(offering="h100-x1", region_class="us"))
    made = await ObjectStore(nc, "nodes", Node).create(node)
    item = f"{API}/nodes/{unique}"
    writes = [
        api.post(f"{API}/nodes", json={"metadata": {"name": "x"}}),
        api.put(item, json={"metadata": {"name": unique}}),
        api.patch(item, json={}, headers={"Content-Type": "application/merge-patch+json"}),
        api.delete(f"{API}/nodes"),  # deletecollection: one at a time only
    ]
    for write in writes:
        resp = await write
        body = assert_status(resp, 405, "MethodNotAllowed")
        assert "node agents" in body["fix"]
        item_write = resp.request.method in ("PUT", "PATCH")
        assert resp.headers["allow"] == ("GET, HEAD, DELETE" if item_write else "GET, HEAD")
    # A precondition on another revision is a Conflict; a dry run deletes nothing.
    stale = {"preconditions": {"resourceVersion": "1"}}
    assert_status(await api.request("DELETE", item, json=stale), 409, "Conflict")
    dry = await api.delete(item, params={"dryRun": "All"})
    assert dry.status_code == 200 and (await api.get(item)).status_code == 200
    rv = made.metadata.resource_version
    deleted = await api.request("DELETE", item, json={"preconditions": {"resourceVersion": rv}})
    assert deleted.status_code == 200, deleted.text
    body = deleted.json()
    assert (body["kind"], body["metadata"]["name"]) == ("Node", unique)
    assert body["metadata"]["deletionTimestamp"]
    assert_status(await api.get(item), 404, "NotFound")
    assert_status(await api.delete(item), 404, "NotFound")
    assert unique not in [i["metadata"]["name"] for i in (await api.get(f"{API}/nodes")).json()["items"]]
    assert_status(await api.delete(f"{API}/nodes/Not_A_Name"), 404, "NotFound")


def catalog(unique: str, version: str, offerings: list[tuple[str, int]]) -> Catalog:
    variant = Variant(id="H100-SXM-80G", family="H100", memory="80Gi", interconnect="NVLink")
    return Catalog(
        pricebook_version=version,
        variants=[variant],
        offerings=[
            Offering(
                id=f"{unique}-{suffix}",
                variant=variant.id,
                gpus_per_node=8,
                region_class="us",
                rate_micros_per_hour=micros,
            )
            for suffix, micros in offerings
        ],
    )


async def test_offerings_are_published_from_the_catalog_with_decimal_rates(
    api: httpx.AsyncClient, nc: NATS, unique: str
) -> None:
    first = await publish_catalog(nc, catalog(unique, "v1", [("a", 31_920_000), ("b", 2_500_001)]))
    assert set(first.created) == {f"{unique}-a", f"{unique}-b"}
    listed = await api.get(f"{API}/offerings", params={"labelSelector": "nodus.dev/pricebook-version=v1"})
    assert listed.status_code == 200, listed.text
    items = {i["metadata"]["name"]: i for i in listed.json()["items"]}
    assert set(items) == {f"{unique}-a", f"{unique}-b"}
    spec = items[f"{unique}-a"]["spec"]
    assert spec["rateUSDPerHour"] == "31.92" and isinstance(spec["rateUSDPerHour"], str)
    assert items[f"{unique}-b"]["spec"]["rateUSDPerHour"] == "2.500001"
    assert spec["gpusPerNode"] == 8 and spec["variant"] == "H100-SXM-80G" and spec["pricebookVersion"] == "v1"
    assert spec["host"] == {"cpu": "8", "memory": "64Gi", "disk": "200Gi"}
    rv = items[f"{unique}-a"]["metadata"]["resourceVersion"]

    # The same price book again writes nothing.
    again = await publish_catalog(nc, catalog(unique, "v1", [("a", 31_920_000), ("b", 2_500_001)]))
    assert (again.created, again.updated, again.deleted, again.unchanged) == ((), (), (), 2)
    got = await api.get(f"{API}/offerings/{unique}-a")
    assert got.json()["metadata"]["resourceVersion"] == rv

    # A new price book: a changed rate is updated, a dropped offering deleted.
    second = await publish_catalog(nc, catalog(unique, "v2", [("a", 30_000_000)]))
    assert second.updated == (f"{unique}-a",) and f"{unique}-b" in second.deleted
    got = await api.get(f"{API}/offerings/{unique}-a")
    assert got.json()["spec"]["rateUSDPerHour"] == "30.00" and got.json()["spec"]["pricebookVersion"] == "v2"
    assert_status(await api.get(f"{API}/offerings/{unique}-b"), 404, "NotFound")
    assert_status(await api.post(f"{API}/offerings", json={}), 405, "MethodNotAllowed")


# ---------------------------------------------------------------------------------------------------------
# Secrets
# ---------------------------------------------------------------------------------------------------------

PLAIN = "hunter2-do-not-show"
PLAIN_B64 = base64.b64encode(PLAIN.encode()).decode()
OTHER = "s3cr3t-other-value"


def secret_body(name: str, **extra: Any) -> dict[str, Any]:
    return {"apiVersion": "nodus.dev/v1", "kind": "Secret", "metadata": {"name": name}, **extra}


def assert_no_values(text: str) -> None:
    for value in (PLAIN, PLAIN_B64, OTHER, base64.b64encode(OTHER.encode()).decode()):
        assert value not in text


async def stored(nc: NATS, namespace: str, name: str) -> Secret:
    return await ObjectStore(nc, "secrets", Secret).get(namespace, name)


async def test_secret_values_are_write_only_and_never_logged(
    api: httpx.AsyncClient, nc: NATS, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    body = secret_body("db", data={"password": PLAIN_B64}, stringData={"token": OTHER})
    created = await api.post(ns_path(unique, "secrets"), json=body)
    assert created.status_code == 201, created.text
    assert_no_values(created.text)
    meta = created.json()["metadata"]
    assert created.json()["data"] == {"password": "", "token": ""}
    assert meta["generation"] == 1 and meta["annotations"]["nodus.dev/redacted"] == "data"
    assert "stringData" not in created.json()

    for resp in (
        await api.get(ns_path(unique, "secrets", "db")),
        await api.get(ns_path(unique, "secrets")),
        await api.get(f"{API}/secrets"),
        await api.get(ns_path(unique, "secrets", "db", "status")),
    ):
        assert resp.status_code in (200, 404), resp.text
        assert_no_values(resp.text)
    # Stored as given (base64), stringData folded in.
    kept = await stored(nc, unique, "db")
    assert base64.b64decode(kept.data["password"]).decode() == PLAIN
    assert base64.b64decode(kept.data["token"]).decode() == OTHER

    for record in caplog.records:
        assert_no_values(record.getMessage() + repr(record.__dict__))


async def test_secret_update_bumps_the_version_only_when_values_change(
    api: httpx.AsyncClient, nc: NATS, unique: str
) -> None:
    await api.post(ns_path(unique, "secrets"), json=secret_body("s", data={"a": PLAIN_B64}))
    fetched = (await api.get(ns_path(unique, "secrets", "s"))).json()

    # Writing back what GET returned ("" values) with a new label keeps the values and the version.
    fetched["metadata"]["labels"] = {"team": "ml"}
    same = await api.put(ns_path(unique, "secrets", "s"), json=fetched)
    assert same.status_code == 200, same.text
    assert same.json()["metadata"]["generation"] == 1 and same.json()["metadata"]["labels"] == {"team": "ml"}
    assert (await stored(nc, unique, "s")).data["a"] == PLAIN_B64

    changed = await api.put(ns_path(unique, "secrets", "s"), json=secret_body("s", stringData={"a": OTHER}))
    assert changed.status_code == 200, changed.text
    assert changed.json()["metadata"]["generation"] == 2
    assert_no_values(changed.text)
    assert base64.b64decode((await stored(nc, unique, "s")).data["a"]).decode() == OTHER

    patched = await api.patch(
        ns_path(unique, "secrets", "s"),
        json={"stringData": {"b": PLAIN}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert patched.status_code == 200, patched.text
    assert patched.json()["metadata"]["generation"] == 3 and patched.json()["data"] == {"a": "", "b": ""}
    assert_no_values(patched.text)
    assert base64.b64decode((await stored(nc, unique, "s")).data["a"]).decode() == OTHER

    stale = {**fetched, "metadata": {**fetched["metadata"], "resourceVersion": "1"}}
    assert_status(await api.put(ns_path(unique, "secrets", "s"), json=stale), 409, "Conflict")
    deleted = await api.delete(ns_path(unique, "secrets", "s"))
    assert deleted.status_code == 200 and deleted.json()["data"] == {"a": "", "b": ""}
    assert_status(await api.get(ns_path(unique, "secrets", "s")), 404, "NotFound")


async def test_invalid_secret_values_are_refused_without_quoting_them(
    api: httpx.AsyncClient, unique: str
) -> None:
    not_base64 = PLAIN + "!"
    resp = await api.post(ns_path(unique, "secrets"), json=secret_body("bad", data={"x": not_base64}))
    body = assert_status(resp, 422, "Invalid")
    assert cause_fields(body) == {"data[x]"}
    assert PLAIN not in resp.text
    resp = await api.post(ns_path(unique, "secrets"), json=secret_body("bad", stringData={"x": 12345678}))
    assert cause_fields(assert_status(resp, 422, "Invalid")) == {"stringData[x]"}
    assert "12345678" not in resp.text


# ---------------------------------------------------------------------------------------------------------
# Connections
# ---------------------------------------------------------------------------------------------------------


def ref(name: str, key: str) -> dict[str, str]:
    return {"name": name, "key": key}


def connection(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "nodus.dev/v1", "kind": "Connection", "metadata": {"name": name}, "spec": spec}


async def test_connections_valid_s3_and_postgres(api: httpx.AsyncClient, unique: str) -> None:
    s3 = {
        "type": "S3",
        "s3": {
            "endpoint": "https://s3.us-east-1.amazonaws.com",
            "bucket": "acme-data",
            "region": "us-east-1",
            "accessKeyIdRef": ref("aws", "id"),
            "secretAccessKeyRef": ref("aws", "secret"),
        },
    }
    resp = await api.post(ns_path(unique, "connections"), json=connection("data", s3))
    assert resp.status_code == 201, resp.text
    local = {"type": "S3", "s3": {"endpoint": "http://127.0.0.1:8333", "bucket": "local"}}
    resp = await api.post(ns_path(unique, "connections"), json=connection("local", local))
    assert resp.status_code == 201, resp.text

    neon = {
        "type": "Postgres",
        "postgres": {
            "provider": "Neon",
            "host": "ep-cool-1.us-east-2.aws.neon.tech",
            "database": "app",
            "user": "app",
            "passwordRef": ref("neon", "password"),
        },
    }
    resp = await api.post(ns_path(unique, "connections"), json=connection("db", neon))
    assert resp.status_code == 201, resp.text
    pg = resp.json()["spec"]["postgres"]
    assert (pg["port"], pg["sslMode"]) == (5432, "require")
    listed = await api.get(ns_path(unique, "connections"))
    assert [i["metadata"]["name"] for i in listed.json()["items"]] == ["data", "db", "local"]


async def test_connections_invalid_are_422_with_causes(api: httpx.AsyncClient, unique: str) -> None:
    s3 = {
        "type": "S3",
        "s3": {"endpoint": "http://minio.example.com", "bucket": "A", "accessKeyIdRef": ref("aws", "id")},
    }
    body = assert_status(
        await api.post(ns_path(unique, "connections"), json=connection("s", s3)), 422, "Invalid"
    )
    assert cause_fields(body) == {"spec.s3.endpoint", "spec.s3.bucket", "spec.s3.secretAccessKeyRef"}

    pg = {
        "type": "Postgres",
        "postgres": {
            "host": "db.example.com",
            "port": 70000,
            "user": "app",
            "sslMode": "disable",
            "passwordRef": {"name": "db"},
        },
    }
    body = assert_status(
        await api.post(ns_path(unique, "connections"), json=connection("p", pg)), 422, "Invalid"
    )
    assert cause_fields(body) == {
        "spec.postgres.port",
        "spec.postgres.database",
        "spec.postgres.sslMode",
        "spec.postgres.passwordRef.key",
    }

    # Credentials inline are an unknown field, with the reference suggested.
    inline = {
        "type": "Postgres",
        "postgres": {"host": "localhost", "database": "d", "user": "u", "password": "x"},
    }
    body = assert_status(
        await api.post(ns_path(unique, "connections"), json=connection("i", inline)), 422, "Invalid"
    )
    assert cause_fields(body) == {"spec.postgres.password"}

    mixed = {"type": "S3", "postgres": {"host": "localhost", "database": "d", "user": "u"}}
    body = assert_status(
        await api.post(ns_path(unique, "connections"), json=connection("m", mixed)), 422, "Invalid"
    )
    assert cause_fields(body) == {"spec.s3", "spec.postgres"}
