"""Prefix caching in the scheduler: closed forms on tiny tables (block size 16, units of 32 tokens)."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.pipelines.llm.prefix_cache import PrefixCache
from simulator.pipelines.llm.scheduler import Scheduler

from test_llm_scheduler import settings, step, table


class Ids:
    """PrefixIds of hand-written id lists (the workload module builds these from traces)."""

    def __init__(self, lists, unit=32):
        self.unit = unit
        self.offsets = np.cumsum([0] + [len(x) for x in lists])
        self.ids = np.array([i for x in lists for i in x], dtype=np.int64)

    def of(self, rid):
        return self.ids[self.offsets[rid]:self.offsets[rid + 1]]


def cached(prompts, ids, kv_blocks=10_000, budget=4096):
    t = table(prompts)
    t.prefix = Ids(ids)
    return t, Scheduler(t, settings(budget), kv_blocks, PrefixCache(t.prefix, 16))


def finish(s, rids):
    s.table.finished[rids] = True
    s.finish(np.array(rids))


def test_a_later_request_prefills_only_the_uncached_suffix():
    t, s = cached([100, 100], [[1, 2, 3, 4], [1, 2, 9, 10]])
    s.waiting.append(0)
    assert step(s).chunks == [(0, 0, 100)]
    s.waiting.append(1)
    b = step(s)
    assert b.chunks == [(1, 64, 36)]  # units 1 and 2 (64 tokens) were cached by request 0
    assert s.cache.hit_units == 2 and s.cache.query_units == 8 and s.cache.saved_tokens == 64


def test_a_full_hit_recomputes_the_last_prompt_token():
    t, s = cached([64, 64], [[5, 6], [5, 6]])
    s.waiting.append(0)
    step(s)
    s.waiting.append(1)
    assert step(s).chunks == [(1, 63, 1)]
    assert s.cache.hit_tokens == 64 and s.cache.saved_tokens == 63


def test_requests_admitted_in_the_same_step_hit_what_the_first_allocated():
    # vLLM caches a block when it is allocated for a step, so the second request hits at once
    t, s = cached([64, 96], [[7, 8], [7, 8, 9]])
    s.waiting.extend([0, 1])
    assert step(s).chunks == [(0, 0, 64), (1, 64, 32)]


def test_shared_blocks_are_held_once():
    # two running requests sharing their first 64 tokens hold the shared blocks once
    t, s = cached([100, 100], [[1, 2, 3, 4], [1, 2, 5, 6]], kv_blocks=100)
    s.waiting.extend([0, 1])
    step(s)
    # request 0: ceil(100/16) = 7 blocks; request 1 shares 4 of them and allocates 7 - 4 = 3
    assert s.kv_free == 100 - 7 - 3
    finish(s, [0, 1])
    # every block is free or idle in the cache
    assert s.kv_free + s.cache.idle_blocks == 100
    assert s.cache.idle_blocks == s.cache.cached_blocks


def test_idle_units_are_evicted_least_recently_used_first():
    # 8 blocks; each request's prompt is one 32-token unit (2 blocks) and it finishes at once
    t, s = cached([32, 32, 32, 32, 64], [[1], [2], [3], [1], [4, 5]], kv_blocks=8)
    for rid in range(4):
        s.waiting.append(rid)
        step(s)
        finish(s, [rid])
    # unit 1 was used again last (request 3 hit it): the least recently used are 2, then 3
    assert list(s.cache.idle) == [2, 3, 1]
    s.waiting.append(4)  # needs 4 blocks, 2 are free: evicts unit 2 (2 blocks)
    assert step(s).chunks == [(4, 0, 64)]
    assert 2 not in s.cache.blocks and 3 in s.cache.blocks and 1 in s.cache.blocks


def test_preemption_releases_the_prefix_and_readmission_hits_it_again_uncounted():
    t, s = cached([64, 64], [[1, 2], [3, 4]], kv_blocks=100)
    s.waiting.append(0)
    step(s)
    s.running.remove(0)
    s._run_arr = None
    s.preempt(0)
    assert s.cache.idle_blocks == 4 and s.kv_free == 100 - 4
    b = step(s)
    assert b.chunks == [(0, 63, 1)]
    assert s.cache.query_units == 2 and s.cache.hit_units == 0  # the second look-up is not counted


MOONCAKE = "scenarios/llm/mooncake_conversation.yaml"


def _mooncake(root, memory, requests=300):
    import simulator as sim

    over = {"serving.prefix_caching": True, "hardware.gpu": {"base": "h100-sxm", "memory": memory},
            "record_spans": False, "workload.requests": requests}
    return sim.run(root / MOONCAKE, overrides=over).summary["prefix_cache"]


@pytest.mark.slow
def test_an_unbounded_cache_hits_exactly_the_traces_own_block_reuse(root):
    """The acceptance check of issue 15: on the Mooncake conversation trace replayed as published,
    the block hit rate with a cache that never evicts is the closed-form reuse of its hash_ids."""
    import simulator as sim
    from simulator.workloads.arrivals import make_requests

    pytest = __import__("pytest")
    if not (root.parent / "shared" / "traces" / "mooncake_conversation.jsonl").is_file():
        pytest.skip("../shared/traces is not beside the checkout")
    sc = sim.load_scenario(root / MOONCAKE, overrides={"workload.requests": 300})
    prefix = make_requests(sc.workload, np.random.default_rng(sc.seed), sc.model.context_length).prefix
    unbounded = _mooncake(root, "4 TB")
    assert unbounded["evicted_units"] == 0
    assert unbounded["block_hit_rate"] == prefix.reuse() > 0.05
    # and it falls as the cache shrinks
    rates = [unbounded["block_hit_rate"]] + [_mooncake(root, m)["block_hit_rate"] for m in ("400 GB", "80 GB")]
    assert rates[0] > rates[1] > rates[2]


def test_after_step_insertion_lets_no_request_of_a_batch_hit_another():
    """SGLang inserts a prefix into its radix tree after the forward that computed it: two requests of
    one group admitted in the same step both compute the shared prefix; a later one hits it."""
    from dataclasses import replace

    t = table([64, 96, 64])
    t.prefix = Ids([[7, 8], [7, 8, 9], [7, 8]])
    s = Scheduler(t, replace(settings(4096), prefix_cache_insert="after_step"), 10_000, PrefixCache(t.prefix, 16))
    s.waiting.extend([0, 1])
    assert step(s).chunks == [(0, 0, 64), (1, 0, 96)]
    pending, s.to_register = s.to_register, []
    assert not s.cache.blocks  # nothing is visible until the step is processed
    s.register_computed(pending)
    assert set(s.cache.blocks) == {7, 8, 9}
    s.waiting.append(2)
    assert step(s).chunks == [(2, 63, 1)]
