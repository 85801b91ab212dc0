"""A run folder's trace stays small: the run's first slices up to a bound, every track's alike, with
where it stops said in the file and by `lastmile run`; --full-trace writes them all."""

from __future__ import annotations

import json

import simulator
from simulator.observe import result as result_mod


def _slices(path):
    d = json.loads(path.read_text())
    return [e for e in d["traceEvents"] if e["ph"] == "X"], d


def test_the_trace_holds_the_runs_first_slices_up_to_the_bound(tmp_path, monkeypatch):
    r = simulator.run(None, {"workload.requests": 120}, last_mile_cost=False)
    monkeypatch.setattr(result_mod, "MAX_TRACE_SPANS", 1500)
    r.write(tmp_path / "a", figures=False)
    cut = r.trace_bound
    xs, d = _slices(tmp_path / "a" / "trace.json")
    assert len(xs) == cut["spans_written"] <= 1500 < cut["spans_total"]
    assert d["otherData"]["lastmile_bounded_trace"] == cut
    assert max(e["ts"] for e in xs) < cut["until_s"] * 1e6  # in microseconds
    counters = [e for e in d["traceEvents"] if e["ph"] == "C"]
    assert counters and max(e["ts"] for e in counters) < cut["until_s"] * 1e6
    r.write(tmp_path / "b", figures=False, full_trace=True)
    full, d2 = _slices(tmp_path / "b" / "trace.json")
    assert len(full) == cut["spans_total"] and "otherData" not in d2 and r.trace_bound is None
    assert sorted(json.dumps(e, sort_keys=True) for e in xs) == sorted(  # the bounded trace is the full one's start
        json.dumps(e, sort_keys=True) for e in full if e["ts"] < cut["until_s"] * 1e6)
