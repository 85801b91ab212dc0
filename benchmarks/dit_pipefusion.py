"""Benchmark (explicit command, not a test): wall time to simulate one 8-GPU PipeFusion image.

    .venv/bin/python benchmarks/dit_pipefusion.py

PixArt-alpha at 1024², 8×A100 NVLink, PipeFusion N=8, M=32 patches, 50 steps, one request.
Target: under 1 s.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulator.config.loader import load_scenario  # noqa: E402
from simulator.api import simulate  # noqa: E402


def main() -> None:
    sc = load_scenario({
        "kind": "dit", "model": "pixart-alpha", "resolution": 1024, "steps": 50,
        "parallel": {"pipefusion": 8, "patches": 32, "warmup_steps": 1},
        "workload": {"requests": 1, "arrival": "closed", "concurrency": 1},
        "hardware": {"gpu": "a100-sxm-80g"},
    })
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        res = simulate(sc)
        best = min(best, time.perf_counter() - t0)
    print(f"8-GPU PipeFusion image (M=32, 50 steps): simulated latency "
          f"{res.summary['latency_s']['p50']:.3f} s, {len(res.spans)} spans; "
          f"wall {best:.3f} s (best of 3)")


if __name__ == "__main__":
    main()
