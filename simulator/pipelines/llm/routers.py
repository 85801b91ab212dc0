"""How a request is spread over engine replicas: one class per ``serving.router``, named in ``ROUTERS``.

A router is made per frontend (it may keep state; :func:`make_router` gives it the request table and
a random stream of its own) and asked for a replica index for request ``rid``, given the engines
(each has ``outstanding``: requests routed to it and not yet finished; ``sched``: its scheduler,
with its KV-cache pool and, with prefix caching, its prefix cache; ``env``: the clock).
"""

from __future__ import annotations

import math
import zlib

import numpy as np

from ...errors import ConfigError
from .run_support import declare

# How closed-form runs of steps cover the serving keys this module owns (run_support).
declare("router", owner="routers")


def _prefix_ids(table, router: str):
    """The requests' prefix ids, which ``router`` routes on (an error when the workload has none)."""
    if table.prefix is None:
        raise ConfigError(f"router {router} needs prompts with prefix identity (a Mooncake .jsonl trace, "
                          "workload.prefix or workload.sessions)", path="serving.router")
    return table.prefix


class RoundRobin:
    """Replicas in turn, whatever their load (a plain load balancer in front of the replicas)."""

    def __init__(self, table, rng=None):
        self._next = 0

    def pick(self, engines, rid: int) -> int:
        k = self._next
        self._next = (self._next + 1) % len(engines)
        return k


class LeastOutstanding:
    """The replica with the fewest unfinished requests, the lowest index on ties: a load-based
    choice, as vLLM's data-parallel coordinator and SGLang's router (when loads are imbalanced) make."""

    def __init__(self, table, rng=None):
        pass

    def pick(self, engines, rid: int) -> int:
        return min(range(len(engines)), key=lambda i: (engines[i].outstanding, i))


class LeastKVLoad:
    """llm-d's inference scheduler with its "KV cache utilization" scorer
    (llm-d/llm-d-inference-scheduler, ``kv-cache-utilization-scorer``) on the Gateway API Inference
    Extension's machinery: the replica with the fewest KV-cache blocks held by requests (idle cached
    prefixes do not count: they are evictable), then the fewest unfinished requests, as the gateway
    last read them, and a random one among equals. The gateway reads each replica's metrics on a
    period (``DefaultRefreshMetricsInterval``, 50 ms: pkg/epp/datastore refresh in
    kubernetes-sigs/gateway-api-inference-extension), so within one the requests it routes all see
    the same loads; its max-score picker then picks at random among the pods of the best score (its
    test accepts either of two equal pods), so a burst spreads over equal replicas instead of piling
    onto the first."""

    REFRESH = 0.050
    """Seconds between two reads of the replicas' metrics."""

    def __init__(self, table, rng=None):
        self.rng = rng if rng is not None else np.random.default_rng(0)
        self.loads: list | None = None
        self.fresh_until = -math.inf

    def pick(self, engines, rid: int) -> int:
        now = engines[0].env.now
        if self.loads is None or now >= self.fresh_until:  # the period's read of every replica
            self.loads = [(_kv_load(e.sched), e.outstanding) for e in engines]
            self.fresh_until = (math.floor(now / self.REFRESH) + 1) * self.REFRESH
        best = min(self.loads)
        ties = [i for i, load in enumerate(self.loads) if load == best]
        return ties[0] if len(ties) == 1 else ties[int(self.rng.integers(len(ties)))]


def _kv_load(sched) -> float:
    """A replica's KV-cache utilization as its metrics report it: blocks held by requests, of all."""
    idle = sched.cache.idle_blocks if sched.cache is not None else 0
    return (sched.kv_total - sched.kv_free - idle) / sched.kv_total


class PrefixAffinity:
    """SGLang's cache-aware router (sgl-router, now the SGLang Model Gateway; policy and defaults
    from its docs, docs/concepts/routing/cache-aware.md: ``--cache-threshold 0.3``,
    ``--balance-abs-threshold 64``, ``--balance-rel-threshold 1.5``): while loads are balanced,
    the replica whose cache holds the longest prefix of the prompt, if it covers at least
    ``CACHE_THRESHOLD`` of it; otherwise (or when the most and least loaded replicas differ by
    more than both thresholds) the least loaded replica. Here the router reads each replica's own
    cache (the gateway mirrors it in a radix tree of what it routed)."""

    CACHE_THRESHOLD = 0.3
    BALANCE_ABS = 64
    BALANCE_REL = 1.5

    def __init__(self, table, rng=None):
        self.prefix = _prefix_ids(table, "prefix_affinity")

    def pick(self, engines, rid: int) -> int:
        loads = [e.outstanding for e in engines]
        least = min(range(len(engines)), key=lambda i: (loads[i], i))
        hi, lo = max(loads), loads[least]
        if hi - lo > self.BALANCE_ABS and hi > self.BALANCE_REL * lo:
            return least
        units = len(self.prefix.of(rid))
        best, best_n = least, -1
        for i, e in enumerate(engines):
            cache = e.sched.cache
            n = cache.longest_prefix(rid) if cache is not None else 0
            if n > best_n or (n == best_n and (loads[i], i) < (loads[best], best)):
                best, best_n = i, n
        return best if units and best_n / units >= self.CACHE_THRESHOLD else least


class CacheAwareTree:
    """SGLang's router with its ``cache_aware`` policy as the router's code runs it (sgl-router,
    github.com/sgl-project/sglang at commit 00b08c4, ``sgl-router/src/router.rs``, ``Router::CacheAware``
    and ``select_generate_worker_from_text``; the router of the SGLang v0.4 blog): it keeps an
    approximate radix tree per worker of the prompts *it routed* (the whole prompt is inserted for
    the chosen worker at routing time, "eliminating the need for direct cache state queries"), so
    a burst of requests sharing a prefix follows the first one even before any replica has computed
    it. While loads are balanced, a prompt whose longest match in any worker's tree exceeds
    ``CACHE_THRESHOLD`` of it goes to that worker, otherwise to the worker with the smallest tree;
    when the most and least loaded workers (requests routed and not finished) differ by more than
    ``BALANCE_ABS`` and ``BALANCE_REL`` times, to the least loaded. Defaults of that router
    (``py_src/sglang_router/launch_router.py`` RouterArgs: cache_threshold 0.5, balance_abs_threshold
    32, balance_rel_threshold 1.0001). Its periodic LRU eviction of the trees (``max_tree_size``
    2^24 nodes every 60 s) is not modelled: the trees only grow. :class:`PrefixAffinity` is the
    variant that reads the replicas' own caches instead."""

    CACHE_THRESHOLD = 0.5
    BALANCE_ABS = 32
    BALANCE_REL = 1.0001

    def __init__(self, table, rng=None):
        self.prefix = _prefix_ids(table, "cache_aware")
        self.prompt = table.prompt
        self.trees: list[set[int]] | None = None  # per worker: prefix ids of the prompts routed to it
        self.sizes: list[int] = []  # per worker: tokens its tree holds

    def _match(self, tree: set[int], ids) -> int:
        n = 0
        for key in ids:
            if key not in tree:
                break
            n += 1
        return n

    def pick(self, engines, rid: int) -> int:
        if self.trees is None:
            self.trees = [set() for _ in engines]
            self.sizes = [0] * len(engines)
        loads = [e.outstanding for e in engines]
        hi, lo = max(loads), min(loads)
        ids = self.prefix.of(rid).tolist()
        prompt = int(self.prompt[rid])
        unit = self.prefix.unit
        if hi - lo > self.BALANCE_ABS and hi > self.BALANCE_REL * lo:
            k = min(range(len(engines)), key=lambda i: (loads[i], i))
        else:
            matches = [self._match(tree, ids) for tree in self.trees]
            best = max(range(len(engines)), key=lambda i: (matches[i], -i))
            matched = min(matches[best] * unit, prompt)
            if prompt and matched / prompt > self.CACHE_THRESHOLD:
                k = best
            else:
                k = min(range(len(engines)), key=lambda i: (self.sizes[i], i))
        tree = self.trees[k]
        for i, key in enumerate(ids):
            if key not in tree:
                tree.add(key)
                self.sizes[k] += min(unit, prompt - i * unit)
        return k


class SessionAffinity:
    """Every turn of a session to the same replica, by a hash of the session id (consistent
    hashing on a session header, as the vLLM production-stack router's ``session`` routing and the
    SGLang Model Gateway's ``consistent_hashing`` policy do), whatever the loads."""

    def __init__(self, table, rng=None):
        if table.session is None:
            raise ConfigError("router session_affinity needs sessions (workload.sessions)", path="serving.router")
        self.session = table.session

    def pick(self, engines, rid: int) -> int:
        key = int(self.session[rid]).to_bytes(8, "little", signed=True)
        return zlib.crc32(key) % len(engines)


ROUTERS = {"round_robin": RoundRobin, "least_outstanding": LeastOutstanding, "least_kv": LeastKVLoad,
           "prefix_affinity": PrefixAffinity, "cache_aware": CacheAwareTree, "session_affinity": SessionAffinity}
"""``serving.router`` -> the router class."""

ROUTER_STREAM = 0x726F75
"""The router's random stream within the scenario's seed (its draws leave the workload's alone)."""


def make_router(name: str, table, seed: int, stream: int = 0):
    """The ``serving.router`` named ``name`` for ``table``, with its own random stream of ``seed``
    (``stream`` tells two routers of one run apart: the frontend's 0, the KV hand-off's 1)."""
    return ROUTERS[name](table, np.random.default_rng([seed, ROUTER_STREAM, stream]))
