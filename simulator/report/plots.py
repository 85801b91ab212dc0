"""Matplotlib figures of lastmile runs and sweeps, readable without the code.

Every figure takes data (a ``Result`` or a sweep DataFrame) and returns a ``Figure``; one
palette gives each latency category the same colour in every figure (compute in blues and
greens, queueing in grey, the last mile in oranges), so figures can be read side by side.
"""

from __future__ import annotations

import re
import textwrap
from types import MappingProxyType
from typing import Mapping, Sequence

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from ..observe.records import DIT_LAST_MILE, LLM_LAST_MILE  # noqa: E402

#: Category -> colour, in the one stacking order every figure uses (LLM and DiT categories merged).
PALETTE = MappingProxyType({
    "queue": "#b3b3b3",
    "schedule": "#8c6bb1",
    "text_encode": "#c6dbef",
    "prefill": "#6baed6",
    "kv_transfer": "#74c476",
    "denoise": "#3182bd",
    "decode": "#08519c",
    "comm": "#41ab5d",
    "bubble": "#c7e9c0",
    "vae": "#756bb1",
    "d2h": "#fdd0a2",
    "detokenize": "#fd8d3c",
    "output": "#f16913",
    "ipc": "#d94801",
    "encode": "#e6550d",
    "stream": "#a63603",
    "deliver": "#7f2704",
})
LAST_MILE = frozenset(LLM_LAST_MILE + DIT_LAST_MILE)
OTHER = "#d9d9d9"
#: Line colours for series that are not latency categories (strategies, placements, ...).
SERIES = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _figure(width: float = 8.0, height: float = 4.5, ncols: int = 1, sharey: bool = False):
    fig, axes = plt.subplots(1, ncols, figsize=(width, height), sharey=sharey, layout="constrained")
    return fig, axes


def _wrap(text: str, fig: Figure, ax_fraction: float = 1.0) -> str:
    """Wrap a title to the figure's width (about 11 characters per inch at the default font size)."""
    width = int(fig.get_figwidth() * ax_fraction * 11)
    return textwrap.fill(text, max(width, 30))


def to_png(fig: Figure, dpi: int = 100) -> bytes:
    """The figure as PNG bytes (for ``IPython.display.Image`` in notebooks), then freed."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return buf.getvalue()


LINESTYLES = ("-", "--", ":", "-.")
DODGE = 1.04
"""Factor by which a series is shifted right on a log x axis per rank of its second name part."""


def label_mantissas(decades: float) -> tuple[float, ...]:
    """Which multiples of a power of ten a log axis labels, by how many decades it spans: every
    labelled tick stays readable (no crowding over many decades, more than two labels over few)."""
    if decades > 3.5:
        return (1,)
    if decades > 1.2:
        return (1, 2, 5)
    return (1, 2, 3, 4, 5, 6, 8)


def _log_labels(axis) -> None:
    """Plain-number labels on a log axis, as many as its span allows (see ``label_mantissas``)."""
    def fmt(v, _pos):
        lo, hi = sorted(axis.get_view_interval())
        decades = np.log10(hi / lo) if lo > 0 and hi > 0 else 10.0
        mant = v / 10 ** np.floor(np.log10(v)) if v > 0 else 0
        return f"{v:g}" if any(abs(mant - m) < 1e-6 for m in label_mantissas(decades)) else ""
    axis.set_major_locator(matplotlib.ticker.LogLocator(base=10))
    axis.set_minor_locator(matplotlib.ticker.LogLocator(base=10, subs=tuple(range(2, 10)), numticks=100))
    axis.set_major_formatter(matplotlib.ticker.FuncFormatter(fmt))
    axis.set_minor_formatter(matplotlib.ticker.FuncFormatter(fmt))


def series_styles(names: Sequence[str], sep: str = " · ") -> dict[str, dict]:
    """Line style of each series named ``first · second``: colour and marker follow the first part,
    line style and marker fill the second, so series that coincide stay distinguishable (an open
    marker around a filled one, a dashed line over a solid one)."""
    firsts = list(dict.fromkeys(str(n).partition(sep)[0] for n in names))
    seconds = list(dict.fromkeys(str(n).partition(sep)[2] for n in names))
    out = {}
    for n in names:
        a, _, b = str(n).partition(sep)
        i, j = firsts.index(a), seconds.index(b)
        color = SERIES[i % len(SERIES)]
        out[n] = {"color": color, "marker": MARKERS[i % len(MARKERS)], "ls": LINESTYLES[j % len(LINESTYLES)],
                  "ms": 5 + 2 * j, "mfc": color if j == 0 else "white", "mew": 1.4, "zorder": 3 + 0.1 * j}
    return out


def _rank(style: dict) -> int:
    """Position of a series' second name part (0 for the first), from its line style."""
    return LINESTYLES.index(style["ls"])


def pareto_figure(df: pd.DataFrame) -> Figure:
    """``lastmile plan``'s candidates that met the SLO: cost per million output tokens against p99
    TTFT, the Pareto front (``pareto`` column) joined and labelled."""
    fig, ax = _figure()
    ax.scatter(df["usd_per_mtok"], df["ttft_p99_ms"], color=SERIES[0], label="meets the SLO")
    front = df[df["pareto"]].sort_values("usd_per_mtok")
    ax.plot(front["usd_per_mtok"], front["ttft_p99_ms"], color=SERIES[1], marker="o", label="Pareto front")
    for _, r in front.iterrows():
        ax.annotate(r["candidate"], (r["usd_per_mtok"], r["ttft_p99_ms"]), fontsize=7, xytext=(4, 4),
                    textcoords="offset points")
    ax.set_xlabel("USD per million output tokens (each candidate at its highest rate within the SLO)")
    ax.set_ylabel("TTFT p99 (ms)")
    ax.legend()
    return fig


def save(fig: Figure, path, dpi: int = 110) -> None:
    """Write a PNG and free the figure (figures are not kept in pyplot's global registry)."""
    fig.savefig(path, dpi=dpi, metadata={"Software": None})
    plt.close(fig)


def categories_in(columns: Sequence[str], prefix: str = "breakdown_share.") -> list[str]:
    """The latency categories present in a sweep frame, in the palette's fixed order."""
    present = {c[len(prefix):] for c in columns if c.startswith(prefix)}
    return [c for c in PALETTE if c in present]


def breakdown_bars(rows: pd.DataFrame, label: str, title: str, absolute: bool = False,
                   xlabel: str | None = None) -> Figure:
    """Stacked bars of the latency breakdown, one bar per row, last mile stacked on top and annotated.

    ``absolute`` scales the shares by each row's mean latency (ms per request); otherwise percent.
    """
    cats = categories_in(rows.columns)
    compute = [c for c in cats if c not in LAST_MILE]
    order = compute + [c for c in cats if c in LAST_MILE]
    if absolute:
        mean_ms = rows["e2e_ms.mean"] if "e2e_ms.mean" in rows else rows["latency_s.mean"] * 1e3
        scale = np.asarray(mean_ms, dtype=float)
        ylabel = "mean latency per request (ms)"
    else:
        scale = np.full(len(rows), 100.0)
        ylabel = "share of end-to-end latency (%)"
    fig, ax = _figure(max(6.0, 0.9 * len(rows) + 3), 4.8)
    x = np.arange(len(rows))
    bottom = np.zeros(len(rows))
    for c in order:
        h = rows[f"breakdown_share.{c}"].to_numpy(dtype=float) * scale
        ax.bar(x, h, bottom=bottom, color=PALETTE[c], label=c, width=0.7, edgecolor="white", linewidth=0.5,
               hatch="//" if c in LAST_MILE else None)
        bottom += h
    share = rows[[f"breakdown_share.{c}" for c in cats if c in LAST_MILE]].sum(axis=1).to_numpy()
    for xi, top, s in zip(x, bottom, share):
        ax.annotate(f"last mile\n{100 * s:.1f}%", (xi, top), ha="center", va="bottom", fontsize=8,
                    xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(x, [textwrap.fill(str(v), 14) for v in rows[label]], fontsize=8)
    ax.set_xlabel(xlabel or label)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, bottom.max() * 1.18 if len(bottom) else 1)
    ax.set_title(_wrap(title, fig, 0.75))
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], title="category (hatched = last mile)", fontsize=8,
              loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def itl_samples(result) -> tuple[np.ndarray, str]:
    """Every inter-token gap (s) the clients saw in an LLM run, with its axis label."""
    gaps = result.itl if result.itl is not None else ()  # None: the run kept a sketch of them only
    return np.asarray(gaps, dtype=float), "inter-token latency (ms)"


def _cdf(ax, values: np.ndarray, label: str, color: str) -> None:
    v = np.sort(values[np.isfinite(values)])
    if len(v):
        ax.step(v * 1e3, np.arange(1, len(v) + 1) / len(v), where="post", label=label, color=color, lw=1.6)


def latency_cdfs(results: Mapping[str, object], title: str) -> Figure:
    """CDFs of TTFT and of inter-token latency for several runs (one line each)."""
    fig, (a, b) = _figure(10.5, 4.2, ncols=2)
    xlabel = "inter-token latency (ms)"
    for i, (label, res) in enumerate(results.items()):
        color = SERIES[i % len(SERIES)]
        _cdf(a, res.requests["ttft_s"].to_numpy(dtype=float), label, color)
        samples, xlabel = itl_samples(res)
        _cdf(b, samples, label, color)
    a.set_xlabel("time to first token (ms)")
    b.set_xlabel(xlabel)
    for ax in (a, b):
        ax.set_ylabel("fraction of requests" if ax is a or "per request" in xlabel else "fraction of gaps")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    for ax in (a, b):
        ax.set_xscale("log")
        _log_labels(ax.xaxis)
    b.legend(fontsize=8, loc="center left")
    fig.suptitle(_wrap(title, fig))
    return fig


def lines(rows: pd.DataFrame, x: str, y: str, hue: str | None, title: str, xlabel: str, ylabel: str,
          logx: bool = False, logy: bool = False, percent: bool = False, threshold: float | None = None,
          threshold_label: str | None = None, ax=None) -> Figure:
    """One line per ``hue`` value of ``y`` against ``x``; failed points (status != ok) are left out."""
    fig, ax = _figure(9.5, 4.5) if ax is None else (ax.figure, ax)
    ok = rows[rows["status"] == "ok"] if "status" in rows else rows
    groups = list(ok.groupby(hue, sort=False)) if hue else [(None, ok)]
    styles = series_styles([name for name, _ in groups])
    scale = 100.0 if percent else 1.0
    for name, g in groups:
        g = g.sort_values(x)
        # on a log x axis, later second parts are dodged a few percent right so coinciding series show
        xs = g[x] * (DODGE ** _rank(styles[name]) if logx else 1.0)
        ax.plot(xs, g[y] * scale, label=str(name) if hue else None, lw=1.6, **styles[name])
    if threshold is not None:
        ax.axhline(threshold * scale, color="black", ls=(0, (6, 3)), lw=1.2, label=threshold_label, zorder=1)
    if logx:
        ax.set_xscale("log", base=2)
        ticks = sorted(ok[x].unique())
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
    if logy:
        ax.set_yscale("log")
        _log_labels(ax.yaxis)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(_wrap(title, fig, 0.72))
    ax.grid(alpha=0.3)
    if hue or threshold_label:
        ax.legend(title=hue if hue and "." not in hue else (hue.split(".")[-1] if hue else None), fontsize=8,
                  loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def line_pair(rows: pd.DataFrame, x: str, hue: str, xlabel: str, left: tuple, right: tuple,
              logx: bool = True) -> Figure:
    """Two :func:`lines` panels side by side over the same rows; ``left`` and ``right`` are
    ``(y, title, ylabel, percent)``."""
    fig, axes = _figure(13.0, 4.5, ncols=2)
    for ax, (y, title, ylabel, percent) in zip(axes, (left, right)):
        lines(rows, x, y, hue, title, xlabel, ylabel, logx=logx, percent=percent, ax=ax)
    return fig


def last_mile_vs_concurrency(rows: pd.DataFrame, title: str, hue: str = "serving.detokenizer",
                             x: str = "workload.concurrency", y: str = "itl_last_mile_share",
                             threshold: float = 0.2) -> Figure:
    """Last-mile share of inter-token latency against concurrency, one line per placement."""
    return lines(rows, x, y, hue, title, "concurrent requests (closed loop)", "last mile share of ITL (%, log scale)",
                 logx=True, logy=True, percent=True, threshold=threshold,
                 threshold_label=f"{100 * threshold:.0f}% line")


def last_mile_share_and_cost(rows: pd.DataFrame, title: str, hue: str = "setup", x: str = "concurrency") -> Figure:
    """The last mile two ways against concurrency: its attributed share of ITL (left, log scale) and
    the throughput the counterfactual with it free gains (right)."""
    fig, axes = _figure(13.0, 4.5, ncols=2)
    lines(rows, x, "itl_last_mile_share", hue, "attributed: last-mile share of ITL", "concurrent requests (closed loop)",
          "last mile share of ITL (%, log scale)", logx=True, logy=True, percent=True, ax=axes[0])
    lines(rows, x, "last_mile_cost.throughput_gain", hue, "counterfactual: throughput gained with the last mile free",
          "concurrent requests (closed loop)", "throughput gain (%)", logx=True, percent=True, ax=axes[1])
    if axes[0].get_legend() is not None:
        axes[0].get_legend().remove()  # one legend, right of the right panel
    fig.suptitle(_wrap(title, fig))
    return fig


def _span_colour(track: str, name: str, category: str) -> str:
    if category in PALETTE:
        return PALETTE[category]
    word = name.split()[0] if name else ""
    if word in PALETTE:
        return PALETTE[word]
    if track.startswith("link:"):
        return PALETTE["comm"] if "nvlink" in track else PALETTE["d2h"]
    return OTHER


def _track_key(track: str) -> tuple:
    kind = 0 if track.startswith("gpu") else 1 if track.startswith("link") else 2
    nums = [int(n) for n in re.findall(r"\d+", track)]
    return (kind, nums, track)


def timeline(result, title: str, window: tuple[float, float] | None = None, max_tracks: int = 12) -> Figure:
    """Gantt chart of GPU, link and CPU tracks over a time window (s), coloured by category."""
    sp = result.spans
    if window is None:
        t0 = float(sp["start"].min())
        window = (t0, t0 + min(0.1, float(sp["end"].max()) - t0))
    lo, hi = window
    sp = sp[(sp["end"] > lo) & (sp["start"] < hi)]
    tracks = sorted(sp["track"].unique(), key=_track_key)[:max_tracks]
    fig, ax = _figure(11, 0.45 * len(tracks) + 1.8)
    used = {}
    for i, tr in enumerate(tracks):
        s = sp[sp["track"] == tr]
        colours = [_span_colour(tr, n, c) for n, c in zip(s["name"], s["category"])]
        starts = (np.maximum(s["start"].to_numpy(), lo) - lo) * 1e3
        widths = (np.minimum(s["end"].to_numpy(), hi) - lo) * 1e3 - starts
        ax.broken_barh(list(zip(starts, np.maximum(widths, 0.02))), (i - 0.38, 0.76), facecolors=colours,
                       edgecolor="none")
        for n, c, col in zip(s["name"], s["category"], colours):
            key = c if c in PALETTE else (n.split()[0] if n.split() and n.split()[0] in PALETTE else
                                          ("link" if tr.startswith("link") else "other"))
            used.setdefault(key, col)
    ax.set_yticks(range(len(tracks)), tracks)
    ax.invert_yaxis()
    ax.set_xlim(0, (hi - lo) * 1e3)
    ax.set_xlabel(f"time since t = {lo:.3f} s (ms)")
    ax.set_title(_wrap(title, fig, 0.8))
    order = [k for k in PALETTE if k in used] + [k for k in used if k not in PALETTE]
    ax.legend([Patch(color=used[k]) for k in order], order, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.grid(axis="x", alpha=0.3)
    return fig


def dit_pipeline(result, title: str, request: int = 0, steps: int | None = 3) -> Figure:
    """PipeFusion diagram: each stage (GPU) a row, each patch a coloured box, over the first denoising steps."""
    sp = result.spans
    pat = re.compile(rf"^r{request} s(\d+) p(\d+)$")
    m = sp["name"].str.extract(pat)
    sp = sp.assign(step=pd.to_numeric(m[0]), patch=pd.to_numeric(m[1])).dropna(subset=["step"])
    if steps is not None:
        sp = sp[sp["step"] < steps]
    gpus = sorted(sp["track"].unique(), key=_track_key)
    n_patch = int(sp["patch"].max()) + 1 if len(sp) else 1
    cmap = plt.get_cmap("tab10" if n_patch <= 10 else "tab20")
    t0 = float(sp["start"].min()) if len(sp) else 0.0
    fig, ax = _figure(11, 0.5 * len(gpus) + 2)
    for i, g in enumerate(gpus):
        s = sp[sp["track"] == g]
        starts = (s["start"].to_numpy() - t0) * 1e3
        widths = (s["end"].to_numpy() - s["start"].to_numpy()) * 1e3
        cols = [cmap(int(p) % cmap.N) for p in s["patch"]]
        ax.broken_barh(list(zip(starts, widths)), (i - 0.4, 0.8), facecolors=cols, edgecolor="white", linewidth=0.3)
    for step, g in sp.groupby("step"):
        ax.axvline((g["start"].min() - t0) * 1e3, color="black", lw=0.6, ls=":")
        ax.text((g["start"].min() - t0) * 1e3, -0.7, f"step {int(step)}", fontsize=8, va="bottom")
    ax.set_yticks(range(len(gpus)), [f"stage {i} ({g})" for i, g in enumerate(gpus)])
    ax.set_ylim(len(gpus) - 0.5, -1.0)
    ax.set_xlabel("time since the first denoising step (ms)")
    ax.set_title(_wrap(title, fig, 0.8))
    ax.legend([Patch(color=cmap(p % cmap.N)) for p in range(n_patch)], [f"patch {p}" for p in range(n_patch)],
              fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), title="white gaps = bubbles")
    ax.grid(axis="x", alpha=0.3)
    return fig


def latency_vs_gpus(rows: pd.DataFrame, title: str, link_col: str = "link", strategy_col: str = "strategy",
                    x: str = "gpus", y: str = "latency_s.p50") -> Figure:
    """Latency against GPU count, one line per strategy, one panel per interconnect; OOM points marked ×."""
    links = list(dict.fromkeys(rows[link_col]))
    fig, axes = _figure(5.2 * len(links) + 1.5, 4.5, ncols=len(links), sharey=True)
    axes = np.atleast_1d(axes)
    strategies = list(dict.fromkeys(rows[strategy_col]))
    for ax, link in zip(axes, links):
        sub = rows[rows[link_col] == link]
        for i, st in enumerate(strategies):
            g = sub[sub[strategy_col] == st].sort_values(x)
            ok = g[g["status"] == "ok"]
            ax.plot(ok[x], ok[y], marker=MARKERS[i % len(MARKERS)], color=SERIES[i % len(SERIES)], label=st, lw=1.6)
            bad = g[g["status"] != "ok"]
            if len(bad) and len(ok):
                ax.scatter(bad[x], [ok[y].max()] * len(bad), marker="x", color=SERIES[i % len(SERIES)], s=50)
        ax.set_xscale("log", base=2)
        ticks = sorted(sub[x].unique())
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
        ax.set_yscale("log")
        _log_labels(ax.yaxis)
        ax.set_xlabel("GPUs")
        ax.set_title(str(link))
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("image latency p50 (s)")
    axes[-1].legend(title="strategy (× = infeasible)", fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.suptitle(_wrap(title, fig))
    return fig
