"""``lastmile measure-cpu``: measure real detokenization and streaming costs on this machine, and with
``--engine-out`` a serving engine's host-path costs (output objects, inter-process messages, SSE chunks)."""

from __future__ import annotations

from ..errors import LastmileError

HELP = "measure this machine's detokenization, tokenization and SSE-chunk costs (needs the [cpu] extra)"


def add_arguments(p) -> None:
    p.add_argument("--out", default="cpu_profile.yaml", help="CPU profile YAML to write (default: cpu_profile.yaml)")
    p.add_argument("--engine-out", metavar="PATH", default=None,
                   help="also measure the engine host path (per-step output objects, msgpack/pickle over ZeroMQ, "
                        "SSE chunks through uvicorn) and write an engine profile (base: vllm-v1) to PATH; a PATH "
                        "that exists must be an earlier engine profile")
    p.add_argument("--quick", action="store_true", help="fewer batch sizes and repetitions (a few seconds)")
    p.add_argument("--seed", type=int, default=0)


def main(args) -> int:
    try:
        from ..calibrate.measure_cpu import measure_cpu
    except ImportError as exc:  # pragma: no cover - the module itself imports nothing optional
        raise LastmileError(str(exc)) from None
    engine_out = getattr(args, "engine_out", None)
    try:
        profile = measure_cpu(args.out, quick=args.quick, seed=args.seed, engine_out=engine_out)
    except ImportError as exc:
        raise LastmileError(str(exc)) from None
    cpu = profile["cpu"]
    print(f"wrote {args.out}: detokenize_per_token={cpu['detokenize_per_token']}, "
          f"stream_per_chunk={cpu['stream_per_chunk']}, tokenize_per_token={cpu['tokenize_per_token']}")
    print(f"use it in a scenario with  hardware: {{cpu: {args.out}}}")
    if engine_out is not None:
        import yaml

        with open(engine_out) as f:
            costs = yaml.safe_load(f)["engine"]["costs"]
        print(f"wrote {engine_out}: " + ", ".join(f"{k}={v}" for k, v in costs.items()))
        print(f"use it in a scenario with  serving: {{engine: {engine_out}}}")
    return 0
