"""Figures of one run, written into its run folder so a run can be looked at without Jupyter.

``breakdown.png``: mean seconds per latency category; ``latency_cdf.png``: the distribution of
TTFT, ITL and E2E (LLM) or of image latency (DiT); ``timeline.png``: a few engine steps (or
denoising slices) across the GPU, link and CPU tracks. Matplotlib's Agg backend, imported only
when figures are drawn, so loading the package stays fast.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .. import forked
from .records import CPU_ACTIVITY

if TYPE_CHECKING:  # pandas is imported where a frame is built, not to load the module
    import pandas as pd

FIGURES = ("breakdown.png", "latency_cdf.png", "timeline.png")
CDF_POINTS = 2000
"""Most points drawn per CDF curve (quantiles of the samples), so long runs draw as fast as short ones."""
TIMELINE_SLICES = 6
"""Slices of the busiest GPU track shown by the timeline."""
COLORS = {"prefill": "#6baed6", "decode": "#08519c", "compute": "#3182bd", "denoise": "#3182bd",
          "text_encode": "#c6dbef", "vae": "#756bb1", "comm": "#41ab5d", "link": "#a1d99b",
          "d2h": "#fdd0a2", "schedule": "#bdbdbd", "tokenize": "#969696", "detokenize": "#fd8d3c",
          "output": "#f16913", "ipc": "#d94801", "stream": "#a63603", "cpu": "#e6550d"}
"""Span category -> colour (the report's palette: compute in blues, communication in greens, the
last mile in oranges); other categories take the next colour of ``EXTRA``."""
EXTRA = ("#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
MAX_TRACKS = 14
"""Most tracks the timeline shows: GPUs first, then the busiest link and CPU tracks in the window."""
DIT_STEP = r"^r(\d+) s(\d+) p\d+"
"""DiT denoising spans are named ``r<request> s<step> p<patch>``."""
DPI = 90


def _plt():
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    return plt


def _unit(seconds: float) -> tuple[float, str]:
    """A scale and unit label that make ``seconds`` read as a number between 1 and 1000."""
    if seconds >= 1:
        return 1.0, "s"
    if seconds >= 1e-3:
        return 1e3, "ms"
    return 1e6, "us"


def breakdown_figure(result, path: Path) -> bool:
    """Horizontal bars of the mean seconds per category; False when there is no breakdown."""
    return draw_breakdown(result.breakdown_means(), _name(result), path)


def draw_breakdown(means: dict, name: str, path: Path) -> bool:
    """:func:`breakdown_figure` from the means alone."""
    if not means:
        return False
    plt = _plt()
    cats = list(means)
    vals = np.array([means[c] for c in cats])
    scale, unit = _unit(float(vals.max()) if vals.max() > 0 else 1.0)
    total = float(vals.sum()) or 1.0
    fig, ax = plt.subplots(figsize=(6.4, 0.35 * len(cats) + 1.2))
    bars = ax.barh(cats[::-1], vals[::-1] * scale, color="#4c72b0")
    for bar, v in zip(bars, vals[::-1]):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {100 * v / total:.1f}%",
                va="center", fontsize=8)
    ax.set_xlabel(f"mean per request ({unit})")
    ax.set_title(f"where the latency goes: {name}", fontsize=10)
    ax.margins(x=0.15)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return True


def _name(result) -> str:
    return str(result.summary.get("scenario", result.summary.get("name", result.kind)))


def _sorted_quantiles(v: np.ndarray, q) -> np.ndarray:
    """Quantiles ``q`` of sorted ``v``, linearly interpolated as ``np.quantile`` does, without sorting again."""
    pos = np.asarray(q, dtype=float) * (len(v) - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def _cdf_xy(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The CDF's points of sorted finite samples ``v`` (at most ``CDF_POINTS`` of them)."""
    if len(v) > CDF_POINTS:
        q = np.linspace(0, 1, CDF_POINTS)
        return _sorted_quantiles(v, q), q
    return v, np.arange(1, len(v) + 1) / max(len(v), 1)


def latency_samples(result) -> dict[str, np.ndarray]:
    """Latency samples in seconds by metric, completed requests only (empty arrays when none)."""
    req = result.requests
    done = req["completed"].to_numpy(bool) if "completed" in req else np.ones(len(req), bool)
    if result.kind == "llm":
        itl = result.itl if result.itl is not None else np.empty(0)
        return {"TTFT": req["ttft_s"].to_numpy(float)[done], "ITL": np.asarray(itl, float),
                "E2E": req["e2e_s"].to_numpy(float)[done]}
    if result.kind == "dit" and "latency_s" in req:
        return {"latency": req["latency_s"].to_numpy(float)[done]}
    return {}


def cdf_figure(result, path: Path) -> bool:
    """One CDF panel per latency metric; False when no request completed."""
    return draw_cdf(_sorted_samples(result), _name(result), path)


def _sorted_samples(result) -> dict[str, np.ndarray]:
    samples = {k: np.sort(v[np.isfinite(v)]) for k, v in latency_samples(result).items()}
    return {k: v for k, v in samples.items() if len(v)}


def draw_cdf(samples: dict, name: str, path: Path) -> bool:
    """:func:`cdf_figure` from each metric's sorted finite samples."""
    if not samples:
        return False
    plt = _plt()
    fig, axes = plt.subplots(1, len(samples), figsize=(3.2 * len(samples) + 0.6, 3.0), squeeze=False)
    for ax, (label, v) in zip(axes[0], samples.items()):
        p50, p99 = _sorted_quantiles(v, [0.5, 0.99])
        scale, unit = _unit(float(p50) if p50 > 0 else float(v[-1] or 1.0))
        x, y = _cdf_xy(v)
        ax.plot(np.r_[x[0], x] * scale, np.r_[0.0, y], color="#4c72b0", lw=1.5, drawstyle="steps-post")
        ax.axvline(p50 * scale, color="grey", lw=0.8, ls="--")
        ax.axvline(p99 * scale, color="grey", lw=0.8, ls=":")
        ax.set_title(f"{label}: p50 {p50 * scale:.4g}, p99 {p99 * scale:.4g} {unit}", fontsize=9)
        ax.set_xlabel(f"{label} ({unit})")
        ax.ticklabel_format(axis="x", useOffset=False, style="plain")  # no "1e-12+3.46" offsets
        if v[-1] - v[0] <= 1e-9 * max(abs(float(v[-1])), 1e-12):  # every sample alike (one image size)
            ax.set_xlim(0.95 * v[0] * scale, 1.05 * v[-1] * scale)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("fraction of samples")
    fig.suptitle(textwrap.fill(f"latency distribution: {name}", int(12 * fig.get_figwidth())), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return True


def timeline_window(spans: pd.DataFrame, n: int = TIMELINE_SLICES) -> tuple[float, float] | None:
    """The window the timeline shows: three denoising steps of the middle request of a DiT run;
    otherwise ``n`` consecutive slices from the middle of the busiest GPU track (engine steps)."""
    if spans.empty:
        return None
    dit = spans["name"].astype(str).str.extract(DIT_STEP).dropna().astype(np.int64)
    if len(dit):
        reqs = np.unique(dit[0].to_numpy())
        mine = dit[dit[0] == reqs[len(reqs) // 2]]
        first = min(1, int(mine[1].max()))  # skip the warmup step when there is another
        part = spans.loc[mine.index[(mine[1] >= first) & (mine[1] < first + 3)]]
        return float(part["start"].min()), float(part["end"].max())
    gpu = spans[~spans["track"].astype(str).str.contains(":")]
    base = gpu if len(gpu) else spans
    track = base["track"].value_counts().index[0]
    sl = base[base["track"] == track].sort_values("start")
    k = max(0, len(sl) // 2 - n // 2)
    part = sl.iloc[k:k + n]
    lo, hi = float(part["start"].min()), float(part["end"].max())
    return (lo, hi) if hi > lo else (lo, lo + 1e-6)


def _busiest_tracks(sp: pd.DataFrame, lo: float, hi: float) -> list[str]:
    """GPU tracks, then link and CPU tracks by busy time inside the window, at most ``MAX_TRACKS``;
    tracks busy for under 0.1% of the window are left out."""
    busy = (sp["end"].clip(upper=hi) - sp["start"].clip(lower=lo)).groupby(sp["track"].astype(str)).sum()
    busy = busy[busy >= 1e-3 * (hi - lo)]
    gpus = sorted((t for t in busy.index if ":" not in t), key=lambda t: (len(t), t))
    others = sorted((t for t in busy.index if ":" in t), key=lambda t: (-busy[t], t))
    keep = set((gpus + others)[:MAX_TRACKS])
    return [t for t in gpus + sorted(others, key=lambda t: (t.startswith("cpu:"), t)) if t in keep]


def _recorded_window(rec, n: int = TIMELINE_SLICES) -> tuple[float, float] | None:
    """:func:`timeline_window` of an LLM run's recorder (spans on disk), a track at a time: ``n``
    consecutive slices from the middle of the busiest GPU track."""
    tracks = rec.tracks()
    if not tracks:
        return None
    base = [t for t in tracks if ":" not in t] or tracks
    counts = {t: len(rec.track_spans(t, names=False)[0]) for t in base}
    track = max(base, key=lambda t: (counts[t], [-ord(c) for c in t]))
    start, end, _, _ = rec.track_spans(track, names=False)
    order = np.argsort(start, kind="stable")
    k = max(0, len(order) // 2 - n // 2)
    part = order[k:k + n]
    lo, hi = float(start[part].min()), float(end[part].max())
    return (lo, hi) if hi > lo else (lo, lo + 1e-6)


def _recorded_spans(rec, lo: float, hi: float) -> pd.DataFrame:
    """The recorder's spans that overlap ``(lo, hi)``, read a track at a time."""
    import pandas as pd

    parts = []
    for t in rec.tracks():
        start, end, _, _ = rec.track_spans(t, names=False)
        inside = (end > lo) & (start < hi)
        if inside.any():
            start, end, names, cats = rec.track_spans(t)
            parts.append(pd.DataFrame({"track": t, "name": names[inside], "start": start[inside],
                                       "end": end[inside], "category": cats[inside]}))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        columns=["track", "name", "start", "end", "category"])


def timeline_figure(result, path: Path) -> bool:
    """Bars per track (GPU, link, CPU) over a few steps from the middle of the run (where the spans
    are on disk, in a recorder, only the window's are read into memory)."""
    return draw_timeline(_timeline_spans(result), _name(result), path)


def _timeline_spans(result):
    """The timeline's window ``(spans in it, lo, hi)``, or None when the run has no spans."""
    rec = getattr(result.trace_events, "spans", None)
    if hasattr(rec, "track_spans"):
        window = _recorded_window(rec)
    else:
        rec, spans = None, result.spans
        window = timeline_window(spans) if spans is not None else None
    if window is None:
        return None
    lo, hi = window
    pad = 0.05 * (hi - lo)
    lo, hi = lo - pad, hi + pad
    sp = _recorded_spans(rec, lo, hi) if rec is not None else spans[(spans["end"] > lo) & (spans["start"] < hi)]
    return sp, lo, hi


SPAN_ACTIVITY = {"schedule+launch": "schedule", "tokenize": "tokenize", "receive request": "schedule",
                 **CPU_ACTIVITY, "d2h": "d2h"}
"""A CPU or link span's name -> the activity its colour shows (the breakdown's, as
``observe.records.CPU_ACTIVITY`` names them): the last mile apart from scheduling and tokenization."""


def _activity(sp):
    """Each span's colour key: its activity where its name says one (CPU work, the D2H copy), else its category."""
    named = sp["name"].astype(str).map(SPAN_ACTIVITY)
    return named.where(named.notna(), sp["category"].astype(str))


def draw_timeline(window, name: str, path: Path) -> bool:
    """:func:`timeline_figure` from the window's spans."""
    if window is None:
        return False
    sp, lo, hi = window
    tracks = _busiest_tracks(sp, lo, hi)
    sp = sp[sp["track"].isin(tracks)]
    sp = sp.assign(category=_activity(sp))
    colors = dict(COLORS)
    for cat in sorted(set(sp["category"].astype(str)) - set(colors)):
        colors[cat] = EXTRA[(len(colors) - len(COLORS)) % len(EXTRA)]
    plt = _plt()
    scale, unit = _unit(hi - lo)
    fig, ax = plt.subplots(figsize=(9, 0.4 * len(tracks) + 1.4))
    seen = set()
    for y, track in enumerate(tracks):
        s = sp[sp["track"] == track]
        for cat, g in s.groupby("category"):
            a = (np.maximum(g["start"].to_numpy(float), lo) - lo) * scale
            b = (np.minimum(g["end"].to_numpy(float), hi) - lo) * scale
            color = colors[str(cat)]
            label = None if cat in seen else (str(cat) or "span")
            seen.add(cat)
            ax.broken_barh(list(zip(a, np.maximum(b - a, 0))), (y - 0.4, 0.8), color=color, label=label,
                           edgecolor="white", linewidth=0.3)
    ax.set_yticks(range(len(tracks)), tracks, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, (hi - lo) * scale)
    ax.set_xlabel(f"time from {lo:.6g} s ({unit})")
    ax.set_title(f"timeline of a few steps: {name}", fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return True


def figure_data(result) -> tuple:
    """What the run's figures draw, read from the result (its files included) into memory."""
    return _name(result), result.breakdown_means(), _sorted_samples(result), _timeline_spans(result)


def draw_figures(data: tuple, folder: str | Path) -> list[Path]:
    """Draw the figures of :func:`figure_data`'s ``data`` into ``folder``; returns the files written
    (a figure with nothing to show, e.g. a CDF when no request completed, is skipped)."""
    name, *parts = data
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for file, draw, part in zip(FIGURES, (draw_breakdown, draw_cdf, draw_timeline), parts):
        if draw(part, name, folder / file):
            written.append(folder / file)
    return written


def write_run_figures(result, folder: str | Path) -> list[Path]:
    """Draw the run's figures into ``folder`` (:func:`draw_figures`)."""
    return draw_figures(figure_data(result), folder)


def fork_figures(result, folder: Path):
    """Draw the run's figures in a forked child while the caller goes on (:mod:`simulator.forked`;
    None where it cannot fork: the caller draws them itself). What they show is read here first, so
    the child touches none of the result's files (their offsets are shared with this process) and
    writes only the figure files. The child's ``join`` raises where they could not be drawn."""
    if not forked.can_fork():
        return None
    return forked.start(draw_figures, figure_data(result), folder)
