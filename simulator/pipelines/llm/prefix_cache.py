"""A replica's prefix cache: KV blocks of prompt prefixes kept for reuse, as vLLM's automatic prefix
caching keeps them.

vLLM V1 (``vllm/v1/core/kv_cache_manager.py`` and ``block_pool.py``, github.com/vllm-project/vllm,
v0.10-v0.11) hashes every full block of a prompt chained to the blocks before it, so a block hash
names the whole prefix up to it; a new request looks its block hashes up in order and stops at the
first miss (``get_computed_blocks``); blocks are cached as soon as they are allocated for a step
(``cache_blocks`` in ``allocate_slots``), so a request scheduled later in the same step already
hits; a block whose reference count drops to zero stays cached in the free queue and is evicted
least-recently-used first when a new allocation needs it; a full hit still recomputes the prompt's
last token (it needs its logits). SGLang's RadixAttention (Zheng et al., 2024, §3) reuses prefixes
the same way with a radix tree and LRU eviction.

Here a cached *unit* is one id of the workload's :class:`~simulator.workloads.prefix.PrefixIds`
(``unit`` tokens: 512 for the Mooncake traces, whose ids hash 512-token blocks; 16 for synthetic
prefixes), occupying ``ceil(tokens / block_size)`` KV blocks. Ids already name prefixes (equal ids
at the same leading positions mean the same prefix), so a request's hit is the run of its leading
ids found in the cache. The cache holds units referenced by running requests (active) and units
nobody references (idle, LRU order); only idle units are evicted. Blocks of a unit are counted once
however many requests share it.
"""

from __future__ import annotations

from collections import OrderedDict

from .run_support import declare

# How closed-form runs of steps cover the serving keys this module owns (run_support).
declare("prefix_caching", owner="prefix_cache")  # inserting at allocation only: run_support.ENGINE_CONDITIONS
declare("prefix_cache_insert", owner="prefix_cache")


class PrefixCache:
    """Cached prefix units of one replica: id -> blocks, reference counts and the idle LRU order.

    The KV cache's own size bounds it: the scheduler asks :meth:`evict` for blocks when its free
    pool runs short."""

    def __init__(self, prefix, block_size: int):
        self.prefix = prefix
        self.block_size = block_size
        self.refs: dict[int, int] = {}
        self.blocks: dict[int, int] = {}
        self.idle: OrderedDict[int, int] = OrderedDict()  # id -> blocks, least recently used first
        self.idle_blocks = 0
        self.cached_blocks = 0
        # per request: ids it references in the cache, and how many of its leading units it has
        # looked up or registered (units below this are settled)
        self.held: dict[int, list[int]] = {}
        self.settled: dict[int, int] = {}
        self.on_evict = None  # called with (id, blocks) for each evicted unit (the offload tier)
        self.on_register = None  # called with (id, blocks) for each unit that joins the cache
        # what the summary reports
        self.query_units = 0
        self.hit_units = 0
        self.query_tokens = 0
        self.hit_tokens = 0
        self.saved_tokens = 0
        self.evicted_units = 0

    def notify(self, on_evict=None, on_register=None) -> None:
        """Call ``on_evict(id, blocks)`` for each unit evicted and ``on_register(id, blocks)`` for each that
        joins the cache (a host tier's copies)."""
        self.on_evict, self.on_register = on_evict, on_register

    def unit_tokens(self, rid: int, i: int, prompt: int) -> int:
        """Tokens of request ``rid``'s unit ``i`` (the last unit may be partial)."""
        unit = self.prefix.unit
        return min(unit, prompt - i * unit)

    def _unit_blocks(self, i: int, tokens: int) -> int:
        """KV blocks a prompt's unit ``i`` of ``tokens`` tokens holds: those its tokens complete or begin
        past the units before it, so that a request's first h units hold the blocks of their tokens
        together (ceil(tokens / block_size)) whether a unit is whole blocks or not (16-token units in
        32-token blocks: units 0, 2, 4 ... hold a block each, shared with the unit after, which holds none)."""
        start = i * self.prefix.unit
        return -(-(start + tokens) // self.block_size) - -(-start // self.block_size)

    def match(self, rid: int, prompt: int, count: bool = True) -> tuple[int, int]:
        """Look up request ``rid``'s leading units and reference the hits; returns (cached tokens,
        their KV blocks). At most ``prompt - 1`` tokens count as computed (the last one is recomputed
        for its logits), but every hit unit is referenced. ``count``: add it to the hit statistics
        (a request's first lookup only; a preempted request looks up again without counting)."""
        ids = self.prefix.of(rid)
        hits = 0
        tokens = 0
        blocks = 0
        held = self.held.setdefault(rid, [])
        for i, key in enumerate(ids.tolist()):
            key = int(key)
            if key not in self.blocks:
                break
            self._ref(key)
            held.append(key)
            hits += 1
            n = self.unit_tokens(rid, i, prompt)
            tokens += n
            blocks += self.blocks[key]
        self.settled[rid] = hits
        if count:
            self.query_units += len(ids)
            self.hit_units += hits
            self.query_tokens += prompt
            self.hit_tokens += tokens
            self.saved_tokens += min(tokens, prompt - 1)
        return min(tokens, prompt - 1), blocks

    def _ref(self, key: int) -> None:
        r = self.refs[key]
        if r == 0:
            self.idle_blocks -= self.idle.pop(key)
        self.refs[key] = r + 1

    def register(self, rid: int, covered: int, prompt: int) -> int:
        """Cache request ``rid``'s units that its KV now covers (``covered`` tokens, at scheduling
        time as vLLM caches blocks on allocation); returns the private blocks that moved to the
        cache. A unit already cached (computed twice, by two requests at once) stays private."""
        ids = self.prefix.of(rid)
        unit = self.prefix.unit
        i = self.settled.get(rid, 0)
        moved = 0
        held = self.held.setdefault(rid, [])
        while i < len(ids):
            tokens = self.unit_tokens(rid, i, prompt)
            if i * unit + tokens > covered:
                break
            key = int(ids[i])
            if key not in self.blocks:
                b = self._unit_blocks(i, tokens)
                self.blocks[key] = b
                self.refs[key] = 1
                self.cached_blocks += b
                held.append(key)
                moved += b
                if self.on_register is not None:
                    self.on_register(key, b)
            i += 1
        self.settled[rid] = i
        return moved

    def release(self, rid: int) -> None:
        """Request ``rid`` no longer references its units (it finished or was preempted): those
        nobody else references become idle, most recently used last, the prompt's tail first (vLLM's
        ``free_blocks`` takes a request's blocks in reverse order "so that the tail blocks are evicted
        first": evicting a prefix's head would strand the rest of it)."""
        for key in reversed(self.held.pop(rid, ())):
            r = self.refs[key] - 1
            self.refs[key] = r
            if r == 0:
                self.idle[key] = self.blocks[key]
                self.idle_blocks += self.blocks[key]
        self.settled.pop(rid, None)

    def evict(self, blocks: int) -> int:
        """Evict idle units, least recently used first, until ``blocks`` are freed or none is left;
        returns the blocks freed."""
        freed = 0
        while freed < blocks and self.idle:
            key, b = self.idle.popitem(last=False)
            del self.blocks[key], self.refs[key]
            self.idle_blocks -= b
            self.cached_blocks -= b
            self.evicted_units += 1
            freed += b
            if self.on_evict is not None:
                self.on_evict(key, b)
        return freed

    def longest_prefix(self, rid: int) -> int:
        """How many of request ``rid``'s leading units this cache holds (for prefix-affinity routing)."""
        n = 0
        for key in self.prefix.of(rid).tolist():
            if int(key) not in self.blocks:
                break
            n += 1
        return n

    def stats(self) -> dict:
        return {"query_units": self.query_units, "hit_units": self.hit_units, "query_tokens": self.query_tokens,
                "hit_tokens": self.hit_tokens, "saved_tokens": self.saved_tokens, "evicted_units": self.evicted_units,
                "cached_blocks": self.cached_blocks}


def merged_stats(caches) -> dict | None:
    """The replicas' cache statistics summed, with hit rates (None without prefix caching)."""
    caches = [c for c in caches if c is not None]
    if not caches:
        return None
    total = {k: sum(c.stats()[k] for c in caches) for k in caches[0].stats()}
    qt, qu = total["query_tokens"], total["query_units"]
    return {"hit_rate": total["hit_tokens"] / qt if qt else None,
            "block_hit_rate": total["hit_units"] / qu if qu else None,
            "saved_prefill_tokens": total["saved_tokens"],
            "queried_tokens": qt, "evicted_units": total["evicted_units"]}
