"""A replica's KV-cache blocks, owned in one place: the free count, each request's blocks, the prefix cache's share.

vLLM V1 keeps its blocks in one ``BlockPool`` (``vllm/v1/core/block_pool.py``) that the KV-cache
manager allocates from and frees to; nano-vllm keeps its ``BlockManager`` apart from its scheduler
the same way. Here the scheduler, the prefix cache's look-ups and evictions, the host tier's loads,
speculative decoding's rejected slots, the disaggregated hand-off and the closed-form runs all change
blocks through this class, and nothing else writes the free count or the table's ``blocks`` column.

A request's ``blocks`` include ``shared[rid]`` references to prefix units the cache holds (counted
once in ``cache.cached_blocks`` however many requests share them); the rest are its private blocks.
Invariant BLOCKS_CONSERVED: private + free + cached = capacity, none negative.
"""

from __future__ import annotations

import numpy as np

from ...invariants import checking, require


class BlockPool:
    """The KV blocks of one replica: ``total`` of them, ``free`` unallocated, ``private`` held by
    requests alone; the table's ``blocks`` column says how many each request holds."""

    def __init__(self, table, total: int, cache=None):
        self.table = table
        self.total = total
        self.free = total
        self.private = 0
        self.cache = cache
        self.shared: dict[int, int] = {}  # request -> blocks of its ``blocks`` that are cached units

    @property
    def used(self) -> int:
        """Blocks not free: held by requests or by the prefix cache."""
        return self.total - self.free

    def fits(self, n: int) -> bool:
        """Whether ``n`` more blocks can be had, evicting idle cached prefixes when the free pool is
        short (vLLM's free queue hands out cached blocks nobody uses, least recently used first)."""
        return self.make_room(n, self.free) is not None

    def make_room(self, n: int, free: int) -> int | None:
        """For ``n`` more blocks where ``free`` are free (the pool's count, or a closed-form run's as it
        stands): the blocks freed by evicting idle cached prefixes, least recently used first, only
        as many as are short (0 where none are); None, evicting nothing, where even every idle one would
        not make room. The one eviction rule of :meth:`fits` and of the runs."""
        if n <= free:
            return 0
        cache = self.cache
        if cache is None or n > free + cache.idle_blocks:
            return None
        freed = cache.evict(n - free)
        self.free += freed
        return freed

    def grant(self, ids, need) -> None:
        """Give request(s) ``ids`` ``need`` more blocks each (the caller has checked they fit)."""
        total = int(need) if isinstance(need, int) else int(need.sum())  # a method: np.sum costs a step ~3 us
        if checking():
            require("BLOCKS_CONSERVED", np.all(np.asarray(need) >= 0), lambda: f"a grant of {need} blocks to {ids}")
        if total:
            self.free -= total
            self.private += total
            self.table.blocks[ids] += need

    def adopt(self, rid: int, blocks: int) -> None:
        """A request admitted with a cached prefix holds ``blocks`` of the cache's blocks (shared)."""
        self.table.blocks[rid] = blocks
        self.shared[rid] = blocks

    def to_cache(self, rid: int, moved: int) -> None:
        """``moved`` of the request's private blocks became cached units (it still references them)."""
        if moved:
            self.shared[rid] = self.shared.get(rid, 0) + moved
            self.private -= moved

    def trim(self, ids, keep) -> None:
        """Request(s) ``ids`` keep ``keep`` blocks each and free the rest (speculative decoding's
        rejected slots)."""
        blocks = self.table.blocks
        freed = int((blocks[ids] - keep).sum())
        self.free += freed
        self.private -= freed
        blocks[ids] = keep

    def release(self, ids) -> None:
        """Free every block of request(s) ``ids`` (finished, preempted or handed off): private ones to
        the free pool, references to cached units back to the cache."""
        blocks = self.table.blocks
        freed = int(blocks[ids].sum())
        if self.cache is not None:
            freed -= sum(self._unshare(r) for r in np.atleast_1d(ids).tolist())
        self.free += freed
        self.private -= freed
        blocks[ids] = 0

    def leave(self, rid: int, blocks: int) -> int:
        """Request ``rid`` leaves a closed-form run holding ``blocks`` (the run's count; those it gained
        in the run not yet granted here): they are granted, then released as :meth:`release` releases
        them (its cached prefix units back to the cache, in its order). Returns the private blocks
        freed."""
        self.settle(np.array([rid]), np.array([blocks]))
        before = self.free
        self.release(rid)
        return self.free - before

    def _unshare(self, rid: int) -> int:
        self.cache.release(rid)
        return self.shared.pop(rid, 0)

    def settle(self, ids, blocks) -> None:
        """Set the blocks of requests ``ids`` to ``blocks`` after a closed-form run played their steps:
        the free count moves by what they gained or gave back (private blocks: a request's shared ones
        stay as they are, released by :meth:`release`)."""
        delta = int(blocks.sum()) - int(self.table.blocks[ids].sum())
        self.free -= delta
        self.private += delta
        self.table.blocks[ids] = blocks

    def check(self, live=None) -> None:
        """BLOCKS_CONSERVED; with ``live`` (every request that may hold blocks here), also that the
        table's blocks of those requests, less their shared ones, are the private count."""
        cached = self.cache.cached_blocks if self.cache is not None else 0
        require("BLOCKS_CONSERVED", self.free >= 0 and self.private >= 0 and cached >= 0
                and self.private + self.free + cached == self.total,
                lambda: f"private {self.private} + free {self.free} + cached {cached} != capacity {self.total}")
        if live is not None:
            held = int(self.table.blocks[live].sum()) - sum(self.shared.values())
            require("BLOCKS_CONSERVED", held == self.private,
                    lambda: f"requests hold {held} private blocks, the pool counts {self.private}")
