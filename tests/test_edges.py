"""Edges a fuzzer found (issue 25): each is a one-line error with exit code 2, refused before any work,
never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import simulator
from simulator.errors import ConfigError


def lastmile(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "simulator", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


@pytest.fixture
def files(tmp_path):
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbfarrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n0.5,20,5\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": '
                    + "[" * 100_000 + "]" * 100_000 + "}\n")
    fam = tmp_path / "fam"
    fam.mkdir()
    (fam / "unknown.yaml").write_text("family: x\nsource: y\nmetric: ttft_ms\ncases:\n- {case: a, measured: 1, bogus: 1}\n")
    nan = tmp_path / "nan"
    nan.mkdir()
    (nan / "nan.yaml").write_text("family: x\nsource: y\nmetric: ttft_ms\ncases:\n- {case: a, measured: .nan}\n")
    late = tmp_path / "late"
    late.mkdir()
    (late / "late.yaml").write_text("family: x\nsource: y\nmetric: ttft_ms\nbase: {workload: {requests: 5}}\ncases:\n"
                                    "- {case: a, measured: 1}\n- {case: b, measured: 1, set: {serving.nope: 3}}\n")
    return {"tmp": str(tmp_path), "fifo": str(fifo), "bom": str(bom), "file": str(bom), "deep": str(deep),
            "fam": str(fam), "nan": str(nan), "late": str(late)}


CASES = [
    (("run", "--no-write", "--set", 'disaggregation={"prefill":{"replicas":8},"decode":{"replicas":1}}'),
     "disaggregation.kv_link: the prefill and decode pools take 9 GPUs, more than a node's 8"),
    (("run", "--no-write", "--set", "workload.requests=" + "9" * 5000), "workload.requests"),
    (("run", "--no-write", "--out", ""), "--out: is empty"),
    (("run", "--no-write", "--save-result", "{tmp}"), "--save-result {tmp}: is a folder"),
    (("run", "--no-write", "--set", "workload.trace={fifo}"), "is not a regular file"),
    (("run", "--no-write", "--set", "workload.trace={tmp}"), "is not a regular file"),
    (("sweep", "--cluster", "not a url", "--grid", "workload.rate=1/s"), "--cluster: a Dask scheduler address"),
    (("sweep", "--out", "{file}", "--grid", "workload.rate=1/s"), "is a file; name a folder"),
    (("sweep", "--grid", "workload.rate=1/s", "--grid", "workload.rate=2/s"), "the axis workload.rate is given twice"),
    (("sweep", "--workers", "0", "--grid", "workload.rate=1/s"), "--workers: worker processes are between 1"),
    (("sweep", "--workers", "-3", "--grid", "workload.rate=1/s"), "--workers: worker processes are between 1"),
    (("sweep", "--seeds", "1000000000", "--grid", "workload.rate=1/s"), "--seeds: seeds per point are between 1"),
    (("schema", "--write-docs", "{tmp}"), "--write-docs {tmp}: is a folder"),
    (("validate", "--write-readme", "{tmp}"), "--write-readme {tmp}: is a folder"),
    (("calibrate", "{file}", "--hardware", "h100-sxm", "--out", "{tmp}"), "--out {tmp}: is a folder"),
    (("run", "--no-write", "--format", "vllm-bench", "--percentiles", "0,50"), "--percentiles: percentiles lie in"),
    (("run", "--no-write", "--set", "workload.trace={deep}", "--set", "workload.requests=1"),
     "line 1: is nested too deeply"),
    (("run", "--no-write", "--set", "workload.trace={tmp}/" + "a" * 5000 + ".csv"), "cannot be read (File name too long)"),
    (("run", "--no-write", "--set", "name=bad\udc80"), "name: name holds a character that is not text"),
    (("run", "scenarios/pipeline/rag.yaml", "--no-write", "--set", "stages.embed.time=null"),
     "stages.embed.time: a cpu stage needs time"),
    (("validate", "--dir", "{fam}"), "cases[0].bogus: a case takes no 'bogus'"),
    (("validate", "--dir", "{nan}"), "cases[0].measured: a measured figure must be a finite number"),
    (("validate", "--dir", "{late}"), "serving.nope: case 'b': unknown key 'nope'"),
    (("run", "scenarios/pipeline/rag.yaml", "--no-write", "--set", "resources.encoders.cores=-1"),
     "resources.encoders.cores: Input should be greater than 0"),
    (("run", "scenarios/pipeline/rag.yaml", "--no-write", "--set", "resources.encoders.kind=cpus"),
     "resources.encoders.kind: kind 'cpus' is not one of cpu, service, llm, dit (did you mean 'cpu'?)"),
    (("report", "--out", "{fam}"), "--out {fam}: holds files a report does not write (unknown.yaml)"),
    (("report", "--out", "{file}"), "is a file; name a folder for the report"),
]


@pytest.mark.parametrize("args, says", CASES, ids=[f"{c[0][0]}-{i}" for i, c in enumerate(CASES)])
def test_an_edge_is_one_line_exit_2(files, args, says):
    def fill(text: str) -> str:
        for key, value in files.items():
            text = text.replace("{" + key + "}", value)
        return text

    proc = lastmile(*map(fill, args))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("lastmile: error: "), proc.stderr
    assert fill(says) in proc.stderr


def test_a_csv_trace_with_a_byte_order_mark_reads(files):
    r = simulator.run(None, {"workload.trace": files["bom"], "workload.arrival": "trace", "workload.requests": 2,
                             "record_spans": False}, last_mile_cost=False)
    assert r.summary["requests_completed"] == 2


@pytest.mark.parametrize("overrides", [5, [1, 2], (x for x in range(2))], ids=["int", "list", "generator"])
def test_the_api_takes_only_a_mapping_of_overrides(overrides):
    with pytest.raises(ConfigError, match="overrides are a mapping of key paths to values"):
        simulator.run(None, overrides)


def test_compare_reads_float_rounding_as_no_difference():
    from simulator.commands.compare import side_by_side

    same = side_by_side(["a", "b"], [{"duration_s": 10.0, "n": 3}, {"duration_s": 10.0 + 1.128e-11, "n": 3}],
                        ["duration_s", "n"], show_all=False)
    assert same == "(no differences)"
    moved = side_by_side(["a", "b"], [{"duration_s": 10.0}, {"duration_s": 10.5}], ["duration_s"], show_all=False)
    assert "+0.5" in moved and "+5.0%" in moved


def test_times_under_a_picosecond_read_as_zero():
    from simulator.units import fmt_time

    assert fmt_time(9.77e-15) == "0 s" and fmt_time(-1e-13) == "0 s"
    assert fmt_time(3e-9) == "3 ns" and fmt_time(2.5e-6) == "2.5 us"


def test_a_killed_runs_temporary_folder_is_cleaned_by_the_next_run(tmp_path):
    import signal

    from simulator.runfolder import OWNER, _restore, _terminate_as_exit, write_run

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = tmp_path / "run"
    stale = tmp_path / ".run.killed01"
    stale.mkdir()
    (stale / OWNER).write_text(str(dead.pid))
    (stale / "summary.json").write_text("{}")
    live = tmp_path / ".run.writing1"  # another run writing right now: left alone
    live.mkdir()
    (live / OWNER).write_text(str(os.getpid()))
    mine = tmp_path / ".run.users01"  # a folder holding a user's file: never deleted
    mine.mkdir()
    (mine / OWNER).write_text(str(dead.pid))
    (mine / "notes.txt").write_text("mine")
    result = simulator.run(None, {"workload.requests": 5}, last_mile_cost=False)
    write_run(result, out)
    assert not stale.exists() and live.is_dir() and (mine / "notes.txt").is_file()
    assert (out / "summary.json").is_file() and not (out / OWNER).exists()
    # SIGTERM while writing exits through Python, so the temporary folder goes as on an error
    previous = _terminate_as_exit()
    try:
        with pytest.raises(SystemExit):
            os.kill(os.getpid(), signal.SIGTERM)
    finally:
        _restore(previous)


def test_a_figure_that_rounds_to_zero_prints_without_a_sign():
    from simulator.report.text import _n, _pct

    assert _n(-1e-9, ".2f") == "0.00" and _n(-0.0, "9.2f") == "     0.00" and _pct(-1e-7, 6) == "  0.00%"
    assert _n(-1.5, ".2f") == "-1.50" and _n(-0.004, "+.1f", 100) == "-0.4"


def test_a_name_too_long_for_the_file_system_is_reported_not_raised():
    # the system refuses to look up a 5,000-character name (ENAMETOOLONG) beside the scenario too
    long = "t" * 5000 + ".csv"
    with pytest.raises(ConfigError, match=r"workload.trace: trace file .* cannot be read \(File name too long\)"):
        simulator.run("scenarios/llm/last_mile_bites.yaml", {"workload.trace": long})
    with pytest.raises(ConfigError, match=r"model: .*\.\.\.x+/config\.json cannot be read \(File name too long\)"):
        simulator.run({"model": "x" * 5000 + "/config.json"})
