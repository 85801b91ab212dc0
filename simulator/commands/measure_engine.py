"""``lastmile measure-engine vllm|sglang``: the real vLLM or SGLang serving stack with a stub GPU, as an
oracle for host-path costs (TTFT, TPOT, ITL, throughput and each process's CPU seconds over a sweep)."""

from __future__ import annotations

from ..errors import LastmileError

HELP = ("run the real vLLM or SGLang server and vLLM's benchmark client on this machine with a stand-in GPU "
        "and record latencies and per-process CPU seconds (the engine in its own environment, see --python)")

ENGINES = ("vllm", "vllm-v0", "vllm-v0.6", "sglang")
DEFAULT_PYTHON = {"vllm": ".venv-vllm/bin/python", "vllm-v0": ".venv-vllm05/bin/python",
                  "vllm-v0.6": ".venv-vllm06/bin/python",
                  "sglang": ".venv-sglang/bin/python"}


def _ints(text: str, option: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise LastmileError(f"{option}: expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise LastmileError(f"{option}: expected comma-separated positive integers, got {text!r}")
    return values


def add_arguments(p) -> None:
    p.add_argument("engine", choices=ENGINES, help="the serving engine")
    p.add_argument("--python", default=None,
                   help="python of the environment that has the engine installed (default: "
                        ".venv-vllm/bin/python for vllm, .venv-vllm05/bin/python for vllm-v0 (vLLM 0.5.3), "
                        ".venv-vllm06/bin/python for vllm-v0.6 (vLLM 0.6.0), "
                        ".venv-sglang/bin/python for sglang)")
    p.add_argument("--client-python", default=".venv-vllm/bin/python",
                   help="sglang and the V0 releases: python of the environment whose `vllm bench serve` is the client "
                        "(default: %(default)s)")
    p.add_argument("--out", default=None,
                   help="CSV to write, one row per point; its sidecar (.yaml) goes next to it "
                        "(default: host_path_ENGINE.csv)")
    p.add_argument("--concurrency", default=None,
                   help="client concurrencies (default: 1,16,64,256,1024,2048 for vllm, 1,16,64,256,1024 for "
                        "sglang and the V0 releases)")
    p.add_argument("--stream-interval", default="1,8", help="server --stream-interval values (default: %(default)s)")
    p.add_argument("--api-servers", default="1,2,4",
                   help="vllm only: server --api-server-count values (default: %(default)s)")
    p.add_argument("--output-len", default="64",
                   help="output tokens per response; the first for the whole sweep, each other one at the "
                        "64/256/1024 concurrencies (default: %(default)s)")
    p.add_argument("--work-dir", default=None, help="keep the model folder, logs and raw results here (default: a temp dir)")
    p.add_argument("--client-taskset", default=None, help="pin the client to these CPUs (taskset -c LIST)")
    p.add_argument("--server-taskset", default=None, help="pin the server processes to these CPUs (taskset -c LIST)")
    p.add_argument("--no-gc", action="store_true",
                   help="turn CPython's cyclic garbage collector off in the engine's processes (what it costs: "
                        "run the sweep with and without)")
    p.add_argument("--trace-intake", action="store_true",
                   help="vllm only: time each point's request intake in the server's own code (tokenization, "
                        "add_request, the engine core's pick-up, a scheduler pass; at concurrency 1 the whole chain "
                        "to the first token) and add those columns to the CSV")
    p.add_argument("--quick", action="store_true",
                   help="two concurrencies, one stream interval and API-server count, few prompts (a smoke run)")


def main(args) -> int:
    from ..calibrate.measure_engine import CONCURRENCY, SGLANG_CONCURRENCY, engine_versions, measure_engine

    if args.trace_intake and args.engine != "vllm":
        raise LastmileError(f"measure-engine {args.engine}: --trace-intake traces vLLM V1's intake (engine vllm) only")
    own_client = args.engine != "vllm"  # engines driven by vLLM 0.33's client
    python = args.python or DEFAULT_PYTHON[args.engine]
    out = args.out or f"host_path_{args.engine.replace('-', '_').replace('.', '')}.csv"
    concurrency = _ints(args.concurrency, "--concurrency") if args.concurrency else \
        (CONCURRENCY if args.engine == "vllm" else SGLANG_CONCURRENCY)
    stream_interval = _ints(args.stream_interval, "--stream-interval")
    api_servers = _ints(args.api_servers, "--api-servers")
    engine_versions(python, args.engine)  # a one-line error before anything starts
    if own_client:
        engine_versions(args.client_python, "vllm")  # the client
    result = measure_engine(args.engine, python, out, concurrency=concurrency,
                            stream_interval=stream_interval, api_servers=api_servers, quick=args.quick,
                            work_dir=args.work_dir, client_taskset=args.client_taskset,
                            server_taskset=args.server_taskset,
                            client_python=args.client_python if own_client else None,
                            output_len=_ints(args.output_len, "--output-len"), python_gc=not args.no_gc,
                            trace_intake=args.trace_intake)
    meta = result["meta"]
    print(f"wrote {result['out']}: {len(result['rows'])} points, {args.engine} "
          f"{meta['versions'].get(args.engine.split('-')[0])}"
          + (f", {len(meta['failures'])} failed" if meta["failures"] else ""))
    return 0 if result["rows"] else 1
