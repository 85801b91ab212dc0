"""Engine profiles (``serving.engine``): how the loader applies them, and the host-path mechanisms they
switch on — one process for the API server and the engine, messages between processes, async output
processing, input preparation — each checked on a single request against its closed form."""

from __future__ import annotations

import numpy as np
import pytest

import simulator
from simulator.config import catalog
from simulator.config.loader import load_scenario
from simulator.errors import ConfigError
from simulator.validate import load_family

from test_decode_runs import assert_same, both

ONE = {
    "model": "llama-3-8b",
    "hardware": {"gpu": "h100-sxm"},
    "workload": {"requests": 1, "arrival": "all_at_once", "prompt_tokens": 100, "output_tokens": 6},
}


def scenario(engine="reference", serving=None, cpu=None, **extra) -> dict:
    raw = {**ONE, **extra, "serving": {"engine": engine, **(serving or {})}}
    if cpu is not None:
        raw["hardware"] = {**ONE["hardware"], "cpu": cpu}
    return raw


# -- the loader --------------------------------------------------------------------------------

def test_every_engine_profile_loads_and_names_its_sources():
    for name in catalog.names("engines"):
        sc = load_scenario(scenario(name))
        assert sc.serving.engine.name == name
        assert sc.hardware.cpu.name == catalog.entry("engines", name)["cpu"]
        # every serving default and every CPU figure that differs from the reference has a source
        entry = catalog.entry("engines", name)
        assert set(entry["serving"]) <= set(entry["sources"]), set(entry["serving"]) - set(entry["sources"])
        if name != "reference":
            ref = load_scenario(scenario("reference")).hardware.cpu.model_dump()
            differ = {k for k, v in sc.hardware.cpu.model_dump().items()
                      if k not in ("sources", "name", "source") and v != ref[k]}
            assert differ <= set(sc.hardware.cpu.sources), differ - set(sc.hardware.cpu.sources)


def test_profile_sets_serving_defaults_that_the_scenario_can_override():
    v1 = load_scenario(scenario("vllm-v1"))
    assert (v1.serving.overlap, v1.serving.detokenizer, v1.serving.max_batch) == ("async", "api_server", 1024)
    own = load_scenario(scenario("vllm-v1", {"overlap": "sync", "max_batch": 64}))
    assert (own.serving.overlap, own.serving.detokenizer, own.serving.max_batch) == ("sync", "api_server", 64)


def test_partial_cpu_mapping_builds_on_the_engine_costs():
    sc = load_scenario(scenario("vllm-0.6", cpu={"stream_per_chunk": "50 us"}))
    plain = load_scenario(scenario("vllm-0.6")).hardware.cpu
    assert sc.hardware.cpu.stream_per_chunk == pytest.approx(50e-6) != plain.stream_per_chunk
    assert sc.hardware.cpu.model_dump(exclude={"stream_per_chunk", "name", "source", "sources"}) == \
        plain.model_dump(exclude={"stream_per_chunk", "name", "source", "sources"})


def test_unknown_engine_is_one_line_with_a_suggestion():
    with pytest.raises(ConfigError, match=r"serving\.engine.*unknown engine 'vllm-v2'.*did you mean 'vllm-v1'"):
        load_scenario(scenario("vllm-v2"))
    with pytest.raises(ConfigError, match=r"serving\.engine\.cpu: unknown cpus entry 'vllm-v2'.*did you mean"):
        load_scenario(scenario({"base": "vllm-v1", "cpu": "vllm-v2"}))


def test_api_servers_must_match_replicas_when_they_live_in_the_engines():
    with pytest.raises(ConfigError, match=r"serving\.api_servers.*api_server_process: engine"):
        load_scenario(scenario("vllm-0.5", {"api_servers": 2}))
    load_scenario(scenario("vllm-0.5", {"api_servers": 2}, parallel={"replicas": 2}))


# -- the mechanisms, on one request -------------------------------------------------------------

ZERO = {"base": "reference", "tokenize_per_token": "0 us", "request_overhead": "0 us", "schedule_per_step": "0 us",
        "schedule_per_request": "0 us", "detokenize_per_token": "0 us", "output_per_request": "0 us",
        "stream_per_chunk": "0 us"}


def run(cpu: dict, serving: dict | None = None, **extra):
    return simulator.run(scenario("reference", {"overlap": "sync", "detokenizer": "engine", **(serving or {})},
                                  cpu={**ZERO, **cpu}, **extra), {"coalesce_decode": False})


def test_a_message_costs_its_sender_and_its_receiver():
    """Request in: sent by the API server, received by the engine before it schedules; each step's
    outputs: sent by the engine (delaying its next step), received by the API server."""
    plain = run({})
    ipc = run({"ipc_per_message": "50 us", "ipc_per_byte": "1 ns", "ipc_bytes_per_request": 100})
    msg, request_msg = 50e-6 + 100e-9, 50e-6 + (100 + 5 * 100) * 1e-9
    a, b = plain.requests.iloc[0], ipc.requests.iloc[0]
    assert b["ttft_s"] - a["ttft_s"] == pytest.approx(2 * request_msg + 2 * msg, abs=1e-12)
    assert b["e2e_s"] - b["ttft_s"] - (a["e2e_s"] - a["ttft_s"]) == pytest.approx(5 * msg, abs=1e-12)


def test_api_server_inside_the_engine_process_shares_its_clock():
    """vLLM <= 0.5: streaming a step's chunk holds the engine's one GIL, so the next step's
    scheduling waits for it; with the API server apart, it does not."""
    apart = run({"stream_per_chunk": "200 us"}, record_spans=True)
    shared = run({"stream_per_chunk": "200 us"}, {"api_server_process": "engine"}, record_spans=True)
    assert "cpu:api_server0" not in shared.summary["utilization"]
    sp = shared.spans[shared.spans.track == "cpu:engine0"].sort_values("start")
    assert {"stream", "schedule+launch"} <= set(sp.name)
    for _, row in sp[sp.name == "stream"].iterrows():
        later = sp[(sp.name == "schedule+launch") & (sp.start >= row.start)]
        assert later.empty or later.start.min() >= row.end - 1e-15
    itl_apart, itl_shared = apart.summary["itl_ms"]["mean"], shared.summary["itl_ms"]["mean"]
    assert itl_shared - itl_apart == pytest.approx(0.2, abs=1e-9)  # one 200 us chunk per step, in the chain
    assert shared.summary["engine_time_share"]["api_server"] > 0


def test_async_output_hides_output_work_behind_the_next_step_and_costs_one_more_step():
    sync = run({"output_per_request": "300 us"})
    over = run({"output_per_request": "300 us"}, {"overlap": "async_output"})
    # steady decode: the 300 us of output work leaves the chain (the GPU step is longer than it)
    assert sync.summary["itl_ms"]["mean"] - over.summary["itl_ms"]["mean"] == pytest.approx(0.3, abs=1e-9)
    assert over.summary["steps"] == sync.summary["steps"] + 1  # the finished request rides one more step
    assert over.requests.iloc[0]["output_tokens"] == 6 and bool(over.requests.iloc[0]["completed"])


def test_multi_step_schedules_once_per_run_and_hands_tokens_back_in_bulk():
    """vLLM 0.6 --num-scheduler-steps 4 on one request of 8 tokens: the prefill, then runs of four
    decode steps scheduled once each; the last run computes one step past the request's end; tokens
    of one run reach the client together."""
    sync = run({"schedule_per_step": "1 ms"}, record_spans=True)
    multi = run({"schedule_per_step": "1 ms"}, {"multi_step": 4}, record_spans=True,
                workload={**ONE["workload"], "output_tokens": 8})
    sync8 = run({"schedule_per_step": "1 ms"}, workload={**ONE["workload"], "output_tokens": 8})
    assert multi.summary["steps"] == sync8.summary["steps"] + 1
    sp = multi.spans
    scheduled = sp[(sp.name == "schedule+launch") & (sp.end - sp.start >= 1e-3)]
    assert len(scheduled) == 3  # the prefill and two runs of four
    itl = multi.summary["itl_ms"]
    assert itl["p50"] < 0.05 and itl["p99"] > 5  # bulk within a run, a whole run between them
    assert bool(multi.requests.iloc[0]["completed"]) and sync.summary["requests_completed"] == 1


def test_multi_step_is_not_for_async_scheduling():
    with pytest.raises(ConfigError, match=r"serving\.multi_step"):
        load_scenario(scenario("vllm-v1", {"multi_step": 4}))


def test_input_preparation_is_scheduling_time_on_the_engine():
    base = run({})
    prep = run({"prepare_per_step": "100 us", "prepare_per_request": "20 us"})
    a, b = base.requests.iloc[0], prep.requests.iloc[0]
    assert b["e2e_s"] - a["e2e_s"] == pytest.approx(6 * 120e-6, abs=1e-12)  # every one of the six steps
    assert prep.summary["breakdown_share"]["schedule"] > base.summary["breakdown_share"]["schedule"]


def test_dispatch_to_the_other_workers_delays_every_step_of_a_multi_gpu_replica_only():
    """vLLM V0's Ray workers (``dispatch_per_step``): the driver starts each step on its other GPU
    workers before any GPU runs it, so every step of a TP 2 replica starts that much later; one GPU
    has no other workers."""
    for tp, delay in ((1, 0.0), (2, 2e-3)):
        base = run({}, parallel={"tp": tp})
        ray = run({"dispatch_per_step": "2 ms"}, parallel={"tp": tp}, record_spans=True)
        a, b = base.requests.iloc[0], ray.requests.iloc[0]
        assert b["ttft_s"] - a["ttft_s"] == pytest.approx(delay, abs=1e-12)
        assert b["e2e_s"] - a["e2e_s"] == pytest.approx(6 * delay, abs=1e-12)  # each of the six steps
    sp = ray.spans[ray.spans.track == "cpu:engine0"]
    held = sp[sp.name == "schedule+launch"]
    assert len(held) == 6 and ((held.end - held.start) >= 2e-3).all()
    assert ray.summary["breakdown_share"]["schedule"] > base.summary["breakdown_share"]["schedule"]


def test_a_cpu_cost_per_call_beyond_any_stack_is_one_line():
    with pytest.raises(ConfigError, match=r"hardware\.cpu\.dispatch_per_step: must be at most 10 s per call"):
        load_scenario(scenario("vllm-0.3", cpu={"dispatch_per_step": "1000 s"}))


def test_decode_runs_keep_the_dispatch_cost_exact():
    raw = scenario("vllm-0.3", parallel={"tp": 2})
    raw["workload"] = {"requests": 40, "arrival": "poisson", "rate": "8/s", "prompt_tokens": 300,
                       "output_tokens": {"dist": "uniform", "low": 20, "high": 120}}
    assert_same(*both(raw))


def test_step_gap_is_the_gpu_idle_between_steps():
    r = run({"schedule_per_step": "300 us"}, record_spans=True)
    g = r.spans[r.spans.track == "gpu0"].sort_values("start")
    gaps = g.start.to_numpy()[1:] - g.end.to_numpy()[:-1]
    assert r.summary["step_gap_ms"]["steps"] == len(gaps)
    assert r.summary["step_gap_ms"]["mean"] == pytest.approx(gaps.mean() * 1e3, rel=1e-12)
    assert gaps.min() > 300e-6


def test_engine_time_shares_sum_to_one_for_every_profile():
    for name in catalog.names("engines"):
        raw = scenario(name)
        raw["workload"] = {"requests": 40, "arrival": "poisson", "rate": "20/s", "prompt_tokens": 200,
                           "output_tokens": 30}
        s = simulator.run(raw).summary
        assert sum(s["engine_time_share"].values()) == pytest.approx(1.0, rel=1e-12), name
        assert s["requests_completed"] == 40, name


def test_decode_runs_keep_input_preparation_exact():
    raw = scenario("reference", {"overlap": "sync", "detokenizer": "engine"},
                   cpu={"base": "reference", "prepare_per_step": "40 us", "prepare_per_request": "3 us"})
    raw["workload"] = {"requests": 60, "arrival": "poisson", "rate": "8/s", "prompt_tokens": 300,
                       "output_tokens": {"dist": "uniform", "low": 20, "high": 200}}
    assert_same(*both(raw))


# -- the validation family's ratio rows -----------------------------------------------------------

def test_ratio_metric_needs_an_earlier_case(tmp_path):
    p = tmp_path / "f.yaml"
    p.write_text("family: f\nsource: s\nmetric: throughput_ratio\ncases:\n"
                 "- {case: a, set: {}, measured: {throughput_ratio: 2}}\n")
    with pytest.raises(ConfigError, match="needs relative_to"):
        load_family(p)
    p.write_text("family: f\nsource: s\nmetric: throughput_ratio\ncases:\n"
                 "- {case: a, set: {}, relative_to: b, measured: {throughput_ratio: 2}}\n")
    with pytest.raises(ConfigError, match=r"cases\[0\]\.relative_to.*not an earlier case"):
        load_family(p)


def test_shares_are_what_the_cpu_processes_were_busy_with():
    r = simulator.run(scenario("vllm-0.5"), {"record_spans": True})
    sp = r.spans[r.spans.category == "cpu"]
    busy = float((sp.end - sp.start).sum())
    gpu = r.summary["utilization"]["gpu0"] * r.summary["duration_s"]
    share = r.summary["engine_time_share"]
    assert share["schedule"] + share["output"] + share["api_server"] == pytest.approx(
        busy / (busy + gpu + 0.0), rel=0.05)
    assert np.isfinite(list(share.values())).all()


def test_engines_differ_the_way_their_changelogs_say():
    """V1 outruns V0 (the V1 blog); SGLang and V1 keep detokenization off the critical path; a larger
    stream interval helps most where the API server shares the engine's process (vLLM <= 0.5)."""
    from simulator.report import experiments as E

    load = {**E.CLOSED_LOOP, "workload.concurrency": 64, "workload.requests": 128}

    def summary(engine, **extra):
        return simulator.run(None, {**load, **E.engine_setup(engine), **extra}).summary

    v05, v1, sg = summary("vllm-0.5"), summary("vllm-v1"), summary("sglang")
    assert v1["throughput"]["output_tokens_per_s"] > 1.1 * v05["throughput"]["output_tokens_per_s"]
    assert v1["itl_last_mile_share"] < 0.005 and sg["itl_last_mile_share"] < 0.005 < v05["itl_last_mile_share"]
    gain = {name: base["tpot_ms"]["mean"] / summary(name, **{"serving.stream_interval": 8})["tpot_ms"]["mean"]
            for name, base in (("vllm-0.5", v05), ("vllm-v1", v1))}
    assert gain["vllm-0.5"] > 1.05 > gain["vllm-v1"]


def test_the_collector_grows_with_the_batch_squared():
    """settings.schedule_cost: per step, per request and, for CPython's cyclic collector, per request pair."""
    from types import SimpleNamespace

    from simulator.pipelines.llm.settings import schedule_cost

    cpu = SimpleNamespace(schedule_per_step=100e-6, schedule_per_request=10e-6, prepare_per_step=0.0,
                          prepare_per_request=5e-6, gc_per_request_pair=0.2e-6)
    assert schedule_cost(cpu, 100) == pytest.approx(100e-6 + 100 * 15e-6 + 0.2e-6 * 100 ** 2)
    assert schedule_cost(cpu, 200) - schedule_cost(cpu, 100) == pytest.approx(100 * 15e-6 + 0.2e-6 * 30_000)
