"""``lastmile calibrate``: fit a hardware profile (achievable GPU fractions, CPU costs) to measured runs."""

from __future__ import annotations

import shlex
import statistics
import sys

HELP = ("fit a GPU's achievable compute/HBM fractions, launch cost and the CPU costs to measured runs; "
        "write a hardware profile")

EPILOG = """\
MEASUREMENTS.csv: one measured run per row; '#' lines are comments.
  required columns: model (catalog name), metric, measured
  metric: tpot_ms | ttft_ms | itl_ms | e2e_ms (means, ms) | output_tokens_per_s
          | latency_s (mean image latency of a kind=dit row)
  optional: dtype, tp, pp, prompt_tokens, output_tokens, batch (N requests arriving at once),
            requests, rate (req/s, Poisson), max_batch, detokenizer, overlap, stream_interval,
            cuda_graphs, any dotted scenario key (serving.max_batched_tokens), source, note;
            DiT rows: kind=dit, resolution, steps, cfg, text_encode, dotted parallel.* keys
example:
  model,tp,prompt_tokens,output_tokens,batch,metric,measured,source
  llama-2-7b,1,5,200,1,tpot_ms,9.53,gpt-fast README
Fewer independent rows than free parameters leave the fit under-determined: the residuals
vanish, the values mean nothing, and the output and the profile say so.
Fitted: achievable.matmul, achievable.hbm (achievable.matmul_fp8 scales with matmul),
cpu.schedule_per_step, cpu.detokenize_per_token, cpu.stream_per_chunk, and the GPU's
launch_overhead when a row runs eager (DiT, or cuda_graphs false). A parameter no row is
sensitive to keeps its starting value. --max-iter 0 evaluates a profile on rows without
fitting (a held-out check). See docs/calibration.md.
"""


def add_arguments(p) -> None:
    import argparse

    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = EPILOG
    p.add_argument("measurements", metavar="MEASUREMENTS.csv", help="table of measured runs (format below)")
    p.add_argument("--hardware", required=True, metavar="NAME",
                   help="catalog GPU (e.g. a100-sxm-80g) or a GPU profile YAML the fit starts from")
    p.add_argument("--cpu", default="reference", help="CPU profile the fit starts from (default: reference)")
    p.add_argument("--out", default="calibrated_profile.yaml",
                   help="profile YAML to write (default: calibrated_profile.yaml)")
    p.add_argument("--max-iter", type=int, default=25,
                   help="Levenberg-Marquardt iterations (default: 25; 0 only evaluates the starting profile, "
                        "e.g. a fitted one on held-out rows, and writes nothing)")


def main(args) -> int:
    from ..calibrate.fit import fit, profile_dict, read_measurements, write_profile
    from .. import progress
    from ..errors import ConfigError

    if args.max_iter < 0:
        raise ConfigError(f"--max-iter must be >= 0, got {args.max_iter}")
    if getattr(args, "out", None):
        from ..runfolder import check_file_out

        check_file_out(args.out, "--out")
    rows = read_measurements(args.measurements)
    say = None if progress.level() == progress.QUIET else (lambda s: print(f"calibrate: {s}", file=sys.stderr))
    result = fit(rows, args.hardware, args.cpu, max_iter=args.max_iter, progress=say)
    evaluate_only = args.max_iter == 0
    if evaluate_only:
        print(f"evaluated {len(rows)} rows on {args.hardware} (no fit: --max-iter 0)")
    else:
        command = "lastmile calibrate " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if len(sys.argv) > 2 \
            else f"lastmile calibrate {args.measurements} --hardware {args.hardware}"
        write_profile(args.out, profile_dict(result, args.hardware, args.cpu, args.measurements, command))
        print(f"fitted {len(rows)} rows on {args.hardware} in {result.iterations} iterations "
              f"({result.runs} simulated runs)")
    print(f"  {'parameter':<22} {'value' if evaluate_only else 'start':>12} {'' if evaluate_only else 'fitted':>12}")
    for k, v in result.values.items():
        s0 = result.start[k]
        fmt = (lambda x: f"{x:.4f}") if k in ("matmul", "hbm") else (lambda x: f"{x * 1e6:.3f} us")
        if evaluate_only:
            print(f"  {k:<22} {fmt(s0):>12}")
            continue
        tag = "" if result.identifiable[k] else "  (no row is sensitive to it: kept)"
        print(f"  {k:<22} {fmt(s0):>12} {fmt(v):>12}{tag}")
    print(f"\n  {'row':>4} {'model':<14} {'metric':<20} {'measured':>10} {'predicted':>10} {'residual':>9}")
    for p, m in zip(result.predicted, result.measurements):
        print(f"  {m.row:>4} {m.overrides['model']:<14} {m.metric:<20} {m.measured:>10.4g} {p:>10.4g} "
              f"{100 * (p / m.measured - 1):>+8.2f}%")
    res = [abs(x) for x in result.residuals_pct]
    print(f"\n  |residual|: median {statistics.median(res):.2f}%, max {max(res):.2f}%")
    warning = result.underdetermined_message()
    if warning:
        print(f"\nWARNING: {warning}")
        print(f"lastmile: warning: {warning}", file=sys.stderr)
    if not evaluate_only:
        print(f"wrote {args.out}; use it with  hardware: {{gpu: {args.out}, cpu: {args.out}}}")
    return 0
