"""The catalog and the versioned price book (ADR-0009, ADR-0014): the shipped data, the loader, the matching
reasons of the schema, the API object, and the rule that a Job is placed and priced at its own version."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pytest
import yaml

from nodus_scheduler.cataloging import (
    catalog_for,
    load_catalog,
    parse_catalog,
    pin_pricebook,
    pricebook_version_of,
    recorded_pricebook,
)
from nodus_schema.catalog import (
    GPUS_PER_NODE,
    INTERCONNECTS,
    Catalog,
    Offering,
    UnknownPricebook,
    catalog_errors,
    offering_matches,
    startup_estimate,
    version_key,
)
from nodus_schema.costs import Estimate
from nodus_schema.gpus import GPURequest
from nodus_schema.jobs import Job, JobSpec, JobStatus
from nodus_schema.meta import ObjectMeta
from nodus_schema.offerings import offering_object
from nodus_testing.localstack import default_agents

CURRENT, PREVIOUS = "2026-11-30.1", "2026-09-01.1"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


# -- the shipped data ------------------------------------------------------------------------------------


def test_the_catalog_has_every_family_and_variant_with_memory_and_interconnect(catalog: Catalog) -> None:
    assert {"B200", "H200", "H100", "A100", "L40S", "L4", "A10G", "MI300X"} <= catalog.families()
    ids = {v.id for v in catalog.variants}
    assert {
        "H100-SXM-80G",
        "H100-PCIE-80G",
        "H100-NVL-94G",
        "A100-SXM-40G",
        "A100-SXM-80G",
        "A100-PCIE-80G",
    } <= ids
    for v in catalog.variants:
        assert re.fullmatch(r"[0-9]+Gi", v.memory) and v.interconnect in INTERCONNECTS and v.tflops > 0
    mi300x = catalog.variant("MI300X")
    assert mi300x is not None and mi300x.interconnect == "InfinityFabric"


def test_the_price_book_is_realistic_and_exact(catalog: Catalog) -> None:
    offerings = catalog.offerings
    assert 24 <= len(offerings) <= 60
    assert {o.region_class for o in offerings} == {"us", "eu", "asia"}
    assert 2 <= len({o.provider for o in offerings}) <= 3
    assert {o.gpus_per_node for o in offerings} <= set(GPUS_PER_NODE)
    assert any(o.interruptible_rate_micros_per_hour for o in offerings)
    for o in offerings:
        # The naming rule: <variant>-x<gpus per node>-<region>, lower case.
        assert o.id == f"{o.variant.lower()}-x{o.gpus_per_node}-{o.region_class}"
        assert type(o.rate_micros_per_hour) is int and o.rate_micros_per_hour > 0  # never a float
        spot = o.interruptible_rate_micros_per_hour
        assert spot is None or (type(spot) is int and 0 < spot < o.rate_micros_per_hour)
        assert o.startup is not None and o.startup.cold.low_seconds <= o.startup.cold.high_seconds
        assert o.startup.warm.high_seconds <= o.startup.cold.low_seconds  # warm starts are faster
    assert catalog_errors(catalog) == []


def test_the_data_file_has_no_float_anywhere() -> None:
    raw = (ROOT / "services/scheduler/src/nodus_scheduler/data/catalog.json").read_text()

    def walk(value: object) -> None:
        assert not isinstance(value, float), value
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(json.loads(raw))


def test_the_local_stack_and_the_examples_name_offerings_that_exist(catalog: Catalog) -> None:
    for agent in default_agents():
        offering = catalog.offering(agent["NODUS_AGENT_OFFERING"])
        assert offering is not None, agent
        assert (offering.region_class, offering.variant) == (
            agent["NODUS_AGENT_REGION"],
            agent["NODUS_AGENT_VARIANT"],
        )
    sweep = yaml.safe_load((ROOT / "examples/sweep.yaml").read_text())
    for gpu in sweep["spec"]["matrix"]["gpu"]:
        family = gpu.split(":")[0]
        assert any(v.family == family for v in catalog.variants), gpu


# -- versions ------------------------------------------------------------------------------------------


def test_the_loader_returns_the_newest_version_and_any_other(catalog: Catalog) -> None:
    assert catalog.pricebook_version == CURRENT and catalog.versions() == [CURRENT, PREVIOUS]
    old = catalog.at(PREVIOUS)
    assert old.pricebook_version == PREVIOUS and old.at(PREVIOUS) is old and old.latest() is catalog
    assert load_catalog(version=PREVIOUS).pricebook_version == PREVIOUS
    assert old.offerings != catalog.offerings and old.variants == catalog.variants
    with pytest.raises(UnknownPricebook):
        catalog.at("2020-01-01.1")
    with pytest.raises(ValueError, match=r"no price book '2020-01-01\.1'"):
        load_catalog(version="2020-01-01.1")


def test_versions_compare_as_numbers() -> None:
    assert version_key("2026-11-30.10") > version_key("2026-11-30.9") > version_key("2026-09-01.1")
    book = Catalog(pricebook_version="2026-11-30.9", pricebooks=[])
    assert book.versions() == ["2026-11-30.9"] and book.latest() is book


def test_a_newer_version_changes_prices_only_for_what_uses_it(catalog: Catalog) -> None:
    now, then = catalog.offering("h100-sxm-80g-x1-us"), catalog.at(PREVIOUS).offering("h100-sxm-80g-x1-us")
    assert now is not None and then is not None
    assert (now.rate_micros_per_hour, then.rate_micros_per_hour) == (2_990_000, 3_290_000)
    assert catalog.at(PREVIOUS).offering("h200-sxm-141g-x8-us") is None  # new in the current book


def test_the_older_single_book_form_is_still_read() -> None:
    legacy = {
        "pricebookVersion": "2026-01-01.1",
        "variants": [{"id": "L4", "family": "L4", "memory": "24Gi"}],
        "offerings": [
            {
                "id": "l4-x1-us",
                "variant": "L4",
                "gpusPerNode": 1,
                "regionClass": "us",
                "rateMicrosPerHour": 790000,
            }
        ],
    }
    got = parse_catalog(json.dumps(legacy).encode())
    assert (got.pricebook_version, [o.id for o in got.offerings], got.versions()) == (
        "2026-01-01.1",
        ["l4-x1-us"],
        ["2026-01-01.1"],
    )


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda o: o.update(variant="NOPE"), "unknown variant NOPE"),
        (lambda o: o.update(gpusPerNode=3), "gpusPerNode 3 is not 1, 2, 4 or 8"),
        (lambda o: o.update(rateMicrosPerHour=0), "the on-demand rate must be positive"),
        (lambda o: o.update(interruptibleRateMicrosPerHour=900000), "at most the on-demand rate"),
        (lambda o: o.update(host={"cpu": "lots", "memory": "1Gi", "disk": "1Gi"}), "host cpu"),
        (
            lambda o: o.update(
                startup={
                    "cold": {"lowSeconds": 9, "highSeconds": 1},
                    "warm": {"lowSeconds": 1, "highSeconds": 1},
                }
            ),
            "cold startup band",
        ),
    ],
)
def test_an_unsound_file_is_refused(change: object, error: str) -> None:
    offering = {
        "id": "l4-x1-us",
        "variant": "L4",
        "gpusPerNode": 1,
        "regionClass": "us",
        "rateMicrosPerHour": 790000,
    }
    change(offering)  # type: ignore[operator]
    data = {
        "variants": [{"id": "L4", "family": "L4", "memory": "24Gi"}],
        "pricebooks": [{"version": "2026-01-01.1", "offerings": [offering, {**offering, "id": "l4-x1-eu"}]}],
    }
    with pytest.raises(ValueError, match=re.escape(error)):
        parse_catalog(json.dumps(data).encode())


def test_duplicates_are_refused() -> None:
    o = {
        "id": "l4-x1-us",
        "variant": "L4",
        "gpusPerNode": 1,
        "regionClass": "us",
        "rateMicrosPerHour": 790000,
    }
    data = {
        "variants": [{"id": "L4", "family": "L4", "memory": "24Gi"}],
        "pricebooks": [
            {"version": "2026-01-01.1", "offerings": [o, o]},
            {"version": "2026-01-01.1", "offerings": []},
        ],
    }
    with pytest.raises(ValueError, match="listed twice") as err:
        parse_catalog(json.dumps(data).encode())
    assert "offering l4-x1-us: listed twice" in str(
        err.value
    ) and "price book 2026-01-01.1 is listed twice" in str(err.value)


# -- the price book version of a Job: new versions apply to new admissions only --------------------------


def job(version: str | None = None, *, estimate: bool = True) -> Job:
    status = JobStatus(
        estimate=Estimate(pricebook_version=version, rate_usd_per_hour="2.99") if estimate else None
    )
    return Job(metadata=ObjectMeta(name="j", namespace="p"), spec=JobSpec(image="x"), status=status)


def test_a_job_is_priced_at_the_version_it_was_admitted_under(catalog: Catalog) -> None:
    admitted = job(PREVIOUS)
    assert recorded_pricebook(admitted) == PREVIOUS
    assert pricebook_version_of(admitted, catalog) == PREVIOUS
    assert catalog_for(admitted, catalog) is catalog.at(PREVIOUS)
    # Whichever version the scheduler loaded as its own, the Job's record wins.
    assert pricebook_version_of(admitted, catalog.at(PREVIOUS)) == PREVIOUS
    assert pricebook_version_of(job(CURRENT), catalog.at(PREVIOUS)) == CURRENT


def test_a_job_without_a_version_gets_the_newest_and_keeps_it(catalog: Catalog) -> None:
    for unpinned in (job(None), job(estimate=False)):
        assert pricebook_version_of(unpinned, catalog.at(PREVIOUS)) == CURRENT
        pinned = pin_pricebook(unpinned.status, catalog.at(PREVIOUS))
        assert pinned.estimate is not None and pinned.estimate.pricebook_version == CURRENT
    # What the estimate said is kept; a recorded version is never replaced, not even by a newer one.
    kept = pin_pricebook(job(None).status, catalog)
    assert kept.estimate is not None and kept.estimate.rate_usd_per_hour == "2.99"
    old = job(PREVIOUS).status
    assert pin_pricebook(old, catalog) is old


def test_an_unknown_recorded_version_is_placed_at_the_newest_but_kept(catalog: Catalog) -> None:
    stray = job("2019-01-01.1")
    assert pricebook_version_of(stray, catalog) == CURRENT
    assert pin_pricebook(stray.status, catalog) is stray.status


# -- the schema's matching reasons, the API object, startup bands --------------------------------------


def test_offering_matches_says_which_rule_failed(catalog: Catalog) -> None:
    def why(request: GPURequest, offering_id: str) -> str | None:
        offering = catalog.offering(offering_id)
        assert offering is not None
        return offering_matches(request, offering, catalog)

    assert why(GPURequest(type=["H100"], count=1), "h100-pcie-80g-x1-us") is None
    assert why(GPURequest(type=["H100"], count=1), "h200-sxm-141g-x1-us") == "other accelerator"
    assert why(GPURequest(type=["H100"], exact=True, count=1), "h100-sxm-80g-x1-us") == "other accelerator"
    assert (
        why(GPURequest(type=["H100"], count=1, interconnect="NVLink"), "h100-pcie-80g-x1-us") == "not NVLink"
    )
    assert (
        why(GPURequest(type=["A100"], count=1, min_memory="80Gi"), "a100-sxm-40g-x1-us") == "below minMemory"
    )
    assert why(GPURequest(type=["H100"], count=8), "h100-sxm-80g-x1-us") == "not 8 GPUs per node"


def test_the_api_object_shows_both_rates_as_decimal_strings_and_the_bands(catalog: Catalog) -> None:
    offering = catalog.offering("h100-sxm-80g-x1-us")
    assert offering is not None
    obj = msgspec.to_builtins(offering_object(offering, CURRENT))
    spec = obj["spec"]
    assert (spec["rateUSDPerHour"], spec["interruptibleRateUSDPerHour"]) == ("2.99", "1.495")
    assert spec["startup"] == {
        "cold": {"lowSeconds": 120, "highSeconds": 300},
        "warm": {"lowSeconds": 10, "highSeconds": 30},
    }
    asia = catalog.offering("h100-sxm-80g-x1-asia")
    assert (
        asia is not None
        and "interruptibleRateUSDPerHour" not in msgspec.to_builtins(offering_object(asia, CURRENT))["spec"]
    )


def test_startup_bands_read_as_the_estimates_p50_and_p90(catalog: Catalog) -> None:
    s = startup_estimate(catalog.offering("h100-sxm-80g-x1-us"))
    assert s is not None and s.cold is not None and s.warm is not None
    assert (s.cold.p50, s.cold.p90, s.warm.p50, s.warm.p90) == ("2m0s", "5m0s", "10s", "30s")
    assert startup_estimate(None) is None
    assert (
        startup_estimate(
            Offering(id="o", variant="L4", gpus_per_node=1, region_class="us", rate_micros_per_hour=1)
        )
        is None
    )
