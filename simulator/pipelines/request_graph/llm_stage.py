"""LLM stages: calls to a serving deployment (``kind: llm``'s engine, frontend and last mile) that
lives in the pipeline's SimPy environment and is shared by every request and stage that names it.

Every call is known before the run (each request's llm stages, less the ones its cache draws
skip), so the deployment is built once for exactly those calls with
:func:`~simulator.pipelines.llm.serving.build_serving`; a stage hands its call to the frontend
with ``arrive`` when it becomes ready, and ends when the client receives the call's last token.
Its first token's receipt is the stage's first output (the client's TTFT for the output stage).

**Early start** (``early_start: true``): when the request arrives, a warm-up call of the stage's
``static_prefix_tokens`` (``max_tokens = 1``, as a client warms a prefix) runs as the added stage
``<stage>:prefix``; the stage's own call, later, carries the whole prompt (prefix + ``prompt_tokens``)
and the engine's prefix cache (``serving.prefix_caching``, vLLM V1 automatic prefix caching:
``pipelines.llm.prefix_cache``) finds the prefix's full blocks and prefills only the rest. The
static prefix is the request's own (its conversation history), so it is shared by the warm-up and
the call of that request only; a prefix shared by all requests (a system prompt) is plain prefix
caching. Only full ``block_size`` units of the prefix are reusable, as in vLLM, whose block hashes
cover full blocks. The call does not wait for the warm-up: if it arrives first, the engine finds
whatever the warm-up has allocated by then (vLLM caches blocks as they are allocated). Each
replica has its own prefix cache: with several replicas, route with ``serving.router:
prefix_affinity`` so that the call reaches the replica its warm-up ran on.

A warm-up is a call like any other: it queues first come, first served in the engine and holds a
running slot and KV blocks, so early start moves work ahead rather than removing it, and it pays
only while the engine has room. When many requests arrive at once (a closed loop's first wave), all
their warm-ups reach the engine before any of their calls, and every call then waits behind every
request's prefix (at 100 users on the RAG example the mean TTFT over all requests rises while the
steady state's falls). When the engine's queue outlasts the prefix cache (1,000 users), the
warm-ups' blocks are evicted, least recently used, before their calls are admitted, and the prefix
is prefilled twice (notebook 6 shows both).

Closed-form decode runs (``coalesce_decode``) are off in these deployments: they need the next
arrival known ahead, and a pipeline's calls arrive when their stages become ready.
"""

from __future__ import annotations

import numpy as np

from ...errors import ConfigError
from ...workloads.arrivals import RequestSpecs, sample_tokens
from ...workloads.prefix import LeadSharedIds
from ..llm.pools import DoesNotFit, check_fit, plan_pools
from ..llm.serving import build_serving


def resource_track(resource: str, track: str) -> str:
    """A deployment's track under its resource's name, its kind prefix kept (``cpu:llm/engine0``,
    ``link:llm/gpu0.pcie.tx``, ``llm/gpu0``), so two deployments' ``gpu0`` stay apart and the trace
    still groups each track with its kind."""
    kind, sep, rest = track.partition(":")
    return f"{kind}:{resource}/{rest}" if sep else f"{resource}/{track}"


class LLMStage:
    """A stage on an llm resource: per request, a prompt (static prefix + ``prompt_tokens``) and an
    output length, drawn up front; an added ``prefix`` stage is the early-start warm-up call."""

    def __init__(self, run, index: int, stage, n: int, rng: np.random.Generator):
        self.run, self.index, self.name, self.spec = run, index, stage.name, stage.spec
        self.role = stage.role
        sp = self.spec
        if stage.role == "prefix":
            self.prefix = sp.static_prefix_tokens
            self.prompt = np.full(n, sp.static_prefix_tokens, dtype=np.int64)
            self.output = np.ones(n, dtype=np.int64)
        else:
            self.prefix = sp.static_prefix_tokens if sp.early_start else 0
            self.prompt = sp.static_prefix_tokens + sample_tokens(sp.prompt_tokens, n, rng)
            self.output = sample_tokens(sp.output_tokens, n, rng)
        self.resource = None  # bound once the run's resources are built

    def start(self, rid: int, now: float) -> None:
        self.run.start[rid, self.index] = now
        self.resource.call(rid, self.index)


def call_prefixes(unit: int, prompts: np.ndarray, group: np.ndarray, shared_tokens: np.ndarray) -> LeadSharedIds:
    """The calls' prefix identity, as the engine's prefix cache reads it: every unit of every call
    has an id of its own, except that calls of one group (``group[c] >= 0``: a request's early-start
    warm-up and its stage's call) share the ids of their first ``shared_tokens[c] // unit`` units
    (the static prefix's full units), named by the group's first call."""
    units = -(-prompts // unit)
    offsets = np.concatenate([[0], np.cumsum(units)]).astype(np.int64)
    lead = np.arange(len(prompts), dtype=np.int64)
    shared = np.zeros(len(prompts), dtype=np.int64)
    grouped = np.flatnonzero(group >= 0)
    if grouped.size:  # each group's first call (in call order) leads it
        _, first = np.unique(group[grouped], return_index=True)
        leaders = dict(zip(group[grouped][first].tolist(), grouped[first].tolist()))
        lead[grouped] = [leaders[g] for g in group[grouped].tolist()]
        follows = grouped[lead[grouped] != grouped]
        shared[follows] = shared_tokens[follows] // unit
    return LeadSharedIds(unit, offsets, lead, shared)


class LLMDeployment:
    """One llm resource: the serving deployment of its ``kind: llm`` scenario, built on the run's
    environment for every call its stages will make, with spans on a recorder of its own (the
    report prefixes its tracks with the resource's name, so two deployments' ``gpu0`` stay apart)."""

    def __init__(self, name: str, spec, run):
        from ...observe.spans import SpanRecorder

        self.name, self.run = name, run
        sc = spec.scenario
        mine = [s for s, p in enumerate(run.stages) if p.resource == name]
        call = np.full((run.n, run.S), -1, dtype=np.int64)
        prompts, outputs, group, shared = [], [], [], []
        for s in mine:
            kind = run.kinds[s]
            rids = np.flatnonzero(~run.hit[:, s])
            call[rids, s] = len(prompts) + np.arange(len(rids))
            prompts.extend(kind.prompt[rids].tolist())
            outputs.extend(kind.output[rids].tolist())
            # a warm-up and its stage's call share group (request, stage it serves)
            served = run.index[run.stages[s].of] if run.stages[s].of else s
            group.extend((rids * run.S + served if kind.prefix else np.full(len(rids), -1)).tolist())
            shared.extend([kind.prefix] * len(rids))
        self.calls = call
        self.owner = np.argwhere(call >= 0)[np.argsort(call[call >= 0], kind="stable")]  # call -> (rid, stage)
        prompts, outputs = np.asarray(prompts, dtype=np.int64), np.asarray(outputs, dtype=np.int64)
        specs = RequestSpecs(np.full(len(prompts), np.nan), prompts, outputs)
        if sc.serving.prefix_caching:
            specs.prefix = call_prefixes(sc.serving.block_size, prompts, np.asarray(group, dtype=np.int64),
                                              np.asarray(shared, dtype=np.int64))
        try:
            plans = plan_pools(sc)
            if len(prompts):
                check_fit(plans, int((prompts + outputs).max()), int(prompts.max()), "stages")
        except DoesNotFit as exc:  # a pipeline has no oom status: its deployment must fit
            key = exc.key if exc.key == "stages" else f"resources.{name}.{exc.key}"
            raise ConfigError(exc.message, path=key) from None
        except ConfigError as exc:
            raise exc.moved(path=f"resources.{name}.{exc.path}" if exc.path else None) from None
        self.recorder = SpanRecorder(enabled=run.recorder.enabled)
        self.system = build_serving(run.env, sc, specs, plans, self.recorder)
        self.system.finish_callbacks.append(self._finished)

    def track(self, track: str) -> str:
        return resource_track(self.name, track)

    def call(self, rid: int, s: int) -> None:
        self.system.arrive(int(self.calls[rid, s]))

    def _finished(self, cid: int, receipt: float) -> None:
        rid, s = (int(x) for x in self.owner[cid])
        run = self.run
        run.first[rid, s] = self.system.table.first_R[cid]
        run.at(receipt, run.finish, rid, s)

    def outcome(self, cut: bool) -> dict:
        """What the run reports of this deployment: its calls' own summary (TTFT, TPOT, E2E of the
        calls, the eight LLM categories, the last mile), each call's breakdown by category, and its
        spans and busy time with its tracks under the resource's name (:meth:`track`)."""
        res = self.system.result(cut)
        s = res.summary
        cache = s.get("prefix_cache")
        block = {"calls": int(self.system.table.n), "calls_completed": s.get("requests_completed", 0),
                 "ttft_ms": s.get("ttft_ms"), "tpot_ms": s.get("tpot_ms"), "e2e_ms": s.get("e2e_ms"),
                 "breakdown_share": s.get("breakdown_share"), "last_mile_share": s.get("last_mile_share"),
                 "prefix_saved_tokens": int(cache["saved_prefill_tokens"]) if cache else None}
        spans = res.spans.copy()
        spans["track"] = [self.track(t) for t in spans["track"].astype(str)]
        busy = {self.track(k): v for k, v in self.recorder.busy.items()}
        return {"summary": block, "breakdown": res.breakdown, "spans": spans, "busy": busy, "calls": self.calls}
