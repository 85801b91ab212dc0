"""The host-path oracle's data as the simulator reads it (issue 23): the validation family and the
measured engine profile stay what the committed measurement says, with no engine installed."""

from pathlib import Path

import yaml

from simulator.calibrate import host_path as hp
from simulator.validate import discover

ROOT = Path(__file__).resolve().parents[1]
SIDECAR = ROOT / "scenarios/validation/reference/host_path_vllm.yaml"
PROFILE = ROOT / "simulator/config/profiles/engine_measured_vllm_stub.yaml"


def test_the_family_is_the_measurement():
    """Every measured point is a case, with its client-side means, and the base runs the stub's step."""
    fam = next(f for f in discover() if f.name == "host_path_vllm")
    points = hp.read_points(hp.reference_path())
    assert len(fam.cases) == len(points) >= 12
    for case, p in zip(fam.cases, points):
        assert case.overrides["workload.concurrency"] == p["concurrency"]
        assert case.overrides["serving.api_servers"] == p["api_servers"]
        for metric, column in hp.METRICS.items():
            assert case.measured[metric] == float(f"{p[column]:.6g}")
    side = yaml.safe_load(SIDECAR.read_text())
    assert fam.base["hardware"]["step_time"] == {"fixed": side["stub_step"]["a_s"],
                                                 "per_decode": side["stub_step"]["b_s"],
                                                 "per_prefill_token": side["stub_step"]["c_s"]}


def test_the_profile_is_the_fit_of_cpu_seconds():
    """The committed profile's costs are the sidecar's fits mapped onto vllm-v1's terms, nothing tuned."""
    side = yaml.safe_load(SIDECAR.read_text())
    profile = yaml.safe_load(PROFILE.read_text())
    assert profile["engine"]["base"] == "vllm-v1"
    assert profile["engine"]["costs"] == hp.profile_costs(side["fits"])
    assert profile["measured"]["versions"]["vllm"] == side["measured"]["versions"]["vllm"]
