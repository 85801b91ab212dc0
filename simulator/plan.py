"""``lastmile plan``: the cheapest deployment that serves a workload within an SLO (issue 27).

A search space of candidates (GPU or node type x TP x replicas or disaggregated prefill:decode splits
x engine profile x API servers x batch limit, under a fixed or bounded GPU count) is pruned before
anything is simulated: a candidate whose weights and KV cache do
not fit, or whose roofline bound on the request rate (:func:`rate_bound`) is below what the search
asks, is dropped with its reason. Each remaining candidate's highest request rate that meets the SLO
is found by bisection, as Vidur-Search finds a configuration's capacity (Agrawal et al., "Vidur",
MLSys 2024: a binary search on QPS under a P99 scheduling-delay SLO): every probe is a
deterministic simulation of the same requests at another Poisson rate, so the search gives the same
answer on one core, many, or a Dask cluster. Candidates are ranked by dollars per million output
tokens at their highest rate.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

from .errors import ConfigError

BISECT_REL_TOL = 0.04
"""The bisection stops once the interval is within 4% of its upper end: a candidate's capacity is
known to 4%, at most 6 halvings after the bound."""

BISECT_MAX_PROBES = 10
"""Probes per candidate at most (the first at the roofline bound, then halvings)."""

SLO_KEYS = ("ttft_p99", "tpot_p99", "e2e_p99")
"""The latency objectives a plan takes (``--slo KEY=VALUE``): p99 of TTFT, TPOT and E2E."""


@dataclass(frozen=True)
class SLO:
    """What a probe must meet: p99 latencies (seconds, None: unbounded) and, optionally, the share of
    requests that each meet the TTFT and TPOT objectives (``goodput``, DistServe's SLO attainment)."""

    ttft_p99: float | None = None
    tpot_p99: float | None = None
    e2e_p99: float | None = None
    goodput: float | None = None

    def misses(self, summary: Mapping) -> str | None:
        """Why a probe's summary misses the SLO (None: it meets it)."""
        if summary.get("status") != "ok":
            return f"status {summary.get('status')}"
        if summary.get("requests_completed", 0) < summary.get("requests_total", 0):
            return "not every request completed"
        if any("exceeds capacity" in w for w in summary.get("warnings") or ()):
            return "offered load exceeds capacity"
        for key, metric in (("ttft_p99", "ttft_ms"), ("tpot_p99", "tpot_ms"), ("e2e_p99", "e2e_ms")):
            bound = getattr(self, key)
            got = (summary.get(metric) or {}).get("p99")
            if bound is not None and (got is None or got > bound * 1e3):
                return f"{key} {got:.4g} ms > {bound * 1e3:.4g} ms" if got is not None else f"no {key}"
        if self.goodput is not None:
            got = summary["goodput"]["slo_attainment"]
            if got < self.goodput:
                return f"goodput {got:.3f} < {self.goodput}"
        return None

    def scenario_slo(self) -> dict:
        """The scenario's ``slo`` block that makes its goodput count against these objectives."""
        pairs = (("ttft", self.ttft_p99), ("tpot", self.tpot_p99), ("e2el", self.e2e_p99))
        return {key: value for key, value in pairs if value is not None}


@dataclass(frozen=True)
class Candidate:
    """One deployment: a GPU type (or a node type, which names its GPU), TP degree, replicas, engine,
    and optionally its API-server processes and batch limit (None: the scenario's)."""

    gpu: str
    tp: int
    replicas: int
    engine: str
    node: str | None = None
    api_servers: int | None = None
    max_batch: int | None = None
    prefill: int | None = None  # disaggregated: prefill replicas (and ``decode`` replicas), each of ``tp`` GPUs
    decode: int | None = None

    @property
    def gpus(self) -> int:
        return self.tp * (self.prefill + self.decode if self.prefill else self.replicas)

    @property
    def label(self) -> str:
        where = self.node or self.gpu
        extra = (f" api{self.api_servers}" if self.api_servers else "") + (f" b{self.max_batch}" if self.max_batch else "")
        layout = f"{self.prefill}P:{self.decode}D" if self.prefill else f"x{self.replicas}"
        return f"{self.gpus}x {where} tp{self.tp} {layout} {self.engine}{extra}"

    def overrides(self) -> dict:
        """The scenario keys this candidate sets."""
        out = {"hardware.gpu": self.gpu, "parallel.tp": self.tp, "parallel.pp": 1, "parallel.replicas": self.replicas,
               "serving.engine": self.engine}
        if self.prefill:
            out["parallel.replicas"] = 1
            out["disaggregation"] = {"prefill": {"replicas": self.prefill, "tp": self.tp},
                                     "decode": {"replicas": self.decode, "tp": self.tp}}
        if self.node is not None:
            out["hardware.node"] = self.node
        if self.api_servers is not None:
            out["serving.api_servers"] = self.api_servers
        if self.max_batch is not None:
            out["serving.max_batch"] = self.max_batch
        return out


def candidates(gpus: Sequence[tuple[str, str | None]], tps: Iterable[int], replicas: Iterable[int],
               engines: Iterable[str], gpu_count: int | None = None, max_gpus: int | None = None,
               api_servers: Sequence[int | None] = (None,), max_batch: Sequence[int | None] = (None,),
               splits: Sequence[tuple[int, int]] = ()) -> list[Candidate]:
    """The search space: (GPU, node) pairs x TP x (replicas, and disaggregated prefill:decode splits)
    x engines x API servers x batch limits, holding the GPU count at ``gpu_count`` (TP x replicas = N,
    the sweep a plain cross product cannot hold fixed) or at most ``max_gpus`` (a layout the node
    cannot take is pruned when it loads)."""
    out = []
    tps, engines = list(tps), list(engines)
    layouts = [(r, None, None) for r in replicas] + [(1, p, d) for p, d in splits]
    for gpu, node in gpus:
        for tp in tps:
            for r, p, d in layouts:
                n = tp * (p + d if p else r)
                if (gpu_count is not None and n != gpu_count) or (max_gpus is not None and n > max_gpus):
                    continue
                out.extend(Candidate(gpu, tp, r, e, node, a, b, p, d)
                           for e in engines for a in api_servers for b in max_batch)
    if not out:
        raise ConfigError("the search space is empty: no TP x replicas combination gives the GPU count asked for",
                          file="lastmile plan")
    return out


def bisect_rate(meets: Callable[[float], bool], hi: float, rel_tol: float = BISECT_REL_TOL,
                max_probes: int = BISECT_MAX_PROBES) -> tuple[float, list[tuple[float, bool]]]:
    """The highest rate in (0, ``hi``] at which ``meets(rate)`` holds, assuming it holds below any rate
    at which it holds (latency grows with load): ``hi`` first, then halvings of the interval until it
    is within ``rel_tol`` of its upper end. Returns the rate (0.0 when even the lowest probe misses)
    and every probe as (rate, met)."""
    if not hi > 0:
        raise ValueError("the upper bound of a rate search must be positive")
    probes = []
    ok = meets(hi)
    probes.append((hi, ok))
    if ok:
        return hi, probes
    lo = 0.0
    while len(probes) < max_probes and hi - lo > rel_tol * hi:
        mid = lo + (hi - lo) / 2 if lo > 0 else hi / 2
        ok = meets(mid)
        probes.append((mid, ok))
        if ok:
            lo = mid
        else:
            hi = mid
    return lo, probes


def rate_bound(cost, replicas: int, max_batch: int, prompt_mean: float, output_mean: float,
               context_mean: float, split: tuple[int, int] | None = None) -> float:
    """A roofline upper bound on the requests per second ``replicas`` replicas of one cost model can
    serve: each request needs its prompt prefilled and ``output_mean`` decode steps; a replica's
    decode steps at their largest batch run no faster than the cost model's decode step time (HBM
    reads of the weights and the KV cache), and its prefill no faster than the prompt's linear-layer
    time. Co-located, a replica does both, so the bound adds the two; disaggregated (``split``:
    prefill and decode replicas), each pool bounds the rate alone. No simulated rate beyond it can
    be met."""
    batch = max(1, max_batch)
    decode = cost.decode_time(context_mean * batch, batch) / batch * max(output_mean - 1.0, 0.0)
    prefill = cost.linear_time(max(1, int(round(prompt_mean)))) if prompt_mean >= 1 else 0.0
    if split is not None:
        return min(split[0] / prefill if prefill > 0 else math.inf, split[1] / decode if decode > 0 else math.inf)
    seconds = decode + prefill
    return math.inf if seconds <= 0 else replicas / seconds


@dataclass
class Outcome:
    """A candidate's search result: pruned (with why), or its highest rate and the summary there."""

    candidate: Candidate
    status: str  # "ok", "pruned: <why>", "misses: <why at the lowest probe>"
    rate: float = 0.0
    bound: float | None = None
    probes: list = field(default_factory=list)
    summary: dict | None = None

    def row(self) -> dict:
        """One row of the plan's table (every figure at the candidate's highest rate that met the SLO)."""
        c, s = self.candidate, self.summary or {}
        cost, energy = s.get("cost") or {}, s.get("energy") or {}
        lm = s.get("last_mile_cost") or {}
        return {"candidate": c.label, "gpu": c.node or c.gpu, "gpus": c.gpus, "tp": c.tp, "replicas": c.replicas,
                "engine": c.engine, "api_servers": c.api_servers, "max_batch": c.max_batch, "status": self.status, "max_rate_per_s": self.rate if self.summary else None,
                "usd_per_hour": cost.get("usd_per_hour"), "usd_per_mtok": cost.get("usd_per_mtok_output"),
                "j_per_token": energy.get("joules_per_output_token"),
                "ttft_p99_ms": (s.get("ttft_ms") or {}).get("p99"), "tpot_p99_ms": (s.get("tpot_ms") or {}).get("p99"),
                "last_mile_share": s.get("last_mile_share"), "last_mile_e2e_ms": (lm.get("e2e_ms") or {}).get("mean"),
                "probes": len(self.probes), "bound_per_s": self.bound}

    def to_json(self) -> dict:
        return {"candidate": asdict(self.candidate), "status": self.status, "rate": self.rate, "bound": self.bound,
                "probes": self.probes, "summary": self.summary}

    @classmethod
    def from_json(cls, data: Mapping) -> "Outcome":
        return cls(Candidate(**data["candidate"]), data["status"], data["rate"], data["bound"],
                   [tuple(p) for p in data["probes"]], data["summary"])


def pareto(rows: Sequence[Mapping], x: str = "usd_per_mtok", y: str = "ttft_p99_ms") -> list[int]:
    """Indices of the rows no other row beats on both ``x`` and ``y`` (lower is better), by ``x``."""
    live = [i for i, r in enumerate(rows) if r.get(x) is not None and r.get(y) is not None]
    live.sort(key=lambda i: (rows[i][x], rows[i][y]))
    front, best = [], math.inf
    for i in live:
        if rows[i][y] < best:
            front.append(i)
            best = rows[i][y]
    return front


def settings_key(base: Mapping, slo: SLO, requests: int) -> str:
    """What a results file's outcomes were searched under: a resumed search reuses only outcomes of
    the same base scenario, SLO and probe size."""
    text = json.dumps({"base": base, "slo": asdict(slo), "requests": requests}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def probe_overrides(job: Mapping, candidate: Candidate, rate: float | None = None) -> dict:
    """The overrides of one probe: the plan's own, the candidate's, the probe's size and rate, the SLO
    the goodput counts against, no spans."""
    slo = SLO(**job["slo"])
    out = {**job["overrides"], **candidate.overrides(), "workload.requests": job["requests"],
           "workload.arrival": "poisson", "record_spans": False}
    for key, value in slo.scenario_slo().items():
        out[f"slo.{key}"] = value
    if rate is not None:
        out["workload.rate"] = rate
    return out


def evaluate(job: Mapping) -> dict:
    """Search one candidate (``job``: the base scenario, the plan's overrides, the candidate, the SLO,
    the probe size, the lowest rate worth searching): prune it, or bisect its highest rate that meets
    the SLO and simulate that rate again with the last mile's counterfactual. Returns the
    :class:`Outcome` as JSON (a worker process or a Dask worker sends it back as it is)."""
    from .api import load_scenario, simulate
    from .pipelines.llm.pools import DoesNotFit, build_cost
    from .pipelines.llm.serving import fitted

    cand, slo = Candidate(**job["candidate"]), SLO(**job["slo"])
    try:
        sc = load_scenario(job["base"], probe_overrides(job, cand))
        _, specs = fitted(sc)
    except ConfigError as exc:
        return Outcome(cand, f"pruned: {exc.path + ': ' if exc.path else ''}{exc.message}").to_json()
    except DoesNotFit as exc:
        return Outcome(cand, f"pruned: does not fit: {exc.message}").to_json()
    if sc.kind != "llm":
        raise ConfigError("lastmile plan searches LLM serving deployments (kind: llm)", file="lastmile plan")
    prompt, output = float(specs.prompt.mean()), float(specs.output.mean())
    bound = rate_bound(build_cost(sc), sc.parallel.replicas, sc.serving.max_batch, prompt, output,
                       prompt + output / 2, (cand.prefill, cand.decode) if cand.prefill else None)
    if bound < job.get("min_rate", 0.0):
        return Outcome(cand, f"pruned: roofline bound {bound:.3g}/s < {job['min_rate']:.3g}/s",
                       bound=bound).to_json()
    seen: dict[float, dict] = {}

    def meets(rate: float) -> bool:
        summary = simulate(load_scenario(job["base"], probe_overrides(job, cand, rate))).summary
        seen[rate] = summary
        return slo.misses(summary) is None

    rate, probes = bisect_rate(meets, bound)
    if rate <= 0:
        why = slo.misses(seen[probes[-1][0]])
        return Outcome(cand, f"misses: {why} at {probes[-1][0]:.3g}/s", bound=bound, probes=probes).to_json()
    final = simulate(load_scenario(job["base"], probe_overrides(job, cand, rate)), last_mile_cost=True).summary
    return Outcome(cand, "ok", rate, bound, probes, final).to_json()
