"""A real CPU workload for the example Sweep: hash a fixed amount of data in blocks of NODUS_PARAM_BLOCK_KB.

Small blocks pay Python's per-call overhead on every block, big ones amortise it, so throughput (MB/s)
depends on the swept parameter. The program follows Nodus' env contract: it appends
``{"unitsPerSecond": …}`` lines to $NODUS_REPORT (the agent turns them into the cell's throughput) and
writes its result under $NODUS_OUTPUTS.
"""

import hashlib
import json
import os
import sys
import time

TOTAL_MB = int(os.environ.get("NODUS_PARAM_TOTAL_MB", "768"))
block_kb = int(os.environ.get("NODUS_PARAM_BLOCK_KB", "64"))
report = os.environ.get("NODUS_REPORT")
outputs = os.environ.get("NODUS_OUTPUTS", ".")

if block_kb <= 0:
    print(f"BLOCK_KB must be positive, got {block_kb}", file=sys.stderr)
    sys.exit(1)

block = os.urandom(block_kb * 1024)
blocks = TOTAL_MB * 1024 // block_kb
digest = hashlib.sha256()
start = last = time.monotonic()
done = 0
for i in range(blocks):
    digest.update(hashlib.sha256(block).digest())
    done += 1
    now = time.monotonic()
    if report and (now - last >= 0.5 or i == blocks - 1):
        mb_per_s = done * block_kb / 1024 / (now - start)
        with open(report, "a") as f:
            f.write(json.dumps({"unitsPerSecond": round(mb_per_s, 1)}) + "\n")
        last = now

elapsed = time.monotonic() - start
result = {"blockKB": block_kb, "totalMB": TOTAL_MB, "seconds": round(elapsed, 3), "digest": digest.hexdigest()}
with open(os.path.join(outputs, "result.json"), "w") as f:
    json.dump(result, f)
print(json.dumps(result))
