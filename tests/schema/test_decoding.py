"""decode(): every type error at once with its path, unknown fields with suggestions, and the reference's
full example proving that every field name of the wire types is spelled as the API spells it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from nodus_schema import (
    DOCS_BASE,
    REASONS,
    CauseType,
    FieldError,
    GPURequest,
    Job,
    SecretMount,
    Status,
    Sweep,
    SweepCell,
    SweepList,
    WatchEvent,
    decode,
    docs_url,
    encode,
    field_errors_of,
    status_for,
    status_success,
    to_builtins,
)

DATA = Path(__file__).parent / "data"


def _sweep(**spec: Any) -> dict[str, Any]:
    job: dict[str, Any] = {"image": "ghcr.io/acme/train:1", "command": ["python", "train.py"]}
    job.update(spec)
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Sweep",
        "metadata": {"name": "lr"},
        "spec": {"template": {"kind": "Job", "spec": job}, "matrix": {"gpu": ["H100:1"]}},
    }


# --- the reference example ------------------------------------------------------------------------------


def _all_keys(v: Any, path: str = "") -> set[str]:
    """Every object key path in a JSON value, with list indexes and free map keys folded to ``*``."""
    out: set[str] = set()
    if isinstance(v, dict):
        for k, x in v.items():
            p = f"{path}.{k}" if path else k
            out.add(p)
            out |= _all_keys(x, p)
    elif isinstance(v, list):
        for x in v:
            out |= _all_keys(x, f"{path}[]")
    return out


def test_full_example_decodes_with_no_unknown_fields() -> None:
    raw = (DATA / "sweep-full.json").read_bytes()
    d = decode(raw, SweepList)
    assert d.errors == []
    assert d.unknown == []
    assert d.value is not None
    sweep = d.value.items[0]
    spec = sweep.spec.template.spec
    assert spec.max_cost_usd == "120.50"
    assert spec.distributed is not None
    assert spec.distributed.total_gpus == 16
    assert spec.placement is not None
    assert spec.placement.max_rate_usd_per_hour == "40.00"
    assert spec.inputs[0].bucket is not None
    assert spec.inputs[0].bucket.sha256 == "b" * 64
    assert spec.inputs[0].url is not None
    assert spec.inputs[0].url.url == "https://example.com/vocab.json"
    assert spec.secrets == [SecretMount(name="wandb", version=2)]
    assert spec.ttl_seconds_after_finished == 86400
    assert isinstance(spec.resources.gpu if spec.resources else None, GPURequest)
    assert d.value.metadata.continue_ == "eyJydiI6MTA0Mn0"
    assert sweep.status.cost is not None
    assert sweep.status.cost.total_usd == "41.200001"
    assert sweep.status.estimate is not None
    assert sweep.status.estimate.cost_usd is not None
    assert sweep.status.cells[0] == SweepCell(
        index=0,
        repetition=0,
        cost_usd="41.20",
        gpu="H100:8",
        object="lr-sweep-0",
        params={"LR": "0.001"},
        phase="Succeeded",
        region="us",
        units_per_second="812.5",
        wall_seconds=3725,
    )


def test_full_example_round_trips_to_the_same_json() -> None:
    # Every field set in the example comes back under the same name: nothing is dropped or renamed.
    original = json.loads((DATA / "sweep-full.json").read_text())
    value = decode(original, SweepList).value
    again = json.loads(encode(value))
    assert _all_keys(again) == _all_keys(original)
    assert again == original


def test_full_status_example() -> None:
    original = json.loads((DATA / "status-full.json").read_text())
    d = decode(original, Status)
    assert (d.errors, d.unknown) == ([], [])
    assert d.value is not None
    assert d.value.request_id == "req-01J9ZK3M8Q"
    assert json.loads(encode(d.value)) == original


# --- unknown fields -------------------------------------------------------------------------------------


def test_unknown_fields_have_paths_and_suggestions() -> None:
    doc = _sweep(comand=["python"], inputs=[{"name": "a"}, {"name": "b"}, {"nmae": "c"}], maxCostUsd="5")
    doc["spec"]["maxparallel"] = 2
    doc["spec"]["wat"] = 1
    d = decode(json.dumps(doc), Sweep)
    assert d.errors == []
    assert d.value is not None  # unknown fields do not stop decoding
    assert sorted(d.unknown) == [
        "spec.maxparallel",
        "spec.template.spec.comand",
        "spec.template.spec.inputs[2].nmae",
        "spec.template.spec.maxCostUsd",
        "spec.wat",
    ]
    assert d.suggestion("spec.template.spec.comand") == "command"
    assert d.suggestion("spec.template.spec.inputs[2].nmae") == "name"
    assert d.suggestion("spec.template.spec.maxCostUsd") == "maxCostUSD"
    assert d.suggestion("spec.maxparallel") == "maxParallel"
    assert d.suggestion("spec.wat") is None
    errs = {e.field: e for e in d.unknown_errors()}
    assert errs["spec.template.spec.comand"].reason is CauseType.UNKNOWN
    assert errs["spec.template.spec.comand"].message == 'unknown field "comand"; did you mean "command"?'
    assert errs["spec.wat"].message == 'unknown field "wat"'


def test_a_spec_seen_before_reports_the_same_unknown_fields_under_any_name() -> None:
    # The key walk remembers a spec's findings (decoding._KeyWalker.walk_spec): the second body, with the
    # same spec and other metadata, must get exactly what a first walk finds, and a clean spec nothing.
    doc = _sweep(comand=["python"])
    doc["spec"]["wat"] = 1
    first = decode(json.dumps(doc), Sweep)
    doc["metadata"] = {"name": "another", "lables": {"a": "b"}}
    again = decode(json.dumps(doc), Sweep)
    assert sorted(first.unknown) == ["spec.template.spec.comand", "spec.wat"]
    assert sorted(again.unknown) == ["metadata.lables", "spec.template.spec.comand", "spec.wat"]
    assert again.suggestion("spec.template.spec.comand") == "command"
    assert again.suggestion("metadata.lables") == "labels"
    clean = decode(json.dumps(_sweep()), Sweep)
    assert clean.unknown == [] and clean.value is not None


def test_unknown_keys_in_free_maps_are_not_unknown_fields() -> None:
    doc = _sweep(env=[{"name": "A", "value": "1"}])
    doc["metadata"]["labels"] = {"anything/goes": "x"}
    doc["spec"]["matrix"]["params"] = {"LR": ["1", "2"]}
    d = decode(doc, Sweep)
    assert (d.errors, d.unknown) == ([], [])


# --- type errors ----------------------------------------------------------------------------------------


def test_every_type_error_in_one_go() -> None:
    doc = _sweep(
        completions="four",
        command="python train.py",
        inputs=[{"name": "a"}, {"name": "b"}, {"name": 7}],
        resources={"gpu": 8, "nodes": True},
        secrets=["hf", {"name": "wandb", "version": "latest"}, 3],
        maxCostUSD=12.5,
        env=[{"name": "A", "valueFrom": {"secretKeyRef": "hf"}}],
    )
    doc["metadata"]["labels"] = {"team": 1}
    doc["spec"]["maxParallel"] = None
    doc["status"] = {"cells": [{"index": 0}]}
    d = decode(json.dumps(doc).encode(), Sweep)
    assert d.value is None
    by_path = {e.field: e for e in d.errors}
    p = "spec.template.spec."
    assert set(by_path) == {
        p + "completions",
        p + "command",
        p + "inputs[2].name",
        p + "resources.gpu",
        p + "resources.nodes",
        p + "secrets[1].version",
        p + "secrets[2]",
        p + "maxCostUSD",
        p + "env[0].valueFrom.secretKeyRef",
        "metadata.labels[team]",
        "status.cells[0].repetition",
    }
    assert by_path[p + "completions"].message == 'Invalid value: "four": must be an integer, not a string'
    assert by_path[p + "command"].message.endswith("must be an array, not a string")
    assert by_path[p + "inputs[2].name"].message == "Invalid value: 7: must be a string, not an integer"
    assert by_path[p + "resources.gpu"].message.endswith("must be an object or a string, not an integer")
    assert by_path[p + "resources.nodes"].message.endswith("must be an integer, not a boolean")
    assert by_path[p + "maxCostUSD"].message.endswith("must be a string, not a number")
    assert by_path["status.cells[0].repetition"].reason is CauseType.REQUIRED
    assert all(
        e.reason is CauseType.TYPE_INVALID for e in d.errors if e.field != "status.cells[0].repetition"
    )


@pytest.mark.parametrize(
    "doc",
    [
        _sweep(),
        _sweep(comand=["python"], inputs=[{"nmae": "c"}]),
        _sweep(completions="four", resources={"gpu": 8}),
        _sweep(completions=2**70),  # an integer msgspec takes and the walk refuses
    ],
    ids=["valid", "unknown fields", "type errors", "out of range"],
)
def test_decoding_parsed_json_with_its_source_is_decoding_the_source(doc: dict[str, Any]) -> None:
    """What a server that parsed the body already passes: the same result as decoding the bytes."""
    raw = json.dumps(doc).encode()
    given = decode(json.loads(raw), Sweep, json_source=raw)
    expected = decode(raw, Sweep)
    assert (given.value, given.errors, given.unknown) == (expected.value, expected.errors, expected.unknown)


def test_null_is_accepted_for_optional_fields() -> None:
    doc = _sweep(completions=None, distributed=None)
    d = decode(doc, Sweep)
    assert d.errors == []
    assert d.value is not None
    assert d.value.spec.template.spec.completions is None


def test_wrong_top_level_type() -> None:
    d = decode(b"[1, 2]", Sweep)
    assert [(e.field, e.reason) for e in d.errors] == [("", CauseType.TYPE_INVALID)]
    assert "must be an object, not an array" in d.errors[0].message


@pytest.mark.parametrize("raw", [b"{", b"", "{'a': 1}", b'{"a": 1} trailing'])
def test_malformed_json_is_one_error_at_the_root(raw: bytes | str) -> None:
    d = decode(raw, Sweep)
    assert d.value is None
    assert len(d.errors) == 1
    assert d.errors[0].field == ""
    assert d.errors[0].message.startswith("malformed JSON")


def test_literal_and_generic_types() -> None:
    d = decode({"type": "ADDED", "object": {"kind": "Job", "spec": {"completions": "x"}}}, WatchEvent[Job])
    assert [e.field for e in d.errors] == ["object.spec.completions"]
    d2 = decode(b'{"type": "DELETED", "object": {"anything": [1, 2]}}', WatchEvent[msgspec.Raw])
    assert d2.errors == []
    assert d2.value is not None
    assert msgspec.json.decode(d2.value.object) == {"anything": [1, 2]}


def test_encode_and_to_builtins_use_wire_names() -> None:
    sweep = decode(_sweep(maxCostUSD="5.00"), Sweep).value
    assert sweep is not None
    b = to_builtins(sweep)
    assert b["spec"]["template"]["spec"]["maxCostUSD"] == "5.00"
    assert b["apiVersion"] == "nodus.dev/v1"
    assert b["kind"] == "Sweep"
    assert msgspec.json.decode(encode(sweep)) == b


# --- error Status and the reason registry ---------------------------------------------------------------


def test_every_reason_has_a_docs_page() -> None:
    docs = Path(__file__).parents[2] / "docs" / "errors"
    for code, reason in REASONS.items():
        assert reason.code == code
        assert code[0].isupper()
        assert code.isalnum()
        page = docs / f"{code}.md"
        assert page.is_file(), f"missing {page}"
        lines = page.read_text().strip().splitlines()
        # The page itself is short; reference sections may follow it (Invalid.md's tables of ranges).
        summary = lines[: next((i for i, line in enumerate(lines) if line.startswith("## ")), len(lines))]
        assert 5 <= len(summary) <= 15
        assert lines[0] == f"# {code}"
        assert docs_url(code) == f"{DOCS_BASE}/errors/{code}"


def test_status_for_invalid_carries_every_cause() -> None:
    causes = [
        FieldError("spec.template.spec.image", CauseType.REQUIRED, "Required value"),
        FieldError("spec.maxParallel", CauseType.INVALID, "Invalid value: 0: must be between 1 and 256"),
    ]
    s = status_for(
        "Invalid", 'Sweep.nodus.dev "lr" is invalid', name="lr", kind="Sweep", causes=causes, request_id="r1"
    )
    b = to_builtins(s)
    assert b["apiVersion"] == "v1"
    assert b["kind"] == "Status"
    assert b["status"] == "Failure"
    assert b["code"] == 422
    assert b["reason"] == "Invalid"
    assert b["docs"] == f"{DOCS_BASE}/errors/Invalid"
    assert b["fix"] == REASONS["Invalid"].fix
    assert b["requestId"] == "r1"
    assert b["details"]["group"] == "nodus.dev"
    assert b["details"]["kind"] == "Sweep"
    assert b["details"]["causes"][0] == {
        "field": "spec.template.spec.image",
        "message": "Required value",
        "reason": "FieldValueRequired",
    }
    assert field_errors_of(s) == causes


def test_status_for_nodus_codes_and_retry() -> None:
    s = status_for(
        "InsufficientCredits", "the hold of $80.00 exceeds the balance of $20.00", fix="nodus billing topup"
    )
    assert (s.code, s.reason, s.fix, s.details) == (403, "InsufficientCredits", "nodus billing topup", None)
    s = status_for("TooManyRequests", "slow down", retry_after=3)
    assert s.details is not None
    assert s.details.retry_after_seconds == 3
    with pytest.raises(ValueError, match="unregistered"):
        status_for("Nope", "x")
    ok = to_builtins(status_success(name="lr", kind="Sweep"))
    assert ok["status"] == "Success"
    assert ok["details"]["name"] == "lr"
