"""What a run folder holds: a Perfetto trace Perfetto can load, strict JSON, joinable CSVs with units,
the run's figures, and readable reprs."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import simulator
from simulator.observe.perfetto import Counter, Trace, assign_lanes, trace_events

ROOT = Path(__file__).resolve().parents[1]
SMALL_LLM = {"workload.requests": 24, "workload.arrival": "poisson", "workload.rate": 40,
             "workload.prompt_tokens": 128, "workload.output_tokens": 24}
SMALL_DIT = {"parallel.pipefusion": 4, "parallel.patches": 4, "workload.requests": 2, "steps": 4}
DIT = ROOT / "scenarios/dit/pixart-1024-a100-nvlink-pipefusion.yaml"


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    r = simulator.run(None, SMALL_LLM)
    return r, r.write(tmp_path_factory.mktemp("llm") / "run")


@pytest.fixture(scope="module")
def dit(tmp_path_factory):
    r = simulator.run(DIT, SMALL_DIT)
    return r, r.write(tmp_path_factory.mktemp("dit") / "run")


def _events(folder: Path) -> list[dict]:
    return json.loads((folder / "trace.json").read_text())["traceEvents"]


def _ns(us: float) -> int:
    return round(us * 1000)


def _slices(events):
    """(pid, tid) -> sorted [(start_ns, end_ns)] of the 'X' events."""
    out = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            s = _ns(e["ts"])
            out[(e["pid"], e["tid"])].append((s, s + _ns(e["dur"])))
    return {k: sorted(v) for k, v in out.items()}


def improper_overlaps(slices) -> int:
    """Pairs on one track that overlap without one containing the other (Perfetto rejects them)."""
    bad = 0
    for spans in slices.values():
        stack: list[int] = []  # ends of the open enclosing slices
        for s, e in spans:
            while stack and stack[-1] <= s:
                stack.pop()
            if stack and e > stack[-1]:
                bad += 1
            stack.append(e)
    return bad


@pytest.mark.parametrize("which", ["llm", "dit"])
def test_trace_slices_never_overlap_on_a_track_and_none_are_dropped(which, request):
    result, folder = request.getfixturevalue(which)
    events = _events(folder)
    slices = _slices(events)
    assert sum(len(v) for v in slices.values()) == len(result.spans)  # every span, no cap
    assert improper_overlaps(slices) == 0
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert set(result.spans["track"]) <= set(names.values())


def test_trace_has_engine_counters(llm):
    result, folder = llm
    counters = defaultdict(list)
    for e in _events(folder):
        if e["ph"] == "C":
            counters[e["name"]].append(e["args"]["value"])
    batch, kv = counters["replica0 batch size"], counters["replica0 KV-cache occupancy"]
    assert max(batch) >= 2  # requests share steps
    assert 0 in batch  # the GPU idles between arrivals
    assert 0 < max(kv) <= 1
    assert max(kv) == pytest.approx(result.summary["kv_cache"]["peak_occupancy"])


@pytest.mark.parametrize("which", ["llm", "dit"])
def test_every_completed_request_has_a_flow_bound_inside_slices(which, request):
    result, folder = request.getfixturevalue(which)
    events = _events(folder)
    slices = _slices(events)
    flows = defaultdict(list)
    for e in events:
        if e["ph"] in "stf":
            flows[e["id"]].append(e)
    assert set(flows) == set(np.flatnonzero(result.requests["completed"].to_numpy()).tolist())
    tracks_crossed = 0
    for fid, evs in flows.items():
        assert [e["ph"] for e in evs][0] == "s" and evs[-1]["ph"] == "f"
        assert all(e["ph"] == "t" for e in evs[1:-1])
        assert [e["ts"] for e in evs] == sorted(e["ts"] for e in evs)
        for e in evs:  # each point lies inside a slice of its own thread
            t = _ns(e["ts"])
            assert any(s <= t <= end for s, end in slices[(e["pid"], e["tid"])])
        tracks_crossed += len({(e["pid"], e["tid"]) for e in evs}) > 1
    assert tracks_crossed == len(flows)


def test_rounding_keeps_back_to_back_spans_apart_and_overlaps_get_lanes(tmp_path):
    # rounding ts and dur separately (the old way) made the first slice end at 1.001 us, 1 ns
    # after the second starts at 1.000 us
    edges = [0.6e-9, 1.0004e-6, 2.0000006e-6, 3.4999995e-6]
    spans = pd.DataFrame({"track": ["gpu0"] * 3 + ["link:x"] * 3, "name": ["a", "b", "c", "t1", "t2", "t3"],
                          "start": edges[:3] + [0.0, 0.5e-6, 1.2e-6], "end": edges[1:] + [1e-6, 2e-6, 1.5e-6],
                          "category": ["compute"] * 3 + ["comm"] * 3})
    Trace(spans, [Counter("n", "gpu0", np.array([0.0, 1e-6]), np.array([1.0, np.nan]))]).write(tmp_path / "trace.json")
    events = _events(tmp_path)
    slices = _slices(events)
    gpu = [v for v in slices.values() if len(v) == 3]
    assert gpu == [[(1, 1000), (1000, 2000), (2000, 3500)]]
    assert improper_overlaps(slices) == 0
    threads = sorted(e["args"]["name"] for e in events if e.get("name") == "thread_name")
    assert threads == ["gpu0", "link:x", "link:x (2)"]
    assert [e["args"]["value"] for e in events if e["ph"] == "C"] == [1.0]  # a NaN sample is left out
    assert list(assign_lanes(np.array([0, 5, 6, 10]), np.array([10, 7, 20, 11]))) == [0, 1, 2, 0]


def test_empty_trace_is_valid_json(tmp_path):
    trace = trace_events(pd.DataFrame(columns=["track", "name", "start", "end", "category"]))
    trace.write(tmp_path / "trace.json")
    assert _events(tmp_path) == [] and len(trace) == 0


def test_summary_json_is_strict_even_with_non_finite_values(llm, tmp_path):
    result, _ = llm
    bad = type(result)(result.kind, result.scenario, {**result.summary, "x": math.nan,
                                                        "nested": {"y": [math.inf, 1.0, np.float64(-np.inf)]}},
                       result.requests, result.breakdown, result.spans, [], itl=result.itl)
    out = bad.write(tmp_path / "run", figures=False)

    def refuse(token):
        raise AssertionError(f"non-standard JSON constant {token}")

    s = json.loads((out / "summary.json").read_text(), parse_constant=refuse)
    assert s["x"] is None and s["nested"]["y"] == [None, 1.0, None]
    assert not list(out.glob("*.png"))  # figures=False


def test_csv_columns_carry_units_and_join_on_request(llm):
    result, folder = llm
    req = pd.read_csv(folder / "requests.csv")
    bd = pd.read_csv(folder / "breakdown.csv")
    assert req.columns[0] == "request" and bd.columns[0] == "request"
    for col in ("arrival_s", "tokenized_s", "first_token_s", "last_token_s", "ttft_s", "tpot_s", "e2e_s"):
        assert col in req.columns
    assert not {"ttft", "e2e", "arrival", "tpot"} & set(req.columns)
    joined = req.merge(bd, on="request", suffixes=("", "_bd"))
    assert len(joined) == int(req["completed"].sum()) > 0
    np.testing.assert_allclose(joined["e2e_s"], joined["e2e_s_bd"], rtol=1e-12)
    # seconds, as the summary's milliseconds say
    assert req["ttft_s"].median() * 1e3 == pytest.approx(result.summary["ttft_ms"]["p50"], rel=1e-9)
    assert result.breakdown.index.name == "request"
    assert abs(result.breakdown.mean().drop("e2e_s").sum() - result.breakdown["e2e_s"].mean()) < 1e-9


def test_dit_csv_columns_carry_units(dit):
    result, folder = dit
    req = pd.read_csv(folder / "requests.csv")
    assert req.columns[0] == "request"
    assert {"arrival_s", "done_s", "latency_s", "queue_s", "denoise_s"} <= set(req.columns)
    assert {"output_bytes", "comm_bytes_per_gpu", "completed"} <= set(req.columns)
    bd = pd.read_csv(folder / "breakdown.csv", index_col="request")
    np.testing.assert_allclose(bd.drop(columns="latency_s").sum(axis=1), bd["latency_s"], rtol=1e-9)


@pytest.mark.parametrize("which", ["llm", "dit"])
def test_run_folder_has_its_figures(which, request):
    _, folder = request.getfixturevalue(which)
    for name in ("breakdown.png", "latency_cdf.png", "timeline.png"):
        data = (folder / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name


def test_repr_and_html_repr_name_the_headline_metrics(llm, dit):
    text = repr(llm[0])
    assert text.startswith("<Result llm ") and "24/24 completed" in text and "TTFT p50" in text
    assert "ms" in text and len(text) < 400
    html = llm[0]._repr_html_()
    assert html.count("<table>") == 2 and "detokenize" in html and "TTFT p50 / p99" in html
    d = repr(dit[0])
    assert d.startswith("<Result dit ") and "latency p50" in d and "2/2 completed" in d


def _nullify(d):
    if isinstance(d, dict):
        return {k: _nullify(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_nullify(v) for v in d]
    return None if isinstance(d, (int, float)) and not isinstance(d, bool) else d


@pytest.mark.parametrize("which", ["llm", "dit"])
def test_text_summary_and_reprs_survive_null_metrics(which, request):
    from simulator.report.text import format_summary

    result, _ = request.getfixturevalue(which)
    empty = type(result)(result.kind, result.scenario, _nullify(result.summary), result.requests,
                         result.breakdown, result.spans, [])
    text = format_summary(empty)
    assert "None" not in text.split("\n", 3)[-1].replace("None/None", "") and " - " in text
    assert "-" in repr(empty) and "<table>" in empty._repr_html_()


def test_timeline_window_shows_a_few_steps():
    from simulator.observe.figures import timeline_window

    # a DiT run: request 1 of 0..2 is the middle one; its steps 1-3 (after the warmup step 0)
    names = [f"r{r} s{s} p0" for r in range(3) for s in range(5)]
    start = np.arange(len(names), dtype=float)
    dit = pd.DataFrame({"track": "gpu0", "name": names, "start": start, "end": start + 0.5, "category": "denoise"})
    assert timeline_window(dit) == (6.0, 8.5)
    # an LLM run: six consecutive steps from the middle of the busiest GPU track
    steps = pd.DataFrame({"track": ["gpu0"] * 20 + ["cpu:engine0"] * 30, "name": "x",
                          "start": np.r_[np.arange(20.0), np.arange(30.0)], "end": np.r_[np.arange(20.0), np.arange(30.0)] + 0.9,
                          "category": "decode"})
    assert timeline_window(steps) == (7.0, 12.9)
