"""The commands a new user reaches for: schema, catalog, compare, --version, -q/-v and progress lines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from simulator.cli import main

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"workload.requests": 12, "workload.prompt_tokens": 64, "workload.output_tokens": 16,
         "record_spans": False}


def lastmile(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "simulator", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


# ---- schema and the generated reference ---------------------------------------------------------

def test_committed_scenario_reference_is_what_the_code_generates():
    from simulator.commands.schema import render_markdown

    committed = (ROOT / "docs" / "scenarios.md").read_text()
    assert committed == render_markdown(), "docs/scenarios.md is stale: run `lastmile schema --write-docs " \
                                           "docs/scenarios.md`"


def test_every_scenario_key_has_a_description():
    from simulator.commands.schema import reference_rows

    missing = [f"{kind}: {r.path}" for kind, rows in reference_rows().items() for r in rows if not r.description]
    assert not missing, "add a sentence to simulator/commands/field_docs.py for:\n" + "\n".join(missing)


def test_reference_has_units_defaults_and_allowed_values():
    from simulator.commands.schema import reference_rows

    rows = {r.path: r for r in reference_rows()["llm"]}
    assert rows["slo.ttft"].unit == "s" and rows["hardware.gpu.memory"].unit == "B"
    assert rows["serving.overlap"].allowed == "sync | async | async_output" and rows["serving.overlap"].default == "sync"
    assert rows["hardware.gpu"].default == "h100-sxm"
    dit = {r.path: r for r in reference_rows()["dit"]}
    assert dit["workload.requests"].default == "4"  # the DiT default workload, not the LLM one
    assert "parallel.pipefusion" in dit and "slices" in {r.path for r in reference_rows()["token_pipeline"]}


def test_dit_model_keys_cover_what_the_architecture_reads():
    """Every key DiTArch validates in the model mapping is documented, and nothing more."""
    from simulator.commands.field_docs import DIT_MODEL_KEYS
    from simulator.config.dit_arch import DiTArch

    read = set(DiTArch.model_fields)
    documented = {k for k, *_ in DIT_MODEL_KEYS} - {"base"}  # base is the loader's
    assert read == documented


@pytest.mark.parametrize("kind", ["llm", "dit", "token_pipeline"])
def test_schema_prints_json_schema_with_units_and_descriptions(kind, capsys):
    assert main(["schema", kind]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["properties"]["kind"]["const" if "const" in schema["properties"]["kind"] else "default"] == kind
    assert schema["properties"]["seed"]["description"]
    assert schema["$defs"]["GPUSpec"]["properties"]["memory"]["x-unit"] == "B"
    assert "hardware" not in schema.get("required", [])


def test_shipped_scenarios_validate_against_their_schema():
    jsonschema = pytest.importorskip("jsonschema")
    from simulator.commands.schema import json_schema

    checked = 0
    for path in sorted((ROOT / "scenarios").rglob("*.yaml")):
        raw = yaml.safe_load(path.read_text())
        if not isinstance(raw, dict) or "cases" in raw or "gpu" in raw or "reference" in path.parts:
            continue  # validation families, hardware profiles and measurement records are not scenarios
        errors = list(jsonschema.Draft202012Validator(json_schema(raw.get("kind", "llm"))).iter_errors(raw))
        assert not errors, f"{path.name}: {errors[0].message}"
        checked += 1
    assert checked >= 5


def test_schema_rejects_what_the_loader_rejects():
    jsonschema = pytest.importorskip("jsonschema")
    from simulator.commands.schema import json_schema

    v = jsonschema.Draft202012Validator(json_schema("llm"))
    assert not v.is_valid({"serving": {"ovrlap": "async"}})
    assert not v.is_valid({"serving": {"overlap": "sometimes"}})
    assert v.is_valid({"hardware": {"gpu": "b200"}, "slo": {"ttft": "2 s"}})


# ---- catalog --------------------------------------------------------------------------------------

def test_catalog_lists_every_gpu_with_its_figures(capsys):
    from simulator.config import catalog

    assert main(["catalog", "gpus"]) == 0
    out = capsys.readouterr().out
    for name in catalog.names("gpus"):
        assert name in out
    h100 = next(line for line in out.splitlines() if line.startswith("h100-sxm"))
    assert "80 GB" in h100 and "3.35 TB/s" in h100 and "989" in h100 and "nvlink4" in h100


def test_catalog_models_show_parameter_counts(capsys):
    assert main(["catalog", "models"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("llama-3-8b"))
    assert "8.0 B" in line and "32/8" in line


def test_catalog_lists_node_types_and_engine_profiles(capsys):
    assert main(["catalog", "nodes"]) == 0
    out = capsys.readouterr().out
    assert "pcie-8xl40s" in out and "gb200-nvl72" in out and "8x ib-400g" in out
    assert main(["catalog", "engines"]) == 0
    out = capsys.readouterr().out
    assert "vllm-0.5" in out and "async_output" in out


def test_catalog_without_a_section_lists_them_all(capsys):
    assert main(["catalog"]) == 0
    out = capsys.readouterr().out
    for title in ("gpus (hardware.gpu)", "links (", "models (", "dits (", "cpus ("):
        assert title in out
    assert "pixart-alpha" in out and "client-lan" in out and "tokenize_per_token" in out


# ---- version, -q, -v ------------------------------------------------------------------------------

def test_version():
    import simulator

    proc = lastmile("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"lastmile {simulator.__version__}"


def test_verbose_reports_timing_and_quiet_silences_notes(tmp_path, capsys):
    assert main(["-v", "catalog", "links"]) == 0
    assert "catalog took" in capsys.readouterr().err
    out = tmp_path / "ref.md"
    assert main(["schema", "--write-docs", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().err
    assert main(["schema", "-q", "--write-docs", str(out)]) == 0
    assert capsys.readouterr().err == ""


# ---- progress -------------------------------------------------------------------------------------

def test_progress_lines_when_stderr_is_not_a_terminal(capsys):
    from simulator import progress

    progress.configure(progress.NORMAL)
    try:
        with progress.Progress(25, "validate", "cases") as bar:
            for _ in range(25):
                bar.update(1, "fam")
    finally:
        progress.configure(None)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "validate: 1/25 cases (fam)" and lines[-1] == "validate: 25/25 cases (fam)"
    assert 3 <= len(lines) <= 12


def test_progress_is_silent_under_quiet_and_in_library_use(capsys):
    from simulator import progress

    for level in (progress.QUIET, None):
        progress.configure(level)
        try:
            with progress.Progress(5, "sweep", "runs") as bar:
                bar.update(5)
        finally:
            progress.configure(None)
    assert capsys.readouterr().err == ""


def test_validate_shows_progress_on_stderr_and_keeps_json_clean(capsys):
    assert main(["validate", "--family", "image_encode", "--json"]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)
    assert "validate: 6/6 cases (image_encode)" in captured.err.splitlines()
    assert main(["-q", "validate", "--family", "image_encode", "--json"]) == 0
    assert "validate:" not in capsys.readouterr().err


def test_sweep_shows_progress_lines_from_the_command_line(capsys):
    args = ["sweep", "--grid", "serving.overlap=sync,async", "--workers", "1"]
    for k, v in SMALL.items():
        args += ["--set", f"{k}={v}"]
    assert main(args) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == "sweep: 2/2 runs"


# ---- compare --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    import simulator

    root = tmp_path_factory.mktemp("runs")
    folders = []
    for name, overlap in (("sync", "sync"), ("async", "async")):
        out = root / name
        simulator.run(None, {**SMALL, "serving.overlap": overlap}).write(out)
        folders.append(out)
    return folders


def test_compare_prints_summaries_and_breakdowns_with_differences(two_runs, tmp_path, capsys):
    a, b = two_runs
    fig = tmp_path / "cmp.png"
    assert main(["compare", str(a), str(b), "--out", str(fig)]) == 0
    out = capsys.readouterr().out
    assert "mean breakdown per request (ms)" in out and "async - sync" in out
    sa = json.loads((a / "summary.json").read_text())
    sb = json.loads((b / "summary.json").read_text())
    line = next(x for x in out.splitlines() if x.startswith("ttft_ms.mean "))
    diff = sb["ttft_ms"]["mean"] - sa["ttft_ms"]["mean"]
    assert f"{diff:+.4g}" in line and f"{100 * (sb['ttft_ms']['mean'] / sa['ttft_ms']['mean'] - 1):+.1f}%" in line
    for cat in sa["breakdown_share"]:
        assert any(x.startswith(f"{cat} ") for x in out.splitlines())
    assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_reads_breakdown_columns_with_a_unit_suffix(two_runs, tmp_path):
    import pandas as pd

    from simulator.commands.compare import read_run

    a = two_runs[0]
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    (renamed / "summary.json").write_text((a / "summary.json").read_text())
    df = pd.read_csv(a / "breakdown.csv")
    df.rename(columns={"queue": "queue_ms"}).assign(queue_ms=lambda d: d["queue_ms"] * 1e3) \
        .set_index(df.columns[0]).to_csv(renamed / "breakdown.csv")
    assert read_run(str(renamed))[1]["queue"] == pytest.approx(read_run(str(a))[1]["queue"])


@pytest.mark.parametrize("make,message", [
    (lambda p: None, "not a run folder (no such directory)"),
    (lambda p: p.mkdir(), "not a run folder: no summary.json"),
    (lambda p: (p.mkdir(), (p / "summary.json").write_text("{nope")), "summary.json is not valid JSON"),
])
def test_compare_bad_folder_is_one_line_exit_2(two_runs, tmp_path, capsys, make, message):
    bad = tmp_path / "bad"
    make(bad)
    assert main(["compare", str(two_runs[0]), str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"lastmile: error: {bad}: {message}") and err.count("\n") == 1


# ---- calibrate: under-determined fits ------------------------------------------------------------

def test_calibrate_says_when_the_fit_is_under_determined(tmp_path, capsys):
    csv = tmp_path / "m.csv"
    csv.write_text("model,prompt_tokens,output_tokens,batch,metric,measured\n"
                   "llama-2-7b,5,20,1,tpot_ms,9.5\n"
                   "llama-2-7b,256,1,1,ttft_ms,25\n")
    out = tmp_path / "p.yaml"
    assert main(["calibrate", str(csv), "--hardware", "a100-sxm-80g", "--max-iter", "1", "-q",
                 "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "WARNING: the fit is under-determined: 2 rows for" in captured.out
    assert captured.err.startswith("lastmile: warning: the fit is under-determined")
    assert "under-determined" in yaml.safe_load(out.read_text())["measured"]["warning"]
