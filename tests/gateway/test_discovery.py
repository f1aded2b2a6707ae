"""Discovery as client-go reads it: /api, /api/v1, /apis, /apis/nodus.dev, /apis/nodus.dev/v1, /version."""

from __future__ import annotations

import json
from typing import Any

import httpx

from nodus_gateway.resources import RESOURCES

# What kubectl 1.32 sends first: aggregated discovery, then the legacy documents.
AGGREGATED = (
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,"
    "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"
)


async def get_json(api: httpx.AsyncClient, path: str, **headers: str) -> dict[str, Any]:
    resp = await api.get(path, headers=headers)
    assert resp.status_code == 200, resp.text
    # Parsed as plain JSON: the documents are what any client sees, not what our types decode.
    body: dict[str, Any] = json.loads(resp.content)
    return body


async def test_api_lists_no_core_version(api: httpx.AsyncClient) -> None:
    body = await get_json(api, "/api")
    assert body["kind"] == "APIVersions"
    # An empty core group: client-go fails discovery for a listed version that has no resources.
    assert body["versions"] == []
    assert body["serverAddressByClientCIDRs"] == [{"clientCIDR": "0.0.0.0/0", "serverAddress": "gateway"}]
    core = await get_json(api, "/api/v1")
    assert core == {"apiVersion": "v1", "kind": "APIResourceList", "groupVersion": "v1", "resources": []}


async def test_apis_and_the_group_name_nodus_dev_v1(api: httpx.AsyncClient) -> None:
    version = {"groupVersion": "nodus.dev/v1", "version": "v1"}
    group = {
        "apiVersion": "v1",
        "kind": "APIGroup",
        "name": "nodus.dev",
        "versions": [version],
        "preferredVersion": version,
    }
    assert await get_json(api, "/apis") == {"apiVersion": "v1", "kind": "APIGroupList", "groups": [group]}
    assert await get_json(api, "/apis/nodus.dev") == group


async def test_resource_list_has_names_verbs_short_names_and_categories(api: httpx.AsyncClient) -> None:
    body = await get_json(api, "/apis/nodus.dev/v1")
    assert (body["kind"], body["apiVersion"], body["groupVersion"]) == (
        "APIResourceList",
        "v1",
        "nodus.dev/v1",
    )
    by_name = {r["name"]: r for r in body["resources"]}
    sweeps = by_name["sweeps"]
    assert sweeps["singularName"] == "sweep"
    assert sweeps["kind"] == "Sweep"
    assert sweeps["namespaced"] is True
    assert sweeps["shortNames"] == ["sw"]
    assert sweeps["categories"] == ["all", "nodus"]
    assert {"create", "get", "list", "delete"} <= set(sweeps["verbs"])
    assert by_name["jobs"]["kind"] == "Job"
    for sub in ("sweeps/status", "jobs/status", "sweeps/results"):
        assert by_name[sub]["singularName"] == ""
        assert "get" in by_name[sub]["verbs"]
    assert by_name["sweeps/results"]["verbs"] == ["get"], "results are read, never written"
    # Written by services; the cluster admin may delete a Node (kubectl delete node.nodus.dev/<name>).
    assert by_name["nodes"]["verbs"] == ["delete", "get", "list"]
    assert by_name["offerings"]["verbs"] == ["get", "list"]
    # Every row of the resource table that has routes is listed, with its own scope.
    for res in RESOURCES:
        if res.plural in by_name:
            assert by_name[res.plural]["namespaced"] is getattr(res, "namespaced", True)
            assert by_name[res.plural]["kind"] == res.kind


async def test_aggregated_discovery_is_answered_with_the_legacy_documents(api: httpx.AsyncClient) -> None:
    # client-go falls back to the legacy documents when the Content-Type is not the aggregated one.
    for path in ("/api", "/apis"):
        resp = await api.get(path, headers={"Accept": AGGREGATED})
        assert resp.status_code == 200
        assert resp.headers["content-type"] == "application/json"
        assert resp.json()["kind"] in ("APIVersions", "APIGroupList")


async def test_discovery_needs_a_token_and_version_does_not(app: Any) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as anon:
        assert (await anon.get("/apis")).status_code == 401
        version = await anon.get("/version")
    assert version.status_code == 200
    info = version.json()
    for key in ("major", "minor", "gitVersion", "gitCommit", "gitTreeState", "buildDate", "goVersion"):
        assert isinstance(info[key], str)
    assert info["gitVersion"].startswith("v")
    assert "/" in info["platform"]
