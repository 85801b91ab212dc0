"""Request pipelines (kind ``pipeline``): closed forms for chains, parallel branches, streaming and
cache hits; the breakdown identity; one-line errors for bad graphs; determinism."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.api import load_scenario, simulate
from simulator.errors import ConfigError
from simulator.report.text import format_summary


def scenario(stages, resources=None, **top):
    raw = {"kind": "pipeline", "record_spans": False,
           "resources": resources or {"host": {"kind": "cpu", "cores": 4}, "web": {"kind": "service"}},
           "stages": stages, "workload": {"requests": 1, "arrival": "all_at_once"}, **top}
    return load_scenario(raw)


def e2e(stages, **kw):
    r = simulate(scenario(stages, **kw))
    return r, float(r.requests["e2e_s"].iloc[0])


def test_a_two_stage_chain_takes_the_sum_of_its_stages():
    r, t = e2e({"a": {"resource": "host", "time": "3 ms"}, "b": {"resource": "web", "after": ["a"], "time": "7 ms"}})
    assert t == pytest.approx(0.010, abs=1e-15)
    assert r.requests["critical_path"].iloc[0] == "a > b"
    assert list(r.breakdown.iloc[0][["a", "b"]]) == pytest.approx([0.003, 0.007], abs=1e-15)


def test_two_parallel_branches_take_the_max():
    r, t = e2e({"a": {"resource": "host", "time": "2 ms"},
                "left": {"resource": "web", "after": ["a"], "time": "30 ms"},
                "right": {"resource": "host", "after": ["a"], "time": "5 ms"},
                "join": {"resource": "host", "after": ["left", "right"], "time": "1 ms"}})
    assert t == pytest.approx(0.002 + 0.030 + 0.001, abs=1e-15)
    assert r.requests["critical_path"].iloc[0] == "a > left > join"
    assert r.breakdown.iloc[0]["right"] == 0.0


def test_streaming_starts_the_consumer_at_the_kth_output_and_ends_it_after_the_producer():
    base = {"search": {"resource": "web", "time": "40 ms", "outputs": 10},
            "rerank": {"resource": "host", "after": ["search"], "time": "15 ms"}}
    _, serial = e2e(base)
    assert serial == pytest.approx(0.055, abs=1e-15)
    streamed = {**base, "rerank": {**base["rerank"], "stream_from": {"stage": "search", "outputs": 2}}}
    r, t = e2e(streamed)
    # ready at the 2nd of 10 outputs (8 ms), own time 15 ms -> 23 ms, held to the producer's 40 ms end
    assert t == pytest.approx(0.040, abs=1e-15)
    assert r.breakdown.iloc[0]["search"] == pytest.approx(0.008, abs=1e-15)
    long = {**streamed, "rerank": {**streamed["rerank"], "time": "50 ms"}}
    assert e2e(long)[1] == pytest.approx(0.058, abs=1e-15)


def test_a_cache_hit_skips_the_stage():
    stages = {"a": {"resource": "host", "time": "3 ms"},
              "b": {"resource": "web", "after": ["a"], "time": "7 ms", "cache_hit_rate": 1.0}}
    r, t = e2e(stages)
    assert t == pytest.approx(0.003, abs=1e-15)
    assert bool(r.requests["b.cache_hit"].iloc[0]) and r.summary["stages"]["b"]["cache_hits"] == 1


def test_a_cpu_pool_queues_when_its_cores_are_busy():
    """Three 10 ms tasks at once on two cores: the third waits 10 ms for a core (FCFS)."""
    sc = scenario({"a": {"resource": "host", "time": "10 ms"}},
                  resources={"host": {"kind": "cpu", "cores": 2}},
                  workload={"requests": 3, "arrival": "all_at_once"})
    r = simulate(sc)
    assert list(r.requests["e2e_s"]) == pytest.approx([0.01, 0.01, 0.02], abs=1e-15)
    assert list(r.requests["a.wait_s"]) == pytest.approx([0, 0, 0.01], abs=1e-15)


CHEAP_RAG = {
    "embed": {"resource": "host", "time": {"dist": "lognormal", "median": "4 ms", "sigma": 0.4}},
    "search": {"resource": "host", "after": ["embed"], "time": {"dist": "lognormal", "median": "6 ms", "sigma": 0.5},
               "outputs": 20},
    "web": {"resource": "web", "after": ["embed"], "time": {"dist": "uniform", "low": "50 ms", "high": "150 ms"},
            "cache_hit_rate": 0.4},
    "rerank": {"resource": "host", "after": ["search", "web"], "time": "8 ms",
               "stream_from": {"stage": "search", "outputs": 5}},
    "assemble": {"resource": "host", "after": ["rerank"], "time": "1 ms"},
    "generate": {"resource": "llm", "after": ["assemble"], "static_prefix_tokens": 256,
                 "prompt_tokens": {"dist": "uniform", "low": 32, "high": 128}, "output_tokens": 4, "early_start": True},
}
TINY_LLM = {"kind": "llm", "model": {"base": "llama-3-8b", "layers": 2}, "serving": {"prefix_caching": True}}
RAG_RESOURCES = {"host": {"kind": "cpu", "cores": 2}, "web": {"kind": "service"}, "llm": TINY_LLM}


def rag(seed=3, **over):
    return simulate(scenario({**CHEAP_RAG, **over}, resources=RAG_RESOURCES,
                             workload={"requests": 1000, "arrival": "poisson", "rate": "60/s"}, seed=seed))


@pytest.fixture(scope="module")
def rag_run():
    return rag()


def test_the_breakdown_sums_to_e2e_for_every_request(rag_run):
    bd = rag_run.breakdown
    assert len(bd) == 1000 and rag_run.summary["status"] == "ok"
    stages = [c for c in bd.columns if c != "e2e_s"]
    np.testing.assert_allclose(bd[stages].sum(axis=1), bd["e2e_s"], rtol=1e-12, atol=1e-15)
    assert (bd[stages] >= -1e-15).all().all()
    assert sum(rag_run.summary["breakdown_share"].values()) == pytest.approx(1.0)
    # the two cores queue: some requests waited for one
    assert rag_run.summary["stages"]["search"]["wait_ms"]["p99"] > 0
    assert "where E2E goes" in format_summary(rag_run)
    # the client's TTFT is the generating call's first token; the call keeps its ten categories
    req = rag_run.requests
    assert (req["ttft_s"] < req["e2e_s"]).all()
    cats = [f"generate.{c}_s" for c in ("queue", "schedule", "prefill", "decode", "comm", "d2h", "detokenize",
                                        "output", "ipc", "stream")]
    np.testing.assert_allclose(req[cats].sum(axis=1), req["generate.time_s"], rtol=1e-9)
    llm = rag_run.summary["llm"]["llm"]
    assert llm["calls"] == 2000 and llm["calls_completed"] == 2000
    assert llm["prefix_saved_tokens"] == 1000 * 256  # every call found its warm-up's prefix


def test_same_seed_same_run_and_another_seed_differs(rag_run):
    again = rag()
    assert again.summary == rag_run.summary
    assert again.requests.equals(rag_run.requests)
    assert rag(seed=4).summary["e2e_ms"] != rag_run.summary["e2e_ms"]


def test_a_cache_rate_changes_no_other_draw():
    """Each switch is measurable on its own: the cache draws do not shift the other stages' draws."""
    res = {**RAG_RESOURCES, "host": {"kind": "cpu", "cores": 64}}
    w = {"requests": 50, "arrival": "poisson", "rate": "5/s"}
    off = simulate(scenario(CHEAP_RAG, resources=res, workload=w))
    on = simulate(scenario({**CHEAP_RAG, "web": {**CHEAP_RAG["web"], "cache_hit_rate": 0.9}}, resources=res, workload=w))
    ran = ~on.requests["web.cache_hit"] & ~off.requests["web.cache_hit"]
    np.testing.assert_array_equal(on.requests["embed.time_s"], off.requests["embed.time_s"])
    np.testing.assert_array_equal(on.requests["web.time_s"][ran], off.requests["web.time_s"][ran])


def test_a_closed_loop_keeps_its_users_busy():
    sc = scenario({"a": {"resource": "web", "time": "10 ms"}}, workload={"requests": 6, "arrival": "closed",
                                                                         "concurrency": 2})
    r = simulate(sc)
    assert list(r.requests["arrival_s"]) == pytest.approx([0, 0, 0.01, 0.01, 0.02, 0.02], abs=1e-15)


@pytest.mark.parametrize("stages,path,words", [
    ({"a": {"resource": "host", "time": "1 ms", "after": ["b"]}, "b": {"resource": "host", "time": "1 ms", "after": ["a"]},
      "c": {"resource": "host", "time": "1 ms", "after": ["a"]}}, "stages.", "cycle: "),
    ({"a": {"resource": "host", "time": "1 ms", "after": ["a"]}}, "stages.a.after", "cycle: a -> a"),
    ({"a": {"resource": "host", "time": "1 ms"}, "b": {"resource": "host", "time": "1 ms", "after": ["aa"]}},
     "stages.b.after.0", "no stage 'aa' (did you mean 'a'?)"),
    ({"a": {"resource": "hots", "time": "1 ms"}}, "stages.a.resource", "no resource 'hots' (did you mean 'host'?)"),
    ({"a": {"resource": "host"}}, "stages.a.time", "a cpu stage needs time"),
    ({"a": {"resource": "host", "time": "1 ms", "prompt_tokens": 5}}, "stages.a.prompt_tokens", "takes no"),
    ({"a": {"resource": "host", "time": "1 ms"}, "b": {"resource": "host", "time": "1 ms"}}, "output", "2 sinks"),
    ({"a": {"resource": "host", "time": "1 ms"}, "b": {"resource": "host", "time": "1 ms", "after": ["a"],
                                                     "stream_from": {"stage": "c"}}},
     "stages.b.stream_from.stage", "not in this stage's after"),
    ({"a": {"resource": "host", "time": "1 ms", "outputs": 3},
      "b": {"resource": "host", "time": "1 ms", "after": ["a"], "stream_from": {"stage": "a", "outputs": 4}}},
     "stages.b.stream_from.outputs", "fewer than 4"),
    ({"a": {"resource": "host", "time": {"dist": "lognormal", "median": "1 ms"}}}, "stages.a.time", "needs sigma"),
])
def test_bad_graphs_are_one_line_errors(stages, path, words):
    with pytest.raises(ConfigError) as err:
        scenario(stages)
    assert str(err.value.path).startswith(path) and words in err.value.message and "\n" not in str(err.value)


def test_a_cycle_is_named_stage_by_stage():
    with pytest.raises(ConfigError) as err:
        scenario({"x": {"resource": "host", "time": "1 ms", "after": ["z"]},
                  "y": {"resource": "host", "time": "1 ms", "after": ["x"]},
                  "z": {"resource": "host", "time": "1 ms", "after": ["y"]},
                  "out": {"resource": "host", "time": "1 ms", "after": ["x"]}})
    assert "x -> y -> z -> x" in err.value.message or "y -> z -> x -> y" in err.value.message \
        or "z -> x -> y -> z" in err.value.message


def _early_start(on: bool):
    """One request: a 1 s search, then a call of 2,048 static + 512 retrieved prompt tokens."""
    return simulate(scenario({"search": {"resource": "host", "time": "1 s"},
                              "generate": {"resource": "llm", "after": ["search"], "static_prefix_tokens": 2048,
                                           "prompt_tokens": 512, "output_tokens": 16, "early_start": on}},
                             resources={"host": {"kind": "cpu"}, "llm": {"kind": "llm", "model": "llama-3-8b",
                                                                         "serving": {"prefix_caching": True}}},
                             record_spans=True))


def test_early_start_removes_exactly_the_prefill_of_the_static_prefix():
    off, on = _early_start(False), _early_start(True)

    def main_prefill(r):  # the GPU time of the call's prefill step (the last prefill on the GPU)
        sp = r.spans[(r.spans.track == "llm/gpu0") & (r.spans.category == "prefill")]
        return float(sp.end.iloc[-1] - sp.start.iloc[-1])

    saved = main_prefill(off) - main_prefill(on)  # 2,560 prompt tokens prefilled vs 512 after 2,048 cached
    assert saved > 0
    assert off.requests["e2e_s"][0] - on.requests["e2e_s"][0] == pytest.approx(saved, abs=1e-12)
    assert off.requests["ttft_s"][0] - on.requests["ttft_s"][0] == pytest.approx(saved, abs=1e-12)
    assert on.requests["critical_path"][0] == off.requests["critical_path"][0] == "search > generate"
    assert on.summary["llm"]["llm"]["prefix_saved_tokens"] == 2048


def test_stages_on_one_llm_resource_share_its_engine():
    """Two calls at once on one deployment are batched by one engine: both arrive at its queue."""
    stages = {"a": {"resource": "llm", "prompt_tokens": 64, "output_tokens": 8},
              "b": {"resource": "llm", "prompt_tokens": 64, "output_tokens": 8},
              "join": {"resource": "host", "after": ["a", "b"], "time": "1 ms"}}
    res = {"host": {"kind": "cpu"}, "llm": {"kind": "llm", "model": {"base": "llama-3-8b", "layers": 2}}}
    r = simulate(scenario(stages, resources=res))
    assert r.summary["llm"]["llm"]["calls"] == 2
    assert r.requests["a.time_s"][0] != r.requests["b.time_s"][0]  # the API server serves one first
    assert r.breakdown.iloc[0]["join"] == pytest.approx(0.001, abs=1e-15)


@pytest.mark.parametrize("stage,res,path,words", [
    ({"resource": "llm", "prompt_tokens": 64, "output_tokens": 8, "static_prefix_tokens": 32, "early_start": True},
     {}, "stages.g.early_start", "prefix_caching: true"),
    ({"resource": "llm", "prompt_tokens": 64, "output_tokens": 8, "early_start": True},
     {"serving": {"prefix_caching": True}}, "stages.g.early_start", "set static_prefix_tokens"),
    ({"resource": "llm", "prompt_tokens": 8000, "output_tokens": 500}, {}, "stages.g.prompt_tokens", "context"),
    ({"resource": "llm", "prompt_tokens": 64}, {}, "stages.g.output_tokens", "needs output_tokens"),
    ({"resource": "llm", "prompt_tokens": 64, "output_tokens": 8}, {"parallel": {"tp": 3}}, "resources.llm.parallel.tp",
     "does not divide"),
    ({"resource": "llm", "prompt_tokens": 64, "output_tokens": 8}, {"serving": {"max_btch": 3}},
     "resources.llm.serving.max_btch", "did you mean 'max_batch'"),
])
def test_bad_llm_stages_are_one_line_errors(stage, res, path, words):
    with pytest.raises(ConfigError) as err:
        scenario({"g": stage}, resources={"llm": {"kind": "llm", "model": "llama-3-8b", **res}})
    assert err.value.path == path and words in err.value.message and "\n" not in str(err.value)


def test_a_stage_too_long_for_the_context_is_told_to_shorten_its_calls():
    # a stage's calls have no distribution to cap and no prompts to cut: the fix a workload gets
    # (set max, truncate_prompt) is not offered, only the one that applies
    with pytest.raises(ConfigError) as err:
        scenario({"g": {"resource": "llm", "prompt_tokens": 8000, "output_tokens": 500}},
                 resources={"llm": {"kind": "llm", "model": "llama-3-8b"}})
    assert err.value.message.endswith("; lower them") and "over_context" not in err.value.message
    assert err.value.fix == "lower them" and "8,000" in err.value.problem


@pytest.mark.parametrize("name", ["rag", "agent", "image"])
def test_the_built_in_examples_run(name):
    from pathlib import Path

    from simulator.api import run

    path = Path(__file__).resolve().parents[1] / "scenarios" / "pipeline" / f"{name}.yaml"
    r = run(path, {"workload.requests": 12, "record_spans": False})
    assert r.summary["status"] == "ok" and r.summary["requests_completed"] == 12
    np.testing.assert_allclose(r.breakdown.drop(columns="e2e_s").sum(axis=1), r.breakdown["e2e_s"], rtol=1e-12)


def _small_llm_run(**over):
    raw = {"a": {"resource": "host", "time": "10 ms"},
           "g": {"resource": "llm", "after": ["a"], "prompt_tokens": 100, "output_tokens": 20}}
    raw["g"].update(over.pop("g", {}))
    return simulate(scenario(raw, resources={"host": {"kind": "cpu"}, "llm": {"kind": "llm", "model": {
        "base": "llama-3-8b", "layers": 2}}}, workload={"requests": 30, "arrival": "poisson", "rate": "5/s"}, **over))


def test_a_run_cut_by_max_sim_time_says_so():
    s = _small_llm_run(max_sim_time="2 s").summary
    assert s["status"] == "truncated" and 0 < s["requests_completed"] < 30 and s["llm"]["llm"]["calls"] == 30


def test_an_llm_stage_that_always_hits_its_cache_makes_no_call():
    r = _small_llm_run(g={"cache_hit_rate": 1.0})
    assert r.summary["status"] == "ok" and r.summary["llm"]["llm"]["calls"] == 0
    np.testing.assert_allclose(r.requests["e2e_s"], r.requests["a.time_s"], rtol=0, atol=1e-12)
    assert "llm llm: 0/0 calls" in format_summary(r)


DIT = {"model": "pixart-alpha", "resolution": 512, "steps": 4, "delivery": {"format": "png"}}


def test_a_dit_stage_takes_what_the_dit_path_takes_alone():
    """One image after a 5 ms CPU stage: the DiT stage's time is the kind: dit run's latency."""
    alone = simulate(load_scenario({"kind": "dit", **DIT, "record_spans": False,
                                    "workload": {"requests": 1, "arrival": "closed", "concurrency": 1}}))
    r = simulate(scenario({"prep": {"resource": "host", "time": "5 ms"},
                           "render": {"resource": "gpu", "after": ["prep"]}},
                          resources={"host": {"kind": "cpu"}, "gpu": {"kind": "dit", **DIT}}))
    assert r.requests["render.time_s"][0] == pytest.approx(alone.summary["latency_s"]["p50"], rel=1e-12)
    assert r.requests["e2e_s"][0] == pytest.approx(0.005 + alone.summary["latency_s"]["p50"], rel=1e-12)
    assert r.summary["dit"]["gpu"]["breakdown_share"] == pytest.approx(alone.summary["breakdown_share"])
    assert r.requests["render.encode_s"][0] > 0


def test_images_queue_for_a_dit_deployment():
    r = simulate(scenario({"render": {"resource": "gpu"}}, resources={"gpu": {"kind": "dit", **DIT}},
                          workload={"requests": 2, "arrival": "all_at_once"}))
    wait = r.requests["render.wait_s"]
    assert wait[0] == 0 and wait[1] > 0  # the second waits for the first image's server time
    with pytest.raises(ConfigError) as err:
        scenario({"render": {"resource": "gpu"}}, resources={"gpu": {"kind": "dit", **DIT, "parallel": {"ulysses": 3}}})
    assert err.value.path == "resources.gpu.parallel.ulysses"


def test_the_rag_transformations_take_what_their_closed_forms_say():
    """Notebook 6's experiment at 2 users (no CPU queueing): before the call, the serial hybrid chain
    takes embed + vector search + keyword search (84.2 ms) + re-rank (19 ms); run in parallel with
    the 84.2 ms keyword search, the ~5 ms vector path leaves 84.2 + 19 ms; a re-ranker that streams
    from the keyword search ends with it, 19 ms sooner."""
    from simulator.report import experiments as E

    picked = {k: E.RAG_TRANSFORMS[k] for k in ("baseline (serial)", "parallel retrievers", "streaming re-rank")}
    rows = E.rag_transformations(users=(2,), transforms=picked, per_user=3).set_index("transform")
    serial, parallel, streamed = (rows.loc[k, "steady_pre_llm_ms"] for k in picked)
    assert serial > 84.2 + 19.0
    assert parallel == pytest.approx(84.2 + 19.0, abs=1e-9)
    assert serial - streamed == pytest.approx(19.0, abs=1e-9)
    assert (rows["completed"] == 6).all() and (rows["steady_requests"] == 4).all()
