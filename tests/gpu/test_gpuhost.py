"""tests/gpu/gpuhost.py, the GPU-host run of issue #6, as a test.

Everywhere it runs with ``--fake`` (a fake H200 and the program's CPU fallback), so the script that is run
by hand on GPU hosts cannot rot: the stack starts, the Job and the Sweep go through the API to the agent
and back, and the report says so. Where NVML sees a GPU and torch has CUDA, it also runs for real and
checks what the fake run cannot: the agent registered the real GPU, the program ran on it under the
process runtime, and GPUHealthy is True. docs/gpu-host.md records such a run on an H200.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nodus_agent.inventory import read_nvml

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("gpuhost.py")


def run_script(out: Path, *flags: str) -> tuple[subprocess.CompletedProcess[str], dict[str, object]]:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--seconds", "2", *flags],
        capture_output=True,
        text=True,
        timeout=600,
    )
    report_file = out / "gpuhost.json"
    assert report_file.exists(), f"no report; output:\n{done.stdout}\n{done.stderr}"
    return done, json.loads(report_file.read_text())


def test_the_gpu_host_run_with_a_fake_gpu(tmp_path: Path) -> None:
    done, report = run_script(tmp_path, "--fake")
    assert done.returncode == 0, done.stdout + done.stderr
    checks = report["checks"]
    assert isinstance(checks, dict) and checks and all(checks.values()), checks
    assert "the Job Succeeded" in checks and "the Sweep Succeeded" in checks
    job = report["job"]
    assert isinstance(job, dict)
    assert any("backend cpu" in line for line in job["log"]), job["log"]  # the fallback, said plainly
    results = report["sweep"]["results"]  # type: ignore[index]
    assert [c["params"]["N"] for c in results["cells"]] == ["4096", "8192", "16384"]
    assert (tmp_path / "logs" / "gpu-host-1.log").exists()


def _cuda() -> bool:
    try:
        import torch  # type: ignore[import-not-found]
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.skipif(read_nvml() is None or not _cuda(), reason="needs a GPU host: NVML and torch with CUDA")
def test_the_gpu_host_run_on_the_real_gpu(tmp_path: Path) -> None:
    done, report = run_script(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert report["nvml"] and report["node"]["status"]["fakeGpus"] is False  # type: ignore[index]
    assert any("backend cuda" in line for line in report["job"]["log"])  # type: ignore[index]
