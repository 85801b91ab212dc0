"""Routers across replicas: each policy's choice on tiny states, and its effect on a run."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import simulator as sim
from simulator.errors import ConfigError
from simulator.pipelines.llm.prefix_cache import PrefixCache
from simulator.pipelines.llm.routers import ROUTERS, make_router

from test_prefix_cache import Ids


def engines(outstanding, kv_used=None, caches=None, now=0.0):
    out = []
    clock = SimpleNamespace(now=now)
    for i, n in enumerate(outstanding):
        sched = SimpleNamespace(kv_total=100, kv_free=100 - (kv_used[i] if kv_used else 0),
                                cache=caches[i] if caches else None)
        out.append(SimpleNamespace(outstanding=n, sched=sched, env=clock))
    return out


def table(prefix=None, session=None):
    return SimpleNamespace(prefix=prefix, session=session)


def test_least_kv_takes_the_replica_with_the_fewest_blocks_held():
    assert ROUTERS["least_kv"](table()).pick(engines([0, 9, 9], kv_used=[50, 10, 30]), 0) == 1
    # idle cached prefixes are evictable: they do not count as load
    cache = SimpleNamespace(idle_blocks=45)
    two = engines([0, 0], kv_used=[50, 10], caches=[cache, SimpleNamespace(idle_blocks=0)])
    assert ROUTERS["least_kv"](table()).pick(two, 0) == 0


def test_least_kv_reads_the_loads_once_a_period_and_draws_among_equals():
    r = make_router("least_kv", table(), seed=7)
    state = engines([0, 0, 0, 0])
    first = [r.pick(state, i) for i in range(400)]  # a burst within one 50 ms period: every load reads 0
    counts = np.bincount(first, minlength=4)
    assert counts.min() > 60  # spread at random over the four equal replicas, not all to replica 0
    stale = engines([0, 0, 0, 0], kv_used=[0, 50, 50, 50], now=0.049)
    assert set(r.pick(stale, i) for i in range(40)) != {0}  # still the period's read: replica 0's lead unseen
    late = engines([5, 5, 5, 5], kv_used=[50, 50, 10, 50], now=0.050)
    assert r.pick(late, 0) == 2  # the next period reads replica 2's low load
    again = make_router("least_kv", table(), seed=7)
    assert [again.pick(engines([0, 0, 0, 0]), i) for i in range(20)] == first[:20]  # the same seed, the same draws


def test_a_burst_spreads_over_equal_replicas_under_least_kv():
    base = {"parallel": {"replicas": 4}, "serving": {"router": "least_kv"},
            "workload": {"requests": 64, "arrival": "closed", "concurrency": 64, "prompt_tokens": 200,
                         "output_tokens": 20}}
    counts = np.bincount(sim.run(base, last_mile_cost=False).requests["replica"], minlength=4)
    assert counts.min() >= 8 and counts.max() <= 24


def test_prefix_affinity_follows_the_longest_cached_prefix_while_loads_are_balanced():
    ids = Ids([[1, 2, 3], [1, 2, 9], [7, 8, 9]])
    caches = [PrefixCache(ids, 16), PrefixCache(ids, 16)]
    for key in (1, 2):
        caches[1].blocks[key] = 2
    r = ROUTERS["prefix_affinity"](table(prefix=ids))
    assert r.pick(engines([5, 9], caches=caches), 1) == 1    # 2 of 3 units cached on replica 1
    assert r.pick(engines([5, 9], caches=caches), 2) == 0    # nothing cached anywhere: the least loaded
    # loads too far apart (more than 64 and 1.5x): the least loaded, whatever the cache
    assert r.pick(engines([5, 90], caches=caches), 1) == 0


def test_session_affinity_sends_every_turn_of_a_session_to_one_replica():
    base = {"model": "llama-3-8b", "parallel": {"replicas": 3}, "serving": {"router": "session_affinity"},
            "workload": {"requests": 60, "rate": 4, "prompt_tokens": 200, "output_tokens": 20,
                         "sessions": {"turns": 4, "think_time": 2}}, "record_spans": False}
    r = sim.run(base)
    sc = sim.load_scenario(base)
    from simulator.workloads.arrivals import make_requests

    session = make_requests(sc.workload, np.random.default_rng(sc.seed), sc.model.context_length).session
    replica = r.requests["replica"].to_numpy()
    for s in np.unique(session):
        assert len(set(replica[session == s])) == 1
    assert len(set(replica)) > 1


def test_prefix_affinity_raises_the_hit_rate_over_round_robin():
    base = {"model": "llama-3-8b", "parallel": {"replicas": 4}, "serving": {"prefix_caching": True},
            "workload": {"requests": 300, "rate": 20, "prompt_tokens": 1024, "output_tokens": 32,
                         "prefix": {"shared_tokens": 768, "groups": 16}}, "record_spans": False}
    rr = sim.run(base, overrides={"serving.router": "round_robin"}).summary["prefix_cache"]["hit_rate"]
    pa = sim.run(base, overrides={"serving.router": "prefix_affinity"}).summary["prefix_cache"]["hit_rate"]
    assert pa > rr


@pytest.mark.parametrize("router", ["prefix_affinity", "session_affinity"])
def test_affinity_routers_need_the_identity_they_route_on(router):
    with pytest.raises(ConfigError) as exc:
        sim.run({"model": "llama-3-8b", "parallel": {"replicas": 2}, "serving": {"router": router},
                 "workload": {"requests": 4}})
    assert exc.value.path == "serving.router"
