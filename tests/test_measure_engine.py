"""`lastmile measure-engine`: the parts that need no vLLM (the missing-engine error, the sweep's plan, the
stub's independence from lastmile) and the committed measurement (host_path_vllm.csv) read back."""

from __future__ import annotations

import ast
import csv
import sys
from pathlib import Path

import pytest

from simulator.calibrate.measure_engine import (CSV_COLUMNS, fit_host_costs, SGLANG_CSV_COLUMNS, STUB_DIR, classify_sglang,
                                                num_prompts_for, plan)
from simulator.cli import main

ROOT = Path(__file__).resolve().parents[1]
CSV_PATH = ROOT / "scenarios" / "validation" / "reference" / "host_path_vllm.csv"
SGLANG_CSV_PATH = ROOT / "scenarios" / "validation" / "reference" / "host_path_sglang.csv"


def test_a_python_without_vllm_is_one_line_and_exit_2(capsys):
    # this interpreter is lastmile's own environment, which never has vLLM
    code = main(["measure-engine", "vllm", "--python", sys.executable, "--out", "unused.csv"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("lastmile: error: measure-engine vllm: ")
    assert "cannot import vllm" in err and "engine-vllm" in err and "--python" in err
    assert not Path("unused.csv").exists()


def test_a_missing_python_is_one_line_and_exit_2(capsys, tmp_path):
    code = main(["measure-engine", "vllm", "--python", str(tmp_path / "nope" / "python")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "does not exist" in err


def test_a_python_without_sglang_is_one_line_and_exit_2(capsys):
    code = main(["measure-engine", "sglang", "--python", sys.executable, "--out", "unused.csv"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("lastmile: error: measure-engine sglang: ")
    assert "cannot import sglang" in err and "--python" in err
    assert not Path("unused.csv").exists()


def test_a_python_without_vllm_0_5_is_one_line_naming_its_install(capsys):
    code = main(["measure-engine", "vllm-v0", "--python", sys.executable, "--out", "unused.csv"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("lastmile: error: measure-engine vllm-v0: ")
    assert "cannot import vllm;" in err and "engine-vllm-v0" in err and ".venv-vllm05" in err
    assert not Path("unused.csv").exists()


def test_py_spy_samples_are_booked_by_the_first_rule_any_frame_matches():
    """Every stack starts in the server's run (uvicorn, api_server.py): those frames book nothing; the engine's
    and the server's work are told apart by the frames above them; the executor thread is idle where it sleeps
    (the stub step) and not where 0.6's async output processing runs in it."""
    root = "<module> (runpy.py:1);run (vllm/entrypoints/openai/api_server.py:9);Server.run (uvicorn/server.py:3);" \
           "Runner.run (asyncio/runners.py:118)"
    lines = [f"{root};engine_step (vllm/engine/async_llm_engine.py:5);schedule (vllm/core/scheduler.py:9) 7",
             f"{root};engine_step (vllm/engine/async_llm_engine.py:5);_process_model_outputs (vllm/engine/llm_engine.py:3);"
             "decode_sequence_inplace (vllm/transformers_utils/detokenizer.py:4);get_len (vllm/sequence.py:2) 3",
             f"{root};completion_stream_generator (vllm/entrypoints/openai/serving_completion.py:2);"
             "model_dump_json (pydantic/main.py:1) 5",
             f"{root} 4",
             "_worker (concurrent/futures/thread.py:81);execute_model (vllm_v0_stub.py:60) 9",
             "_worker (concurrent/futures/thread.py:81);execute_model (vllm_v0_stub.py:58);"
             "_process_model_outputs (vllm/engine/llm_engine.py:3) 6",
             f"{root};step_async (vllm/engine/async_llm_engine.py:2);do_log_stats (vllm/engine/llm_engine.py:7) 2"]
    from simulator.calibrate.measure_engine_v0 import categorize

    assert categorize(lines) == {"schedule": 7, "detokenize": 3, "api": 5, "loop": 4, "idle": 9, "engine": 2, "output": 6}


def test_vllm_0_5s_fit_gives_back_the_costs_its_cpu_seconds_were_made_of():
    """A closed form: the one process's CPU seconds made from known costs per category, split by exact shares,
    come back from fit_v0_costs."""
    from simulator.calibrate.measure_engine_v0 import HOST_CATEGORIES, fit_v0_costs

    def row(c, out, steps):
        n, req_steps = 4 * c, 4 * c * out
        chunks = req_steps + n
        part = {"schedule": 20e-6 * steps + 40e-6 * req_steps, "engine": 100e-6 * steps + 5e-6 * req_steps,
                "output": 25e-6 * req_steps, "detokenize": 9e-6 * req_steps, "ipc": 15e-6 * chunks,
                "api": 700e-6 * n + 60e-6 * chunks,
                "loop": 300e-6 * steps + 20e-6 * chunks}
        cpu = sum(part.values())
        return {"concurrency": c, "stream_interval": 1, "api_servers": 1, "output_len": out, "completed": n,
                "steps": steps, "req_steps": req_steps, "chunks": chunks, "cpu_s_api": cpu, "cpu_s_client": 1.0,
                "spy_samples": 1000, **{f"spy_{k}": part[k] / cpu for k in HOST_CATEGORIES}}
    fits = fit_v0_costs([row(1, 64, 6400), row(64, 64, 300), row(256, 16, 140), row(256, 256, 1100), row(16, 64, 450)])
    got = {k: v["coefficients"] for k, v in fits.items()}
    assert got["schedule"] == pytest.approx({"per_step_s": 20e-6, "per_request_step_s": 40e-6}, rel=1e-3)
    assert got["engine"] == pytest.approx({"per_step_s": 100e-6, "per_request_step_s": 5e-6}, rel=1e-3)
    assert got["detokenize"] == pytest.approx({"per_request_step_s": 9e-6}, rel=1e-3)
    assert got["api_server"] == pytest.approx({"per_request_s": 700e-6, "per_chunk_s": 60e-6}, rel=1e-3)
    assert got["loop"] == pytest.approx({"per_step_s": 300e-6, "per_chunk_s": 20e-6}, rel=1e-3)
    assert got["ipc"] == pytest.approx({"per_chunk_s": 15e-6}, rel=1e-3) and "api_process" not in got


def test_the_sglang_table_adds_only_the_detokenizer_column():
    assert [c for c in SGLANG_CSV_COLUMNS if c != "cpu_s_detokenizer"] == CSV_COLUMNS
    assert len(SGLANG_CSV_COLUMNS) == len(CSV_COLUMNS) + 1


def test_sglang_roles_come_from_the_process_titles(monkeypatch):
    import simulator.calibrate.measure_engine as me

    titles = {10: "python -m sglang.launch_server --model-path m", 11: "sglang::scheduler",
              12: "sglang::detokenizer", 13: "python -B -c from multiprocessing.resource_tracker import main"}
    monkeypatch.setattr(me, "descendants", lambda root: list(titles))
    monkeypatch.setattr(me, "_cmdline", titles.get)
    assert classify_sglang(10) == {10: "api", 11: "engine_core", 12: "detokenizer", 13: "other"}


def test_the_plan_puts_the_base_sweep_first():
    points = plan()
    base = [(p.concurrency, p.stream_interval, p.api_servers) for p in points[:6]]
    assert base == [(c, 1, 1) for c in (1, 16, 64, 256, 1024, 2048)]
    assert {p.api_servers for p in points} == {1, 2, 4} and {p.stream_interval for p in points} == {1, 8}
    assert sum(not p.async_scheduling for p in points) == 1
    assert len({(p.concurrency, p.stream_interval, p.api_servers, p.async_scheduling) for p in points}) == len(points)
    assert num_prompts_for(1) == 100 and num_prompts_for(64) == 256 and num_prompts_for(2048) == 4096


def test_other_output_lengths_set_a_cost_per_token_apart():
    """Points at two output lengths: the API servers' fit recovers a per-token cost beside the per-request
    one (a closed form: CPU seconds made from known costs come back); one length keeps the old three terms."""
    def row(c, out, chunks, steps):
        n = 4 * c
        tokens = n * out
        return {"concurrency": c, "stream_interval": 1, "api_servers": 1, "output_len": out, "completed": n,
                "steps": steps, "req_steps": tokens, "chunks": chunks, "output_tokens": tokens,
                "cpu_s_api": 300e-6 * steps + 1.5e-3 * n + 30e-6 * chunks + 10e-6 * tokens,
                "cpu_s_engine_core": 1.0, "cpu_s_client": 1.0}
    rows = [row(64, 64, 9000, 400), row(256, 64, 30000, 900), row(64, 16, 3000, 130), row(256, 256, 150000, 2400),
            row(16, 256, 4000, 1100)]
    fit = fit_host_costs(rows)["api_server"]["coefficients"]
    assert fit == pytest.approx({"per_message_s": 300e-6, "per_request_s": 1.5e-3, "per_chunk_s": 30e-6,
                                 "per_token_s": 10e-6}, rel=1e-3)
    one = [r for r in rows if r["output_len"] == 64] + [row(16, 64, 900, 500)]
    assert set(fit_host_costs(one)["api_server"]["coefficients"]) == {"per_message_s", "per_request_s", "per_chunk_s"}


@pytest.mark.parametrize("stub", ["vllm_stub_executor.py", "sglang_stub.py", "vllm_v0_stub.py", "stub_step.py",
                                  "vllm_intake_trace.py"])
def test_the_stubs_import_nothing_from_lastmile(stub):
    # they run inside the engine's environment, where lastmile is not installed
    tree = ast.parse((STUB_DIR / stub).read_text())
    modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any(m.split(".")[0] == "simulator" for m in modules)
    assert not any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(tree))


def _table(path, columns) -> list[dict]:
    """A committed measurement's rows as text, its header checked against the columns it must have."""
    with open(path) as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == columns
        return list(reader)


@pytest.fixture(scope="module")
def rows():
    return _table(CSV_PATH, CSV_COLUMNS)


def _base(rows, c):
    return next(r for r in rows if int(r["concurrency"]) == c and r["stream_interval"] == "1"
                and r["api_servers"] == "1" and r["async_scheduling"] == "True")


def test_the_measured_table_is_sane(rows):
    assert rows and {r["engine"] for r in rows} == {"vllm"}
    assert {int(_base(rows, c)["concurrency"]) for c in (1, 16, 64)} == {1, 16, 64}
    positive = ("ttft_ms_mean", "ttft_ms_p99", "tpot_ms_mean", "itl_ms_mean", "itl_ms_p99", "e2e_ms_mean",
                "output_tokens_per_s", "requests_per_s", "cpu_s_api", "cpu_s_engine_core", "cpu_s_client",
                "duration_s", "steps", "step_ms_mean", "batch_mean")
    for r in rows:
        assert all(float(r[k]) > 0 for k in positive), r
        assert int(r["completed"]) == int(r["num_prompts"])
        assert int(r["output_tokens"]) == int(r["num_prompts"]) * int(r["output_len"])
        assert float(r["ttft_ms_p50"]) <= float(r["ttft_ms_p99"])
        assert float(r["itl_ms_p50"]) <= float(r["itl_ms_p99"])
        # the stub's step never takes less than its fixed part
        assert float(r["step_ms_mean"]) >= 1e3 * float(r["stub_a_s"])
        assert 0 < int(r["chunks"]) <= int(r["output_tokens"])
        # the stub's step log covers the window whole: every request-step sampled one token (a log that
        # lost its last rows, as before the stub wrote it every second, fails here)
        assert abs(int(r["req_steps"]) / int(r["output_tokens"]) - 1) < 0.01, r
    t1, t16, t64 = (float(_base(rows, c)["output_tokens_per_s"]) for c in (1, 16, 64))
    assert t1 < t16 < t64
    # one request at a time: TPOT sits near the stub's step (2 ms + 10 us), the host adding little
    assert 2.0 <= float(_base(rows, 1)["tpot_ms_mean"]) < 4.0
    assert float(_base(rows, 64)["batch_mean"]) > float(_base(rows, 1)["batch_mean"])


@pytest.fixture(scope="module")
def sglang_rows():
    return _table(SGLANG_CSV_PATH, SGLANG_CSV_COLUMNS)


def test_the_sglang_table_is_sane(sglang_rows):
    rows = sglang_rows
    assert rows and {r["engine"] for r in rows} == {"sglang"}
    base = {int(r["concurrency"]): r for r in rows if r["stream_interval"] == "1" and r["async_scheduling"] == "True"}
    assert {1, 16, 64} <= set(base)
    positive = ("ttft_ms_mean", "tpot_ms_mean", "itl_ms_p99", "output_tokens_per_s", "cpu_s_api",
                "cpu_s_engine_core", "cpu_s_detokenizer", "cpu_s_client", "duration_s", "steps", "step_ms_mean")
    for r in rows:
        assert all(float(r[k]) > 0 for k in positive), r
        assert int(r["completed"]) == int(r["num_prompts"])
        assert int(r["output_tokens"]) == int(r["num_prompts"]) * int(r["output_len"])
        assert float(r["step_ms_mean"]) >= 1e3 * float(r["stub_a_s"])
    assert float(base[1]["output_tokens_per_s"]) < float(base[16]["output_tokens_per_s"])
    # one request at a time: TPOT sits near the stub's step (2 ms + 10 us)
    assert 2.0 <= float(base[1]["tpot_ms_mean"]) < 5.0
    # at stream interval 1 the 2-core host saturates from c = 64; streaming every 8th token lifts it
    si8 = {int(r["concurrency"]): r for r in rows if r["stream_interval"] == "8" and r["async_scheduling"] == "True"}
    for c in set(si8) & set(base) - {1, 16}:
        assert float(si8[c]["output_tokens_per_s"]) > float(base[c]["output_tokens_per_s"])


@pytest.mark.parametrize("name,engine,version", [("host_path_vllm_v0", "vllm-v0", "0.5.3.post1"),
                                                  ("host_path_vllm_v06", "vllm-v0.6", "0.6.0")])
def test_the_vllm_v0_tables_are_sane(name, engine, version):
    """vLLM 0.5's and 0.6's committed sweeps: every py-spy share present and the shares of the busy samples
    summing to one (0.5: one process, its engine-core column 0; 0.6: the engine process busy too); the
    server's CPU grows with the work it was given."""
    from simulator.calibrate.measure_engine import V0_CSV_COLUMNS
    from simulator.calibrate.measure_engine_v0 import SPY_COLUMNS

    rows = _table(ROOT / "scenarios" / "validation" / "reference" / f"{name}.csv", V0_CSV_COLUMNS)
    assert len(rows) >= 9 and {r["engine"] for r in rows} == {engine}
    assert {r["engine_version"] for r in rows} == {version}
    assert all((float(r["cpu_s_engine_core"]) > 0) == (engine == "vllm-v0.6") for r in rows)
    for r in rows:
        assert int(r["completed"]) == int(r["num_prompts"]) and int(r["spy_samples"]) > 50
        assert sum(float(r[c]) for c in SPY_COLUMNS[1:]) == pytest.approx(1.0, abs=2e-3)
    by_work = sorted(rows, key=lambda r: int(r["req_steps"]))
    assert float(by_work[-1]["cpu_s_api"]) > 10 * float(by_work[0]["cpu_s_api"]) > 0


@pytest.mark.parametrize("setting,enabled", [("off", "False"), ("on", "True"), ("", "True")])
def test_the_stubs_turn_the_collector_off_only_when_asked(setting, enabled):
    """measure-engine --no-gc: every stub imports stub_step, which turns CPython's cyclic collector off in the
    engine's process when LASTMILE_STUB_GC=off, and leaves it alone otherwise."""
    import os
    import subprocess

    env = {**os.environ, "LASTMILE_STUB_GC": setting, "PYTHONPATH": str(STUB_DIR)}
    out = subprocess.run([sys.executable, "-c", "import stub_step, gc; print(gc.isenabled())"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == enabled


def test_the_collectors_cost_is_the_difference_of_the_two_sweeps():
    """A closed form: points whose CPU with the collector on exceeds the same points' with it off by 0.2 us
    per request pair in a step give back 0.2 us (fit_gc pairs the points by concurrency and length)."""
    from simulator.calibrate.measure_engine_v0 import fit_gc

    def row(c, out, sq, base):
        return {"concurrency": c, "output_len": out, "req_steps_sq": sq, "cpu_s_api": base, "cpu_s_engine_core": 0.0,
                "stream_interval": 1, "api_servers": 1}
    off = [row(64, 64, 0, 1.8), row(256, 64, 0, 7.0), row(256, 256, 0, 26.0)]
    on = [row(64, 64, 1_000_000, 1.8 + 0.2), row(256, 64, 16_000_000, 7.0 + 3.2), row(256, 256, 66_000_000, 26.0 + 13.2)]
    assert fit_gc(on, list(reversed(off)))["coefficients"] == pytest.approx({"per_request_pair_s": 0.2e-6}, rel=1e-3)
