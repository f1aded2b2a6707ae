"""ServiceAccounts (ADR-0037): the kind's rules, the token's outer form, and spec.serviceAccountName as a
field Jobs and Sweep templates may set (checked against the project at admission, not here)."""

from __future__ import annotations

import pytest

from nodus_schema import decode
from nodus_schema.defaulting import default_job, default_sweep
from nodus_schema.examples import full_sweep, minimal_job
from nodus_schema.fielding import CauseType, FieldError
from nodus_schema.meta import ObjectMeta
from nodus_schema.serviceaccounts import (
    SERVICE_ACCOUNT_ROLES,
    ServiceAccount,
    ServiceAccountSpec,
    TokenParts,
    principal_name,
    token_parts,
    validate_service_account,
)
from nodus_schema.validating import validate_job, validate_sweep

MAC = "A" * 42 + "_"


def account(name: str = "trainer", role: str | None = "editor") -> ServiceAccount:
    return ServiceAccount(metadata=ObjectMeta(name=name), spec=ServiceAccountSpec(role=role))


def fields(errs: list[FieldError]) -> dict[str, FieldError]:
    return {e.field: e for e in errs}


@pytest.mark.parametrize("role", SERVICE_ACCOUNT_ROLES)
def test_a_viewer_or_editor_account_is_valid(role: str) -> None:
    assert validate_service_account(account(role=role)) == []


def test_the_role_is_required() -> None:
    err = fields(validate_service_account(account(role=None)))["spec.role"]
    assert err.reason == CauseType.REQUIRED and "viewer or editor" in err.message


@pytest.mark.parametrize("role", ["admin", "owner", "Editor", ""])
def test_no_other_role_and_never_admin(role: str) -> None:
    err = fields(validate_service_account(account(role=role)))["spec.role"]
    assert err.reason == CauseType.NOT_SUPPORTED
    assert '"viewer", "editor"' in err.message
    if role == "admin":
        assert "may not mint tokens" in err.message


@pytest.mark.parametrize("name", ["a.b", "Trainer", "-x", "x" * 64])
def test_the_name_is_a_dns_label(name: str) -> None:
    assert "metadata.name" in fields(validate_service_account(account(name=name)))


def test_kind_and_api_version_are_checked() -> None:
    sa = account()
    sa.kind, sa.api_version = "Secret", "v1"
    assert {"kind", "apiVersion"} <= set(fields(validate_service_account(sa)))


def test_it_decodes_strictly_and_has_no_status_and_no_secret() -> None:
    decoded = decode({"metadata": {"name": "t"}, "spec": {"role": "viewer", "token": "x"}}, ServiceAccount)
    assert decoded.value is not None and decoded.value.spec.role == "viewer"
    assert [str(e.field) for e in decoded.unknown_errors()] == ["spec.token"]
    assert set(ServiceAccount.__struct_fields__) == {"api_version", "kind", "metadata", "spec"}


def test_principal_name_is_kubernetes_form() -> None:
    assert principal_name("team-a", "trainer") == "system:serviceaccount:team-a:trainer"


def test_token_parts() -> None:
    token = f"nodus-sa.team-a.train-1a2b3c4d-0-a1.{MAC}"
    assert token_parts(token) == TokenParts("team-a", "train-1a2b3c4d-0-a1", MAC)
    for bad in (
        "nds_abc",
        f"nodus-sa.team-a.{MAC}",
        f"nodus-sa.team-a.x.y.{MAC}",
        f"nodus-sa.Team.x.{MAC}",
        f"nodus-sa.team-a.x.{MAC[:-1]}",
        f"nodus-sa.team-a.x.{MAC[:-1]}=",
        f"nodus-sa.{'a' * 64}.x.{MAC}",
        "nodus-sa...",
    ):
        assert token_parts(bad) is None, bad


# -- spec.serviceAccountName on Jobs and Sweep templates: accepted as a name ---------------------------------


def test_a_job_may_name_a_service_account() -> None:
    job = minimal_job()
    job.spec.service_account_name = "trainer"
    assert validate_job(job) == [] and validate_job(default_job(job)) == []


def test_a_sweep_template_may_name_a_service_account() -> None:
    sweep = full_sweep()
    sweep.spec.template.spec.service_account_name = "trainer"
    assert [e for e in validate_sweep(default_sweep(sweep)) if "serviceAccountName" in e.field] == []


def test_a_service_account_name_that_is_no_object_name_is_refused_on_the_field() -> None:
    job = minimal_job()
    job.spec.service_account_name = "Not_A_Name"
    err = fields(validate_job(job))["spec.serviceAccountName"]
    assert err.reason == CauseType.INVALID
