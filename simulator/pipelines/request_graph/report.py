"""A pipeline run's frames and summary: per request its TTFT, E2E, critical path and the seconds each
stage holds on it; per stage its time, queue wait, cache hits and how often it is critical."""

from __future__ import annotations

from collections import Counter

import numpy as np

from ...observe.perfetto import trace_events
from ...observe.result import Result
from ...observe.stats import stats
from ..health import assess, overload_warning
from .critical_path import critical_paths

TOP_PATHS = 5
"""Most distinct critical paths the summary lists (the most frequent first)."""


def _share(part: float, whole: float):
    return float(part / whole) if whole > 0 else None


def build_result(sc, run, now: float, cut: bool) -> Result:
    """The run's Result: requests and breakdown frames, the summary, the trace."""
    import pandas as pd

    names = [p.name for p in run.stages]
    done = run.done
    paths, charge = critical_paths(run.arrival, run.ready, run.end, run.pred, done)
    finish = np.nanmax(np.where(np.isnan(run.end), -np.inf, run.end), axis=1)
    finish = np.where(done, finish, np.nan)
    e2e = finish - run.arrival
    out = run.index[sc.output]
    ttft = np.where(done, run.first[:, out] - run.arrival, np.nan)
    path_names = [" > ".join(names[s] for s in p) for p in paths]

    # a stage's wait for its resource: for a core, start - ready; for a model call, its queue there
    wait = run.start - run.ready
    llm_cats: dict[str, np.ndarray] = {}
    outcomes = {name: res.outcome(cut) for name, res in run.resources.items() if hasattr(res, "outcome")}
    for rname, oc in outcomes.items():  # each model stage's call, by its deployment's own categories
        calls = oc["calls"]
        cats = oc["breakdown"].reindex(range(oc["summary"]["calls"]))
        table = cats.to_numpy(dtype=float)
        for s, name in enumerate(names):
            if run.stages[s].resource == rname:
                picked = np.full((run.n, len(cats.columns)), np.nan)
                made = calls[:, s] >= 0  # a cache hit made no call
                picked[made] = table[calls[made, s]]
                for j, c in enumerate(cats.columns):
                    if c != "e2e_s":
                        llm_cats[f"{name}.{c}_s"] = picked[:, j]
                wait[:, s] = np.where(made, picked[:, list(cats.columns).index("queue")], wait[:, s])
    req = {"request": np.arange(run.n), "arrival_s": run.arrival, "ttft_s": ttft, "e2e_s": e2e,
           "critical_path": path_names}
    for s, name in enumerate(names):
        req[f"{name}.wait_s"] = wait[:, s]
        req[f"{name}.time_s"] = run.end[:, s] - run.ready[:, s]
        req[f"{name}.cache_hit"] = run.hit[:, s]
    requests = pd.DataFrame({**req, **llm_cats}).set_index("request")
    bd = pd.DataFrame(charge[done], columns=names, index=pd.Index(np.flatnonzero(done), name="request"))
    bd["e2e_s"] = e2e[done]

    total = float(np.nansum(e2e[done]))
    completed = int(done.sum())
    on_path = Counter(s for p in paths for s in p)
    stage_rows = {}
    for s, p in enumerate(run.stages):
        ran = done & ~run.hit[:, s]
        stage_rows[p.name] = {
            "resource": p.resource, "kind": sc.resources[p.resource].kind, "role": p.role,
            "ran": int(ran.sum()), "cache_hits": int((done & run.hit[:, s]).sum()),
            "time_ms": stats((run.end[:, s] - run.ready[:, s])[ran], 1e3),
            "wait_ms": stats(wait[ran, s], 1e3),
            "critical": _share(on_path[s], completed),
        }
    counts = Counter(p for p, d in zip(path_names, done) if d)
    horizon = float(np.nanmax(finish)) if completed else now
    summary = {
        "kind": "pipeline", "scenario": sc.name, "status": "ok",
        "output_stage": sc.output,
        "duration_s": horizon,
        "ttft_ms": stats(ttft[done], 1e3), "e2e_ms": stats(e2e[done], 1e3), "latency_s": stats(e2e[done]),
        "throughput": {"requests_per_s": completed / horizon if horizon > 0 and completed else None},
        "breakdown_share": {name: _share(float(charge[done, s].sum()), total) for s, name in enumerate(names)},
        "critical_paths": [{"path": path, "requests": c, "share": c / completed}
                           for path, c in counts.most_common(TOP_PATHS)],
        "stages": stage_rows,
        "utilization": _utilization(run.recorder, outcomes, horizon),
    }
    for kind in ("llm", "dit"):
        blocks = {name: oc["summary"] for name, oc in outcomes.items() if sc.resources[name].kind == kind}
        if blocks:
            summary[kind] = blocks
    extra = []
    if sc.workload.arrival != "closed":
        extra.append(overload_warning(run.arrival, finish, e2e, done))
    assess(summary, run.n, completed, cut, sc.max_sim_time, extra)
    spans = pd.concat([run.recorder.frame(), *(oc["spans"] for oc in outcomes.values())], ignore_index=True)
    return Result("pipeline", sc, summary, requests, bd, spans, trace_events(spans) if sc.record_spans else [])


def _utilization(recorder, outcomes: dict, horizon: float) -> dict:
    """Busy share of every track over the run: the CPU pools' cores and each deployment's tracks."""
    busy = dict(recorder.busy)
    for oc in outcomes.values():
        busy.update(oc["busy"])
    if horizon <= 0:
        return {k: 0.0 for k in sorted(busy)}
    return {k: min(1.0, v / horizon) for k, v in sorted(busy.items())}
