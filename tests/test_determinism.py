"""Same scenario + same seed -> byte-identical run folders, across processes and string-hash seeds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# A small LLM run with random arrivals and lengths, two API servers and two replicas (dicts and
# routing keyed by name), and a hybrid DiT run (CFG x PipeFusion: slot dicts keyed by tuples).
RUNS = {
    "llm": (None, {"workload.requests": 40, "workload.arrival": "poisson", "workload.rate": 30,
                   "serving.api_servers": 2, "serving.detokenizer": "api_server",
                   "parallel.replicas": 2}),
    "dit": ("scenarios/dit/pixart-1024-a100-nvlink-pipefusion.yaml",
            {"parallel.cfg": 2, "parallel.pipefusion": 4, "workload.requests": 2}),
}
# figures=False: drawing the PNGs would take most of the test's time; the data files must match.
SCRIPT = """
import sys
import simulator
from test_determinism import RUNS
for name, (scenario, overrides) in RUNS.items():
    simulator.run(scenario, overrides).write(f"{sys.argv[1]}/{name}", figures=False)
"""


def _run_folders(out: Path, hash_seed: str) -> dict[str, bytes]:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed,
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    subprocess.run([sys.executable, "-c", SCRIPT, str(out)], cwd=ROOT, env=env, check=True,
                   timeout=120)
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_run_folders_are_identical_across_hash_seeds(tmp_path):
    a = _run_folders(tmp_path / "a", "0")
    b = _run_folders(tmp_path / "b", "12345")
    for name in RUNS:  # what must be there, and not empty
        assert {f"{name}/summary.json", f"{name}/requests.csv"} <= set(a)
        assert a[f"{name}/requests.csv"].count(b"\n") > 2
    assert sorted(a) == sorted(b)
    differ = [f for f in a if a[f] != b[f]]
    assert not differ, f"differ between PYTHONHASHSEED=0 and 12345: {differ}"
