"""The LLM serving path: closed-form single requests, overlap, placements, preemption, the breakdown identity."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

import simulator
from simulator.config.loader import load_scenario
from simulator.observe import llm_metrics
from simulator.pipelines.llm.pools import build_cost

BASE = {
    "model": "llama-3-8b",
    "hardware": {"gpu": "h100-sxm"},
    "serving": {"overlap": "sync", "detokenizer": "engine", "stream_interval": 1},
    "workload": {"requests": 1, "arrival": "all_at_once", "prompt_tokens": 100, "output_tokens": 4},
}


def merged(**sections) -> dict:
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BASE.items()}
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key].update(value)
        else:
            out[key] = value
    return out


def identity_error(result) -> float:
    b = result.breakdown
    return float((b[list(llm_metrics.CATEGORIES)].sum(axis=1) - b["e2e_s"]).abs().max())


def test_single_request_ttft_and_itl_are_the_sum_of_the_stages():
    result = simulator.run(BASE)
    sc = load_scenario(BASE)
    cost = build_cost(sc)
    cpu, host, client, sv = sc.hardware.cpu, sc.hardware.host_link, sc.hardware.client_link, sc.serving
    # With CUDA graphs the step is one graph launch, which overlaps the GPU work it starts.
    sched = cpu.schedule_per_step + cpu.schedule_per_request
    d2h = host.latency + 8 / host.effective_bandwidth
    detok = cpu.detokenize_step_fixed + cpu.detokenize_per_token + cpu.output_per_request
    deliver = cpu.stream_per_chunk + client.latency + (sv.response_header_bytes + sv.chunk_bytes_per_token) / client.effective_bandwidth
    tokenize = cpu.request_overhead + cpu.tokenize_per_token * 100

    ttft = tokenize + sched + cost.step(0, 0, [(0, 100)]).total + d2h + detok + deliver
    req = result.requests.iloc[0]
    assert req["ttft_s"] == pytest.approx(ttft, rel=1e-12)
    receipts = [ttft]
    for k in range(1, 4):
        receipts.append(receipts[-1] + sched + cost.step(100 + k, 1).total + d2h + detok)
    assert req["e2e_s"] == pytest.approx(receipts[-1], rel=1e-12)
    itl = np.diff(receipts)
    assert result.summary["itl_ms"]["mean"] == pytest.approx(itl.mean() * 1e3, rel=1e-12)
    assert result.summary["tpot_ms"]["mean"] == pytest.approx((receipts[-1] - ttft) / 3 * 1e3, rel=1e-12)


def test_eager_launches_bound_a_short_step():
    eager = merged(hardware={"gpu": {"base": "h100-sxm", "launch_overhead": "50 us"}, "cuda_graphs": False})
    sc = load_scenario(eager)
    cost = build_cost(sc)
    launches = cost.kernels_per_step() * sc.hardware.gpu.launch_overhead
    assert launches > cost.step(101, 1).total     # a batch-1 decode step is launch-bound in eager mode
    graphs = simulator.run(merged(hardware={"gpu": {"base": "h100-sxm", "launch_overhead": "50 us"}})).requests.iloc[0]
    slow = simulator.run(eager).requests.iloc[0]
    assert slow["tpot_s"] - graphs["tpot_s"] == pytest.approx(launches - cost.step(102, 1).total, rel=0.05)


@pytest.mark.parametrize("graphs", [{"steps": "decode_only"}, {"max_tokens": 50}, {"sizes": [1, 2, 4]}])
def test_a_step_without_a_captured_graph_launches_each_kernel(graphs):
    """Issue 26: an engine replays graphs only for the steps it captured (decode-only ones, as vLLM V0 and
    SGLang; up to a size, as vLLM V1): the 100-token prefill here launches each kernel, the decodes do not."""
    gpu = {"base": "h100-sxm", "launch_overhead": "50 us"}
    base = merged(hardware={"gpu": gpu})
    some = merged(hardware={"gpu": gpu}, serving={**BASE["serving"], "graph_capture": graphs})
    sc = load_scenario(some)
    cost = build_cost(sc)
    launches, prefill = cost.kernels_per_step() * sc.hardware.gpu.launch_overhead, cost.step(0, 0, [(0, 100)]).total
    assert launches > prefill  # launch-bound: the step ends at its last launch
    a, b = simulator.run(base).requests.iloc[0], simulator.run(some).requests.iloc[0]
    assert b["ttft_s"] - a["ttft_s"] == pytest.approx(launches - prefill, rel=1e-9)
    assert b["e2e_s"] - b["ttft_s"] == pytest.approx(a["e2e_s"] - a["ttft_s"], rel=1e-12)


def test_vllm_v1_captures_graphs_up_to_twice_its_batch_limit():
    """vLLM V1's capture sizes stop at min(2 x max_num_seqs, 512) tokens (``per_sequence`` 2)."""
    from simulator.config.models import GraphCapture
    from simulator.pipelines.llm.settings import EngineSettings

    v1 = GraphCapture(max_tokens=512, per_sequence=2)
    assert (v1.for_batch(1024).max_tokens, v1.for_batch(128).max_tokens) == (512, 256)
    assert GraphCapture(per_sequence=2).for_batch(40).max_tokens == 80
    assert GraphCapture(max_tokens=256).for_batch(8) == GraphCapture(max_tokens=256)  # no bound per sequence
    for max_batch, largest in ((40, 80), (1024, 512)):
        sv = EngineSettings.from_scenario(load_scenario(merged(serving={"engine": "vllm-v1", "max_batch": max_batch})))
        assert sv.replays_graph(largest, True) and not sv.replays_graph(largest + 1, False)


def test_an_engine_profile_names_its_kernels_and_sets_the_modelled_ones():
    """The profile's kernels block lays its modelled kernels under the scenario keys; a scenario's own win."""
    sc = load_scenario(merged(serving={"engine": "vllm-0.6"}))
    k = sc.serving.engine.kernels
    assert k.attention and k.gemm and k.sampler
    assert sc.serving.graph_capture == k.cuda_graphs and k.cuda_graphs.steps == "decode_only"
    assert sc.parallel.allreduce == k.allreduce
    own = load_scenario(merged(serving={"engine": "vllm-0.6", "graph_capture": {"steps": "all"}},
                               parallel={"allreduce": "nccl"}))
    assert (own.serving.graph_capture.steps, own.serving.graph_capture.max_tokens) == ("all", k.cuda_graphs.max_tokens)
    assert own.parallel.allreduce == "nccl"


def test_single_request_breakdown_is_exact():
    result = simulator.run(BASE)
    sc = load_scenario(BASE)
    cpu = sc.hardware.cpu
    row = result.breakdown.iloc[0]
    detok = cpu.detokenize_step_fixed + cpu.detokenize_per_token
    # Sync, engine-side detokenization: every token's detokenization and output object are on the
    # critical path, and no process is crossed (the reference profile's messages cost nothing).
    assert row["detokenize"] == pytest.approx(4 * detok, rel=1e-9)
    assert row["output"] == pytest.approx(4 * cpu.output_per_request, rel=1e-9)
    assert row["ipc"] == 0.0
    # The GPU time of each step is attributed to its phase: one prefill step, three decode steps.
    cost = build_cost(sc)
    assert row["prefill"] == pytest.approx(cost.step(0, 0, [(0, 100)]).total, rel=1e-9)
    assert row["decode"] == pytest.approx(sum(cost.step(100 + k, 1).total for k in range(1, 4)), rel=1e-9)
    assert row["comm"] == 0.0
    assert identity_error(result) < 1e-12


CPU_HEAVY = {"hardware": {"gpu": "h100-sxm", "cpu": {"base": "reference", "detokenize_per_token": "60 us",
                                                     "output_per_request": "20 us"}},
             "workload": {"requests": 256, "arrival": "closed", "concurrency": 64, "prompt_tokens": 64,
                          "output_tokens": 64}}


def test_async_beats_sync_when_cpu_work_is_comparable_to_the_gpu_step():
    sync = simulator.run(merged(**CPU_HEAVY))
    asyn = simulator.run(merged(**CPU_HEAVY), {"serving.overlap": "async"})
    gpu_step = build_cost(load_scenario(merged(**CPU_HEAVY))).step(64 * 100, 64).total
    cpu_step = 64 * 80e-6
    assert 0.3 < cpu_step / gpu_step < 3      # the regime the claim is about
    s, a = sync.summary, asyn.summary
    assert a["throughput"]["output_tokens_per_s"] > 1.2 * s["throughput"]["output_tokens_per_s"]
    assert a["tpot_ms"]["mean"] < s["tpot_ms"]["mean"]
    assert a["last_mile_share"] < s["last_mile_share"]


@pytest.mark.parametrize("placement", ["separate", "api_server"])
def test_moving_detokenization_off_the_engine_helps_when_cpu_bound(placement):
    engine = simulator.run(merged(**CPU_HEAVY))
    moved = simulator.run(merged(**CPU_HEAVY), {"serving.detokenizer": placement})
    assert moved.summary["tpot_ms"]["mean"] < engine.summary["tpot_ms"]["mean"]
    assert identity_error(moved) < 1e-9


def test_a_separate_detokenizer_hears_only_the_steps_that_stream():
    """SGLang's scheduler builds an entry for a request only when it streams (stream_output_generation):
    one request of 8 tokens at stream interval 4 streams its 1st, 5th and 8th tokens, so the engine
    builds exactly three 1 ms entries and the detokenizer runs three times, once per chunk, each
    time decoding the tokens made since the last (1, 4 and 3: all 8 once)."""
    r = simulator.run(None, {"model": {"base": "llama-3-8b", "layers": 2}, "serving.engine": "sglang",
                             "serving.stream_interval": 4, "hardware.cpu.stream_entry_per_request": "1 ms",
                             "hardware.cpu.detokenize_per_token": "10 us", "hardware.cpu.detokenize_step_fixed": "0 ms",
                             "workload.requests": 1, "workload.arrival": "all_at_once", "workload.prompt_tokens": 16,
                             "workload.output_tokens": 8, "record_spans": True}, last_mile_cost=False)
    sp = r.spans
    entries = sp[(sp.track == "cpu:engine0") & (sp.name == "output")]
    np.testing.assert_allclose((entries.end - entries.start).to_numpy(), [1e-3] * 3, rtol=0, atol=1e-12)
    detok = sp[(sp.track == "cpu:detokenizer0") & (sp.name == "detokenize")]
    np.testing.assert_allclose((detok.end - detok.start).to_numpy(), [10e-6, 40e-6, 30e-6], rtol=0, atol=1e-12)
    assert r.summary["tokens"]["output_total"] == 8
    assert identity_error(r) < 1e-9


def test_a_load_generator_on_the_host_costs_its_send_and_its_reads():
    """``workload.client_cpu``: one request sent at 0 reaches the server after the client's 1 ms of
    sending, and each chunk is received after the client's 50 us read (the client idle between
    chunks), so TTFT and E2E grow by exactly 1.05 ms and every inter-token gap is unchanged; a
    closed-form run cannot book the client, so the engine steps event by event."""
    one = {"model": {"base": "llama-3-8b", "layers": 2}, "workload.requests": 1, "workload.arrival": "all_at_once",
           "workload.prompt_tokens": 16, "workload.output_tokens": 4, "hardware.cpu_cores": 8, "record_spans": False}
    base = simulator.run(None, one, last_mile_cost=False)
    with_client = simulator.run(None, {**one, "workload.client_cpu": {"per_request": "1 ms", "per_chunk": "50 us"}},
                                last_mile_cost=False)
    b, c = base.requests.iloc[0], with_client.requests.iloc[0]
    assert c["ttft_s"] - b["ttft_s"] == pytest.approx(1.05e-3, abs=1e-12)
    assert c["e2e_s"] - b["e2e_s"] == pytest.approx(1.05e-3, abs=1e-12)
    np.testing.assert_allclose(with_client.itl, base.itl, rtol=0, atol=1e-12)
    assert with_client.summary["utilization"]["cpu:client"] > 0
    assert identity_error(with_client) < 1e-9


def test_same_seed_same_results():
    a = simulator.run(None, {"workload.requests": 120})
    b = simulator.run(None, {"workload.requests": 120})
    assert a.summary == b.summary
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.breakdown, b.breakdown)
    c = simulator.run(None, {"workload.requests": 120, "seed": 1})
    assert c.summary != a.summary


@pytest.mark.parametrize("overrides", [
    {},
    {"serving.overlap": "async", "serving.detokenizer": "separate", "serving.stream_interval": 3},
    {"serving.detokenizer": "api_server", "serving.api_servers": 2, "parallel.replicas": 2},
])
def test_breakdown_sums_to_e2e_for_every_request_of_a_real_trace(conv_trace, overrides):
    scenario = {"model": "llama-2-7b", "dtype": "fp16", "hardware": {"gpu": "a100-sxm-80g"},
                "serving": {"max_batch": 128, "max_batched_tokens": 4096},
                "workload": {"requests": 300, "arrival": "trace", "trace": str(conv_trace), "trace_time_scale": 0.5,
                             "over_context": "truncate_prompt"}}
    result = simulator.run(scenario, overrides)
    assert result.summary["requests_completed"] == 300
    assert identity_error(result) < 1e-9
    shares = result.summary["breakdown_share"]
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-9)
    assert all(v >= 0 for v in shares.values())


def test_breakdown_does_not_depend_on_chunking(conv_trace, monkeypatch):
    scenario = {"model": "llama-2-7b", "hardware": {"gpu": "a100-sxm-80g"},
                "workload": {"requests": 200, "arrival": "trace", "trace": str(conv_trace),
                             "over_context": "truncate_prompt"}}
    whole = simulator.run(scenario)
    monkeypatch.setattr(llm_metrics, "CHUNK_ROWS", 257)
    chunked = simulator.run(scenario)
    pd.testing.assert_frame_equal(whole.breakdown, chunked.breakdown, rtol=1e-12)
    assert whole.summary["itl_last_mile_share"] == pytest.approx(chunked.summary["itl_last_mile_share"], rel=1e-12)


def test_preemption_by_recompute_when_kv_runs_out():
    scenario = merged(model="llama-2-7b",
                      hardware={"gpu": {"base": "a100-sxm-80g", "memory": "17 GB"}},
                      serving={"gpu_memory_utilization": 1.0, "max_batched_tokens": 2048},
                      workload={"requests": 32, "arrival": "all_at_once", "prompt_tokens": 200, "output_tokens": 300})
    result = simulator.run(scenario)
    assert result.summary["preemptions"] > 0
    assert result.summary["requests_completed"] == 32
    assert result.summary["kv_cache"]["peak_occupancy"] <= 1.0
    assert identity_error(result) < 1e-9


def test_stream_interval_groups_tokens_into_chunks():
    result = simulator.run(merged(serving={"stream_interval": 4},
                                  workload={"requests": 1, "arrival": "all_at_once", "prompt_tokens": 100,
                                            "output_tokens": 9}))
    # 9 tokens: the first at once, then chunks of 4 and 4: two gaps between chunks (vllm bench serve's
    # ITL), and in the per-token view 8 gaps, 6 of them zero
    itl = result.itl
    assert len(itl) == 2 and (itl > 0).all()
    s = result.summary
    assert s["itl_ms"]["p50"] == pytest.approx(1e3 * np.median(itl)) and s["itl_per_token_ms"]["p50"] == 0.0
    assert s["itl_per_token_ms"]["mean"] == pytest.approx(1e3 * itl.sum() / 8)
    req = result.requests.iloc[0]
    # the two gaps are the chunks' receipts: they add up to the time after the first token
    assert itl.sum() == pytest.approx(req["last_token_s"] - req["first_token_s"], rel=1e-12)
    assert req["tpot_s"] == pytest.approx(itl.sum() / 8, rel=1e-12)
    # ... so the per-chunk ITL is about stream_interval x TPOT, never 0
    assert s["itl_ms"]["p50"] == pytest.approx(4 * 1e3 * req["tpot_s"], rel=0.2)


def _most_in_flight(requests) -> int:
    events = sorted([(a, 1) for a in requests["arrival_s"]] + [(e, -1) for e in requests["last_token_s"]])
    return int(np.cumsum([d for _, d in events]).max())


def test_a_rate_with_a_concurrency_limit_sends_when_both_allow():
    # vllm bench serve --request-rate 40 --max-concurrency C: due at Poisson times, sent when a slot is free
    w = {"requests": 120, "arrival": "poisson", "rate": "40/s", "prompt_tokens": 300, "output_tokens": 60}
    free = simulator.run(merged(workload=w), last_mile_cost=False)
    limited = simulator.run(merged(workload={**w, "concurrency": 4}), last_mile_cost=False)
    one = simulator.run(merged(workload={**w, "concurrency": 1}), last_mile_cost=False)
    assert _most_in_flight(free.requests) > 4 and _most_in_flight(limited.requests) == 4
    r = one.requests.sort_values("arrival_s")
    assert (r["arrival_s"].to_numpy()[1:] >= r["last_token_s"].to_numpy()[:-1] - 1e-12).all()  # one at a time
    due = free.requests["arrival_s"].to_numpy()
    assert (limited.requests["arrival_s"].to_numpy() >= due - 1e-12).all()  # never before it is due
    assert limited.summary["duration_s"] > free.summary["duration_s"]


def test_a_rate_given_to_a_closed_loop_is_said_to_be_unused():
    r = simulator.run(merged(workload={"arrival": "closed", "concurrency": 4, "rate": "5/s", "requests": 20}),
                      last_mile_cost=False)
    assert any(w.startswith("workload.rate (5/s) is not used: a closed loop") for w in r.summary["warnings"])


def test_closed_loop_keeps_concurrency():
    result = simulator.run(merged(workload={"requests": 40, "arrival": "closed", "concurrency": 4,
                                            "prompt_tokens": 50, "output_tokens": 20}))
    r = result.requests
    events = sorted([(a, 1) for a in r["arrival_s"]] + [(e, -1) for e in r["last_token_s"]])
    live = np.cumsum([d for _, d in events])
    assert live.max() == 4
    assert result.summary["requests_completed"] == 40


def test_tensor_parallel_adds_communication():
    result = simulator.run(merged(model="llama-3-70b", parallel={"tp": 4},
                                  workload={"requests": 4, "arrival": "all_at_once", "prompt_tokens": 256,
                                            "output_tokens": 16}))
    assert result.summary["breakdown_share"]["comm"] > 0.01
    assert identity_error(result) < 1e-9


def test_more_api_servers_relieve_a_streaming_bottleneck():
    heavy = merged(hardware={"gpu": "h100-sxm", "cpu": {"base": "reference", "stream_per_chunk": "200 us"}},
                   serving={"detokenizer": "api_server", "overlap": "async"},
                   workload={"requests": 128, "arrival": "closed", "concurrency": 64, "prompt_tokens": 32,
                             "output_tokens": 32})
    one = simulator.run(heavy)
    four = simulator.run(heavy, {"serving.api_servers": 4})
    assert four.summary["itl_ms"]["mean"] < one.summary["itl_ms"]["mean"]


@settings(max_examples=12, deadline=None)
@given(overlap=st.sampled_from(["sync", "async"]),
       placement=st.sampled_from(["engine", "separate", "api_server"]),
       interval=st.integers(1, 5), servers=st.integers(1, 3), batch=st.integers(1, 8),
       chunked=st.booleans(), seed=st.integers(0, 3))
def test_breakdown_identity_holds_for_any_serving_setup(overlap, placement, interval, servers, batch, chunked, seed):
    scenario = merged(seed=seed,
                      serving={"overlap": overlap, "detokenizer": placement, "stream_interval": interval,
                               "api_servers": servers, "max_batch": batch, "chunked_prefill": chunked,
                               "max_batched_tokens": 512},
                      workload={"requests": 12, "arrival": "poisson", "rate": 50,
                                "prompt_tokens": {"dist": "uniform", "low": 10, "high": 400},
                                "output_tokens": {"dist": "uniform", "low": 1, "high": 20}})
    result = simulator.run(scenario)
    assert result.summary["requests_completed"] == 12
    assert identity_error(result) < 1e-9
    r = result.requests
    assert (r["ttft_s"] > 0).all() and (r["e2e_s"] >= r["ttft_s"]).all()
