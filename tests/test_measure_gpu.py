"""The GPU calibration script takes the no-GPU path cleanly: one line, exit 0, nothing written."""

import sys
import types

import pytest

from simulator.calibrate import measure_gpu
from simulator.units import parse


def test_without_torch_returns_0_and_writes_nothing(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    out = tmp_path / "gpu.yaml"
    assert measure_gpu.main(["--out", str(out)]) == 0
    assert not out.exists()
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 1 and "no CUDA GPU" in printed[0]


def test_without_cuda_returns_0_and_writes_nothing(monkeypatch, tmp_path, capsys):
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: False))
    monkeypatch.setattr(measure_gpu, "_load_torch", lambda: fake)
    out = tmp_path / "gpu.yaml"
    assert measure_gpu.main(["--out", str(out), "--peak-bf16-tflops", "989"]) == 0
    assert not out.exists()
    assert "is_available() is false" in capsys.readouterr().out


@pytest.mark.parametrize("value,unit,dimension", [(7.12e14, "FLOPS", "flops"), (4.3e12, "B/s", "bandwidth"),
                                                  (2.5e10, "B/s", "bandwidth"), (12.0, "FLOPS", "flops")])
def test_rates_are_written_in_units_the_catalog_parses(value, unit, dimension):
    assert parse(measure_gpu._fmt(value, unit), dimension) == pytest.approx(value, rel=1e-3)


class _FakeTensor:
    def __init__(self, *shape, **kwargs):
        self.shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], tuple) else shape

    def copy_(self, src, non_blocking=False):
        return self

    fill_ = add_ = to = lambda self, *a, **k: self

    def t(self):
        return _FakeTensor(*reversed(self.shape))

    def repeat_interleave(self, times, dim):
        return _FakeTensor(*(d * times if i == dim else d for i, d in enumerate(self.shape)))


class _FakeEvent:
    def __init__(self, enable_timing=False):
        self.t = 0.0

    def record(self):
        import time
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return max(end.t - self.t, 1e-6) * 1e3


class _FakeGraph:
    def replay(self):
        pass


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _fake_torch(capability=(9, 0), gqa=True):
    """Just enough of torch's API to drive every measurement without a GPU (``capability``: the
    device's compute capability; ``gqa``: whether its fused attention takes grouped KV heads)."""
    tensor = lambda *a, **k: _FakeTensor(*a)  # noqa: E731
    calls = []

    def sdpa(q, k, v, is_causal=False, **kw):
        if kw and not gqa:
            raise TypeError("unexpected keyword argument 'enable_gqa'")
        calls.append((q.shape, k.shape, is_causal))
        return _FakeTensor(*q.shape)

    cuda = types.SimpleNamespace(get_device_capability=lambda *a: capability,
        is_available=lambda: True, synchronize=lambda: None, Event=_FakeEvent, empty_cache=lambda: None,
        get_device_name=lambda *a: "Fake GPU", current_device=lambda: 0,
        Stream=lambda: None, stream=lambda s: _Nothing(), CUDAGraph=_FakeGraph, graph=lambda g: _Nothing(),
        get_device_properties=lambda i: types.SimpleNamespace(total_memory=80 * 2**30, multi_processor_count=132))
    return types.SimpleNamespace(
        cuda=cuda, version=types.SimpleNamespace(cuda="12.4"), __version__="0.0-fake",
        bfloat16="bf16", int64="i64", uint8="u8", float32="f32", float8_e4m3fn="e4m3",
        randn=tensor, empty=tensor, empty_like=tensor, zeros=tensor, randint=tensor, matmul=tensor, ones=tensor,
        _scaled_mm=lambda a, b, **k: _FakeTensor(a.shape[0], b.shape[1]),
        nn=types.SimpleNamespace(functional=types.SimpleNamespace(scaled_dot_product_attention=sdpa)),
        attention_calls=calls)


def test_gpu_path_writes_a_parseable_profile(monkeypatch, tmp_path):
    import yaml

    monkeypatch.setattr(measure_gpu, "_load_torch", _fake_torch)
    monkeypatch.setattr(measure_gpu, "_driver_version", lambda: "550.00")
    out = tmp_path / "gpu.yaml"
    assert measure_gpu.main(["--out", str(out), "--peak-bf16-tflops", "989", "--peak-hbm-bandwidth", "4.8 TB/s"]) == 0
    profile = yaml.safe_load(out.read_text())
    gpu, raw = profile["gpu"], profile["measured"]["raw"]
    assert gpu["name"] == "Fake GPU"
    assert set(gpu["achievable"]) == {"matmul", "hbm"}
    assert parse(raw["matmul_flops_best"], "flops") > 0
    assert parse(raw["hbm_copy_bandwidth"], "bandwidth") > 0
    assert parse(gpu["launch_overhead"], "time") > 0
    assert sorted(raw["d2h_latency_pinned"]) == list(measure_gpu.D2H_BATCHES)
    assert sorted(raw["d2h_latency_pageable"]) == list(measure_gpu.D2H_BATCHES)  # not vacuous below
    assert all(parse(v, "time") > 0 for v in raw["d2h_latency_pageable"].values())
    assert profile["measured"]["driver"] == "550.00" and "--peak-bf16-tflops" in profile["measured"]["command"]
    assert parse(raw["graph_tiny_kernel"], "time") > 0


def test_a_measured_profile_loads_as_hardware_gpu(monkeypatch, tmp_path):
    """What measure-gpu writes runs as ``hardware.gpu: <file>``: its figures over the catalog GPU it is."""
    import simulator as sim

    monkeypatch.setattr(measure_gpu, "_load_torch", _fake_torch)
    monkeypatch.setattr(measure_gpu, "_events_per_call", lambda *a, **k: 0.01)  # 10 ms a call: fractions < 1
    out = tmp_path / "gpu.yaml"
    assert measure_gpu.main(["--out", str(out), "--peak-bf16-tflops", "989", "--peak-hbm-bandwidth", "4.8 TB/s",
                             "--base", "h200"]) == 0
    sc = sim.load_scenario({"hardware": {"gpu": str(out)}, "workload": {"requests": 2}})
    assert sc.hardware.gpu.name == "Fake GPU" and sc.hardware.gpu.memory == parse("141 GB", "bytes")
    assert sc.hardware.gpu.measured["driver"]


@pytest.mark.parametrize("name, base", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100-sxm"),
                                        ("NVIDIA A100-PCIE-40GB", "a100-pcie-80g"), ("NVIDIA L40S", "l40s"),
                                        ("Some GPU", None)])
def test_the_catalog_base_is_guessed_from_the_device_name(name, base):
    assert measure_gpu.catalog_base(name) == base


def test_the_profile_kernels_are_timed_at_every_shape(monkeypatch, tmp_path):
    """FP8 GEMMs at every M of a step, attention at each prefill and decode shape; the FP8 and the
    decode attention's fractions of the peaks given (10 ms a call: far below any peak)."""
    import yaml

    from simulator.calibrate import measure_kernels as mk

    monkeypatch.setattr(measure_gpu, "_load_torch", _fake_torch)
    monkeypatch.setattr(measure_gpu, "_events_per_call", lambda *a, **k: 0.01)
    out = tmp_path / "gpu.yaml"
    assert measure_gpu.main(["--out", str(out), "--peak-fp8-tflops", "1979", "--peak-hbm-bandwidth", "4.8 TB/s",
                             "--base", "h200"]) == 0
    profile = yaml.safe_load(out.read_text())
    raw = profile["measured"]["raw"]
    n, k = mk.FP8_NK
    assert list(raw["matmul_fp8"]) == [f"{m}x{n}x{k}" for m in mk.FP8_M]
    assert parse(raw["matmul_fp8"][f"8192x{n}x{k}"]["flops"], "flops") == pytest.approx(2 * 8192 * n * k / 0.01,
                                                                                        rel=1e-3)
    assert profile["gpu"]["achievable"]["matmul_fp8"] == pytest.approx(2 * 8192 * n * k / 0.01 / 1979e12, abs=1e-4)
    assert list(raw["attention_prefill_bf16"]) == [f"S={s}" for s in mk.PREFILL_S]
    assert list(raw["attention_decode_bf16"]) == [f"B={b} L={n}" for b, n in mk.DECODE_BL]
    kv = 2 * 128 * mk.KV_HEADS * 1024 * mk.HEAD_DIM * 2
    assert raw["attention_decode_bandwidth_fraction"] == pytest.approx(kv / 0.01 / 4.8e12, abs=1e-4)


def test_fp8_is_not_measured_on_a_gpu_without_it(monkeypatch):
    monkeypatch.setattr(measure_gpu, "_events_per_call", lambda *a, **k: 0.01)
    torch = _fake_torch(capability=(8, 0))
    from simulator.calibrate import measure_kernels as mk

    assert "sm_80" in mk.fp8_support(torch)
    fractions, raw = measure_gpu.measure_profile_kernels(torch, 312e12, 2.0e12)
    assert raw["matmul_fp8"].startswith("not measured: sm_80") and "matmul_fp8" not in fractions


def test_without_grouped_kv_heads_the_repeated_heads_are_the_bytes_read(monkeypatch):
    from simulator.calibrate import measure_kernels as mk

    torch = _fake_torch(gqa=False)
    decode = mk.measure_decode_attention(torch, lambda fn: (fn(), 0.01)[1])
    b, n = mk.DECODE_BL[0]
    assert decode[(b, n)]["bandwidth"] == pytest.approx(2 * b * mk.HEADS * n * mk.HEAD_DIM * 2 / 0.01)
    assert all(kv[1] == mk.HEADS for _, kv, _ in torch.attention_calls)  # the repeated heads ran
