"""The CLI's newer commands against a real gateway on the session's nats-server: get -o wide|name for every
kind, patch, estimate (with the scheduler's and billing's real estimate endpoints), offers (from the real
price book, published as the scheduler publishes it), login and config, apply --wait, and exit codes."""

from __future__ import annotations

import asyncio
import io
import json
import os
import stat
import sys
import threading
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio
import yaml
from nats.aio.client import Client as NATS

from nodus_billing.quoting import serve_quotes
from nodus_cli import main, watching
from nodus_cli import waiting as waiting_module
from nodus_cli.kinds import JOB
from nodus_kit.storing import ObjectStore
from nodus_scheduler.answering import serve_estimates
from nodus_scheduler.cataloging import load_catalog
from nodus_scheduler.publishing import publish_catalog
from nodus_schema import Job, JobStatus, ObjectMeta, Sweep, SweepStatus
from nodus_schema.attempts import Attempt, AttemptSpec
from nodus_schema.costs import Cost
from nodus_schema.nodes import GPUDevice, Node, NodeSpec, NodeStatus
from nodus_testing.processes import free_port

TOKEN = "cli-test-token-0123456789"  # the gateway_url fixture's admin token (tests/cli/conftest.py)

SWEEP_YAML = """\
apiVersion: nodus.dev/v1
kind: Sweep
metadata:
  name: lr
spec:
  maxParallel: 2
  matrix:
    gpu: ["H100:1", "L4:1"]
    params:
      LR: ["0.1", "0.01"]
  template:
    kind: Job
    spec:
      image: ghcr.io/acme/train:1.0
      expectedDuration: 30m
"""

JOB_YAML = """\
apiVersion: nodus.dev/v1
kind: Job
metadata:
  name: train
spec:
  image: ghcr.io/acme/train:1.0
  expectedDuration: 2h
  resources:
    gpu: {type: [H100-SXM-80G], exact: true, count: 1}
  placement:
    regions: [us]
"""

BLOCKED_YAML = """\
apiVersion: nodus.dev/v1
kind: Job
metadata:
  name: b200
spec:
  image: ghcr.io/acme/train:1.0
  expectedDuration: 2h
  resources:
    gpu: B200:1
  placement:
    regions: [us]
"""


class Cli:
    """Runs ``nodus`` in a thread against the test gateway, in one namespace; collects what it printed."""

    def __init__(self, url: str, namespace: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.url, self.namespace, self.capsys = url, namespace, capsys

    async def __call__(self, *argv: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        args = ["--server", self.url, "--token", TOKEN, "-n", self.namespace, *argv]
        code = await asyncio.to_thread(main, args)
        out, err = self.capsys.readouterr()
        return code, out, err


@pytest.fixture(autouse=True)
def no_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test with its own (absent) config file: a developer's ~/.config/nodus never leaks in."""
    path = tmp_path / "nodus-config" / "config.yaml"
    monkeypatch.setenv("NODUS_CONFIG", str(path))
    return path


@pytest.fixture
def nodus(gateway_url: str, unique: str, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(gateway_url, unique, capsys)


def saved(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def exists(path: Path) -> bool:
    return path.exists()


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest_asyncio.fixture
async def estimates(nc: NATS) -> AsyncIterator[None]:
    """The scheduler's and billing's estimate endpoints on the real subjects the gateway asks."""
    subs = [await serve_estimates(nc, load_catalog()), await serve_quotes(nc)]
    yield
    for sub in subs:
        await sub.unsubscribe()


@pytest_asyncio.fixture
async def price_book(nc: NATS) -> None:
    """The shipped price book in the offerings bucket, as the scheduler publishes it at start."""
    await publish_catalog(nc, load_catalog())


# ---------------------------------------------------------------------------------------------------------
# get -o wide | name, every kind
# ---------------------------------------------------------------------------------------------------------


async def test_get_wide_and_name_outputs(nodus: Cli, nc: NATS, tmp_path: Path, unique: str) -> None:
    assert (await nodus("apply", "-f", write(tmp_path, "s.yaml", SWEEP_YAML + "---\n" + JOB_YAML)))[0] == 0

    code, out, _ = await nodus("get", "sweeps", "-o", "wide")
    header, row = out.splitlines()
    assert code == 0
    assert header.split() == [
        "NAME", "PHASE", "CELLS", "SPENT", "BEST", "AGE",
        "BEST-THROUGHPUT", "RATE", "GPU", "REGIONS", "MAX-COST",
    ]  # fmt: skip
    assert row.split()[:3] == ["lr", "Pending", "0/4"] and "H100:1,L4:1" in row

    code, out, _ = await nodus("get", "jobs", "-o", "wide")
    header, row = out.splitlines()
    assert header.split()[-5:] == ["RATE", "REGIONS", "ATTEMPTS", "TOPOLOGY", "MAX-COST"]
    assert row.split()[:2] == ["train", "Pending"] and " us " in row

    code, out, _ = await nodus("get", "sweeps", "-o", "name")
    assert (code, out) == (0, "sweep.nodus.dev/lr\n")
    code, out, _ = await nodus("get", "job", "train", "-o", "name")
    assert (code, out) == (0, "job.nodus.dev/train\n")

    # Services' kinds: an Attempt (namespaced) and a Node (cluster-scoped) as the scheduler and agents
    # write them; -o wide shows where and at what rate.
    spec = AttemptSpec(
        job="train",
        index=0,
        attempt=1,
        node=f"{unique}-node",
        offering="h100-sxm-80g-x1-us",
        region_class="us",
        rate_micros_per_hour=2_990_000,
        pricebook_version="2026-11-30.1",
        gpu_variant="H100-SXM-80G",
    )
    await ObjectStore(nc, "attempts", Attempt).create(
        Attempt(metadata=ObjectMeta(name="train-0-a1", namespace=unique), spec=spec)
    )
    code, out, _ = await nodus("get", "attempts", "-o", "wide")
    header, row = out.splitlines()
    assert code == 0
    assert header.split() == [
        "NAME", "JOB", "INDEX", "PHASE", "NODE", "WALL", "AGE",
        "GPU", "OFFERING", "REGION", "RATE", "INTERRUPTIBLE", "EXIT",
    ]  # fmt: skip
    cells = row.split()
    assert cells[:5] == ["train-0-a1", "train", "0", "Pending", f"{unique}-node"]
    assert cells[7:11] == ["H100-SXM-80G", "h100-sxm-80g-x1-us", "us", "$2.99/h"]

    node = Node(
        metadata=ObjectMeta(name=f"{unique}-node"),
        spec=NodeSpec(offering="l4-x1-eu", region_class="eu"),
        status=NodeStatus(
            phase="Ready", gpus=[GPUDevice(index=0, uuid="GPU-1", variant="L4", memory="24Gi")]
        ),
    )
    await ObjectStore(nc, "nodes", Node).create(node)
    code, out, _ = await nodus("get", "node", f"{unique}-node", "-o", "wide")
    header, row = out.splitlines()
    assert code == 0 and header.split()[:6] == ["NAME", "PHASE", "OFFERING", "REGION", "GPUS", "AGE"]
    assert row.split()[:5] == [f"{unique}-node", "Ready", "l4-x1-eu", "eu", "1/1"]
    code, out, _ = await nodus("describe", "node", f"{unique}-node")
    assert code == 0 and yaml.safe_load(out)["spec"]["offering"] == "l4-x1-eu"  # no view: the YAML
    # The cluster admin removes the record of an agent gone for good (the CLI's token is the admin's).
    code, out, _ = await nodus("delete", "node", f"{unique}-node")
    assert (code, out) == (0, f"node.nodus.dev/{unique}-node deleted\n")
    code, _, err = await nodus("get", "node", f"{unique}-node")
    assert code != 0 and "not found" in err


# ---------------------------------------------------------------------------------------------------------
# patch
# ---------------------------------------------------------------------------------------------------------


async def test_patch_merge_json_and_strategic(nodus: Cli, tmp_path: Path) -> None:
    assert (await nodus("apply", "-f", write(tmp_path, "s.yaml", SWEEP_YAML)))[0] == 0

    code, out, err = await nodus("patch", "sweep", "lr", "-p", '{"spec": {"maxParallel": 3}}')
    assert (code, out) == (0, "sweep.nodus.dev/lr patched\n"), err
    code, out, _ = await nodus("get", "sweep", "lr", "-o", "json")
    assert json.loads(out)["spec"]["maxParallel"] == 3

    # A YAML patch reads too; the same value again changes nothing.
    code, out, _ = await nodus("patch", "sw", "lr", "-p", "spec: {maxParallel: 3}")
    assert (code, out) == (0, "sweep.nodus.dev/lr patched (no change)\n")

    ops = json.dumps(
        [
            {"op": "test", "path": "/spec/maxParallel", "value": 3},
            {"op": "replace", "path": "/spec/maxParallel", "value": 1},
        ]
    )
    code, out, _ = await nodus("patch", "sweep", "lr", "--type", "json", "-p", ops, "-o", "json")
    assert code == 0 and json.loads(out)["spec"]["maxParallel"] == 1

    code, _, _ = await nodus(
        "patch", "sweep", "lr", "--type", "strategic", "-p", '{"metadata": {"labels": {"a": "b"}}}'
    )
    assert code == 0
    code, out, _ = await nodus("get", "sweep", "lr", "-o", "yaml")
    assert yaml.safe_load(out)["metadata"]["labels"] == {"a": "b"}

    # The server refuses: a failed test op, and a patched object that is invalid (every cause, the fix).
    failing = '[{"op": "test", "path": "/spec/maxParallel", "value": 99}]'
    code, out, err = await nodus("patch", "sweep", "lr", "--type", "json", "-p", failing)
    assert code == 1 and out == "" and err.startswith("error: ") and "test failed" in err
    code, _, err = await nodus("patch", "sweep", "lr", "-p", '{"spec": {"maxParallel": 0}}')
    assert code == 1
    assert 'error: the Sweep "lr" is invalid:' in err and "  spec.maxParallel: Invalid value: 0" in err
    assert "fix: " in err and "docs: https://docs.nodus.dev/errors/Invalid" in err

    # Usage errors: a patch that is not one, a JSON patch that is not a list.
    code, _, err = await nodus("patch", "sweep", "lr", "-p", "{not: [json")
    assert code == 2 and "neither JSON nor YAML" in err and "fix:" in err
    code, _, err = await nodus("patch", "sweep", "lr", "--type", "json", "-p", '{"spec": {}}')
    assert code == 2 and "list of operations" in err
    code, _, err = await nodus("patch", "sweep", "missing", "-p", '{"spec": {"maxParallel": 2}}')
    assert code == 1 and 'sweeps.nodus.dev "missing" not found' in err and "fix:" in err
    code, _, err = await nodus("patch", "offering", "x", "-p", "{}")
    assert code == 1 and "written by Nodus' services" in err


# ---------------------------------------------------------------------------------------------------------
# estimate
# ---------------------------------------------------------------------------------------------------------


async def test_estimate_prints_cost_rate_startup_and_holds(
    nodus: Cli, tmp_path: Path, estimates: None
) -> None:
    code, out, err = await nodus("estimate", "-f", write(tmp_path, "job.yaml", JOB_YAML))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "job.nodus.dev/train: could run"
    fields = {
        k.strip(): v.strip()
        for k, _, v in (
            line.partition(":") for line in lines[1:] if line.startswith("  ") and not line.startswith("    ")
        )
    }
    # 2h at 2.99 $/h plus the 2m boot (the gateway's own estimate test has the same figures).
    assert fields["cost"].startswith("p50 $6.079667  p90 $")
    assert fields["rate"] == "$2.99/h on h100-sxm-80g-x1-us (us, on-demand)"
    assert fields["startup"] == "cold p50 2m0s  p90 5m0s; warm p50 10s  p90 30s"
    # The first hold: billing's ten-minute window at 2.99 $/h (0.4983333…, rounded up); one index at once.
    assert fields["hold"].startswith("$0.498334  (first hold")
    assert fields["concurrent"].startswith("$0.498334  (")
    # Holds in one paragraph, with this estimate's amounts and the $2-cap example.
    paragraph = " ".join(
        line.strip() for line in out.split("  holds:\n", 1)[1].split("\n  warnings:")[0].splitlines()
    )
    assert paragraph.startswith("Billing sets $0.498334 aside before the run starts")
    assert "any cap of at least $0.000831 (one second) runs until it is spent" in paragraph
    assert paragraph.endswith('For example, maxCostUSD "2.00" at $2.99/h runs about 40 minutes.')
    assert fields["price book"].startswith("2026-11-30.1  (valid until ")
    assert "BalanceNotChecked" in out  # warnings are listed
    # Nothing was created.
    assert (await nodus("get", "job", "train"))[0] == 1

    code, out, _ = await nodus("estimate", "-f", write(tmp_path, "s.yaml", SWEEP_YAML), "-o", "json")
    (entry,) = json.loads(out)
    assert code == 0 and (entry["kind"], entry["name"], entry["blocked"]) == ("Sweep", "lr", False)
    assert entry["estimate"]["rateUSDPerHour"] == "2.99" and entry["etag"].startswith('"e1:2990000:')


async def test_estimate_of_a_blocked_job_exits_3_with_each_reason_and_fix(
    nodus: Cli, tmp_path: Path, estimates: None
) -> None:
    both = write(tmp_path, "both.yaml", JOB_YAML + "---\n" + BLOCKED_YAML)
    code, out, _ = await nodus("estimate", "-f", both)
    assert code == 3
    first, second = out.split("\n\n")
    assert first.startswith("job.nodus.dev/train: could run")
    assert second.startswith("job.nodus.dev/b200: BLOCKED (1 reason)")
    reasons = second.split("  blocked by:\n")[1].splitlines()
    assert reasons[0].startswith("    CapacityUnavailable: ")
    assert reasons[1].startswith("      fix: ")


async def test_estimate_errors(nodus: Cli, tmp_path: Path) -> None:
    # Without the estimate services the gateway refuses the dry run: its Status and fix, exit 1.
    code, out, err = await nodus("estimate", "-f", write(tmp_path, "job.yaml", JOB_YAML))
    assert code == 1 and out == ""
    assert "no estimate" in err and "fix: A dry run answers the estimate" in err
    budget = "apiVersion: nodus.dev/v1\nkind: Budget\nmetadata: {name: b}\nspec: {monthlyUSD: '1.00'}\n"
    code, _, err = await nodus("estimate", "-f", write(tmp_path, "b.yaml", budget))
    assert code == 1 and "has no estimate" in err and "no Sweep or Job to estimate" in err
    code, _, err = await nodus("estimate", "-f", str(tmp_path / "missing.yaml"))
    assert code == 1 and "cannot read" in err


# ---------------------------------------------------------------------------------------------------------
# offers
# ---------------------------------------------------------------------------------------------------------


def _rows(out: str) -> list[list[str]]:
    """The table's cells, cut at the header's column starts (a cell may be empty)."""
    header, *lines = out.splitlines()
    starts = [header.index(h) for h in header.split()]
    ends = [*starts[1:], None]
    return [[line[a:b].strip() for a, b in zip(starts, ends, strict=True)] for line in lines]


async def test_offers_groups_by_family_sorted_by_rate_with_filters(nodus: Cli, price_book: None) -> None:
    code, out, _ = await nodus("offers")
    assert code == 0
    header = out.splitlines()[0].split()
    assert header == ["GPU", "VARIANT", "GPUS", "REGION", "RATE", "INTERRUPTIBLE", "OFFERING"]
    # Families in groups: a family's name heads its group, and no family comes back after another.
    families = [r[0] for r in _rows(out) if r[0]]
    assert len(families) == len(set(families)) and {"H100", "L4", "MI300X"} <= set(families)

    code, out, _ = await nodus("offers", "--gpu", "L4")
    rows = _rows(out)
    assert code == 0 and rows and all(r[-1].startswith("l4-") for r in rows)
    assert rows[0][0] == "L4" and all(r[0] == "" for r in rows[1:])  # the family once, atop its group

    code, out, _ = await nodus("offers", "--region", "eu", "--max-rate", "2.5", "-o", "json")
    items = json.loads(out)["items"]
    assert code == 0 and items
    rates = [o["spec"]["rateUSDPerHour"] for o in items]
    assert all(o["spec"]["regionClass"] == "eu" for o in items)
    assert all(Decimal(r) <= Decimal("2.5") for r in rates)

    code, out, _ = await nodus("offers", "--gpu", "H100:8", "-o", "wide")
    rows = _rows(out)
    assert code == 0 and rows and all(r[2] == "8" for r in rows)
    assert "RATE/GPU" in out.splitlines()[0]
    # Sorted by rate inside the family, as exact decimals.
    on_demand = [Decimal(r[4].removeprefix("$").removesuffix("/h")) for r in rows if r[4] != "-"]
    assert on_demand == sorted(on_demand)

    code, out, _ = await nodus("offers", "--interruptible", "--family", "h100", "-o", "name")
    assert code == 0 and out and all(line.startswith("offering.nodus.dev/h100-") for line in out.splitlines())
    code, _, err = await nodus("offers", "--gpu", "NOPE")
    assert code == 0 and "no offering matches the filters" in err
    code, _, err = await nodus("offers", "--max-rate", "cheap")
    assert code == 2 and "--max-rate" in err

    # The same objects through get (cluster-scoped: -n does not apply).
    code, out, _ = await nodus("get", "offerings", "h100-sxm-80g-x1-us")
    assert code == 0 and out.splitlines()[1].split()[:5] == [
        "h100-sxm-80g-x1-us",
        "H100-SXM-80G",
        "1",
        "us",
        "$2.99/h",
    ]


# ---------------------------------------------------------------------------------------------------------
# login, config
# ---------------------------------------------------------------------------------------------------------


async def test_login_writes_a_private_context_that_later_commands_use(
    gateway_url: str,
    unique: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    no_config_file: Path,
) -> None:
    monkeypatch.chdir(tmp_path)  # no .nodus/local.env above it
    for var in ("NODUS_URL", "NODUS_TOKEN", "NODUS_CA"):
        monkeypatch.delenv(var, raising=False)

    async def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = await asyncio.to_thread(main, list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    code, _, err = await run("login", "--server", gateway_url, "--token", "wrong-token", "--project", unique)
    assert code == 1 and "Unauthorized" in err and "nothing was saved" in err
    assert not exists(no_config_file)
    code, _, err = await run("login", "--server", f"http://127.0.0.1:{free_port()}", "--token", TOKEN)
    assert code == 4 and "not running" in err and not exists(no_config_file)

    code, out, err = await run(
        "login", "--server", gateway_url, "--token", TOKEN, "--project", unique, "--name", "local"
    )
    assert code == 0, err
    assert out.startswith(f'logged in to {gateway_url} as context "local", project {unique}')
    assert mode(no_config_file) == 0o600
    data = saved(no_config_file)
    assert data == {
        "current-context": "local",
        "contexts": [{"name": "local", "server": gateway_url, "token": TOKEN, "project": unique}],
    }

    # No flags, no environment: the context's server, token and project.
    code, out, err = await run("apply", "-f", write(tmp_path, "job.yaml", JOB_YAML))
    assert (code, out) == (0, "job.nodus.dev/train created\n"), err
    code, out, _ = await run("get", "jobs", "-o", "name")
    assert (code, out) == (0, "job.nodus.dev/train\n")

    code, out, _ = await run("config", "view")
    assert code == 0 and yaml.safe_load(out)["contexts"][0]["token"] == "REDACTED"
    code, out, _ = await run("config", "view", "--raw", "-o", "json")
    assert json.loads(out)["contexts"][0]["token"] == TOKEN
    code, out, _ = await run("config", "current-context")
    assert (code, out) == (0, "local\n")

    other = f"{unique}-other"
    code, out, _ = await run("config", "set-project", other)
    assert code == 0 and saved(no_config_file)["contexts"][0]["project"] == other
    code, out, err = await run("get", "jobs")
    assert code == 0 and out == "" and f"No jobs found in {other} namespace." in err
    code, out, _ = await run("get", "jobs", "-n", unique, "-o", "name")  # -n still wins
    assert out == "job.nodus.dev/train\n"

    code, _, err = await run("config", "use-context", "nope")
    assert code == 1 and 'no context "nope"' in err and "contexts: local" in err
    code, _, err = await run(
        "login", "--server", gateway_url, "--token", TOKEN, "--name", "second", "--no-verify"
    )
    assert code == 0 and saved(no_config_file)["current-context"] == "second"
    code, out, _ = await run("config", "use-context", "local")
    assert code == 0 and saved(no_config_file)["current-context"] == "local"
    assert mode(no_config_file) == 0o600

    # The context's token goes to its own server only.
    monkeypatch.setenv("NODUS_URL", f"http://127.0.0.1:{free_port()}")
    code, _, err = await run("get", "jobs")
    assert code == 4

    write(no_config_file.parent, no_config_file.name, "contexts: [{name: x}]\n")
    code, _, err = await run("get", "jobs")
    assert code == 1 and "contexts[0] (x) needs a server" in err and "fix:" in err


# ---------------------------------------------------------------------------------------------------------
# apply --wait
# ---------------------------------------------------------------------------------------------------------


async def test_apply_wait_follows_each_job_to_its_end(
    nodus: Cli, nc: NATS, tmp_path: Path, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ObjectStore(nc, "jobs", Job)

    def status(s: JobStatus) -> Any:
        return lambda j: msgspec.structs.replace(j, status=s)

    # apply is held between its create and its wait while the Job goes Running: the Pending it was
    # created in must still be shown (apply follows from what its create returned, not from a later read).
    running_written = threading.Event()
    real_wait = waiting_module.wait

    def held_wait(*args: Any, **kwargs: Any) -> int:
        assert running_written.wait(10), "the test never wrote Running"
        return real_wait(*args, **kwargs)

    monkeypatch.setattr(waiting_module, "wait", held_wait)
    async with store.watch(unique, resource_version=await store.last_revision(), name="train") as w:
        waiting = asyncio.create_task(nodus("apply", "-f", write(tmp_path, "job.yaml", JOB_YAML), "--wait"))
        assert (await w.next(timeout=10)).type == "ADDED", "apply never created the Job"
    running = JobStatus(phase="Running", active=1, cost=Cost(total_usd="0.01", rate_usd_per_hour="2.99"))
    await store.mutate(unique, "train", status(running))
    running_written.set()
    await store.mutate(
        unique,
        "train",
        status(JobStatus(phase="Succeeded", succeeded=1, cost=Cost(total_usd="0.10", final=True))),
    )
    code, out, err = await asyncio.wait_for(waiting, 20)
    assert code == 0, err
    assert out.splitlines() == [
        "job.nodus.dev/train created",
        "job.nodus.dev/train  Succeeded  indexes 1/1 succeeded  spent $0.10 (final)",
    ]
    # Into a pipe (not a terminal) each state is a line of its own on stderr.
    assert "job.nodus.dev/train  Pending  indexes 0/1 succeeded  spent -" in err.splitlines()


async def test_apply_wait_exits_1_when_a_job_fails(nodus: Cli, nc: NATS, tmp_path: Path, unique: str) -> None:
    store = ObjectStore(nc, "jobs", Job)
    await nodus("apply", "-f", write(tmp_path, "job.yaml", JOB_YAML))
    await store.mutate(
        unique,
        "train",
        lambda j: msgspec.structs.replace(
            j,
            status=JobStatus(
                phase="Failed", reason="BackoffLimitExceeded", cost=Cost(total_usd="0.02", final=True)
            ),
        ),
    )
    # Applied again, it is unchanged and already over: --wait reports its end at once.
    code, out, _ = await nodus("apply", "-f", write(tmp_path, "job.yaml", JOB_YAML), "--wait")
    assert code == 1
    assert (
        out.splitlines()[-1]
        == "job.nodus.dev/train  Failed (BackoffLimitExceeded)  indexes 0/1 succeeded  spent $0.02 (final)"
    )


# ---------------------------------------------------------------------------------------------------------
# get -w: live, in a subprocess reading lines until the expected one (no sleeps)
# ---------------------------------------------------------------------------------------------------------


class Live:
    """``nodus ... get -w`` as a subprocess writing into a pipe; lines are read until one matches."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []

    @classmethod
    async def start(cls, url: str, namespace: str, *argv: str) -> Live:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "nodus_cli",
            "--server",
            url,
            "--token",
            TOKEN,
            "-n",
            namespace,
            *argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        return cls(proc)

    async def until(self, predicate: Any, deadline_s: float = 15.0, *, stderr: bool = False) -> str:
        """The first line (of stdout, or of stderr) that ``predicate`` accepts; every line read is kept."""
        stream = self.proc.stderr if stderr else self.proc.stdout
        assert stream is not None
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline_s
        while True:
            left = end - loop.time()
            assert left > 0, f"no such line; got {self.lines}"
            raw = await asyncio.wait_for(stream.readline(), left)
            assert raw, f"the output ended; got {self.lines}" + (
                "" if stderr else f", {await self._stderr()}"
            )
            line = raw.decode().rstrip("\n")
            self.lines.append(line)
            if predicate(line):
                return line

    async def _stderr(self) -> str:
        assert self.proc.stderr is not None
        return (await self.proc.stderr.read()).decode()

    async def interrupt(self) -> int:
        self.proc.send_signal(2)  # SIGINT: Ctrl-C
        return await asyncio.wait_for(self.proc.wait(), 15)


@pytest_asyncio.fixture
async def lives() -> AsyncIterator[list[Live]]:
    started: list[Live] = []
    yield started
    for live in started:
        if live.proc.returncode is None:
            live.proc.kill()
            await live.proc.wait()


async def test_get_jobs_watch_prints_changed_rows_and_ctrl_c_exits_0(
    gateway_url: str, nc: NATS, unique: str, lives: list[Live], nodus: Cli, tmp_path: Path
) -> None:
    live = await Live.start(gateway_url, unique, "get", "jobs", "-w")
    lives.append(live)
    # Nothing yet: said on stderr, as kubectl says it; the header comes with the first row.
    await live.until(lambda line: line.startswith("No jobs found"), stderr=True)

    assert (await nodus("apply", "-f", write(tmp_path, "job.yaml", JOB_YAML)))[0] == 0
    header = await live.until(lambda line: line.startswith("NAME"))
    assert header.split() == ["NAME", "PHASE", "GPU", "COMPLETIONS", "WALL", "UNITS/S", "SPENT", "AGE"]
    row = await live.until(lambda line: line.startswith("train "))
    assert row.split()[:2] == ["train", "Pending"] and row.split()[3] == "0/1"

    store = ObjectStore(nc, "jobs", Job)
    await store.mutate(
        unique,
        "train",
        lambda j: msgspec.structs.replace(
            j, status=JobStatus(phase="Running", active=1, cost=Cost(total_usd="0.05"))
        ),
    )
    row = await live.until(lambda line: line.startswith("train ") and "Running" in line)
    assert "$0.05" in row
    # A changed row is a new line in the first table's columns.
    assert row.index("Running") == header.index("PHASE")

    assert (await nodus("delete", "job", "train"))[0] == 0
    await live.until(lambda line: line.startswith("train "))  # the deleted object's last row
    assert await live.interrupt() == 0


async def test_get_sweep_watch_ends_1_when_the_sweep_fails(
    gateway_url: str, nc: NATS, unique: str, lives: list[Live], nodus: Cli, tmp_path: Path
) -> None:
    assert (await nodus("apply", "-f", write(tmp_path, "s.yaml", SWEEP_YAML)))[0] == 0
    live = await Live.start(gateway_url, unique, "get", "sweep", "lr", "-w")
    lives.append(live)
    await live.until(lambda line: line.startswith("Sweep lr  Pending"))
    store = ObjectStore(nc, "sweeps", Sweep)
    await store.mutate(
        unique,
        "lr",
        lambda s: msgspec.structs.replace(
            s,
            status=SweepStatus(phase="Failed", reason="CellsFailed", cost=Cost(total_usd="0.20", final=True)),
        ),
    )
    await live.until(lambda line: line.startswith("Sweep lr  Failed (CellsFailed)"))
    assert await asyncio.wait_for(live.proc.wait(), 15) == 1


async def test_get_watch_of_a_kind_the_gateway_does_not_watch_polls(
    gateway_url: str, nc: NATS, unique: str, lives: list[Live]
) -> None:
    live = await Live.start(gateway_url, unique, "get", "nodes", "-w", "-l", f"test={unique}")
    lives.append(live)
    await live.until(lambda line: line.startswith("No nodes found"), stderr=True)
    node = Node(
        metadata=ObjectMeta(name=f"{unique}-n", labels={"test": unique}),
        spec=NodeSpec(offering="l4-x1-us", region_class="us"),
        status=NodeStatus(phase="Ready"),
    )
    await ObjectStore(nc, "nodes", Node).create(node)
    row = await live.until(lambda line: line.startswith(f"{unique}-n "))
    assert row.split()[1:4] == ["Ready", "l4-x1-us", "us"]
    assert await live.interrupt() == 0


def test_a_terminal_gets_the_table_redrawn_in_place() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    view = watching.LiveTable(JOB, wide=False, out=out)
    job = {"apiVersion": "nodus.dev/v1", "kind": "Job", "metadata": {"name": "a", "namespace": "n"}}
    view.apply(watching.Change(watching.RESET))
    view.apply(watching.Change("ADDED", job))
    view.apply(watching.Change(watching.SYNCED))
    first = out.getvalue()
    assert first.startswith("NAME") and "\x1b[" not in first
    view.apply(watching.Change("ADDED", {**job, "metadata": {"name": "b", "namespace": "n"}}))
    redraw = out.getvalue()[len(first) :]
    # Back up over the two lines drawn, clear to the end, draw the three of now.
    assert redraw.startswith("\x1b[2F\x1b[J") and redraw.count("\n") == 3


def test_help_lists_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "exit codes:" in out and "130  interrupted" in out and "3    blocked" in out
    assert main(["get"]) == 2  # usage error
