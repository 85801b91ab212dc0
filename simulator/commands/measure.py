"""``lastmile measure-cpu``: measure real detokenization and streaming costs on this machine."""

from __future__ import annotations

from ..errors import LastmileError

HELP = "measure this machine's detokenization, tokenization and SSE-chunk costs (needs the [cpu] extra)"


def add_arguments(p) -> None:
    p.add_argument("--out", default="cpu_profile.yaml", help="CPU profile YAML to write (default: cpu_profile.yaml)")
    p.add_argument("--quick", action="store_true", help="fewer batch sizes and repetitions (a few seconds)")
    p.add_argument("--seed", type=int, default=0)


def main(args) -> int:
    try:
        from ..calibrate.measure_cpu import measure_cpu
    except ImportError as exc:  # pragma: no cover - the module itself imports nothing optional
        raise LastmileError(str(exc)) from None
    try:
        profile = measure_cpu(args.out, quick=args.quick, seed=args.seed)
    except ImportError as exc:
        raise LastmileError(str(exc)) from None
    cpu = profile["cpu"]
    print(f"wrote {args.out}: detokenize_per_token={cpu['detokenize_per_token']}, "
          f"stream_per_chunk={cpu['stream_per_chunk']}, tokenize_per_token={cpu['tokenize_per_token']}")
    print(f"use it in a scenario with  hardware: {{cpu: {args.out}}}")
    return 0
