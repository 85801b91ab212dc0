"""The command line as a user meets it: summaries, run folders, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SMALL = ["--set", "workload.requests=20"]


def lastmile(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "simulator", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def test_run_default_writes_the_run_folder(tmp_path):
    out = tmp_path / "run"
    proc = lastmile("run", *SMALL, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "TTFT" in proc.stdout and "last mile" in proc.stdout
    for name in ("summary.json", "requests.csv", "breakdown.csv", "scenario.yaml", "trace.json"):
        assert (out / name).is_file(), name
    trace = json.loads((out / "trace.json").read_text())
    tracks = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"gpu0", "cpu:engine0", "cpu:api_server0"} <= tracks
    assert any(e["ph"] == "X" for e in trace["traceEvents"])


def test_no_trace_writes_the_run_folder_without_it(tmp_path):
    out = tmp_path / "run"
    proc = lastmile("run", *SMALL, "--out", str(out), "--no-trace")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir() if p.suffix != ".png") == [
        "breakdown.csv", "requests.csv", "scenario.yaml", "summary.json"]
    assert (out / "latency_cdf.png").is_file() and "trace.json" not in proc.stdout


def test_json_summary_has_the_contract_keys():
    proc = lastmile("run", *SMALL, "--json", "--no-write")
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
        assert set(s[key]) >= {"p50", "p90", "p99", "mean"}
    assert {"output_tokens_per_s", "requests_per_s"} <= set(s["throughput"])
    assert set(s["breakdown_share"]) == {"queue", "schedule", "prefill", "kv_transfer", "decode", "comm", "d2h", "detokenize",
                                         "output", "ipc", "stream"}
    assert 0 <= s["last_mile_share"] <= 1 and 0 <= s["itl_last_mile_share"] <= 1
    assert s["requests_completed"] == 20


def test_resolved_scenario_reloads_to_the_same_run(tmp_path):
    out = tmp_path / "run"
    assert lastmile("run", *SMALL, "--out", str(out)).returncode == 0
    again = lastmile("run", str(out / "scenario.yaml"), "--json", "--no-write")
    assert again.returncode == 0, again.stderr
    first = json.loads((out / "summary.json").read_text())
    second = json.loads(again.stdout)
    assert first["e2e_ms"] == second["e2e_ms"]


BAD_TRACE = "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,100,10\n0.5,abc,10\n"


@pytest.mark.parametrize("args,expected", [
    (["--set", "serving.ovrlap=async"], "serving.ovrlap: unknown key 'ovrlap' (did you mean 'overlap'?)"),
    (["--set", "hardware.gpu.memory=80 parsecs"], "hardware.gpu.memory: unknown unit 'parsecs'"),
    (["--set", "hardware.gpu_link.bandwidth=0"], "hardware.gpu_link.bandwidth: must be greater than zero"),
    (["--set", "parallel.tp=3"], "parallel.tp: tp=3 does not divide the 32 attention heads"),
    (["--set", "model=llama-3-70b"], "hardware.gpu.memory: llama-3-70b does not fit"),
    (["--set", "workload.trace=missing.csv", "--set", "workload.arrival=trace"], "workload.trace: trace file"),
    (["missing_scenario.yaml"], "missing_scenario.yaml: scenario file does not exist"),
])
def test_bad_input_is_one_line_exit_2_and_no_run_folder(tmp_path, args, expected):
    out = tmp_path / "run"
    proc = lastmile("run", *args, "--out", str(out))
    assert proc.returncode == 2
    assert expected in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_malformed_trace_names_file_and_row(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(BAD_TRACE)
    proc = lastmile("run", "--set", f"workload.trace={trace}", "--set", "workload.arrival=trace", "--no-write")
    assert proc.returncode == 2
    assert "workload.trace: trace t.csv row 3: num_prefill_tokens = 'abc' is not a number" in proc.stderr


def test_broken_yaml_names_the_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: llama-3-8b\nserving:\n  max_batch: [1, 2\n")
    proc = lastmile("run", str(bad), "--no-write")
    assert proc.returncode == 2
    assert f"{bad}: not valid YAML at line" in proc.stderr


def test_dit_out_of_memory_is_a_clear_error(tmp_path, root):
    out = tmp_path / "run"
    proc = lastmile("run", str(root / "scenarios/dit/pixart-4096-a100-nvlink-distrifusion.yaml"), "--set", "resolution=8192",
                    "--out", str(out))
    assert proc.returncode == 2
    assert "parallel: does not fit in GPU memory: needs" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()


def test_dit_across_nodes_needs_a_node_link(root):
    scenario = str(root / "scenarios/dit/pixart-1024-a100-nvlink-pipefusion.yaml")
    proc = lastmile("run", scenario, "--set", "parallel.pipefusion=16", "--no-write")
    assert proc.returncode == 2
    assert "hardware.node_link: 16 GPUs span more than one 8-GPU node" in proc.stderr
    ok = lastmile("run", scenario, "--set", "parallel.pipefusion=16", "--set", "hardware.node_link=ib-400g",
                  "--no-write", "--json")
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize("command", ["", "run", "sweep", "validate", "calibrate", "report", "measure-cpu",
                                     "measure-gpu"])
def test_help_of_every_command(command):
    proc = lastmile(*([command] if command else []), "--help")
    assert proc.returncode == 0, proc.stderr
    assert "usage: lastmile" in proc.stdout


def test_a_run_changed_with_set_is_named_after_what_ran(tmp_path):
    from simulator.runfolder import run_name

    assert run_name("base", {}) == "base" and run_name("base", {"name": "mine"}) == "base"
    assert run_name("base", {"model": "llama-3-70b", "parallel.tp": 8}) == "base+model=llama-3-70b+parallel.tp=8"
    proc = lastmile("run", *SMALL, "--set", "parallel.tp=2", "--json", "--no-write")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["scenario"].endswith("+parallel.tp=2")


def test_vllm_bench_format_prints_vllms_block_and_saves_its_keys(tmp_path):
    saved = tmp_path / "result.json"
    proc = lastmile("run", "--set", "workload.requests=60", "--set", "serving.stream_interval=8", "--no-write",
                    "--no-last-mile-cost", "--format", "vllm-bench", "--percentiles", "50,99", "--save-result",
                    str(saved))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "============ Serving Benchmark Result ============" and lines[-1] == "=" * 50
    shown = {line[:40].strip(): float(line[41:]) for line in lines if line[:1] not in "=-" and line[41:].strip()}
    r = json.loads(saved.read_text())
    assert shown["Successful requests:"] == r["completed"] == 60
    for key, label in (("median_itl_ms", "Median ITL (ms):"), ("p99_ttft_ms", "P99 TTFT (ms):"),
                       ("p50_tpot_ms", "P50 TPOT (ms):"), ("mean_tpot_ms", "Mean TPOT (ms):")):
        assert shown[label] == pytest.approx(r[key], abs=0.005)
    # a chunk carries 8 tokens: the per-chunk ITL is about 8 TPOTs, never 0
    assert 4 * r["median_tpot_ms"] < r["median_itl_ms"] < 12 * r["median_tpot_ms"]
    assert {"std_ttft_ms", "total_input_tokens", "total_output_tokens", "output_throughput"} <= set(r)


def test_bad_percentiles_are_one_line():
    proc = lastmile("run", "--no-write", "--format", "vllm-bench", "--percentiles", "50,abc")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--percentiles" in proc.stderr
