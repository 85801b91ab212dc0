"""Benchmark: simulate the first 10,000 requests of splitwise_conv.csv and report wall time and peak memory.

Run with ``make bench`` (or ``python benchmarks/llm_trace.py``). Prints one JSON line and appends it
to ``benchmarks/results.jsonl``.
"""

from __future__ import annotations

import json
import platform
import resource
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import simulator  # noqa: E402

SCENARIO = ROOT / "scenarios" / "llm" / "benchmark_splitwise_a100.yaml"


def main() -> int:
    t0 = time.perf_counter()
    result = simulator.run(SCENARIO)
    wall = time.perf_counter() - t0
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    s = result.summary
    record = {
        "benchmark": "llm_trace_10k",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {platform.processor() or platform.platform()}",
        "wall_s": round(wall, 3),
        "peak_rss_mib": round(peak_mib, 1),
        "requests_completed": s["requests_completed"],
        "steps": s["steps"],
        "simulated_s": round(s["duration_s"], 1),
        "ttft_p50_ms": round(s["ttft_ms"]["p50"], 2),
        "tpot_mean_ms": round(s["tpot_ms"]["mean"], 2),
        "last_mile_share": round(s["last_mile_share"], 4),
    }
    line = json.dumps(record)
    print(line)
    with open(ROOT / "benchmarks" / "results.jsonl", "a") as fh:
        fh.write(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
