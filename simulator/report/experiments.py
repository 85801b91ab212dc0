"""The experiments behind the notebooks and the report: small, deterministic sweeps returning tidy frames.

Each function answers one of the project's questions with ``simulator.sweep`` and adds the label
columns its figure needs (``setup``, ``strategy``, ``link``...). Sizes are parameters, so the
notebooks, the report and the tests run the same experiment at different scales.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from ..config import catalog
from ..observe.records import LLM_LAST_MILE
from ..project import scenarios_dir
from ..sweep import sweep
from ..units import parse



def __getattr__(name: str):
    """``SCENARIOS``: the project's scenarios/ folder, found when first used (``simulator.project``)."""
    if name == "SCENARIOS":
        return scenarios_dir()
    raise AttributeError(name)

#: The last-mile remedies of question 1: a label and the serving overrides that apply it.
REMEDIES: Mapping[str, Mapping] = {
    "baseline (engine detok, sync)": {},
    "separate detokenizer": {"serving.detokenizer": "separate"},
    "API-server detok x1": {"serving.detokenizer": "api_server", "serving.api_servers": 1},
    "API-server detok x4": {"serving.detokenizer": "api_server", "serving.api_servers": 4},
    "async overlap": {"serving.overlap": "async"},
    "stream every 4 tokens": {"serving.stream_interval": 4},
}

#: Detokenizer placements, for the last-mile-vs-concurrency figure.
PLACEMENTS: Mapping[str, Mapping] = {
    "engine": {"serving.detokenizer": "engine"},
    "separate": {"serving.detokenizer": "separate"},
    "api_server": {"serving.detokenizer": "api_server"},
}

#: Closed-loop chat-like load on the default scenario (Llama-3-8B on one H100), sized for speed.
CLOSED_LOOP: Mapping = {"serving.engine": "reference", "workload.arrival": "closed", "workload.prompt_tokens": 512,
                        "workload.output_tokens": 128, "serving.max_batch": 1024, "serving.overlap": "sync",
                        "serving.detokenizer": "engine", "record_spans": False}

#: Engine profiles of the report, in release order (``serving.engine``; catalog engines.yaml); vLLM V1
#: twice: with the catalog's sourced costs and with the host costs measured from its own code here.
ENGINES = ("vllm-0.5", "vllm-0.6", "vllm-v1", "vllm-v1-measured", "sglang", "trtllm")

#: What each remedy changes on an engine profile, for the per-engine remedies figure.
ENGINE_REMEDIES: Mapping[str, Mapping] = {
    "as shipped": {},
    "async scheduling": {"serving.overlap": "async"},
    "4 API servers": {"serving.api_servers": 4, "serving.api_server_process": "own"},
    "stream every 8 tokens": {"serving.stream_interval": 8},
    "separate detokenizer": {"serving.detokenizer": "separate"},
}


def engine_setup(name: str) -> dict:
    """Overrides that run engine profile ``name`` with its own serving defaults, which the closed-loop
    base's serving keys (``CLOSED_LOOP``) would otherwise hide."""
    entry = catalog.entry("engines", name) or {}
    return {"serving.engine": name, **{f"serving.{k}": v for k, v in (entry.get("serving") or {}).items()}}


def engine_remedies(engines: Sequence[str] = ENGINES, remedies: Mapping[str, Mapping] = ENGINE_REMEDIES) -> dict:
    """``{"<engine> · <remedy>": overrides}`` for every engine and every remedy that changes it."""
    out = {}
    for name in engines:
        base = engine_setup(name)
        for label, over in remedies.items():
            if over and all(base.get(k) == v for k, v in over.items()):
                continue  # the profile has it already
            out[f"{name} · {label}"] = {**base, **over}
    return out


#: GPU counts of the scale-out question ("8P -> 16P -> 32P", and a whole 72-GPU rack).
SCALE_GPUS = (8, 16, 32, 72)

#: Fabrics of the scale-out question, all with B200s: 8-GPU NVLink nodes joined by InfiniBand, one
#: 72-GPU NVLink domain, and each with its slower link doubled (what a faster NIC or NVLink buys).
SCALE_FABRICS: Mapping[str, Mapping] = {
    "NVL8 + IB (dgx-b200)": {"hardware.node": "dgx-b200"},
    "NVL8 + 2x IB": {"hardware.node": {"base": "dgx-b200", "nic": {"base": "ib-400g", "bandwidth": "100 GB/s",
                                                                   "nccl_bandwidth": "100 GB/s"}}},
    "NVL72 (gb200-nvl72)": {"hardware.node": "gb200-nvl72"},
    "NVL72, 2x NVLink": {"hardware.node": {"base": "gb200-nvl72",
                                           "nvlink": {"base": "nvlink5", "bandwidth": "1800 GB/s",
                                                      "nccl_bandwidth": "1443.6 GB/s"}}},
}

#: Llama-3-70B in BF16 spread over the GPUs as 8-way tensor parallel stages (pipeline parallel
#: across the rest), closed loop, chat-sized requests, vLLM V1's host path.
SCALE_LLM: Mapping = {"model": "llama-3-70b", "hardware.gpu": "b200", "serving.engine": "vllm-v1", "parallel.tp": 8,
                      "record_spans": False,
                      "workload.arrival": "closed", "workload.concurrency": 32, "workload.requests": 64,
                      "workload.prompt_tokens": 512, "workload.output_tokens": 128}


def llm_scale_out(gpus: Sequence[int] = SCALE_GPUS, fabrics: Mapping[str, Mapping] = SCALE_FABRICS,
                  base: Mapping = SCALE_LLM, scenario=None, workers: int | None = None) -> pd.DataFrame:
    """Llama-3-70B on ``gpus`` GPUs (TP 8 x PP gpus/8) of each fabric (``fabric``, ``gpus`` columns)."""
    points = [({"fabric": name, "gpus": int(g)}, {**base, **over, "parallel.pp": int(g) // 8})
              for name, over in fabrics.items() for g in gpus]
    return run_labelled(scenario, points, workers)


#: FLUX.1-dev at 1536x1536 (9,216 image tokens, which 8, 16, 32 and 72 GPUs split evenly) with ring
#: attention over every GPU: the sequence-parallel layout that scales furthest.
SCALE_DIT: Mapping = {"hardware.gpu": "b200", "resolution": 1536, "workload.requests": 1, "record_spans": False,
                      "delivery.format": "jpeg"}


def dit_scale_out(gpus: Sequence[int] = SCALE_GPUS, fabrics: Mapping[str, Mapping] = SCALE_FABRICS,
                  base: Mapping = SCALE_DIT, steps: int = 28, workers: int | None = None) -> pd.DataFrame:
    """FLUX.1-dev with ring attention over ``gpus`` GPUs of each fabric (``fabric``, ``gpus`` columns)."""
    scenario = scenarios_dir() / "dit" / "flux-1024-h100-single.yaml"
    points = [({"fabric": name, "gpus": int(g)}, {**base, **over, "steps": steps, "parallel.ring": int(g)})
              for name, over in fabrics.items() for g in gpus]
    return run_labelled(scenario, points, workers)


#: Issue 15's what-if: the Mooncake conversation trace (Kimi's chat traffic, 512-token prefix
#: blocks) on four H100s running Llama-3.1-8B under vLLM V1's host path, co-located or
#: disaggregated at equal GPU count, with and without prefix caching and cache-aware routing.
KV_SCENARIO = "llm/mooncake_conversation.yaml"
KV_LAYOUTS: Mapping[str, Mapping] = {
    "4 co-located": {"parallel.replicas": 4, "serving.router": "least_outstanding"},
    "4 co-located + prefix cache": {"parallel.replicas": 4, "serving.router": "least_outstanding",
                                    "serving.prefix_caching": True},
    "4 co-located + prefix cache + affinity": {"parallel.replicas": 4, "serving.router": "prefix_affinity",
                                               "serving.prefix_caching": True},
    "2P2D": {"disaggregation": {"prefill": {"replicas": 2}, "decode": {"replicas": 2}},
             "serving.router": "least_outstanding"},
    "2P2D + prefix cache + affinity": {"disaggregation": {"prefill": {"replicas": 2}, "decode": {"replicas": 2}},
                                       "serving.router": "prefix_affinity", "serving.prefix_caching": True},
}


def kv_layouts(requests: int = 1000, time_scale: float = 1.0, layouts: Mapping[str, Mapping] = KV_LAYOUTS,
               workers: int | None = None) -> pd.DataFrame:
    """The first ``requests`` of the Mooncake conversation trace (arrival times x ``time_scale``) under
    each layout of ``layouts`` (``layout`` column)."""
    base = {"workload.requests": int(requests), "workload.trace_time_scale": float(time_scale), "record_spans": False}
    points = [({"layout": name}, {**base, **over}) for name, over in layouts.items()]
    return run_labelled(scenarios_dir() / KV_SCENARIO, points, workers)


CPU_COSTS = ("detokenize_per_token", "output_per_request", "stream_per_chunk", "schedule_per_request",
             "schedule_per_step", "tokenize_per_token", "request_overhead")

#: DiT strategies swept over GPU counts (each is one ``parallel.<name>`` degree).
DIT_STRATEGIES = ("pipefusion", "ulysses", "ring", "tensor", "distrifusion")
#: Interconnect label -> the A100 variant that has it (SXM: NVLink; PCIe: peer traffic over PCIe).
DIT_LINKS: Mapping[str, str] = {"NVLink (A100 SXM)": "a100-sxm-80g", "PCIe (A100 PCIe)": "a100-pcie-80g"}


def cpu_slowdown(factor: float, costs: Sequence[str] = CPU_COSTS, profile: str = "reference") -> dict:
    """Overrides multiplying a CPU profile's per-request costs by ``factor`` (a slower host or tokenizer)."""
    base = catalog.entry("cpus", profile)
    out = {"hardware.cpu.base": profile}
    for c in costs:
        out[f"hardware.cpu.{c}"] = f"{parse(base[c], 'time') * factor * 1e6:.6g} us"
    return out


def requests_for(concurrency: int, per_client: int = 2, minimum: int = 24) -> int:
    """Closed-loop request count: a couple of requests per client, never too few for percentiles."""
    return max(per_client * int(concurrency), minimum)


def run_labelled(scenario, points: Sequence[tuple[Mapping, Mapping]], workers: int | None = None,
                 progress: bool | None = False, last_mile_cost: bool = False) -> pd.DataFrame:
    """Run ``(labels, overrides)`` points as one parallel sweep; the labels become the leading columns
    (``last_mile_cost``: each LLM point's counterfactual with the last mile free too)."""
    df = sweep(scenario, [over for _, over in points], workers=workers, progress=progress,
               last_mile_cost=last_mile_cost)
    labels = pd.DataFrame([dict(lab) for lab, _ in points])
    return pd.concat([labels, df.drop(columns=[c for c in labels.columns if c in df.columns])], axis=1)


def llm_concurrency(concurrency: Sequence[int], setups: Mapping[str, Mapping], scenario=None,
                    base: Mapping | None = None, per_client: int = 2, workers: int | None = None,
                    progress: bool | None = False, last_mile_cost: bool = False) -> pd.DataFrame:
    """Closed-loop sweep of concurrency under each named setup (``setup``, ``concurrency`` columns);
    ``last_mile_cost`` adds each point's counterfactual with the last mile free."""
    points = []
    for label, extra in setups.items():
        for c in concurrency:
            over = {**CLOSED_LOOP, **(base or {}), **extra, "workload.concurrency": int(c),
                    "workload.requests": requests_for(c, per_client)}
            points.append(({"setup": label, "concurrency": int(c)}, over))
    return run_labelled(scenario, points, workers, progress, last_mile_cost)


def crossover(rows: pd.DataFrame, threshold: float = 0.2, y: str = "itl_last_mile_share",
              x: str = "concurrency", by: str = "setup") -> dict:
    """Per group, the smallest swept ``x`` at which ``y`` reaches ``threshold`` (None if it never does)."""
    out = {}
    for name, g in rows[rows["status"] == "ok"].groupby(by, sort=False):
        hit = g[g[y] >= threshold].sort_values(x)
        out[name] = None if hit.empty else int(hit[x].iloc[0])
    return out


def dit_strategies(scenario: str | Path | None = None,
                   gpu_counts: Sequence[int] = (1, 2, 4, 8), strategies: Sequence[str] = DIT_STRATEGIES,
                   links: Mapping[str, str] = DIT_LINKS, base: Mapping | None = None,
                   workers: int | None = None, progress: bool | None = False) -> pd.DataFrame:
    """Latency, breakdown and memory of each DiT strategy at each GPU count on each interconnect
    (``scenario``: PixArt-alpha 1024x1024 on one A100 unless given)."""
    scenario = scenario or scenarios_dir() / "dit" / "pixart-1024-a100-nvlink-single.yaml"
    points = []
    for link, gpu in links.items():
        for strategy in strategies:
            for n in gpu_counts:
                over = {**(base or {}), "hardware.gpu": gpu, "workload.requests": 1}
                if n > 1:
                    over[f"parallel.{strategy}"] = int(n)
                points.append(({"link": link, "strategy": strategy, "gpus": int(n)}, over))
    return run_labelled(scenario, points, workers, progress)


def best_strategy(rows: pd.DataFrame, y: str = "latency_s.p50") -> pd.DataFrame:
    """For each interconnect and GPU count above one, the fastest feasible strategy and its speed-up."""
    ok = rows[rows["status"] == "ok"]
    single = ok[ok["gpus"] == 1].groupby("link")[y].min()
    best = ok[ok["gpus"] > 1].sort_values(y).groupby(["link", "gpus"], sort=False).head(1)
    best = best.assign(speedup=best[y].to_numpy() / 1.0)
    best["speedup"] = [single[link] / v for link, v in zip(best["link"], best[y])]
    return best[["link", "gpus", "strategy", y, "speedup", "breakdown_share.comm",
                 "breakdown_share.bubble", "memory_per_gpu_gib"]].sort_values(["link", "gpus"]).reset_index(drop=True)


def token_pipeline(slices: Sequence[int] = (1, 2, 4, 8, 16, 32), slicings: Sequence[str] = ("uniform", "balanced"),
                   workloads: Mapping[str, str] | None = None, base: Mapping | None = None,
                   workers: int | None = None, progress: bool | None = False) -> pd.DataFrame:
    """Bubble fraction and latency of the token-level pipeline vs slice count, causal LLM vs DiT."""
    dit = scenarios_dir() / "dit"
    workloads = workloads or {"causal LLM (llama-3-8b)": str(dit / "token-pipeline-causal.yaml"),
                              "DiT (pixart-alpha)": str(dit / "token-pipeline-dit.yaml")}
    frames = []
    for label, path in workloads.items():
        df = sweep(path, {"slicing": list(slicings), "slices": list(slices)}, overrides=base, workers=workers,
                   progress=progress)
        frames.append(df.assign(workload=label))
    out = pd.concat(frames, ignore_index=True)
    return out[["workload", *[c for c in out.columns if c != "workload"]]]


def jitter_table(rows: pd.DataFrame) -> pd.DataFrame:
    """ITL smoothness per row: p50, p99, their ratio and the count of gaps over twice the median."""
    cols = {"itl_ms.p50": "ITL p50 (ms)", "itl_ms.p99": "ITL p99 (ms)", "itl_stalls.p99_over_p50": "p99/p50",
            "itl_stalls.gaps_over_2x_median": "gaps > 2x median", "itl_last_mile_share": "last-mile share of ITL"}
    keep = [c for c in ("setup", "concurrency", "link") if c in rows]
    return rows[keep + list(cols)].rename(columns=cols)


def interp_crossing(x: Sequence[float], y: Sequence[float], level: float) -> float | None:
    """The x (log-interpolated) where y first reaches ``level``; None if it never does."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    for i in range(len(x)):
        if y[i] >= level:
            if i == 0:
                return float(x[0])
            f = (level - y[i - 1]) / (y[i] - y[i - 1])
            return float(np.exp(np.log(x[i - 1]) + f * (np.log(x[i]) - np.log(x[i - 1]))))
    return None


# ---- issue 16: value-parallel transformations of a RAG pipeline -----------------------------

#: The RAG example of ``kind: pipeline`` (embed -> vector search -> re-rank -> generate on
#: Llama-3-8B / vLLM V1 / one H100).
RAG_SCENARIO = "pipeline/rag.yaml"

#: A keyword (BM25) retriever next to the vector search, as hybrid RAG runs them: Elasticsearch
#: 8.14 BM25 over MS MARCO passages (8.8M), one search thread on one Xeon core, 11.88 queries/s
#: (github.com/xhluca/bm25-benchmarks README, "Queries per second", ES column, commit
#: 03a22d427ca0b9a7d6de1bc8e7bbc752ffec3520): 1 / 11.88 = 84.2 ms a query, as a constant (only the
#: mean throughput is published), on a 4-core search box (one query per core). Its 50 candidates
#: are the re-ranker's input (the example's re-ranker scores the top 50).
KEYWORD_SEARCH: Mapping = {
    "resources.keyword": {"kind": "cpu", "cores": 4},
    "stages.keyword": {"resource": "keyword", "after": ["search"], "time": "84.2 ms", "outputs": 50},
    "stages.rerank.after": ["keyword"],
    "stages.generate.early_start": False,
}

#: What-if result-cache hit rate of the retrieval stages (no published hit rate for a RAG
#: pipeline's query results was found; 30% is an assumption, labelled as such where it is shown).
RAG_CACHE_HIT_RATE = 0.3

_STREAM = {"stages.rerank.stream_from": {"stage": "keyword", "outputs": 10}}
_PARALLEL = {"stages.keyword.after": [], "stages.rerank.after": ["search", "keyword"]}
_EARLY = {"stages.generate.early_start": True}
_CACHE = {f"stages.{s}.cache_hit_rate": RAG_CACHE_HIT_RATE for s in ("embed", "search", "keyword", "rerank")}

#: The value-parallel transformations of issue 16, each alone on the serial hybrid chain
#: (``KEYWORD_SEARCH``: embed -> vector search -> keyword search -> re-rank -> generate), then all
#: together. Streaming: the re-ranker starts on the keyword search's first 10 of 50 candidates
#: (a what-if: the outputs come evenly over the search's time). Caching: each retrieval stage
#: (embed, vector search, keyword search, re-rank) hits its own result cache at
#: ``RAG_CACHE_HIT_RATE``, drawn independently per stage (a what-if).
RAG_TRANSFORMS: Mapping[str, Mapping] = {
    "baseline (serial)": {},
    "parallel retrievers": _PARALLEL,
    "early start": _EARLY,
    "streaming re-rank": _STREAM,
    "cached retrieval (30% what-if)": _CACHE,
    "all together": {**_PARALLEL, **_STREAM, **_EARLY, **_CACHE},
}

#: Closed-loop requests per user at each concurrency: enough for a steady state after every
#: user's first request, few enough for the notebook's 90 s a cell.
RAG_REQUESTS_PER_USER: Mapping[int, int] = {10: 20, 100: 5, 1000: 2}


def rag_run_row(result, users: int) -> dict:
    """One RAG run's figures: TTFT and E2E of all requests and of the steady state (the requests a
    user sends after its first: the first wave of a closed loop arrives all at once), the part of
    the steady-state TTFT spent before the LLM call (retrieval on the critical path) and in it
    (its queue and prefill), and the generate call's last mile (``LLM_LAST_MILE``, over the
    whole call) in ms and as a share of E2E, and the prompt tokens the engine's prefix cache saved."""
    q = result.requests
    done = q["e2e_s"].notna()
    steady = done & (q.index >= users)
    bd = result.breakdown
    pre = (bd["e2e_s"] - bd["generate"]).reindex(q.index)  # seconds before the call on the critical path
    last_mile = q[[f"generate.{c}_s" for c in LLM_LAST_MILE]].sum(axis=1, min_count=1)
    s = q[steady]
    ms = 1e3
    return {
        "requests": int(len(q)), "completed": int(done.sum()), "steady_requests": int(steady.sum()),
        "ttft_ms.mean": result.summary["ttft_ms"]["mean"], "ttft_ms.p50": result.summary["ttft_ms"]["p50"],
        "steady_ttft_ms.mean": float(s["ttft_s"].mean() * ms), "steady_ttft_ms.p50": float(s["ttft_s"].median() * ms),
        "steady_ttft_ms.p90": float(s["ttft_s"].quantile(0.9) * ms),
        "steady_e2e_ms.mean": float(s["e2e_s"].mean() * ms),
        "steady_pre_llm_ms": float(pre[steady].mean() * ms),
        "steady_llm_queue_ms": float(s["generate.queue_s"].mean() * ms),
        "steady_llm_prefill_ms": float(s["generate.prefill_s"].mean() * ms),
        "steady_last_mile_ms": float(last_mile[steady].mean() * ms),
        "steady_last_mile_share_e2e": float(last_mile[steady].sum() / s["e2e_s"].sum()),
        "duration_s": result.summary["duration_s"],
        # prompt tokens the generate calls found in the prefix cache (early start's warm-ups)
        "prefix_saved_tokens": (result.summary.get("llm") or {}).get("llm", {}).get("prefix_saved_tokens"),
    }


def rag_transformations(users: Sequence[int] = (10, 100, 1000), transforms: Mapping[str, Mapping] = RAG_TRANSFORMS,
                        per_user: Mapping[int, int] | int = RAG_REQUESTS_PER_USER, base: Mapping | None = None,
                        scenario=None) -> pd.DataFrame:
    """The RAG example with a keyword retriever (``KEYWORD_SEARCH``) under each transformation of
    ``transforms`` (``transform`` column), closed loop at each count of ``users`` (``users``
    column), ``per_user`` requests per user; one row of :func:`rag_run_row` per point.

    Runs one after another in this process (each needs its request table, not only its summary)."""
    import copy

    from ..api import run

    scenario = scenario or scenarios_dir() / RAG_SCENARIO
    rows = []
    for u in users:
        n = per_user if isinstance(per_user, int) else per_user[u]
        for label, over in transforms.items():
            # a deep copy: the loader sets dotted keys inside the mappings it is given
            o = copy.deepcopy({**KEYWORD_SEARCH, **(base or {}), **over, "record_spans": False,
                               "workload": {"arrival": "closed", "concurrency": int(u),
                                            "requests": int(n) * int(u)}})
            rows.append({"users": int(u), "transform": label, **rag_run_row(run(scenario, o), int(u))})
    return pd.DataFrame(rows)
