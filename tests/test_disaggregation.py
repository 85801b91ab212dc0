"""Prefill/decode disaggregation: KV transfers on the link, the breakdown identity, TTFT, errors."""

from __future__ import annotations

import numpy as np
import pytest

import simulator as sim
from simulator.errors import ConfigError
from simulator.observe.records import LLM_CATEGORIES
from simulator.pipelines.llm import serving

BASE = {
    "name": "pd", "model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
    "disaggregation": {"prefill": {"replicas": 1}, "decode": {"replicas": 1}, "kv_link": "ib-400g",
                       "transfer": "whole"},
    "workload": {"requests": 60, "rate": 6, "prompt_tokens": 2000, "output_tokens": 50},
}


def scenario(**over):
    return sim.load_scenario(BASE, overrides=over)


def system(sc):
    """The deployment after its run (its table holds every request's times)."""
    return serving.run_deployment(sc)


def test_one_transfer_takes_latency_plus_bytes_over_the_links_bandwidth():
    s = system(scenario(**{"workload.requests": 1}))
    t, link = s.table, s.handoff.link
    nbytes = 2000 * 2 * 32 * 8 * 128 * 2  # prompt x K,V x layers x KV heads x head dim x bf16
    assert s.handoff.transfer_bytes(0, 0.0, link.bandwidth) == nbytes
    assert t.kv_end[0] - t.kv_start[0] == pytest.approx(link.latency + nbytes / link.bandwidth, rel=1e-12)
    # the transfer starts after the prefill replica's step and ends before the decode replica's first
    decode = s.engines[1]
    assert t.replica[0] == decode.index == 1
    assert t.tok_end[0] < t.kv_start[0] < t.kv_end[0] < t.first_R[0]


def test_the_breakdown_sums_to_e2e_for_every_request_and_has_the_transfer():
    r = sim.run(BASE)
    b = r.breakdown
    assert list(b.columns[:-1]) == list(LLM_CATEGORIES)
    np.testing.assert_allclose(b[list(LLM_CATEGORIES)].sum(axis=1), b["e2e_s"], rtol=0, atol=1e-9)
    assert (b.to_numpy() >= -1e-12).all()
    assert r.summary["breakdown_share"]["kv_transfer"] > 0
    assert r.summary["disaggregation"]["bytes_total"] == pytest.approx(60 * 2000 * 131072)


def test_a_slow_kv_link_raises_ttft_by_the_extra_transfer_time():
    fast = sim.run(BASE, overrides={"workload.requests": 1})
    slow = sim.run(BASE, overrides={"workload.requests": 1, "disaggregation.kv_link": "eth-100g"})
    extra = slow.summary["disaggregation"]["transfer_ms"]["mean"] - fast.summary["disaggregation"]["transfer_ms"]["mean"]
    assert extra > 10  # 262 MB at 11.25 GB/s instead of 45 GB/s
    assert slow.summary["ttft_ms"]["mean"] - fast.summary["ttft_ms"]["mean"] == pytest.approx(extra, rel=1e-6)
    assert slow.summary["breakdown_share"]["kv_transfer"] > fast.summary["breakdown_share"]["kv_transfer"]


def test_layer_by_layer_sending_hides_the_transfer_behind_the_prefill():
    whole = sim.run(BASE, overrides={"workload.requests": 1})
    layered = sim.run(BASE, overrides={"workload.requests": 1, "disaggregation.transfer": "layerwise"})
    w, lw = (x.summary["disaggregation"]["transfer_ms"]["mean"] for x in (whole, layered))
    assert lw < w
    assert lw >= w / 32 - 1e-9  # at least the last layer's KV is sent after the prefill


def test_transfers_show_on_the_link_tracks_of_both_gpus():
    r = sim.run(BASE, overrides={"workload.requests": 3})
    tracks = set(r.spans["track"])
    assert {"link:gpu0.kv.tx", "link:gpu1.kv.rx"} <= tracks


def test_requests_prefill_on_the_prefill_pool_and_decode_on_the_decode_pool():
    r = sim.run(BASE, overrides={"disaggregation.prefill.replicas": 2, "disaggregation.decode.replicas": 2,
                                 "serving.router": "least_outstanding"})
    assert set(r.requests["replica"]) <= {2, 3}  # every request ends on a decode replica
    assert r.summary["requests_completed"] == 60


def test_deterministic():
    a, b = sim.run(BASE), sim.run(BASE)
    assert a.summary == b.summary


@pytest.mark.parametrize("over, path", [
    ({"model": "llama-3-70b"}, "disaggregation.prefill.tp"),
    ({"model": "llama-3-70b", "disaggregation.prefill.tp": 4}, "disaggregation.decode.tp"),
    ({"parallel.tp": 2}, "parallel.tp"),
    ({"disaggregation.kv_link": {"base": "ib-400g", "bandwidth": 0}}, "disaggregation.kv_link.bandwidth"),
])
def test_bad_layouts_are_one_line_errors(over, path):
    with pytest.raises(ConfigError) as exc:
        sim.run(BASE, overrides=over)
    assert exc.value.path == path
    assert "\n" not in str(exc.value)
