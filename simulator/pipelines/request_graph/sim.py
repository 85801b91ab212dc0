"""Requests walk a graph of stages on shared resources, in one SimPy environment.

Each request arrives (open loop, all at once, or a closed loop of users), and each of its stages
starts when every edge into it is released: a dependency's end, or a streamed producer's k-th
output. A stage with ``cache_hit_rate`` is skipped (it ends when it is ready) where the run's rng
drew a hit for that request. Resources are built once and shared by all requests, so stages on one
resource queue for it. Everything is booked by callbacks at the times it happens (no process per
request), and every random figure is drawn up front in a fixed order, so a seed fixes the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import simpy

from ...config.pipeline_models import PipelineScenario
from ...config.stage_graph import topological_order
from ...errors import ConfigError
from ...observe.result import Result
from ...observe.spans import SpanRecorder
from ...workloads.arrivals import open_loop_arrivals
from ..health import was_cut
from .resources import RESOURCES
from .stages import STAGE_KINDS


@dataclass
class PlannedStage:
    """A stage as the run executes it: the user's stage, or one the run adds (an early-start prefix)."""

    name: str
    spec: object
    resource: str
    after: list[str]
    role: str = "stage"
    """``stage``: as written; ``prefix``: the static prompt prefix an early-start llm stage prefills ahead."""
    of: str | None = None
    """For an added stage: the stage it serves."""


def plan(sc: PipelineScenario) -> list[PlannedStage]:
    """The stages the run executes, in topological order: the scenario's own, each preceded by the
    stages its kind adds (``early_start`` adds ``<stage>:prefix``, an entry stage of its own: the
    warm-up call at the arrival, which the stage does not wait for; ``llm_stage`` says why)."""
    planned: dict[str, PlannedStage] = {}
    for name, st in sc.stages.items():
        if st.early_start:
            pre = f"{name}:prefix"
            planned[pre] = PlannedStage(pre, st, st.resource, [], role="prefix", of=name)
        planned[name] = PlannedStage(name, st, st.resource, list(st.after))
    order = topological_order({n: p.after for n, p in planned.items()})
    return [planned[n] for n in order]


@dataclass
class Run:
    """The state of a run: per request and stage, when it became ready, started, produced its first
    output and ended, which dependency released it last, and whether its cache hit."""

    sc: PipelineScenario
    env: simpy.Environment
    recorder: SpanRecorder
    rng: np.random.Generator
    stages: list[PlannedStage] = field(init=False)
    on_done: object = None

    def __post_init__(self):
        sc, n = self.sc, self.sc.workload.requests
        self.stages = plan(sc)
        self.index = {p.name: i for i, p in enumerate(self.stages)}
        S = len(self.stages)
        self.n, self.S = n, S
        self.after = [[self.index[a] for a in p.after] for p in self.stages]
        stream = {(p.name, p.spec.stream_from.stage): p.spec.stream_from.outputs for p in self.stages
                  if p.role == "stage" and p.spec.stream_from is not None}
        self.normal = [[] for _ in range(S)]   # dependents released at the stage's end
        self.streams = [[] for _ in range(S)]  # (dependent, k): released at the stage's k-th output
        for d, p in enumerate(self.stages):
            for a in p.after:
                k = stream.get((p.name, a))
                (self.streams[self.index[a]].append((d, k)) if k else self.normal[self.index[a]].append(d))
        self.entries = [s for s in range(S) if not self.after[s]]
        nan = np.full((n, S), np.nan)
        self.arrival = np.full(n, np.nan)
        self.ready, self.start, self.first, self.end = nan.copy(), nan.copy(), nan.copy(), nan.copy()
        self.hold = np.full((n, S), -np.inf)
        self.pred = np.full((n, S), -1, dtype=np.int64)
        self.waiting = np.tile(np.array([len(a) for a in self.after], dtype=np.int64), (n, 1))
        self.left = np.full(n, S, dtype=np.int64)
        self.done = np.zeros(n, dtype=bool)
        # every draw up front, in a fixed order: arrivals (by the caller), then per stage its kind's
        # figures and its cache draws (drawn whatever the rate, so a rate changes no other draw)
        self.kinds, self.hit = [], np.zeros((n, S), dtype=bool)
        for s, p in enumerate(self.stages):
            self.kinds.append(STAGE_KINDS[sc.resources[p.resource].kind](self, s, p, n, self.rng))
            if p.role == "stage":
                self.hit[:, s] = self.rng.random(n) < p.spec.cache_hit_rate
        # built once, shared by every stage and request that names them (an llm deployment is built
        # for exactly the calls the draws leave)
        self.resources = {name: RESOURCES[spec.kind](name, spec, self) for name, spec in sc.resources.items()}
        for s, p in enumerate(self.stages):
            self.kinds[s].resource = self.resources[p.resource]

    # -- scheduling ------------------------------------------------------------------------
    def at(self, t: float, fn, *args) -> None:
        """Call ``fn(*args)`` at simulated time ``t`` (now, if ``t`` is not in the future)."""
        now = self.env.now
        if t <= now:
            fn(*args)
        else:
            self.env.timeout(t - now).callbacks.append(lambda _ev: fn(*args))

    def arrive(self, rid: int) -> None:
        self.arrival[rid] = self.env.now
        for s in self.entries:
            self.begin(rid, s)

    def release(self, rid: int, s: int, d: int) -> None:
        """The edge ``s -> d`` of request ``rid`` is released now; ``d`` starts when it was the last."""
        self.pred[rid, d] = s  # releases come in time order: the last one is the critical one
        self.waiting[rid, d] -= 1
        if self.waiting[rid, d] == 0:
            self.begin(rid, d)

    def begin(self, rid: int, s: int) -> None:
        now = self.env.now
        self.ready[rid, s] = now
        if self.hit[rid, s]:  # served from the stage's result cache: nothing runs
            self.start[rid, s] = self.first[rid, s] = now
            for d, _k in self.streams[s]:
                self.release(rid, s, d)
            self.finish(rid, s)
        else:
            self.kinds[s].start(rid, now)

    def finish(self, rid: int, s: int) -> None:
        self.end[rid, s] = self.env.now
        for d in self.normal[s]:
            self.release(rid, s, d)
        self.left[rid] -= 1
        if self.left[rid] == 0:
            self.done[rid] = True
            if self.on_done is not None:
                self.on_done(rid)


def check(sc: PipelineScenario) -> None:
    """What the layouts decide before simulating: each llm resource's parallel layout
    (``pipelines.llm.pools.check_parallel``), reported at the resource's keys."""
    from ..llm.pools import check_parallel

    for name, res in sc.resources.items():
        if res.kind == "llm":
            try:
                check_parallel(res.scenario)
            except ConfigError as exc:
                raise exc.moved(path=f"resources.{name}.{exc.path}" if exc.path else f"resources.{name}") from None


def simulate(sc: PipelineScenario) -> Result:
    """Run every request of a pipeline scenario through its graph; returns the Result."""
    check(sc)
    from .report import build_result  # the frames and the summary

    env = simpy.Environment()
    recorder = SpanRecorder(enabled=sc.record_spans)
    rng = np.random.default_rng(sc.seed)
    w = sc.workload
    arrivals = open_loop_arrivals(w, rng)  # drawn first, as every kind does; None for a closed loop
    run = Run(sc, env, recorder, rng)
    if arrivals is None:
        nxt = [min(w.concurrency, run.n)]

        def next_user(_rid: int) -> None:  # a user sends its next request when its last completes
            if nxt[0] < run.n:
                nxt[0] += 1
                run.arrive(nxt[0] - 1)

        run.on_done = next_user
        for rid in range(nxt[0]):
            run.arrive(rid)
    else:
        def open_loop():
            for rid, t in enumerate(arrivals):
                if t > env.now:
                    yield env.timeout(t - env.now)
                run.arrive(rid)

        env.process(open_loop())
    env.run(until=sc.max_sim_time)
    return build_result(sc, run, env.now, was_cut(env, sc.max_sim_time))
