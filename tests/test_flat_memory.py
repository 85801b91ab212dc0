"""Memory that follows the requests in flight, not the run's length: request-table columns that are
windows over the ids, requests retired to a store on disk as they finish, spans written to disk as
they are made. Every test compares against the same run held whole in memory."""

from __future__ import annotations

import mmap
import warnings

import numpy as np
import pandas as pd
import pytest

import simulator
import simulator.observe.paged as paged
import simulator.observe.spans as spans_mod
import simulator.observe.token_ledger as ledger
from simulator.observe.paged import Arrivals, Window
from simulator.observe.perfetto import trace_events
from simulator.observe.request_store import RequestStore
from simulator.observe.spans import SpanRecorder

BENCH = "scenarios/llm/benchmark_splitwise_a100.yaml"


def test_a_window_prepares_ids_a_chunk_at_a_time_and_releases_whole_chunks(monkeypatch):
    monkeypatch.setattr(paged, "CHUNK", mmap.PAGESIZE // 8)  # a page of float64 per chunk
    c = paged.CHUNK
    w = Window(4 * c)
    times = w.column(float, np.nan)
    counts = w.column(np.int64)
    arrivals = Arrivals(np.arange(4.0 * c), w)
    assert w.prepared == 0
    assert arrivals[c + 3] == c + 3  # reading an arrival prepares past it
    assert w.prepared == 3 * c and np.isnan(times[: 3 * c]).all() and not counts[: 3 * c].any()
    times[: 3 * c] = 1.0
    w.release(c + 5)  # only the whole first chunk
    assert w.released == c
    if paged._MAPPABLE:
        assert not times[:c].any()  # handed back: reads as fresh pages
    assert (times[c: 3 * c] == 1.0).all()
    arrivals[4 * c - 1] = 0.5  # setting one prepares too
    assert w.prepared == 4 * c and np.isnan(times[3 * c:]).all()


def test_the_request_store_reads_back_ranges_of_columns_in_order():
    store = RequestStore({"a": "f8", "b": "i4"})
    store.append(3, a=[1.0, 2.0, 3.0], b=7)
    store.append(2, a=np.array([4.0, 5.0]), b=np.array([8, 9]))
    assert store.size == 5
    np.testing.assert_array_equal(store.column("a"), [1, 2, 3, 4, 5])
    np.testing.assert_array_equal(store.column("b", 2, 4), [7, 8])
    assert list(store.chunks(2)) == [(0, 2), (2, 4), (4, 5)]


def _retiring(monkeypatch):
    """Retire after a few steps, a small chunk of ids at a time; count the retirements made while running."""
    monkeypatch.setattr(ledger, "RETIRE_LAG", 16)
    monkeypatch.setattr(paged, "CHUNK", 64)
    seen, ending = [], []
    retire, finish = ledger.TokenLedger._retire, ledger.TokenLedger.finish

    def spy(self, lo, hi, *a, **k):
        seen.append((not ending, lo, hi))
        return retire(self, lo, hi, *a, **k)

    def spy_finish(self, *a, **k):
        ending.append(True)
        return finish(self, *a, **k)

    monkeypatch.setattr(ledger.TokenLedger, "_retire", spy)
    monkeypatch.setattr(ledger.TokenLedger, "finish", spy_finish)
    return seen


@pytest.mark.parametrize("overrides", [
    {"workload.requests": 1200},
    {"workload.requests": 300, "workload.rate": "20/s", "serving.gpu_memory_utilization": 0.2,
     "max_sim_time": "30 s"},  # preemptions, and requests cut short at the end
    {"workload.requests": 400, "serving.overlap": "async", "serving.stream_interval": 3},
    {"workload.requests": 400, "parallel.replicas": 2, "serving.multi_step": 8},  # steps of two engines
])
def test_retiring_requests_while_running_changes_no_result(monkeypatch, overrides):
    monkeypatch.setattr(ledger, "FOLD_ROWS", 2048)  # fold (and retire) often, in both runs
    whole = simulator.run(BENCH, {**overrides, "record_spans": False}, last_mile_cost=False)
    seen = _retiring(monkeypatch)
    retired = simulator.run(BENCH, {**overrides, "record_spans": False}, last_mile_cost=False)
    assert any(running for running, _, _ in seen)  # some retired while the run went on
    assert [hi for _, _, hi in seen] == sorted(hi for _, _, hi in seen)  # in id order
    assert retired.summary == whole.summary
    pd.testing.assert_frame_equal(retired.requests, whole.requests)
    pd.testing.assert_frame_equal(retired.breakdown, whole.breakdown)
    np.testing.assert_array_equal(retired.itl, whole.itl)


def test_a_closed_loop_sets_each_arrival_before_its_request_runs(monkeypatch):
    raw = (None, {"workload.arrival": "closed", "workload.concurrency": 8, "workload.requests": 300})
    monkeypatch.setattr(ledger, "FOLD_ROWS", 2048)
    whole = simulator.run(*raw, last_mile_cost=False)
    seen = _retiring(monkeypatch)
    retired = simulator.run(*raw, last_mile_cost=False)
    assert any(running for running, _, _ in seen)
    assert retired.summary == whole.summary
    pd.testing.assert_frame_equal(retired.requests, whole.requests)


def test_spans_written_to_disk_give_the_same_trace_and_frame(monkeypatch, tmp_path):
    raw = (BENCH, {"workload.requests": 150, "record_spans": True})
    held = simulator.run(*raw, last_mile_cost=False)
    assert not held.trace_events.spans.segments  # fewer than SPILL_SPANS: all still in the lists
    monkeypatch.setattr(spans_mod, "SPILL_SPANS", 1000)  # many segments while running
    spilled = simulator.run(*raw, last_mile_cost=False)
    assert len(spilled.trace_events.spans.segments) > 20
    held.write(tmp_path / "a", figures=False)
    spilled.write(tmp_path / "b", figures=False)
    assert (tmp_path / "a" / "trace.json").read_bytes() == (tmp_path / "b" / "trace.json").read_bytes()
    pd.testing.assert_frame_equal(spilled.spans, held.spans)


def test_a_recorder_read_back_is_the_frame_it_was_given(monkeypatch):
    monkeypatch.setattr(spans_mod, "SPILL_SPANS", 3)
    rec = SpanRecorder()
    spans = [("gpu0", "a", 0.0, 1.0, "x"), ("cpu:e", "b", 0.5, 0.7, ""), ("gpu0", "c", 1.0, 2.0, "x"),
             ("link:l", "d", 0.1, 0.4, "y"), ("link:l", "e", 0.2, 0.3, "y"), ("gpu0", "f\u00e9", 2.0, 2.5, "x"),
             ("cpu:e", "g", 3.0, 3.0, "")]
    for s in spans:
        rec.add(*s)
    assert rec.count == 7 and rec.held == 1  # two segments' worth written out
    # in time order: by start, then track, then as recorded on the track
    frame = pd.DataFrame(sorted(spans, key=lambda s: (s[2], s[0])), columns=["track", "name", "start", "end", "category"])
    pd.testing.assert_frame_equal(rec.frame(), frame)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(trace_events(rec).lines()) == list(trace_events(frame).lines())
