"""``lastmile plan`` (issue 27): the search's parts against closed forms, and the command end to end."""

import math
import subprocess
import sys
from dataclasses import asdict
from types import SimpleNamespace

import pytest
import yaml

import simulator
from simulator.errors import ConfigError
from simulator.plan import SLO, Candidate, Outcome, bisect_rate, candidates, evaluate, pareto, rate_bound


def test_bisection_finds_the_threshold_within_its_tolerance():
    calls = []

    def meets(rate):
        calls.append(rate)
        return rate <= 7.3

    rate, probes = bisect_rate(meets, 40.0, rel_tol=0.01, max_probes=20)
    assert calls[0] == 40.0  # the bound first
    assert 7.3 * 0.99 <= rate <= 7.3
    assert probes == [(r, r <= 7.3) for r in calls]
    assert all(r > rate for r, ok in probes if not ok) and all(r <= rate for r, ok in probes if ok)


def test_bisection_stops_at_the_bound_or_finds_nothing():
    assert bisect_rate(lambda r: True, 12.5) == (12.5, [(12.5, True)])
    rate, probes = bisect_rate(lambda r: False, 10.0, max_probes=6)
    assert rate == 0.0 and len(probes) == 6 and probes[-1][0] == pytest.approx(10.0 / 32)
    with pytest.raises(ValueError):
        bisect_rate(lambda r: True, 0.0)


def test_the_rate_bound_is_the_roofline_closed_form():
    """decode: the largest batch's step time per token times the decode steps a request needs;
    prefill: the prompt's linear-layer time; replicas multiply."""
    cost = SimpleNamespace(decode_time=lambda ctx, n: 0.004 + 1e-9 * ctx, linear_time=lambda t: 2e-5 * t)
    got = rate_bound(cost, 3, 64, 500.0, 201.0, 600.0)
    per_token = (0.004 + 1e-9 * 600.0 * 64) / 64
    assert got == pytest.approx(3 / (per_token * 200 + 2e-5 * 500))


def test_a_disaggregated_split_is_bounded_by_its_slower_pool():
    cost = SimpleNamespace(decode_time=lambda ctx, n: 0.004 + 1e-9 * ctx, linear_time=lambda t: 2e-5 * t)
    decode = (0.004 + 1e-9 * 600.0 * 64) / 64 * 200
    assert rate_bound(cost, 1, 64, 500.0, 201.0, 600.0, split=(1, 3)) == pytest.approx(min(1 / 0.01, 3 / decode))
    space = candidates([("h100-sxm", None)], [2], [2], ["vllm-v1"], gpu_count=4, splits=[(1, 1), (1, 2)])
    assert [(c.replicas, c.prefill, c.decode) for c in space] == [(2, None, None), (1, 1, 1)]
    over = space[1].overrides()
    assert over["disaggregation"] == {"prefill": {"replicas": 1, "tp": 2}, "decode": {"replicas": 1, "tp": 2}}
    assert space[1].label == "4x h100-sxm tp2 1P:1D vllm-v1"


def test_the_search_space_holds_the_gpu_count_and_names_an_empty_one():
    space = candidates([("h100-sxm", None), ("b200", None)], [1, 2, 4, 8], [1, 2, 4, 8], ["vllm-v1"], gpu_count=8)
    assert {(c.gpu, c.tp, c.replicas) for c in space} == {(g, tp, 8 // tp) for g in ("h100-sxm", "b200")
                                                          for tp in (1, 2, 4, 8)}
    assert all(c.gpus == 8 for c in space)
    assert max(c.gpus for c in candidates([("h100-sxm", None)], [1, 2], [1, 2, 4], ["a", "b"], max_gpus=4)) == 4
    both = candidates([("b200", None)], [1], [1, 2], ["vllm-v1"], api_servers=[1, 2], max_batch=[256])
    assert [(c.replicas, c.api_servers) for c in both] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert both[1].overrides()["serving.api_servers"] == 2 and both[1].overrides()["serving.max_batch"] == 256
    with pytest.raises(ConfigError, match="search space is empty"):
        candidates([("h100-sxm", None)], [2], [3], ["vllm-v1"], gpu_count=8)


def test_the_pareto_front_keeps_what_nothing_beats_on_both():
    rows = [{"usd_per_mtok": 1.0, "ttft_p99_ms": 300}, {"usd_per_mtok": 2.0, "ttft_p99_ms": 100},
            {"usd_per_mtok": 1.5, "ttft_p99_ms": 400}, {"usd_per_mtok": 0.5, "ttft_p99_ms": 900},
            {"usd_per_mtok": None, "ttft_p99_ms": 50}]
    assert pareto(rows) == [3, 0, 1]


def test_an_slo_names_what_a_probe_misses():
    ok = {"status": "ok", "requests_total": 10, "requests_completed": 10, "ttft_ms": {"p99": 400.0},
          "tpot_ms": {"p99": 40.0}, "e2e_ms": {"p99": 9000.0}, "goodput": {"slo_attainment": 0.995}}
    assert SLO(ttft_p99=0.5, tpot_p99=0.05, goodput=0.99).misses(ok) is None
    assert "ttft_p99" in SLO(ttft_p99=0.3).misses(ok)
    assert "goodput" in SLO(goodput=0.999).misses(ok)
    assert SLO(ttft_p99=1.0).misses({**ok, "warnings": ["offered load exceeds capacity: ..."]}) \
        == "offered load exceeds capacity"
    assert SLO(ttft_p99=1.0).misses({**ok, "requests_completed": 9}) == "not every request completed"


def _job(candidate, **slo):
    return {"base": None, "overrides": {"workload.prompt_tokens": 256, "workload.output_tokens": 64},
            "candidate": asdict(candidate), "slo": asdict(SLO(**slo)), "requests": 120}


def test_a_layout_that_does_not_fit_is_pruned_before_anything_runs():
    out = Outcome.from_json(evaluate({**_job(Candidate("l40s", 1, 1, "vllm-v1")),
                                      "overrides": {"model": "llama-3.1-70b"}}))
    assert out.status.startswith("pruned: does not fit") and out.probes == [] and out.summary is None


def test_a_candidate_s_highest_rate_meets_the_slo_and_a_faster_one_misses():
    job = _job(Candidate("h100-sxm", 1, 1, "reference"), ttft_p99=0.2, tpot_p99=0.03)
    out = Outcome.from_json(evaluate(job))
    assert out.status == "ok" and 0 < out.rate <= out.bound
    assert SLO(**job["slo"]).misses(out.summary) is None
    assert out.summary["cost"]["usd_per_mtok_output"] > 0 and out.summary["energy"]["joules_per_output_token"] > 0
    failed = [r for r, ok in out.probes if not ok]
    assert all(r > out.rate for r in failed)


def _plan(tmp_path, *extra, timeout=600):
    cmd = [sys.executable, "-m", "simulator", "plan", "--slo", "ttft_p99=300ms", "--slo", "tpot_p99=40ms",
           "--set", "workload.prompt_tokens=256", "--set", "workload.output_tokens=64", "--requests", "150",
           "--engine", "reference", "--out", str(tmp_path / "plan"), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_plan_end_to_end_writes_a_winner_that_runs_and_meets_the_slo(tmp_path):
    proc = _plan(tmp_path, "--gpu", "h100-sxm,a100-sxm-80g", "--tp", "1,2", "--replicas", "1,2", "--max-gpus", "2",
                 "--workers", "2")
    assert proc.returncode == 0, proc.stderr
    assert "winner:" in proc.stdout and "lastmile plan: 6 candidates" in proc.stderr
    winner = tmp_path / "plan" / "winner.yaml"
    result = simulator.run(str(winner), last_mile_cost=False)
    s = result.summary
    assert SLO(ttft_p99=0.3, tpot_p99=0.04).misses(s) is None
    assert yaml.safe_load(winner.read_text())["workload"]["rate"] > 0
    assert (tmp_path / "plan" / "pareto.png").stat().st_size > 0
    again = _plan(tmp_path, "--gpu", "h100-sxm,a100-sxm-80g", "--tp", "1,2", "--replicas", "1,2", "--max-gpus", "2")
    assert again.returncode == 0 and "6 from" in again.stderr  # resumed: nothing simulated again
    assert again.stdout.splitlines()[1] == proc.stdout.splitlines()[1]  # the same winner, same figures


@pytest.mark.parametrize("args, message", [
    (["--gpu", "h1000"], "--gpu: unknown GPU 'h1000'"),
    (["--gpus", "8", "--tp", "3", "--replicas", "2"], "the search space is empty"),
    (["--slo", "ttft=1s"], "--slo: expected KEY=VALUE"),
    (["--engine", "vllm-9"], "--engine: unknown engine profile 'vllm-9'"),
])
def test_plan_bad_input_is_one_line(tmp_path, args, message):
    proc = _plan(tmp_path, *args, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_plan_says_when_no_candidate_meets_the_slo(tmp_path):
    proc = _plan(tmp_path, "--gpu", "a100-sxm-80g", "--tp", "1", "--replicas", "1", "--slo", "ttft_p99=0.1ms")
    assert proc.returncode == 1 and "no candidate meets" in proc.stdout and "Traceback" not in proc.stderr


def test_energy_is_the_activity_model_in_closed_form():
    from simulator.observe.energy import gpu_energy

    power = SimpleNamespace(max=700.0, idle=75.0)
    j, capped = gpu_energy(power, 2, 10.0, 15.0, 1e15, 3e12, 1e15, 3e12)  # 1 s of peak FLOPs + 1 s of peak HBM
    assert j == pytest.approx(2 * 75 * 10 + 625 * 2) and not capped
    j, capped = gpu_energy(power, 2, 10.0, 1.5, 1e15, 3e12, 1e15, 3e12)  # more than the limit over 1.5 busy s
    assert j == pytest.approx(2 * 75 * 10 + 625 * 1.5) and capped


def test_a_run_s_cost_is_its_gpu_hours_at_the_price():
    s = simulator.run(None, {"workload.requests": 60, "cost.gpu_hour": 3.0, "parallel.tp": 2}, last_mile_cost=False).summary
    c, e = s["cost"], s["energy"]
    wall = s["duration_s"]
    assert c["usd_per_hour"] == 6.0 and c["price_source"] == "cost.gpu_hour"
    assert c["usd"] == pytest.approx(6.0 * wall / 3600)
    assert c["usd_per_mtok_output"] == pytest.approx(c["usd"] / s["tokens"]["output_total"] * 1e6)
    assert e["joules_per_output_token"] == pytest.approx(e["gpu_joules"] / s["tokens"]["output_total"])
    assert 75 < e["gpu_watts_mean"] <= 700 and e["total_joules"] == pytest.approx(e["gpu_joules"] + e["host_joules"])
    default = simulator.run(None, {"workload.requests": 60}, last_mile_cost=False).summary["cost"]
    assert default["price_source"] == "semianalysis-neocloud-h100" and default["usd_per_gpu_hour"] == 1.69
    with pytest.raises(ConfigError, match="cost.offering"):
        simulator.run(None, {"cost.offering": "aws-p9"})


def test_every_price_and_power_figure_has_a_source_and_a_date():
    from simulator.config import catalog

    for name, entry in catalog.prices().items():
        assert entry["source"] and entry["date"] and entry["usd_per_hour"] > 0, name
        assert catalog.entry("gpus", entry["gpu"]) is not None, name
    for gpu in catalog.names("gpus"):
        spec = catalog.entry("gpus", gpu)
        for key in ("max", "idle", "host"):
            if (spec.get("power") or {}).get(key) is not None:
                assert f"power.{key}" in spec["sources"], (gpu, key)
        if spec.get("offering"):
            assert catalog.price(spec["offering"])["gpu"] == gpu
            assert not math.isnan(catalog.price(spec["offering"])["usd_per_hour"])


@pytest.mark.slow
def test_plan_on_a_dask_cluster_equals_local_processes(tmp_path):
    import pandas as pd
    from dask import distributed  # the [dev] extra installs it

    space = ("--gpu", "h100-sxm", "--tp", "1", "--replicas", "1,2")
    local = _plan(tmp_path / "local", *space, "--workers", "2")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        remote = _plan(tmp_path / "dask", *space, "--scheduler", cluster.scheduler_address)
    assert local.returncode == remote.returncode == 0, remote.stderr
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "local" / "plan" / "plan.csv"),
                                  pd.read_csv(tmp_path / "dask" / "plan" / "plan.csv"))
    assert (tmp_path / "local" / "plan" / "winner.yaml").read_text() == (tmp_path / "dask" / "plan" / "winner.yaml").read_text()
