"""The block pool owns a replica's KV blocks: conservation (private + free + cached = capacity) holds
through every change the scheduler, the prefix cache, preemption and speculative decoding make, is
checked at every step in debug runs, and a broken count raises the invariant's own error."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings as hsettings, strategies as st

import simulator
from simulator.invariants import INVARIANTS, InvariantError, checks_on, require
from simulator.pipelines.llm.block_pool import BlockPool
from simulator.pipelines.llm.prefix_cache import PrefixCache
from simulator.pipelines.llm.scheduler import Scheduler

from test_llm_scheduler import settings, step, table
from test_prefix_cache import Ids, finish


def test_grant_trim_release_keep_the_count():
    t = table([10, 10, 10])
    pool = BlockPool(t, 20)
    pool.grant(np.array([0, 1]), np.array([3, 4]))
    pool.grant(2, 5)
    assert (pool.free, pool.private, list(t.blocks[:3])) == (8, 12, [3, 4, 5])
    pool.trim(np.array([1, 2]), np.array([2, 2]))
    assert (pool.free, pool.private) == (13, 7)
    pool.release(np.array([0, 2]))
    assert (pool.free, pool.private, list(t.blocks[:3])) == (18, 2, [0, 2, 0])
    pool.check(np.array([0, 1, 2]))


def test_a_broken_count_names_the_invariant():
    t = table([10])
    pool = BlockPool(t, 8)
    pool.grant(0, 3)
    t.blocks[0] += 1  # a block taken behind the pool's back
    pool.check()  # the pool's own count still adds up ...
    with pytest.raises(InvariantError, match="BLOCKS_CONSERVED.*hold 4 private blocks, the pool counts 3"):
        pool.check(np.array([0]))  # ... the holders' blocks do not
    pool.free -= 1
    with pytest.raises(InvariantError, match="private 3 \\+ free 4 \\+ cached 0 != capacity 8"):
        pool.check()


def test_every_invariant_named_in_the_code_is_listed():
    with pytest.raises(AssertionError):
        require("NOT_AN_INVARIANT", False, "")
    assert {"BLOCKS_CONSERVED", "RUN_MATCHES_POOL", "WAIT_WITHIN", "FINISHED_ONCE"} <= set(INVARIANTS)


def test_shared_prefix_blocks_are_counted_once():
    t = table([64, 64])
    t.prefix = Ids([[5, 6], [5, 6]])
    s = Scheduler(t, settings(4096), 100, PrefixCache(t.prefix, 16))
    s.waiting.append(0)
    step(s)
    s.waiting.append(1)
    step(s)  # request 1 references request 0's two cached units (4 blocks)
    pool = s.pool
    assert (pool.private, pool.free, s.cache.cached_blocks) == (0 + 1, 100 - 4 - 1, 4)
    pool.check(s.holders())
    finish(s, [0, 1])
    assert pool.private == 0 and pool.free + s.cache.cached_blocks == 100
    pool.check(s.holders())


@hsettings(max_examples=60, deadline=None)
@given(prompts=st.lists(st.integers(1, 120), min_size=1, max_size=12), kv=st.integers(12, 60),
       unit_ids=st.lists(st.integers(0, 3), min_size=4, max_size=4), seed=st.integers(0, 2**16))
def test_conservation_holds_through_preemption_and_eviction(prompts, kv, unit_ids, seed):
    """Random prompts on a cache too small for them, with shared prefixes: the scheduler preempts,
    evicts and finishes; the pool's count and the holders' blocks agree at every step."""
    rng = np.random.default_rng(seed)
    need = max(-(-(p + 4) // 16) for p in prompts)
    t = table(prompts, [4] * len(prompts))
    # a prompt's first unit of 32 tokens, where it has a whole one, is one of 4 shared ids; the rest are its own
    t.prefix = Ids([[unit_ids[i % 4] if p >= 32 else 100 + 10 * i] + [100 + 10 * i + u for u in range(1, -(-p // 32))]
                    for i, p in enumerate(prompts)])
    s = Scheduler(t, settings(64), max(kv, need + 1), PrefixCache(t.prefix, 16))
    s.waiting.extend(range(len(prompts)))
    with checks_on():
        for _ in range(400):
            b = s.schedule()
            if b is None:
                break
            t.computed[b.decode] = b.comp + 1
            for rid, p, n in b.chunks:
                t.computed[rid] = p + n
            emit = np.concatenate([b.decode, [r for r, p, n in b.chunks if p + n >= t.target[r]]]).astype(np.int64)
            t.generated[emit] += 1
            done = emit[(t.generated[emit] >= t.output[emit]) | (rng.random(len(emit)) < 0.05)]
            if len(done):
                t.finished[done] = True
                s.finish(done)
    s.pool.check(s.holders())


MOONCAKE = "scenarios/llm/mooncake_conversation.yaml"
CHAT = "scenarios/llm/chat_trace_h100.yaml"
PD = {"name": "pd", "model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
      "disaggregation": {"prefill": {"replicas": 1}, "decode": {"replicas": 1}, "kv_link": "ib-400g",
                         "transfer": "whole"},
      "workload": {"requests": 60, "rate": 6, "prompt_tokens": 2000, "output_tokens": 50}}


@pytest.mark.parametrize("source, overrides", [
    (MOONCAKE, {"serving.prefix_caching": True, "serving.gpu_memory_utilization": 0.42}),
    (MOONCAKE, {"serving.prefix_caching": True, "serving.gpu_memory_utilization": 0.42,
                "serving.kv_offload": {"capacity": "64 GiB", "link": "pcie5-x16"}}),
    (CHAT, {"serving.speculative": {"method": "ngram", "tokens": 3}}),
    (CHAT, {"serving.overlap": "async", "serving.engine": "vllm-v1", "serving.gpu_memory_utilization": 0.3}),
    (CHAT, {}),  # the closed-form runs: RUN_MATCHES_POOL at the end of each
    (PD, {}),
], ids=["prefix", "offload", "speculative", "async", "runs", "disaggregated"])
def test_whole_runs_conserve_blocks_at_every_step(source, overrides):
    with checks_on():
        res = simulator.run(source, {"workload.requests": 200, "record_spans": False, **overrides},
                            last_mile_cost=False)
    assert res.summary["requests_completed"] > 50  # (the Mooncake scenario stops at its horizon)


def test_the_scheduler_checks_its_holders_blocks_at_every_step_in_debug_runs():
    t = table([40, 40])
    s = Scheduler(t, settings(4096), 100)
    s.waiting.extend([0, 1])
    step(s)
    t.blocks[1] += 1  # a block taken behind the pool's back
    s.schedule()  # not checked outside debug runs
    with checks_on(), pytest.raises(InvariantError, match="BLOCKS_CONSERVED.*private blocks"):
        s.schedule()
