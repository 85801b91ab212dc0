"""Write the question notebooks with nbformat (run: python notebooks/build_notebooks.py).

Each notebook opens with its question, runs small deterministic sweeps through
``simulator.report.experiments``, shows a figure and ends with an answer printed from the data.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

SETUP = """\
import pandas as pd
from IPython.display import Image, display

import simulator
from simulator.report import experiments as E, plots

pd.set_option("display.width", 160)
pd.set_option("display.precision", 3)"""

NB1 = [
    new_markdown_cell("""\
# 1 · Where does the last mile bite?

**Question.** Llama-3-8B on one H100: as concurrency grows, the GPU step grows slowly while the
per-token CPU work (D2H copy, detokenization, streaming) grows linearly with the batch. At what
concurrency does the last mile pass **20% of inter-token latency (ITL)**, and what does each remedy
buy — a separate detokenizer process, detokenizing in 1 or 4 API servers, async overlap, streaming
every 4 tokens? And how do real serving stacks fare?

We sweep closed-loop concurrency from 1 to 1,024 (two requests per client, 512-token prompts,
128-token outputs) twice, on the idealised `reference` engine profile: once with its CPU costs
(tokenizer, detokenizer and SSE framing measured on their own, a floor rather than what a real
stack costs) and once with its detokenize/output/stream costs multiplied by 10. The 10x factor is
a hypothetical slow last mile (think pure-Python detokenization), not a measured stack; it is kept
for contrast with the engines below.

Then, under **Real engines**, the same closed loop runs on the engine profiles the report uses
(`serving.engine`: vLLM 0.5, vLLM 0.6, vLLM V1, SGLang, TensorRT-LLM; catalog `engines.yaml`, CPU
costs in `cpus.yaml`, every figure with its source), each with its own process layout, overlap
mode and stream interval, and each with the remedies it does not already ship."""),
    new_code_cell("""\
import pandas as pd
from IPython.display import Image, Markdown, display

import simulator
from simulator.report import experiments as E, plots

pd.set_option("display.width", 160)
pd.set_option("display.precision", 3)"""),
    new_code_cell("""\
concurrency = [1, 4, 16, 64, 256, 1024]
slow = E.cpu_slowdown(10, ("detokenize_per_token", "output_per_request", "stream_per_chunk"))
ref = E.llm_concurrency(concurrency, E.REMEDIES).assign(cpu="reference")
slw = E.llm_concurrency(concurrency, E.REMEDIES, base=slow).assign(cpu="10x slower detok")
rows = pd.concat([ref, slw], ignore_index=True)
rows.pivot_table(index="concurrency", columns=["cpu", "setup"], values="itl_last_mile_share").round(3).T"""),
    new_code_cell("""\
fig = plots.last_mile_vs_concurrency(rows[rows["setup"].str.startswith(("baseline", "separate", "API-server detok x1"))]
                                     .assign(series=lambda d: d["setup"] + " · " + d["cpu"]),
                                     "Llama-3-8B on 1x H100: last-mile share of ITL vs concurrency", hue="series")
display(Image(plots.to_png(fig)))"""),
    new_code_cell("""\
at = 256
sub = slw[slw["concurrency"] == at].set_index("setup")
fig = plots.breakdown_bars(sub.reset_index(), "setup", f"Latency breakdown per remedy, concurrency {at}, 10x slower detok",
                           absolute=True)
display(Image(plots.to_png(fig)))
sub[["tpot_ms.mean", "itl_ms.p99", "itl_last_mile_share", "throughput.output_tokens_per_s"]]"""),
    new_markdown_cell("""\
## Real engines

Each engine profile runs with its own serving defaults (`E.engine_setup`: process layout, overlap
mode, stream interval, batch limits) on the same closed-loop load, at fewer concurrencies than
above to keep the notebook quick. The last mile is measured two ways: its share of ITL attributed on
the critical path (`itl_last_mile_share`: the part of each gap spent in D2H, detokenization, output
processing and streaming, whichever process ran it), and what it costs (`last_mile_cost`: the same
run with the last mile made free, `serving.last_mile: free`, and what that saves; `last_mile_cost=True`
adds that second run to each point). The summary also splits each engine's time into GPU,
scheduling + input preparation, output processing and API-server work (`engine_time_share.*`)."""),
    new_code_cell("""\
engine_concurrency = [1, 16, 64, 256]
engines = E.llm_concurrency(engine_concurrency, {name: E.engine_setup(name) for name in E.ENGINES},
                            last_mile_cost=True)
fig = plots.last_mile_share_and_cost(engines, "Llama-3-8B on 1x H100, per engine profile: the last mile attributed "
                                     "and what a free last mile would gain")
display(Image(plots.to_png(fig)))
shares = ["itl_last_mile_share", "last_mile_cost.itl_share", "last_mile_cost.throughput_gain",
          *[f"engine_time_share.{k}" for k in ("gpu", "schedule", "output", "api_server")]]
for name, g in engines.groupby("setup", sort=False):
    t = g.set_index("concurrency")[["status", "tpot_ms.mean", "throughput.output_tokens_per_s", *shares]]
    t[shares] = (100 * t[shares]).round(2)  # shares in percent
    display(Markdown(f"**{name}** (shares in %)"))
    display(t.rename(columns={c: f"{c} %" for c in shares}))"""),
    new_markdown_cell("""\
### What each remedy buys per engine

At concurrency 64, each engine as shipped and with each remedy it lacks (`E.engine_remedies`: a
remedy the profile already has is skipped): async scheduling, four API-server processes, a stream
every 8 tokens, a separate detokenizer process."""),
    new_code_cell("""\
remedy_at = 64
rem = E.llm_concurrency([remedy_at], E.engine_remedies())
rem[["engine", "remedy"]] = rem["setup"].str.split(" · ", n=1, expand=True)
fig = plots.breakdown_bars(rem, "setup", f"Latency breakdown per engine and remedy at concurrency {remedy_at}",
                           absolute=True, xlabel="setup")
display(Image(plots.to_png(fig)))
shipped = rem[rem["remedy"] == "as shipped"].set_index("engine")["tpot_ms.mean"]
rem["TPOT vs as shipped %"] = (100 * (rem["tpot_ms.mean"] / rem["engine"].map(shipped) - 1)).round(2)
rem["itl_last_mile_share %"] = (100 * rem["itl_last_mile_share"]).round(3)
rem.set_index(["engine", "remedy"])[["status", "tpot_ms.mean", "TPOT vs as shipped %", "itl_last_mile_share %"]]"""),
    new_markdown_cell("""\
## Answer"""),
    new_code_cell("""\
cross_ref = E.crossover(ref)
cross_slow = E.crossover(slw)
base_name = "baseline (engine detok, sync)"
def when(c):
    return f"at concurrency {c}" if c is not None else "nowhere between 1 and 1,024"
peak_ref = ref[ref["setup"] == base_name]["itl_last_mile_share"].max()
print(f"With the reference CPU costs the engine-process last mile reaches at most {100 * peak_ref:.1f}% of ITL, "
      f"so it passes 20% {when(cross_ref[base_name])}.")
print(f"With a 10x slower detokenizer it passes 20% {when(cross_slow[base_name])}.")
b = sub.loc[base_name]
for name, r in sub.drop(index=base_name).iterrows():
    print(f"  {name}: mean TPOT {b['tpot_ms.mean']:.1f} -> {r['tpot_ms.mean']:.1f} ms "
          f"({100 * (1 - r['tpot_ms.mean'] / b['tpot_ms.mean']):.0f}% less), last mile of ITL "
          f"{100 * b['itl_last_mile_share']:.1f}% -> {100 * r['itl_last_mile_share']:.1f}%, "
          f"throughput {r['throughput.output_tokens_per_s'] / b['throughput.output_tokens_per_s']:.2f}x")
best = sub["tpot_ms.mean"].idxmin()
print(f"Best single remedy at concurrency {at}: {best}.")

top_c = engines["concurrency"].max()
top = engines[(engines["concurrency"] == top_c) & (engines["status"] == "ok")].set_index("setup")
ok_rem = rem[rem["status"] == "ok"]
print(f"Real engines (last mile of ITL and API-server share of engine time at concurrency {top_c}; "
      f"remedies at concurrency {remedy_at}):")
for name in E.ENGINES:
    if name not in top.index:
        print(f"  {name}: no successful run at concurrency {top_c}.")
        continue
    g = ok_rem[ok_rem["engine"] == name]
    base_t = g[g["remedy"] == "as shipped"]["tpot_ms.mean"].iloc[0]
    fixes = g[g["remedy"] != "as shipped"]
    best_fix = fixes.loc[fixes["tpot_ms.mean"].idxmin()] if not fixes.empty else None
    if best_fix is not None and best_fix["tpot_ms.mean"] < base_t:
        t = best_fix["tpot_ms.mean"]
        remedy = (f"the remedy that lowers its mean TPOT most is {best_fix['remedy']} ({base_t:.2f} -> {t:.2f} ms, "
                  f"{100 * (1 - t / base_t):.1f}% less)")
    else:
        remedy = f"none of the remedies it lacks lowers its mean TPOT ({base_t:.2f} ms as shipped)"
    print(f"  {name}: the last mile is {100 * top.loc[name, 'itl_last_mile_share']:.2f}% of ITL attributed; "
          f"made free it would change mean ITL by {-top.loc[name, 'last_mile_cost.itl_ms.mean']:+.2f} ms and "
          f"throughput by {100 * top.loc[name, 'last_mile_cost.throughput_gain']:+.1f}%; the API server is "
          f"{100 * top.loc[name, 'engine_time_share.api_server']:.0f}% of engine time; {remedy}.")
cross_en = {k: v for k, v in E.crossover(engines).items() if v is not None}
print("Engines whose last mile passes 20% of ITL between concurrency "
      f"{min(engine_concurrency)} and {max(engine_concurrency)}: "
      + (", ".join(f"{k} (at {v})" for k, v in cross_en.items()) if cross_en else "none") + ".")"""),
]

NB2 = [
    new_markdown_cell("""\
# 2 · Parallel DiT on NVLink vs PCIe

**Question.** For PixArt-alpha (0.6 B) and FLUX.1-dev (12 B), which parallel strategy —
PipeFusion (patch pipeline), Ulysses or Ring sequence parallelism, tensor parallelism,
DistriFusion — gives the lowest image latency at 2, 4 and 8 GPUs, on NVLink (A100 SXM) and on
PCIe (A100 PCIe), and why: communication volume, pipeline bubbles, or memory?

Every point is one image (10 denoising steps to keep the notebook fast; ratios between
strategies hold at 20+ steps because every step costs the same)."""),
    new_code_cell(SETUP),
    new_code_cell("""\
single = E.SCENARIOS / "dit" / "pixart-1024-a100-nvlink-single.yaml"
frames = []
for res in (1024, 2048):
    frames.append(E.dit_strategies(single, base={"steps": 10, "resolution": res}).assign(model="PixArt-alpha", resolution=res))
flux = E.SCENARIOS / "dit" / "flux-1024-h100-single.yaml"
frames.append(E.dit_strategies(flux, base={"steps": 10}).assign(model="FLUX.1-dev", resolution=1024))
dit = pd.concat(frames, ignore_index=True)
dit[["model", "resolution", "link", "strategy", "gpus", "status", "latency_s.p50", "breakdown_share.comm",
     "breakdown_share.bubble", "memory_per_gpu_gib"]].head(12)"""),
    new_code_cell("""\
for (model, res), g in dit.groupby(["model", "resolution"], sort=False):
    fig = plots.latency_vs_gpus(g, f"{model} {res}x{res}, 10 steps: image latency vs GPUs per strategy")
    display(Image(plots.to_png(fig)))"""),
    new_code_cell("""\
pf = simulator.run(single, {"parallel.pipefusion": 4, "parallel.patches": 4, "workload.requests": 1, "steps": 4})
display(Image(plots.to_png(plots.dit_pipeline(pf, "PipeFusion, 4 stages x 4 patches, PixArt-alpha 1024x1024 on A100 NVLink"))))"""),
    new_markdown_cell("## Answer"),
    new_code_cell("""\
for (model, res), g in dit.groupby(["model", "resolution"], sort=False):
    best = E.best_strategy(g)
    print(f"{model} {res}x{res}:")
    for _, r in best.iterrows():
        print(f"  {r['link']:<18} {r['gpus']} GPUs: {r['strategy']:<12} {r['latency_s.p50']:.3f} s "
              f"({r['speedup']:.1f}x over 1 GPU; comm {100 * r['breakdown_share.comm']:.1f}%, "
              f"bubble {100 * r['breakdown_share.bubble']:.1f}%, {r['memory_per_gpu_gib']:.1f} GiB/GPU)")
px = dit[(dit["model"] == "PixArt-alpha") & (dit["resolution"] == 1024) & (dit["gpus"] == 8)]
t = px.set_index(["link", "strategy"])["latency_s.p50"]
links = list(E.DIT_LINKS)
worst = max(E.DIT_STRATEGIES, key=lambda s: t[(links[1], s)] / t[(links[0], s)])
print(f"Moving from NVLink to PCIe hurts {worst} most at 8 GPUs (PixArt 1024): "
      f"{t[(links[0], worst)]:.3f} s -> {t[(links[1], worst)]:.3f} s, because it moves the most bytes per step; "
      f"PipeFusion changes {t[(links[0], 'pipefusion')]:.3f} s -> {t[(links[1], 'pipefusion')]:.3f} s "
      f"(it only passes activations between neighbours).")"""),
]

NB3 = [
    new_markdown_cell("""\
# 3 · Token-level pipelining: causal LLM vs DiT

**Question.** The same token-level pipeline (a 32k-token sequence cut into slices that flow
through 4 stages) runs a causal LLM prefill and a DiT forward pass. In the DiT every slice attends
to all tokens and costs the same; in the causal LLM slice *i* attends to every earlier token, so
later slices cost more. How does the bubble fraction fall with the number of slices for each,
and how much does cost-balanced slicing (TeraPipe's dynamic programme) recover?"""),
    new_code_cell(SETUP),
    new_code_cell("""\
tok = E.token_pipeline(slices=(1, 2, 4, 8, 16, 32))
tok[["workload", "slicing", "slices", "latency_s.p50", "bubble_fraction", "slice_cost_spread"]]"""),
    new_code_cell("""\
fig = plots.lines(tok.assign(series=tok["workload"] + " · " + tok["slicing"]), "slices", "bubble_fraction", "series",
                  "Token-level pipeline, 32k tokens on 4 A100 stages: bubble fraction vs slices",
                  "slices", "bubble fraction (%)", logx=True, percent=True)
display(Image(plots.to_png(fig)))
r = simulator.run(E.SCENARIOS / "dit" / "token-pipeline-causal.yaml")
display(Image(plots.to_png(plots.timeline(r, "Causal LLM, 8 uniform slices on 4 stages: later slices cost more",
                                          window=(0.0, float(r.spans["end"].max()))))))"""),
    new_markdown_cell("## Answer"),
    new_code_cell("""\
k = 8
at = tok[tok["slices"] == k].set_index(["workload", "slicing"])
causal, dit_name = [w for w in dict.fromkeys(tok["workload"])]
cu, cb = at.loc[(causal, "uniform")], at.loc[(causal, "balanced")]
du = at.loc[(dit_name, "uniform")]
ideal = (4 - 1) / (k + 4 - 1)
print(f"At {k} slices on 4 stages the fill-and-drain bubble alone is {100 * ideal:.1f}%.")
print(f"DiT: {100 * du['bubble_fraction']:.1f}% bubble with uniform slices (slice cost spread {du['slice_cost_spread']:.2f}x): "
      f"equal slices already balance the pipeline.")
print(f"Causal LLM: uniform slices cost up to {cu['slice_cost_spread']:.2f}x each other and the bubble is "
      f"{100 * cu['bubble_fraction']:.1f}%; balanced slicing brings it to {100 * cb['bubble_fraction']:.1f}% "
      f"and the latency from {cu['latency_s.p50'] * 1e3:.0f} ms to {cb['latency_s.p50'] * 1e3:.0f} ms "
      f"({100 * (1 - cb['latency_s.p50'] / cu['latency_s.p50']):.0f}% faster).")"""),
]

NB4 = [
    new_markdown_cell("""\
# 4 · Wider, nearer, more continuous

**Question.** Three levers beyond raw FLOP/s: **wider** links (NVLink vs PCIe; 8 vs 16 GPUs),
**nearer** data paths (where the sampled token is turned into text, relative to the GPU), and
**more continuous** output — ITL jitter and stalls (p99 ITL, gaps over twice the median), not only
means. How much does each move the numbers?"""),
    new_code_cell(SETUP),
    new_code_cell("""\
# Wider: Ulysses and PipeFusion on PixArt-alpha 2048x2048 at 8 and 16 GPUs, NVLink vs PCIe (two nodes over IB for 16).
wide = E.dit_strategies(E.SCENARIOS / "dit" / "pixart-2048-a100-nvlink-single.yaml", gpu_counts=(1, 8, 16),
                        strategies=("ulysses", "pipefusion"), base={"steps": 10, "hardware.node_link": "ib-400g"})
display(Image(plots.to_png(plots.latency_vs_gpus(wide, "PixArt-alpha 2048x2048, 10 steps: wider links and more GPUs"))))
wide[["link", "strategy", "gpus", "status", "latency_s.p50", "breakdown_share.comm"]]"""),
    new_code_cell("""\
# Nearer and more continuous: detokenizer placement, overlap and stream interval at concurrency 256 (10x slower detok).
slow = E.cpu_slowdown(10, ("detokenize_per_token", "output_per_request", "stream_per_chunk"))
setups = {"engine process (sync)": {}, "separate process": {"serving.detokenizer": "separate"},
          "API server x4": {"serving.detokenizer": "api_server", "serving.api_servers": 4},
          "engine, async overlap": {"serving.overlap": "async"},
          "stream every 2": {"serving.stream_interval": 2}, "stream every 8": {"serving.stream_interval": 8}}
near = E.llm_concurrency([256], setups, base=slow)
E.jitter_table(near)"""),
    new_code_cell("""\
fig = plots.breakdown_bars(near, "setup", "Llama-3-8B on 1x H100, concurrency 256, 10x slower detok: where the time goes",
                           absolute=True)
display(Image(plots.to_png(fig)))"""),
    new_markdown_cell("""\
## Wider still: 8 -> 16 -> 32 GPUs on NVLink nodes joined by InfiniBand, or one NVL72 rack

Node types (`hardware.node`) wire B200s as eight-GPU NVLink boxes with a 400 Gb/s NIC per GPU
(`dgx-b200`) or as one 72-GPU NVLink domain (`gb200-nvl72`); each fabric also runs with its slower
link doubled. Llama-3-70B runs 8-way tensor parallel with pipeline stages across the rest; FLUX.1-dev
runs ring attention over every GPU."""),
    new_code_cell("""\
llm_scale = E.llm_scale_out(gpus=(8, 16, 32))
dit_scale = E.dit_scale_out(gpus=(8, 16, 32), steps=4)
fig = plots.lines(dit_scale, "gpus", "latency_s.p50", "fabric", "FLUX.1-dev 1536x1536, 4 steps, ring attention",
                  "GPUs", "latency (s)", logx=True)
display(Image(plots.to_png(fig)))
dit_scale[["fabric", "gpus", "latency_s.p50", "breakdown_share.comm", "last_mile_share"]]"""),
    new_markdown_cell("""\
## What each step buys per dollar and per joule

Every summary carries `cost` (the GPU-hours of the run at the catalog's price: B200s at SemiAnalysis's
neocloud TCO tier, the rack's GPUs priced as B200s) and `energy` (the component-activity power
model, `simulator/observe/energy.py`). At the same load, more GPUs cost more per token unless they
buy proportionally more speed."""),
    new_code_cell("""\
llm_scale[["fabric", "gpus", "tpot_ms.mean", "cost.usd_per_mtok_output", "energy.joules_per_output_token",
           "energy.gpu_watts_mean"]]"""),
    new_markdown_cell("## Answer"),
    new_code_cell("""\
for name, g in llm_scale.groupby("fabric", sort=False):
    g = g.set_index("gpus")
    steps = ", ".join(f"{n}: {g.loc[n, 'cost.usd_per_mtok_output']:.2f} USD/Mtok, "
                      f"{g.loc[n, 'energy.joules_per_output_token']:.2f} J/token" for n in g.index)
    print(f"Per dollar and per joule — Llama-3-70B on {name}: {steps}.")
for name, g in dit_scale.groupby("fabric", sort=False):
    g = g.set_index("gpus")
    lo, hi = g.index.min(), g.index.max()
    print(f"Wider — FLUX.1-dev ring on {name}: {g.loc[lo, 'latency_s.p50']:.2f} s at {lo} GPUs, "
          f"{g.loc[hi, 'latency_s.p50']:.2f} s at {hi} ({100 * g.loc[hi, 'breakdown_share.comm']:.0f}% communication); "
          f"Llama-3-70B mean TPOT {llm_scale[(llm_scale.fabric == name) & (llm_scale.gpus == hi)]['tpot_ms.mean'].iloc[0]:.1f} ms at {hi}.")
w = wide[wide["status"] == "ok"].set_index(["link", "strategy", "gpus"])["latency_s.p50"]
nv, pc = list(E.DIT_LINKS)
print(f"Wider: Ulysses at 8 GPUs takes {w[(nv, 'ulysses', 8)]:.2f} s on NVLink and {w[(pc, 'ulysses', 8)]:.2f} s on PCIe "
      f"({w[(pc, 'ulysses', 8)] / w[(nv, 'ulysses', 8)]:.2f}x); going to 16 GPUs over IB gives "
      f"{w[(nv, 'ulysses', 16)]:.2f} s on NVLink nodes.")
t = near.set_index("setup")
e = t.loc["engine process (sync)"]
for name in ("separate process", "API server x4", "engine, async overlap"):
    r = t.loc[name]
    print(f"Nearer/off the critical path — {name}: ITL p50 {e['itl_ms.p50']:.1f} -> {r['itl_ms.p50']:.1f} ms, "
          f"last mile of ITL {100 * e['itl_last_mile_share']:.1f}% -> {100 * r['itl_last_mile_share']:.1f}%.")
for name in ("stream every 2", "stream every 8"):
    r = t.loc[name]
    print(f"More continuous? {name}: mean TPOT {e['tpot_ms.mean']:.1f} -> {r['tpot_ms.mean']:.1f} ms, but ITL p99 "
          f"{e['itl_ms.p99']:.1f} -> {r['itl_ms.p99']:.1f} ms and gaps over 2x median "
          f"{int(e['itl_stalls.gaps_over_2x_median'])} -> {int(r['itl_stalls.gaps_over_2x_median'])}.")"""),
]

NB5 = [
    new_markdown_cell("""\
# 5 · Nearer state: prefix caching, cache-aware routing and disaggregation

**Question.** Two questions a deployment planner asks: *what does a 50% prefix hit rate buy me?*
and *is 2 prefill + 2 decode GPUs better than 4 co-located replicas for my trace?* Keeping the KV
cache next to the compute that needs it (a prefix cache, a router that sends a prompt where its
prefix lives) saves prefill; moving it between GPUs (disaggregation) costs a transfer on the links
lastmile already models. Where does the last mile stand in each?

Part 1 sweeps the share of each prompt that is a shared system prompt (`workload.prefix`) on
Llama-3-8B on one H100 (vLLM V1 host path), with and without `serving.prefix_caching`. Part 2 replays
the first requests of Mooncake's conversation trace (real arrival times, 512-token prefix blocks) on
four H100s: co-located replicas or a prefill pool and a decode pool (`disaggregation`), with and
without prefix caching and SGLang's cache-aware router (`serving.router: prefix_affinity`)."""),
    new_code_cell(SETUP),
    new_code_cell("""\
base = {"workload.requests": 200, "workload.rate": 12, "workload.prompt_tokens": 2048, "workload.output_tokens": 128,
        "record_spans": False}
points = [({"shared": share, "prefix_caching": on},
           {**base, "workload.prefix": {"shared_tokens": int(2048 * share), "groups": 4}, "serving.prefix_caching": on})
          for share in (0.0, 0.25, 0.5, 0.75) for on in (False, True)]
prefix = E.run_labelled(None, points)
prefix[["shared", "prefix_caching", "prefix_cache.hit_rate", "ttft_ms.mean", "ttft_ms.p99", "tpot_ms.mean",
        "last_mile_share"]]"""),
    new_code_cell("""\
layouts = E.kv_layouts(requests=200)
fig = plots.breakdown_bars(layouts, "layout", "Mooncake conversation trace, first 200 requests, Llama-3.1-8B on 4x H100",
                           absolute=True, xlabel="layout at 4 GPUs")
display(Image(plots.to_png(fig)))
layouts[["layout", "ttft_ms.mean", "ttft_ms.p99", "tpot_ms.mean", "throughput.output_tokens_per_s",
         "prefix_cache.hit_rate", "breakdown_share.kv_transfer", "last_mile_share"]]"""),
    new_markdown_cell("## Answer"),
    new_code_cell("""\
p = prefix.set_index(["shared", "prefix_caching"])
off, on = p.loc[(0.5, False)], p.loc[(0.5, True)]
print(f"A half-shared prompt: {100 * on['prefix_cache.hit_rate']:.0f}% of prompt tokens hit the cache; mean TTFT "
      f"{off['ttft_ms.mean']:.0f} -> {on['ttft_ms.mean']:.0f} ms, p99 {off['ttft_ms.p99']:.0f} -> {on['ttft_ms.p99']:.0f} ms, "
      f"mean TPOT {off['tpot_ms.mean']:.1f} -> {on['tpot_ms.mean']:.1f} ms.")
t = layouts.set_index("layout")
co, dis = t.loc["4 co-located"], t.loc["2P2D"]
print(f"Mooncake trace on 4 GPUs: 4 co-located replicas give TTFT {co['ttft_ms.mean']:.0f} ms and TPOT "
      f"{co['tpot_ms.mean']:.1f} ms; 2P2D gives TTFT {dis['ttft_ms.mean']:.0f} ms and TPOT {dis['tpot_ms.mean']:.1f} ms, "
      f"{100 * dis['breakdown_share.kv_transfer']:.3f}% of latency in KV transfers over NVLink.")
best = t["ttft_ms.mean"].idxmin()
print(f"Lowest mean TTFT: {best} ({t.loc[best, 'ttft_ms.mean']:.0f} ms); the last mile stays under "
      f"{100 * t['last_mile_share'].max():.2f}% of latency in every layout.")"""),
]

NB6 = [
    new_markdown_cell("""\
# 6 · Value parallelism in a RAG pipeline: which transformations cut TTFT?

**Question.** A retrieval-augmented request embeds its question, searches a vector index *and* a
keyword (BM25) index, re-ranks the candidates, then generates on Llama-3-8B (vLLM V1 on one H100,
prefix caching on; `scenarios/pipeline/rag.yaml`). Only the last step needs the model to think.
Which value-parallel transformation cuts time to first token (TTFT) most at 10, 100 and 1,000
concurrent users, and where does the last mile (D2H copy, detokenization, streaming) then stand?

**Setup** (`E.rag_transformations`, `E.KEYWORD_SEARCH`, `E.RAG_TRANSFORMS`). The baseline is a serial
hybrid chain: embed → vector search → keyword search → re-rank → generate. The keyword search is
Elasticsearch BM25 over MS MARCO (8.8M passages): 11.88 queries/s on one core in the
`xhluca/bm25-benchmarks` table, so 84.2 ms a query, on a 4-core box; it returns the re-ranker's 50
candidates. Each transformation is applied alone, then all together:

- **parallel retrievers**: the keyword search starts at the arrival, next to embed → vector search;
- **early start**: a warm-up call prefills the static 1,024-token prefix (system prompt +
  history) at the arrival while retrieval runs; the generate call finds it in the prefix cache;
- **streaming re-rank**: the re-ranker starts on the keyword search's first 10 of 50 candidates
  (*what-if*: candidates come evenly over the search's time);
- **cached retrieval**: each retrieval stage hits its own result cache 30% of the time
  (*what-if*: no published hit rate for RAG query results; drawn independently per stage).

Closed loop, sizes kept small for the notebook: 20 requests per user at 10 users (200), 5 at 100
(500), 2 at 1,000 (2,000). A closed loop's first wave arrives all at once, so the tables give
TTFT over all requests and over the **steady state** (each user's requests after its first)."""),
    new_code_cell(SETUP),
    new_code_cell("""\
rows = E.rag_transformations(users=(10, 100, 1000))
order = list(E.RAG_TRANSFORMS)
rows.pivot_table(index="transform", columns="users", values=["steady_ttft_ms.mean", "ttft_ms.mean"],
                 sort=False).reindex(order).round(0)"""),
    new_code_cell("""\
fig = plots.lines(rows, "users", "steady_ttft_ms.mean", "transform",
                  "RAG on Llama-3-8B / 1x H100: steady-state mean TTFT per transformation", "concurrent users",
                  "mean TTFT (ms)", logx=True, logy=True)
display(Image(plots.to_png(fig)))
cols = ["steady_ttft_ms.mean", "steady_pre_llm_ms", "steady_llm_queue_ms", "steady_llm_prefill_ms",
        "steady_last_mile_ms", "prefix_saved_tokens", "duration_s"]
rows.set_index(["users", "transform"])[cols].round(1)"""),
    new_markdown_cell("""\
**Reading early start honestly.** Early start is not free: each warm-up is a call of its own in the
engine's first-come-first-served queue. *At 100 users* it lowers the steady-state TTFT but raises
the mean over all requests: in the first wave all 100 warm-ups reach the engine at once, before any
generate call (retrieval takes ~100 ms), so every first call waits behind every user's prefix
instead of only the prompts ahead of it. *At 1,000 users* the engine's queue is ~90 s deep and its
KV cache holds only part of the users' prefixes: most warm-ups' blocks are evicted (least recently
used) before their calls are admitted (`prefix_saved_tokens` far below 1,024 per request), so the
prefix is prefilled twice and TTFT rises. And at 1,000 users every time saved before the
engine is spent waiting in its queue instead: in a closed loop the saturated engine sets the pace.
(An engine bug made this point worse before: with async
scheduling, a warm-up preempted while its only token was in flight stayed in the waiting queue
after finishing and decoded forever; vLLM V1 removes such requests, and lastmile now does too.)"""),
    new_markdown_cell("## Answer"),
    new_code_cell("""\
t = rows.set_index(["users", "transform"])
base = "baseline (serial)"
def change(before, after):
    d = before - after
    return f"cuts {d:.0f} ms ({100 * d / before:.0f}%)" if d >= 0 else f"adds {-d:.0f} ms ({-100 * d / before:.0f}%)"
for u in (10, 100, 1000):
    b = t.loc[(u, base)]["steady_ttft_ms.mean"]
    singles = [k for k in order if k not in (base, "all together")]
    ranked = sorted(singles, key=lambda k: t.loc[(u, k), "steady_ttft_ms.mean"])
    print(f"{u} users, steady-state mean TTFT {b:.0f} ms serial: "
          + "; ".join(f"{k} {change(b, t.loc[(u, k), 'steady_ttft_ms.mean'])}" for k in ranked)
          + f"; all together {change(b, t.loc[(u, 'all together'), 'steady_ttft_ms.mean'])}.")
    es = t.loc[(u, "early start")]
    print(f"   over all requests (first wave included): serial {t.loc[(u, base), 'ttft_ms.mean']:.0f} ms, early start "
          f"{es['ttft_ms.mean']:.0f} ms, all together {t.loc[(u, 'all together'), 'ttft_ms.mean']:.0f} ms; the calls found "
          f"{es['prefix_saved_tokens'] / (1024 * es['completed']):.0%} of their warm-ups' prefix tokens in the cache.")
a = t.loc[(10, "all together")]
print(f"Where the last mile stands (10 users, all together): TTFT {a['steady_ttft_ms.mean']:.0f} ms = retrieval "
      f"{a['steady_pre_llm_ms']:.0f} ms + LLM queue {a['steady_llm_queue_ms']:.0f} ms + prefill "
      f"{a['steady_llm_prefill_ms']:.0f} ms + the rest (scheduling, first token out); the generate call's exposed last "
      f"mile is {a['steady_last_mile_ms']:.2f} ms over its whole stream ({100 * a['steady_last_mile_share_e2e']:.3f}% of E2E).")
h, c = t.loc[(1000, base)], t.loc[(1000, "cached retrieval (30% what-if)")]
print(f"At 1,000 users the LLM queue is {h['steady_llm_queue_ms'] / 1e3:.1f} s of a {h['steady_ttft_ms.mean'] / 1e3:.1f} s TTFT: "
      f"caching cuts retrieval {h['steady_pre_llm_ms']:.0f} -> {c['steady_pre_llm_ms']:.0f} ms and the engine queue grows "
      f"{h['steady_llm_queue_ms'] / 1e3:.1f} -> {c['steady_llm_queue_ms'] / 1e3:.1f} s; no pipeline transformation helps "
      "a saturated engine.")"""),
]

NOTEBOOKS = {
    "01_where_the_last_mile_bites.ipynb": NB1,
    "02_parallel_dit_nvlink_vs_pcie.ipynb": NB2,
    "03_token_pipelining_causal_vs_dit.ipynb": NB3,
    "04_wider_nearer_more_continuous.ipynb": NB4,
    "05_nearer_state_kv_cache.ipynb": NB5,
    "06_value_parallel_rag.ipynb": NB6,
}


def build(out: Path = HERE) -> list[Path]:
    """Write every notebook (no outputs; CI executes them from a clean kernel)."""
    paths = []
    for name, cells in NOTEBOOKS.items():
        nb = new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                "language": "python"}})
        path = out / name
        nbformat.write(nb, path)
        paths.append(path)
    return paths


if __name__ == "__main__":
    for p in build():
        print(f"wrote {p}")
