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
    out = []
    for ledger in (KeepEveryRow, TokenLedger):
        monkeypatch.setattr(serving, "TokenLedger", ledger)
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
    simulator.run("scenarios/llm/benchmark_splitwise_a100.yaml", {"workload.requests": 1200, "record_spans": False})
    assert max(sizes) >= FOLD_ROWS and len([s for s in sizes if s]) > 1


def test_a_separate_detokenizer_keeps_every_row(monkeypatch):
    made = []
    init = TokenLedger.__init__

    def spy(self, *a, **k):
        init(self, *a, **k)
        made.append(self)

    monkeypatch.setattr(TokenLedger, "__init__", spy)
    simulator.run(None, {"serving.detokenizer": "separate", "workload.requests": 20})
    simulator.run(None, {"serving.detokenizer": "engine", "workload.requests": 20})
    assert made[0].rows is not None and made[0].buffer is None
    assert made[1].rows is None and made[1].buffer is not None
