"""Speed benchmark of the whole `lastmile run` process, in seconds and in a machine-independent unit.

    .venv/bin/python benchmarks/run.py                        # `make bench`: the 10k-request scenario, spans off and on
    .venv/bin/python benchmarks/run.py --series               # `make bench-series`: 1k, 10k, 100k, 1M requests
    .venv/bin/python benchmarks/run.py --series --max-requests 100000 --repeats 1
    .venv/bin/python benchmarks/run.py --series --min-requests 1000000 --repeats 1   # the 1M row alone
    .venv/bin/python benchmarks/run.py --engines [--series --max-requests 100000]    # each engine profile's own layout

What it measures, in one invocation:

- **reference**: the wall time of 1,000,000 SimPy timeouts (``env.timeout(1)`` yielded by one process,
  ``env.run()`` timed) in a fresh Python process. Wall time divided by it is the run's cost in
  *reference units*, which moves much less than seconds between machines and Python builds.
- **runs**: ``lastmile run SCENARIO --no-write --no-last-mile-cost -q --json --set record_spans=...`` as a child process:
  wall clock as the shell sees it (interpreter start, imports, loading the trace, simulating, the
  summary) and that child's own peak RSS (``os.wait4``'s rusage, so one child's peak is not another's).

With ``--engines``, each engine profile (``ENGINES``) runs the same requests with its own serving
layout (the profile's ``serving`` defaults from the catalog: overlap, where it detokenizes, messages),
interleaved with the plain benchmark, and each record gives its ratio to the plain one in the same
round (the median of the rounds' ratios).

Each measurement is repeated (default 3) with the configurations interleaved (reference, spans off,
spans on, then again), and the median is reported. Records go as JSON lines to
``runs/bench/results.jsonl`` (ignored by git); ``--record`` also appends them to the tracked
``benchmarks/results.jsonl`` for a measurement meant to be committed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = Path("scenarios") / "llm" / "benchmark_splitwise_a100.yaml"
TRACE_ROWS = 19_366
"""Rows of splitwise_conv.csv: a run asking more sets ``workload.trace_repeat=true``."""
SERIES = (1_000, 10_000, 100_000, 1_000_000)
RESULTS = Path("runs") / "bench" / "results.jsonl"
TRACKED = Path("benchmarks") / "results.jsonl"
REFERENCE_TIMEOUTS = 1_000_000
ENGINES = ("reference", "vllm-0.5", "vllm-0.6", "vllm-v1", "sglang", "trtllm")
"""The engine profiles ``--engines`` measures (catalog engines.yaml), each with its own layout."""

REFERENCE_SCRIPT = f"""
import time, simpy
env = simpy.Environment()
def proc(env):
    for _ in range({REFERENCE_TIMEOUTS}):
        yield env.timeout(1)
env.process(proc(env))
t0 = time.perf_counter()
env.run()
print(time.perf_counter() - t0)
"""


# --- pure functions (tested in tests/test_bench_harness.py) ------------------------------------

def median(values: list[float]) -> float:
    """Median of the repeated measurements of one configuration."""
    if not values:
        raise ValueError("no measurements")
    return float(statistics.median(values))


def interleave(configs: list, repeats: int) -> list:
    """Run order: every configuration once per round, ``repeats`` rounds (a drift hits them all alike)."""
    return [c for _ in range(repeats) for c in configs]


def medians_by_config(samples: list[tuple]) -> dict:
    """``[(config, value), ...]`` from interleaved rounds -> ``{config: median of its values}``, in first-seen order."""
    grouped: dict = {}
    for config, value in samples:
        grouped.setdefault(config, []).append(value)
    return {config: median(values) for config, values in grouped.items()}


def ref_units(wall_s: float, reference_s: float) -> float:
    """Wall time in reference units: how many reference workloads (1M SimPy timeouts) it is worth."""
    if reference_s <= 0:
        raise ValueError("reference time must be positive")
    return wall_s / reference_s


def maxrss_mib(ru_maxrss: int, system: str | None = None) -> float:
    """``ru_maxrss`` in MiB: kilobytes on Linux and the BSDs, bytes on macOS."""
    system = system or platform.system()
    return ru_maxrss / (1024 * 1024) if system == "Darwin" else ru_maxrss / 1024


def format_table(records: list[dict]) -> str:
    """The printed table: one line per record, wall (s), peak RSS (MiB), wall in reference units, wall per
    request (with ``--engines``: the engine profile and the ratio to the plain benchmark first)."""
    if not records:
        return "(no measurements)"
    if any("engine" in r for r in records):
        return _engine_table(records)
    ref = records[0]["reference_s"]
    head = (f"reference: {REFERENCE_TIMEOUTS:,} SimPy timeouts in {ref:.3f} s "
            f"(median of {len(records[0].get('reference_runs_s', [ref]))})")
    cols = f"{'requests':>10}  {'spans':>5}  {'wall s':>8}  {'peak MiB':>9}  {'ref units':>9}  {'us/request':>10}"
    lines = [head, cols, "-" * len(cols)]
    for r in records:
        per_req = r["wall_s"] / r["requests"] * 1e6
        lines.append(f"{r['requests']:>10,}  {'on' if r['record_spans'] else 'off':>5}  {r['wall_s']:>8.2f}  "
                     f"{r['peak_mib']:>9.1f}  {r['ref_units']:>9.2f}  {per_req:>10.1f}")
    return "\n".join(lines)


def _engine_table(records: list[dict]) -> str:
    """The table of an ``--engines`` measurement: per size, the plain benchmark and each profile."""
    cols = f"{'requests':>10}  {'engine':>10}  {'wall s':>8}  {'peak MiB':>9}  {'ref units':>9}  {'x plain':>7}"
    lines = [f"reference: {REFERENCE_TIMEOUTS:,} SimPy timeouts in {records[0]['reference_s']:.3f} s", cols, "-" * len(cols)]
    for r in records:
        lines.append(f"{r['requests']:>10,}  {r.get('engine') or 'plain':>10}  {r['wall_s']:>8.2f}  {r['peak_mib']:>9.1f}  "
                     f"{r['ref_units']:>9.2f}  {r.get('vs_plain', 1.0):>7.2f}")
    return "\n".join(lines)


def paired_ratios(walls: list[tuple], configs: list) -> dict:
    """Each engine configuration's median ratio to the plain benchmark of its size in the same round
    (``walls``: (config, seconds) in run order, one round after another; config: (kind, n, spans, engine))."""
    rounds = len(walls) // len(configs)
    out = {}
    for c in configs:
        if c[0] != "run" or c[3] is None:
            continue
        plain = next(p for p in configs if p[0] == "run" and p[1] == c[1] and p[3] is None)
        ratios = [walls[r * len(configs) + configs.index(c)][1] / walls[r * len(configs) + configs.index(plain)][1]
                  for r in range(rounds)]
        out[c] = median(ratios)
    return out


def engine_sets(engine: str) -> list[str]:
    """``--set`` arguments for engine profile ``engine`` with its own serving layout (its catalog defaults)."""
    from simulator.config import catalog

    argv = ["--set", f"serving.engine={engine}"]
    for key, value in (catalog.entry("engines", engine) or {}).get("serving", {}).items():
        argv += ["--set", f"serving.{key}={str(value).lower() if isinstance(value, bool) else value}"]
    return argv


def write_records(records: list[dict], root: Path | None = None, *, record: bool = False) -> list[Path]:
    """Append the records as JSON lines under ``root/runs/bench`` (ignored by git; root: the checkout);
    with ``record`` also to the tracked ``benchmarks/results.jsonl``. Returns the files written."""
    root = ROOT if root is None else root
    targets = [root / RESULTS] + ([root / TRACKED] if record else [])
    for path in targets:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            for r in records:
                fh.write(json.dumps(r) + "\n")
    return targets


# --- measurement ---------------------------------------------------------------------------------

def _cli() -> list[str]:
    """The `lastmile` command of this interpreter's environment."""
    for candidate in (Path(sys.executable).parent / "lastmile", ROOT / ".venv" / "bin" / "lastmile"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return [str(candidate)]
    return [sys.executable, "-c", "import sys; from simulator.cli import main; sys.exit(main())"]


def run_child(argv: list[str]) -> tuple[float, float, str]:
    """Run a child to completion: (wall s from start to reaped, its own peak RSS in MiB, its stdout)."""
    with tempfile.TemporaryFile(mode="w+b") as out, tempfile.TemporaryFile(mode="w+b") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=err)
        if hasattr(os, "wait4"):
            _, status, usage = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - t0
            proc.returncode = os.waitstatus_to_exitcode(status)
            peak = maxrss_mib(usage.ru_maxrss)
        else:  # pragma: no cover - no per-child rusage: the largest child so far
            import resource
            proc.wait()
            wall = time.perf_counter() - t0
            peak = maxrss_mib(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}:\n{stderr[-2000:]}")
    return wall, peak, stdout


def reference_once() -> float:
    """Seconds for 1M SimPy timeouts in a fresh interpreter."""
    _, _, out = run_child([sys.executable, "-c", REFERENCE_SCRIPT])
    return float(out.strip().splitlines()[-1])


def run_argv(requests: int | None, spans: bool, engine: str | None = None) -> list[str]:
    # the simulation alone: the counterfactual with the last mile free (on by default) would run it twice
    argv = _cli() + ["run", str(SCENARIO), "--no-write", "--no-last-mile-cost", "-q", "--json",
                     "--set", f"record_spans={str(spans).lower()}"]
    if requests is not None:
        argv += ["--set", f"workload.requests={requests}"]
        if requests > TRACE_ROWS:
            argv += ["--set", "workload.trace_repeat=true"]
    return argv + (engine_sets(engine) if engine else [])


def _machine() -> dict:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()

    try:  # the commit measured; "-dirty" when tracked files differ from it
        commit = git("rev-parse", "--short", "HEAD") or None
        if commit and git("status", "--porcelain", "--untracked-files=no"):
            commit += "-dirty"
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()} {platform.processor() or platform.platform()}",
            "python": platform.python_version(), "commit": commit}


def measure(sizes: list[int | None], spans_modes: list[bool], repeats: int, log=print,
            engines: tuple = ()) -> list[dict]:
    """Interleaved rounds of reference + every (size, spans) run, and each of ``engines`` with its own
    layout (spans off); one record per configuration, medians (an engine's: its ratio to the plain run too)."""
    configs = [("reference", None, None, None)] + [("run", n, s, None) for n in sizes for s in spans_modes]
    configs += [("run", n, False, e) for n in sizes for e in engines]
    walls, peaks, summaries = [], [], {}
    for i, config in enumerate(interleave(configs, repeats)):
        kind, n, spans, engine = config
        if kind == "reference":
            wall, peak = reference_once(), 0.0
            log(f"  [{i + 1}/{len(configs) * repeats}] reference: {wall:.3f} s")
        else:
            wall, peak, out = run_child(run_argv(n, spans, engine))
            summaries[config] = json.loads(out)
            log(f"  [{i + 1}/{len(configs) * repeats}] {summaries[config]['requests_total']:,} requests, "
                f"{engine or 'spans ' + ('on' if spans else 'off')}: {wall:.2f} s, {peak:.1f} MiB")
        walls.append((config, wall))
        peaks.append((config, peak))
    wall_med, peak_med = medians_by_config(walls), medians_by_config(peaks)
    ref_runs = [w for c, w in walls if c[0] == "reference"]
    ref = wall_med[configs[0]]
    meta = _machine()
    ratios = paired_ratios(walls, configs) if engines else {}
    records = []
    for config in configs[1:]:
        _, n, spans, engine = config
        s = summaries[config]
        extra = {"engine": engine, "vs_plain": round(ratios.get(config, 1.0), 3)} if engines else {}
        records.append({**extra,
            "benchmark": "llm_trace", "scenario": str(SCENARIO), **meta,
            "requests": s["requests_total"], "record_spans": spans, "repeats": repeats,
            "wall_s": round(wall_med[config], 3),
            "wall_runs_s": [round(w, 3) for c, w in walls if c == config],
            "peak_mib": round(peak_med[config], 1),
            "reference_s": round(ref, 4), "reference_runs_s": [round(w, 4) for w in ref_runs],
            "ref_units": round(ref_units(wall_med[config], ref), 3),
            "requests_completed": s["requests_completed"],
            "steps": s.get("steps"),
            "simulated_s": round(s["duration_s"], 1),
        })
    return records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--series", action="store_true",
                    help=f"run at {', '.join(f'{n:,}' for n in SERIES)} requests (spans off)")
    ap.add_argument("--max-requests", type=int, default=None, help="series: stop after this many requests")
    ap.add_argument("--min-requests", type=int, default=None, help="series: start at this many requests")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds; the median is reported (default 3)")
    ap.add_argument("--engines", action="store_true",
                    help=f"also run each engine profile with its own layout ({', '.join(ENGINES)}), spans off")
    ap.add_argument("--record", action="store_true",
                    help=f"also append the records to the tracked {TRACKED} (to commit a measurement)")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    if args.series:
        sizes = [n for n in SERIES if (args.max_requests is None or n <= args.max_requests)
                 and (args.min_requests is None or n >= args.min_requests)]
        if not sizes:
            ap.error(f"no size of the series ({', '.join(f'{n:,}' for n in SERIES)}) is within "
                     "--min-requests and --max-requests")
        spans_modes = [False]
    else:
        sizes, spans_modes = [None], [False] if args.engines else [False, True]
    print(f"lastmile run {SCENARIO} (whole process), {args.repeats} interleaved round(s):", flush=True)
    log = lambda m: print(m, flush=True)  # noqa: E731
    records = (measure(sizes, spans_modes, args.repeats, log=log, engines=ENGINES) if args.engines
               else measure(sizes, spans_modes, args.repeats, log=log))
    print()
    print(format_table(records))
    for path in write_records(records, record=args.record):
        print(f"appended {len(records)} record(s) to {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
