"""``lastmile compare``: two or more run folders side by side, summaries and mean breakdowns, with differences.

Reads only ``summary.json`` and ``breakdown.csv`` of each folder. Breakdown columns are found by
the categories the summary names (``breakdown_share``), whatever the CSV's index or unit suffix
(``queue``, ``queue_s`` or ``queue_ms``), so a change of column layout does not break it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..errors import LastmileError

HELP = "compare run folders (summary.json, breakdown.csv) side by side with differences; --out FIG.png plots them"


def add_arguments(p) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN", help="run folders written by `lastmile run` (two or more)")
    p.add_argument("--out", metavar="FIG.png", help="also write a grouped bar chart of the mean breakdowns")
    p.add_argument("--all", action="store_true", help="show every summary figure, not only those that differ")


def _flatten(d: dict, prefix: str = "") -> dict:
    """Numeric leaves of a nested summary as ``a.b`` keys (booleans and text left out)."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, f"{key}."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[key] = float(v)
    return out


def read_run(folder: str) -> tuple[dict, dict]:
    """(summary, mean breakdown in seconds per category) of one run folder; a one-line error if unusable."""
    path = Path(folder)
    if not path.is_dir():
        raise LastmileError("not a run folder (no such directory)", file=folder)
    summary_file = path / "summary.json"
    if not summary_file.is_file():
        raise LastmileError("not a run folder: no summary.json (write one with `lastmile run --out DIR`)", file=folder)
    try:
        summary = json.loads(summary_file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise LastmileError(f"summary.json is not valid JSON ({str(exc).splitlines()[0]})", file=folder) from None
    if not isinstance(summary, dict):
        raise LastmileError("summary.json is not a JSON object", file=folder)
    return summary, _mean_breakdown(path, summary)


def _mean_breakdown(path: Path, summary: dict) -> dict:
    """Mean seconds per breakdown category over the run's requests ({} when there is no breakdown.csv)."""
    import pandas as pd

    csv = path / "breakdown.csv"
    if not csv.is_file():
        return {}
    try:
        df = pd.read_csv(csv)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise LastmileError(f"breakdown.csv is not a readable CSV ({str(exc).splitlines()[0]})",
                            file=str(path)) from None
    categories = list(summary.get("breakdown_share") or [])
    out = {}
    for c in categories:
        for col, scale in ((c, 1.0), (f"{c}_s", 1.0), (f"{c}_ms", 1e-3)):
            if col in df.columns and pd.api.types.is_numeric_dtype(df[col]):
                out[c] = float(df[col].mean()) * scale
                break
    return out


#: Values smaller than this are rounding noise of a sum (a share of 1e-16) and shown as 0.
TINY = 1e-12


def _clean(v: float | None) -> float | None:
    return 0.0 if v is not None and abs(v) < TINY else v


def _pct(a: float, b: float) -> str:
    if a == 0 or not (math.isfinite(a) and math.isfinite(b)):
        return "-" if a == b else "n/a"
    return f"{100 * (b / a - 1):+.1f}%"


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     .rstrip() for r in rows)


SAME = 1e-9
"""Relative difference under which two figures are the same (float rounding of sums taken in
another order, never a difference a user should read)."""


def _alike(vals: list) -> bool:
    """Whether every value equals the first, numbers to ``SAME`` relative."""
    first = vals[0]
    for x in vals[1:]:
        if isinstance(first, (int, float)) and isinstance(x, (int, float)) and not isinstance(x, bool):
            if abs(x - first) > SAME * max(abs(first), abs(x)):
                return False
        elif x != first:
            return False
    return True


def side_by_side(names: list[str], values: list[dict], keys: list[str], show_all: bool = True) -> str:
    """One row per key: each run's value, then each later run's difference from the first (absolute, %)."""
    header = ["", *names]
    for n in names[1:]:
        header += [f"{n} - {names[0]}", "%"]
    rows = [header]
    for k in keys:
        vals = [_clean(v.get(k)) for v in values]
        if not show_all and _alike(vals):
            continue
        row = [k, *(_num(x) for x in vals)]
        for x in vals[1:]:
            a = vals[0]
            row += ["-", "-"] if a is None or x is None else [f"{x - a:+.4g}", _pct(a, x)]
        rows.append(row)
    return _table(rows) if len(rows) > 1 else "(no differences)"


#: Folder names longer than this (or more than two runs) are shown as A, B, C... with a legend.
MAX_LABEL = 16


def _labels(folders: list[str]) -> list[str]:
    """Short, distinct column names: the folder names when two short distinct ones, else A, B, C..."""
    names = [Path(f).resolve().name for f in folders]
    if len(names) == 2 and len(set(names)) == 2 and max(map(len, names)) <= MAX_LABEL:
        return names
    return [chr(ord("A") + i) if i < 26 else f"R{i}" for i in range(len(names))]


def plot(names: list[str], breakdowns: list[dict], out: str) -> None:
    """Grouped bars: one group per breakdown category, one bar per run (mean ms per request)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cats = list(dict.fromkeys(c for b in breakdowns for c in b))
    x = np.arange(len(cats))
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(cats) * max(1, len(names) / 2)), 4.0))
    for i, (name, b) in enumerate(zip(names, breakdowns)):
        ax.bar(x + (i - (len(names) - 1) / 2) * width, [1e3 * b.get(c, 0.0) for c in cats], width, label=name)
    ax.set_xticks(x, cats, rotation=30, ha="right")
    positive = [v for b in breakdowns for v in b.values() if v > 0]
    log = bool(positive) and max(positive) > 100 * min(positive)
    if log:  # small last-mile categories would be invisible next to decode on a linear axis
        ax.set_yscale("log")
    ax.set_ylabel("mean per request (ms)" + (", log scale" if log else ""))
    ax.set_title("latency breakdown")
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=120)
    except (OSError, ValueError) as exc:
        raise LastmileError(f"cannot write the figure: {exc}", file=out) from None
    finally:
        plt.close(fig)


def main(args) -> int:
    from .. import progress

    if len(args.runs) < 2:
        raise LastmileError("compare needs at least two run folders")
    runs = [read_run(f) for f in args.runs]
    names = _labels(args.runs)
    if names != [Path(f).resolve().name for f in args.runs]:
        print("\n".join(f"{n}: {f}" for n, f in zip(names, args.runs)) + "\n")
    flat = [_flatten(s) for s, _ in runs]
    keys = list(dict.fromkeys(k for f in flat for k in f))
    print("summary" + ("" if args.all else " (figures that differ; --all for every one)"))
    print(side_by_side(names, flat, keys, show_all=args.all))
    breakdowns = [{c: 1e3 * v for c, v in b.items()} for _, b in runs]
    cats = list(dict.fromkeys(c for b in breakdowns for c in b))
    if cats:
        print("\nmean breakdown per request (ms)")
        print(side_by_side(names, breakdowns, cats))
    if args.out:
        if not cats:
            raise LastmileError("no breakdown.csv with breakdown categories in these runs to plot", file=args.out)
        plot(names, [b for _, b in runs], args.out)
        progress.info(f"wrote {args.out}")
    return 0
