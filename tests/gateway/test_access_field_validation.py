"""Unknown fields on tokens and projects, as on every other kind (ADR-0012): fieldValidation Strict (the
default) is a 422 naming each field with its "did you mean", Warn a ``Warning: 299`` header per field,
Ignore drops them silently; an unsupported value is a 400."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS

from nodus_gateway.app import build_app
from nodus_gateway.principals import Principals
from nodus_gateway.resources import stores_for

ADMIN_TOKEN = "fields-admin-token-0123456789"
V1 = "/apis/nodus.dev/v1"


@pytest_asyncio.fixture
async def api(nc: NATS) -> AsyncIterator[httpx.AsyncClient]:
    """The cluster admin on a gateway that serves the projects and tokens endpoints."""
    principals = Principals(nc, pepper=b"fields-pepper", cache_ttl_s=0.2)
    app = build_app(stores_for(nc), admin_token=ADMIN_TOKEN, principals=principals)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://gateway",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    ) as client:
        yield client


def causes(resp: httpx.Response) -> list[tuple[str, str]]:
    assert resp.status_code == 422, resp.text
    body = resp.json()
    assert body["reason"] == "Invalid"
    return [(c["field"], c["reason"]) for c in body["details"]["causes"]]


async def project(api: httpx.AsyncClient, name: str) -> None:
    resp = await api.post(f"{V1}/projects", json={"metadata": {"name": name}})
    assert resp.status_code == 201, resp.text


# -- tokens ------------------------------------------------------------------------------------------------


def token_body(project: str, **extra: Any) -> dict[str, Any]:
    return {"spec": {"principal": "uma", "roles": {project: "viewer"}, **extra}}


async def test_a_token_with_an_unknown_field_is_422_by_default(api: httpx.AsyncClient, unique: str) -> None:
    await project(api, unique)
    resp = await api.post(f"{V1}/tokens", json=token_body(unique, expirationSecond=600))
    assert causes(resp) == [("spec.expirationSecond", "FieldValueUnknown")]
    assert 'did you mean "expirationSeconds"?' in resp.json()["message"]
    strict = await api.post(
        f"{V1}/tokens", json=token_body(unique, rols={}), params={"fieldValidation": "Strict"}
    )
    assert causes(strict) == [("spec.rols", "FieldValueUnknown")]


async def test_the_short_form_and_the_top_level_are_checked_too(api: httpx.AsyncClient, unique: str) -> None:
    await project(api, unique)
    short = {"principal": "uma", "roles": {unique: "viewer"}, "bogus": 1}
    assert causes(await api.post(f"{V1}/tokens", json=short)) == [("spec.bogus", "FieldValueUnknown")]
    top = {**token_body(unique), "sepc": {}}
    resp = await api.post(f"{V1}/tokens", json=top)
    assert causes(resp) == [("sepc", "FieldValueUnknown")]
    assert 'did you mean "spec"?' in resp.json()["message"]


async def test_a_token_with_unknown_fields_warns_under_warn(api: httpx.AsyncClient, unique: str) -> None:
    await project(api, unique)
    body = token_body(unique, expirationSecond=600)
    body["metadata"] = {"labelz": {"a": "b"}}
    resp = await api.post(f"{V1}/tokens", json=body, params={"fieldValidation": "Warn"})
    assert resp.status_code == 201, resp.text
    assert sorted(resp.headers.get_list("warning")) == [
        '299 - "unknown field \\"metadata.labelz\\"; did you mean \\"labels\\"?"',
        '299 - "unknown field \\"spec.expirationSecond\\"; did you mean \\"expirationSeconds\\"?"',
    ]
    assert resp.json()["secret"] and "expirationSecond" not in resp.json()["spec"]


async def test_a_token_with_unknown_fields_is_silent_under_ignore(
    api: httpx.AsyncClient, unique: str
) -> None:
    await project(api, unique)
    resp = await api.post(
        f"{V1}/tokens", json=token_body(unique, expirationSecond=600), params={"fieldValidation": "Ignore"}
    )
    assert resp.status_code == 201, resp.text
    assert "warning" not in resp.headers and "expirationSecond" not in resp.text


# -- projects ----------------------------------------------------------------------------------------------


async def test_a_project_with_unknown_fields_is_422_by_default(api: httpx.AsyncClient, unique: str) -> None:
    body = {"metadata": {"name": unique, "labelz": {}}, "spec": {"descripton": "x"}}
    resp = await api.post(f"{V1}/projects", json=body)
    assert causes(resp) == [
        ("metadata.labelz", "FieldValueUnknown"),
        ("spec.descripton", "FieldValueUnknown"),
    ]
    assert (await api.get(f"{V1}/projects/{unique}")).status_code == 404


async def test_a_project_with_unknown_fields_warns_under_warn(api: httpx.AsyncClient, unique: str) -> None:
    body = {"metadata": {"name": unique}, "spec": {"descripton": "x", "description": "team"}}
    resp = await api.post(f"{V1}/projects", json=body, params={"fieldValidation": "Warn"})
    assert resp.status_code == 201, resp.text
    assert resp.headers.get_list("warning") == [
        '299 - "unknown field \\"spec.descripton\\"; did you mean \\"description\\"?"'
    ]
    assert resp.json()["spec"] == {"description": "team"}


async def test_a_project_with_unknown_fields_is_silent_under_ignore(
    api: httpx.AsyncClient, unique: str
) -> None:
    body = {"metadata": {"name": unique}, "spec": {"descripton": "x"}}
    resp = await api.post(f"{V1}/projects", json=body, params={"fieldValidation": "Ignore"})
    assert resp.status_code == 201, resp.text
    assert "warning" not in resp.headers and "descripton" not in resp.text


async def test_a_project_keeps_only_its_name_labels_and_annotations(
    api: httpx.AsyncClient, unique: str
) -> None:
    meta = {"name": unique, "labels": {"team": "a"}, "finalizers": ["x/y"], "uid": "not-yours"}
    resp = await api.post(f"{V1}/projects", json={"metadata": meta})
    assert resp.status_code == 201, resp.text
    got = resp.json()["metadata"]
    assert got["labels"] == {"team": "a"} and "finalizers" not in got and got["uid"] != "not-yours"


@pytest.mark.parametrize("path", ["projects", "tokens"])
async def test_an_unsupported_field_validation_is_400(api: httpx.AsyncClient, unique: str, path: str) -> None:
    resp = await api.post(
        f"{V1}/{path}", json={"metadata": {"name": unique}}, params={"fieldValidation": "Loose"}
    )
    assert (resp.status_code, resp.json()["reason"]) == (400, "BadRequest")
