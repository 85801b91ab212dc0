"""The host-memory KV tier: swaps instead of recompute, evicted prefix units loaded back, errors."""

from __future__ import annotations

import numpy as np
import pytest

import simulator as sim
from simulator.errors import ConfigError
from simulator.pipelines.llm.kv_offload import HostTier
from simulator.pipelines.llm.prefix_cache import PrefixCache
from simulator.pipelines.llm.scheduler import Scheduler

from test_llm_scheduler import settings, step, table
from test_prefix_cache import Ids


class Copies:
    """An Offloader without time: records the copies; a load completes when the test says."""

    def __init__(self, capacity: float, block_bytes: float = 1.0):
        self.tier = HostTier(capacity, block_bytes)
        self.out: list[float] = []
        self.loads: list[tuple[int, float]] = []
        self.pending = []
        self.wake = None
        self.write_through = False

    def unit_evicted(self, key, blocks):
        self.out.append(self.tier.store(key, blocks))

    def swap_out(self, rid, blocks, tokens):
        self.out.append(self.tier.store(("swap", rid), blocks, tokens))

    def load(self, rid, nbytes, done):
        self.loads.append((rid, nbytes))
        self.pending.append(done)


def test_a_preempted_request_is_swapped_out_and_loaded_back_instead_of_recomputed():
    t = table([100, 40])
    copies = Copies(capacity=1e9)
    s = Scheduler(t, settings(4096), 100, offload=copies)
    s.waiting.append(0)
    step(s)  # request 0's prompt: 7 blocks
    t.generated[0] = 1
    s.running.remove(0)
    s._run_arr = None
    s.preempt(0)
    assert copies.out == [7.0] and s.kv_free == 100
    assert s.schedule() is None  # request 0 waits out of the queue for its copy
    assert copies.loads == [(0, 7.0)] and s.kv_free == 93 and 0 in s.loading
    copies.pending.pop()()
    # back at the head of the queue with its 100 tokens computed: only the sampled token is left
    assert step(s).chunks == [(0, 100, 1)]
    assert copies.tier.loads == 1 and not copies.tier.has(("swap", 0))


def test_an_evicted_prefix_unit_goes_to_host_memory_and_a_later_hit_loads_it():
    t = table([64, 64, 64])
    t.prefix = Ids([[1, 2], [3, 4], [1, 2]])
    copies = Copies(capacity=1e9)
    s = Scheduler(t, settings(4096), 4, PrefixCache(t.prefix, 16), offload=copies)
    s.waiting.append(0)
    step(s)
    t.finished[0] = True
    s.finish(np.array([0]))
    s.waiting.append(1)  # needs the 4 blocks request 0's units hold: both are evicted to the host
    step(s)
    assert copies.out == [2.0, 2.0] and copies.tier.has(1) and copies.tier.has(2)
    t.finished[1] = True
    s.finish(np.array([1]))
    s.waiting.append(2)  # its prefix [1, 2] is not on the GPU any more, but in host memory
    assert s.schedule() is None and copies.loads == [(2, 4.0)]
    copies.pending.pop()()
    assert step(s).chunks == [(2, 63, 1)]  # loaded, not recomputed: the last token only


def test_write_through_copies_each_prefix_unit_out_once_when_it_is_cached():
    t = table([64, 64])
    t.prefix = Ids([[1, 2], [1, 2]])
    copies = Copies(capacity=1e9)
    copies.write_through = True
    s = Scheduler(t, settings(4096), 100, PrefixCache(t.prefix, 16), offload=copies)
    s.waiting.extend([0, 1])
    step(s)
    assert copies.out == [2.0, 2.0]  # units 1 and 2, copied when request 0 allocated them; request 1 hit them


def test_a_full_tier_drops_its_least_recently_used_entries():
    tier = HostTier(capacity=4.0, block_bytes=1.0)
    assert tier.store(1, 2) == 2 and tier.store(2, 2) == 2
    tier.take(1)  # 1 is used again: 2 is now the least recently used
    assert tier.store(3, 2) == 2
    assert list(tier.entries) == [1, 3] and tier.dropped == 1
    assert tier.store(4, 5) == 0  # larger than the tier: not kept


BASE = {"name": "offload", "model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
        "serving": {"gpu_memory_utilization": 0.3, "kv_offload": {"capacity": "64 GiB"}},
        "workload": {"requests": 120, "rate": 20, "prompt_tokens": 3000, "output_tokens": 600}}


def test_under_memory_pressure_swaps_restore_tokens_over_the_host_link():
    r = sim.run(BASE)
    off = r.summary["kv_offload"]
    assert r.summary["preemptions"] > 0
    assert off["loads"] > 0 and off["loaded_tokens"] > 0
    assert off["stored_bytes"] >= off["loaded_bytes"] > 0
    names = set(r.spans["name"])
    assert any(n.startswith("swap out r") for n in names) and any(n.startswith("load r") for n in names)
    assert set(r.spans.loc[r.spans["name"].str.startswith("load r"), "track"]) == {"link:gpu0.pcie.rx"}


@pytest.mark.parametrize("over, path", [
    ({"serving.kv_offload.link": {"base": "pcie5-x16", "bandwidth": 0}}, "serving.kv_offload.link.bandwidth"),
    ({"serving.kv_offload.capacity": 0}, "serving.kv_offload.capacity"),
    ({"serving.kv_offload.link": "pcie9"}, "serving.kv_offload.link"),
])
def test_bad_offload_tiers_are_one_line_errors(over, path):
    with pytest.raises(ConfigError) as exc:
        sim.load_scenario(BASE, overrides=over)
    assert exc.value.path == path and "\n" not in str(exc.value)
