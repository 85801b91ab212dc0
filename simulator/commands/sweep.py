"""``lastmile sweep``: run a grid of scenario variants and write one tidy CSV row per point and seed."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ConfigError

HELP = "run the cross product of --grid values over a scenario (parallel on local cores, or on a Dask cluster)"

#: Columns printed to the terminal when present (the CSV has every metric).
HEADLINE = ("ttft_ms.p50", "ttft_ms.p99", "itl_ms.p50", "itl_ms.p99", "throughput.output_tokens_per_s",
            "itl_last_mile_share", "last_mile_share", "last_mile_cost.itl_share", "last_mile_cost.throughput_gain",
            "latency_s.p50", "bubble_fraction", "memory_per_gpu_gib")


MAX_WORKERS = 1024
"""Local worker processes at most (no machine has more cores to give a sweep)."""
MAX_SEEDS = 100_000
"""Seeds per point at most: a million points of one scenario is past any sweep's use (and its rows' memory)."""


def add_arguments(p) -> None:
    p.add_argument("scenario", nargs="?", help="scenario YAML file (default: the built-in default scenario)")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="a sweep axis, e.g. --grid workload.concurrency=1,8,64 (repeatable; cross product)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key for every point (repeatable)")
    p.add_argument("--seeds", type=int, default=1, help="seeds per point: the scenario's seed, +1, ... (default 1)")
    p.add_argument("--out", help="folder to write sweep.csv into")
    p.add_argument("--cluster", metavar="tcp://HOST:PORT", help="run the points on this Dask scheduler")
    p.add_argument("--workers", type=int, help="local worker processes (default: all cores)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--last-mile-cost", action="store_true",
                   help="also simulate each LLM point with its last mile free (last_mile_cost.* columns; twice the work)")


def parse_grid(text: str) -> tuple[str, list]:
    """``key=v1,v2,...`` -> (key, [values]); each value is read as YAML like ``--set``."""
    if "=" not in text:
        raise ConfigError(f"--grid expects key=v1,v2,..., got {text!r}")
    key, _, values = text.partition("=")
    key = key.strip()
    parts = [v.strip() for v in values.split(",")]
    if not key or not any(parts):
        raise ConfigError(f"--grid expects key=v1,v2,..., got {text!r}")
    from ..config.yamlio import YAMLInputError, loads

    out = []
    for v in parts:
        try:
            out.append(loads(v) if v else "")
        except YAMLInputError:
            out.append(v)
    return key, out


def main(args) -> int:
    import pandas as pd

    from ..config.loader import parse_override
    from ..sweep import connect, sweep

    axes = [parse_grid(g) for g in args.grid]
    grid = dict(axes)
    if len(grid) < len(axes):
        twice = next(k for i, (k, _) in enumerate(axes) if k in dict(axes[:i]))
        raise ConfigError(f"the axis {twice} is given twice; give its values once: --grid {twice}=A,B,...",
                          file="--grid")
    if args.workers is not None and not 1 <= args.workers <= MAX_WORKERS:
        raise ConfigError(f"worker processes are between 1 and {MAX_WORKERS}, got {args.workers}", file="--workers")
    if not 1 <= args.seeds <= MAX_SEEDS:
        raise ConfigError(f"seeds per point are between 1 and {MAX_SEEDS:,}, got {args.seeds}", file="--seeds")
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise ConfigError("is a file; name a folder for sweep.csv", file=f"--out {args.out}")
    if args.cluster and not args.cluster.startswith(("tcp://", "tls://", "inproc://", "ucx://")) and ":" not in args.cluster:
        raise ConfigError(f"a Dask scheduler address is tcp://HOST:PORT, got {args.cluster!r}", file="--cluster")
    overrides = dict(parse_override(o) for o in args.overrides)
    client = connect(args.cluster) if args.cluster else None
    try:
        df = sweep(args.scenario, grid, seeds=args.seeds, client=client, workers=args.workers,
                   progress=False if args.no_progress else None, overrides=overrides,
                   last_mile_cost=args.last_mile_cost)
    finally:
        if client is not None:
            client.close()
    shown = [c for c in (*grid, "seed", "status", *HEADLINE) if c in df.columns]
    table = df[shown].copy()
    if "warnings" in df.columns:  # a point that warned says so in its status (the CSV keeps the text)
        table["status"] = [_status(st, w) for st, w in zip(df["status"], df["warnings"])]
    with pd.option_context("display.max_columns", None, "display.width", 200, "display.float_format",
                           "{:.4g}".format):
        print(table.to_string(index=False))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        df.to_csv(out / "sweep.csv", index=False)
        print(f"\nwrote {out / 'sweep.csv'} ({len(df)} rows, {len(df.columns)} columns)")
    return 0


def _status(status: str, warnings) -> str:
    """A point's status with its warnings named: ``ok, overloaded`` and the like."""
    if not isinstance(warnings, str) or warnings in ("", "[]"):
        return status
    words = [("overloaded" if w.startswith("offered load exceeds capacity") else "warned")
             for w in json.loads(warnings)]
    return ", ".join([status, *dict.fromkeys(words)])
