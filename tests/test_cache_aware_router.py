"""SGLang's cache-aware router (serving.router: cache_aware): its own tree of routed prompts, closed forms."""

from __future__ import annotations

import numpy as np
import pytest

import simulator as sim
from simulator.errors import ConfigError
from simulator.pipelines.llm.routers import CacheAwareTree

from test_prefix_cache import Ids


class Table:
    def __init__(self, prompts, ids, unit=32):
        self.prompt = np.array(prompts)
        self.prefix = Ids(ids, unit)


class Engine:
    def __init__(self):
        self.outstanding = 0


def route(router, engines, rids):
    out = []
    for rid in rids:
        k = router.pick(engines, rid)
        engines[k].outstanding += 1
        out.append(k)
    return out


def test_a_burst_follows_the_first_request_of_its_prefix_before_any_replica_cached_it():
    # four 128-token prompts: two groups sharing their first 96 tokens (3 of 4 units); nothing has run
    t = Table([128] * 4, [[1, 2, 3, 10], [5, 6, 7, 11], [1, 2, 3, 12], [5, 6, 7, 13]])
    r = CacheAwareTree(t)
    engines = [Engine(), Engine()]
    # request 0: empty trees -> smallest tree, worker 0; request 1: no match -> smallest tree, worker 1;
    # requests 2 and 3 match 96/128 = 0.75 > 0.5 of their group's worker
    assert route(r, engines, range(4)) == [0, 1, 0, 1]
    assert r.sizes == [128 + 32, 128 + 32]  # the shared units are counted once per worker


def test_a_match_at_or_below_the_threshold_goes_to_the_smallest_tree():
    t = Table([128, 64, 128], [[1, 2, 3, 4], [8, 9], [1, 2, 5, 6]])
    r = CacheAwareTree(t)
    engines = [Engine(), Engine()]
    # request 2 matches 64 of 128 tokens on worker 0: 0.5 is not above the threshold; worker 1's tree
    # (64 tokens) is smaller than worker 0's (128)
    assert route(r, engines, range(3)) == [0, 1, 1]


def test_imbalanced_loads_go_to_the_least_loaded_worker():
    t = Table([128, 128], [[1, 2, 3, 4], [1, 2, 3, 5]])
    r = CacheAwareTree(t)
    engines = [Engine(), Engine()]
    assert r.pick(engines, 0) == 0
    engines[0].outstanding = 40  # 40 - 0 > 32 and 40 > 1.0001 x 0
    assert r.pick(engines, 1) == 1


def test_it_needs_prefix_identity():
    with pytest.raises(ConfigError) as exc:
        sim.run({"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"}, "parallel": {"replicas": 2},
                 "serving": {"router": "cache_aware"}, "workload": {"requests": 4}})
    assert exc.value.path == "serving.router" and "\n" not in str(exc.value)
