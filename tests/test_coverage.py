"""A run is told when a validation family that ran its set-up misses its target: the committed status
agrees with the README's fidelity table and with the families' cases, and the caveat names what misses."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import simulator
from simulator.coverage import caveat, committed, signature
from simulator.validate import CASE_KINDS, _check_cases, _simulate_case, discover

ROOT = Path(__file__).resolve().parents[1]


def test_the_committed_status_is_the_readme_tables_misses():
    table = (ROOT / "README.md").read_text().split("<!-- fidelity:start -->")[1].split("<!-- fidelity:end -->")[0]
    missed = {(f, m): float(med) for f, m, med in
              re.findall(r"^\| (\w+) \| (\w+) \| \d+ \| ([\d.]+)% \| [\d.n/a%]+ \| missed[^|]*\|$", table, re.M)}
    status = {(name, m["metric"]): m["median_abs_pct"] for name, fam in committed()["families"].items()
              for m in fam["misses"]}
    assert missed and status == missed, "rerun `lastmile validate --write-readme README.md --write-fidelity " \
                                        "simulator/data/fidelity.json`"


def test_the_committed_status_covers_the_set_ups_the_families_cases_run():
    families = discover()
    setups = _check_cases(families)
    for fam in families:
        for miss in committed()["families"][fam.name]["misses"]:
            want = []
            for case in fam.cases:
                if CASE_KINDS[case.kind or fam.kind] is not _simulate_case:
                    continue
                measures = case.measured if isinstance(case.measured, dict) else {fam.metric: None}
                sig = setups[fam.name, case.name]
                if miss["metric"] in measures and sig not in want:
                    want.append(sig)
            assert sorted(want) == miss["covers"], (fam.name, miss["metric"])


STATUS = {"families": {
    "fam_a": {"misses": [{"metric": "tpot_ms", "median_abs_pct": 12.34,
                          "covers": [["llm", "llama-3-8b", "h100-sxm", "vllm-v1"]]}]},
    "fam_b": {"misses": [{"metric": "ttft_ms", "median_abs_pct": 40.0, "covers": [["llm", "llama-3-8b", "h100-sxm",
                                                                                     "sglang"]]}]}}}


def test_the_caveat_names_the_covering_families_misses_and_nothing_else():
    sc = simulator.load_scenario(None)  # the default: Llama-3-8B, one H100, vllm-v1
    assert signature(sc) == ["llm", "llama-3-8b", "h100-sxm", "vllm-v1"]
    line = caveat(sc, STATUS)
    assert "fam_a tpot_ms (12.3% median |error|)" in line and "fam_b" not in line and "\n" not in line
    other = simulator.load_scenario(None, {"hardware.gpu": "a100-sxm-80g"})
    assert caveat(other, STATUS) is None


def test_lastmile_run_prints_the_caveat():
    r = subprocess.run([sys.executable, "-m", "simulator", "run", "--no-write", "--no-last-mile-cost",
                        "--set", "serving.engine=vllm-0.5", "--set", "workload.requests=20"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0
    lines = [x for x in r.stderr.splitlines() if x.startswith("lastmile: caveat:")]
    assert len(lines) == 1 and "last_mile_engines host_share" in lines[0]
