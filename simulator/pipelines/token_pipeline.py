"""One long sequence through P pipeline stages in K token slices (TeraPipe-style), as SimPy.

On a causal LLM slice i attends to every earlier token, so its cost grows with its
position and uniform slices leave bubbles; ``balanced`` slicing picks slice lengths that
minimise TeraPipe's latency model Σ t_i + (P−1)·max t_i by its dynamic programme. On a DiT (bidirectional, stale K/V) every
slice attends to all tokens, so equal slices already cost the same.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import simpy

from ..config.dit_models import Kernels, TokenPipelineScenario, layer_split
from ..hardware.gpu import GPU
from ..hardware.topology import Topology
from ..observe.perfetto import trace_events
from ..observe.result import Result, with_units
from ..observe.spans import SpanRecorder
from ..workloads import dit as W
from ..workloads.llm import LLMCostModel, LLMShape
from .dit_cost import DiTCost
from .health import assess


class DiTSliceCost:
    """Per-stage time of a DiT slice: stale K/V, so every slice attends to the full sequence."""

    causal = False

    def __init__(self, sc: TokenPipelineScenario, gpu: GPU):
        self.arch = sc.arch
        self.hidden = self.arch.hidden
        self.tokens, self.dtype = sc.sequence_tokens, sc.dtype
        # the DiT path's kernel figures (config.dit_models.Kernels defaults: a token pipeline
        # scenario has no kernels section); CUDA graphs, so no eager dispatch bound
        self.dit = DiTCost.from_kernels(gpu, self.arch.head_dim, Kernels(), eager=False)
        self.stages = layer_split(self.arch.num_layers, sc.parallel.pp)
        self._cache: dict = {}

    def __call__(self, p: int, n: int, stage: int = 1) -> float:
        key = (n, stage)  # the slice's position does not matter
        v = self._cache.get(key)
        if v is None:
            l0, l1 = self.stages[stage]
            v = self._cache[key] = self.dit.time(W.stage_ops(self.arch, l0, l1, n, self.tokens, 1,
                                                             self.dtype))
        return v


class CausalSliceCost:
    """Per-stage time of an LLM slice: its ``n`` new tokens attend to ``p`` cached ones and themselves."""

    causal = True

    def __init__(self, sc: TokenPipelineScenario, gpu: GPU):
        self.hidden = sc.arch.hidden
        self.llm = LLMCostModel(LLMShape.from_spec(sc.arch), gpu, sc.dtype, 1, sc.parallel.pp)
        self._cache: dict = {}

    def __call__(self, p: int, n: int, stage: int = 1) -> float:
        key = (p, n)  # every stage holds the same layers' share
        v = self._cache.get(key)
        if v is None:
            m = self.llm
            v = self._cache[key] = (m.linear_time(n)
                                    + m.attention_time(0, 0, n * (p + (n + 1) / 2), p + n, n))
        return v


def slice_cost(sc: TokenPipelineScenario):
    """The slice-cost model of the scenario's model: DiT (bidirectional) or causal LLM."""
    gpu = GPU.from_spec(sc.hardware.gpu)
    return DiTSliceCost(sc, gpu) if sc.is_dit else CausalSliceCost(sc, gpu)


def uniform_slices(total: int, k: int) -> list[int]:
    base, extra = divmod(total, k)
    return [base + (1 if i < extra else 0) for i in range(k)]


def balanced_slices(total: int, k: int, cost, stages: int = 1, max_units: int = 128) -> list[int]:
    """TeraPipe's dynamic programme: K slice lengths minimising sum(t_i) + (P - 1) * max(t_i).

    The sequence is cut on a grid of at most ``max_units`` cells. For each candidate bound
    on the largest slice cost, a DP finds the K-slice split with the least total cost whose
    slices all stay within the bound; the best bound wins.
    """
    uni = uniform_slices(total, k)
    if cost(0, uni[0]) == cost(total - uni[-1], uni[-1]):  # position-independent: uniform is optimal
        return uni
    units = min(max_units, total)
    edges = np.rint(np.linspace(0, total, units + 1)).astype(int)
    # c[i, j]: cost of one slice covering grid cells [i, j).
    c = np.full((units + 1, units + 1), np.inf)
    for i in range(units):
        for j in range(i + 1, units + 1):
            c[i, j] = cost(int(edges[i]), int(edges[j] - edges[i]))
    best_latency, best_cut = np.inf, None
    for bound in np.unique(c[np.isfinite(c)]):
        allowed = np.where(c <= bound, c, np.inf)
        f = allowed[0].copy()                      # f[j]: least total cost of cells [0, j) in one slice
        back = [np.zeros(units + 1, dtype=int)]
        for _ in range(1, k):
            cand = f[:, None] + allowed             # split [0, i) then slice [i, j)
            back.append(np.argmin(cand, axis=0))
            f = cand[back[-1], np.arange(units + 1)]
        if not np.isfinite(f[units]):
            continue
        latency = f[units] + (stages - 1) * bound
        if latency < best_latency:
            best_latency, cut, j = latency, [], units
            for level in range(k - 1, 0, -1):
                i = int(back[level][j])
                cut.append(j - i)
                j = i
            cut.append(j)
            best_cut = cut[::-1]
    if best_cut is None:
        return uni
    lens, pos = [], 0
    for cells in best_cut:
        lens.append(int(edges[pos + cells] - edges[pos]))
        pos += cells
    return lens


class _Pipeline:
    """The SimPy side: one process per stage, each slice handed to the next stage over the topology."""

    def __init__(self, sc: TokenPipelineScenario, cost, starts: np.ndarray, lens: np.ndarray):
        self.P, self.K = sc.parallel.pp, sc.slices
        self.cost, self.starts, self.lens = cost, starts, lens
        self.env = simpy.Environment()
        self.rec = SpanRecorder(enabled=sc.record_spans)
        self.topo = Topology.from_hardware(self.env, sc.hardware, self.P, self.rec)
        self.ready = {(j, i): self.env.event() for j in range(self.P) for i in range(self.K)}
        self.busy = np.zeros(self.P)
        self.slice_times = np.zeros((self.P, self.K))
        self.finished = 0  # slices the last stage has completed
        self.act_bytes = W.act_bytes(sc.dtype)

    def stage(self, j: int):
        env, i_start, lens = self.env, self.starts, self.lens
        for i in range(self.K):
            if j > 0:
                yield self.ready[(j, i)]
            t = self.cost(int(i_start[i]), int(lens[i]), j)
            start = env.now
            yield env.timeout(t)
            self.busy[j] += t
            self.slice_times[j, i] = t
            self.rec.add(f"gpu{j}", f"slice {i} [{i_start[i]}:{i_start[i] + lens[i]})", start, env.now, "compute")
            if j + 1 == self.P:
                self.finished += 1
            else:
                ev = self.ready[(j + 1, i)]
                tr = self.topo.send(j, j + 1, lens[i] * self.cost.hidden * self.act_bytes, f"slice {i}")
                tr.callbacks.append(lambda _e, ev=ev: ev.succeed())

    def run(self) -> float:
        for j in range(self.P):
            self.env.process(self.stage(j))
        self.env.run()
        return self.env.now


def _summary(sc: TokenPipelineScenario, pipe: _Pipeline, latency: float) -> dict:
    P, K = pipe.P, pipe.K
    bubble = 1.0 - pipe.busy.sum() / (P * latency) if latency > 0 else 0.0
    # causal slices differ by position, measured on stage 0; DiT slices by stage only
    st = pipe.slice_times[0] if pipe.cost.causal else pipe.slice_times.mean(axis=0)
    summary = {
        "kind": "token_pipeline", "scenario": sc.name, "status": "ok",
        "model": sc.model.get("name", "?"), "causal": not sc.is_dit,
        "sequence_tokens": sc.sequence_tokens, "stages": P, "slices": K, "slicing": sc.slicing,
        "latency_s": {"p50": latency, "p90": latency, "p99": latency, "mean": latency},
        "bubble_fraction": float(bubble),
        "slice_tokens": [int(x) for x in pipe.lens],
        "slice_time_s": [float(x) for x in st],
        "slice_cost_spread": float(st.max() / st.min()) if st.min() > 0 else None,
        "utilization": {"gpu": {f"gpu{j}": float(pipe.busy[j] / latency) for j in range(P)}},
    }
    # one sequence: it completes when the last stage has run every slice
    assess(summary, 1, int(pipe.finished == K and np.isfinite(latency)), False, None, unit="sequence")
    return summary


def simulate(sc: TokenPipelineScenario) -> Result:
    """Push the sequence through the pipeline; report latency, bubble fraction, utilization."""
    P, K, S = sc.parallel.pp, sc.slices, sc.sequence_tokens
    cost = slice_cost(sc)
    lens = (uniform_slices(S, K) if sc.slicing == "uniform"
            else balanced_slices(S, K, lambda p, n: cost(p, n), P))
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(int)
    pipe = _Pipeline(sc, cost, starts, np.asarray(lens))
    latency = pipe.run()
    spans = pipe.rec.frame()
    req = pd.DataFrame({"slice": range(K), "start_token": starts, "tokens": lens,
                        "stage0_time": pipe.slice_times[0]})
    bd = pd.DataFrame({"stage": range(P), "busy": pipe.busy, "latency": latency,
                       "bubble": latency - pipe.busy})
    return Result("token_pipeline", sc, _summary(sc, pipe, latency), with_units(req, ("stage0_time",), "slice"),
                  with_units(bd, ("busy", "latency", "bubble"), "stage"), spans,
                  trace_events(spans) if sc.record_spans else [])
