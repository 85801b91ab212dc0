"""The intake timings of ``measure-engine vllm --trace-intake``, on traces written by hand (closed forms)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from simulator.calibrate.measure_intake import CHAIN, COLUMNS, WARMUP, intake_columns, op_cpu_ms, read_trace


def _write(folder, pid, rows):
    with open(folder / f"trace_{pid}.csv", "w") as f:
        f.writelines(f"{e},{t!r},{th},{tc!r},{pc!r}\n" for e, t, th, tc, pc in rows)


def test_an_operations_cpu_pairs_each_start_with_its_threads_next_end(tmp_path):
    # two threads tokenize at the same time; each call's CPU is its own thread's clock
    _write(tmp_path, 1, [("tok_b", 0.0, "A", 1.0, 0), ("tok_b", 0.1, "B", 5.0, 0),
                         ("tok_e", 0.2, "A", 1.0004, 0), ("tok_e", 0.3, "B", 5.0006, 0),
                         ("tok_b", 0.4, "A", 2.0, 0), ("tok_e", 0.5, "A", 2.0005, 0)])
    assert op_cpu_ms(read_trace(tmp_path), "tok") == pytest.approx(0.5)


def test_calls_that_overlap_on_one_thread_are_left_out(tmp_path):
    # a coroutine suspended inside: the second start comes before the first end on the same thread
    _write(tmp_path, 1, [("add_b", 0.0, "Main", 1.0, 0), ("add_b", 0.1, "Main", 1.1, 0),
                         ("add_e", 0.2, "Main", 1.3, 0), ("add_e", 0.3, "Main", 1.4, 0),
                         ("add_b", 0.4, "Main", 2.0, 0), ("add_e", 0.5, "Main", 2.0002, 0)])
    assert op_cpu_ms(read_trace(tmp_path), "add") == pytest.approx(0.2)


def test_the_concurrency_1_chain_adds_up_to_the_ttft(tmp_path):
    # request k starts at 1.0 + k; HTTP parsed 1.3 ms later, added 2.5 ms after that (2.4 ms of API CPU),
    # the prefill launched 0.6 ms later and runs 3.2 ms, the first token reaches the client 1.0 ms after it
    n, offset = WARMUP + 4, 1000.0
    api, steps = [], ["launch,start,end,reqs,decode_reqs,prefill_tokens,sampled,new_reqs,preempted\n"]
    for k in range(n):
        s = 1.0 + k
        api += [("http_b", s + 1.3e-3, "Main", 0, 10 * k), ("add_e", s + 3.8e-3, "Main", 0, 10 * k + 2.4e-3)]
        launch = s + 4.4e-3
        steps.append(f"{launch + offset!r},{launch + offset!r},{launch + 3.2e-3 + offset!r},1,0,128,1,1,0\n")
        steps.append(f"{launch + 4e-3 + offset!r},{launch + 4e-3 + offset!r},{launch + 6e-3 + offset!r},1,1,0,1,0,0\n")
    _write(tmp_path, 7, api)
    (tmp_path / "steps.csv").write_text("".join(steps))
    starts = [1.0 + k for k in range(n)]
    (tmp_path / "bench.json").write_text(json.dumps({"start_times": starts, "ttfts": [8.6e-3] * n}))
    row = intake_columns(tmp_path, tmp_path / "bench.json", tmp_path / "steps.csv", offset, 1)
    assert set(row) == set(COLUMNS)
    got = [row[c] for c in CHAIN]
    assert got == pytest.approx([1.3, 2.5, 2.4, 0.6, 3.2, 1.0], abs=1e-6)
    assert np.isnan(row["intake_tokenize_cpu_ms"])  # nothing traced there
    waits = [row[c] for c in CHAIN if c != "intake_api_cpu_ms"]
    assert sum(waits) == pytest.approx(8.6, abs=1e-6)


def test_above_concurrency_1_there_is_no_chain(tmp_path):
    _write(tmp_path, 1, [("sch_b", 0.0, "Main", 1.0, 0), ("sch_e", 0.1, "Main", 1.0007, 0)])
    row = intake_columns(tmp_path, tmp_path / "missing.json", tmp_path / "missing.csv", 0.0, 64)
    assert set(row) == set(COLUMNS) - set(CHAIN) and row["schedule_cpu_ms"] == pytest.approx(0.7)


def test_tracing_is_vllm_v1s_alone(capsys):
    from simulator.cli import main

    assert main(["measure-engine", "vllm-v0", "--trace-intake"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--trace-intake" in err[0] and "vllm" in err[0]


def test_the_committed_intake_table_is_sane():
    import csv
    from pathlib import Path

    from simulator.calibrate.measure_engine import CSV_COLUMNS

    path = Path(__file__).resolve().parents[1] / "scenarios/validation/reference/host_path_vllm_intake.csv"
    with open(path) as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == list(CSV_COLUMNS) + list(COLUMNS)
        rows = list(reader)
    one = next(r for r in rows if r["concurrency"] == "1")
    chain = {c: float(one[c]) for c in CHAIN}
    assert all(v > 0 for v in chain.values())
    assert chain["intake_api_cpu_ms"] <= chain["intake_http_to_added_ms"] * 1.02  # CPU within its own wall time
    waited = sum(v for c, v in chain.items() if c != "intake_api_cpu_ms")
    assert waited == pytest.approx(float(one["ttft_ms_p50"]), rel=0.15)  # the pieces make up the first token
    loaded = [r for r in rows if int(r["concurrency"]) >= 16]
    assert loaded and all(r[c] == "" for r in loaded for c in CHAIN)
    # the same code costs more CPU at concurrency 1 than under load (the notes of host_path_vllm)
    for column in ("intake_tokenize_cpu_ms", "intake_add_request_cpu_ms", "intake_core_preprocess_cpu_ms"):
        assert float(one[column]) > 1.3 * max(float(r[column]) for r in loaded)
