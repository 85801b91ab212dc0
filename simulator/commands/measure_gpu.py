"""``lastmile measure-gpu``: measure matmul, HBM, D2H and launch costs and the engine profiles' kernels
(FP8 GEMMs, attention) on a local NVIDIA GPU."""

from __future__ import annotations

HELP = ("measure this machine's GPU (matmul, HBM copy, D2H latency, launch overhead, FP8 GEMMs over M, "
        "attention at prefill and decode shapes); exits 0 without a GPU")


def add_arguments(p) -> None:
    p.add_argument("--out", default="gpu_profile.yaml")
    p.add_argument("--peak-bf16-tflops", type=float, default=None)
    p.add_argument("--peak-fp8-tflops", type=float, default=None)
    p.add_argument("--peak-hbm-bandwidth", default=None)
    p.add_argument("--base", default=None, help="the catalog GPU the profile builds on (default: from the device name)")


def main(args) -> int:
    from ..calibrate.measure_gpu import main as measure
    argv = ["--out", args.out]
    for flag, value in (("--peak-bf16-tflops", args.peak_bf16_tflops), ("--peak-fp8-tflops", args.peak_fp8_tflops),
                        ("--peak-hbm-bandwidth", args.peak_hbm_bandwidth), ("--base", args.base)):
        if value is not None:
            argv += [flag, str(value)]
    return measure(argv)
