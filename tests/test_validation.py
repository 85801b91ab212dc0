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
                                run_family, run_validation, summarize)

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
    ("dit_scaling_a100", "latency_s"): (15, 37),  # out of sample (not in ../shared/reference)
    # xDiT's 8xL20 plot (issue 14, out of sample): the 4096 DistriFusion OOM is not reproduced (the
    # simulator fits it in 48 GB): an OOM mismatch, counted apart (test_oom_rows_are_a_status_not_an_error)
    ("dit_xdit_l20_strategies", "latency_s"): (16, 142),
    # Video DiTs (issue 28, out of sample): the speed-up past 4 GPUs and the VAE decode's data movement
    # are missing (see the families' notes)
    ("dit_video", "latency_s"): (16, 38),
    ("dit_video_vae", "vae_s"): (34, 36),  # the eager census: convolutions 0.94 s of 1.26 s, copies 0.17 of 0.51 s (notes)
    # A live vLLM under load (issues 11 and 25): TPOT and E2E meet the target and no stage saturates
    # (test_the_live_vllm_20_per_s_stages_are_served); TTFT is 10-24% low, 51% at 70B's 20 req/s (notes).
    ("vllm_serving_h100", "ttft_ms"): (22, 52),
    ("vllm_serving_h100", "tpot_ms"): (3, 7),
    ("vllm_serving_h100", "e2e_ms"): (3, 7),
    # Out of sample (not in ../shared/reference): vLLM V0's latency benchmark on Mixtral; its tp 8 rows
    # carry V0's per-step host time (issue 13), see the family's notes.
    ("vllm_latency_mixtral", "batch_latency_s"): (40, 62),
    # NCCL collectives (issue 14): the median meets 10%; the worst rows are the OCI A100 small sizes (an
    # older NCCL's latency) and NVLSTree across GB200 racks: see the family's notes.
    ("nccl_collectives", "busbw_gbps"): (10, 118),
    # The real vLLM host stack with a stub GPU (issue 23, measured here), its API server as vLLM V1's asyncio
    # loop: TPOT and throughput meet 10% median; TTFT misses (a wall-clock path outside the fitted CPU at
    # low concurrency), and from c = 1,024 up an API-server cost growing with the requests in flight (notes)
    ("host_path_vllm", "ttft_ms"): (23, 43),
    ("host_path_vllm", "tpot_ms"): (7, 64),
    ("host_path_vllm", "output_tokens_per_s"): (9, 22),
    # The real SGLang host stack (issue 23, measured here), its tokenizer manager as an asyncio loop: its
    # scheduler's polling on the shared cores and the intake's awaits are not modelled (notes)
    ("host_path_sglang", "ttft_ms"): (29, 57),
    ("host_path_sglang", "tpot_ms"): (28, 38),
    ("host_path_sglang", "output_tokens_per_s"): (17, 40),
    # vLLM 0.5.3's one-process server (issue 23, measured here, its CPU split by py-spy): its cost per request-step
    # grows with the batch where the simulator's is one figure; TTFT misses the intake's wall time after a
    # closed-loop wave (notes)
    ("host_path_vllm_v0", "ttft_ms"): (54, 66),
    ("host_path_vllm_v0", "tpot_ms"): (10, 55),
    ("host_path_vllm_v0", "output_tokens_per_s"): (11, 29),
    # vLLM 0.6.0's two processes (issue 23, measured here), its API server as the loop with a chunk per output:
    # throughput within 17% median; at c = 1,024 the real engine runs ahead of its API server where the
    # simulated one waits for a core between steps (whole tasks, no time slicing: TTFT +1,007%, TPOT -73%), and
    # its cost per chunk falls with load (notes)
    ("host_path_vllm_v06", "ttft_ms"): (77, 1008),
    ("host_path_vllm_v06", "tpot_ms"): (52, 115),
    ("host_path_vllm_v06", "output_tokens_per_s"): (17, 106),
    # Engine host paths (issue 13): far from the 15% / 30% target; what each row misses and the
    # mechanism it needs are in the family's notes.
    # ML.ENERGY v3.0's energy per token (issue 27): the power model meets 10.4% median; J/token follows the
    # simulated step's speed; on the B200 from batch 64 up the leaderboard's GPU waited (on vLLM 0.11.1's host
    # path or its Blackwell kernels) where the simulated one, its API server merging outputs, runs on (notes)
    ("energy_mlenergy", "joules_per_output_token"): (19, 56),
    ("energy_mlenergy", "gpu_watts"): (11, 46),
    ("energy_mlenergy", "output_tokens_per_s"): (15, 122),
    # FLUX.1-dev's energy per image: the power within 16%, the image's latency half the measured (notes)
    ("energy_mlenergy_diffusion", "joules_per_image"): (43, 52),  # FLUX on H100 -34%, B200 -52%
    ("energy_mlenergy_diffusion", "gpu_watts"): (12, 16),
    # vLLM 0.5's and 0.6's costs measured from their own servers (host_path_vllm_v0, _v06): 0.5's split GPU 51% ->
    # 9% off, API server 58% -> 8%, scheduling and outputs 1% -> 20% (the build VM's CPU seconds, notes)
    ("last_mile_engines", "gpu_share"): (9, 9),
    ("last_mile_engines", "host_share"): (21, 21),
    ("last_mile_engines", "api_server_share"): (8, 8),
    ("last_mile_engines", "throughput_ratio"): (12, 42),  # 0.6 over 0.5: the real 0.6.0 is slower here (notes)
    ("last_mile_engines", "step_gap_ms"): (100, 141),  # RFC #6854's bubble at an assumed batch of 256 (notes)
    ("last_mile_engines", "tpot_ms"): (41, 46),
    # KV-cache mechanisms (issue 15): what each row misses and the mechanism it needs are in the
    # family's notes. The Mooncake traces' cache ratios (an unbounded-cache replay) are within 7%.
    ("prefix_caching", "ttft_ms"): (92, 98),
    ("prefix_caching", "e2e_ms"): (70, 82),
    ("prefix_caching", "ttft_ratio"): (39, 103),
    ("prefix_caching", "e2e_ratio"): (25, 101),  # 17% before vLLM 0.5's costs were measured (issue 23)
    ("prefix_caching", "prefix_hit_rate"): (5, 7),
    ("cache_routing", "prefix_hit_rate"): (74, 141),
    ("cache_routing", "throughput_ratio"): (30, 30),
    ("kv_transfer", "kv_transfer_ms"): (31, 78),
    ("kv_transfer", "ttft_ms"): (58, 83),
    ("kv_offload", "copy_gbps"): (21, 32),
    # Speculative decoding (issue 16): the low-load speed-ups are near; the high-load slowdowns of
    # vLLM 0.6 (its spec-decode host path) are not reproduced, see the family's notes.
    ("speculative_decoding", "e2e_ratio"): (21, 76),
    ("speculative_decoding", "throughput_ratio"): (16, 27),
}
# (family, metric) read from ../shared/traces: not replayed (no prediction) in a clone without them
NEEDS_TRACES = {("prefix_caching", "prefix_hit_rate")}
TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"


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


def test_the_live_vllm_20_per_s_stages_are_served():
    """Issue 26: every 20 req/s stage vLLM 0.15.1 kept up with is served in the simulator too: no queue
    builds (mean TTFT within 2x the measured, not seconds) and TPOT and E2E land within 10%."""
    fam = next(f for f in discover() if f.name == "vllm_serving_h100")
    idx = [i for i, c in enumerate(fam.cases) if c.overrides["workload"]["stages"][-1]["rate"] == "20/s"]
    assert len(idx) == 3  # Llama-2-70B TP4, Llama-2-7B, Mixtral-8x7B TP2
    rows = {(r["case"], r["metric"]): r for r in run_family(fam, cases=idx)}
    for i in idx:
        ttft, tpot, e2e = (rows[(fam.cases[i].name, m)] for m in ("ttft_ms", "tpot_ms", "e2e_ms"))
        assert ttft["predicted"] < 2 * ttft["measured"], fam.cases[i].name
        assert abs(tpot["error_pct"]) <= 10 and abs(e2e["error_pct"]) <= 10, fam.cases[i].name


KV_REF = Path(__file__).resolve().parents[1] / "scenarios" / "validation" / "reference"


def _kv_rows(name: str) -> dict[str, dict]:
    with open(KV_REF / name) as f:
        return {r["id"]: r for r in csv.DictReader(f)}


def test_kv_transfer_cases_match_the_reference_csv():
    """One case per prompt length of Mooncake's vLLM PD table, its transfer time and (where published
    in the TTFT rows) its mean TTFT, in ms; the prompt is the length plus Qwen3's 9 chat-template tokens."""
    rows = _kv_rows("disaggregation.csv")
    fam = next(f for f in discover() if f.name == "kv_transfer")
    lengths = [int(r["input_tokens"]) for i, r in rows.items() if i.startswith("dg-mc-vllm-xfer-")]
    assert [c.overrides["workload.prompt_tokens"] - 9 for c in fam.cases] == lengths
    for case, n in zip(fam.cases, lengths):
        want = {"kv_transfer_ms": float(rows[f"dg-mc-vllm-xfer-{n}"]["value"])}
        if f"dg-mc-vllm-ttft-{n}" in rows:
            want["ttft_ms"] = float(rows[f"dg-mc-vllm-ttft-{n}"]["value"])
        assert case.measured == want


def test_prefix_caching_cases_match_the_reference_csv():
    """vLLM PR #1983: each QPS has a cache-off case (the rows' baselines) and a cache-on case (their
    values), seconds in the CSV and ms in the family; the Mooncake replays carry Table 2's ratios."""
    rows = _kv_rows("prefix_caching.csv")
    fam = next(f for f in discover() if f.name == "prefix_caching")
    cases = {c.name: c for c in fam.cases}
    for q in (10, 15, 25):
        ttft, lat = rows[f"pc-pr1983-ttft-q{q}"], rows[f"pc-pr1983-lat-q{q}"]
        off, on = cases[f"llama-13b a100 {q} qps, prefix cache off"], cases[f"llama-13b a100 {q} qps, prefix cache on"]
        assert off.overrides["workload.rate"] == on.overrides["workload.rate"] == f"{q}/s"
        assert off.measured == {"ttft_ms": 1000 * float(ttft["baseline_value"]), "e2e_ms": 1000 * float(lat["baseline_value"])}
        assert on.measured["ttft_ms"] == 1000 * float(ttft["value"]) and on.measured["e2e_ms"] == 1000 * float(lat["value"])
        assert on.relative_to == off.name
    for trace in ("conversation", "synthetic"):
        case = cases[f"mooncake {trace} trace, unbounded cache"]
        assert case.measured == {"prefix_hit_rate": float(rows[f"pc-mooncake-cacheratio-{trace}"]["value"])}


@pytest.mark.slow
def test_every_family_and_metric_has_a_tolerance(summary):
    assert set(zip(summary.family, summary.metric)) == set(TOLERANCE)


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(TOLERANCE))
def test_family_within_tolerance(summary, key):
    if key in NEEDS_TRACES and not TRACES.is_dir():
        pytest.skip("../shared/traces not present (a clone outside the workplace)")
    row = summary[(summary.family == key[0]) & (summary.metric == key[1])].iloc[0]
    med, mx = TOLERANCE[key]
    assert row.median_abs_pct <= med, f"{key}: median |error| {row.median_abs_pct:.1f}% > {med}%"
    assert row.max_abs_pct <= mx, f"{key}: max |error| {row.max_abs_pct:.1f}% > {mx}%"


@pytest.mark.slow
def test_rows_have_signed_errors(table):
    assert list(table.columns[:6]) == ["family", "case", "metric", "predicted", "measured", "error_pct"]
    r = table[table.family == "llm_decode_batch1"].iloc[0]
    assert math.isclose(r.error_pct, 100 * (r.predicted - r.measured) / r.measured)


@pytest.mark.slow
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


def test_oom_rows_are_a_status_not_an_error():
    """A row the simulator and the measurement disagree on fitting carries no number (it cannot poison a
    family's max), is counted as an OOM mismatch and fails the family's target; an agreed OOM is no error."""
    import pandas as pd

    from simulator.validate import ROW_COLUMNS

    rows = [dict(family="f", case="a", metric="m", predicted=11.0, measured=10.0, error_pct=10.0, note="", status="ok"),
            dict(family="f", case="b", metric="m", predicted=5.0, measured=math.nan, error_pct=math.nan,
                 note="OOM measured, simulator fits", status="missed_oom"),
            dict(family="g", case="c", metric="m", predicted=9.5, measured=10.0, error_pct=-5.0, note="", status="ok"),
            dict(family="g", case="d", metric="m", predicted=math.nan, measured=math.nan, error_pct=math.nan,
                 note="OOM measured and predicted", status="oom")]
    s = summarize(pd.DataFrame(rows, columns=ROW_COLUMNS)).set_index("family")
    assert (s.loc["f", "max_abs_pct"], s.loc["f", "oom_mismatches"], bool(s.loc["f", "meets_target"])) == (10.0, 1, False)
    assert (s.loc["g", "max_abs_pct"], s.loc["g", "oom_mismatches"], bool(s.loc["g", "meets_target"])) == (5.0, 0, True)
    text = fidelity_markdown(pd.DataFrame(rows, columns=ROW_COLUMNS))
    assert "| b | m | 5 | OOM | OOM missed |" in text and "missed (1 OOM mismatch)" in text


@pytest.mark.slow
def test_the_l20_distrifusion_oom_is_reported_as_a_miss(table, summary):
    row = table[(table.family == "dit_xdit_l20_strategies") & (table.case == "4096 distrifusion")].iloc[0]
    assert row.status == "missed_oom" and math.isnan(row.error_pct) and row.predicted > 0
    assert summary[summary.family == "dit_xdit_l20_strategies"].iloc[0].oom_mismatches == 1


def test_host_copy_cases_run_at_the_host_links_effective_bandwidth(tmp_path):
    """One 2 GB copy alone on an H100's PCIe 5 port: 63 GB/s x 0.87 (links.yaml pcie5-x16), plus its
    10 us latency; both directions at once each get a full port."""
    p = tmp_path / "copy.yaml"
    p.write_text("family: c\nsource: s\nmetric: copy_gbps\nkind: host_copy\nbase: {gpu: h100-sxm}\ncases:\n"
                 "- {case: one, set: {direction: d2h, size: 2.0e9}, measured: 50}\n"
                 "- {case: two, set: {direction: both, size: 2.0e9}, measured: 80}\n")
    table = run_validation(directory=tmp_path)
    one, two = table.predicted.tolist()
    assert one == pytest.approx(2.0 / (10e-6 + 2.0e9 / (63e9 * 0.87)), rel=1e-9)
    assert two == pytest.approx(2 * one, rel=1e-9)


def test_a_case_of_an_unknown_kind_names_its_key(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("family: x\nsource: y\nmetric: ttft_ms\ncases:\n- {case: a, kind: nope, measured: 1}\n")
    with pytest.raises(ConfigError) as err:
        load_family(p)
    assert "cases[0].kind" in str(err.value)


@pytest.mark.slow
def test_host_path_knee_within_one_step_of_the_sweep(table):
    """Where one API server saturates (throughput within 10% of the sweep's maximum from there on),
    simulated and measured on the real vLLM stack, is the same concurrency or the next."""
    rows = table[(table.family == "host_path_vllm") & (table.metric == "output_tokens_per_s")]
    rows = rows[rows.case.str.endswith("si=1 api=1")]
    conc = [int(c.split()[0][2:]) for c in rows.case]

    def knee(values):
        return next(i for i, v in enumerate(values) if v >= 0.9 * max(values))

    assert len(conc) >= 5
    assert abs(knee(list(rows.predicted)) - knee(list(rows.measured))) <= 1
