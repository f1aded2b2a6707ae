"""The nodus CLI against a real gateway: apply, get, watch, describe, delete, and its error output."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec
import pytest
import yaml
from nats.aio.client import Client as NATS

from nodus_cli import commands, main
from nodus_cli.config import load, read_env_file
from nodus_kit.storing import ObjectStore
from nodus_schema import Cost, Sweep, SweepBest, SweepCell, SweepStatus
from nodus_testing.processes import free_port
from nodus_testing.waiting import eventually

TOKEN = "cli-test-token-0123456789"

SWEEP_YAML = """\
apiVersion: nodus.dev/v1
kind: Sweep
metadata:
  name: lr
  labels:
    team: vision
spec:
  matrix:
    params:
      LR: ["0.1", "0.01"]
  template:
    kind: Job
    spec:
      image: ghcr.io/acme/train:1.0
      command: [python, train.py]
      resources:
        gpu: H100:1
"""

JOB_YAML = """\
apiVersion: nodus.dev/v1
kind: Job
metadata:
  name: train
spec:
  image: ghcr.io/acme/train:1.0
  command: [python, train.py]
  resources:
    gpu: H100:1
"""

INVALID_YAML = """\
apiVersion: nodus.dev/v1
kind: Sweep
metadata:
  name: broken
spec:
  maxParallel: 0
  repetitons: 2
  template:
    spec:
      command: [python]
      resources:
        gpu: H100:3
"""


class Cli:
    """Runs ``nodus`` in a thread against the test gateway, in one namespace; collects what it printed."""

    def __init__(self, url: str, namespace: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.url, self.namespace, self.capsys = url, namespace, capsys

    async def __call__(self, *argv: str, server: str | None = None) -> tuple[int, str, str]:
        self.capsys.readouterr()
        args = ["--server", server or self.url, "--token", TOKEN, "-n", self.namespace, *argv]
        code = await asyncio.to_thread(main, args)
        out, err = self.capsys.readouterr()
        return code, out, err


@pytest.fixture
def nodus(gateway_url: str, unique: str, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(gateway_url, unique, capsys)


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


async def test_apply_get_describe_delete_a_sweep(nodus: Cli, tmp_path: Path, unique: str) -> None:
    manifest = write(tmp_path, "sweep.yaml", SWEEP_YAML)
    code, out, err = await nodus("apply", "-f", manifest)
    assert (code, out.strip()) == (0, "sweep.nodus.dev/lr created"), err

    code, out, _ = await nodus("get", "sweeps")
    assert code == 0
    header, row = out.strip().splitlines()
    assert header.split() == ["NAME", "PHASE", "CELLS", "SPENT", "BEST", "AGE"]
    assert row.split()[:3] == ["lr", "Pending", "0/2"]

    code, out, _ = await nodus("get", "sweep", "lr")
    assert code == 0
    assert out.startswith("Sweep lr  Pending  cells 0/2 done  spent -")
    assert "no cells yet" in out

    code, out, _ = await nodus("get", "sw", "lr", "-o", "json")
    assert code == 0 and json.loads(out)["spec"]["maxParallel"] == 4
    code, out, _ = await nodus("get", "sweeps", "-o", "yaml", "-l", "team=vision")
    assert code == 0 and yaml.safe_load(out)["items"][0]["metadata"]["name"] == "lr"
    code, out, err = await nodus("get", "sweeps", "-l", "team=nlp")
    assert code == 0 and out == "" and f"No sweeps found in {unique} namespace." in err

    code, out, _ = await nodus("describe", "sweep", "lr")
    assert code == 0
    for section in ("Name:", "Namespace:", "Spec:", "Template:", "Status:", "Conditions:", "Cells:"):
        assert section in out, out
    assert "LR [0.1, 0.01]" in out and "ghcr.io/acme/train:1.0" in out and "team=vision" in out

    code, out, _ = await nodus("delete", "sweep", "lr")
    assert code == 0 and out.startswith("sweep.nodus.dev/lr deleted")
    code, out, err = await nodus("get", "sweep", "lr")
    assert code == 1 and out == ""
    assert 'error: sweeps.nodus.dev "lr" not found' in err
    assert f"fix: Check the name and the project: `nodus get sweeps -n {unique}`" in err
    assert "docs: https://docs.nodus.dev/errors/NotFound" in err
    assert "request id: " in err


async def test_apply_again_is_unchanged_and_a_changed_spec_is_refused(nodus: Cli, tmp_path: Path) -> None:
    manifest = write(tmp_path, "sweep.yaml", SWEEP_YAML)
    assert (await nodus("apply", "-f", manifest))[0] == 0
    code, out, _ = await nodus("apply", "-f", manifest)
    assert (code, out.strip()) == (0, "sweep.nodus.dev/lr unchanged")
    changed = write(tmp_path, "changed.yaml", SWEEP_YAML.replace('"0.01"', '"0.001"'))
    code, _, err = await nodus("apply", "-f", changed)
    assert code == 1
    assert "already exists with a different spec" in err and "updates come with the full API" in err


async def test_apply_several_documents_and_jobs(nodus: Cli, tmp_path: Path) -> None:
    manifest = write(tmp_path, "both.yaml", SWEEP_YAML + "---\n" + JOB_YAML)
    code, out, err = await nodus("apply", "-f", manifest)
    assert code == 0, err
    assert out.splitlines() == ["sweep.nodus.dev/lr created", "job.nodus.dev/train created"]
    code, out, _ = await nodus("get", "jobs")
    assert code == 0 and out.splitlines()[1].split()[:4] == ["train", "Pending", "H100:1", "0/1"]
    code, out, _ = await nodus("describe", "job", "train")
    assert code == 0 and "Backoff Limit:" in out and "python train.py" in out
    code, out, _ = await nodus("delete", "job", "train")
    assert code == 0 and out.strip() == "job.nodus.dev/train deleted"


async def test_an_invalid_file_prints_every_cause_and_exits_1(nodus: Cli, tmp_path: Path) -> None:
    code, out, err = await nodus("apply", "-f", write(tmp_path, "bad.yaml", INVALID_YAML))
    assert code == 1 and out == ""
    lines = err.splitlines()
    assert lines[0] == 'error: the Sweep "broken" is invalid:'
    assert '  spec.repetitons: unknown field "repetitons"; did you mean "repetitions"?' in lines
    # Unknown fields are reported first; fixed, the file shows the rule violations, all of them.
    code, _, err = await nodus(
        "apply", "-f", write(tmp_path, "bad2.yaml", INVALID_YAML.replace("  repetitons: 2\n", ""))
    )
    assert code == 1
    causes = [line for line in err.splitlines() if line.startswith("  ")]
    assert any(c.startswith("  spec.maxParallel: Invalid value: 0") for c in causes)
    assert any(c.startswith("  spec.template.spec.image: Required value") for c in causes)
    assert any(c.startswith("  spec.template.spec.resources.gpu:") for c in causes)
    assert "fix: Fix the fields listed in details.causes" in err
    assert "docs: https://docs.nodus.dev/errors/Invalid" in err


async def test_unreadable_and_foreign_manifests(nodus: Cli, tmp_path: Path) -> None:
    code, _, err = await nodus("apply", "-f", str(tmp_path / "missing.yaml"))
    assert code == 1 and "cannot read" in err
    code, _, err = await nodus("apply", "-f", write(tmp_path, "bad.yaml", "a: [1, 2\n"))
    assert code == 1 and "is not valid YAML" in err
    code, _, err = await nodus("apply", "-f", write(tmp_path, "pod.yaml", "apiVersion: v1\nkind: Pod\n"))
    assert code == 1 and 'kind "Pod" is not a Nodus kind' in err
    code, _, err = await nodus("get", "pods")
    assert code == 1 and 'resource type "pods"' in err


async def test_no_gateway_says_to_run_make_up(nodus: Cli) -> None:
    code, out, err = await nodus("get", "sweeps", server=f"http://127.0.0.1:{free_port()}")
    assert code == 4 and out == ""  # exit 4: the gateway cannot be reached (exiting.py)
    assert "the Nodus gateway is not running" in err and "make up" in err


async def test_a_wrong_token_says_where_the_token_is(
    gateway_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = await asyncio.to_thread(main, ["--server", gateway_url, "--token", "wrong", "get", "sweeps"])
    err = capsys.readouterr().err
    assert code == 1 and "Unauthorized" in err and ".nodus/local.env" in err


async def test_server_and_token_come_from_local_env(
    gateway_url: str,
    unique: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / ".nodus").mkdir()
    (tmp_path / ".nodus" / "local.env").write_text(f"NODUS_URL={gateway_url}\nNODUS_TOKEN={TOKEN}\n")
    (tmp_path / "deep" / "er").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "deep" / "er")
    monkeypatch.delenv("NODUS_URL", raising=False)
    monkeypatch.delenv("NODUS_TOKEN", raising=False)
    code = await asyncio.to_thread(main, ["get", "sweeps", "-n", unique])
    assert code == 0, capsys.readouterr().err
    # The local token is never sent to another server.
    other = f"http://127.0.0.1:{free_port()}"
    config = load(server=None, token=None, namespace=None, environ={"NODUS_URL": other}, cwd=Path.cwd())
    assert config.server == other and config.token is None
    config = load(server=other, token=None, namespace=None, environ={}, cwd=Path.cwd())
    assert config.token is None


async def test_watch_redraws_until_the_sweep_finishes(
    nodus: Cli, nc: NATS, tmp_path: Path, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(commands, "WATCH_INTERVAL_S", 0.05)
    assert (await nodus("apply", "-f", write(tmp_path, "sweep.yaml", SWEEP_YAML)))[0] == 0
    store = ObjectStore(nc, "sweeps", Sweep)

    def cells(*phases: str) -> list[SweepCell]:
        out = []
        for i, (phase, lr) in enumerate(zip(phases, ("0.1", "0.01"), strict=True)):
            done = phase == "Succeeded"
            out.append(
                SweepCell(
                    index=i,
                    repetition=0,
                    object=f"lr-{i}",
                    gpu="H100:1",
                    params={"LR": lr},
                    phase=phase,
                    wall_seconds=125 + i if done else None,
                    units_per_second=("812.5", "900")[i] if done else None,
                    cost_usd=("0.30", "0.10")[i] if done else None,
                )
            )
        return out

    def set_status(status: SweepStatus) -> None:
        async def write() -> None:
            await store.mutate(unique, "lr", lambda s: msgspec.structs.replace(s, status=status))

        asyncio.run_coroutine_threadsafe(write(), loop).result(10)

    loop = asyncio.get_running_loop()
    await store.mutate(
        unique,
        "lr",
        lambda s: msgspec.structs.replace(
            s, status=SweepStatus(phase="Running", cells=cells("Running", "Pending"))
        ),
    )
    captured: list[str] = []
    nodus.capsys.readouterr()
    watch = asyncio.create_task(
        asyncio.to_thread(
            main, ["--server", nodus.url, "--token", TOKEN, "-n", unique, "get", "sweep", "lr", "--watch"]
        )
    )

    def drawn(text: str) -> bool:
        captured.append(nodus.capsys.readouterr().out)
        return text in "".join(captured)

    await eventually(lambda: drawn("cells 0/2 done"), message="the first frame was never drawn")
    await asyncio.to_thread(
        set_status,
        SweepStatus(
            phase="Succeeded",
            cells=cells("Succeeded", "Succeeded"),
            best=SweepBest(by_cost=1, by_throughput=1),
            cost=Cost(total_usd="0.40", final=True),  # the watch ends once the cost is final
        ),
    )
    assert await asyncio.wait_for(watch, 10) == 0
    captured.append(nodus.capsys.readouterr().out)
    final = "".join(captured).split("Sweep lr  ")[-1]
    assert final.startswith("Succeeded  cells 2/2 done  spent $0.40")
    rows = [line.split("  ") for line in final.splitlines() if line.startswith(("0 ", "1 "))]
    assert len(rows) == 2
    assert "INDEX  JOB   GPU     REGION  PARAMS   REP  PHASE      WALL   UNITS/S  COST" in final
    assert "1      lr-1  H100:1  -       LR=0.01  0    Succeeded  2m06s  900      $0.10" in final
    assert "best by cost: #1 (lr-1) $0.10" in final
    assert "best by throughput: #1 (lr-1) 900 units/s" in final


def test_usage_errors_return_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["frobnicate"]) == 2
    assert "invalid choice" in capsys.readouterr().err
    assert main(["--help"]) == 0
    assert "nodus apply -f sweep.yaml" in capsys.readouterr().out


def test_local_env_lines(tmp_path: Path) -> None:
    path = tmp_path / "local.env"
    path.write_text("# made by make up\n\nexport NODUS_URL='http://127.0.0.1:1'\nNODUS_TOKEN=\"a=b\"\nJUNK\n")
    assert read_env_file(path) == {"NODUS_URL": "http://127.0.0.1:1", "NODUS_TOKEN": "a=b"}
