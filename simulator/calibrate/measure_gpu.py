"""Measure a CUDA GPU's achievable figures (matmul, HBM copy, D2H latency, launch overhead) and the
kernels the engine profiles name (FP8 GEMMs over M, attention at prefill and decode shapes).

Writes a calibration profile (``gpu:``) with the provenance of every figure (``measured:``).
Without torch or a CUDA GPU it says so in one line and exits 0, so scripts can call it anywhere.

    python -m simulator.calibrate.measure_gpu --out gpu_profile.yaml [--peak-bf16-tflops 989]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

from ..units import fmt_time, parse
from . import measure_kernels

# (M, N, K): compute-bound squares and a wide/flat shape, then decode-like skinny ones
MATMUL_SHAPES = ((8192, 8192, 8192), (4096, 4096, 4096), (16384, 8192, 1024),
                 (1, 8192, 8192), (128, 8192, 8192))
D2H_BATCHES = tuple(2**i for i in range(11))  # 1 .. 1024 requests, 8 bytes each
COPY_BYTES = 2 << 30


def _fmt(value: float, unit: str) -> str:
    """``value`` in SI base units as a string with a decimal prefix: 7.1e14, "FLOPS" -> "710 TFLOPS"."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.4g} {prefix}{unit}"
    return f"{value:.4g} {unit}"


def _load_torch():
    """torch, or None when it is not installed."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def _events_per_call(torch, fn, target_s: float = 0.25, trials: int = 5) -> float:
    """Median over ``trials`` of the GPU time per call of ``fn``, timed with CUDA events.

    The number of calls per trial is chosen so that a trial lasts about ``target_s``.
    """
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    calls = int(min(max(target_s / max(start.elapsed_time(end) * 1e-3, 1e-7), 10), 5000))
    per_call = []
    for _ in range(trials):
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) * 1e-3 / calls)
    return statistics.median(per_call)


def measure_matmul(torch) -> dict[tuple[int, int, int], dict[str, float]]:
    """bf16 matmul time, FLOP/s and operand bytes/s for each of ``MATMUL_SHAPES``."""
    out = {}
    for m, n, k in MATMUL_SHAPES:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        seconds = _events_per_call(torch, lambda: torch.matmul(a, b, out=c))
        out[(m, n, k)] = {"seconds": seconds, "flops": 2.0 * m * n * k / seconds,
                          "bandwidth": 2.0 * (m * k + k * n + m * n) / seconds}
        del a, b, c
    torch.cuda.empty_cache()
    return out


def measure_hbm_copy(torch) -> float:
    """Device-to-device copy bandwidth of a 2 GiB buffer, counting bytes read plus written."""
    src = torch.empty(COPY_BYTES, device="cuda", dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    seconds = _events_per_call(torch, lambda: dst.copy_(src), target_s=0.5)
    del src, dst
    torch.cuda.empty_cache()
    return 2.0 * COPY_BYTES / seconds


def measure_d2h(torch, pinned: bool, reps: int = 200) -> dict[int, float]:
    """Host-observed latency of copying B int64 sampled ids to the host and synchronizing, per B."""
    out = {}
    for batch in D2H_BATCHES:
        src = torch.randint(0, 32_000, (batch,), device="cuda", dtype=torch.int64)
        dst = torch.empty(batch, dtype=torch.int64, pin_memory=pinned)
        samples = []
        for i in range(reps + 10):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=pinned)
            torch.cuda.synchronize()
            if i >= 10:
                samples.append(time.perf_counter() - t0)
        out[batch] = statistics.median(samples)
    return out


def measure_launch(torch, launches: int = 20_000) -> dict[str, float]:
    """Per-launch cost of back-to-back tiny kernels: host-side issue time and wall time to completion."""
    x = torch.zeros(1, device="cuda")
    for _ in range(100):
        x.add_(1)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(launches):
        x.add_(1)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return {"host_issue": (t1 - t0) / launches, "wall": (t2 - t0) / launches}


def measure_graph_kernels(torch, kernels: int = 1000, replays: int = 20) -> float:
    """GPU time per tiny kernel replayed from a CUDA graph: the catalog's ``kernel_floor`` plus
    ``kernel_overhead`` (a one-element add runs for the floor, then the graph waits the gap)."""
    x = torch.zeros(1, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # capture needs a side stream; warm it up first
        for _ in range(3):
            x.add_(1)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(kernels):
            x.add_(1)
    return _events_per_call(torch, graph.replay, target_s=0.2, trials=replays) / kernels


def _driver_version() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
        return out.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


#: Device-name fragments -> the catalog GPU a measured profile builds on (first match wins).
CATALOG_BASES = (("H200", "h200"), ("H100", "h100-sxm"), ("H800", "h800"), ("B200", "b200"),
                 ("A100-PCIE", "a100-pcie-80g"), ("A100", "a100-sxm-80g"), ("L40S", "l40s"), ("L40", "l40"),
                 ("L20", "l20"), ("MI300X", "mi300x"))


def catalog_base(device_name: str) -> str | None:
    """The catalog GPU a device of this name is (None when the name matches none)."""
    upper = device_name.upper().replace(" ", "-")
    return next((base for frag, base in CATALOG_BASES if frag in upper), None)


def measure_profile_kernels(torch, peak_fp8_flops: float | None, peak_hbm_bandwidth: float | None) -> tuple:
    """(achievable fractions, raw figures) of the kernels the engine profiles name: the best FP8 GEMM's
    fraction of the FP8 peak, the decode attention's of the HBM peak (each where a peak is given)."""
    timer = lambda fn: _events_per_call(torch, fn)  # noqa: E731 - CUDA-event time per call
    raw, achievable = {}, {}
    why = measure_kernels.fp8_support(torch)
    if why is None:
        fp8 = measure_kernels.measure_fp8_gemm(torch, timer)
        n, k = measure_kernels.FP8_NK
        raw["matmul_fp8"] = {f"{m}x{n}x{k}": {"time": fmt_time(v["seconds"]), "flops": _fmt(v["flops"], "FLOPS")}
                             for m, v in fp8.items()}
        if peak_fp8_flops:
            achievable["matmul_fp8"] = round(max(v["flops"] for v in fp8.values()) / peak_fp8_flops, 4)
    else:
        raw["matmul_fp8"] = f"not measured: {why}"
    prefill = measure_kernels.measure_prefill_attention(torch, timer)
    raw["attention_prefill_bf16"] = {f"S={s}": {"time": fmt_time(v["seconds"]), "flops": _fmt(v["flops"], "FLOPS")}
                                     for s, v in prefill.items()}
    decode = measure_kernels.measure_decode_attention(torch, timer)
    raw["attention_decode_bf16"] = {f"B={b} L={n}": {"time": fmt_time(v["seconds"]),
                                                     "kv_bandwidth": _fmt(v["bandwidth"], "B/s")}
                                    for (b, n), v in decode.items()}
    if peak_hbm_bandwidth:
        best = max(v["bandwidth"] for v in decode.values())
        raw["attention_decode_bandwidth_fraction"] = round(best / peak_hbm_bandwidth, 4)
    torch.cuda.empty_cache()
    return achievable, raw


def measure_gpu(torch, peak_bf16_flops: float | None = None, peak_hbm_bandwidth: float | None = None,
                command: str = "", base: str | None = None, peak_fp8_flops: float | None = None) -> dict:
    """Run every measurement on the current CUDA device; return the profile (values as unit strings)."""
    started = time.perf_counter()
    name = torch.cuda.get_device_name()
    base = base or catalog_base(name)
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    matmul = measure_matmul(torch)
    hbm = measure_hbm_copy(torch)
    d2h_pageable = measure_d2h(torch, pinned=False)
    d2h_pinned = measure_d2h(torch, pinned=True)
    launch = measure_launch(torch)
    graph_kernel = measure_graph_kernels(torch)
    kernel_fractions, kernels = measure_profile_kernels(torch, peak_fp8_flops, peak_hbm_bandwidth)

    best_flops = max(v["flops"] for v in matmul.values())
    achievable = {}
    if peak_bf16_flops:
        achievable["matmul"] = round(best_flops / peak_bf16_flops, 4)
    if peak_hbm_bandwidth:
        achievable["hbm"] = round(hbm / peak_hbm_bandwidth, 4)
    achievable.update(kernel_fractions)

    # A loadable GPU profile (``hardware.gpu: this file``): the measured figures over the catalog
    # entry of the same GPU (``base``), which supplies what is not measured (peaks, memory, links).
    gpu = {"base": base} if base else {}
    gpu["name"] = name
    if achievable:
        gpu["achievable"] = achievable
    gpu["launch_overhead"] = fmt_time(launch["wall"])
    measured = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "gpu": name,
        "memory": f"{props.total_memory / 2**30:.1f} GiB",
        "multiprocessors": props.multi_processor_count,
        "driver": _driver_version(),
        "cuda": str(torch.version.cuda),
        "torch": str(torch.__version__),  # a TorchVersion (a str subclass safe_dump cannot write)
        "python": platform.python_version(),
        "hostname": platform.node(),
        "command": command,
        "runtime": fmt_time(time.perf_counter() - started),
        "raw": {
            "matmul_bf16": {f"{m}x{n}x{k}": {"time": fmt_time(v["seconds"]), "flops": _fmt(v["flops"], "FLOPS"),
                                             "operand_bandwidth": _fmt(v["bandwidth"], "B/s")}
                            for (m, n, k), v in matmul.items()},
            "hbm_copy_bytes": f"{COPY_BYTES / 2**30:g} GiB",
            "launch_host_issue": fmt_time(launch["host_issue"]),
            "launch_wall": fmt_time(launch["wall"]),
            "graph_tiny_kernel": fmt_time(graph_kernel),
            "matmul_flops_best": _fmt(best_flops, "FLOPS"),
            "hbm_copy_bandwidth": _fmt(hbm, "B/s"),
            "d2h_latency_pinned": {b: fmt_time(s) for b, s in d2h_pinned.items()},
            "d2h_latency_pageable": {b: fmt_time(s) for b, s in d2h_pageable.items()},
            **kernels,
        },
    }
    if peak_bf16_flops:
        measured["peak_bf16_flops"] = _fmt(peak_bf16_flops, "FLOPS")
    if peak_hbm_bandwidth:
        measured["peak_hbm_bandwidth"] = _fmt(peak_hbm_bandwidth, "B/s")
    if peak_fp8_flops:
        measured["peak_fp8_flops"] = _fmt(peak_fp8_flops, "FLOPS")
    return {"gpu": gpu, "measured": measured}


def main(argv: list[str] | None = None) -> int:
    """Command line: measure the GPU and write the profile; a machine without one is not an error."""
    parser = argparse.ArgumentParser(prog="measure_gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu_profile.yaml", help="where to write the YAML profile")
    parser.add_argument("--peak-bf16-tflops", type=float, default=None,
                        help="datasheet dense BF16 peak, to report the achievable fraction")
    parser.add_argument("--peak-fp8-tflops", type=float, default=None,
                        help="datasheet dense FP8 peak, to report the FP8 GEMM's achievable fraction")
    parser.add_argument("--peak-hbm-bandwidth", default=None,
                        help='datasheet HBM bandwidth, e.g. "4.8 TB/s", to report the achievable fraction')
    parser.add_argument("--base", default=None,
                        help="the catalog GPU the profile builds on (default: guessed from the device name)")
    args = parser.parse_args(argv)

    torch = _load_torch()
    if torch is None or not torch.cuda.is_available():
        why = "torch is not installed" if torch is None else "torch.cuda.is_available() is false"
        print(f"measure_gpu: no CUDA GPU is available ({why}); nothing measured")
        return 0

    argv = sys.argv[1:] if argv is None else argv
    profile = measure_gpu(
        torch,
        peak_bf16_flops=args.peak_bf16_tflops * 1e12 if args.peak_bf16_tflops else None,
        peak_hbm_bandwidth=parse(args.peak_hbm_bandwidth, "bandwidth") if args.peak_hbm_bandwidth else None,
        command=" ".join(["python -m simulator.calibrate.measure_gpu", *argv]),
        base=args.base,
        peak_fp8_flops=args.peak_fp8_tflops * 1e12 if args.peak_fp8_tflops else None,
    )
    Path(args.out).write_text(yaml.safe_dump(profile, sort_keys=False))
    print(yaml.safe_dump({"gpu": profile["gpu"]}, sort_keys=False), end="")
    print(f"wrote {args.out} in {profile['measured']['runtime']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
