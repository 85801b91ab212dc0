"""Calibration: the fit recovers known parameters from the simulator's own measurements; bad CSVs fail clearly."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from simulator.calibrate.fit import (base_values, default_params, fit, predict, profile_dict, read_measurements,
                                    write_profile)
from simulator.errors import ConfigError

TRUE = {"matmul": 0.72, "hbm": 0.76, "schedule_per_step": 150e-6, "detokenize_per_token": 3.1e-6,
        "stream_per_chunk": 4.5e-6}
ROWS = [  # each parameter has rows that are sensitive to it
    dict(prompt_tokens=16, output_tokens=32, batch=1, metric="tpot_ms"),
    dict(prompt_tokens=4096, output_tokens=1, batch=1, metric="ttft_ms"),
    dict(prompt_tokens=1024, output_tokens=1, batch=8, metric="ttft_ms"),
    dict(prompt_tokens=16, output_tokens=16, batch=128, metric="tpot_ms"),
    dict(prompt_tokens=16, output_tokens=16, batch=256, metric="ttft_ms"),
    dict(prompt_tokens=16, output_tokens=16, batch=64, metric="e2e_ms"),
    dict(prompt_tokens=16, output_tokens=16, batch=256, metric="tpot_ms", detokenizer="api_server"),
    # Scheduling hides behind the GPU step when the engine schedules one step ahead: this row's
    # step is weights over HBM alone, which tells hbm apart from schedule_per_step (both add the
    # same time to every synchronous decode step).
    dict(prompt_tokens=16, output_tokens=32, batch=1, metric="tpot_ms", overlap="async"),
]
COLS = ["model", "prompt_tokens", "output_tokens", "batch", "detokenizer", "overlap", "metric", "measured"]


def _write(path, rows, cols=COLS):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, cols)
        w.writeheader()
        for r in rows:
            w.writerow(r)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """Measurements made by the simulator itself at known parameters, then fitted."""
    path = tmp_path_factory.mktemp("cal") / "synthetic.csv"
    _write(path, [{"model": "llama-3-8b", **r, "measured": 1.0} for r in ROWS])
    rows = read_measurements(path)
    start = base_values("h100-sxm")
    for m, y in zip(rows, predict(rows, "h100-sxm", "reference", {**start, **TRUE}, start)):
        m.measured = float(y)
    return rows, fit(rows, "h100-sxm")


@pytest.mark.parametrize("name", sorted(TRUE))
def test_round_trip_recovers_parameters_within_2_percent(synthetic, name):
    _, result = synthetic
    assert result.identifiable[name]
    assert result.values[name] == pytest.approx(TRUE[name], rel=0.02)


def test_round_trip_residuals_vanish(synthetic):
    _, result = synthetic
    assert max(abs(r) for r in result.residuals_pct) < 0.1


def test_profile_is_loadable_as_gpu_and_cpu(synthetic, tmp_path):
    import simulator

    rows, result = synthetic
    out = tmp_path / "profile.yaml"
    write_profile(out, profile_dict(result, "h100-sxm", "reference", "synthetic.csv", "test"))
    r = simulator.run({"model": "llama-3-8b", "hardware": {"gpu": str(out), "cpu": str(out)},
                       "workload": {"requests": 1, "arrival": "all_at_once", "prompt_tokens": 16,
                                    "output_tokens": 32}, "record_spans": False})
    hw = r.scenario.hardware
    assert hw.gpu.achievable.hbm == pytest.approx(TRUE["hbm"], rel=0.02)
    assert hw.cpu.schedule_per_step == pytest.approx(TRUE["schedule_per_step"], rel=0.02)
    assert r.summary["tpot_ms"]["mean"] == pytest.approx(rows[0].measured, rel=0.01)


def test_unsensitive_parameter_is_held(tmp_path):
    path = tmp_path / "m.csv"
    _write(path, [{"model": "llama-2-7b", "prompt_tokens": 5, "output_tokens": 50, "batch": 1,
                   "metric": "tpot_ms", "measured": 9.5}])
    result = fit(read_measurements(path), "a100-sxm-80g", max_iter=2)
    # batch-1 TPOT: streaming runs on the API server, off the engine's path
    assert not result.identifiable["stream_per_chunk"]
    assert result.values["stream_per_chunk"] == result.start["stream_per_chunk"]


@pytest.mark.parametrize("text,where", [
    ("model,metric\nllama-2-7b,tpot_ms\n", "row 1"),                                   # no measured column
    ("model,metric,measured\nllama-2-7b,tpot_ms,fast\n", "row 2, column 'measured'"),
    ("model,metric,measured\nllama-2-7b,tpot_ms,9\nllama-2-7b,speed,9\n", "row 3, column 'metric'"),
    ("model,metric,measured,tp\nllama-2-7b,tpot_ms,9,two\n", "row 2, column 'tp'"),
    ("model,metric,measured,colour\nllama-2-7b,tpot_ms,9,red\n", "row 1"),
    ("model,metric,measured\nllama-2-7b,tpot_ms,-3\n", "row 2, column 'measured'"),
])
def test_csv_errors_name_file_row_and_column(tmp_path, text, where):
    p = tmp_path / "meas.csv"
    p.write_text(text)
    with pytest.raises(ConfigError) as err:
        read_measurements(p)
    assert "meas.csv" in str(err.value) and where in str(err.value)


def test_cli_exits_2_on_bad_csv(tmp_path, capsys):
    from simulator.cli import main

    p = tmp_path / "m.csv"
    p.write_text("model,metric\n")
    assert main(["calibrate", str(p), "--hardware", "a100-sxm-80g"]) == 2
    assert "m.csv" in capsys.readouterr().err


# ---- DiT rows: image latency, with the eager launch cost fitted too ------------------------

DIT_TRUE = {"matmul": 0.75, "hbm": 0.70, "launch_overhead": 30e-6}
DIT_COLS = ["model", "kind", "resolution", "steps", "cfg", "hardware.cuda_graphs", "delivery.vae", "delivery.format",
            "parallel.ulysses", "parallel.tensor", "metric", "measured"]
DIT_ROWS = [  # GPU-bound (matmul, hbm) and launch-bound (8 GPUs at 1024) rows
    {"resolution": 1024, "parallel.ulysses": 8},
    {"resolution": 1024, "parallel.tensor": 8},
    {"resolution": 2048},
    {"resolution": 1024},
]


@pytest.fixture(scope="module")
def dit_synthetic(tmp_path_factory):
    """Image latencies made by the simulator at known GPU figures, fitted from a start profile."""
    d = tmp_path_factory.mktemp("dit")
    start_profile = d / "start.yaml"
    start_profile.write_text("gpu: {base: a100-sxm-80g, launch_overhead: 20 us}\n")
    path = d / "dit.csv"
    common = {"model": "pixart-alpha", "kind": "dit", "steps": 3, "cfg": "true", "hardware.cuda_graphs": "false",
              "delivery.vae": "false", "delivery.format": "latent", "metric": "latency_s", "measured": 1.0}
    _write(path, [{**common, **r} for r in DIT_ROWS], DIT_COLS)
    rows = read_measurements(path)
    hw = str(start_profile)
    start = base_values(hw)
    for m, y in zip(rows, predict(rows, hw, "reference", {**start, **DIT_TRUE}, start)):
        m.measured = float(y)
    params = tuple(p for p in default_params(rows) if p.name in DIT_TRUE)
    return rows, fit(rows, hw, params=params)


def test_dit_rows_fit_the_launch_cost_and_llm_rows_do_not(dit_synthetic, synthetic):
    assert "launch_overhead" in {p.name for p in default_params(dit_synthetic[0])}
    assert "launch_overhead" not in {p.name for p in default_params(synthetic[0])}


@pytest.mark.parametrize("name", sorted(DIT_TRUE))
def test_dit_round_trip_recovers_parameters_within_2_percent(dit_synthetic, name):
    _, result = dit_synthetic
    assert result.identifiable[name]
    assert result.values[name] == pytest.approx(DIT_TRUE[name], rel=0.02)


def test_max_iter_0_only_evaluates(tmp_path, capsys):
    from simulator.cli import main

    p = tmp_path / "m.csv"
    _write(p, [{"model": "pixart-alpha", "kind": "dit", "steps": 2, "resolution": 1024, "metric": "latency_s",
                "measured": 1.0}], ["model", "kind", "steps", "resolution", "metric", "measured"])
    assert main(["calibrate", str(p), "--hardware", "a100-sxm-80g", "--max-iter", "0", "--quiet",
                 "--out", str(tmp_path / "out.yaml")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("evaluated 1 rows") and "fitted" not in out.splitlines()[1]
    assert not (tmp_path / "out.yaml").exists()


REF = Path(__file__).resolve().parents[1].parent / "shared" / "reference"
SPLIT = Path(__file__).resolve().parents[1] / "scenarios" / "calibration"


@pytest.mark.skipif(not REF.is_dir(), reason="../shared/reference not present")
def test_held_out_split_covers_each_published_row_once():
    """docs/calibration.md's held-out check: the two halves together are dit_latency.csv's numeric rows."""
    with open(REF / "dit_latency.csv") as f:
        published = sorted(float(r["latency_s"]) for r in csv.DictReader(f) if r["latency_s"] != "OOM")
    halves = [read_measurements(SPLIT / n) for n in ("pixart_a100_fit.csv", "pixart_a100_holdout.csv")]
    assert sorted(m.measured for h in halves for m in h) == published
    for half in halves:  # every resolution appears in both halves
        assert {m.overrides["resolution"] for m in half} == {1024, 2048, 4096, 8192}


def test_a_row_the_simulator_rejects_names_file_row_and_key(tmp_path, capsys):
    from simulator.cli import main

    p = tmp_path / "meas.csv"
    p.write_text("model,kind,resolution,metric,measured\npixart-alpha,dit,1000,latency_s,1.0\n")
    assert main(["calibrate", str(p), "--hardware", "a100-sxm-80g", "--quiet",
                 "--out", str(tmp_path / "out.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert "meas.csv: row 2, resolution:" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out.yaml").exists()
