"""Hostile request bodies never reach a 500: nesting past the limit, bytes that are not UTF-8, lone
surrogates, duplicate fields (by fieldValidation, as Kubernetes treats them), JSON-patch bombs, and a
fuzz of a few hundred crafted bodies sent to every route that reads a body, each answer a 2xx/4xx whose
error body is a metav1.Status with a reason and a docs link."""

from __future__ import annotations

import copy
import itertools
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec
import pytest
import pytest_asyncio
from fastapi import FastAPI
from msgspec import inspect as mi
from nats.aio.client import Client as NATS

from nodus_billing.quoting import serve_quotes
from nodus_gateway.app import build_app
from nodus_gateway.patching import (
    MAX_COPIED_VALUES,
    MAX_OPERATIONS,
    PatchApplyError,
    PatchDecodeError,
    json_patch,
    merge_patch,
)
from nodus_gateway.principals import Principals
from nodus_gateway.resources import RESOURCES, stores_for
from nodus_scheduler.answering import serve_estimates
from nodus_scheduler.cataloging import load_catalog
from nodus_schema.parsing import MAX_DEPTH
from nodus_schema.wire import DOCS_BASE

ADMIN_TOKEN = "hostile-admin-token-0123456789"
V1 = "/apis/nodus.dev/v1"
JSON = "application/json"
YAML = "application/yaml"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"


def job_body(name: str = "j") -> dict[str, Any]:
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"image": "ghcr.io/acme/train:1.0", "command": ["python"], "resources": {"gpu": "H100:1"}},
    }


def sweep_body(name: str = "s") -> dict[str, Any]:
    template = {"kind": "Job", "spec": job_body()["spec"]}
    spec = {"matrix": {"params": {"LR": ["0.1", "0.01"]}}, "template": template}
    return {"apiVersion": "nodus.dev/v1", "kind": "Sweep", "metadata": {"name": name}, "spec": spec}


def connection_body(name: str = "c") -> dict[str, Any]:
    spec = {"type": "S3", "s3": {"endpoint": "http://127.0.0.1:8333", "bucket": "local"}}
    return {"apiVersion": "nodus.dev/v1", "kind": "Connection", "metadata": {"name": name}, "spec": spec}


def budget_body(name: str = "b") -> dict[str, Any]:
    spec = {"monthlyUSD": "500.00", "selector": {"team": "ml"}}
    return {"apiVersion": "nodus.dev/v1", "kind": "Budget", "metadata": {"name": name}, "spec": spec}


def secret_body(name: str = "sec") -> dict[str, Any]:
    return {"apiVersion": "nodus.dev/v1", "kind": "Secret", "metadata": {"name": name}, "data": {"a": "YQ=="}}


BODIES = {"sweeps": sweep_body, "jobs": job_body, "connections": connection_body, "budgets": budget_body}


@dataclass
class Gateway:
    """A gateway with admin routes, a project of its own and one object of each writable kind in it."""

    api: httpx.AsyncClient
    ns: str

    def path(self, plural: str, *rest: str) -> str:
        return "/".join([f"{V1}/namespaces/{self.ns}/{plural}", *rest])


@pytest_asyncio.fixture
async def gw(nc: NATS, unique: str) -> AsyncIterator[Gateway]:
    # The real estimate endpoints: a dry run of a Job or Sweep asks them, with whatever numbers it got.
    subs = [await serve_estimates(nc, load_catalog()), await serve_quotes(nc)]
    principals = Principals(nc, pepper=b"hostile-pepper", cache_ttl_s=0.2)
    app: FastAPI = build_app(stores_for(nc), admin_token=ADMIN_TOKEN, principals=principals)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://gateway",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    ) as api:
        g = Gateway(api, unique)
        resp = await api.post(f"{V1}/projects", json={"metadata": {"name": unique}})
        assert resp.status_code == 201, resp.text
        for plural, body in [*BODIES.items(), ("secrets", secret_body)]:
            resp = await api.post(g.path(plural), json=body())
            assert resp.status_code == 201, resp.text
        yield g
    for sub in subs:
        await sub.unsubscribe()


def status_of(resp: httpx.Response, code: int, reason: str) -> dict[str, Any]:
    assert resp.status_code == code, resp.text
    body: dict[str, Any] = resp.json()
    assert (body["kind"], body["code"], body["reason"]) == ("Status", code, reason)
    assert body["fix"] and body["docs"] == f"{DOCS_BASE}/errors/{reason}"
    return body


def nested(depth: int, kind: str = "[") -> bytes:
    if kind == "[":
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth


async def send(gw: Gateway, method: str, url: str, body: bytes, content_type: str) -> httpx.Response:
    return await gw.api.request(method, url, content=body, headers={"Content-Type": content_type})


# ---------------------------------------------------------------------------------------------------------
# Nesting
# ---------------------------------------------------------------------------------------------------------


async def test_json_nested_50000_deep_is_400_naming_the_limit_on_every_write(gw: Gateway) -> None:
    for body in (nested(50_000), nested(50_000, "{"), nested(MAX_DEPTH + 1)):
        for method, url, media in [
            ("POST", gw.path("jobs"), JSON),
            ("POST", gw.path("jobs") + "?dryRun=All", JSON),
            ("PUT", gw.path("jobs", "j"), JSON),
            ("PATCH", gw.path("jobs", "j"), MERGE),
            ("PATCH", gw.path("jobs", "j"), JSON_PATCH),
            ("PATCH", gw.path("jobs", "j"), STRATEGIC),
            ("PATCH", gw.path("jobs", "j") + "?fieldManager=t", APPLY),
            ("DELETE", gw.path("jobs", "j") + "?dryRun=All", JSON),
            ("POST", gw.path("secrets"), JSON),
            ("PATCH", gw.path("secrets", "sec"), MERGE),
            ("POST", f"{V1}/tokens", JSON),
            ("POST", f"{V1}/projects", JSON),
            ("POST", gw.path("account", "grants"), JSON),
        ]:
            resp = await send(gw, method, url, body, media)
            assert f"{MAX_DEPTH} levels" in status_of(resp, 400, "BadRequest")["message"], (method, url)


async def test_brackets_inside_strings_do_not_count_and_cannot_hide_depth(gw: Gateway) -> None:
    many = job_body("many-brackets")
    many["metadata"]["annotations"] = {"a": "[" * 5000, "b": "]" * 5000 + '\\"{{{'}
    resp = await gw.api.post(gw.path("jobs"), json=many)
    assert resp.status_code == 201, resp.text
    # Each "]" string would cancel the "[" before it if strings were not skipped: 300 levels really.
    hidden = b'{"spec": ' + b'["]",' * 300 + b"1" + b"]" * 300 + b"}"
    resp = await send(gw, "POST", gw.path("jobs"), hidden, JSON)
    assert f"{MAX_DEPTH} levels" in status_of(resp, 400, "BadRequest")["message"]


async def test_a_body_at_the_limit_is_read_and_judged_without_a_crash(gw: Gateway) -> None:
    body = job_body("deep")
    value: Any = "x"
    for _ in range(MAX_DEPTH - 3):  # the object, spec and its field are three levels
        value = [value]
    body["spec"]["command"] = value
    resp = await gw.api.post(gw.path("jobs"), json=body)
    assert "spec.command" in status_of(resp, 422, "Invalid")["message"]
    patch = {"spec": {"command": value}}
    resp = await send(gw, "PATCH", gw.path("jobs", "j"), msgspec.json.encode(patch), MERGE)
    status_of(resp, 422, "Invalid")


async def test_yaml_nested_past_the_limit_is_400_before_it_is_composed(gw: Gateway) -> None:
    flow = b"a: " + b"[" * 50_000 + b"]" * 50_000
    block = (
        "".join(f"{'  ' * i}a:\n" for i in range(MAX_DEPTH + 1)).encode() + b"  " * (MAX_DEPTH + 1) + b"1\n"
    )
    for body in (flow, block):
        resp = await send(gw, "POST", gw.path("jobs"), body, YAML)
        assert f"{MAX_DEPTH} levels" in status_of(resp, 400, "BadRequest")["message"]
        resp = await send(gw, "PATCH", gw.path("jobs", "j") + "?fieldManager=t", body, APPLY)
        assert f"{MAX_DEPTH} levels" in status_of(resp, 400, "BadRequest")["message"]
    # At the limit, PyYAML's recursive composer and constructor run, and the body is judged.
    at_limit = b"metadata: {name: y}\nspec:\n  command: " + b"[" * (MAX_DEPTH - 2) + b"]" * (MAX_DEPTH - 2)
    resp = await send(gw, "POST", gw.path("jobs"), at_limit, YAML)
    assert "spec.command" in status_of(resp, 422, "Invalid")["message"]


async def test_a_json_patch_cannot_build_what_a_body_may_not_be(gw: Gateway) -> None:
    # Each op nests one level deeper: ~1 MiB of patch would build ~1,000 levels, past every recursion.
    ops = [{"op": "add", "path": "/metadata/annotations", "value": {}}]
    ops += [{"op": "add", "path": "/metadata/annotations" + "/a" * n, "value": {}} for n in range(1, 900)]
    resp = await send(gw, "PATCH", gw.path("jobs", "j"), msgspec.json.encode(ops), JSON_PATCH)
    assert f"deeper than the limit of {MAX_DEPTH} levels" in status_of(resp, 422, "Invalid")["message"]


def test_json_patch_limits_operations_copies_and_depth() -> None:
    with pytest.raises(PatchDecodeError, match=f"maximum operations in a JSON patch is {MAX_OPERATIONS}"):
        json_patch({}, [{"op": "test", "path": "", "value": {}}] * (MAX_OPERATIONS + 1))
    # Each copy doubles /x: unbounded, 40 of them would need 2**40 values.
    doubling = [{"op": "add", "path": "/x", "value": [0]}] + [
        {"op": "copy", "from": "/x", "path": "/x/-"}
    ] * 40
    with pytest.raises(PatchApplyError, match=f"more than {MAX_COPIED_VALUES} values"):
        json_patch({}, doubling)
    big = [{"op": "add", "path": "/x", "value": list(range(1000))}]
    copies = [{"op": "copy", "from": "/x", "path": f"/y{i}"} for i in range(MAX_COPIED_VALUES // 1000 + 1)]
    with pytest.raises(PatchApplyError, match=f"more than {MAX_COPIED_VALUES} values"):
        json_patch({}, big + copies)
    # The n-th operation puts {} n levels down: the document is then n + 1 deep.
    deeper = [{"op": "add", "path": "/a" * n, "value": {}} for n in range(1, MAX_DEPTH + 1)]
    assert json_patch({}, deeper[:-1])  # exactly at the limit: fine
    with pytest.raises(PatchApplyError, match="deeper than the limit"):
        json_patch({}, deeper)
    with pytest.raises(PatchDecodeError, match="deeper than the limit"):
        merge_patch({}, msgspec.json.decode(nested(MAX_DEPTH + 1, "{")))


# ---------------------------------------------------------------------------------------------------------
# Bytes and characters
# ---------------------------------------------------------------------------------------------------------


async def test_invalid_utf8_is_400_naming_the_byte(gw: Gateway) -> None:
    for media in (JSON, YAML):
        body = b'{"metadata": {"name": "caf\xe9"}}'  # Latin-1, not UTF-8
        resp = await send(gw, "POST", gw.path("jobs"), body, media)
        message = status_of(resp, 400, "BadRequest")["message"]
        assert "not UTF-8: byte 26 (0xe9)" in message, message
    for body in (b'{"a": "\xed\xa0\x80"}', b'{"a": "\xc0\xaf"}', b'{"a": "\xe2\x82"}'):
        resp = await send(gw, "PATCH", gw.path("jobs", "j"), body, MERGE)
        assert "not UTF-8: byte 7" in status_of(resp, 400, "BadRequest")["message"]


async def test_lone_surrogates_are_400_in_json_and_yaml(gw: Gateway) -> None:
    resp = await send(gw, "POST", gw.path("jobs"), b'{"metadata": {"name": "\\ud800"}}', JSON)
    assert "surrogate" in status_of(resp, 400, "BadRequest")["message"]
    body = b'metadata: {name: x, annotations: {a: "\\ud800"}}\nspec: {image: x}\n'
    resp = await send(gw, "POST", gw.path("jobs"), body, YAML)
    assert "surrogate" in status_of(resp, 400, "BadRequest")["message"]
    resp = await send(gw, "PATCH", gw.path("jobs", "j") + "?fieldManager=t", body, APPLY)
    assert "surrogate" in status_of(resp, 400, "BadRequest")["message"]


async def test_nul_is_a_character_in_values_and_never_a_name(gw: Gateway) -> None:
    # As in Kubernetes, "\u0000" is a string's character like any other: kept in free text, refused
    # where a name must be a DNS label (names and namespaces become NATS subject tokens and KV keys).
    body = job_body("nul")
    body["metadata"]["annotations"] = {"note": "a\u0000b"}
    body["spec"]["command"] = ["echo", "\u0000"]
    resp = await gw.api.post(gw.path("jobs"), json=body)
    assert resp.status_code == 201, resp.text
    got = (await gw.api.get(gw.path("jobs", "nul"))).json()
    assert got["metadata"]["annotations"]["note"] == "a\u0000b" and got["spec"]["command"][1] == "\u0000"
    named = job_body("a\u0000b")
    status_of(await gw.api.post(gw.path("jobs"), json=named), 422, "Invalid")
    resp = await gw.api.post(f"{V1}/projects", json={"metadata": {"name": "p\u0000"}})
    status_of(resp, 422, "Invalid")
    resp = await send(gw, "POST", gw.path("jobs"), b'{"a": "\x00"}', JSON)  # a raw NUL byte is no JSON
    status_of(resp, 400, "BadRequest")


# ---------------------------------------------------------------------------------------------------------
# Duplicate fields, by fieldValidation
# ---------------------------------------------------------------------------------------------------------

DUPLICATED = (
    b'{"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": "first", "name": "dup"},'
    b' "spec": {"image": "a", "resources": {"gpu": "H100:1"}, "image": "b"}}'
)
DUPLICATED_YAML = b"""apiVersion: nodus.dev/v1
kind: Job
metadata:
  name: first
  name: dup-yaml
spec:
  image: a
  resources: {gpu: "H100:1"}
  image: b
"""


async def test_duplicate_fields_are_refused_under_strict_the_default(gw: Gateway) -> None:
    for query in ("", "?fieldValidation=Strict"):
        resp = await send(gw, "POST", gw.path("jobs") + query, DUPLICATED, JSON)
        body = status_of(resp, 400, "BadRequest")
        assert body["message"] == (
            'strict decoding error: duplicate field "metadata.name", duplicate field "spec.image"'
        )
        causes = [(c["field"], c["reason"]) for c in body["details"]["causes"]]
        assert causes == [("metadata.name", "FieldValueDuplicate"), ("spec.image", "FieldValueDuplicate")]
        resp = await send(gw, "POST", gw.path("jobs") + query, DUPLICATED_YAML, YAML)
        body = status_of(resp, 400, "BadRequest")
        assert body["message"] == (
            'strict decoding error: line 5: key "name" already set in map, '
            'line 9: key "image" already set in map'
        )
        assert [c["field"] for c in body["details"]["causes"]] == ["metadata.name", "spec.image"]


async def test_duplicate_fields_under_warn_are_accepted_with_kubernetes_warnings(gw: Gateway) -> None:
    resp = await send(gw, "POST", gw.path("jobs") + "?fieldValidation=Warn", DUPLICATED, JSON)
    assert resp.status_code == 201, resp.text
    assert resp.json()["metadata"]["name"] == "dup" and resp.json()["spec"]["image"] == "b"  # last wins
    assert resp.headers.get_list("Warning") == [
        '299 - "duplicate field \\"metadata.name\\""',
        '299 - "duplicate field \\"spec.image\\""',
    ]
    resp = await send(gw, "POST", gw.path("jobs") + "?fieldValidation=Warn", DUPLICATED_YAML, YAML)
    assert resp.status_code == 201, resp.text
    assert resp.headers.get_list("Warning") == [
        '299 - "line 5: key \\"name\\" already set in map"',
        '299 - "line 9: key \\"image\\" already set in map"',
    ]
    # With an unknown field too: both kinds of warning, and a patch warns the same way.
    body = b'{"spec": {"backoffLimit": 1, "backoffLimit": 2, "backofLimit": 3}}'
    resp = await send(gw, "PATCH", gw.path("jobs", "j") + "?fieldValidation=Warn", body, MERGE)
    assert resp.status_code == 200, resp.text
    assert resp.json()["spec"]["backoffLimit"] == 2
    assert set(resp.headers.get_list("Warning")) == {
        '299 - "duplicate field \\"spec.backoffLimit\\""',
        '299 - "unknown field \\"spec.backofLimit\\"; did you mean \\"backoffLimit\\"?"',
    }


async def test_a_body_of_repeats_gets_an_answer_of_bounded_size(gw: Gateway) -> None:
    long_name = "n" * 100_000
    repeats = "".join(f'"a{i}": 1, "a{i}": 2, ' for i in range(30_000))
    body = f'{{"spec": {{"a": 1, "a": 2, "a": 3, {repeats}"{long_name}": 1, "{long_name}": 2}}}}'.encode()
    resp = await send(gw, "POST", gw.path("jobs"), body, JSON)
    status = status_of(resp, 400, "BadRequest")
    assert status["message"].startswith(
        'strict decoding error: duplicate field "spec.a", duplicate field "spec.a0"'
    )
    assert len(status["details"]["causes"]) == 50 and "and 29952 more repeated fields" in status["message"]
    assert len(resp.content) < 20_000
    resp = await send(gw, "POST", gw.path("jobs") + "?fieldValidation=Warn", body, JSON)
    assert len(resp.headers.get_list("Warning")) == 51 and len(str(resp.headers)) < 20_000


async def test_duplicate_fields_under_ignore_are_accepted_silently(gw: Gateway) -> None:
    body = DUPLICATED.replace(b'"dup"', b'"dup-ignored"')
    resp = await send(gw, "POST", gw.path("jobs") + "?fieldValidation=Ignore", body, JSON)
    assert resp.status_code == 201, resp.text
    assert resp.json()["metadata"]["name"] == "dup-ignored" and "Warning" not in resp.headers


async def test_duplicate_fields_in_every_kind_of_body(gw: Gateway) -> None:
    cases = [
        (
            "PUT",
            gw.path("jobs", "j"),
            JSON,
            b'{"metadata": {"name": "j"}, "spec": {"a": 1, "a": 2}}',
            "spec.a",
        ),
        (
            "PATCH",
            gw.path("jobs", "j"),
            MERGE,
            b'{"spec": {"parallelism": 1, "parallelism": 2}}',
            "spec.parallelism",
        ),
        ("PATCH", gw.path("jobs", "j"), STRATEGIC, b'{"spec": {"x": [{"y": 1, "y": 2}]}}', "spec.x[0].y"),
        (
            "PATCH",
            gw.path("jobs", "j"),
            JSON_PATCH,
            b'[{"op": "add", "path": "/spec/parallelism", "path": "/spec/completions", "value": 2}]',
            "[0].path",
        ),
        ("PATCH", gw.path("secrets", "sec"), MERGE, b'{"data": {"a": "YQ==", "a": "Yg=="}}', "data.a"),
        (
            "POST",
            f"{V1}/tokens",
            JSON,
            b'{"spec": {"principal": "x", "principal": "admin"}}',
            "spec.principal",
        ),
        ("POST", f"{V1}/projects", JSON, b'{"metadata": {"name": "p1", "name": "p2"}}', "metadata.name"),
        (
            "POST",
            gw.path("account", "grants"),
            JSON,
            b'{"amountUSD": "1.00", "amountUSD": "9999"}',
            "amountUSD",
        ),
        (
            "DELETE",
            gw.path("jobs", "j") + "?dryRun=All",
            JSON,
            b'{"propagationPolicy": "Orphan", "propagationPolicy": "x"}',
            "propagationPolicy",
        ),
    ]
    for method, url, media, body, field in cases:
        resp = await send(gw, method, url, body, media)
        assert (
            status_of(resp, 400, "BadRequest")["message"]
            == f'strict decoding error: duplicate field "{field}"'
        )
    body = b"metadata: {name: j}\nspec: {parallelism: 1, parallelism: 2}\n"
    resp = await send(gw, "PATCH", gw.path("jobs", "j") + "?fieldManager=t", body, APPLY)
    assert 'key "parallelism" already set in map' in status_of(resp, 400, "BadRequest")["message"]


async def test_a_scalar_or_array_where_an_object_is_expected_is_400(gw: Gateway) -> None:
    # Every route but DELETE, whose body is optional (and, for now, ignored when it is no object).
    for method, url, patch_type in _routes(gw):
        if method == "DELETE" or url.endswith("/status"):
            continue
        for body in (b"null", b"1", b'"x"', b"true", b"[1]", b"[]" if patch_type != JSON_PATCH else b"{}"):
            resp = await send(gw, method, url, body, patch_type or JSON)
            status_of(resp, 400, "BadRequest")


# ---------------------------------------------------------------------------------------------------------
# The fuzz: a few hundred bodies to every route that reads one
# ---------------------------------------------------------------------------------------------------------


def _routes(gw: Gateway) -> list[tuple[str, str, str | None]]:
    """(method, url, the patch type a PATCH sends whatever the body is; None: the body's own type)."""
    routes: list[tuple[str, str, str | None]] = []
    for plural, name in (("sweeps", "s"), ("jobs", "j"), ("connections", "c"), ("budgets", "b")):
        routes += [
            ("POST", gw.path(plural), None),
            ("POST", gw.path(plural) + "?dryRun=All&fieldValidation=Warn", None),
            ("PUT", gw.path(plural, name) + "?fieldValidation=Ignore", None),
            ("PATCH", gw.path(plural, name), MERGE),
            ("PATCH", gw.path(plural, name) + "?dryRun=All", JSON_PATCH),
        ]
    routes += [
        ("PATCH", gw.path("jobs", "j"), STRATEGIC),
        ("PATCH", gw.path("jobs", "j") + "?fieldManager=fuzz", APPLY),
        ("PATCH", gw.path("sweeps", "s") + "?fieldManager=fuzz&dryRun=All", APPLY),
        ("PUT", gw.path("jobs", "j", "status"), None),
        ("DELETE", gw.path("jobs", "j") + "?dryRun=All", None),
        ("DELETE", gw.path("jobs") + "?dryRun=All", None),
        ("POST", gw.path("secrets"), None),
        ("PUT", gw.path("secrets", "sec"), None),
        ("PATCH", gw.path("secrets", "sec"), MERGE),
        ("PATCH", gw.path("secrets", "sec"), JSON_PATCH),
        ("POST", f"{V1}/tokens", None),
        ("POST", f"{V1}/projects", None),
        ("POST", gw.path("account", "grants"), None),
    ]
    return routes


def _hostile_json() -> Iterator[bytes]:
    yield from (nested(MAX_DEPTH + 1), nested(50_000), nested(20_000, "{"), b"[" * 50_000, b'{"a":' * 50_000)
    yield b'{"spec": ' + b'["]",' * 5000 + b"1" + b"]" * 5000 + b"}"
    yield b'{"spec": {"image": ' + nested(MAX_DEPTH - 2) + b"}}"  # exactly at the limit
    yield b'{"metadata": {"labels": ' + nested(MAX_DEPTH - 2, "{") + b"}}"
    for number in (
        b"1e400",
        b"-1e400",
        b"1e-400",
        b"9" * 4000,
        b"-" + b"9" * 4000,
        b"9" * 5000,
        b"1" + b"0" * 30,
    ):
        yield number
        yield b'{"spec": {"parallelism": ' + number + b', "image": ' + number + b"}}"
        yield b'{"amountUSD": ' + number + b', "metadata": {"name": ' + number + b"}}"
    for literal in (b"NaN", b"Infinity", b"-Infinity", b"nan", b"inf"):
        yield literal
        yield b'{"spec": {"parallelism": ' + literal + b"}}"
    yield from (
        b'{"a": "\xff"}',
        b"\xff\xfe{\x00}\x00",
        b'{"a": "\xc0\xaf"}',
        b'{"a": "\xed\xa0\x80"}',
        b"\x80",
    )
    yield from (b'\xef\xbb\xbf{"metadata": {"name": "bom"}}', b"\xef\xbb\xbf")
    yield from (
        b'{"a": 1, "a": 2}',
        b'{"metadata": {"name": "x", "name": "y"}}',
        b'[{"op": "add", "op": "remove"}]',
    )
    yield from (b'{"spec": 1, "\\u0073pec": 2}', b'{"data": {"a": "", "a": "YQ=="}}')
    for text in (b"\\u0000", b"\\ud800", b"\\udfff", b"\\ud800\\u0041", b"a\\u0000b", b"\\ud83d\\ude00"):
        yield b'{"metadata": {"name": "' + text + b'", "labels": {"' + text + b'": "' + text + b'"}}}'
        yield b'{"spec": {"image": "' + text + b'"}, "data": {"' + text + b'": "' + text + b'"}}'
    yield from (b'{"a": "\x00"}', b"\x00", b'{"a": "\n"}', b'{"a": "\\x"}')
    yield from (b"", b"   ", b"null", b"1", b'"x"', b"true", b"[]", b"[1, 2]", b"{}", b"[{}]", b"[null]")
    yield from (b"{}{}", b"{} x", b"{", b"}", b'{"a"}', b'{"a":}', b",", b'"\\')
    yield from (
        b'{"metadata": []}',
        b'{"metadata": "x"}',
        b'{"spec": []}',
        b'{"data": []}',
        b'{"spec": null}',
    )
    yield from (b'{"metadata": {"name": []}}', b'{"metadata": {"annotations": []}}', b'[{"op": 1}]')
    yield from (
        b'[{"op": "add", "path": 1, "value": 1}]',
        b'[{"op": "copy", "from": "/spec", "path": "/spec/x"}]',
    )
    yield from (b'[{"op": "move", "from": "/spec", "path": "/spec/x"}]', b'[{"op": "add", "path": "/a/b/c"}]')
    yield from (
        b'[{"op": "test", "path": "/metadata/name", "value": "zz"}]',
        b'[{"op": "remove", "path": ""}]',
    )
    yield from (b'{"propagationPolicy": []}', b'{"preconditions": {"uid": 1}}', b'{"spec": {"principal": 1}}')


def _hostile_yaml() -> Iterator[bytes]:
    yield b"a: " + b"[" * 50_000 + b"]" * 50_000
    yield "".join(f"{' ' * i}- \n" for i in range(0, 2 * (MAX_DEPTH + 5), 2)).encode()
    yield b"a: &a [1]\nb: [*a, *a]"
    yield from (
        b'a: "\\ud800"',
        b'a: "\\UFFFFFFFF"',
        b'"\\udc00": x',
        b"a: \xff",
        b"\xef\xbb\xbfmetadata: {name: bom}",
    )
    yield from (b"a: 1e400", b"a: !!float 1e400", b"a: .nan", b"a: .inf", b"spec: {parallelism: .nan}")
    yield from (
        b"a: " + b"1" * 5000,
        b"a: !!int " + b"9" * 5000,
        b"a: 0b" + b"1" * 20000,
        b"a: 0x" + b"f" * 5000,
    )
    yield from (b"a: !!timestamp 2001-99-99", b"metadata: {name: 2001-12-14}", b"a: !!binary aGVsbG8=")
    yield from (
        b"a: !!set {x}",
        b"a: !!omap [b: 1]",
        b"? [a]\n: b",
        b"1: a",
        b"null: a",
        b"~: a",
        b"{? {a: 1}: x}",
    )
    yield from (b"metadata: {name: x, name: y}", b"a: 1\n---\nb: 2", b"", b"~", b"- a", b"a:\n\t- b")
    yield from (b"a: !!python/object:os.system x", b"a: !!python/name:os.system", b'a: "\\0"', b"a: b: c")
    yield from (
        b"spec: {parallelism: " + b"9" * 30 + b"}",
        b"data: {a: !!binary aGVsbG8=}",
        b"metadata: !!str",
    )


def _int_paths(
    t: mi.Type, path: tuple[Any, ...] = (), seen: frozenset[Any] = frozenset()
) -> Iterator[tuple[Any, ...]]:
    """Every path to an integer (or float) field of a wire type, status left out (users never write it)."""
    if isinstance(t, mi.IntType | mi.FloatType):
        yield path
    elif isinstance(t, mi.UnionType):
        for member in t.types:
            yield from _int_paths(member, path, seen)
    elif isinstance(t, mi.StructType) and t.cls not in seen:
        for f in t.fields:
            if f.encode_name != "status":
                yield from _int_paths(f.type, (*path, f.encode_name), seen | {t.cls})
    elif isinstance(t, mi.ListType | mi.SetType | mi.FrozenSetType | mi.VarTupleType):
        yield from _int_paths(t.item_type, (*path, 0), seen)
    elif isinstance(t, mi.DictType):
        yield from _int_paths(t.value_type, (*path, "k"), seen)


def _with_number(base: dict[str, Any], path: tuple[Any, ...], number: bytes) -> bytes:
    """``base`` with ``number`` (raw JSON text: 1e400 has no Python value) at ``path``, whatever was on
    the way replaced by an object or a one-item array as the path needs."""
    body: Any = copy.deepcopy(base)
    node = body
    for segment, following in itertools.pairwise(path):
        node = _child(node, segment, [] if isinstance(following, int) else {})
    if isinstance(node, list):
        node[:] = ["__NUMBER__"]
    else:
        node[path[-1]] = "__NUMBER__"
    return msgspec.json.encode(body).replace(b'"__NUMBER__"', number)


def _child(node: Any, segment: Any, empty: Any) -> Any:
    if isinstance(node, list):
        if not node or type(node[0]) is not type(empty):
            node[:] = [empty]
        return node[0]
    if type(node.get(segment)) is not type(empty):
        node[segment] = empty
    return node[segment]


NUMBERS = (
    b"1180591620717411303424",
    b"-1180591620717411303424",
    b"18446744073709551616",
    b"1e400",
    b"-1e400",
    b"1.5",
)


def _number_bodies() -> Iterator[tuple[str, bytes]]:
    by_plural = {r.plural: r for r in RESOURCES}
    for plural, make in BODIES.items():
        base = make(f"num-{plural}")
        del base["metadata"]["name"]
        base["metadata"]["generateName"] = "num-"
        for path in dict.fromkeys(_int_paths(mi.type_info(by_plural[plural].object_type))):
            for number in NUMBERS:
                yield plural, _with_number(base, path, number)


def _is_status(resp: httpx.Response) -> bool:
    body = resp.json()
    reason = body.get("reason")
    return (
        body.get("kind") == "Status" and bool(reason) and body.get("docs") == f"{DOCS_BASE}/errors/{reason}"
    )


def _fuzz(gw: Gateway) -> list[tuple[str, str, str, bytes]]:
    """(method, url, content type, body): each hostile body to ROUTES_PER_BODY routes, so that every
    route gets every kind of body; the numbers to every create and to merge patches of a Job."""
    routes = _routes(gw)
    stride = max(1, len(routes) // ROUTES_PER_BODY)
    sent: list[tuple[str, str, str, bytes]] = []
    bodies = [(JSON, b) for b in _hostile_json()] + [(YAML, b) for b in _hostile_yaml()]
    for k, (media, body) in enumerate(bodies):
        # Body k goes to every stride-th route from k: neighbours (variants of one kind of body) go to
        # different routes, and each route gets one body in `stride` (every route: ~5,000 requests, 9 s).
        for j in range(ROUTES_PER_BODY):
            method, url, patch_type = routes[(k + j * stride) % len(routes)]
            sent.append((method, url, patch_type or media, body))
    for (method, url, _), media in zip(routes, itertools.cycle(WRONG_TYPES), strict=False):
        sent.append((method, url, media, b"{}"))
    for n, (plural, body) in enumerate(_number_bodies()):
        sent.append(("POST", gw.path(plural) + ("?dryRun=All" if n % 2 else ""), JSON, body))
    for path in dict.fromkeys(_int_paths(mi.type_info(RESOURCES[1].object_type))):
        for number in NUMBERS[::2]:
            sent.append(
                ("PATCH", gw.path("jobs", "j") + "?dryRun=All", MERGE, _with_number({}, path, number))
            )
    return sent


ROUTES_PER_BODY = 11
WRONG_TYPES = ("text/plain", "application/xml", "multipart/form-data", "application/x-www-form-urlencoded")


async def test_hostile_bodies_to_every_body_route_never_answer_5xx(gw: Gateway) -> None:
    sent = _fuzz(gw)
    failures: list[str] = []
    for method, url, media, body in sent:
        resp = await send(gw, method, url, body, media)
        if resp.status_code >= 500 or (resp.status_code >= 400 and not _is_status(resp)):
            failures.append(f"{method} {url} [{media}] {body[:80]!r} -> {resp.status_code} {resp.text[:300]}")
    assert {(m, u) for m, u, _, _ in sent} >= {(m, u) for m, u, _ in _routes(gw)}
    assert not failures, f"{len(failures)} of {len(sent)}:\n" + "\n".join(failures[:40])
