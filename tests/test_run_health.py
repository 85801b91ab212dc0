"""A run says what it did not do: unfinished requests, a run cut short, offered load beyond capacity."""

from __future__ import annotations

import json

import numpy as np
import pytest

import simulator
from simulator.config.loader import load_scenario
from simulator.api import simulate
from simulator.pipelines import health

PIPEFUSION = "scenarios/dit/pixart-1024-a100-nvlink-pipefusion.yaml"
# Llama-3-8B on one H100 (the default scenario), small batches so that capacity is ~18 requests/s.
SMALL_LLM = {"workload.requests": 60, "workload.prompt_tokens": 128, "workload.output_tokens": 64,
             "serving.max_batch": 8}


def _json_ok(summary: dict) -> None:
    json.dumps(summary, allow_nan=False)  # raises on NaN or inf


def test_dit_cut_before_anything_finishes_says_so(root):
    r = simulator.run(root / PIPEFUSION, {"max_sim_time": "1 ns", "workload.requests": 3})
    s = r.summary
    assert (s["status"], s["requests_total"], s["requests_completed"]) == ("truncated", 3, 0)
    assert s["warnings"] == ["run truncated at max_sim_time = 1 ns: 3 of 3 images did not complete; "
                             "no latency metrics (they are null)"]
    assert s["latency_s"]["p50"] is None and s["last_mile_share"] is None
    assert set(s["breakdown_share"].values()) == {None}
    assert len(r.requests) == 3 and not r.requests["completed"].any() and r.breakdown.empty
    _json_ok(s)


def test_dit_cut_midway_keeps_the_unfinished_images(root):
    full = simulator.run(root / PIPEFUSION, {"workload.requests": 4})
    cut_at = float(full.requests["done_s"].iloc[1]) + 1e-6  # after the second image is delivered
    r = simulator.run(root / PIPEFUSION, {"workload.requests": 4, "max_sim_time": cut_at})
    s = r.summary
    assert (s["status"], s["requests_total"], s["requests_completed"]) == ("truncated", 4, 2)
    assert "2 of 4 images did not complete; metrics cover the 2 that did" in s["warnings"][0]
    assert list(r.requests["completed"]) == [True, True, False, False]
    assert list(r.breakdown.index) == [0, 1]
    assert s["latency_s"]["mean"] == pytest.approx(full.requests["latency_s"].iloc[:2].mean(), rel=1e-12)
    # a complete run is "ok" and has nothing to warn about
    assert full.summary["status"] == "ok" and "warnings" not in full.summary
    assert full.summary["requests_total"] == full.summary["requests_completed"] == 4


def test_llm_cut_short_is_truncated_with_null_metrics():
    r = simulator.run(None, {**SMALL_LLM, "max_sim_time": "1 ms"})
    s = r.summary
    assert (s["status"], s["requests_total"], s["requests_completed"]) == ("truncated", 60, 0)
    assert "60 of 60 requests did not complete" in s["warnings"][0]
    assert s["ttft_ms"]["mean"] is None and s["last_mile_share"] is None
    assert s["itl_last_mile_share"] is None and set(s["breakdown_share"].values()) == {None}
    _json_ok(s)
    partial = simulator.run(None, {**SMALL_LLM, "max_sim_time": "1 s"}).summary
    assert partial["status"] == "truncated" and 0 < partial["requests_completed"] < 60
    assert f"{60 - partial['requests_completed']} of 60 requests" in partial["warnings"][0]


def test_llm_complete_run_is_ok_without_warnings():
    s = simulator.run(None, SMALL_LLM).summary
    assert (s["status"], s["requests_total"], s["requests_completed"]) == ("ok", 60, 60)
    assert "warnings" not in s


def test_token_pipeline_counts_its_one_sequence(root):
    s = simulator.run(root / "scenarios/dit/token-pipeline-dit.yaml").summary
    assert (s["status"], s["requests_total"], s["requests_completed"]) == ("ok", 1, 1)


def test_absurd_timing_values_never_leave_nan_or_inf_in_the_summary():
    """The loader bounds timing values; past it, the pipeline still reports null, not inf/NaN."""
    sc = load_scenario(None, {"workload.requests": 12})
    object.__setattr__(sc.hardware.client_link, "latency", 1e308)  # beyond the loader's bounds
    with np.errstate(all="ignore"):
        s = simulate(sc).summary
    _json_ok(s)
    assert any(w.startswith("non-finite results reported as null: ") for w in s["warnings"])
    assert s["ttft_ms"]["p50"] is None


def test_incomplete_is_not_truncated():
    status, warnings = health.completion_status(30, 0, cut=False, max_sim_time=None)
    assert status == "incomplete"
    assert warnings == ["30 of 30 requests did not complete (the simulation ran out of events before "
                        "they finished); no latency metrics (they are null)"]
    assert health.completion_status(30, 30, cut=False, max_sim_time=None) == ("ok", [])


# ---- overload -------------------------------------------------------------------------------

def _fifo(arrival: np.ndarray, service: float):
    """A single FIFO server of fixed service time: each request's finish time and queueing delay."""
    finish, free = np.empty(len(arrival)), 0.0
    for i, a in enumerate(arrival):
        free = max(free, a) + service
        finish[i] = free
    return finish, finish - service - arrival


@pytest.mark.parametrize("load, warns", [(0.5, False), (0.9, False), (1.3, True), (3.0, True)])
def test_overload_criterion_on_a_fifo_queue(load, warns):
    arrival = np.cumsum(np.random.default_rng(0).exponential(1.0, 300))
    finish, delay = _fifo(arrival, service=load)
    w = health.overload_warning(arrival, finish, delay, np.ones(300, bool))
    assert (w is not None) == warns
    if warns:
        sustained = float(w.split("complete at ")[1].split("/s")[0])
        assert sustained == pytest.approx(1 / load, rel=0.03)  # the server's capacity


def test_a_burst_absorbed_in_one_batch_is_not_overload():
    """Arrivals outpace completions (the completions bunch), but nobody waits longer over time."""
    arrival = np.linspace(0.0, 1.0, 40)
    finish = arrival + np.linspace(9.0, 9.2, 40)  # one large batch, every request takes ~9 s
    assert health.overload_warning(arrival, finish, np.full(40, 0.01), np.ones(40, bool)) is None


def test_a_growing_wait_for_the_first_token_is_overload_though_latency_is_flat():
    """The engine admits faster than it completes: the queue before it grows (TTFT climbs), while the
    end-of-run drain keeps the latency of the last arrivals from growing."""
    arrival = np.linspace(0.0, 10.0, 300)
    finish = np.linspace(30.0, 60.0, 300)  # completions at 10/s against 30/s offered
    first = 0.5 * arrival  # TTFT climbs 0.5 s per second of arrivals
    latency = np.full(300, 20.0)  # flat: no latency growth
    assert health.overload_warning(arrival, finish, latency, np.ones(300, bool)) is None
    w = health.overload_warning(arrival, finish, latency, np.ones(300, bool), first=first)
    assert w.startswith("offered load exceeds capacity: requests arrive at 29.9/s but complete at 9.967/s "
                        "sustained, and time to first output grows")
    flat = health.overload_warning(arrival, finish, latency, np.ones(300, bool), first=np.full(300, 0.2))
    assert flat is None  # a steady wait is no queue growing


def test_a_short_overloaded_run_of_the_default_scenario_warns_by_its_first_tokens():
    # 300 requests at 60/s: TTFT climbs through the run while the drain keeps E2E from growing
    s = simulator.run(None, {"workload.rate": "60/s", "workload.requests": 300, "record_spans": False},
                      last_mile_cost=False).summary
    assert s["status"] == "ok" and "time to first output grows through the run" in s["warnings"][0]


def test_a_saturated_api_server_is_named_as_the_bottleneck():
    hint = health.saturated_hint({"gpu0": 0.4, "cpu:api_server0": 0.995, "cpu:engine0": 0.3})
    assert hint == ("api_server0 was busy 99.5% of the run, the bottleneck: more API servers "
                    "(serving.api_servers) would serve more")
    assert health.saturated_hint({"gpu0": 1.0, "cpu:api_server0": 0.5}) is None


def test_llm_overload_warns_with_offered_rate_and_throughput():
    over = simulator.run(None, {**SMALL_LLM, "workload.arrival": "poisson", "workload.rate": 40}).summary
    (w,) = over["warnings"]
    offered = float(w.split("arrive at ")[1].split("/s")[0])
    sustained = float(w.split("complete at ")[1].split("/s")[0])
    assert w.startswith("offered load exceeds capacity: requests arrive at ")
    assert offered == pytest.approx(40, rel=0.15) and sustained < 0.6 * offered
    comfortable = simulator.run(None, {**SMALL_LLM, "workload.arrival": "poisson",
                                       "workload.rate": 5}).summary
    assert comfortable["status"] == "ok" and "warnings" not in comfortable


def test_dit_overload_warns(root):
    # 4 steps, one image at a time on the server: capacity ~3 images/s
    short = {"steps": 4, "workload.requests": 15}
    over = simulator.run(root / PIPEFUSION, {**short, "workload.arrival": "constant",
                                             "workload.rate": 8}).summary
    assert over["status"] == "ok" and len(over["warnings"]) == 1
    assert over["warnings"][0].startswith("offered load exceeds capacity: images arrive at 8/s but ")
    easy = simulator.run(root / PIPEFUSION, {**short, "workload.arrival": "poisson",
                                             "workload.rate": 1}).summary
    assert "warnings" not in easy


def test_cli_prints_each_warning_on_stderr(root, capsys):
    from simulator.cli import main

    assert main(["run", str(root / PIPEFUSION), "--set", "max_sim_time=1 ns", "--no-write"]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("lastmile: caveat:")]
    assert err == ["lastmile: warning: run truncated at max_sim_time = 1 ns: 2 of 2 images did not "
                   "complete; no latency metrics (they are null)"]
