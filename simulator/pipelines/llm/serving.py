"""The LLM serving pipeline, assembled from a scenario: clients, API servers, router, engine replicas."""

from __future__ import annotations

from collections import deque

import numpy as np
import simpy

from ... import progress
from ...config.models import upper_tokens
from ...hardware.cpu import CorePool, CPUProcess
from ...hardware.topology import LinkParams, Topology
from ...invariants import require
from ...observe.attribution import WAIT_COLUMNS
from ...observe.columns import Columns, RingColumns
from ...observe.llm_metrics import ServingStats, build_result
from ...observe.result import Result
from ...observe.spans import SpanRecorder
from ...observe.stats import stats as stats_of
from ...observe.token_ledger import TokenLedger
from ...workloads.arrivals import make_requests
from ...workloads.llm import LLMCostModel
from ..health import assess, overload_warning, saturated_hint, was_cut
from .decode_runs import DecodeRuns
from .engine import Engine, Records, Replica, RequestTable
from .frontend import Frontend
from .routers import make_router
from .kv_offload import HostTier, Offloader, merged_stats as offload_stats
from .kv_transfer import KVHandoff
from .links import ReplicaLinks
from .overlap import serial_steps
from .prefix_cache import merged_stats
from .settings import EngineSettings, FrontendSettings
from .pools import DoesNotFit, PoolPlan, check_fit, check_parallel, plan_pools
from .speculative import SpecDecoder, merged_stats as spec_stats

STEP_COLUMNS = {"a0": "f8", "a1": "f8", "s0": "f8", "g0": "f8", "g1": "f8", "comm": "f8", "d1": "f8",
                **dict.fromkeys(WAIT_COLUMNS, "f8"), "batch": "i4", "decode": "i4", "prefill_tokens": "i4"}
"""One row per engine step: scheduling submitted (a0), started on its process (s0) and done (a1), GPU
start and end, communication, copy end, the seconds of detokenization, output processing, messages
and streaming its scheduling waited behind on its process (``observe.attribution.WAIT_COLUMNS``),
and its size."""


def _oom_result(scenario, exc: DoesNotFit) -> Result:
    """``status: oom``: nothing ran; the summary says what did not fit and which key to change."""
    summary = {"kind": "llm", "scenario": scenario.name, "status": "oom",
               "requests_total": scenario.workload.requests, "requests_completed": 0,
               "memory_per_gpu_gib": exc.memory, "message": exc.message, "memory_key": exc.key}
    import pandas as pd

    empty = pd.DataFrame(index=pd.RangeIndex(0, name="request"))
    return Result("llm", scenario, summary, empty, empty.copy(),
                  pd.DataFrame(columns=["track", "name", "start", "end", "category"]), [])


def fitted(scenario) -> tuple[list[PoolPlan], object]:
    """The deployment's pools and its workload's requests, once every request is known to fit its
    replicas' memory (raises DoesNotFit naming what does not)."""
    check_parallel(scenario)
    w = scenario.workload
    plans = plan_pools(scenario)
    if not w.trace:
        prompt = w.prompt_upper  # with sessions, a last turn's whole history
        check_fit(plans, prompt + upper_tokens(w.output_tokens), prompt,
                   "workload.sessions" if w.sessions else "workload.prompt_tokens")
    specs = make_requests(w, np.random.default_rng(scenario.seed), scenario.model.context_length)
    if w.trace:
        check_fit(plans, int((specs.prompt + specs.output).max()), int(specs.prompt.max()), "workload.trace")
    return plans, specs


def simulate(scenario):
    """Run an LLM serving scenario to completion; returns a Result (``status: oom`` if it does not fit)."""
    try:
        plans, specs = fitted(scenario)
    except DoesNotFit as exc:
        return _oom_result(scenario, exc)

    system = run_deployment(scenario, specs, plans)
    return system.result(was_cut(system.env, scenario.max_sim_time))


def run_deployment(scenario, specs=None, plans: list[PoolPlan] | None = None) -> "ServingSystem":
    """Build a scenario's deployment, run its own workload (``specs``: drawn from it when None) to
    the end and return it: :func:`simulate` reads its Result; a caller may look inside (its engines,
    schedulers and request table), where a Result keeps only the metrics."""
    if specs is None:
        specs = make_requests(scenario.workload, np.random.default_rng(scenario.seed), scenario.model.context_length)
    env = simpy.Environment()
    system = build_serving(env, scenario, specs, plans, SpanRecorder(enabled=scenario.record_spans))
    system.start_arrivals()
    env.run(until=scenario.max_sim_time)
    return system


class ServingSystem:
    """An LLM serving deployment on a SimPy environment: API servers, router, engine replicas and
    the run's stores. ``arrive(rid)`` hands request ``rid`` of the table to the frontend now; a
    request graph (``kind: pipeline``) feeds its LLM calls this way, a plain run from its arrivals."""

    def __init__(self, env, scenario, table: RequestTable, frontend: Frontend, replicas: list, servers: list,
                 records: Records, recorder: SpanRecorder, memory: dict, kv_blocks: int):
        self.env, self.scenario, self.table, self.frontend = env, scenario, table, frontend
        self.replicas, self.servers, self.records, self.recorder = replicas, servers, records, recorder
        self.memory, self.kv_blocks = memory, kv_blocks
        self.engines: list[Engine] = []  # every replica's engine (the frontend routes to the entry pool's)
        self.handoff: KVHandoff | None = None
        self.finish_callbacks: list = []  # called as (rid, receipt time) when a request's last token is received
        self._next_rid = 0

    def arrive(self, rid: int) -> None:
        """The client sends request ``rid`` now (its arrival time is set to now; see ``Frontend.send``)."""
        self.table.arrival[rid] = self.env.now
        self.frontend.send(rid)

    def _finished(self, rid: int, receipt: float) -> None:
        t = self.table
        require("FINISHED_ONCE", not t.reported[rid], lambda: f"request {rid} finished again at {receipt}")
        t.reported[rid] = True
        require("TOKENS_CONSERVED", t.generated[rid] == t.output[rid] == t.sent[rid],
                lambda: f"request {rid}: {t.output[rid]} to make, {t.generated[rid]} made, {t.sent[rid]} sent")
        for callback in self.finish_callbacks:
            callback(rid, receipt)

    def start_arrivals(self) -> None:
        """The workload's own arrivals: the open loop at the table's arrival times, or a closed
        loop of ``workload.concurrency`` clients, each sending its next request when the last is received."""
        env, table, frontend = self.env, self.table, self.frontend
        if self.scenario.workload.arrival == "closed":
            def next_request(_rid: int, receipt: float) -> None:
                if self._next_rid < table.n:
                    nxt = self._next_rid
                    self._next_rid += 1
                    env.timeout(receipt - env.now).callbacks.append(lambda _ev: self.arrive(nxt))

            self.finish_callbacks.append(next_request)
            self._next_rid = min(self.scenario.workload.concurrency, table.n)
            for rid in range(self._next_rid):
                self.arrive(rid)
            return

        send = frontend.send if self.scenario.workload.concurrency is None else self._limited()

        def open_loop():
            while frontend.next_rid < table.n:
                rid = frontend.next_rid
                wait = table.arrival[rid] - env.now
                if wait > 0:
                    yield env.timeout(wait)
                    if frontend.next_rid != rid:
                        continue  # a decode run took it (and those after it) meanwhile
                frontend.took_arrivals(rid + 1)
                send(rid)

        env.process(open_loop())

    def _limited(self):
        """An open loop's sender with at most ``workload.concurrency`` requests in flight, as ``vllm bench
        serve --request-rate R --max-concurrency C`` sends them: a request due while C are in flight
        waits for one to be received (first due, first sent), and its latencies count from when it is
        sent (``benchmarks/serve.py`` acquires the semaphore before the request function starts its clock)."""
        env, limit = self.env, self.scenario.workload.concurrency
        waiting: deque[int] = deque()
        flight = [0]

        def send(rid: int) -> None:
            if flight[0] < limit:
                flight[0] += 1
                self.arrive(rid)
            else:
                waiting.append(rid)

        def received(_rid: int, receipt: float) -> None:
            flight[0] -= 1
            if waiting:
                nxt = waiting.popleft()
                flight[0] += 1
                env.timeout(receipt - env.now).callbacks.append(lambda _ev: self.arrive(nxt))

        self.finish_callbacks.append(received)
        return send

    def _transfer_summary(self) -> dict:
        t, dis = self.table, self.scenario.disaggregation
        done = t.finished & np.isfinite(t.last_R)
        return {"link": dis.kv_link.name if dis.kv_link is not None else "topology route",
                "transfer": dis.transfer, "transfer_ms": stats_of((t.kv_end - t.kv_start)[done], 1e3),
                "bytes_total": self.handoff.bytes_sent,
                "prefill_replicas": dis.prefill.replicas, "decode_replicas": dis.decode.replicas}

    def result(self, cut: bool) -> Result:
        """The run's Result once the environment has run (``cut``: stopped by max_sim_time)."""
        scenario, table = self.scenario, self.table
        procs = {id(q): q for q in [*self.servers, *(r.proc for r in self.replicas),
                                    *(r.detok_proc for r in self.replicas)] if q}
        activity: dict[str, float] = {}
        for q in procs.values():
            for label, seconds in q.by_label.items():
                activity[label] = activity.get(label, 0.0) + seconds
        stats = ServingStats(tuple(e.stats() for e in self.engines),
                             tuple(dict.fromkeys(s.track for s in self.servers)), activity)
        result = build_result(scenario, table, self.records.steps, self.records.rows, self.recorder, stats,
                              self.memory, self.kv_blocks, self.env.now)
        caches = merged_stats(e.sched.cache for e in self.engines)
        if caches is not None:
            result.summary["prefix_cache"] = caches
        if self.handoff is not None:
            result.summary["disaggregation"] = self._transfer_summary()
        tiers = offload_stats(e.sched.offload.tier for e in self.engines if e.sched.offload is not None)
        if tiers is not None:
            result.summary["kv_offload"] = tiers
        spec = spec_stats(e.spec for e in self.engines)
        if spec is not None:
            # a chunk carries a step's accepted tokens: the gaps between chunks, the summary's itl_ms
            # (what vllm bench serve's ITL measures; itl_per_token_ms counts the further tokens as 0 s gaps)
            spec["itl_per_chunk_ms"] = result.summary["itl_ms"] if result.itl is not None else None
            result.summary["speculative"] = spec
        _assess(result.summary, scenario, table, cut)
        return result


def build_serving(env, scenario, specs, plans: list[PoolPlan] | None, recorder: SpanRecorder,
                  topo: Topology | None = None, pool: CorePool | None = None) -> ServingSystem:
    """Build a scenario's serving deployment on ``env`` for the requests ``specs`` (their arrival
    times are used only by :meth:`ServingSystem.start_arrivals`); ``plans`` from :func:`plan_pools`
    (made here when None). ``topo`` and ``pool`` let a caller share the GPUs' topology and the
    host's cores with other work."""
    hw, sv = scenario.hardware, scenario.serving
    plans = plans or plan_pools(scenario)
    # one replica on a topology of its own: its step's TP/PP traffic is alone on its ports (``ReplicaLinks``)
    sole = topo is None and sum(q.replicas for q in plans) == 1
    if topo is None:
        topo = Topology.from_hardware(env, hw, sum(q.replicas * q.gpus_per_replica for q in plans), recorder)
    if pool is None:
        pool = CorePool(hw.cpu_cores, now=lambda: env.now)
    table = RequestTable(specs.arrival, specs.prompt, specs.output, specs.prefix, specs.session)
    # a disaggregated request's rows lie on two replicas far apart in steps: keep every row
    keep_rows = scenario.disaggregation is not None
    # steps are read at the end only by the trace and by a walk over kept rows; otherwise the
    # ledger reads them while it folds, and only the recent ones need to be held
    steps = Columns(STEP_COLUMNS) if recorder.enabled or keep_rows else RingColumns(STEP_COLUMNS)
    ledger = TokenLedger(table, steps, keep_rows=keep_rows, capacity=max(1024, int(specs.output.sum()) + len(specs)))
    records = Records(steps, ledger, recorder)
    replicas = [_replica(q.first_replica + k, q.scenario, topo, pool, q.cost, recorder,
                         q.first_gpu + k * q.gpus_per_replica, sole) for q in plans for k in range(q.replicas)]
    if sv.api_server_process == "engine":  # each replica's API server is its engine process
        servers = [r.proc for r in replicas]
    else:
        servers = [CPUProcess(f"api_server{j}", pool, recorder) for j in range(sv.api_servers)]
    system: ServingSystem | None = None
    client = topo.client_link
    if sv.last_mile == "free":  # the counterfactual: chunks reach the client as they are serialized
        client = LinkParams(float("inf"), 0.0, f"{client.name} (free)")
    # the load generator on the host's cores (workload.client_cpu), a process like the servers'
    loadgen = CPUProcess("client", pool, recorder) if scenario.workload.client_cpu is not None else None
    frontend = Frontend(env, FrontendSettings.from_scenario(scenario), client, table, servers,
                        records.rows, lambda rid, receipt: system._finished(rid, receipt), loadgen)
    last = plans[-1]  # the pool whose KV cache holds the generation: what the summary reports
    system = ServingSystem(env, scenario, table, frontend, replicas, servers, records, recorder, last.memory,
                           last.kv_blocks)
    settings = EngineSettings.from_scenario(scenario)
    by_role: dict[str, list[Engine]] = {}
    for q in plans:
        cache = table.prefix if sv.prefix_caching and q.role != "decode" else None
        for k in range(q.first_replica, q.first_replica + q.replicas):
            engine = Engine(env, k, settings, table, q.cost, q.kv_blocks, replicas[k], frontend, records, cache,
                            _offloader(env, sv, topo, q, replicas[k].first_gpu))
            if sv.speculative is not None:
                engine.speculate(SpecDecoder.from_scenario(q.scenario, q.cost, k))
            system.engines.append(engine)
            by_role.setdefault(q.role, []).append(engine)
    frontend.engines.extend(by_role.get("both") or by_role["prefill"])
    if scenario.disaggregation is not None:
        system.handoff = _handoff(env, scenario, topo, table, plans, by_role["decode"])
        for engine in by_role["prefill"]:
            engine.hand_off_to(system.handoff)
    elif scenario.coalesce_decode:
        # a closed loop's or a concurrency limit's next send depends on a receipt: not known in advance
        open_loop = scenario.workload.arrival != "closed" and scenario.workload.concurrency is None
        _attach_runs(frontend, sv, open_loop, scenario.max_sim_time)
    return system


def _attach_runs(frontend: Frontend, sv, open_loop: bool, horizon: float | None) -> None:
    """Give each replica closed-form runs of its steps where its set-up allows them; under ``-v``, say
    which replicas step event by event and why (what keeps them off the fast path, issue 24): one
    line per distinct set of reasons, so thousands of replicas alike print one."""
    engines = frontend.engines
    stepped: dict[tuple, list[int]] = {}
    for i, engine in enumerate(engines):
        blockers = DecodeRuns.blockers(sv, engine, open_loop, len(engines))
        if blockers:
            stepped.setdefault(tuple(blockers), []).append(i)
        else:
            engine.use_runs(DecodeRuns(engine, frontend, horizon))
    for blockers, ids in stepped.items():
        who = (f"replica {ids[0]} steps" if len(ids) == 1 else f"all {len(ids)} replicas step"
               if len(ids) == len(engines) else f"replicas {', '.join(map(str, ids))} step")
        progress.detail(f"{who} one event at a time (no closed-form runs): " + "; ".join(blockers))


def _offloader(env, sv, topo: Topology, plan: PoolPlan, gpu: int) -> Offloader | None:
    """A replica's host tier for KV blocks (``serving.kv_offload``), copying over ``gpu``'s host
    route or the tier's own link; one GPU's shard per copy."""
    off = sv.kv_offload
    if off is None:
        return None
    link = LinkParams.from_spec(off.link) if off.link is not None else None
    tier = HostTier(off.capacity, plan.cost.kv_bytes_per_token_per_gpu() * sv.block_size)
    return Offloader(env, topo.fabric, topo.offload_route(gpu, "tx", link), topo.offload_route(gpu, "rx", link), tier,
                     off.policy == "write_through")


def _handoff(env, scenario, topo: Topology, table: RequestTable, plans: list[PoolPlan], decode: list) -> KVHandoff:
    """The KV transfers from the prefill pool to the decode pool: each carries the larger of the
    two pools' per-GPU KV shards over ``disaggregation.kv_link`` (or the topology's route)."""
    dis = scenario.disaggregation
    shard = max(q.cost.kv_bytes_per_token_per_gpu() for q in plans)
    link = LinkParams.from_spec(dis.kv_link) if dis.kv_link is not None else None
    return KVHandoff(env, topo, decode, make_router(scenario.serving.router, table, scenario.seed, 1), table, shard,
                     scenario.model.layers, link, dis.transfer == "layerwise")


def _replica(k: int, scenario, topo: Topology, pool: CorePool, cost: LLMCostModel, recorder,
             first: int, sole: bool = False) -> Replica:
    """Replica ``k``'s CPU processes and its GPUs (tp x pp, stage by stage, from GPU ``first``) on the
    topology (``sole``: the only replica on it)."""
    p, sv = scenario.parallel, scenario.serving
    stages = [[first + s * p.tp + i for i in range(p.tp)] for s in range(p.pp)]
    # other copies share the GPUs' host route: KV offload over the host link, KV transfers routed
    # by the topology (over PCIe where there is no NVLink)
    dis = scenario.disaggregation
    host_shared = ((sv.kv_offload is not None and sv.kv_offload.link is None)
                   or (dis is not None and dis.kv_link is None))
    links = ReplicaLinks(topo, stages, scenario.model.layers, cost.activation_bytes, cost.collective_parts, host_shared,
                         sv.last_mile == "free", cost.collectives_per_layer,
                         "all-to-all" if cost.dp_attention else "all-reduce", sole, serial_steps(sv))
    # the engine's process keeps what ran on it: its steps' scheduling waits are split by it (observe.attribution)
    engine = CPUProcess(f"engine{k}", pool, recorder, keep_history=True)
    detok = CPUProcess(f"detokenizer{k}", pool, recorder) if sv.detokenizer == "separate" else None
    return Replica(engine, detok, links,
                   [f"gpu{first + i}" for i in range(p.tp * p.pp)], first)


def _assess(summary: dict, scenario, table: RequestTable, cut: bool) -> None:
    """Status and warnings: unfinished requests, overload (a trace shorter than
    workload.requests is rejected at load time)."""
    w = scenario.workload
    done = table.finished & np.isfinite(table.last_R)
    completed = int(done.sum())
    if completed == 0:  # shares of nothing are not 0 %: they are undefined
        summary["breakdown_share"] = {c: None for c in summary["breakdown_share"]}
        summary["last_mile_share"] = summary["itl_last_mile_share"] = None
    extra = []
    if w.arrival != "closed":
        overload = overload_warning(table.arrival, table.last_R, table.last_R - table.arrival, done,
                                    first=table.first_R - table.arrival)
        hint = saturated_hint(summary.get("utilization") or {}) if overload else None
        extra.append(overload if hint is None else f"{overload}; {hint}")
    elif "rate" in w.model_fields_set and w.rate is not None:
        extra.append(f"workload.rate ({w.rate:g}/s) is not used: a closed loop sends each request when the last is "
                     "received; for a rate with a limit in flight use an open arrival with workload.concurrency "
                     "(vllm bench serve --request-rate with --max-concurrency)")
    ordered = list(summary.items())  # status right after the scenario's name
    summary.clear()
    for k, v in ordered:
        summary[k] = v
        if k == "scenario":
            summary["status"] = "ok"
    assess(summary, table.n, completed, cut, scenario.max_sim_time, extra)
