"""How a request is spread over engine replicas: one class per ``serving.router``, named in ``ROUTERS``.

A router is made per frontend (it may keep state) and asked for a replica index for request
``rid``, given the engines (each has ``outstanding``: requests routed to it and not yet finished;
``sched``: its scheduler, with its KV-cache pool and, with prefix caching, its prefix cache) and
the request table.
"""

from __future__ import annotations

import zlib

from ...errors import ConfigError


class RoundRobin:
    """Replicas in turn, whatever their load (a plain load balancer in front of the replicas)."""

    def __init__(self, table):
        self._next = 0

    def pick(self, engines, rid: int) -> int:
        k = self._next
        self._next = (self._next + 1) % len(engines)
        return k


class LeastOutstanding:
    """The replica with the fewest unfinished requests, the lowest index on ties: a load-based
    choice, as vLLM's data-parallel coordinator and SGLang's router (when loads are imbalanced) make."""

    def __init__(self, table):
        pass

    def pick(self, engines, rid: int) -> int:
        return min(range(len(engines)), key=lambda i: (engines[i].outstanding, i))


class LeastKVLoad:
    """The replica with the fewest KV-cache blocks held by requests (idle cached prefixes do not
    count: they are evictable), then the fewest unfinished requests: the "KV cache utilization"
    scorer of llm-d's inference scheduler (llm-d/llm-d-inference-scheduler, ``kv-cache-utilization-scorer``)."""

    def __init__(self, table):
        pass

    def pick(self, engines, rid: int) -> int:
        def load(i):
            s = engines[i].sched
            idle = s.cache.idle_blocks if s.cache is not None else 0
            return (s.kv_total - s.kv_free - idle) / s.kv_total
        return min(range(len(engines)), key=lambda i: (load(i), engines[i].outstanding, i))


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

    def __init__(self, table):
        if table.prefix is None:
            raise ConfigError("router prefix_affinity needs prompts with prefix identity (a Mooncake .jsonl "
                              "trace, workload.prefix or workload.sessions)", path="serving.router")
        self.prefix = table.prefix

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


class SessionAffinity:
    """Every turn of a session to the same replica, by a hash of the session id (consistent
    hashing on a session header, as the vLLM production-stack router's ``session`` routing and the
    SGLang Model Gateway's ``consistent_hashing`` policy do), whatever the loads."""

    def __init__(self, table):
        if table.session is None:
            raise ConfigError("router session_affinity needs sessions (workload.sessions)", path="serving.router")
        self.session = table.session

    def pick(self, engines, rid: int) -> int:
        key = int(self.session[rid]).to_bytes(8, "little", signed=True)
        return zlib.crc32(key) % len(engines)


ROUTERS = {"round_robin": RoundRobin, "least_outstanding": LeastOutstanding, "least_kv": LeastKVLoad,
           "prefix_affinity": PrefixAffinity, "session_affinity": SessionAffinity}
"""``serving.router`` -> the router class."""
