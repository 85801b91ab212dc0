"""The validation suite's accuracy, asserted per family: a change that worsens fidelity fails here.

Targets (issue 4): median |error| <= 10% per family and no row beyond 25%. Families that do not
meet them assert the tolerance they do meet; the reason is in the family's ``notes`` (and so in
the README's generated fidelity table).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from simulator.errors import ConfigError
from simulator.validate import (MARK_END, MARK_START, discover, fidelity_markdown, load_family, rewrite_readme,
                                run_validation, summarize)

REF = Path(__file__).resolve().parents[1].parent / "shared" / "reference"

# (family, metric) -> (median |error| %, max |error| %) asserted. Batch-1 decode and first token
# must have every row within 15% (the LLM issue's acceptance); the other families assert what
# they meet today, and their notes (README fidelity table) say why a target is missed.
TOLERANCE = {
    ("llm_decode_batch1", "tpot_ms"): (10, 15),
    ("llm_first_token", "ttft_ms"): (10, 15),
    ("llm_max_throughput", "output_tokens_per_s"): (10, 29),   # L40S FP8 compute-bound rows: see notes
    # no Triton/gRPC front-end or TensorRT-LLM v0.14 executor host time per step: see notes
    ("llm_online_serving", "ttft_ms"): (35, 46),
    ("llm_online_serving", "itl_ms"): (23, 42),
    ("llm_online_serving", "output_tokens_per_s"): (10, 21),
    ("image_encode", "encode_s"): (10, 25),
    # DiT families miss the 25% row target (see the README's fidelity notes); these bounds
    # keep today's accuracy from getting worse.
    ("dit_pixart_strategies", "latency_s"): (25, 55),
    ("dit_pipefusion_patches", "latency_s"): (15, 31),
    ("dit_scaling_a100", "latency_s"): (30, 75),  # out of sample (not in ../shared/reference)
    # xDiT's 8xL20 plot (issue 14, out of sample): the 4096 DistriFusion OOM is not reproduced (the
    # simulator fits it in 48 GB), so its max is infinite; the median is asserted
    ("dit_xdit_l20_strategies", "latency_s"): (16, math.inf),
    # A live vLLM under load (issue 11): what it meets after the step work; the 20 req/s
    # stages still saturate in the simulator (TTFT of seconds), see the family's notes.
    ("vllm_serving_h100", "ttft_ms"): (34, 30_000),
    ("vllm_serving_h100", "tpot_ms"): (14, 71),
    ("vllm_serving_h100", "e2e_ms"): (15, 710),
    # Out of sample (not in ../shared/reference): vLLM V0's latency benchmark on Mixtral; its tp 8 rows
    # carry V0's per-step host time (issue 13), see the family's notes.
    ("vllm_latency_mixtral", "batch_latency_s"): (40, 62),
    # NCCL collectives (issue 14): the median meets 10%; the worst rows are a PCIe box whose GPUs stage
    # through host memory (NCCL's SHM transport, not modelled) and A100 mid-size protocol limits.
    ("nccl_collectives", "busbw_gbps"): (10, 325),
    # Engine host paths (issue 13): far from the 15% / 30% target; what each row misses and the
    # mechanism it needs are in the family's notes.
    ("last_mile_engines", "gpu_share"): (55, 55),
    ("last_mile_engines", "host_share"): (8, 8),
    ("last_mile_engines", "api_server_share"): (57, 57),
    ("last_mile_engines", "throughput_ratio"): (30, 51),
    ("last_mile_engines", "step_gap_ms"): (35, 100),
    ("last_mile_engines", "tpot_ms"): (46, 53),
    # Speculative decoding (issue 16): the low-load speed-ups are near; the high-load slowdowns of
    # vLLM 0.6 (its spec-decode host path) are not reproduced, see the family's notes.
    ("speculative_decoding", "e2e_ratio"): (21, 75),
    ("speculative_decoding", "throughput_ratio"): (16, 27),
}


@pytest.fixture(scope="module")
def table():
    return run_validation()


@pytest.fixture(scope="module")
def summary(table):
    return summarize(table)


# Reference CSVs whose validation family an open issue builds; each names that issue.
PENDING: dict[str, str] = {}


@pytest.mark.skipif(not REF.is_dir(), reason="../shared/reference not present (a clone outside the workplace)")
def test_every_reference_csv_has_a_family():
    fams = discover()
    csvs = {p.name for p in REF.glob("*.csv")}
    covered = {"llm_decode_batch1.csv", "llm_first_token.csv", "llm_max_throughput.csv", "llm_online_serving.csv",
               "dit_latency.csv", "dit_pipefusion_patches.csv", "image_encode.csv", "vllm_serving_h100.csv"}
    assert {f.name for f in fams} >= {"llm_decode_batch1", "llm_first_token", "llm_max_throughput",
                                      "llm_online_serving", "dit_pixart_strategies", "dit_pipefusion_patches",
                                      "image_encode", "vllm_serving_h100"}
    # cpu_detokenize.csv and last_mile_evidence.csv are the CPU catalog's sources, not latency targets.
    assert csvs - covered - set(PENDING) <= {"cpu_detokenize.csv", "last_mile_evidence.csv"}


@pytest.mark.skipif(not REF.is_dir(), reason="../shared/reference not present")
@pytest.mark.parametrize("family,csv_name,column", [
    ("llm_decode_batch1", "llm_decode_batch1.csv", "ms_per_token"),
    ("llm_first_token", "llm_first_token.csv", "ttft_ms"),
    ("llm_max_throughput", "llm_max_throughput.csv", "output_tokens_per_s"),
    ("dit_pipefusion_patches", "dit_pipefusion_patches.csv", "latency_s"),
    ("image_encode", "image_encode.csv", "seconds"),
])
def test_embedded_figures_match_the_reference_csv(family, csv_name, column):
    fam = next(f for f in discover() if f.name == family)
    with open(REF / csv_name) as f:
        published = [float(r[column]) for r in csv.DictReader(f)]
    assert [float(c.measured) for c in fam.cases] == published


@pytest.mark.skipif(not REF.is_dir(), reason="../shared/reference not present")
def test_vllm_serving_cases_match_the_reference_csv():
    """One case per CSV row, in order, with its means, its stage and its load profile: stage 1 of a
    run replays that run's stage 0 first, at the same rates (durations are a quarter: see notes)."""
    fam = next(f for f in discover() if f.name == "vllm_serving_h100")
    with open(REF / "vllm_serving_h100.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(fam.cases) == len(rows)
    stage0 = {r["experiment"]: r for r in rows if r["stage"] == "0"}
    for case, r in zip(fam.cases, rows):
        assert case.name.startswith(r["id"]) and case.stage == int(r["stage"])
        assert case.measured == {"ttft_ms": float(r["ttft_mean_ms"]), "tpot_ms": float(r["tpot_mean_ms"]),
                                 "e2e_ms": float(r["e2e_mean_ms"])}
        o = case.overrides
        assert (o["model"]["base"], o["parallel.tp"], o["serving.max_batch"], o["serving.max_batched_tokens"],
                o["model"]["context_length"]) == (r["model"], int(r["tp"]), int(r["max_num_seqs"]),
                                                  int(r["max_num_batched_tokens"]), int(r["max_model_len"]))
        played = [stage0[r["experiment"]], r] if r["stage"] == "1" else [r]
        assert [s["rate"] for s in o["workload"]["stages"]] == [f"{float(p['rate_or_concurrency']):g}/s" for p in played]
        assert o["workload"]["output_tokens"] == int(float(r["output_mean"]))


def test_every_family_and_metric_has_a_tolerance(summary):
    assert set(zip(summary.family, summary.metric)) == set(TOLERANCE)


@pytest.mark.parametrize("key", sorted(TOLERANCE))
def test_family_within_tolerance(summary, key):
    row = summary[(summary.family == key[0]) & (summary.metric == key[1])].iloc[0]
    med, mx = TOLERANCE[key]
    assert row.median_abs_pct <= med, f"{key}: median |error| {row.median_abs_pct:.1f}% > {med}%"
    assert row.max_abs_pct <= mx, f"{key}: max |error| {row.max_abs_pct:.1f}% > {mx}%"


def test_rows_have_signed_errors(table):
    assert list(table.columns[:6]) == ["family", "case", "metric", "predicted", "measured", "error_pct"]
    r = table[table.family == "llm_decode_batch1"].iloc[0]
    assert math.isclose(r.error_pct, 100 * (r.predicted - r.measured) / r.measured)


def test_readme_block_is_rewritten_between_markers(tmp_path, table):
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nbefore\n{MARK_START}\nSTALE-BLOCK\n{MARK_END}\nafter\n")
    rewrite_readme(readme, fidelity_markdown(table))
    text = readme.read_text()
    assert "STALE-BLOCK" not in text and "before" in text and "after" in text
    assert "| llm_decode_batch1 | tpot_ms |" in text


def test_bad_family_file_names_file_and_key(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("family: x\nsource: y\nmetric: nope\ncases: []\n")
    with pytest.raises(ConfigError) as err:
        load_family(p)
    assert "bad.yaml" in str(err.value) and "metric" in str(err.value)


def test_unknown_family_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown validation family"):
        run_validation(["no_such_family"])
