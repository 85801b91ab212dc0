"""Speculative decoding: verify steps of k + 1 tokens, accepted drafts plus the bonus per step, the
proposers' costs, KV slots of rejected drafts released, chunks of several tokens, errors."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest

import simulator as sim
from simulator.errors import ConfigError
from simulator.pipelines.llm import pools, serving
from simulator.pipelines.llm.scheduler import Scheduler
from simulator.pipelines.llm.speculative import SPEC_METHODS, NgramProposer, alpha_for, expected_tokens
from simulator.validate import discover

from test_llm_scheduler import settings, table

N = 100  # output tokens of the single request
K = 4
BASE = {
    "name": "spec", "model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
    "serving": {"speculative": {"method": "ngram", "tokens": K, "acceptance": 1.0}},
    "workload": {"requests": 1, "prompt_tokens": 64, "output_tokens": N},
}


def run(**over):
    return sim.run(BASE, overrides=over)


def system(**over):
    """Build and run the deployment, returning it (its engines and table stay readable)."""
    return serving.run_deployment(sim.load_scenario(BASE, overrides=over))


def test_full_acceptance_emits_k_plus_one_tokens_per_step():
    # the prefill step gives the first token; every verify step then gives k + 1 (the last, the rest)
    r = run()
    assert r.summary["steps"] == 1 + math.ceil((N - 1) / (K + 1))
    assert r.summary["speculative"]["acceptance_length"] == (N - 1) / math.ceil((N - 1) / (K + 1))
    assert r.summary["speculative"]["draft_acceptance_rate"] == 1.0


def test_zero_acceptance_emits_one_token_per_step_at_more_than_a_plain_steps_cost():
    spec = run(**{"serving.speculative.acceptance": 0.0})
    plain = run(**{"serving.speculative": None})
    assert spec.summary["steps"] == plain.summary["steps"] == N
    assert spec.summary["speculative"]["acceptance_length"] == 1.0
    assert spec.summary["tpot_ms"]["mean"] > plain.summary["tpot_ms"]["mean"]


def test_a_per_position_list_accepts_the_leading_positions():
    r = run(**{"serving.speculative.acceptance": [1.0, 1.0, 0.0, 1.0]})  # the third always fails
    assert r.summary["steps"] == 1 + math.ceil((N - 1) / 3)


def test_a_verify_steps_gpu_time_is_the_target_over_k_plus_one_tokens_per_request():
    s = system()
    eng = s.engines[0]
    spans = s.recorder.frame()
    gpu = spans[(spans["track"] == "gpu0") & spans["name"].str.startswith("step")].sort_values("start")
    took = (gpu["end"] - gpu["start"]).to_numpy()
    prompt = 64
    for i in range(1, len(took)):
        comp = prompt + (i - 1) * (K + 1)  # computed tokens before verify step i
        want = eng.cost.step(comp + K + 1, 1, (), K + 1, decode_queries=K + 1).compute
        assert took[i] == pytest.approx(want, rel=1e-12)


def test_a_draft_model_adds_its_passes_to_each_step():
    over = {"serving.speculative": {"method": "draft", "draft_model": "qwama-0.5b", "tokens": K, "acceptance": 1.0}}
    sc = sim.load_scenario(BASE, overrides=over)
    target = pools.build_cost(sc)
    proposer = SPEC_METHODS["draft"].build(sc, target)
    comp = np.array([100])
    first = proposer.cost.step(100 + K + 1, 1, (), 1, decode_queries=K + 1).compute
    rest = sum(proposer.cost.step(100 + K + 1 + j, 1, (), 1).compute for j in range(1, K))
    assert proposer.gpu_time(comp, [], 1, K) == pytest.approx(first + rest, rel=1e-12)
    drafted, ngram = sim.run(BASE, overrides=over), run()
    assert drafted.summary["steps"] == ngram.summary["steps"]
    assert drafted.summary["tpot_ms"]["mean"] > ngram.summary["tpot_ms"]["mean"]


def test_an_eagle_head_costs_one_target_layer_and_the_lm_head_per_pass():
    sc = sim.load_scenario(BASE, overrides={"serving.speculative": {"method": "eagle", "tokens": K}})
    target = pools.build_cost(sc)
    head = SPEC_METHODS["eagle"].build(sc, target).cost
    assert head.shape.layers == 1 and head.shape.hidden == target.shape.hidden
    assert head.head_time(8) == target.head_time(8)
    assert head.linear_time(8) == pytest.approx(target.linear_time(8) / target.shape.layers, rel=1e-12)


def test_ngram_drafting_is_cpu_time_on_the_engine():
    p = NgramProposer()
    assert p.gpu_time(np.array([100]), [], 1, K) == 0.0
    assert p.cpu_time(np.array([100, 300]), K) == pytest.approx(2 * p.PER_REQUEST + 400 * p.PER_TOKEN)


def test_a_chunk_carries_the_steps_tokens():
    r = run()
    verify_steps = math.ceil((N - 1) / (K + 1))
    gaps = r.itl
    # one gap per chunk after the first (the per-token view adds a zero for each further token of a chunk)
    assert len(gaps) == verify_steps and (gaps > 0).all()
    assert r.summary["speculative"]["itl_per_chunk_ms"]["mean"] == pytest.approx(gaps.mean() * 1e3)
    assert r.summary["itl_ms"] == r.summary["speculative"]["itl_per_chunk_ms"]
    assert r.summary["itl_per_token_ms"]["mean"] == pytest.approx(gaps.sum() / (N - 1) * 1e3)


def test_the_scheduler_budgets_and_allocates_k_plus_one_tokens_per_decode():
    t = table([14, 14, 14], outputs=[50, 50, 50])
    s = Scheduler(t, settings(3 * 14), kv_blocks=100)
    s.lookahead = K
    for rid in range(3):
        s.waiting.append(rid)
    b = s.schedule()
    for rid, p, n in b.chunks:
        t.computed[rid] = p + n
    assert [n for *_, n in b.chunks] == [14, 14, 14] and list(t.blocks) == [1, 1, 1]
    s.sv = settings(12)  # room for two decodes of 1 + 4 tokens
    b = s.schedule()
    assert list(b.decode) == [0, 1]
    assert list(t.blocks) == [2, 2, 1]  # 14 + 5 tokens need two 16-token blocks


def test_rejected_drafts_release_their_kv_blocks():
    s = system(**{"workload.requests": 8, "workload.rate": 100.0, "serving.speculative.acceptance": 0.3,
                  "serving.block_size": 4})
    t, eng = s.table, s.engines[0]
    assert t.finished.all() and eng.sched.kv_free == eng.sched.kv_total
    assert eng.runs is None  # decode runs in closed form are off: a step's tokens are draws


def test_deterministic_and_seeded():
    over = {"serving.speculative.acceptance": 0.6, "workload.requests": 5}
    a, b = run(**over), run(**over)
    assert a.summary == b.summary
    c = run(**over, seed=1)
    assert c.summary["speculative"]["acceptance_length"] != a.summary["speculative"]["acceptance_length"]


def test_default_acceptance_is_the_methods_published_mean_accepted_tokens():
    for method in SPEC_METHODS.values():
        d = method.default
        assert expected_tokens(np.full(d.k, d.alpha)) == pytest.approx(d.tau, rel=1e-9)
    assert alpha_for(1.0, 4) == pytest.approx(0.0, abs=1e-9) and alpha_for(5.0, 4) == pytest.approx(1.0)


@pytest.mark.parametrize("over, path, words", [
    ({"serving.speculative.method": "medusa"}, "serving.speculative.method", "draft"),
    ({"serving.speculative": {"method": "draft", "tokens": 4}}, "serving.speculative.draft_model", "draft_model"),
    ({"serving.speculative": {"method": "draft", "tokens": 4, "draft_model": "qwama-05b"}},
     "serving.speculative.draft_model", "did you mean 'qwama-0.5b'"),
    ({"serving.speculative": {"method": "draft", "tokens": 4, "draft_model": "llama-2-7b"}},
     "serving.speculative.draft_model", "vocabulary"),
    ({"model": "llama-3-70b", "parallel.tp": 4,
      "serving.speculative": {"method": "draft", "tokens": 4, "draft_model": "qwama-0.5b"}},
     "serving.speculative.draft_tp", "draft_tp"),
    ({"serving.speculative.tokens": 0}, "serving.speculative.tokens", ""),
    ({"serving.speculative.tokens": 17}, "serving.speculative.tokens", ""),
    ({"serving.speculative.acceptance": 1.5}, "serving.speculative.acceptance", ""),
    ({"serving.speculative.acceptance": [0.5, 0.5]}, "serving.speculative.acceptance", "one per draft token"),
    ({"serving.speculative.draft_model": "qwama-0.5b"}, "serving.speculative.draft_model", "method: draft"),
    ({"serving.multi_step": 8}, "serving.multi_step", "multi-step"),
])
def test_bad_speculative_settings_are_one_line_errors(over, path, words):
    with pytest.raises(ConfigError) as exc:
        run(**over)
    assert exc.value.path.startswith(path), exc.value.path
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_the_validation_family_carries_the_reference_csvs_figures():
    ref = Path(__file__).resolve().parents[1] / "scenarios" / "validation" / "reference" / "speculative_decoding.csv"
    with open(ref) as f:
        rows = {r["id"]: r for r in csv.DictReader(f)}
    fam = next(f for f in discover() if f.name == "speculative_decoding")
    checked = [c for c in fam.cases if c.measured]
    assert len(checked) == 13
    for case in checked:
        (metric, value), = case.measured.items()
        row = rows[case.note.split(":")[0]]
        want = (float(row["value"]) / float(row["baseline_value"]) if metric == "e2e_ratio" else float(row["value"]))
        assert value == pytest.approx(want, abs=5e-5), case.name


def test_the_drafters_weights_and_kv_cache_take_from_the_kv_pool():
    sc = sim.load_scenario(BASE, overrides={"serving.speculative": {"method": "draft", "draft_model": "qwama-0.5b",
                                                                    "tokens": K}})
    target = pools.build_cost(sc)
    draft = SPEC_METHODS["draft"].build(sc, target).cost
    plain_blocks, _ = pools.kv_capacity(sim.load_scenario(BASE, overrides={"serving.speculative": None}), target)
    blocks, memory = pools.kv_capacity(sc, target)
    assert memory["weights_gib"] * 2**30 == pytest.approx(target.weight_bytes_per_gpu() + draft.weight_bytes_per_gpu())
    per_block = (target.kv_bytes_per_token_per_gpu() + draft.kv_bytes_per_token_per_gpu()) * 16
    assert blocks == int((memory["kv_cache_gib"] * 2**30) // per_block) < plain_blocks
