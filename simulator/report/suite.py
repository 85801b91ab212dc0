"""The report suite: the experiments behind the notebooks' questions, written to ``results/``.

``generate`` runs them (small and deterministic), writes ``summary.csv`` (long format, values
rounded to a fixed number of significant digits so it is stable across platforms), the PNG
figures and a README whose sentences are computed from the numbers. ``check`` regenerates into a
temporary folder and reports any committed CSV that differs.
"""

from __future__ import annotations

import difflib
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..api import run
from ..progress import Progress
from ..project import scenarios_dir
from . import experiments as E
from . import plots

SIG_DIGITS = 5
LLM_DESC = "Llama-3-8B on 1x H100 SXM, closed loop, 512-token prompts, 128-token outputs"
#: The slower last mile of question 1: 10x the reference detokenize/output/stream costs (pure-Python detok).
SLOW_LAST_MILE = ("detokenize_per_token", "output_per_request", "stream_per_chunk")
SLOW_FACTOR = 10


@dataclass(frozen=True)
class Scale:
    """Sizes of the suite's experiments: ``full`` for results/, ``quick`` for the determinism test."""

    concurrency: tuple
    remedy_concurrency: int
    scale_gpus: tuple
    dit_gpus: tuple
    dit_steps: int
    slices: tuple
    figures: bool
    kv_requests: int = 600


FULL = Scale((1, 4, 16, 64, 256, 1024), 256, (8, 16, 32, 72), (1, 2, 4, 8), 20, (1, 2, 4, 8, 16, 32), True)
QUICK = Scale((4, 64), 64, (8, 16), (1, 4), 4, (1, 8), False, 60)


def _sig(value) -> str:
    """A number as text with SIG_DIGITS significant digits (platform-stable); other values as str."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            return "nan" if math.isnan(value) else str(value)
        return f"{value:.{SIG_DIGITS}g}"
    return str(value)


def _long(df: pd.DataFrame, experiment: str, keys: list[str], metrics: list[str]) -> pd.DataFrame:
    """Tidy long rows: experiment, case (key=value;...), metric, value (rounded text)."""
    rows = []
    for _, r in df.iterrows():
        case = ";".join(f"{k}={r[k]}" for k in keys)
        for m in metrics:
            if m in df.columns:
                v = r[m]
                rows.append({"experiment": experiment, "case": case, "metric": m,
                             "value": _sig(None if pd.isna(v) else (v.item() if hasattr(v, "item") else v))})
    return pd.DataFrame(rows)


def slow_cpu() -> dict:
    """CPU overrides for the slow-last-mile variant."""
    return E.cpu_slowdown(SLOW_FACTOR, SLOW_LAST_MILE)


def run_experiments(scale: Scale) -> dict:
    """Run every experiment of the suite; returns named DataFrames (and Results for the figures)."""
    placements = {f"{name} · {cpu}": {**over, **extra}
                  for cpu, extra in (("reference CPU", {}), (f"{SLOW_FACTOR}x slower detok", slow_cpu()))
                  for name, over in E.PLACEMENTS.items()}
    engines = {name: E.engine_setup(name) for name in E.ENGINES}
    stages = {
        "engines": lambda: E.llm_concurrency(scale.concurrency, engines, last_mile_cost=True),
        "engine_remedies": lambda: E.llm_concurrency([scale.remedy_concurrency], E.engine_remedies(),
                                                     last_mile_cost=True),
        "scale_out": lambda: E.llm_scale_out(scale.scale_gpus),
        "dit_scale_out": lambda: E.dit_scale_out(scale.scale_gpus, steps=scale.dit_steps),
        "placements": lambda: E.llm_concurrency(scale.concurrency, placements),
        "remedies": lambda: E.llm_concurrency([scale.remedy_concurrency], E.REMEDIES, base=slow_cpu()),
        "dit": lambda: E.dit_strategies(gpu_counts=scale.dit_gpus, base={"steps": scale.dit_steps}),
        "token": lambda: E.token_pipeline(slices=scale.slices),
        "kv_layouts": lambda: E.kv_layouts(scale.kv_requests),
    }
    data = {}
    with Progress(len(stages), "report", "experiments") as bar:
        for name, experiment in stages.items():
            data[name] = experiment()
            bar.update(1, name)
    return data


def summary_frame(data: dict) -> pd.DataFrame:
    """The long-format summary of every experiment, in a fixed order."""
    llm = ["status", "itl_last_mile_share", "last_mile_share", "itl_ms.p50", "itl_ms.p99", "ttft_ms.p50",
           "ttft_ms.p99", "tpot_ms.mean", "throughput.output_tokens_per_s", "itl_stalls.p99_over_p50",
           "itl_stalls.gaps_over_2x_median"]
    cost = [f"last_mile_cost.{m}" for m in ("itl_share", "e2e_share", "throughput_gain", "ttft_ms.p50",
                                            "itl_ms.mean", "e2e_ms.mean")]
    parts = [
        _long(data["engines"], "engines_last_mile_vs_concurrency", ["setup", "concurrency"],
              llm + cost + [f"engine_time_share.{k}" for k in ("gpu", "schedule", "output", "api_server")]),
        _long(data["engine_remedies"], "engine_remedies", ["setup", "concurrency"], llm + cost),
        _long(data["dit_scale_out"], "dit_scale_out", ["fabric", "gpus"],
              ["status", "latency_s.p50", "last_mile_share", "breakdown_share.comm", "breakdown_share.denoise",
               "cost.usd_per_image", "energy.joules_per_image"]),
        _long(data["scale_out"], "llm_scale_out", ["fabric", "gpus"],
              ["status", "ttft_ms.mean", "tpot_ms.mean", "e2e_ms.p50", "throughput.output_tokens_per_s",
               "last_mile_share", "itl_last_mile_share", "breakdown_share.comm", "cost.usd_per_mtok_output",
               "energy.joules_per_output_token"]),
        _long(data["placements"], "last_mile_vs_concurrency", ["setup", "concurrency"], llm),
        _long(data["remedies"], "remedies", ["setup", "concurrency"],
              llm + [f"breakdown_share.{c}" for c in plots.categories_in(data["remedies"].columns)]),
        _long(data["dit"], "dit_strategies", ["link", "strategy", "gpus"],
              ["status", "latency_s.p50", "last_mile_share", "breakdown_share.denoise", "breakdown_share.comm",
               "breakdown_share.bubble", "breakdown_share.encode", "memory_per_gpu_gib"]),
        _long(data["token"], "token_pipeline", ["workload", "slicing", "slices"],
              ["status", "latency_s.p50", "bubble_fraction", "slice_cost_spread"]),
        _long(data["kv_layouts"], "kv_layouts", ["layout"],
              ["status", "ttft_ms.mean", "ttft_ms.p99", "tpot_ms.mean", "throughput.output_tokens_per_s",
               "prefix_cache.hit_rate", "breakdown_share.kv_transfer", "last_mile_share"]),
    ]
    return pd.concat(parts, ignore_index=True)


def _fmt_concurrency(c) -> str:
    return "does not reach it in the swept range" if c is None else f"reaches it at concurrency {c}"


def _engines_figure(data: dict, out: Path, scale: Scale) -> dict:
    """The headline: last-mile share of ITL against concurrency, per engine profile."""
    en = data["engines"]
    fig = plots.last_mile_share_and_cost(en, f"The last mile of real engines: {LLM_DESC}", hue="setup")
    plots.save(fig, out / "engines_last_mile_vs_concurrency.png")
    return {"engines_last_mile_vs_concurrency.png": (
        "Left: the last mile's share of inter-token latency, attributed on the critical path (the part of each gap "
        "spent in D2H, detokenization, output processing, the outputs' messages and streaming, wherever it ran). "
        "Right: what it costs, from the counterfactual run of the same scenario with the last mile free: the "
        "throughput that run gains. Closed-loop concurrency grows, per engine profile with its sourced CPU costs "
        f"and process layout. {_headline_costs(en)}")}


def _headline_costs(en: pd.DataFrame) -> str:
    """The headline's sentence at the highest concurrency: attributed share and counterfactual cost per engine."""
    top = en[en["concurrency"] == en["concurrency"].max()].set_index("setup")
    parts = [f"{name}: {100 * top.loc[name, 'itl_last_mile_share']:.1f}% of ITL attributed, a free last mile "
             f"{_signed_ms(top.loc[name, 'last_mile_cost.itl_ms.mean'])} mean ITL and changes throughput by "
             f"{100 * top.loc[name, 'last_mile_cost.throughput_gain']:+.1f}% (API server "
             f"{100 * top.loc[name, 'engine_time_share.api_server']:.0f}% of engine time)"
             + _disagreement(top.loc[name]) for name in top.index]
    return f"At concurrency {int(top['concurrency'].iloc[0])}: " + "; ".join(parts) + "."


DISAGREE = 0.05
"""Attributed and counterfactual ITL shares further apart than this are said to disagree, with why."""


def _disagreement(row) -> str:
    """Where the attributed share of ITL and the counterfactual's ITL saving part, the reason the
    numbers show: a free last mile spent on throughput (larger batches) rather than on ITL, or the
    last mile's cost off the critical path the attribution walks."""
    attributed, saved = row["itl_last_mile_share"], row["last_mile_cost.itl_share"]
    if abs(attributed - saved) <= DISAGREE:
        return ""
    if saved < attributed and row["last_mile_cost.throughput_gain"] > DISAGREE:
        return (f" — the two disagree ({100 * saved:.1f}% of ITL saved): a free last mile lets the engine run "
                "larger batches, so it buys throughput rather than shorter gaps")
    return (f" — the two disagree ({100 * saved:.1f}% of ITL saved): removing the last mile changes what else "
            "waits, beyond the time the attribution finds on each gap's critical path")


def _signed_ms(saved_ms: float) -> str:
    """What a free last mile does to a latency that the last mile costs ``saved_ms``: cuts or lengthens it."""
    return f"cuts {saved_ms:.2f} ms off" if saved_ms >= 0 else f"adds {-saved_ms:.2f} ms to"


def _engine_remedies_figure(data: dict, out: Path, scale: Scale) -> dict:
    """What each remedy buys on each engine: mean TPOT per engine and remedy."""
    rem = data["engine_remedies"].copy()
    c = scale.remedy_concurrency
    fig = plots.breakdown_bars(rem, "setup", f"Latency breakdown per engine and remedy at concurrency {c}, {LLM_DESC}",
                               absolute=True, xlabel="setup")
    plots.save(fig, out / "engine_remedies_breakdown.png")
    rem["engine"] = rem["setup"].str.split(" · ").str[0]
    lines = []
    for name, g in rem.groupby("engine", sort=False):
        base = g[g["setup"].str.endswith("as shipped")].iloc[0]
        best = g.loc[g["tpot_ms.mean"].idxmin()]
        lines.append(f"{name}: {base['tpot_ms.mean']:.1f} ms as shipped, {best['tpot_ms.mean']:.1f} ms with "
                     f"{best['setup'].split(' · ')[1]}")
    return {"engine_remedies_breakdown.png": (
        f"Mean per-request latency split into categories (last mile hatched) at concurrency {c}, for each engine "
        "profile as shipped and with each remedy it lacks (async scheduling, four API-server processes, a stream "
        "interval of 8, a separate detokenizer). Mean TPOT: " + "; ".join(lines) + ".")}


def _scale_out_figure(data: dict, out: Path, scale: Scale) -> dict:
    """Llama-3-70B as the GPU count grows, per fabric: TPOT and the share of latency in communication."""
    so = data["scale_out"]
    fig = plots.line_pair(so, "gpus", "fabric", "GPUs",
                          ("tpot_ms.mean", "Llama-3-70B, TP 8 x PP gpus/8: mean TPOT", "mean TPOT (ms)", False),
                          ("breakdown_share.comm", "share of E2E in communication", "communication share of E2E (%)",
                           True))
    plots.save(fig, out / "llm_scale_out.png")
    top = so[so["gpus"] == so["gpus"].max()].set_index("fabric")
    parts = [f"{name} {top.loc[name, 'tpot_ms.mean']:.1f} ms ({100 * top.loc[name, 'breakdown_share.comm']:.1f}% "
             f"in communication, last mile {100 * top.loc[name, 'last_mile_share']:.2f}%)" for name in top.index]
    text = {"llm_scale_out.png": (
        f"Llama-3-70B (BF16, vLLM V1's host path, closed loop of 32) on 8 to {int(so['gpus'].max())} B200s as 8-way "
        "tensor-parallel stages, pipeline-parallel across the rest, on 8-GPU NVLink nodes joined by 400 Gb/s "
        "InfiniBand per GPU and on one 72-GPU NVLink domain, each also with its slower link doubled. At "
        f"{int(so['gpus'].max())} GPUs, mean TPOT: " + "; ".join(parts) + ". " + _per_dollar_and_joule(
            so, "cost.usd_per_mtok_output", "energy.joules_per_output_token", "USD per million output tokens",
            "J per output token"))}
    dit = data["dit_scale_out"]
    fig = plots.line_pair(dit, "gpus", "fabric", "GPUs",
                          ("latency_s.p50", f"FLUX.1-dev 1536², {scale.dit_steps} steps, ring: latency", "latency (s)",
                           False),
                          ("last_mile_share", "last-mile share of image latency",
                           "last mile (VAE copy, JPEG encode, delivery) %", True))
    plots.save(fig, out / "dit_scale_out.png")
    top = dit[dit["gpus"] == dit["gpus"].max()].set_index("fabric")
    eight = dit[dit["gpus"] == dit["gpus"].min()].set_index("fabric")
    rack = next(name for name in top.index if name.startswith("NVL72"))
    rack_lo, rack_hi = eight.loc[rack, "last_mile_share"], top.loc[rack, "last_mile_share"]
    parts = [f"{name} {top.loc[name, 'latency_s.p50']:.2f} s ({100 * top.loc[name, 'breakdown_share.comm']:.0f}% "
             f"communication, last mile {100 * top.loc[name, 'last_mile_share']:.1f}%)" for name in top.index]
    text["dit_scale_out.png"] = (
        f"FLUX.1-dev at 1536x1536 with ring attention over every GPU, the same fabrics. On "
        f"{int(dit['gpus'].min())} GPUs the fabrics take {eight['latency_s.p50'].min():.2f}-"
        f"{eight['latency_s.p50'].max():.2f} s; at "
        f"{int(dit['gpus'].max())}: " + "; ".join(parts) + ". Where a ring crosses nodes each pass waits on one "
        "NIC, so NVL8 + InfiniBand gets slower past 8 GPUs while the rack keeps the ring on NVLink. The last mile's "
        f"share {'falls' if rack_hi < rack_lo else 'rises'} on the rack from {100 * rack_lo:.1f}% at "
        f"{int(dit['gpus'].min())} GPUs to {100 * rack_hi:.1f}% at {int(dit['gpus'].max())}. "
        + _per_dollar_and_joule(dit, "cost.usd_per_image", "energy.joules_per_image", "USD per image", "J per image"))
    return text


def _per_dollar_and_joule(rows: pd.DataFrame, usd: str, joules: str, usd_unit: str, joule_unit: str) -> str:
    """What each step of the GPU count buys per dollar and per joule, per fabric (``observe.energy``:
    the catalog's B200 price and power; the rack's GPUs priced as B200s)."""
    if usd not in rows.columns or joules not in rows.columns:
        return ""
    parts = []
    for fabric, group in rows.sort_values("gpus").groupby("fabric", sort=False):
        steps = ", ".join(f"{int(g)}: {c:.3g} / {j:.3g}" for g, c, j in zip(group["gpus"], group[usd], group[joules]))
        parts.append(f"{fabric} {steps}")
    return f"Per GPU count, {usd_unit} / {joule_unit} (GPUs'): " + "; ".join(parts) + "."


def _last_mile_figure(data: dict, out: Path, scale: Scale) -> dict:
    """The headline: last-mile share of ITL against concurrency, per detokenizer placement."""
    text = {}
    pl = data["placements"]
    fig = plots.last_mile_vs_concurrency(pl, f"Where the last mile bites: {LLM_DESC}", hue="setup")
    plots.save(fig, out / "last_mile_vs_concurrency.png")
    cross = E.crossover(pl)
    peak = pl.loc[pl["itl_last_mile_share"].idxmax()]
    eng_slow = f"engine · {SLOW_FACTOR}x slower detok"
    text["last_mile_vs_concurrency.png"] = (
        f"Last-mile share of inter-token latency as closed-loop concurrency grows, per detokenizer placement. "
        f"Against a 20% line, the engine-process detokenizer with reference CPU costs "
        f"{_fmt_concurrency(cross.get('engine · reference CPU'))}; with a {SLOW_FACTOR}x slower detokenizer it "
        f"{_fmt_concurrency(cross.get(eng_slow))}, peaking at {100 * peak['itl_last_mile_share']:.1f}% "
        f"({peak['setup']}, concurrency {peak['concurrency']}). Moving detokenization out of the engine keeps the "
        f"share below {100 * pl[~pl['setup'].str.startswith('engine')]['itl_last_mile_share'].max():.1f}% everywhere.")
    return text


def _remedies_figure(data: dict, out: Path, scale: Scale) -> dict:
    """What each last-mile remedy buys, as a latency breakdown per setup."""
    text = {}
    rem = data["remedies"]
    c = scale.remedy_concurrency
    fig = plots.breakdown_bars(rem, "setup", f"Latency breakdown per remedy at concurrency {c} "
                               f"({SLOW_FACTOR}x slower detok), {LLM_DESC}", absolute=True, xlabel="setup")
    plots.save(fig, out / "remedies_breakdown.png")
    base = rem.iloc[0]
    best = rem.loc[rem["tpot_ms.mean"].idxmin()]
    text["remedies_breakdown.png"] = (
        f"Mean per-request latency split into categories (last mile hatched) at concurrency {c}. The baseline "
        f"spends {100 * base['last_mile_share']:.1f}% of end-to-end latency in the last mile with a mean TPOT of "
        f"{base['tpot_ms.mean']:.1f} ms; the best remedy, {best['setup']}, brings TPOT to "
        f"{best['tpot_ms.mean']:.1f} ms ({100 * (1 - best['tpot_ms.mean'] / base['tpot_ms.mean']):.0f}% less) "
        f"and the last-mile share to {100 * best['last_mile_share']:.1f}%.")
    return text


def _llm_run_figures(data: dict, out: Path, scale: Scale) -> dict:
    """Latency CDFs of three setups, and a timeline of a few steps of the first."""
    text = {}
    cdf_runs = {label: run(None, {**E.CLOSED_LOOP, **over, **slow_cpu(), "workload.concurrency": 64,
                                  "workload.requests": 128, "record_spans": label == "engine, sync"},
                                 last_mile_cost=False)
                for label, over in (("engine, sync", {}), ("separate detokenizer", E.REMEDIES["separate detokenizer"]),
                                    ("async overlap", E.REMEDIES["async overlap"]))}
    fig = plots.latency_cdfs(cdf_runs, f"Latency distributions at concurrency 64, {SLOW_FACTOR}x slower detok, {LLM_DESC}")
    plots.save(fig, out / "latency_cdfs.png")
    itl = {k: (r.summary["itl_ms"]["p50"], r.summary["itl_ms"]["p99"]) for k, r in cdf_runs.items()}
    text["latency_cdfs.png"] = (
        "Distributions of time to first token and of every inter-token gap the clients saw. Median / p99 ITL: "
        + ", ".join(f"{p50:.1f} / {p99:.1f} ms ({k})" for k, (p50, p99) in itl.items()) + ".")

    res = cdf_runs["engine, sync"]
    steps = res.spans[(res.spans["track"] == "gpu0") & (res.spans["category"] == "decode")].sort_values("start")
    mid = steps.iloc[len(steps) // 2]
    window = (float(mid["start"]), float(mid["start"]) + 4 * float(mid["end"] - mid["start"]) + 0.002)
    fig = plots.timeline(res, "Timeline of one engine (engine-process detok, sync, concurrency 64, "
                         f"{SLOW_FACTOR}x slower detok): GPU steps wait on CPU work", window=window)
    plots.save(fig, out / "timeline_llm.png")
    util = res.summary["utilization"]
    text["timeline_llm.png"] = (
        f"Four engine steps in steady state: each GPU step (blue) is followed by D2H, detokenization and the next "
        f"schedule on the engine's CPU before the GPU can start again. Over the run the GPU is busy "
        f"{100 * util.get('gpu0', 0):.0f}% of the time and the engine process "
        f"{100 * util.get('cpu:engine0', 0):.0f}%.")
    return text


def _kv_layouts_figure(data: dict, out: Path, scale: Scale) -> dict:
    """Issue 15's what-if: co-located vs disaggregated on the Mooncake trace, with and without prefix caching."""
    kv = data["kv_layouts"]
    fig = plots.breakdown_bars(kv, "layout", f"Mooncake conversation trace (first {scale.kv_requests} requests), "
                               "Llama-3.1-8B on 4x H100, vLLM V1 host path: mean latency per request",
                               absolute=True, xlabel="layout at 4 GPUs")
    plots.save(fig, out / "kv_layouts.png")
    rows = kv.set_index("layout")
    parts = []
    for name, r in rows.iterrows():
        hit = r.get("prefix_cache.hit_rate")
        cache = f", {100 * hit:.1f}% of prompt tokens from the prefix cache" if pd.notna(hit) else ""
        parts.append(f"{name}: TTFT {r['ttft_ms.mean']:.0f} ms mean, TPOT {r['tpot_ms.mean']:.1f} ms{cache}, "
                     f"last mile {100 * r['last_mile_share']:.2f}%")
    return {"kv_layouts.png": (
        f"The first {scale.kv_requests} requests of Mooncake's conversation trace (12k-token prompts on average, "
        "512-token prefix blocks, arrival times as published) on four H100s, as four co-located replicas or two "
        "prefill and two decode replicas with the KV cache crossing NVLink layer by layer, each with and without "
        "prefix caching and SGLang's cache-aware routing. " + "; ".join(parts) + ". " + _kv_reading(rows))}


def _kv_reading(rows: pd.DataFrame) -> str:
    """What the layouts' numbers say, read from them (which way each comparison went)."""
    co, pd_ = rows.loc["4 co-located"], rows.loc["2P2D"]
    ttft = "raises" if pd_["ttft_ms.mean"] > co["ttft_ms.mean"] else "lowers"
    tpot = "lowers" if pd_["tpot_ms.mean"] < co["tpot_ms.mean"] else "raises"
    from ..config.models import Serving  # the layouts keep the default block size

    cache_tokens = int(co["kv_cache.blocks_per_replica"]) * Serving.model_fields["block_size"].default
    return (f"Against four co-located replicas, 2P2D {ttft} mean TTFT (two GPUs prefill every prompt) and {tpot} "
            f"TPOT (decode steps carry no prompt chunks). Each replica's KV cache holds {cache_tokens:,} tokens, so "
            "a conversation's next turn, which comes after minutes of other traffic, rarely finds its history still "
            "cached.")


def _dit_figure(data: dict, out: Path, scale: Scale) -> dict:
    """Image latency against GPU count per DiT strategy, NVLink vs PCIe."""
    text = {}
    dit = data["dit"]
    fig = plots.latency_vs_gpus(dit, f"PixArt-alpha 1024x1024, {scale.dit_steps} steps: image latency vs GPUs "
                                "per strategy")
    plots.save(fig, out / "dit_latency_vs_gpus.png")
    best = E.best_strategy(dit)
    top = best[best["gpus"] == best["gpus"].max()]
    text["dit_latency_vs_gpus.png"] = (
        "Image latency against GPU count for each parallel strategy, NVLink vs PCIe. At "
        f"{int(top['gpus'].iloc[0])} GPUs the fastest is " + "; ".join(
            f"{r.strategy} on {r.link} ({r['latency_s.p50']:.3f} s, {r.speedup:.1f}x over one GPU, "
            f"{100 * r['breakdown_share.comm']:.0f}% communication)" for _, r in top.iterrows()) + ".")
    return text


def _pipefusion_figure(data: dict, out: Path, scale: Scale) -> dict:
    """PipeFusion's patches moving through its stages."""
    text = {}
    pf = run(scenarios_dir() / "dit" / "pixart-1024-a100-nvlink-single.yaml",
             {"parallel.pipefusion": 4, "parallel.patches": 4, "workload.requests": 1, "steps": 4})
    fig = plots.dit_pipeline(pf, "PipeFusion on 4x A100 NVLink, PixArt-alpha 1024x1024: 4 patches through 4 "
                             "stages (first 3 steps; step 0 is the synchronous warmup)")
    plots.save(fig, out / "dit_pipeline.png")
    text["dit_pipeline.png"] = (
        f"Each box is one patch on one stage. The warmup step fills and drains the pipeline; afterwards the "
        f"patches stream back to back. Bubbles are {100 * pf.summary['breakdown_share']['bubble']:.1f}% of this "
        f"4-step request's latency.")
    return text


def _token_pipeline_figure(data: dict, out: Path, scale: Scale) -> dict:
    """Bubble fraction of the token-level pipeline, causal LLM vs DiT."""
    text = {}
    tok = data["token"]
    fig = plots.lines(tok.assign(series=tok["workload"] + " · " + tok["slicing"]), "slices", "bubble_fraction",
                      "series", "Token-level pipeline, 32k tokens on 4 stages: bubble fraction vs slices",
                      "slices (micro-batches of tokens)", "bubble fraction (%)", logx=True, percent=True)
    plots.save(fig, out / "token_pipeline_bubbles.png")
    k = max(scale.slices)
    at = tok[tok["slices"] == k].set_index(["workload", "slicing"])["bubble_fraction"]
    text["token_pipeline_bubbles.png"] = (
        f"Bubble fraction of the same 4-stage token pipeline on a causal LLM and on a DiT. At {k} slices: "
        + "; ".join(f"{w}: {100 * at[(w, 'uniform')]:.1f}% uniform, {100 * at[(w, 'balanced')]:.1f}% balanced"
                    for w in dict.fromkeys(tok["workload"])) + ".")
    return text


FIGURES = (_engines_figure, _engine_remedies_figure, _last_mile_figure, _remedies_figure, _llm_run_figures,
           _scale_out_figure, _kv_layouts_figure, _dit_figure, _pipefusion_figure, _token_pipeline_figure)
"""Each draws its figure(s) into the report folder and returns the sentence under each."""


def write_figures(data: dict, out: Path, scale: Scale) -> dict:
    """Draw and save the report's figures; returns the sentences that go under each figure."""
    text = {}
    for figure in FIGURES:
        text.update(figure(data, out, scale))
    return text


def headline(data: dict) -> list[str]:
    """The report's headline numbers, as sentences."""
    pl = data["placements"]
    cross = E.crossover(pl)
    rem = data["remedies"]
    base, asy = rem.iloc[0], rem[rem["setup"] == "async overlap"].iloc[0]
    tok = data["token"]
    causal = tok[(tok["workload"].str.startswith("causal")) & (tok["slices"] == tok["slices"].max())]
    u = float(causal[causal["slicing"] == "uniform"]["bubble_fraction"].iloc[0])
    b = float(causal[causal["slicing"] == "balanced"]["bubble_fraction"].iloc[0])
    en = data["engines"]
    return [
        f"Real engines ({LLM_DESC}), the last mile attributed and its counterfactual cost. {_headline_costs(en)}",
        f"Last mile vs 20% of inter-token latency, engine-process detokenization: with reference CPU costs it "
        f"{_fmt_concurrency(cross.get('engine · reference CPU'))}; with a {SLOW_FACTOR}x slower detokenizer it "
        f"{_fmt_concurrency(cross.get(f'engine · {SLOW_FACTOR}x slower detok'))}.",
        f"At concurrency {int(base['concurrency'])} with the slow detokenizer, async overlap cuts mean TPOT from "
        f"{base['tpot_ms.mean']:.1f} ms to {asy['tpot_ms.mean']:.1f} ms.",
        f"Causal token pipelining at {int(tok['slices'].max())} slices: balanced slicing cuts the bubble fraction "
        f"from {100 * u:.1f}% to {100 * b:.1f}%.",
    ]


def write_readme(out: Path, text: dict, lines: list[str]) -> None:
    """results/README.md: headline numbers, then each figure with its generated sentences."""
    body = ["# lastmile report", "",
            "Generated by `lastmile report` (do not edit by hand; CI runs `lastmile report --check`). "
            "Every number below is computed from the simulations; `summary.csv` holds them all.", "",
            "## Headline", ""] + [f"- {s}" for s in lines] + [""]
    for name, sentences in text.items():
        title = name[:-4].replace("_", " ")
        body += [f"## {title[0].upper()}{title[1:]}", "", f"![{title}]({name})", "", sentences, ""]
    (out / "README.md").write_text("\n".join(body))


def generate(out: str | Path = "results", scale: Scale = FULL) -> Path:
    """Run the suite and write summary.csv (+ figures and README.md when ``scale.figures``)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data = run_experiments(scale)
    summary_frame(data).to_csv(out / "summary.csv", index=False)
    if scale.figures:
        text = write_figures(data, out, scale)
        write_readme(out, text, headline(data))
    return out


def check(out: str | Path = "results", scale: Scale = FULL) -> int:
    """Regenerate into a temp folder; 0 if every committed CSV matches, else print a diff summary and return 1."""
    out = Path(out)
    committed = sorted(out.glob("*.csv"))
    if not committed:
        print(f"lastmile report --check: no CSV in {out}/ to compare; run `lastmile report` first")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        generate(tmp, Scale(**{**scale.__dict__, "figures": False}))
        bad = 0
        for path in committed:
            fresh = Path(tmp) / path.name
            old = path.read_text().splitlines()
            new = fresh.read_text().splitlines() if fresh.exists() else []
            if old != new:
                bad += 1
                diff = [d for d in difflib.unified_diff(old, new, f"committed/{path.name}", f"regenerated/{path.name}",
                                                        lineterm="", n=0) if not d.startswith("@@")]
                changed = sum(1 for d in diff[2:] if d.startswith(("+", "-")))
                print(f"{path}: differs ({changed} changed lines); first differences:")
                for d in diff[:22]:
                    print(f"  {d}")
    if bad:
        print(f"lastmile report --check: {bad} CSV file(s) differ; rerun `lastmile report` and commit results/")
        return 1
    print(f"lastmile report --check: {len(committed)} CSV file(s) match")
    return 0
