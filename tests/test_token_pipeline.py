"""Token-level pipeline: causal LLM slices are unequal, DiT slices are equal, balancing helps."""

from __future__ import annotations

import pytest

from simulator.config.loader import load_scenario
from simulator.errors import ConfigError
from simulator.api import simulate
from simulator.report.text import format_summary


def run(model, slicing, tokens=32768, pp=4, slices=8):
    return simulate(load_scenario({
        "kind": "token_pipeline", "model": model, "sequence_tokens": tokens,
        "parallel": {"pp": pp}, "slices": slices, "slicing": slicing,
        "hardware": {"gpu": "a100-sxm-80g"}})).summary


def test_uniform_causal_leaves_more_bubble_than_dit_and_balanced_recovers_most():
    causal = run("llama-3-8b", "uniform")
    balanced = run("llama-3-8b", "balanced")
    dit = run("pixart-alpha", "uniform")
    assert causal["slice_cost_spread"] > 1.5
    assert dit["slice_cost_spread"] == pytest.approx(1.0, abs=0.02)
    assert causal["bubble_fraction"] > dit["bubble_fraction"]
    gap = causal["bubble_fraction"] - dit["bubble_fraction"]
    assert causal["bubble_fraction"] - balanced["bubble_fraction"] > 0.7 * gap
    assert balanced["latency_s"]["p50"] < causal["latency_s"]["p50"]
    assert sum(balanced["slice_tokens"]) == 32768 and len(balanced["slice_tokens"]) == 8
    # later causal slices are shorter
    assert balanced["slice_tokens"][0] > balanced["slice_tokens"][-1]


def test_equal_slices_bubble_matches_closed_form_for_dit():
    s = run("pixart-alpha", "uniform", tokens=16384, pp=4, slices=16)
    assert s["bubble_fraction"] == pytest.approx(3 / (16 + 3), rel=0.1)
    assert len(s["utilization"]["gpu"]) == 4


def test_text_summary_and_errors():
    res = simulate(load_scenario({"kind": "token_pipeline", "model": "llama-3-8b",
                                  "hardware": {"gpu": "a100-sxm-80g"}}))
    assert "bubble" in format_summary(res)
    with pytest.raises(ConfigError) as exc:
        load_scenario({"kind": "token_pipeline", "model": "llama-3-8b", "slices": 0,
                       "hardware": {"gpu": "a100-sxm-80g"}})
    assert exc.value.path == "slices"
    with pytest.raises(ConfigError) as exc:
        load_scenario({"kind": "token_pipeline", "model": "llama-3-8b", "parallel": {"pp": 64},
                       "hardware": {"gpu": "a100-sxm-80g"}})
    assert exc.value.path == "parallel.pp"
