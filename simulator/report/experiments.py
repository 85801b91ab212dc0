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

#: Engine profiles of the report, in release order (``serving.engine``; catalog engines.yaml).
ENGINES = ("vllm-0.5", "vllm-0.6", "vllm-v1", "sglang", "trtllm")

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
                 progress: bool | None = False) -> pd.DataFrame:
    """Run ``(labels, overrides)`` points as one parallel sweep; the labels become the leading columns."""
    df = sweep(scenario, [over for _, over in points], workers=workers, progress=progress)
    labels = pd.DataFrame([dict(lab) for lab, _ in points])
    return pd.concat([labels, df.drop(columns=[c for c in labels.columns if c in df.columns])], axis=1)


def llm_concurrency(concurrency: Sequence[int], setups: Mapping[str, Mapping], scenario=None,
                    base: Mapping | None = None, per_client: int = 2, workers: int | None = None,
                    progress: bool | None = False) -> pd.DataFrame:
    """Closed-loop sweep of concurrency under each named setup (``setup``, ``concurrency`` columns)."""
    points = []
    for label, extra in setups.items():
        for c in concurrency:
            over = {**CLOSED_LOOP, **(base or {}), **extra, "workload.concurrency": int(c),
                    "workload.requests": requests_for(c, per_client)}
            points.append(({"setup": label, "concurrency": int(c)}, over))
    return run_labelled(scenario, points, workers, progress)


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
