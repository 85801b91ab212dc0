"""The host-path oracle's data as the simulator reads it (issue 23): the validation family and the
measured engine profile stay what the committed measurement says, with no engine installed."""

from pathlib import Path

import pytest
import yaml

from simulator.calibrate import host_path as hp
from simulator.calibrate.measure_engine import read_csv
from simulator.config import catalog
from simulator.validate import discover

ROOT = Path(__file__).resolve().parents[1]
SIDECAR = ROOT / "scenarios/validation/reference/host_path_vllm.yaml"


@pytest.mark.parametrize("engine", ["vllm", "sglang", "vllm_v0", "vllm_v06"])
def test_the_family_is_the_measurement(engine):
    """Every measured point is a case, with its client-side means, and the base runs the stub's step."""
    fam = next(f for f in discover() if f.name == f"host_path_{engine}")
    points = read_csv(hp.reference_path(engine))
    assert len(fam.cases) == len(points) >= 9
    for case, p in zip(fam.cases, points):
        assert case.overrides["workload.concurrency"] == p["concurrency"]
        assert case.overrides["serving.api_servers"] == p["api_servers"]
        for metric, column in hp.METRICS.items():
            assert case.measured[metric] == float(f"{p[column]:.6g}")
    side = yaml.safe_load((ROOT / f"scenarios/validation/reference/host_path_{engine}.yaml").read_text())
    assert fam.base["hardware"]["step_time"] == {"fixed": side["stub_step"]["a_s"],
                                                 "per_decode": side["stub_step"]["b_s"],
                                                 "per_prefill_token": side["stub_step"]["c_s"]}


def test_the_measured_profile_is_the_fit_of_cpu_seconds(tmp_path):
    """The catalog's vllm-v1-measured costs are the sidecar's fits mapped onto the simulator's terms,
    nothing tuned; a profile written from the same sidecar loads to the same costs."""
    side = yaml.safe_load(SIDECAR.read_text())
    entry = catalog.entry("cpus", "vllm-v1-measured")
    fitted = hp.profile_costs(side["fits"])
    assert {k: entry[k] for k in fitted} == {k: (v if isinstance(v, int) else v) for k, v in fitted.items()}
    assert catalog.entry("engines", "vllm-v1-measured")["cpu"] == "vllm-v1-measured"
    written = hp.write_profile(side, tmp_path / "mine.yaml", "host_path_vllm.csv")
    assert written["engine"]["costs"] == fitted
    from simulator.api import load_scenario
    mine = load_scenario(None, {"serving.engine": str(tmp_path / "mine.yaml")}).hardware.cpu
    ours = load_scenario(None, {"serving.engine": "vllm-v1-measured"}).hardware.cpu
    assert mine.model_dump(exclude={"name", "source", "sources", "measured"}) == \
        ours.model_dump(exclude={"name", "source", "sources", "measured"})


def test_the_sglang_family_runs_the_fit_of_cpu_seconds():
    """host_path_sglang's costs are the SGLang sidecar's fits mapped onto the separate-detokenizer layout."""
    side = yaml.safe_load((ROOT / "scenarios/validation/reference/host_path_sglang.yaml").read_text())
    fam = next(f for f in discover() if f.name == "host_path_sglang")
    assert fam.base["serving"]["engine"] == {"base": "sglang", "costs": hp.sglang_costs(side["fits"])}


def test_vllm_0_5s_profile_is_the_fit_of_its_own_server():
    """The catalog's vllm-0.5 costs are the V0 sidecar's py-spy-split fits mapped onto the simulator's terms
    (host_path.v0_costs), nothing tuned; the model runner's input preparation, which the stub does not run,
    keeps its own source and is zero in host_path_vllm_v0, which checks the rest against the same stub."""
    side = yaml.safe_load((ROOT / "scenarios/validation/reference/host_path_vllm_v0.yaml").read_text())
    entry = catalog.entry("cpus", "vllm-0.5")
    fitted = hp.v0_costs(side["fits"])
    assert {k: entry[k] for k in fitted} == fitted
    assert entry["prepare_per_request"] != "0 us" and "gc_per_request_pair" not in entry
    fam = next(f for f in discover() if f.name == "host_path_vllm_v0")
    assert fam.base["serving"]["engine"] == {"base": "vllm-0.5", "costs": {"prepare_per_request": "0 us"}}


def test_the_collectors_cost_is_what_the_two_committed_sweeps_give():
    """The same server measured with CPython's collector off (host_path_vllm_v0_nogc): its sidecar says so, and
    its collector fit is the two committed sweeps' difference per request pair (measure_engine_v0.fit_gc),
    with the collector-free costs it leaves (host_path.v0_costs with the fit) below the averaged ones."""
    from simulator.calibrate.measure_engine_v0 import fit_gc

    ref = ROOT / "scenarios/validation/reference"
    off = yaml.safe_load((ref / "host_path_vllm_v0_nogc.yaml").read_text())
    assert off["measured"]["python_gc"] == "off"
    gc = fit_gc(read_csv(ref / "host_path_vllm_v0.csv"), read_csv(ref / "host_path_vllm_v0_nogc.csv"))
    assert gc["coefficients"] == off["fits"]["gc"]["coefficients"] and gc["coefficients"]["per_request_pair_s"] > 0
    free, averaged = hp.v0_costs(off["fits"], gc), catalog.entry("cpus", "vllm-0.5")
    assert float(free["stream_per_chunk"].split()[0]) < float(averaged["stream_per_chunk"].split()[0])


def test_vllm_0_6s_profile_is_the_fit_of_its_two_processes():
    """The catalog's vllm-0.6 costs are the 0.6 sidecar's fits (its engine process split by py-spy, its
    API-server process whole) mapped by host_path.v06_costs; host_path_vllm_v06 runs them with async output
    processing where the measured point had it."""
    side = yaml.safe_load((ROOT / "scenarios/validation/reference/host_path_vllm_v06.yaml").read_text())
    entry = catalog.entry("cpus", "vllm-0.6")
    fitted = hp.v06_costs(side["fits"])
    assert {k: entry[k] for k in fitted} == fitted
    fam = next(f for f in discover() if f.name == "host_path_vllm_v06")
    assert fam.base["serving"]["engine"] == {"base": "vllm-0.6", "costs": {"prepare_per_request": "0 us"}}
    assert {c.overrides["serving.overlap"] for c in fam.cases} == {"async_output", "sync"}
    assert fam.base["serving"]["api_server_loop"] == "asyncio_per_output"
