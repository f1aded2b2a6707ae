"""The GPU-host run of issue #6: the whole stack on one GPU host, its agent on the host's real GPUs.

    python tests/gpu/gpuhost.py --out DIR            # on a GPU host (NVML and torch with CUDA)
    python tests/gpu/gpuhost.py --out DIR --fake     # anywhere: a fake H200 and a CPU program

What it does, in order, and what it writes to DIR/gpuhost.json (and prints as it goes):

1. NVML discovery as the agent does it (``nodus_agent.inventory.read_nvml``): model, catalog variant,
   memory, NVLink links, driver and CUDA versions.
2. The local stack (``nodus_testing.localstack.Stack``: nats-server, gateway, sweep controller,
   scheduler, billing) with ONE node agent that registers what NVML found (no fake inventory), runs
   the ``process`` runtime and watches GPU health (XID/ECC). SeaweedFS only where its binary is.
3. A Job through the API: ``examples/gpu/matmul.py`` (bf16 matrix products on the GPU) on ``H200:1``
   (or whatever the host has), its throughput reported through NODUS_REPORT; waited for until its cost is
   final. Recorded: phase, node, offering, rate, throughput, cost, wall time and the program's log.
4. A Sweep over the matrix size (three cells, one at a time on the one GPU) with its best cell by
   throughput and by cost.
5. The Node as the API shows it (GPUs, GPUHealthy, fakeGpus) and the agent's own log lines about NVML.

Exit status 0 when every step did what it should (a real GPU was found unless --fake, the Job and every
cell Succeeded with a throughput, the Node is healthy), 1 otherwise. tests/gpu/test_gpuhost.py runs it
with --fake in CI so the script cannot rot, and for real where NVML sees a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from nodus_agent.inventory import read_nvml
from nodus_sdk import Client, settled
from nodus_testing.localstack import Stack
from nodus_testing.processes import venv_bin

REPO = Path(__file__).resolve().parents[2]
PROGRAM = REPO / "examples" / "gpu" / "matmul.py"
NODE = "gpu-host-1"
PROJECT = "gpu-host"
SIZES = ("4096", "8192", "16384")


def agent_env(fake: bool, gpu: str) -> dict[str, str]:
    env = {"NODUS_AGENT_NODE": NODE, "NODUS_AGENT_REGION": "us", "NODUS_AGENT_RUNTIME": "process"}
    if fake:  # what a one-H200 host would register
        env.update(
            NODUS_AGENT_FAKE_GPUS="1",
            NODUS_AGENT_OFFERING="h200-sxm-141g-x1-us",
            NODUS_AGENT_VARIANT="H200-SXM-141G",
            NODUS_AGENT_GPU_MEMORY="141Gi",
            NODUS_AGENT_GPUS="1",
        )
    return env


def job(name: str, gpu: str, env: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"example": "gpu-host"}},
        "spec": {
            # What a container runtime would run; the process runtime runs the command on the host.
            "image": "nvcr.io/nvidia/pytorch:25.01-py3",
            "command": [sys.executable, str(PROGRAM)],
            "env": [{"name": k, "value": v} for k, v in env.items()],
            "resources": {"gpu": gpu},
            "backoffLimit": 0,
            "expectedDuration": f"{int(env.get('SECONDS', '15')) + 15}s",  # the run and its start
            "timeout": "10m",
        },
    }


def sweep(name: str, gpu: str, env: dict[str, str]) -> dict[str, Any]:
    template = job(name, gpu, env)["spec"]
    del template["resources"]  # the matrix says the GPU
    return {
        "apiVersion": "nodus.dev/v1",
        "kind": "Sweep",
        "metadata": {"name": name, "labels": {"example": "gpu-host"}},
        "spec": {
            "maxParallel": 1,  # one GPU: the cells take turns
            "matrix": {"gpu": [gpu], "params": {"N": list(SIZES)}},
            "template": {"kind": "Job", "spec": template},
        },
    }


def wire(obj: Any) -> Any:
    """A typed object as the API writes it (camelCase)."""
    return msgspec.json.decode(msgspec.json.encode(obj))


class Check:
    """Named expectations; the run fails if any does not hold."""

    def __init__(self) -> None:
        self.results: dict[str, bool] = {}

    def __call__(self, name: str, ok: bool, detail: object = "") -> bool:
        self.results[name] = ok
        print(f"  [{'ok' if ok else 'FAILED'}] {name}" + (f": {detail}" if detail != "" else ""), flush=True)
        return ok


def section(title: str) -> None:
    print(f"\n== {title}", flush=True)


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t = time.monotonic()
    value = fn()
    return value, time.monotonic() - t


def run(root: Path, out: Path, fake: bool, seconds: int) -> int:
    report: dict[str, Any] = {"fake": fake, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    check = Check()

    section("1. NVML discovery (nodus_agent.inventory.read_nvml)")
    found = None if fake else read_nvml()
    report["nvml"] = None if found is None else dataclasses.asdict(found)
    print(json.dumps(report["nvml"], indent=2))
    if not fake:
        check("NVML sees a GPU", found is not None and bool(found.gpus))
    gpu = "H200:1"
    if found is not None and found.gpus:
        from nodus_agent.inventory import model_of

        model = model_of(found.gpus[0].name)
        if model is not None:
            gpu = f"{model.variant.split('-')[0]}:1"  # the family: H200-SXM-141G -> H200
    report["gpuRequest"] = gpu

    section("2. the stack, with one agent on this host's GPUs")
    stack = Stack(root, agents=[agent_env(fake, gpu)], s3=shutil.which("weed") is not None or _venv_weed())
    try:
        values, took = timed(lambda: stack.start(deadline_s=120))
        print(f"  up in {took:.1f} s: gateway {values['NODUS_URL']}")
        client = Client(
            server=values["NODUS_URL"], token=values["NODUS_TOKEN"], ca=values["NODUS_CA"], project=PROJECT
        )
        with client:
            _run_work(client, report, check, fake, gpu, seconds)
    finally:
        stopped = stack.stop()
        print(f"\n  stack stopped ({len(stopped)} processes)")
        shutil.copytree(root / "logs", out / "logs", dirs_exist_ok=True)

    agent_log = out / "logs" / f"{NODE}.log"
    if agent_log.exists():
        lines = agent_log.read_text(errors="replace").splitlines()
        report["agentLogNvml"] = [ln for ln in lines if "GPU" in ln or "NVML" in ln or "nvml" in ln][:20]
    report["checks"] = check.results
    report["ok"] = all(check.results.values())
    (out / "gpuhost.json").write_text(json.dumps(report, indent=2))
    print(
        f"\n{'ALL CHECKS PASSED' if report['ok'] else 'SOME CHECKS FAILED'}; report: {out / 'gpuhost.json'}"
    )
    return 0 if report["ok"] else 1


def _venv_weed() -> bool:
    try:
        venv_bin("weed")
        return True
    except FileNotFoundError:
        return False


def _run_work(
    client: Client, report: dict[str, Any], check: Check, fake: bool, gpu: str, seconds: int
) -> None:
    env = {"SECONDS": str(seconds)}
    if fake:
        env["ALLOW_CPU"] = "1"

    section("3. a CUDA Job through the API")
    created = client.jobs.create(job("cuda-matmul", gpu, {**env, "N": "8192"}))
    print(f"  created job {created.metadata.name}: resources.gpu {gpu}")
    done, took = timed(lambda: client.jobs.wait_for("cuda-matmul", settled, timeout=300 + seconds))
    st = done.status
    attempts = [wire(a) for a in client.attempts.list()]
    log = list(client.jobs.log("cuda-matmul"))
    report["job"] = {"status": wire(st), "attempts": attempts, "log": log, "secondsToSettle": round(took, 1)}
    print("\n".join(f"  | {line}" for line in log))
    check("the Job Succeeded", st.phase == "Succeeded", f"{st.phase} {st.reason or ''} {st.message or ''}")
    check("its throughput was reported", bool(st.units_per_second), f"{st.units_per_second} TFLOP/s")
    check("its cost is final", bool(st.cost and st.cost.final), st.cost.total_usd if st.cost else None)
    mine = [a for a in attempts if a.get("spec", {}).get("job") == "cuda-matmul"]
    if mine:
        spec, ast = mine[0]["spec"], mine[0].get("status", {})
        rate = int(spec["rateMicrosPerHour"]) / 1_000_000
        print(
            f"  attempt {mine[0]['metadata']['name']} on node {spec['node']}, offering {spec['offering']} "
            f"(${rate:.2f}/h), exit {ast.get('exitCode')}, {ast.get('wallMillis')} ms"
        )
    check("it ran on this host's node", bool(mine) and mine[0]["spec"]["node"] == NODE)
    backend = next((ln for ln in log if "backend" in ln), "")
    if not fake:
        check("the program ran on the GPU", "backend cuda" in backend, backend)

    section("4. a Sweep over the matrix size on this GPU")
    client.sweeps.create(sweep("matmul-sizes", gpu, env))
    sw, took = timed(lambda: client.sweeps.wait_for("matmul-sizes", settled, timeout=300 + 4 * seconds))
    results = client.sweeps.results("matmul-sizes")
    report["sweep"] = {"status": wire(sw.status), "results": wire(results), "secondsToSettle": round(took, 1)}
    for c in results.cells:
        print(
            f"  cell {c.index}: N={c.params.get('N')} {c.phase} {c.units_per_second} TFLOP/s "
            f"${c.cost_usd} in {c.wall_seconds} s"
        )
    print(
        f"  best by throughput: cell {results.best.by_throughput}; by cost: cell {results.best.by_cost}; "
        f"total ${results.total_usd}"
    )
    check(
        "the Sweep Succeeded", sw.status.phase == "Succeeded", f"{sw.status.phase} {sw.status.reason or ''}"
    )
    check("every cell reported a throughput", all(c.units_per_second for c in results.cells))
    check("it names a best cell by throughput", results.best.by_throughput is not None)

    section("5. the Node as the API shows it")
    node = client.nodes.get(NODE)
    report["node"] = wire(node)
    print(json.dumps(report["node"].get("status", {}), indent=2))
    health = next((c for c in node.status.conditions if c.type == "GPUHealthy"), None)
    if not fake:
        check("the Node's GPUs are real (not fakeGpus)", not node.status.fake_gpus)
        check(
            "GPUHealthy is True",
            health is not None and health.status == "True",
            None if health is None else f"{health.status} {health.reason or ''}",
        )
    check(
        "the Node is not draining",
        not any(c.type == "Draining" and c.status == "True" for c in node.status.conditions),
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="where gpuhost.json and the logs go")
    parser.add_argument("--root", type=Path, help="the stack's state (default: DIR/stack)")
    parser.add_argument("--fake", action="store_true", help="a fake H200 and a CPU program (no GPU needed)")
    parser.add_argument("--seconds", type=int, default=15, help="how long each run multiplies matrices")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    root = (args.root or args.out / "stack").resolve()
    # A fresh stack, but the local CA and certificate of an earlier one are kept (as `make up` keeps
    # them): they need the openssl command only to be made.
    for old in root.glob("*") if root.exists() else ():
        if old.name not in ("ca.crt", "ca.key", "gateway.crt", "gateway.key"):
            shutil.rmtree(old) if old.is_dir() else old.unlink()
    return run(root, args.out.resolve(), args.fake, args.seconds)


if __name__ == "__main__":
    sys.exit(main())
