"""Multi-stage load (``workload.stages``): arrival times in closed form, the stage of each request,
the per-stage summary block, the one-line errors, and a validation case that reads one stage."""

from __future__ import annotations

import numpy as np
import pytest

import simulator
from simulator.config.loader import load_scenario, resolved_dict
from simulator.errors import ConfigError
from simulator.validate import load_family, run_family
from simulator.observe.llm_metrics import request_stages
from simulator.workloads.arrivals import arrival_times

SMALL = {"model": {"base": "llama-3-8b", "layers": 2}, "hardware": {"gpu": "h100-sxm"}, "record_spans": False,
         "workload": {"arrival": "constant", "prompt_tokens": 64, "output_tokens": 8,
                      "stages": [{"rate": "2/s", "duration": "5 s"}, {"rate": "4/s", "duration": "5 s"}]}}


def _workload(**over):
    raw = {**SMALL, "workload": {**SMALL["workload"], **over}}
    return load_scenario(raw).workload


def test_constant_stages_are_evenly_spaced_and_back_to_back():
    w = _workload()
    t = arrival_times(w, w.requests, np.random.default_rng(0))
    # stage 0: 10 requests at 0.5 s .. 5 s; stage 1: 20 at 5.25 s .. 10 s; shifted so the first is at 0
    expected = np.r_[0.5 * np.arange(1, 11), 5 + 0.25 * np.arange(1, 21)] - 0.5
    assert w.requests == 30 and w.rate is None
    np.testing.assert_allclose(t, expected, rtol=0, atol=1e-12)
    assert list(request_stages(w, 30)) == [0] * 10 + [1] * 20


def test_poisson_stage_gaps_fill_each_stage_exactly():
    """inference-perf's ConstantLoadTimer: int(rate x duration) exponential gaps scaled to the duration."""
    w = _workload(arrival="poisson", stages=[{"rate": "3/s", "duration": "7 s"}, {"rate": "10/s", "duration": "2 s"}])
    t = arrival_times(w, w.requests, np.random.default_rng(1))
    assert w.requests == 21 + 20 and np.all(np.diff(t) > 0)
    shift = 7.0 - t[20]  # stage 0's last request lands on its end
    assert t[-1] + shift == pytest.approx(9.0)
    assert np.all(t[:21] + shift <= 7.0 + 1e-9) and np.all(t[21:] + shift > 7.0)


def test_no_stages_means_no_stage_ids():
    assert request_stages(load_scenario({"workload": {"requests": 5}}).workload, 5) is None


@pytest.mark.parametrize("over,path", [
    ({"rate": "3/s"}, "workload.rate"),
    ({"requests": 7}, "workload.requests"),
    ({"arrival": "closed", "concurrency": 4}, "workload.arrival"),
    ({"arrival": "all_at_once"}, "workload.arrival"),
    ({"stages": []}, "workload.stages"),
    ({"stages": [{"rate": "1/s", "duration": "0.5 s"}]}, "workload.stages.0"),
    ({"stages": [{"rate": "1/s", "duration": "25 h"}]}, "workload.stages.0.duration"),
    ({"stages": [{"rate": "1/s", "duration": "2 s"}] * 101}, "workload.stages"),
    ({"stages": [{"rate": "1000000/s", "duration": "86400 s"}]}, "workload.stages"),
    ({"trace": "trace.csv"}, "workload.stages"),
])
def test_bad_stages_are_one_line_errors(over, path):
    with pytest.raises(ConfigError) as err:
        _workload(**over)
    assert err.value.path == path and "\n" not in str(err.value)


def test_requests_equal_to_the_total_is_accepted():
    assert _workload(requests=30).requests == 30


def test_resolved_scenario_loads_again():
    sc = load_scenario(SMALL)
    again = load_scenario(resolved_dict(sc))
    assert again.workload.requests == 30 and again.workload.rate is None
    assert again.workload.stages == sc.workload.stages


@pytest.fixture(scope="module")
def staged_run():
    return simulator.run(SMALL)


def test_summary_has_one_block_per_stage_keyed_by_arrival(staged_run):
    s, req = staged_run.summary, staged_run.requests
    blocks = s["stages"]
    assert [b["requests"] for b in blocks] == [10, 20]
    assert [(b["rate"], b["start_s"], b["duration_s"]) for b in blocks] == [(2.0, 0.0, 5.0), (4.0, 5.0, 5.0)]
    stage = np.repeat([0, 1], [10, 20])
    for k, b in enumerate(blocks):
        mine = req[(stage == k) & req.completed]
        assert b["requests_completed"] == len(mine)
        assert b["ttft_ms"]["mean"] == pytest.approx(1e3 * mine.ttft_s.mean())
        assert b["e2e_ms"]["mean"] == pytest.approx(1e3 * mine.e2e_s.mean())
        assert b["tpot_ms"]["mean"] == pytest.approx(1e3 * mine.tpot_s.mean())


def test_a_run_without_stages_has_no_stage_block():
    r = simulator.run({**SMALL, "workload": {"requests": 4, "prompt_tokens": 64, "output_tokens": 4}})
    assert "stages" not in r.summary


def _family(tmp_path, stage):
    p = tmp_path / "fam.yaml"
    p.write_text(
        "family: f\nsource: s\nmetric: mean\nbase:\n"
        "  model: {base: llama-3-8b, layers: 2}\n  hardware: {gpu: h100-sxm}\n  record_spans: false\n"
        "  workload: {arrival: constant, prompt_tokens: 64, output_tokens: 8,\n"
        "             stages: [{rate: 2/s, duration: 5 s}, {rate: 4/s, duration: 5 s}]}\n"
        f"cases:\n- {{case: c, stage: {stage}, measured: {{ttft_ms: 10.0}}}}\n")
    return p


def test_validation_case_reads_its_stage(tmp_path, staged_run):
    rows = run_family(load_family(_family(tmp_path, 1)))
    assert rows[0]["predicted"] == pytest.approx(staged_run.summary["stages"][1]["ttft_ms"]["mean"])


@pytest.mark.parametrize("stage", ["-1", "true", "x"])
def test_validation_bad_stage_names_the_key(tmp_path, stage):
    with pytest.raises(ConfigError) as err:
        load_family(_family(tmp_path, stage))
    assert err.value.path == "cases[0].stage"


def test_validation_stage_beyond_the_run_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="stage 2"):
        run_family(load_family(_family(tmp_path, 2)))


def test_a_request_count_that_contradicts_the_stages_says_what_to_set():
    with pytest.raises(ConfigError, match=r"workload.requests: 600 differs from the stages' 80 requests "
                                          r"\(int\(rate x duration\) each\); set it to 80 or drop it"):
        load_scenario(None, {"workload.stages": [{"rate": 4, "duration": 20}]})
