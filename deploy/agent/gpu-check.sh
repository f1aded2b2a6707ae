#!/usr/bin/env bash
# On a GPU host: what the Nodus agent will see and register, and whether a CUDA program runs under the
# agent's process runtime. Read-only apart from a scratch directory; safe while the agent runs.
#
#   /opt/nodus/share/gpu-check.sh [--config /etc/nodus/agent.toml] [--python /opt/nodus/venv/bin/python]
#
# Best effort: each step says what it found, a missing tool skips its step, and the exit status is
# non-zero only when NVML (and so the agent) sees no GPU.
set -uo pipefail

CONFIG=/etc/nodus/agent.toml
PY=/opt/nodus/venv/bin/python
while [ $# -gt 0 ]; do
  case "$1" in
    --config) CONFIG="$2"; shift 2 ;;
    --python) PY="$2"; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "gpu-check.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -x "$PY" ] || PY="$(command -v python3)"
config_args=()
[ -f "$CONFIG" ] && config_args=(--config "$CONFIG")

section() { printf '\n== %s\n' "$*"; }

section "driver (nvidia-smi)"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=index,name,memory.total,driver_version,ecc.errors.uncorrected.volatile.total,retired_pages.pending,remapped_rows.pending \
    --format=csv 2>&1 || nvidia-smi -L
  nvidia-smi nvlink --status 2>/dev/null | head -20 || true
else
  echo "nvidia-smi not found (no driver, or not on PATH)"
fi

section "NVML discovery, as the agent sees it (python -m nodus_agent.inventory)"
discovery="$("$PY" -m nodus_agent.inventory "${config_args[@]+"${config_args[@]}"}")"
status=$?
echo "$discovery"
if [ $status -ne 0 ]; then
  echo "the agent's discovery failed (status $status): is the agent installed for $PY?"
  exit 1
fi
if echo "$discovery" | grep -q '"fakeGpus": true'; then
  echo "NVML sees no GPU: the agent would register a FAKE inventory here"
  exit 1
fi

section "the effective settings (nodus-agent --check)"
"$PY" -m nodus_agent "${config_args[@]+"${config_args[@]}"}" --check || echo "the settings do not validate (see above)"

section "a CUDA program under the process runtime"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
program=()
if "$PY" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
  cat >"$scratch/matmul.py" <<'EOF'
import json, os, time
import torch

n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(10):  # warm-up: cuBLAS picks its kernel and the clocks come up (else ~1/3 of the rate)
    a @ b
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(200):
    a @ b
torch.cuda.synchronize()
tflops = 200 * 2 * n**3 / (time.perf_counter() - t) / 1e12
print(f"{torch.cuda.get_device_name(0)}: bf16 matmul {tflops:.0f} TFLOPS on {torch.cuda.device_count()} GPU(s)")
with open(os.environ["NODUS_REPORT"], "a") as f:
    f.write(json.dumps({"unitsPerSecond": f"{tflops:.1f}"}) + "\n")
EOF
  program=("$PY" "$scratch/matmul.py")
elif command -v nvcc >/dev/null; then
  cat >"$scratch/add.cu" <<'EOF'
#include <cstdio>
#include <cstdlib>
__global__ void add(int n, float *x, float *y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + y[i];
}
int main() {
  int n = 1 << 24; float *x, *y;
  cudaMallocManaged(&x, n * sizeof(float)); cudaMallocManaged(&y, n * sizeof(float));
  for (int i = 0; i < n; i++) { x[i] = 1.0f; y[i] = 2.0f; }
  add<<<(n + 255) / 256, 256>>>(n, x, y);
  cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) { printf("CUDA error: %s\n", cudaGetErrorString(err)); return 1; }
  for (int i = 0; i < n; i++) if (y[i] != 3.0f) { printf("wrong result at %d\n", i); return 1; }
  printf("vector add of %d floats on the GPU: correct\n", n);
  FILE *f = fopen(getenv("NODUS_REPORT"), "a"); fprintf(f, "{\"unitsPerSecond\": 1}\n"); fclose(f);
  return 0;
}
EOF
  if nvcc -o "$scratch/add" "$scratch/add.cu"; then program=("$scratch/add"); fi
fi
if [ ${#program[@]} -eq 0 ]; then
  echo "skipped: neither torch with CUDA (for $PY) nor nvcc is here"
  exit 0
fi
# The agent's own Runner (spawn, env contract, report file, finish record) with a reporter that
# prints instead of publishing: the program runs exactly as an Attempt would, minus the bus.
SCRATCH="$scratch" "$PY" - "${program[@]}" <<'EOF'
import asyncio, os, sys
from pathlib import Path

from nodus_agent.running import Runner
from nodus_agent.settings import AgentSettings
from nodus_schema.messages import StartAttempt


class PrintingReporter:
    finished_report = None

    async def started(self, namespace, attempt, time):
        print(f"started at {time}")

    async def progress(self, namespace, attempt, n, units_per_second):
        return True

    async def finished(self, msg, **_):
        self.finished_report = msg


async def main() -> int:
    scratch = Path(os.environ["SCRATCH"])
    env = {k: v for k, v in os.environ.items() if k.startswith("NODUS_")}
    env.update(NODUS_AGENT_WORKDIR=str(scratch / "work"), NODUS_AGENT_CWD=str(scratch))
    settings = AgentSettings.from_env(env)
    reporter = PrintingReporter()
    runner = Runner(settings, reporter)
    msg = StartAttempt(namespace="gpu-check", job="gpu-check", attempt="gpu-check-1", index=0,
                       attempt_no=1, node=settings.node, command=sys.argv[1:], timeout_seconds=300)
    await runner.start(msg)
    while runner.runs:
        await asyncio.sleep(0.2)  # a diagnostic, not a test: poll the runner until the program is done
    report = reporter.finished_report
    log = scratch / "work" / "gpu-check" / "gpu-check-1" / "log.txt"
    print(log.read_text() if log.exists() else "(no log)")
    if report is None:
        print("no finish report: the runner failed (see above)")
        return 1
    print(f"finished: {report.reason}, exit code {report.exit_code}, {report.wall_millis} ms, "
          f"unitsPerSecond {report.units_per_second}")
    return 0 if report.reason == "Completed" else 1


sys.exit(asyncio.run(main()))
EOF
echo "(the CUDA step is best effort: a failure here points at the driver, toolkit or torch build)"
