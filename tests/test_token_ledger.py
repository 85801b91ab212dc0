"""The token ledger folds each step's output rows into per-request totals as they are made; the
totals equal a walk over every row kept to the end (the metrics' other path) to rounding."""

from __future__ import annotations

import numpy as np
import pytest

import simulator
import simulator.pipelines.llm.serving as serving
from simulator.observe.token_ledger import FOLD_ROWS, TokenLedger


class KeepEveryRow(TokenLedger):
    def __init__(self, table, steps, keep_rows=False, capacity=1024):
        super().__init__(table, steps, True, capacity)


def both(monkeypatch, scenario, overrides):
    """The run with every row kept and walked at the end (all steps kept too), and as it runs."""
    from simulator.observe.columns import Columns, RingColumns

    out = []
    for ledger, steps in ((KeepEveryRow, Columns), (TokenLedger, RingColumns)):
        monkeypatch.setattr(serving, "TokenLedger", ledger)
        monkeypatch.setattr(serving, "RingColumns", steps)
        out.append(simulator.run(scenario, overrides))
    return out


@pytest.mark.parametrize("scenario, overrides", [
    ("scenarios/llm/benchmark_splitwise_a100.yaml", {"workload.requests": 1200}),   # folds several buffers
    (None, {"serving.overlap": "async", "serving.detokenizer": "api_server", "serving.stream_interval": 4}),
    ("scenarios/llm/benchmark_splitwise_a100.yaml", {"workload.requests": 300, "workload.rate": "20/s",
                                                     "serving.gpu_memory_utilization": 0.2, "max_sim_time": "30 s"}),
    ("scenarios/llm/llama3_70b_tp4_h100.yaml", {"workload.requests": 40}),
])
def test_folded_totals_are_the_row_walk(monkeypatch, scenario, overrides):
    walked, folded = both(monkeypatch, scenario, {**overrides, "record_spans": True})
    a, b = walked.breakdown.to_numpy(), folded.breakdown.to_numpy()
    assert a.shape == b.shape and a.size
    np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(np.sort(folded.itl), np.sort(walked.itl))
    for key in ("last_mile_share", "itl_last_mile_share"):
        assert folded.summary[key] == pytest.approx(walked.summary[key], rel=1e-12)
    assert folded.summary["breakdown_share"] == pytest.approx(walked.summary["breakdown_share"], rel=1e-12)
    assert folded.summary["itl_ms"] == pytest.approx(walked.summary["itl_ms"], rel=1e-12)
    assert len(folded.spans) == len(walked.spans)


def test_the_benchmark_folds_more_rows_than_one_buffer(monkeypatch):
    sizes = []
    flush = TokenLedger.flush

    def counting(self):
        sizes.append(self.buffer.size if self.buffer is not None else 0)
        flush(self)

    monkeypatch.setattr(TokenLedger, "flush", counting)
    # step by step (decode runs fold their rows as they are made, without the buffer)
    simulator.run("scenarios/llm/benchmark_splitwise_a100.yaml", {"workload.requests": 1200, "record_spans": False,
                                                                   "coalesce_decode": False})
    assert max(sizes) >= FOLD_ROWS and len([s for s in sizes if s]) > 1


def test_a_separate_detokenizer_hands_each_requests_rows_over_in_step_order(monkeypatch):
    # its outputs reach the API server a message later than the engine made them, while the engine
    # goes on: the tokens a stream interval holds back and the prefill chunks of later steps wait for
    # them (here the detokenizer lags steps behind), so the ledger folds as it goes (it keeps no row)
    made, order = [], {}
    init, extend = TokenLedger.__init__, TokenLedger.extend

    def spy(self, *a, **k):
        init(self, *a, **k)
        made.append(self)

    def log(self, n, **row):
        reqs, steps = (np.broadcast_to(np.asarray(row[c]), (n,)) for c in ("req", "step"))
        for r, st in zip(reqs.tolist(), steps.tolist()):
            order.setdefault(r, []).append(st)
        return extend(self, n, **row)

    monkeypatch.setattr(TokenLedger, "__init__", spy)
    monkeypatch.setattr(TokenLedger, "extend", log)
    simulator.run(None, {"serving.detokenizer": "separate", "serving.overlap": "async", "serving.stream_interval": 3,
                         "serving.max_batched_tokens": 256, "workload.requests": 40, "coalesce_decode": False,
                         "hardware.cpu": {"base": "reference", "detokenize_step_fixed": "30 ms"}},  # a slow detokenizer
                  last_mile_cost=False)
    assert made[0].rows is None and made[0].buffer is not None
    assert sum(len(v) for v in order.values()) > 400
    assert all(steps == sorted(steps) for steps in order.values())


def test_past_the_exact_store_the_itl_percentiles_come_from_the_sketch(monkeypatch):
    import simulator.observe.token_ledger as ledger

    raw = ("scenarios/llm/benchmark_splitwise_a100.yaml", {"workload.requests": 600, "record_spans": False})
    exact = simulator.run(*raw)
    monkeypatch.setattr(ledger, "EXACT_GAPS", 5_000)  # spill into the sketch many times over
    monkeypatch.setattr(ledger, "FOLD_ROWS", 4_096)
    sketched = simulator.run(*raw)
    assert exact.summary.get("itl_quantile_error") is None and exact.itl is not None
    assert sketched.summary["itl_quantile_error"] == 1e-3 and sketched.itl is None
    a, b = exact.summary["itl_ms"], sketched.summary["itl_ms"]
    assert b["mean"] == pytest.approx(a["mean"], rel=1e-9)
    for q in ("p50", "p90", "p99"):
        # within the sketch's relative error of an order statistic next to numpy's interpolation
        assert b[q] == pytest.approx(a[q], rel=2e-3)
    sa, sb = exact.summary["itl_stalls"], sketched.summary["itl_stalls"]
    assert sb["p99_over_p50"] == pytest.approx(sa["p99_over_p50"], rel=5e-3)
    assert sb["gaps_over_2x_median"] == pytest.approx(sa["gaps_over_2x_median"], rel=0.02)
    # everything else is untouched by where the gaps live
    assert sketched.summary["breakdown_share"] == exact.summary["breakdown_share"]
    assert sketched.summary["tpot_ms"] == exact.summary["tpot_ms"]


def test_with_spans_off_the_steps_live_in_a_ring_and_the_totals_do_not_move(monkeypatch):
    import simulator.observe.columns as columns

    raw = ("scenarios/llm/benchmark_splitwise_a100.yaml", {"workload.requests": 400, "record_spans": False})
    walked, _ = both(monkeypatch, *raw)
    small = columns.RingColumns.__init__.__defaults__
    monkeypatch.setattr(columns.RingColumns.__init__, "__defaults__", (1024,))  # fold every 512 steps
    folded = simulator.run(*raw)
    monkeypatch.setattr(columns.RingColumns.__init__, "__defaults__", small)
    np.testing.assert_allclose(folded.breakdown.to_numpy(), walked.breakdown.to_numpy(), rtol=1e-12, atol=1e-15)
    assert folded.summary["steps"] == walked.summary["steps"] > 2048
    assert folded.summary["itl_ms"] == pytest.approx(walked.summary["itl_ms"], rel=1e-12)


def test_ring_columns_hold_the_last_rows_by_their_absolute_numbers():
    from simulator.observe.columns import RingColumns

    ring = RingColumns({"x": "f8"}, capacity=4)
    ring.extend(3, x=[0.0, 1.0, 2.0])
    assert ring.append(x=3.0) == 3
    ring.extend(3, x=[4.0, 5.0, 6.0])  # wraps
    assert ring.size == 7 and ring.oldest() == 3
    assert ring["x"][[3, 4, 5, 6]].tolist() == [3.0, 4.0, 5.0, 6.0]
    ring.set("x", 5, 50.0)
    assert ring["x"][5] == 50.0
    with pytest.raises(ValueError):
        ring.extend(5, x=0.0)
