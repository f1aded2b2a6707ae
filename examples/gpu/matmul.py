"""A small CUDA program for a GPU host: N×N bf16 matrix products for SECONDS, throughput in TFLOP/s.

It follows Nodus' env contract like any Job: it appends ``{"unitsPerSecond": "…"}`` lines to
$NODUS_REPORT about twice a second (the agent publishes the last and the mean; a Sweep's best cell by
throughput is the highest), and writes its result under $NODUS_OUTPUTS. Parameters: N (matrix size,
default 8192), SECONDS (default 15) and DTYPE (bfloat16, float16 or float32), each a Sweep parameter
(NODUS_PARAM_N) or a Job's env variable (N).

Without torch and a CUDA device it exits 3, unless ALLOW_CPU=1: then it multiplies small
float matrices in pure Python (so the harness that drives it, tests/gpu/gpuhost.py, runs in CI too) and
says so in its first line. The rate is then GFLOP/s-small, not a GPU's.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections.abc import Callable


def param(name: str, default: str) -> str:
    """A Sweep's parameter (NODUS_PARAM_<name>), else the Job's own variable <name>."""
    return os.environ.get(f"NODUS_PARAM_{name}", os.environ.get(name, default))


N = int(param("N", "8192"))
SECONDS = float(param("SECONDS", "15"))
DTYPE = param("DTYPE", "bfloat16")
ALLOW_CPU = param("ALLOW_CPU", "0") == "1"
REPORT = os.environ.get("NODUS_REPORT")
OUTPUTS = os.environ.get("NODUS_OUTPUTS", ".")
WINDOW_S = 0.5


def report(tflops: float) -> None:
    if REPORT:
        with open(REPORT, "a") as f:
            f.write(json.dumps({"unitsPerSecond": f"{tflops:.6f}"}) + "\n")


def cuda_step() -> tuple[Callable[[], None], Callable[[], None], str] | None:
    """One matrix product on the GPU, a synchronise, and the device's name; None without CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    dtype = getattr(torch, DTYPE)
    a = torch.randn(N, N, device="cuda", dtype=dtype)
    b = torch.randn(N, N, device="cuda", dtype=dtype)
    c = torch.empty(N, N, device="cuda", dtype=dtype)

    def step() -> None:
        torch.matmul(a, b, out=c)

    name = f"{torch.cuda.get_device_name(0)} (torch {torch.__version__}, CUDA {torch.version.cuda})"
    return step, torch.cuda.synchronize, name


def cpu_step(n: int) -> tuple[Callable[[], None], Callable[[], None], str]:
    a = [[random.random() for _ in range(n)] for _ in range(n)]
    bt = [[random.random() for _ in range(n)] for _ in range(n)]

    def step() -> None:
        [[sum(x * y for x, y in zip(row, col, strict=True)) for col in bt] for row in a]

    return step, lambda: None, "CPU (pure Python)"


def main() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "(unset)")
    found = cuda_step()
    if found is None and not ALLOW_CPU:
        print(f"no CUDA device (CUDA_VISIBLE_DEVICES={visible}): this program needs torch with CUDA")
        return 3
    n = N if found is not None else min(N, 48)
    step, sync, device = found if found is not None else cpu_step(n)
    print(f"backend {'cuda' if found else 'cpu'}: {device}; CUDA_VISIBLE_DEVICES={visible}; N={n} {DTYPE}")
    flops = 2 * n**3
    step()  # warm-up: kernel selection, allocations
    sync()
    start = window = time.perf_counter()
    products = in_window = 0
    rates: list[float] = []
    while True:
        step()
        products += 1
        in_window += 1
        now = time.perf_counter()
        if now - window >= WINDOW_S:
            sync()  # time what the GPU did, not what was queued
            now = time.perf_counter()
            rates.append(in_window * flops / (now - window) / 1e12)
            report(rates[-1])
            window, in_window = now, 0
            if now - start >= SECONDS:
                break
    sync()
    elapsed = time.perf_counter() - start
    mean = products * flops / elapsed / 1e12
    print(
        f"{products} products of {n}x{n} in {elapsed:.1f} s: "
        f"{mean:.4g} TFLOP/s mean, {max(rates):.4g} best window"
    )
    result = {
        "device": device,
        "n": n,
        "dtype": DTYPE,
        "products": products,
        "seconds": round(elapsed, 3),
        "tflops": round(mean, 3),
    }
    os.makedirs(OUTPUTS, exist_ok=True)
    with open(os.path.join(OUTPUTS, "result.json"), "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
