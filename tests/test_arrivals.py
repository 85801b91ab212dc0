"""One arrival module for every kind: burstiness is the CV of the gaps, the first arrival is at 0."""

from __future__ import annotations

import numpy as np
import pytest

import simulator
from simulator.config.loader import load_scenario
from simulator.workloads.arrivals import ARRIVALS, arrival_times, open_loop_arrivals

DIT = "scenarios/dit/flux-1024-h100-pipefusion-ulysses.yaml"


def _workload(**kw):
    return load_scenario({"workload": {"requests": 20000, **kw}}).workload


@pytest.mark.parametrize("cv", [0.5, 1.0, 2.0])
def test_gamma_burstiness_is_the_coefficient_of_variation(cv):
    w = _workload(arrival="gamma", rate=10.0, burstiness=cv)
    gaps = np.diff(arrival_times(w, w.requests, np.random.default_rng(1)))
    assert gaps.mean() == pytest.approx(0.1, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.05)


@pytest.mark.parametrize("kind", ["poisson", "gamma", "constant", "all_at_once"])
def test_every_open_loop_process_starts_at_zero(kind):
    w = _workload(arrival=kind, rate=4.0, burstiness=0.5)
    times = arrival_times(w, 10, np.random.default_rng(0))
    assert times[0] == 0.0 and np.all(np.diff(times) >= 0)


def test_constant_gaps_are_exact_multiples():
    w = _workload(arrival="constant", rate=4.0)
    assert arrival_times(w, 5, np.random.default_rng(0)).tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_closed_is_not_open_loop_and_trace_is_not_a_process():
    assert open_loop_arrivals(_workload(arrival="closed", concurrency=2), np.random.default_rng(0)) is None
    assert "trace" not in ARRIVALS


@pytest.mark.parametrize("arrival", [{"arrival": "poisson", "rate": 0.5},
                                     {"arrival": "gamma", "rate": 0.5, "burstiness": 2.0}])
def test_llm_and_dit_draw_the_same_arrivals_from_the_same_seed(arrival):
    """The same workload section and seed give the same arrival times on both kinds."""
    over = {f"workload.{k}": v for k, v in arrival.items()} | {"workload.requests": 3, "seed": 7}
    llm = simulator.run(overrides={**over, "workload.prompt_tokens": 16, "workload.output_tokens": 4})
    dit = simulator.run(DIT, overrides={**over, "steps": 2})
    a = llm.requests["arrival_s"].to_numpy()
    b = np.sort(dit.requests["arrival_s"].to_numpy())
    assert a[0] == 0.0
    np.testing.assert_array_equal(a, b)
