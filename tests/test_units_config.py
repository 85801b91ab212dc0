"""Units at the boundary and scenario validation: every bad input is one clear ConfigError."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from simulator.config.loader import load_scenario, parse_override
from simulator.errors import ConfigError, UnitError
from simulator.units import fmt_time, parse


@pytest.mark.parametrize("text,dim,expected", [
    ("3.35 TB/s", "bandwidth", 3.35e12),
    ("100 Gbit/s", "bandwidth", 12.5e9),
    ("989 TFLOPS", "flops", 989e12),
    ("8 us", "time", 8e-6),
    ("1.5ms", "time", 1.5e-3),
    ("80 GiB", "bytes", 80 * 2**30),
    ("80 GB", "bytes", 80e9),
    ("4/s", "rate", 4.0),
    (5, "time", 5.0),
    ("2e3", "time", 2000.0),
])
def test_parse_units(text, dim, expected):
    assert parse(text, dim) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("text,dim", [("3 parsecs", "bytes"), ("fast", "time"), ("8 TB/s", "time"),
                                      (True, "time"), ("nan s", "time")])
def test_parse_rejects(text, dim):
    with pytest.raises(UnitError):
        parse(text, dim)


@given(st.floats(min_value=1e-9, max_value=1e4, allow_nan=False))
def test_time_round_trip_through_text(seconds):
    assert parse(fmt_time(seconds), "time") == pytest.approx(seconds, rel=5e-3)


def test_default_scenario_resolves_catalog_and_defaults():
    sc = load_scenario()
    assert sc.hardware.gpu.name == "h100-sxm"
    assert sc.hardware.gpu_link.name == "nvlink4"      # the GPU's default links
    assert sc.hardware.host_link.bandwidth == 63e9
    assert sc.serving.engine.name == "vllm-v1" and sc.hardware.cpu.name == "vllm-v1"  # the engine's costs
    assert sc.model.name == "llama-3-8b"


def test_override_any_catalog_field():
    sc = load_scenario(None, {"hardware.gpu.hbm_bandwidth": "3 TB/s", "model.layers": 8})
    assert sc.hardware.gpu.hbm_bandwidth == 3e12
    assert sc.hardware.gpu.name == "h100-sxm"
    assert sc.model.layers == 8


def test_inline_and_based_entries():
    sc = load_scenario({"model": "llama-2-7b", "hardware": {"gpu": {"base": "a100-sxm-80g", "memory": "40 GB"}}})
    assert sc.hardware.gpu.memory == 40e9
    assert sc.hardware.gpu.peak_flops["bf16"] == 312e12


def test_measured_cpu_profile_is_a_scenario_option():
    sc = load_scenario(None, {"hardware.cpu": "cpu_measured_buildhost.yaml"})
    assert sc.hardware.cpu.measured["tokenizers"]
    assert 0 < sc.hardware.cpu.detokenize_per_token < 1e-4
    # Costs the profile does not measure come from the reference profile.
    assert sc.hardware.cpu.schedule_per_request == load_scenario().hardware.cpu.schedule_per_request


@pytest.mark.parametrize("overrides,path,words", [
    ({"serving.ovrlap": "async"}, "serving.ovrlap", "did you mean 'overlap'"),
    ({"serving.overlap": "asap"}, "serving.overlap", "'sync', 'async' or 'async_output'"),
    ({"hardware.gpu.memory": "3 parsecs"}, "hardware.gpu.memory", "unknown unit"),
    ({"hardware.gpu.hbm_bandwidth": 0}, "hardware.gpu.hbm_bandwidth", "greater than zero"),
    ({"hardware.host_link.bandwidth": "0 GB/s"}, "hardware.host_link.bandwidth", "greater than zero"),
    ({"hardware.gpu": "h100"}, "hardware.gpu", "unknown gpu 'h100'"),
    ({"model": "llama-4"}, "model", "unknown llm"),
    ({"workload.prompt_tokens": -5}, "workload.prompt_tokens", "greater than 0"),
    ({"workload.arrival": "closed"}, "workload", "concurrency"),
    ({"kind": "diffusion"}, "kind", "unknown kind"),
])
def test_bad_values_name_the_key(overrides, path, words):
    with pytest.raises(ConfigError) as info:
        load_scenario(None, overrides)
    msg = str(info.value)
    assert msg.startswith(f"<default scenario>: {path}:"), msg
    assert words in msg
    assert "\n" not in msg


def test_scenario_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: llama-3-8b\nserving: {max_batch: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: not valid YAML at line"):
        load_scenario(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_scenario(tmp_path / "missing.yaml")


@pytest.mark.parametrize("text,key,value", [("serving.overlap=async", "serving.overlap", "async"),
                                            ("parallel.tp=2", "parallel.tp", 2),
                                            ("hardware.gpu_link=null", "hardware.gpu_link", None)])
def test_parse_override(text, key, value):
    assert parse_override(text) == (key, value)


def test_override_needs_equals():
    with pytest.raises(ConfigError, match="key=value"):
        parse_override("serving.overlap")
