"""benchmarks/run.py's pure parts on fixed numbers; the real benchmark is never run here."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("lastmile_bench_run", ROOT / "benchmarks" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _record(requests=10_000, spans=False, wall=7.5, peak=270.0, ref=0.6):
    return {"requests": requests, "record_spans": spans, "wall_s": wall, "peak_mib": peak,
            "reference_s": ref, "reference_runs_s": [0.7, 0.6, 0.5], "ref_units": wall / ref}


def test_median_and_interleaving(bench):
    assert bench.median([3.0, 1.0, 2.0]) == 2.0
    assert bench.median([4.0, 1.0]) == 2.5
    with pytest.raises(ValueError):
        bench.median([])
    assert bench.interleave(["ref", "off", "on"], 3) == ["ref", "off", "on"] * 3
    order = bench.interleave(["ref", "off", "on"], 3)
    samples = list(zip(order, [0.6, 7.0, 9.0, 0.5, 7.4, 9.9, 0.7, 7.2, 9.1]))
    assert bench.medians_by_config(samples) == {"ref": 0.6, "off": 7.2, "on": 9.1}
    assert list(bench.medians_by_config(samples)) == ["ref", "off", "on"]


def test_reference_units_and_rss_units(bench):
    assert bench.ref_units(7.5, 0.6) == pytest.approx(12.5)
    with pytest.raises(ValueError):
        bench.ref_units(1.0, 0.0)
    assert bench.maxrss_mib(279_552, "Linux") == 273.0  # KiB
    assert bench.maxrss_mib(279_552 * 1024, "Darwin") == 273.0  # bytes


def test_table_has_one_line_per_record_with_exact_figures(bench):
    table = bench.format_table([_record(), _record(spans=True, wall=9.0, peak=410.25)])
    lines = table.splitlines()
    assert lines[0] == "reference: 1,000,000 SimPy timeouts in 0.600 s (median of 3)"
    assert lines[1].split() == ["requests", "spans", "wall", "s", "peak", "MiB", "ref", "units", "us/request"]
    assert lines[3].split() == ["10,000", "off", "7.50", "270.0", "12.50", "750.0"]
    assert lines[4].split() == ["10,000", "on", "9.00", "410.2", "15.00", "900.0"]
    assert len(lines) == 5
    assert bench.format_table([]) == "(no measurements)"


def test_series_argv_sets_trace_repeat_only_beyond_the_trace(bench):
    small = bench.run_argv(10_000, False)
    assert "record_spans=false" in small and "workload.requests=10000" in small
    assert "workload.trace_repeat=true" not in small
    big = bench.run_argv(1_000_000, True)
    assert "record_spans=true" in big and "workload.trace_repeat=true" in big
    assert "--no-write" in big and "--no-write" in bench.run_argv(None, False)


def test_records_go_under_runs_bench_not_to_the_tracked_file(bench, tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "ROOT", tmp_path)
    records = [_record(), _record(spans=True, wall=9.0)]
    written = bench.write_records(records, tmp_path)
    assert written == [tmp_path / "runs" / "bench" / "results.jsonl"]
    lines = (tmp_path / "runs" / "bench" / "results.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == records
    assert not (tmp_path / "benchmarks" / "results.jsonl").exists()
    bench.write_records(records[:1], tmp_path)  # appends
    assert len((tmp_path / "runs" / "bench" / "results.jsonl").read_text().splitlines()) == 3
    # --record: the tracked file as well
    written = bench.write_records(records[:1], tmp_path, record=True)
    assert written[1] == tmp_path / "benchmarks" / "results.jsonl"
    assert len(written[1].read_text().splitlines()) == 1


def test_main_with_a_fake_measurement_prints_the_table_and_writes_under_runs(bench, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "ROOT", tmp_path)
    calls = []

    def fake_measure(sizes, spans_modes, repeats, log=print):
        calls.append((sizes, spans_modes, repeats))
        return [_record(spans=s) for s in spans_modes]

    monkeypatch.setattr(bench, "measure", fake_measure)
    assert bench.main([]) == 0
    assert calls == [([None], [False, True], 3)]
    out = capsys.readouterr().out
    assert "12.50" in out and "appended 2 record(s) to runs/bench/results.jsonl" in out
    assert (tmp_path / "runs" / "bench" / "results.jsonl").is_file()
    assert not (tmp_path / "benchmarks" / "results.jsonl").exists()
    bench.main(["--series", "--max-requests", "100000", "--repeats", "1"])
    assert calls[-1] == ([1_000, 10_000, 100_000], [False], 1)


def test_engine_ratios_pair_each_profile_with_the_plain_run_of_its_round(bench):
    configs = [("reference", None, None, None), ("run", 10, False, None), ("run", 10, False, "sglang")]
    walls = [(configs[0], 1.0), (configs[1], 2.0), (configs[2], 3.0),   # round 1: 1.5x
             (configs[0], 1.0), (configs[1], 4.0), (configs[2], 4.4),   # round 2: 1.1x (a slower round)
             (configs[0], 1.0), (configs[1], 2.0), (configs[2], 2.6)]   # round 3: 1.3x
    assert bench.paired_ratios(walls, configs) == {configs[2]: pytest.approx(1.3)}
    argv = bench.engine_sets("vllm-v1")
    assert argv[:2] == ["--set", "serving.engine=vllm-v1"]
    assert "serving.overlap=async" in argv and "serving.detokenizer=api_server" in argv
    assert "serving.chunked_prefill=true" in argv  # YAML's spelling of a boolean
    table = bench.format_table([{**_record(), "engine": None, "vs_plain": 1.0},
                                {**_record(wall=9.75), "engine": "vllm-v1", "vs_plain": 1.3}])
    assert table.splitlines()[-1].split() == ["10,000", "vllm-v1", "9.75", "270.0", "16.25", "1.30"]
