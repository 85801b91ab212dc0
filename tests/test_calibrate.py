"""Calibration: the fit recovers known parameters from the simulator's own measurements; bad CSVs fail clearly."""

from __future__ import annotations

import csv

import pytest

from simulator.calibrate.fit import base_values, fit, predict, profile_dict, read_measurements, write_profile
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
]
COLS = ["model", "prompt_tokens", "output_tokens", "batch", "detokenizer", "metric", "measured"]


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
