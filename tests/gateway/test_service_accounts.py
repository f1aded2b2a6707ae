"""ServiceAccounts (ADR-0037) through the gateway: the kind's CRUD and RBAC, admission of Jobs and Sweeps
that name one, the token the Node authorizer mints for a run, and what that token may do.

The gateway runs in-process against the session's real nats-server, with minted tokens (principals.py)
and a URL for runs. A run is written as the scheduler would (nodus_testing.binding); its grant is asked of
the real Node authorizer's code (noding.NodeAccess) with the gateway's issuer.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from nodus_gateway.app import build_app
from nodus_gateway.authlimits import AuthFailureLimiter
from nodus_gateway.config import ConfigError, GatewayConfig
from nodus_gateway.minting import Issuer, token_key
from nodus_gateway.noding import NodeAccess
from nodus_gateway.principals import Principals
from nodus_gateway.reaching import RunAccess
from nodus_gateway.resources import stores_for
from nodus_schema.jobs import Job
from nodus_schema.noding import RunSecrets, RunSecretsRequest, secrets_subject
from nodus_testing.binding import bind_attempt, finish
from nodus_testing.waiting import eventually

ADMIN_TOKEN = "service-accounts-admin-token-0123456789"
PEPPER = b"service-accounts-pepper"
V1 = "/apis/nodus.dev/v1"
RUN_URL = "https://nodus.example.com"
CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
NODE = "n1"
MERGE = {"Content-Type": "application/merge-patch+json"}
APPLY = {"Content-Type": "application/apply-patch+yaml"}


def path(namespace: str, plural: str, *rest: str) -> str:
    return "/".join([f"{V1}/namespaces/{namespace}/{plural}", *rest])


def account_body(name: str, role: str | None = "editor") -> dict[str, Any]:
    spec = {} if role is None else {"role": role}
    return {"apiVersion": "nodus.dev/v1", "kind": "ServiceAccount", "metadata": {"name": name}, "spec": spec}


def job_spec(**kw: Any) -> dict[str, Any]:
    return {"image": "ghcr.io/acme/train:1.0", "command": ["python"], "resources": {"gpu": "H100:1"}, **kw}


def job_body(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": name}, "spec": job_spec(**spec)}


def sweep_body(name: str, **template: Any) -> dict[str, Any]:
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Sweep",
        "metadata": {"name": name},
        "spec": {
            "matrix": {"params": {"LR": ["0.1", "0.01"]}},
            "template": {"kind": "Job", "spec": job_spec(**template)},
        },
    }


def client(app: FastAPI, token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://gateway",
        headers={"Authorization": f"Bearer {token}"},
    )


def assert_status(resp: httpx.Response, code: int, reason: str) -> dict[str, Any]:
    assert resp.status_code == code, resp.text
    body: dict[str, Any] = resp.json()
    assert (body["kind"], body["reason"], body["code"]) == ("Status", reason, code)
    assert body["fix"] and body["docs"]
    return body


def causes(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["field"]: c for c in body["details"]["causes"]}


async def ok(resp: Any) -> None:
    """A create that must succeed."""
    got = await resp
    assert got.status_code == 201, got.text


async def mint(admin: httpx.AsyncClient, principal: str, roles: dict[str, str]) -> str:
    resp = await admin.post(f"{V1}/tokens", json={"spec": {"principal": principal, "roles": roles}})
    assert resp.status_code == 201, resp.text
    secret: str = resp.json()["secret"]
    return secret


@dataclass
class Project:
    a: str
    b: str
    app: FastAPI
    admin: httpx.AsyncClient
    alice: httpx.AsyncClient
    """An editor in A."""
    vera: httpx.AsyncClient
    """A viewer in A."""
    bob: httpx.AsyncClient
    """An editor in B, nothing in A."""
    access: NodeAccess
    """The Node authorizer with the gateway's issuer."""
    nc: NATS


@pytest_asyncio.fixture
async def project(nc: NATS, unique: str) -> AsyncIterator[Project]:
    # No lookup cache for minted tokens: a test sees a change at once (runs' tokens cache at most 1 s).
    principals = Principals(nc, pepper=PEPPER, cache_ttl_s=0.0)
    stores = stores_for(nc)
    access = RunAccess(url=RUN_URL, ca_pem=CA_PEM)
    app = build_app(stores, admin_token=ADMIN_TOKEN, principals=principals, run_access=access)
    node_access = NodeAccess(stores, issuer=Issuer(token_key(PEPPER), access))
    a, b = f"a-{unique}", f"b-{unique}"
    async with client(app, ADMIN_TOKEN) as admin:
        for name in (a, b):
            await ok(admin.post(f"{V1}/projects", json={"metadata": {"name": name}}))
        alice = await mint(admin, "alice", {a: "editor"})
        vera = await mint(admin, "vera", {a: "viewer"})
        bob = await mint(admin, "bob", {b: "editor"})
        async with client(app, alice) as ac, client(app, vera) as vc, client(app, bob) as bc:
            yield Project(a, b, app, admin, ac, vc, bc, node_access, nc)


@dataclass
class Run:
    token: str
    attempt: str
    job: Job
    grant: RunSecrets


async def start_run(p: Project, job: str, account: str, role: str = "editor") -> Run:
    """A ServiceAccount, a Job that names it (created through the API), one Attempt of it bound to NODE,
    and the grant the agent of NODE gets for it."""
    resp = await p.alice.post(path(p.a, "serviceaccounts"), json=account_body(account, role))
    assert resp.status_code in (201, 409), resp.text
    resp = await p.alice.post(path(p.a, "jobs"), json=job_body(job, serviceAccountName=account))
    assert resp.status_code == 201, resp.text
    stored: Job = await stores_for(p.nc)["jobs"].get(p.a, job)
    attempt = f"{job}-{(stored.metadata.uid or '')[:8]}-0-a1"
    await bind_attempt(p.nc, p.a, attempt, stored, NODE)
    grant = await p.access.run_secrets(
        RunSecretsRequest(namespace=p.a, attempt=attempt), secrets_subject(NODE)
    )
    assert grant.service_account is not None, grant.missing
    return Run(grant.service_account.token, attempt, stored, grant)


async def grant_of(p: Project, attempt: str) -> RunSecrets:
    """What the agent of NODE is answered for ``attempt``."""
    return await p.access.run_secrets(
        RunSecretsRequest(namespace=p.a, attempt=attempt), secrets_subject(NODE)
    )


async def unauthorized_like_an_unknown_token(p: Project, token: str) -> bool:
    """Whether ``token`` now answers exactly what a token nobody ever minted answers."""
    async with client(p.app, token) as run, client(p.app, "nds_" + "x" * 43) as stranger:
        got, unknown = await run.get(path(p.a, "jobs")), await stranger.get(path(p.a, "jobs"))
    if got.status_code != 401:
        return False
    body, other = got.json(), unknown.json()
    body.pop("requestId"), other.pop("requestId")
    assert body == other and got.headers["www-authenticate"] == unknown.headers["www-authenticate"]
    return True


# -- the kind: CRUD, RBAC, rules -----------------------------------------------------------------------------
async def test_an_editor_creates_reads_changes_and_deletes_a_service_account(project: Project) -> None:
    p = project
    created = await p.alice.post(path(p.a, "serviceaccounts"), json=account_body("trainer", "viewer"))
    assert created.status_code == 201, created.text
    obj = created.json()
    assert obj["kind"] == "ServiceAccount" and obj["spec"] == {"role": "viewer"}
    assert "status" not in obj and obj["metadata"]["creationTimestamp"] and obj["metadata"]["uid"]
    assert "secret" not in json.dumps(obj).lower() and "token" not in json.dumps(obj).lower()
    got = await p.vera.get(path(p.a, "serviceaccounts", "trainer"))
    assert got.status_code == 200 and got.json()["spec"]["role"] == "viewer"
    listed = await p.vera.get(path(p.a, "serviceaccounts"))
    assert listed.json()["kind"] == "ServiceAccountList"
    assert [i["metadata"]["name"] for i in listed.json()["items"]] == ["trainer"]
    patched = await p.alice.patch(
        path(p.a, "serviceaccounts", "trainer"), json={"spec": {"role": "editor"}}, headers=MERGE
    )
    assert patched.status_code == 200 and patched.json()["spec"]["role"] == "editor"
    table = await p.vera.get(
        path(p.a, "serviceaccounts"), headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}
    )
    assert [c["name"] for c in table.json()["columnDefinitions"]] == ["Name", "Role", "Age"]
    assert table.json()["rows"][0]["cells"][:2] == ["trainer", "editor"]
    assert (await p.alice.delete(path(p.a, "serviceaccounts", "trainer"))).status_code == 200
    assert_status(await p.vera.get(path(p.a, "serviceaccounts", "trainer")), 404, "NotFound")


async def test_a_viewer_reads_but_never_writes_them_and_other_tenants_see_nothing(project: Project) -> None:
    p = project
    await ok(p.alice.post(path(p.a, "serviceaccounts"), json=account_body("ci")))
    item = path(p.a, "serviceaccounts", "ci")
    assert_status(
        await p.vera.post(path(p.a, "serviceaccounts"), json=account_body("mine")), 403, "Forbidden"
    )
    assert_status(
        await p.vera.patch(item, json={"spec": {"role": "viewer"}}, headers=MERGE), 403, "Forbidden"
    )
    assert_status(await p.vera.delete(item), 403, "Forbidden")
    # Bob, an editor elsewhere: a name in A looks missing, the collection is forbidden.
    assert_status(await p.bob.get(item), 404, "NotFound")
    assert_status(await p.bob.get(path(p.a, "serviceaccounts")), 403, "Forbidden")
    assert_status(await p.bob.post(path(p.a, "serviceaccounts"), json=account_body("x")), 403, "Forbidden")
    assert_status(await p.bob.delete(item), 404, "NotFound")
    assert (await p.vera.get(item)).status_code == 200


async def test_the_role_is_required_and_never_admin(project: Project) -> None:
    p = project
    for role, reason in ((None, "FieldValueRequired"), ("admin", "FieldValueNotSupported")):
        resp = await p.alice.post(path(p.a, "serviceaccounts"), json=account_body("x", role))
        body = assert_status(resp, 422, "Invalid")
        assert causes(body)["spec.role"]["reason"] == reason
    unknown = await p.alice.post(
        path(p.a, "serviceaccounts"), json={**account_body("x"), "spec": {"role": "editor", "token": "t"}}
    )
    assert "spec.token" in causes(assert_status(unknown, 422, "Invalid"))


async def test_discovery_lists_them_with_the_short_name_sa(project: Project) -> None:
    body = (await project.vera.get(V1)).json()
    row = next(r for r in body["resources"] if r["name"] == "serviceaccounts")
    assert (row["kind"], row["singularName"], row["shortNames"], row["namespaced"]) == (
        "ServiceAccount",
        "serviceaccount",
        ["sa"],
        True,
    )
    assert {"create", "get", "list", "watch", "patch", "update", "delete"} <= set(row["verbs"])


# -- admission -----------------------------------------------------------------------------------------------
async def test_a_job_naming_an_unknown_account_is_422_with_a_fix(project: Project) -> None:
    p = project
    resp = await p.alice.post(path(p.a, "jobs"), json=job_body("j", serviceAccountName="ghost"))
    body = assert_status(resp, 422, "Invalid")
    cause = causes(body)["spec.serviceAccountName"]
    assert cause["reason"] == "FieldValueNotFound" and "ghost" in cause["message"]
    assert body["fix"].startswith("create it: kind ServiceAccount") and p.a in body["fix"]
    # A server-side apply that creates the Job is a create too.
    applied = await p.alice.patch(
        path(p.a, "jobs", "j"),
        content=json.dumps(job_body("j", serviceAccountName="ghost")),
        headers=APPLY,
        params={"fieldManager": "test"},
    )
    assert "spec.serviceAccountName" in causes(assert_status(applied, 422, "Invalid"))
    await ok(p.alice.post(path(p.a, "serviceaccounts"), json=account_body("ghost")))
    await ok(p.alice.post(path(p.a, "jobs"), json=job_body("j", serviceAccountName="ghost")))


async def test_a_sweep_naming_an_unknown_account_is_422_at_its_template(project: Project) -> None:
    p = project
    resp = await p.alice.post(path(p.a, "sweeps"), json=sweep_body("s", serviceAccountName="ghost"))
    body = assert_status(resp, 422, "Invalid")
    assert causes(body)["spec.template.spec.serviceAccountName"]["reason"] == "FieldValueNotFound"
    assert body["fix"].startswith("create it: kind ServiceAccount")
    # An account of another project does not count.
    await ok(p.bob.post(path(p.b, "serviceaccounts"), json=account_body("ghost")))
    again = await p.alice.post(path(p.a, "sweeps"), json=sweep_body("s", serviceAccountName="ghost"))
    assert_status(again, 422, "Invalid")
    await ok(p.alice.post(path(p.a, "serviceaccounts"), json=account_body("ghost")))
    await ok(p.alice.post(path(p.a, "sweeps"), json=sweep_body("s", serviceAccountName="ghost")))


async def test_a_gateway_without_a_url_for_runs_refuses_them(nc: NATS, unique: str) -> None:
    app = build_app(stores_for(nc), admin_token=ADMIN_TOKEN)  # no NODUS_PUBLIC_URL and nothing served
    async with client(app, ADMIN_TOKEN) as admin:
        await ok(admin.post(path(unique, "serviceaccounts"), json=account_body("sa")))
        resp = await admin.post(path(unique, "jobs"), json=job_body("j", serviceAccountName="sa"))
        body = assert_status(resp, 422, "Invalid")
        assert causes(body)["spec.serviceAccountName"]["reason"] == "FieldValueForbidden"
        assert "NODUS_PUBLIC_URL" in body["fix"]
        # Jobs without one are not concerned.
        await ok(admin.post(path(unique, "jobs"), json=job_body("k")))


# -- the run's token -----------------------------------------------------------------------------------------
async def test_the_grant_carries_a_token_the_same_every_time(project: Project) -> None:
    p = project
    run = await start_run(p, "train", "trainer")
    grant = run.grant.service_account
    assert grant is not None and (grant.name, grant.url, grant.ca_pem) == ("trainer", RUN_URL, CA_PEM)
    assert run.token.startswith(f"nodus-sa.{p.a}.{run.attempt}.")
    again = await p.access.run_secrets(
        RunSecretsRequest(namespace=p.a, attempt=run.attempt), secrets_subject(NODE)
    )
    assert again.service_account == grant  # stateless: derived again, not stored
    # The account deleted: the grant names it missing instead.
    assert (await p.alice.delete(path(p.a, "serviceaccounts", "trainer"))).status_code == 200
    gone = await p.access.run_secrets(
        RunSecretsRequest(namespace=p.a, attempt=run.attempt), secrets_subject(NODE)
    )
    assert gone.service_account is None and gone.missing == ["ServiceAccount/trainer"]


async def test_an_editor_token_works_in_its_project_only_and_never_as_an_admin(project: Project) -> None:
    p = project
    run = await start_run(p, "train", "trainer", "editor")
    async with client(p.app, run.token) as sa:
        me = await sa.post(path(p.a, "jobs"), json=job_body("child"))
        assert me.status_code == 201, me.text
        assert (await sa.get(path(p.a, "jobs", "child"))).status_code == 200
        # Nothing in another project: hidden names, forbidden collections.
        await ok(p.bob.post(path(p.b, "jobs"), json=job_body("bobs")))
        assert_status(await sa.get(path(p.b, "jobs", "bobs")), 404, "NotFound")
        body = assert_status(await sa.get(path(p.b, "jobs")), 403, "Forbidden")
        assert f'User "system:serviceaccount:{p.a}:trainer"' in body["message"]
        assert_status(await sa.post(path(p.b, "jobs"), json=job_body("x")), 403, "Forbidden")
        assert_status(await sa.delete(path(p.b, "jobs", "bobs")), 404, "NotFound")
        assert_status(
            await sa.patch(
                path(p.b, "jobs", "bobs"), json={"metadata": {"labels": {"x": "y"}}}, headers=MERGE
            ),
            404,
            "NotFound",
        )
        # No tokens, no projects, no cluster-scoped writes: a run is never an admin.
        mint_spec = {"spec": {"principal": "evil", "roles": {p.a: "editor"}}}
        assert_status(await sa.post(f"{V1}/tokens", json=mint_spec), 403, "Forbidden")
        assert_status(await sa.get(f"{V1}/tokens"), 403, "Forbidden")
        assert_status(await sa.get(f"{V1}/projects"), 403, "Forbidden")
        assert_status(await sa.post(f"{V1}/projects", json={"metadata": {"name": "x"}}), 403, "Forbidden")
        assert_status(await sa.delete(f"{V1}/projects/{p.a}"), 403, "Forbidden")
        # Across all namespaces: only its own project.
        listed = await sa.get(f"{V1}/jobs")
        assert {i["metadata"]["namespace"] for i in listed.json()["items"]} == {p.a}


async def test_a_viewer_token_reads_but_cannot_create_a_job(project: Project) -> None:
    p = project
    run = await start_run(p, "look", "reader", "viewer")
    async with client(p.app, run.token) as sa:
        assert (await sa.get(path(p.a, "jobs", "look"))).status_code == 200
        body = assert_status(await sa.post(path(p.a, "jobs"), json=job_body("child")), 403, "Forbidden")
        assert "viewer" in body["fix"]
        assert_status(await sa.post(path(p.a, "serviceaccounts"), json=account_body("up")), 403, "Forbidden")
        assert_status(await sa.delete(path(p.a, "jobs", "look")), 403, "Forbidden")
        # Nor tokens or anything of the cluster admin's, as for the editor's.
        mint_spec = {"spec": {"principal": "evil", "roles": {p.a: "viewer"}}}
        assert_status(await sa.post(f"{V1}/tokens", json=mint_spec), 403, "Forbidden")
        assert_status(await sa.get(f"{V1}/projects"), 403, "Forbidden")
        assert_status(await sa.get(path(p.b, "jobs")), 403, "Forbidden")


async def test_the_token_stops_when_the_attempt_finishes(project: Project) -> None:
    p = project
    run = await start_run(p, "train", "trainer")
    async with client(p.app, run.token) as sa:
        assert (await sa.get(path(p.a, "jobs"))).status_code == 200
    await finish(p.nc, p.a, run.attempt, "Succeeded")
    # Within the one second the gateway may cache a run's answer.
    await eventually(
        lambda: unauthorized_like_an_unknown_token(p, run.token), deadline_s=3, message="token still works"
    )


async def test_the_token_stops_when_the_account_is_deleted_and_a_new_one_does_not_revive_it(
    project: Project,
) -> None:
    p = project
    run = await start_run(p, "train", "trainer")
    async with client(p.app, run.token) as sa:
        assert (await sa.get(path(p.a, "jobs"))).status_code == 200
    assert (await p.alice.delete(path(p.a, "serviceaccounts", "trainer"))).status_code == 200
    await eventually(
        lambda: unauthorized_like_an_unknown_token(p, run.token), deadline_s=3, message="token still works"
    )
    # Created again under the same name: another uid, so the old token's MAC no longer matches.
    await ok(p.alice.post(path(p.a, "serviceaccounts"), json=account_body("trainer")))
    assert await unauthorized_like_an_unknown_token(p, run.token)
    fresh = await p.access.run_secrets(
        RunSecretsRequest(namespace=p.a, attempt=run.attempt), secrets_subject(NODE)
    )
    assert fresh.service_account is not None and fresh.service_account.token != run.token


async def test_a_forged_or_altered_token_is_401_like_any_unknown_one(project: Project) -> None:
    p = project
    run = await start_run(p, "train", "trainer")
    prefix, mac = run.token.rsplit(".", 1)
    altered = mac[:-1] + ("A" if mac[-1] != "A" else "B")
    other_attempt = run.token.replace(run.attempt, run.attempt[:-1] + "2")
    for token in (f"{prefix}.{altered}", other_attempt, run.token.replace(p.a, p.b, 1), "nodus-sa.garbage"):
        assert await unauthorized_like_an_unknown_token(p, token), token


async def test_a_run_token_works_from_a_client_limited_for_failures(nc: NATS, unique: str) -> None:
    principals = Principals(nc, pepper=PEPPER, cache_ttl_s=0.0)
    stores = stores_for(nc)
    access = RunAccess(url=RUN_URL)
    app = build_app(
        stores,
        admin_token=ADMIN_TOKEN,
        principals=principals,
        run_access=access,
        auth_limiter=AuthFailureLimiter(failures=1, window_s=600),
    )
    async with client(app, ADMIN_TOKEN) as admin:
        await ok(admin.post(path(unique, "serviceaccounts"), json=account_body("sa")))
        await ok(admin.post(path(unique, "jobs"), json=job_body("j", serviceAccountName="sa")))
    job: Job = await stores["jobs"].get(unique, "j")
    attempt = f"j-{(job.metadata.uid or '')[:8]}-0-a1"
    await bind_attempt(nc, unique, attempt, job, NODE)
    grant = await NodeAccess(stores, issuer=Issuer(token_key(PEPPER), access)).run_secrets(
        RunSecretsRequest(namespace=unique, attempt=attempt), secrets_subject(NODE)
    )
    assert grant.service_account is not None
    async with client(app, "wrong") as wrong, client(app, grant.service_account.token) as sa:
        assert (await wrong.get(path(unique, "jobs"))).status_code == 401
        assert (await wrong.get(path(unique, "jobs"))).status_code == 429  # limited now
        assert (await sa.get(path(unique, "jobs"))).status_code == 200


# -- where the token never goes ------------------------------------------------------------------------------
async def test_the_token_appears_in_no_object_event_or_bus_message(project: Project) -> None:
    p = project
    seen: list[bytes] = []

    async def tap(msg: Msg) -> None:
        seen.append(msg.subject.encode() + b" " + msg.data + repr(msg.headers).encode())

    sub = await p.nc.subscribe(">", cb=tap)
    try:
        run = await start_run(p, "train", "trainer")
        async with client(p.app, run.token) as sa:
            assert (await sa.post(path(p.a, "jobs"), json=job_body("child"))).status_code == 201
            assert (await sa.get(path(p.a, "jobs", "train"))).status_code == 200
        await finish(p.nc, p.a, run.attempt, "Succeeded")
        await eventually(lambda: unauthorized_like_an_unknown_token(p, run.token), deadline_s=3)
        # Everything published so far has reached the tap: a request answered after it is later.
        await p.nc.flush()
        texts = [
            (await p.admin.get(path(p.a, plural))).text
            for plural in ("jobs", "attempts", "serviceaccounts", "sweeps")
        ]
    finally:
        await sub.unsubscribe()
    assert seen, "the tap heard nothing: it would prove nothing"
    mac = run.token.rsplit(".", 1)[1]
    for text in texts:
        assert mac not in text
    leaks = [m[:200] for m in seen if mac.encode() in m]
    assert leaks == [], leaks


# -- how runs reach the API: NODUS_PUBLIC_URL and NODUS_PUBLIC_CA, read once at start -----------------------
def test_runs_reach_the_url_the_gateway_serves_on_unless_told_otherwise(tmp_path: Path) -> None:
    def access(**env: str) -> RunAccess:
        return GatewayConfig.from_env({"NODUS_ADMIN_TOKEN": "t", **env}).run_access

    assert access(NODUS_GATEWAY_PORT="8443").url == "http://127.0.0.1:8443"
    assert access(NODUS_GATEWAY_HOST="::1", NODUS_GATEWAY_PORT="9").url == "http://[::1]:9"
    # A wildcard address or an ephemeral port is no URL a run can dial: none, and such Jobs are refused.
    assert access(NODUS_GATEWAY_HOST="0.0.0.0").url is None
    assert access(NODUS_GATEWAY_HOST="::", NODUS_GATEWAY_PORT="80").url is None
    assert access(NODUS_GATEWAY_PORT="0").url is None
    public = access(NODUS_GATEWAY_HOST="0.0.0.0", NODUS_PUBLIC_URL="https://nodus.example.com/")
    assert public == RunAccess(url="https://nodus.example.com", ca_pem=None)
    ca = tmp_path / "ca.crt"
    ca.write_text(CA_PEM)
    assert access(NODUS_PUBLIC_CA=str(ca)).ca_pem == CA_PEM  # its content, read now


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("NODUS_PUBLIC_URL", "nodus.example.com"),
        ("NODUS_PUBLIC_URL", "ftp://nodus.example.com"),
        ("NODUS_PUBLIC_URL", "https://user:pw@nodus.example.com"),
        ("NODUS_PUBLIC_URL", "https://nodus.example.com/?x=1"),
        ("NODUS_PUBLIC_CA", "/no/such/ca.crt"),
    ],
)
def test_a_bad_setting_stops_the_start_naming_it(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        GatewayConfig.from_env({"NODUS_ADMIN_TOKEN": "t", name: value})


def test_a_ca_file_without_a_certificate_stops_the_start(tmp_path: Path) -> None:
    empty = tmp_path / "ca.crt"
    empty.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match="NODUS_PUBLIC_CA"):
        GatewayConfig.from_env({"NODUS_ADMIN_TOKEN": "t", "NODUS_PUBLIC_CA": str(empty)})


async def test_an_answer_about_a_run_token_is_kept_one_second_at_most(project: Project) -> None:
    """Even with minted tokens cached for 5 s, a run's token is re-checked after a second (a clock of the
    test's own: no waiting)."""
    p = project
    run = await start_run(p, "train", "trainer")
    now = [100.0]
    principals = Principals(p.nc, pepper=PEPPER, cache_ttl_s=5.0, clock=lambda: now[0])
    assert principals.run_cache.ttl == 1.0
    first = await principals.authenticate(run.token)
    assert first is not None and first.roles == {p.a: "editor"}
    assert first.name == f"system:serviceaccount:{p.a}:trainer" and not first.admin
    await finish(p.nc, p.a, run.attempt, "Failed")
    now[0] += 0.9
    assert await principals.authenticate(run.token) == first  # still the cached answer
    now[0] += 0.2
    assert await principals.authenticate(run.token) is None  # past the second: checked again, refused
