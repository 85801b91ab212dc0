"""DiT path: schedules against closed forms, breakdowns, determinism, published patterns, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dit_fidelity import legacy_scenario, reference_rows
from simulator.config.loader import load_scenario
from simulator.errors import ConfigError
from simulator.hardware.collectives import alltoall_time
from simulator.api import simulate
from simulator.pipelines.dit import CATEGORIES, DiTModel
from simulator.report.text import format_summary


def dit(**kw):
    raw = {"kind": "dit", "model": "pixart-alpha", "resolution": 1024, "steps": 4,
           "workload": {"requests": 2, "arrival": "closed", "concurrency": 1},
           "hardware": {"gpu": "a100-sxm-80g"}}
    for k, v in kw.items():
        raw[k] = v
    return load_scenario(raw)


def latency(sc) -> float:
    return simulate(sc).summary["latency_s"]["p50"]


# ---- schedules and closed forms ----------------------------------------------------------

def test_pipefusion_bubble_matches_closed_form_on_fast_links():
    N, M, T = 4, 8, 6
    sc = dit(steps=T, cfg=False, text_encode=False, delivery={"vae": False, "format": "latent"},
             parallel={"pipefusion": N, "patches": M, "warmup_steps": 0},
             hardware={"gpu": "a100-sxm-80g", "gpu_link": {"base": "nvlink3",
                                                            "bandwidth": "100 TB/s",
                                                            "latency": "0 us"}})
    res = simulate(sc)
    row = res.breakdown.iloc[0]
    d = row["denoise"] + row["comm"] + row["bubble"]
    fill = (N - 1) / (T * M + N - 1)
    # stage 0 also embeds, the last stage projects out: the slowest stage paces the pipeline
    model = DiTModel.build(sc)
    tau = [model.task(k, 4096 // M, False).compute for k in range(N)]
    expected = 1 - (1 - fill) * np.mean(tau) / max(tau)
    assert row["bubble"] / d == pytest.approx(expected, rel=0.05)
    assert fill < row["bubble"] / d < 2 * fill


def test_ulysses_comm_volume_is_four_alltoalls_per_layer():
    u = 8
    sc = dit(cfg=False, steps=2, parallel={"ulysses": u},
             delivery={"vae": False, "format": "latent"}, text_encode=False)
    res = simulate(sc)
    S, inner, L = 4096, 1152, 28
    per_gpu = S // u * inner * 2  # one of Q, K, V or O per GPU, bf16
    expected = 2 * L * 4 * per_gpu * (u - 1) / u
    assert res.summary["comm_bytes_per_gpu"] == pytest.approx(expected, rel=1e-9)
    link = sc.hardware.gpu_link
    t = 2 * L * 4 * alltoall_time(per_gpu, u, link.effective_bandwidth, link.latency)
    assert res.breakdown["comm"].iloc[0] == pytest.approx(t, rel=1e-6)


def test_tensor_parallel_comm_volume_is_three_allreduces_per_block():
    t = 4
    sc = dit(cfg=False, steps=1, parallel={"tensor": t},
             delivery={"vae": False, "format": "latent"}, text_encode=False)
    res = simulate(sc)
    nbytes = 4096 * 1152 * 2
    assert res.summary["comm_bytes_per_gpu"] == pytest.approx(28 * 3 * 2 * (t - 1) / t * nbytes)


def test_replicated_cross_attention_leaves_two_allreduces_per_block():
    """xDiT legacy TP splits the self-attention and the MLP only: 2 all-reduces per block."""
    t = 4
    sc = dit(cfg=False, steps=1, parallel={"tensor": t, "tensor_cross_attention": "replicated"},
             delivery={"vae": False, "format": "latent"}, text_encode=False)
    res = simulate(sc)
    nbytes = 4096 * 1152 * 2
    assert res.summary["comm_bytes_per_gpu"] == pytest.approx(28 * 2 * 2 * (t - 1) / t * nbytes)


def test_replicated_cross_attention_runs_whole_on_every_rank():
    from simulator.workloads.dit import block_ops, total_flops

    arch = DiTModel.build(dit()).arch
    def cross(tp, cross_tp):
        return total_flops(op for op in block_ops(arch, 4096, 4096, 2, tp=tp, cross_tp=cross_tp)
                           if op.name.startswith("cross_") and op.name != "cross_residual")
    assert cross(4, True) == pytest.approx(cross(1, True) / 4)
    assert cross(4, False) == cross(1, True)


def test_breakdown_sums_to_latency_for_every_request():
    for par in ({"pipefusion": 4, "cfg": 2}, {"ulysses": 2, "ring": 2, "pipefusion": 2},
                {"distrifusion": 4}, {"tensor": 2}, {}):
        res = simulate(dit(parallel=par, workload={"requests": 3, "arrival": "poisson",
                                                   "rate": 5}))
        bd = res.breakdown
        assert len(bd) == 3
        total = bd[list(CATEGORIES)].sum(axis=1)
        np.testing.assert_allclose(total, bd["latency_s"], rtol=1e-9, atol=1e-12)
        share = res.summary
        assert share["last_mile_share"] == pytest.approx(
            sum(share["breakdown_share"][c] for c in ("d2h", "encode", "deliver")))


def test_same_seed_same_result():
    sc = dit(parallel={"pipefusion": 4}, workload={"requests": 3, "arrival": "poisson",
                                                   "rate": 3})
    a, b = simulate(sc), simulate(sc)
    assert a.requests.equals(b.requests)
    assert a.summary == b.summary
    other = simulate(sc.model_copy(update={"seed": sc.seed + 1}))
    assert not other.requests["arrival_s"].equals(a.requests["arrival_s"])  # the seed is used


def test_json_contract_and_text_summary():
    res = simulate(dit(parallel={"pipefusion": 2}))
    s = res.summary
    for key in ("latency_s", "breakdown_share", "last_mile_share", "memory_per_gpu_gib",
                "status", "requests_total", "requests_completed", "throughput"):
        assert key in s
    assert set(s["latency_s"]) == {"p50", "p90", "p95", "p99", "mean", "std"}
    assert set(s["breakdown_share"]) == set(CATEGORIES)
    assert s["status"] == "ok"
    spans = res.spans
    assert {"gpu0", "gpu1"} <= set(spans["track"])
    assert "last mile" in format_summary(res)


def test_base64_inflates_delivery_by_four_thirds():
    a = simulate(dit(delivery={"format": "raw"})).requests["output_bytes"].iloc[0]
    b = simulate(dit(delivery={"format": "raw", "base64": True})).requests["output_bytes"].iloc[0]
    assert (b - 200) == pytest.approx((a - 200) * 4 / 3)


# ---- published patterns (dit_latency.csv, dit_pipefusion_patches.csv) ------------------------

def _a100(res, strategy):
    return latency(legacy_scenario("a100-sxm-80g", res, strategy, 1 if strategy == "single"
                                   else 8))


def test_1024_pipefusion_beats_tensor_and_ring():
    pf = _a100(1024, "pipefusion")
    assert pf < _a100(1024, "tensor") and pf < _a100(1024, "ring")


def test_4096_single_is_slowest():
    single = _a100(4096, "single")
    for s in ("tensor", "pipefusion", "distrifusion", "ulysses", "ring"):
        assert _a100(4096, s) < single


def test_4096_ulysses_is_fastest():
    uly = _a100(4096, "ulysses")
    for s in ("tensor", "pipefusion", "distrifusion", "ring"):
        assert uly < _a100(4096, s)


def test_distrifusion_oom_at_8192():
    res = simulate(legacy_scenario("a100-sxm-80g", 8192, "distrifusion", 8))
    assert res.summary["status"] == "oom"
    assert res.summary["memory_needed_gib"] > 80e9 / 2 ** 30
    assert simulate(legacy_scenario("a100-sxm-80g", 8192, "pipefusion", 8)).summary["status"] == "ok"


def test_fewer_patches_than_stages_is_slower_and_32_patches_slower_than_8_on_l20():
    def pf(n, m):
        return latency(legacy_scenario("l20", 1024, "pipefusion", n, patches=m))
    assert pf(8, 4) > pf(8, 8)
    assert pf(4, 2) > pf(4, 4)
    assert pf(8, 32) > pf(8, 8)


# ---- fidelity -------------------------------------------------------------------------------

# Today's accuracy over the 23 numeric rows of dit_latency.csv: median |error| 21.1%, max 51.9%
# (2048 ring). The 25% row target is missed: every A100 row is under-predicted, beyond 25%
# are 1024 tensor/pipefusion/distrifusion/ulysses and 2048 tensor/ring; no sourced mechanism is
# found for them (the dit_pixart_strategies notes and docs/calibration.md give the published runs'
# own arithmetic and a held-out calibration). These bounds fail on any regression beyond rounding.
FIDELITY_MEDIAN, FIDELITY_MAX, FIDELITY_ROWS = 0.22, 0.52, 23  # issue 11 (kernel floor + gap): 0.205 -> 0.211


def _fidelity():
    rows = []
    for r in reference_rows("dit_latency.csv"):
        flag = int(r["warmup_steps"]) if r["warmup_steps"] else None
        res = simulate(legacy_scenario(r["gpu"], int(r["resolution"]), r["strategy"],
                                       int(r["degree"]), warmup_flag=flag))
        rows.append((r, res.summary))
    return rows


def test_fidelity_oom_rows_are_oom():
    rows = _fidelity()
    assert len(rows) == FIDELITY_ROWS + 1 and sum(r["latency_s"] == "OOM" for r, _ in rows) == 1
    for r, s in rows:
        assert (s["status"] == "oom") == (r["latency_s"] == "OOM"), (r["resolution"], r["strategy"])


def test_fidelity_holds_todays_bounds():
    errs = [s["latency_s"]["p50"] / float(r["latency_s"]) - 1 for r, s in _fidelity()
            if r["latency_s"] != "OOM"]
    assert len(errs) == FIDELITY_ROWS
    assert all(math.isfinite(e) for e in errs)
    assert float(np.median(np.abs(errs))) <= FIDELITY_MEDIAN
    assert max(abs(e) for e in errs) <= FIDELITY_MAX


# ---- bad input ------------------------------------------------------------------------------

@pytest.mark.parametrize("raw, path", [
    ({"gpus": 8, "parallel": {"pipefusion": 4}}, "gpus"),
    ({"parallel": {"ulysses": 3}}, "parallel.ulysses"),
    ({"parallel": {"pipefusion": 2, "patches": 128}}, "parallel.patches"),
    ({"parallel": {"pipefusion": 2, "patches": 3}}, "parallel.patches"),
    ({"resolution": "1000x1024"}, "resolution"),
    ({"parallel": {"cfg": 2}, "cfg": False}, "parallel.cfg"),
    ({"parallel": {"pipefusoin": 2}}, "parallel.pipefusoin"),
    ({"model": "pixart-alfa"}, "model"),
])
def test_bad_input_is_a_config_error_with_a_key_path(raw, path):
    base = {"kind": "dit", "model": "pixart-alpha", "hardware": {"gpu": "a100-sxm-80g"}}
    base.update(raw)
    with pytest.raises(ConfigError) as exc:
        load_scenario(base)
    assert exc.value.path == path
    assert "\n" not in str(exc.value)


def test_every_dit_scenario_file_loads_and_runs():
    from pathlib import Path
    files = sorted((Path(__file__).resolve().parents[1] / "scenarios" / "dit").glob("*.yaml"))
    assert len(files) >= 10
    for f in files:
        assert f.read_text().startswith("#"), f"{f.name} needs a comment saying what it shows"
        assert simulate(load_scenario(f)).summary["status"] == "ok", f.name
