"""workload.trace_repeat: a trace replayed again and again when more requests are asked than it has rows."""

from __future__ import annotations

import numpy as np
import pytest

import simulator
from simulator.config.loader import load_scenario
from simulator.config.trace import repeat_period, repeated_arrivals
from simulator.errors import ConfigError
from simulator.workloads.arrivals import make_requests

# 4 rows: span 3.0 s, mean gap 1.0 s, so a repetition's period is 4.0 s.
ROWS = [(10.0, 100, 5), (11.0, 200, 6), (11.5, 300, 7), (13.0, 400, 8)]


@pytest.fixture
def tiny_trace(tmp_path):
    path = tmp_path / "tiny.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                    + "".join(f"{t},{p},{o}\n" for t, p, o in ROWS))
    return path


def _scenario(trace, **workload):
    return {"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
            "workload": {"trace": str(trace), "arrival": "trace", **workload}}


def _specs(trace, seed=0, **workload):
    sc = load_scenario(_scenario(trace, **workload))
    return make_requests(sc.workload, np.random.default_rng(seed), sc.model.context_length)


def test_tokens_cycle_through_the_rows(tiny_trace):
    s = _specs(tiny_trace, requests=10, trace_repeat=True)
    assert s.prompt.tolist() == [100, 200, 300, 400, 100, 200, 300, 400, 100, 200]
    assert s.output.tolist() == [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]


def test_trace_times_shift_by_span_plus_mean_gap_per_repetition(tiny_trace):
    s = _specs(tiny_trace, requests=10, trace_repeat=True)
    # repetition k at row time - 10 + k x (3 + 3/3) = row time - 10 + 4k
    assert s.arrival.tolist() == [0.0, 1.0, 1.5, 3.0, 4.0, 5.0, 5.5, 7.0, 8.0, 9.0]
    assert np.all(np.diff(s.arrival) > 0)


def test_trace_time_scale_scales_the_repeated_times(tiny_trace):
    s = _specs(tiny_trace, requests=6, trace_repeat=True, trace_time_scale=0.5)
    assert s.arrival.tolist() == [0.0, 0.5, 0.75, 1.5, 2.0, 2.5]


def test_closed_form_helpers():
    at = np.array([10.0, 11.0, 11.5, 13.0])
    assert repeat_period(at) == 4.0
    assert repeat_period(np.array([7.0])) == 0.0
    assert repeated_arrivals(at, 9).tolist() == [0.0, 1.0, 1.5, 3.0, 4.0, 5.0, 5.5, 7.0, 8.0]


def test_synthetic_arrivals_cycle_only_the_tokens(tiny_trace):
    s = _specs(tiny_trace, requests=9, trace_repeat=True, arrival="constant", rate=2.0)
    assert s.arrival.tolist() == [i / 2.0 for i in range(9)]
    assert s.prompt.tolist() == [100, 200, 300, 400, 100, 200, 300, 400, 100]
    p1 = _specs(tiny_trace, seed=3, requests=9, trace_repeat=True, arrival="poisson", rate=2.0)
    p2 = _specs(tiny_trace, seed=3, requests=9, trace_repeat=True, arrival="poisson", rate=2.0)
    np.testing.assert_array_equal(p1.arrival, p2.arrival)
    np.testing.assert_array_equal(p1.prompt, p2.prompt)
    assert p1.output.tolist() == [5, 6, 7, 8, 5, 6, 7, 8, 5]


def test_within_the_rows_repeat_changes_nothing(tiny_trace):
    a = _specs(tiny_trace, requests=3)
    b = _specs(tiny_trace, requests=3, trace_repeat=True)
    np.testing.assert_array_equal(a.arrival, b.arrival)
    np.testing.assert_array_equal(a.prompt, b.prompt)
    assert a.arrival.tolist() == [0.0, 1.0, 1.5]


def test_too_few_rows_without_repeat_is_an_error_naming_the_key(tiny_trace):
    with pytest.raises(ConfigError) as exc:
        load_scenario(_scenario(tiny_trace, requests=5))
    msg = str(exc.value)
    assert "5 requests asked of trace tiny.csv, which has 4 rows" in msg
    assert "set workload.requests to at most 4" in msg
    assert "workload.trace_repeat: true" in msg


def test_repeated_span_beyond_the_horizon_bound_is_an_error(tiny_trace):
    with pytest.raises(ConfigError, match="trace_time_scale"):
        load_scenario(_scenario(tiny_trace, requests=10_000_000, trace_repeat=True, trace_time_scale=1e6))


def test_a_repeated_trace_runs_end_to_end_and_deterministically(tiny_trace):
    sc = _scenario(tiny_trace, requests=12, trace_repeat=True)
    a = simulator.run(sc)
    b = simulator.run(sc)
    assert a.summary["requests_completed"] == 12
    assert a.summary == b.summary
