"""``lastmile measure-gpu``: measure matmul, HBM, D2H and launch costs on a local NVIDIA GPU."""

from __future__ import annotations

HELP = "measure this machine's GPU (matmul, HBM copy, D2H latency, launch overhead); exits 0 without a GPU"


def add_arguments(p) -> None:
    p.add_argument("--out", default="gpu_profile.yaml")
    p.add_argument("--peak-bf16-tflops", type=float, default=None)
    p.add_argument("--peak-hbm-bandwidth", default=None)


def main(args) -> int:
    from ..calibrate.measure_gpu import main as measure
    argv = ["--out", args.out]
    if args.peak_bf16_tflops is not None:
        argv += ["--peak-bf16-tflops", str(args.peak_bf16_tflops)]
    if args.peak_hbm_bandwidth is not None:
        argv += ["--peak-hbm-bandwidth", args.peak_hbm_bandwidth]
    return measure(argv)
