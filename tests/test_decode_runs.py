"""Decode runs in closed form give the step-by-step engine's results: every request's timestamps
within 1 ns and the same summary, on real traces and on the edges of a run (KV running out,
the horizon, several API servers); where a run's reasoning does not hold, nothing is coalesced."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

import simulator
from simulator.config.loader import load_scenario
from simulator.pipelines.llm.decode_runs import Run

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"


@pytest.fixture
def coalesced(monkeypatch):
    """Steps committed by decode runs, counted as they are recorded."""
    count = [0]
    record = Run._record

    def counting(self, k, *rest):
        count[0] += k
        return record(self, k, *rest)

    monkeypatch.setattr(Run, "_record", counting)
    return count


def both(raw: dict, **overrides):
    """The same scenario stepped one by one and with decode runs (without the last-mile counterfactual,
    which ``serving.last_mile: free`` checks on its own, so ``coalesced`` counts this run's steps alone)."""
    overrides.setdefault("record_spans", False)
    runs = {c: simulator.run(raw, {**overrides, "coalesce_decode": c}, last_mile_cost=False) for c in (False, True)}
    return runs[False], runs[True]


def assert_same(a, b):
    ra, rb = a.requests, b.requests
    assert list(ra.columns) == list(rb.columns) and len(ra) == len(rb) > 0
    for c in ra.columns:
        x, y = ra[c].to_numpy(), rb[c].to_numpy()
        if x.dtype.kind == "f":
            assert np.array_equal(np.isnan(x), np.isnan(y)), c
            assert np.nanmax(np.abs(x - y), initial=0.0) <= 1e-9, c
        else:
            assert np.array_equal(x, y), c
    sa, sb = a.summary, b.summary
    assert sa["steps"] == sb["steps"] and sa["requests_completed"] == sb["requests_completed"]
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        for stat, v in sa[key].items():
            assert sb[key][stat] == pytest.approx(v, rel=1e-12, abs=1e-9), (key, stat)
    assert sb["utilization"] == pytest.approx(sa["utilization"], rel=1e-12)
    _same_leaves(sa, sb, "summary")


def _same_leaves(x, y, path: str) -> None:
    """Every figure of two summaries agrees (to rounding: totals summed in another order)."""
    if isinstance(x, dict):
        assert isinstance(y, dict) and x.keys() == y.keys(), path
        for key in x:
            _same_leaves(x[key], y[key], f"{path}.{key}")
    elif isinstance(x, float):
        assert y == pytest.approx(x, rel=1e-9, abs=1e-12), path
    else:
        assert x == y, path


def trace_scenario(trace: str, requests: int, rate: str = "4/s", **extra) -> dict:
    raw = {"name": "runs", "model": "llama-2-7b", "dtype": "fp16", "hardware": {"gpu": "a100-sxm-80g"},
           "serving": {"max_batch": 128, "max_batched_tokens": 4096},
           "workload": {"requests": requests, "arrival": "poisson", "rate": rate,
                        "trace": f"{TRACES}/{trace}", "over_context": "truncate_prompt"}}
    for k, v in extra.items():
        raw[k] = {**raw.get(k, {}), **v} if isinstance(v, dict) else v
    return raw


@pytest.mark.parametrize("overlap", ["sync", "async_output"])
def test_runs_cover_tp_over_pcie_where_steps_are_serial(overlap, coalesced):
    """TP on a PCIe box: the all-reduces share the sampled ids' port, and a loop that launches a step
    once the previous step's ids are on the host never has both on it at once, so both are booked
    and the steps run in closed form, as stepped."""
    a, b = both(trace_scenario("splitwise_conv.csv", 300, hardware={"gpu": "l40s"}, dtype="fp8",
                               parallel={"tp": 2}, serving={"overlap": overlap}))
    assert_same(a, b)
    assert coalesced[0] > 0.9 * a.summary["steps"]
    assert a.summary["utilization"]["link:gpu0.pcie.tx"] > 0  # the all-reduces and copies crossed it


@pytest.mark.parametrize("trace, rate", [("splitwise_conv.csv", "4/s"), ("splitwise_code.csv", "2/s")])
def test_runs_reproduce_the_step_by_step_engine_on_real_traces(trace, rate, coalesced):
    a, b = both(trace_scenario(trace, 600, rate))
    assert_same(a, b)
    assert coalesced[0] > 0.9 * a.summary["steps"]  # nearly every step was in a run


def test_runs_reproduce_it_with_several_api_servers_and_the_horizon_cutting_a_run(coalesced):
    raw = trace_scenario("splitwise_conv.csv", 300, "6/s", serving={"api_servers": 3})
    a, b = both(raw, max_sim_time="40 s")
    assert a.summary["status"] == "truncated" and coalesced[0] > 0
    assert_same(a, b)


def test_runs_stop_where_the_kv_cache_runs_out(coalesced):
    # A small cache: decode runs end where a step's blocks do not fit and the step-by-step path
    # preempts.
    raw = trace_scenario("splitwise_conv.csv", 200, "20/s", serving={"gpu_memory_utilization": 0.2})
    a, b = both(raw)
    assert int(a.requests["preemptions"].sum()) > 0 and coalesced[0] > 0
    assert_same(a, b)


@pytest.mark.parametrize("serving", [{"api_servers": 1}, {"api_servers": 3},
                                     # messages; the API server in the engine's process; it detokenizing
                                     {"engine": "sglang", "overlap": "sync", "detokenizer": "engine"},
                                     {"engine": "vllm-0.5"},
                                     {"engine": "vllm-v1", "overlap": "sync"}])
def test_runs_record_the_same_spans_in_the_same_order(serving, coalesced):
    a, b = both(trace_scenario("splitwise_conv.csv", 120, "6/s", serving=serving), record_spans=True)
    assert coalesced[0] > 0
    assert_same(a, b)
    sa, sb = a.spans, b.spans
    assert len(sa) == len(sb) > 0
    assert list(sa["track"]) == list(sb["track"]) and list(sa["name"]) == list(sb["name"])
    for col in ("start", "end"):
        assert np.abs(sa[col].to_numpy() - sb[col].to_numpy()).max() <= 1e-9


def test_runs_with_the_last_mile_free_copy_nothing(coalesced):
    # the counterfactual: the sampled ids are on the host at once, so no copy, no port busy time, no span
    a, b = both(trace_scenario("splitwise_conv.csv", 150, "6/s", serving={"last_mile": "free", "api_servers": 2}),
                record_spans=True)
    assert coalesced[0] > 0
    assert_same(a, b)
    assert list(a.spans["name"]) == list(b.spans["name"]) and "d2h" not in set(b.spans["name"])


@pytest.mark.parametrize("model, gpu, parallel, serving, spans", [
    ("llama-2-7b", "a100-sxm-80g", {"tp": 2}, {}, False),
    ("llama-2-7b", "a100-sxm-80g", {"tp": 2}, {}, True),
    # TP and PP: each stage's all-reduces, then its activations to the next stage, with vLLM V1's layout
    ("llama-2-70b", "h100-sxm", {"tp": 4, "pp": 2}, {"engine": "vllm-v1"}, False),
    ("llama-2-70b", "h100-sxm", {"tp": 4, "pp": 2}, {"engine": "vllm-v1"}, True),
    # DP attention's expert all-to-alls instead of all-reduces, with SGLang's own layout
    ("deepseek-v3", "h200", {"tp": 8, "expert_parallel": True, "dp_attention": True}, {"engine": "sglang"}, False)])
def test_runs_reproduce_a_sole_replicas_tp_and_pp_traffic(model, gpu, parallel, serving, spans, coalesced):
    # one replica alone on its topology books its steps' traffic on its own NVLink ports in closed form:
    # the stepped engine and the runs book the same transfers, with the same ports' busy time and spans
    raw = trace_scenario("splitwise_conv.csv", 150, "6/s", model=model, hardware={"gpu": gpu}, parallel=parallel,
                         serving=serving)
    if model == "deepseek-v3":
        raw["dtype"] = "fp8"
    a, b = both(raw, record_spans=spans)
    assert coalesced[0] > 0.5 * a.summary["steps"]
    assert_same(a, b)
    assert b.summary["breakdown_share"]["comm"] > 0
    assert b.summary["utilization"]["link:gpu1.nvlink.tx"] > 0
    if spans:
        sa, sb = a.spans, b.spans
        assert list(sa["track"]) == list(sb["track"]) and list(sa["name"]) == list(sb["name"])
        assert np.abs(sa["end"].to_numpy() - sb["end"].to_numpy()).max() <= 1e-9


def covered(serving: dict) -> float:
    """The share of steps runs cover: nearly all, but about half where a quarter of the memory keeps
    preempting (a preemption ends a run; TensorRT-LLM's profile at 0.25: 54-88% of the steps)."""
    return 0.5 if "gpu_memory_utilization" in serving else 0.9


SYNC_IN_ENGINE = {"overlap": "sync", "detokenizer": "engine", "api_server_process": "own", "stream_interval": 1}
"""The layout runs cover, set over an engine profile's own defaults."""


@pytest.mark.parametrize("engine, extra", [("vllm-v1", {}), ("sglang", {"max_sim_time": "30 s"}),
                                           ("trtllm", {"serving": {"gpu_memory_utilization": 0.25}})])
def test_runs_reproduce_engine_profiles_whose_processes_exchange_messages(engine, extra, coalesced):
    # each request's message is received on the engine's process in time order between its steps'
    # work, and each step's outputs cross to the API server as a message sent and received
    raw = trace_scenario("splitwise_conv.csv", 250, "8/s", serving={"engine": engine, **SYNC_IN_ENGINE,
                                                                    **extra.get("serving", {})})
    a, b = both(raw, **{k: v for k, v in extra.items() if k != "serving"})
    assert coalesced[0] > 0.5 * a.summary["steps"]
    assert_same(a, b)
    assert b.summary["breakdown_share"]["ipc"] > 0  # the messages were priced, not skipped


@pytest.mark.parametrize("engine, extra", [("vllm-v1", {}), ("reference", {"max_sim_time": "30 s"}),
                                           ("trtllm", {"serving": {"gpu_memory_utilization": 0.25}})])
def test_runs_reproduce_detokenization_in_the_api_server(engine, extra, coalesced):
    # vLLM V1's OutputProcessor without async scheduling: the engine sends the sampled ids on and
    # goes on; the API server receives them, detokenizes, builds the outputs and streams; the next
    # step's scheduling waits behind the message's sending; a step's outputs still on their way when
    # a run starts are delivered first
    raw = trace_scenario("splitwise_conv.csv", 250, "8/s", serving={
        "engine": engine, **SYNC_IN_ENGINE, "detokenizer": "api_server", **extra.get("serving", {})})
    a, b = both(raw, **{k: v for k, v in extra.items() if k != "serving"})
    assert coalesced[0] > covered(extra.get("serving", {})) * a.summary["steps"]
    assert_same(a, b)
    assert b.summary["breakdown_share"]["detokenize"] > 0


@pytest.mark.parametrize("engine, serving", [("vllm-v1", SYNC_IN_ENGINE), ("reference", {"detokenizer": "api_server"}),
                                            ("vllm-v1", {}), ("vllm-0.6", {}), ("reference", {"overlap": "async"}),
                                            ("trtllm", {"gpu_memory_utilization": 0.25}), ("sglang", {}),
                                            ("sglang", {"overlap": "sync"})])
@pytest.mark.parametrize("spans", [False, True])
@pytest.mark.parametrize("interval", [1, 4])
def test_runs_reproduce_several_api_servers_that_receive_or_detokenize_their_parts(engine, serving, spans, interval,
                                                                                  coalesced):
    # each API server that holds some of a step's outputs receives its part as a message (one per
    # server: the engine's sending grows with the servers it touches), detokenizes and builds it where
    # it detokenizes, then streams; its tokens' milestones are its own, not the step's; in a sync loop
    # and with a step of lag (each engine profile's own layout: vLLM V1 and TensorRT-LLM detokenize in
    # the API servers with async scheduling, vLLM 0.6 processes outputs a step late, SGLang's
    # detokenizer process sends each server its part); with a stream interval, each server's part
    # streams its requests that stream, and the held tokens carry their server's milestones
    raw = trace_scenario("splitwise_conv.csv", 250, "8/s", serving={"engine": engine, "api_servers": 3, **serving,
                                                                    "stream_interval": interval})
    a, b = both(raw, record_spans=spans, max_sim_time="40 s")
    assert coalesced[0] > covered(serving) * a.summary["steps"]
    assert_same(a, b)
    if spans:
        assert list(a.spans["track"]) == list(b.spans["track"]) and list(a.spans["name"]) == list(b.spans["name"])
        assert np.abs(a.spans["start"].to_numpy() - b.spans["start"].to_numpy()).max() <= 1e-9
        assert {"cpu:api_server1", "cpu:api_server2"} <= set(b.spans["track"])


def _shared_prefixes(serving: dict, workload: dict | None = None) -> dict:
    """Prompts sharing system prompts (workload.prefix) behind a prefix cache."""
    raw = trace_scenario("splitwise_conv.csv", 300, "6/s", serving={"prefix_caching": True, **serving})
    raw["workload"] = {"requests": 300, "arrival": "poisson", "rate": "6/s",
                       "prompt_tokens": {"dist": "uniform", "low": 100, "high": 800},
                       "output_tokens": {"dist": "uniform", "low": 1, "high": 200},
                       "prefix": {"shared_tokens": 512, "groups": 4}, **(workload or {})}
    return raw


@pytest.mark.parametrize("serving, workload, extra", [
    ({"engine": "reference"}, None, {}),
    ({"engine": "vllm-v1"}, None, {}),  # async scheduling, the API server detokenizing
    # a small pool: idle cached prefixes evicted to make room, least recently used first
    ({"engine": "reference", "gpu_memory_utilization": 0.25, "block_size": 32}, {"prefix": {"shared_tokens": 512,
                                                                                          "groups": 8, "block_tokens": 64}}, {}),
    # multi-turn sessions (each turn's prompt extends the last), two API servers, the horizon cutting a run
    ({"engine": "vllm-v1", "api_servers": 2}, {"sessions": {"turns": 4, "think_time": 5}}, {"max_sim_time": "40 s"}),
    ({"engine": "reference"}, {"sessions": {"turns": 4, "think_time": 5}, "prefix": {"shared_tokens": 256, "groups": 2}}, {}),
    # SGLang's own layout: a step's units cached once the step is processed (with its step of lag: after
    # the next step is scheduled), its detokenizer process
    ({"engine": "sglang"}, None, {}),
    ({"engine": "sglang", "gpu_memory_utilization": 0.25, "overlap": "sync"}, {"sessions": {"turns": 4, "think_time": 5}}, {}),
    ({"engine": "reference", "prefix_cache_insert": "after_step", "gpu_memory_utilization": 0.25}, None,
     {"max_sim_time": "30 s"})])
def test_runs_reproduce_a_prefix_cache(serving, workload, extra, coalesced):
    # a run looks each admitted request's cached prefix up (Scheduler.lacks), takes its blocks as the
    # scheduler does (evicting idle units where the free ones fall short), caches the units its KV
    # covers as their blocks are allocated (or once the step is processed), and gives a leaving
    # request's units back to the cache in the scheduler's order: the same hits, evictions and times
    # as stepping one event at a time
    a, b = both(_shared_prefixes(serving, workload), **extra)
    assert coalesced[0] > 0.9 * a.summary["steps"]
    assert_same(a, b)
    assert b.summary["prefix_cache"]["hit_rate"] > 0.2


def test_units_that_are_not_whole_blocks_hold_their_tokens_blocks(coalesced):
    # 16-token units in 32-token KV blocks: a request's h cached units hold ceil(16 h / 32) blocks (unit
    # 2j holds the block it shares with unit 2j + 1, which holds none), so blocks are conserved at every
    # step (they were not: each unit held a block of its own) and runs reproduce the stepped engine
    from simulator.invariants import checks_on

    raw = _shared_prefixes({"engine": "reference", "block_size": 32, "gpu_memory_utilization": 0.3},
                           {"prefix": {"shared_tokens": 512, "groups": 4, "block_tokens": 16}})
    with checks_on():
        a, b = both(raw)
    assert coalesced[0] > 0.9 * a.summary["steps"]
    assert_same(a, b)
    assert b.summary["prefix_cache"]["hit_rate"] > 0.4


def test_runs_reproduce_the_mooncake_trace_behind_a_prefix_cache(coalesced):
    raw = {"name": "mooncake", "model": "llama-3.1-8b", "dtype": "bf16", "hardware": {"gpu": "h100-sxm"},
           "serving": {"engine": "vllm-v1", "prefix_caching": True, "gpu_memory_utilization": 0.5},
           "workload": {"requests": 150, "arrival": "trace", "trace": f"{TRACES}/mooncake_conversation.jsonl",
                        "trace_time_scale": 4}}
    a, b = both(raw)
    assert coalesced[0] > 0.9 * a.summary["steps"]
    assert_same(a, b)
    assert b.summary["prefix_cache"]["evicted_units"] > 0


def _sender():
    """An engine's delivery queues alone (Engine.deliver and its pending queues), on a SimPy environment."""
    import simpy
    from collections import deque
    from simulator.pipelines.llm.engine import Engine

    class Sender:
        deliver, deliver_pending, deliver_handoffs = Engine.deliver, Engine.deliver_pending, Engine.deliver_handoffs
        _deliver_due, _drain = staticmethod(Engine._deliver_due), staticmethod(Engine._drain)

    sender = Sender()
    sender.env, sender.outputs_pending, sender.handoffs_pending = simpy.Environment(), deque(), deque()
    return sender


def test_outputs_on_their_way_are_delivered_each_once_in_order_at_their_times():
    # two steps' outputs pending at once (the second sent while the first is still on its way)
    sender, log = _sender(), []

    def steps(env):
        sender.deliver(2.0, lambda now: log.append(("first", now, env.now)))
        yield env.timeout(1.0)
        sender.deliver(3.0, lambda now: log.append(("second", now, env.now)))
        sender.deliver(0.5, lambda now: log.append(("due already", now, env.now)))
        # entries to a separate detokenizer, in their own queue: one due before the outputs pending
        sender.deliver(1.5, lambda now: log.append(("entries", now, env.now)), sender.handoffs_pending)

    sender.env.process(steps(sender.env))
    sender.env.run()
    assert log == [("due already", 1.0, 1.0), ("entries", 1.5, 1.5), ("first", 2.0, 2.0), ("second", 3.0, 3.0)]
    assert not sender.outputs_pending and not sender.handoffs_pending


def test_pending_deliveries_made_early_keep_their_times_and_order():
    # a run that starts delivers what is on its way first: the entries to the detokenizer (which send
    # outputs on), then the outputs, each at the time it was due; their timeouts then find nothing
    sender, log = _sender(), []

    def on_entries(now):
        log.append(("entries", now))
        sender.deliver(now + 1.0, lambda at: log.append(("outputs", at)))

    def steps(env):
        sender.deliver(2.0, on_entries, sender.handoffs_pending)
        sender.deliver(2.5, lambda at: log.append(("older outputs", at)))
        yield env.timeout(1.0)
        sender.deliver_pending()
        log.append(("run starts", env.now))

    sender.env.process(steps(sender.env))
    sender.env.run()
    assert log == [("entries", 2.0), ("older outputs", 2.5), ("outputs", 3.0), ("run starts", 1.0)]


@pytest.mark.parametrize("serving, extra", [
    ({"engine": "vllm-v1"}, {}),  # its own layout: async scheduling, the API server detokenizing, messages
    ({"engine": "vllm-v1", "gpu_memory_utilization": 0.2}, {"rate": "20/s"}),  # preemptions end runs
    ({"engine": "vllm-v1"}, {"max_sim_time": "30 s"}),
    ({"engine": "reference", "overlap": "async"}, {"record_spans": True}),  # detokenizing in the engine
    ({"engine": "trtllm", "max_batched_tokens": 512, "max_batch": 16}, {}),
    ({"engine": "vllm-0.6"}, {}),  # async output processing: the loop waits for the step it launched
    ({"engine": "vllm-0.6", "gpu_memory_utilization": 0.2}, {"rate": "20/s", "max_sim_time": "20 s"})])
def test_runs_reproduce_async_scheduling(serving, extra, coalesced):
    # the loop launches step k, then processes step k-1: a request's last token's step is followed by
    # one more in its batch (the token dropped), its blocks freed after that step's scheduling; a run
    # processes the step in flight when it starts and leaves its own last step in flight
    raw = trace_scenario("splitwise_conv.csv", 250, extra.pop("rate", "8/s"), serving=serving)
    a, b = both(raw, **extra)
    assert coalesced[0] > 0.9 * a.summary["steps"]
    assert_same(a, b)
    if extra.get("record_spans"):
        assert list(a.spans["name"]) == list(b.spans["name"])
        assert np.abs(a.spans["start"].to_numpy() - b.spans["start"].to_numpy()).max() <= 1e-9


@pytest.mark.parametrize("serving, extra", [
    ({"engine": "sglang"}, {}),  # its own layout: the overlap scheduler, messages, the detokenizer process
    ({"engine": "sglang", "stream_interval": 3, "gpu_memory_utilization": 0.2}, {"rate": "20/s"}),  # tokens held
    ({"engine": "sglang", "overlap": "sync"}, {"max_sim_time": "30 s"}),
    ({"engine": "reference", "overlap": "async_output", "detokenizer": "separate", "stream_interval": 2}, {}),
    ({"engine": "sglang", "last_mile": "free", "overlap": "async_output"}, {})])  # hand-overs that cost nothing
def test_runs_reproduce_a_separate_detokenizer(serving, extra, coalesced):
    # SGLang's DetokenizerManager: the engine builds the streaming requests' entries and sends them
    # on; the detokenizer receives them, decodes every token held since its last message, builds the
    # outputs and sends them to the API server; entries still on their way when a run starts are
    # delivered first; the next step's scheduling waits behind the hand-over
    raw = trace_scenario("splitwise_conv.csv", 200, extra.pop("rate", "8/s"), serving=serving)
    a, b = both(raw, record_spans=True, **extra)
    assert coalesced[0] > 0.9 * a.summary["steps"]
    assert_same(a, b)
    assert list(a.spans["track"]) == list(b.spans["track"]) and list(a.spans["name"]) == list(b.spans["name"])
    assert np.abs(a.spans["start"].to_numpy() - b.spans["start"].to_numpy()).max() <= 1e-9
    if serving.get("last_mile") != "free":
        assert "cpu:detokenizer0" in set(b.spans["track"])


@pytest.mark.parametrize("extra", [{}, {"max_sim_time": "30 s"}])
def test_runs_reproduce_the_api_server_in_the_engine_process(extra, coalesced):
    # vLLM 0.5: one clock for tokenization, the steps' work and the streams; a step's scheduling
    # waits behind the stream of the step before it (the wait is the stream's, in the breakdown)
    raw = trace_scenario("splitwise_conv.csv", 250, "8/s", serving={"engine": "vllm-0.5"})
    a, b = both(raw, **extra)
    assert coalesced[0] > 0.5 * a.summary["steps"]
    assert_same(a, b)
    assert b.summary["breakdown_share"]["stream"] > 0


@pytest.mark.parametrize("serving", [{"stream_interval": 4},
                                     # messages carry the streaming requests' entries alone; a small KV pool
                                     {"engine": "sglang", "overlap": "sync", "detokenizer": "engine", "stream_interval": 8,
                                      "gpu_memory_utilization": 0.25},
                                     # the API server detokenizes every token, builds and streams the chunks
                                     {"engine": "vllm-v1", "overlap": "sync", "stream_interval": 3},
                                     # a step of lag: vLLM V1's own layout; vLLM 0.6's async output processing
                                     {"engine": "vllm-v1", "stream_interval": 8},
                                     {"engine": "vllm-0.6", "overlap": "async_output", "stream_interval": 3,
                                      "gpu_memory_utilization": 0.25}])
def test_runs_reproduce_a_stream_interval(serving, coalesced):
    # a request streams its first token, its last and every N-th since its last chunk; the tokens it
    # holds back meanwhile are rows of their own (buffered), and its chunks carry them
    a, b = both(trace_scenario("splitwise_conv.csv", 200, "8/s", serving=serving), record_spans=True)
    assert coalesced[0] > 0.5 * a.summary["steps"]
    assert_same(a, b)
    assert list(a.spans["name"]) == list(b.spans["name"])
    assert np.abs(a.spans["start"].to_numpy() - b.spans["start"].to_numpy()).max() <= 1e-9
    # a chunk carries about N tokens: the gap between chunks is several tokens' time
    assert b.summary["itl_ms"]["mean"] > 2 * b.summary["tpot_ms"]["mean"]


@pytest.mark.parametrize("change", [{"serving.multi_step": 4},
                                    # a stream interval with the API server in the engine's process
                                    {"serving.stream_interval": 4, "serving.api_server_process": "engine"},
                                    {"parallel.replicas": 2},
                                    # TP on PCIe with async scheduling: a step's all-reduces overlap the
                                    # previous step's copy on the port they share, as flows
                                    {"hardware.gpu": "l40s", "dtype": "fp8", "parallel.tp": 2,
                                     "serving.overlap": "async"},
                                    # a host KV tier on its own link: admissions load swapped-out KV back
                                    {"serving.kv_offload": {"capacity": "64 GiB", "link": "pcie5-x16"}}])
def test_ineligible_setups_step_one_by_one(change, coalesced):
    assert load_scenario(trace_scenario("splitwise_conv.csv", 10)).coalesce_decode  # on by default
    simulator.run(trace_scenario("splitwise_conv.csv", 150), change)
    assert coalesced[0] == 0


@pytest.mark.parametrize("model, tp, pp, extra", [
    ("llama-2-7b", 1, 1, {}), ("mixtral-8x7b", 2, 1, {}), ("llama-2-70b", 4, 2, {}),
    ("gpt-oss-20b", 1, 1, {}), ("gpt-oss-20b", 2, 3, {"parallel": {"expert_parallel": True}}),  # sliding windows
    ("gpt-oss-20b", 4, 1, {"parallel": {"expert_parallel": True, "expert_skew": 1.2, "eplb": True,
                                        "redundant_experts": 4}}),
    ("deepseek-v3", 8, 1, {"dtype": "fp8", "hardware": {"gpu": "h200"}}),  # MLA, shared experts, dense layers
    ("deepseek-v3", 8, 1, {"dtype": "fp8", "hardware": {"gpu": "h200"},
                           "parallel": {"expert_parallel": True, "dp_attention": True}})])
def test_decode_time_is_the_step_cost_to_the_last_bit(model, tp, pp, extra):
    from simulator.pipelines.llm.pools import build_cost

    cost = build_cost(load_scenario({"model": model, **extra, "parallel": {"tp": tp, "pp": pp, **extra.get("parallel", {})},
                                     "workload": {"prompt_tokens": 100, "output_tokens": 10}}))
    rng = np.random.default_rng(0)
    n = rng.integers(1, 300, 50)
    ctx = (n * rng.integers(10, 4000, 50)).astype(float) + n
    got = [cost.decode_time(float(c), int(k)) for c, k in zip(ctx, n)]
    want = [cost.step(float(c), int(k)).compute for c, k in zip(ctx, n)]
    assert got == want


@st.composite
def covered_set_ups(draw):
    """A one-replica scenario drawn from the settings closed-form runs cover (``run_support``): CPU
    costs, inter-process messages, where the API server runs and who detokenizes, async scheduling, batch and token
    budgets, block sizes, API servers, chunked prefill, a small KV pool that preempts, the decode
    attention layout, the SSE chunk sizes, the counterfactual's free last mile, a prefix cache over
    shared system prompts, TP over NVLink; arrivals and token counts drawn too."""
    gpu = draw(st.sampled_from(["a100-sxm-80g", "h100-sxm", "l40s"]))
    long_prompts = draw(st.booleans())
    ipc = draw(st.booleans())  # requests and outputs cross between processes as messages
    detokenizer = draw(st.sampled_from(["engine", "api_server", "separate"]))  # where the sampled ids are detokenized
    # the API server's own process or the engine's (one clock; it detokenizes in the engine there)
    process = "own" if detokenizer != "engine" else draw(st.sampled_from(["own", "engine"]))
    # the overlapped loops: a step of lag
    overlap = "sync" if process == "engine" else draw(st.sampled_from(["sync", "async", "async_output"]))
    serving = {"engine": "reference", **SYNC_IN_ENGINE,  # the CPU costs are drawn over the reference profile's
               "api_server_process": process, "detokenizer": detokenizer, "overlap": overlap,
               "max_batch": draw(st.sampled_from([8, 32, 128])),
               "max_batched_tokens": draw(st.sampled_from([512, 2048, 8192])),
               # several API servers (in their own processes), with messages or detokenizing
               "block_size": draw(st.sampled_from([16, 32])), "api_servers": 1 if process == "engine"
               else draw(st.integers(1, 3)),
               "chunked_prefill": draw(st.booleans()),
               "gpu_memory_utilization": draw(st.sampled_from([0.9, 0.3])),
               "decode_attention": draw(st.sampled_from(["paged", "contiguous"])),
               "chunk_bytes_per_token": draw(st.sampled_from([24.0, 200.0])),
               "last_mile": draw(st.sampled_from(["modelled", "free"]))}
    cpu = {"base": "reference", **{key: f"{draw(st.sampled_from([0.0, 3.0, 40.0]))} us" for key in
                                   ("schedule_per_step", "tokenize_per_token", "detokenize_per_token", "stream_per_chunk",
                                    "schedule_per_request", "detokenize_step_fixed", "output_per_request",
                                    "stream_entry_per_request")}}
    if ipc:
        cpu.update(ipc_per_message=f"{draw(st.sampled_from([0.0, 0.6, 20.0]))} us", ipc_per_byte="4 ns",
                   ipc_bytes_per_request=draw(st.sampled_from([0, 64, 2000])))
    if process == "own":  # a stream interval
        serving["stream_interval"] = draw(st.sampled_from([1, 2, 8]))
    if not serving["chunked_prefill"]:
        serving["max_batched_tokens"] = 8192  # whole prompts must fit the budget
    prefix = {}
    if draw(st.booleans()):  # prompts sharing system prompts, behind a prefix cache
        serving["prefix_caching"] = True
        serving["prefix_cache_insert"] = draw(st.sampled_from(["allocate", "after_step"]))
        prefix = {"prefix": {"shared_tokens": draw(st.sampled_from([64, 400])), "groups": draw(st.integers(1, 4)),
                             "block_tokens": draw(st.sampled_from([16, 24, 64]))}}
    # tensor parallelism over NVLink: the step's all-reduces booked on the replica's own ports
    tp = 1 if gpu == "l40s" else draw(st.sampled_from([1, 2]))
    return {"name": "random", "model": draw(st.sampled_from(["llama-2-7b", "llama-3-8b"])),
            "record_spans": draw(st.booleans()), "parallel": {"tp": tp},
            "dtype": "fp8" if gpu == "l40s" else "fp16", "hardware": {"gpu": gpu, "cpu": cpu}, "serving": serving,
            "seed": draw(st.integers(0, 1000)),
            "workload": {"requests": 100, "arrival": draw(st.sampled_from(["poisson", "gamma"])),
                         "rate": f"{draw(st.floats(2, 30)):.2f}/s",
                         "prompt_tokens": {"dist": "uniform", "low": 10, "high": 1500 if long_prompts else 500},
                         "output_tokens": {"dist": "uniform", "low": 1, "high": 300}, **prefix}}


def _check_drawn(raw: dict, coalesced) -> None:
    """A drawn set-up stepped one by one and in runs: the same results (and spans, where recorded),
    some steps in runs."""
    before = coalesced[0]
    a, b = both(raw, record_spans=raw["record_spans"])
    assert_same(a, b)
    if raw["record_spans"]:
        sa, sb = a.spans, b.spans
        assert list(sa["track"]) == list(sb["track"]) and list(sa["name"]) == list(sb["name"])
        assert np.abs(sa["start"].to_numpy() - sb["start"].to_numpy()).max(initial=0.0) <= 1e-9
    assert coalesced[0] > before


@hsettings(max_examples=12, deadline=None, print_blob=True, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=covered_set_ups())
def test_runs_reproduce_randomly_drawn_covered_set_ups(raw, coalesced):
    # runs admit requests (whole prompts, chunks, the budget's last tokens), end where the cache
    # runs out (a small pool preempts) and take preempted requests back as they are re-admitted
    _check_drawn(raw, coalesced)


@hsettings(max_examples=6, deadline=None, print_blob=True, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=covered_set_ups(), servers=st.integers(2, 4))
def test_runs_reproduce_randomly_drawn_set_ups_with_several_api_servers(raw, servers, coalesced):
    # the covered set-ups above, each with 2-4 API servers in their own processes: each server's part
    # of a step's outputs is received, detokenized and streamed on its own clock, in time order with
    # its tokenizations
    serving = raw["serving"]
    if serving["api_server_process"] == "engine":
        serving["detokenizer"], serving["api_server_process"] = "api_server", "own"
    serving["api_servers"] = servers
    _check_drawn(raw, coalesced)


@pytest.mark.parametrize("coalesce", [False, True])
def test_a_request_whose_last_chunk_is_on_its_way_at_the_horizon_is_not_complete(coalesce, coalesced):
    # with a step of lag and a stream interval, the engine finishes a request a step before its last
    # chunk leaves, and its held tokens' rows come before that chunk: at the horizon such a request was
    # counted complete with its E2E at its last chunk received, while its breakdown ran to its held
    # tokens (BREAKDOWN_SUMS broke); complete now means the client received the whole response
    from simulator.invariants import checks_on

    raw = trace_scenario("splitwise_conv.csv", 250, "8/s", serving={"overlap": "async", "stream_interval": 4})
    with checks_on():
        r = simulator.run(raw, {"coalesce_decode": coalesce, "max_sim_time": "40 s", "record_spans": False},
                          last_mile_cost=False)
    assert r.summary["status"] == "truncated" and 0 < r.summary["requests_completed"] < 250
    done = r.requests[r.requests["completed"]]
    assert len(done) == r.summary["requests_completed"] and done["e2e_s"].notna().all()
