"""``simulate``: run a DiT scenario end to end and build its Result."""

from __future__ import annotations

import numpy as np
import simpy

from ...config.dit_models import DiTScenario
from ...observe.perfetto import Counter, trace_events
from ...observe.result import Result, with_units
from ...workloads.dit_requests import dit_arrivals, own_shape, request_shapes, shaped
from ..health import assess, overload_warning, was_cut
from . import results as R
from .layout import Layout
from .model import DiTModel
from .sim import DiTSim
from .strategies import label


def strategy_name(sc: DiTScenario) -> str:
    """A short label of the layout, e.g. ``cfg2 x pipefusion4(M=8) x ulysses2``."""
    return label(Layout.build(sc.parallel, sc.steps).strategies)


def _run(sim: DiTSim, env: simpy.Environment, sc: DiTScenario, rng: np.random.Generator, shapes):
    """Start the clients (closed loop) or the arrival source (open loop) of requests of ``shapes`` (None: the
    scenario's own) and run; the arrival times."""
    wl = sc.workload
    times = dit_arrivals(sc, rng)
    if times is None:
        ids = list(range(wl.requests))
        for c in range(wl.concurrency):
            env.process(sim.closed_client(ids[c::wl.concurrency], shapes))
    else:
        env.process(sim.open_source(times, shapes))
    env.run(until=sc.max_sim_time)
    return times


def _memory(model: DiTModel, shapes) -> float:
    """Bytes the busiest GPU needs for the largest pass the service may run: each shape asked for at
    ``serving.max_batch`` requests."""
    sc = model.sc
    n = sc.serving.max_batch
    kinds = set(shapes) if shapes else {own_shape(sc)}
    return max(model.memory_per_gpu() if (s == own_shape(sc) and n == 1)
               else DiTModel.build(shaped(sc, s), n).memory_per_gpu() for s in kinds)


def simulate(sc: DiTScenario) -> Result:
    """Run a DiT scenario; a layout that does not fit in memory returns ``status: oom``."""
    model = DiTModel.build(sc)
    shapes = request_shapes(sc, sc.workload.requests)
    need = _memory(model, shapes)
    if need > model.gpu.memory:
        return R.oom_result(sc, need, model.gpu.memory, label(model.lay.strategies))
    env = simpy.Environment()
    rng = np.random.default_rng(sc.seed)
    sim = DiTSim(model, env, rng)
    times = _run(sim, env, sc, rng, shapes)
    wl = sc.workload
    req = R.request_frame(sim.rows, sim.started, wl.requests, times)
    done = req[req["completed"]]
    bd = done[["request", *R.CATEGORIES, "latency"]].reset_index(drop=True)
    cut = was_cut(env, sc.max_sim_time)
    horizon = float(env.now) if cut else (float(done["done"].max()) if len(done) else 0.0)
    spans = sim.rec.frame()
    summary = R.summary(sc, model, done, sim.rec.utilization(horizon), need, label(model.lay.strategies))
    summary["serving"] = R.serving_summary(sc, sim.batches, done)
    overload = None
    if times is not None:
        overload = overload_warning(req["arrival"].to_numpy(float), req["done"].to_numpy(float),
                                    req["latency"].to_numpy(float), req["completed"].to_numpy(bool),
                                    unit="images")
    assess(summary, wl.requests, len(done), cut, sc.max_sim_time, [overload], unit="image")
    counters = [Counter("queue depth", "gpu0", *map(np.array, zip(*sim.queue.depth))),
                Counter("batch size", "gpu0", *map(np.array, zip(*sim.batches)))] if sim.batches else []
    return Result("dit", sc, summary, with_units(req, R.SECONDS), with_units(bd, ("latency",)), spans,
                  trace_events(spans, counters) if sc.record_spans else [])
