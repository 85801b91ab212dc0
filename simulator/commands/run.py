"""``lastmile run``: simulate one scenario, print a summary, write the run folder."""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

from ..errors import ConfigError

HELP = "simulate a scenario (the built-in default if none is given)"


def add_arguments(p) -> None:
    p.add_argument("scenario", nargs="?", help="scenario YAML file (default: the built-in default scenario)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key, e.g. --set serving.overlap=async (repeatable)")
    p.add_argument("--out", help="run folder (default: runs/<scenario>-<timestamp>)")
    p.add_argument("--json", action="store_true", help="print summary.json to stdout instead of the text summary")
    p.add_argument("--format", choices=("text", "json", "vllm-bench"), default=None,
                   help="what to print: the text summary (default), summary.json (as --json), or the result "
                        "block vllm bench serve prints, from the same run")
    p.add_argument("--percentiles", default=None, metavar="P,P,...",
                   help="percentiles of TTFT, TPOT and ITL for --format vllm-bench and --save-result (vllm bench "
                        "serve's --metric-percentiles; default 99)")
    p.add_argument("--save-result", default=None, metavar="FILE",
                   help="also write the run's metrics as the JSON keys vllm bench serve --save-result writes")
    p.add_argument("--no-write", action="store_true", help="do not write a run folder")
    p.add_argument("--full-trace", action="store_true",
                   help="write every span to trace.json (by default it holds the run's first 250,000, about 45 MB)")
    p.add_argument("--no-trace", action="store_true",
                   help="write the run folder without trace.json (the Perfetto timeline: the largest file of a "
                        "long run with spans)")
    p.add_argument("--no-last-mile-cost", action="store_true",
                   help="skip the counterfactual with the last mile free (an LLM run's last_mile_cost: a second "
                        "simulation of the same scenario and seed)")


def main(args) -> int:
    # Start-up (the simulator's modules, loaded when a run is asked for, not for --help; the
    # scenario) makes many objects and next to no garbage cycles: the cyclic collector waits until
    # it is done (its collections while numpy, pydantic and the models load cost about 60 ms).
    gc.disable()
    try:
        from ..api import load_scenario, run_loaded
        from ..config.loader import parse_override
        from ..report.text import format_summary
        from ..runfolder import check_file_out, check_out, default_out, run_name, write_run

        from ..report.vllm_bench import parse_percentiles

        if args.out is not None and not args.out.strip():
            raise ConfigError("is empty; name the run folder, or leave --out out for runs/<name>-<time>", file="--out")
        overrides = dict(parse_override(o) for o in args.overrides)
        percentiles = parse_percentiles(args.percentiles)
        if args.save_result:
            check_file_out(args.save_result, "--save-result")  # before simulating
        fmt = args.format or ("json" if args.json else "text")
        if args.out and not args.no_write:
            check_out(Path(args.out))  # before simulating: a refused folder costs nothing
        scenario = load_scenario(args.scenario, overrides)
        scenario = scenario.model_copy(update={"name": run_name(scenario.name, overrides)})
    finally:
        gc.enable()
    result = run_loaded(scenario, args.scenario, not args.no_last_mile_cost)
    s = result.summary
    if s.get("status") == "oom":  # an outcome in a sweep; for one run there is nothing to show
        raise ConfigError(s["message"], file=args.scenario or "<default scenario>", path=s["memory_key"])
    out = None
    if not args.no_write:
        out = write_run(result, Path(args.out) if args.out else default_out(result.scenario.name),
                        trace=not args.no_trace, full_trace=args.full_trace)
        cut = result.trace_bound
        if cut:
            print(f"lastmile: note: trace.json holds the run's first {cut['until_s']:.4g} s of {cut['run_s']:.4g} s "
                  f"({cut['spans_written']:,} of {cut['spans_total']:,} slices); --full-trace writes them all",
                  file=sys.stderr)
    for warning in result.summary.get("warnings") or ():  # after the write: an error is then the only line
        print(f"lastmile: warning: {warning}", file=sys.stderr)
    from ..coverage import caveat

    if (line := caveat(result.scenario)) is not None:
        print(f"lastmile: caveat: {line}", file=sys.stderr)
    if args.save_result:
        from ..report.vllm_bench import result_json
        _save(Path(args.save_result), result_json(result, percentiles))
    if fmt == "json":
        json.dump(result.summary, sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif fmt == "vllm-bench":
        from ..report.vllm_bench import result_block
        print(result_block(result, percentiles))
    else:
        print(format_summary(result))
        if out is not None:
            trace = "" if args.no_trace else " trace.json,"
            print(f"\nrun folder: {out}  (summary.json, requests.csv, breakdown.csv, scenario.yaml,{trace} figures)")
    return 0


def _save(path: Path, data: dict) -> None:
    """Write ``data`` as JSON at ``path`` whole or not at all (``runfolder.write_atomically``)."""
    from ..runfolder import write_atomically

    try:
        write_atomically(path, json.dumps(data, indent=2, allow_nan=False) + "\n")
    except OSError as exc:
        raise ConfigError(f"cannot write it ({exc.strerror or exc})", file=f"--save-result {path}") from None
