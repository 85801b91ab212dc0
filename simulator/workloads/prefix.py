"""Prefix identity of prompts: which leading blocks of a request's prompt an earlier request already sent.

A prompt is cut into consecutive blocks of ``unit`` tokens (the last may be partial) and each block
gets an id; two requests whose ids agree on their first k positions share their first k blocks of
prompt, which a prefix cache may reuse. Every source here also keeps ids naming whole prefixes: an
id recurs only at the same position after the same id (a .jsonl trace that breaks this is rejected),
so a cache may key blocks by id alone. The ids say nothing else: a block's id is only compared
with the ids at the same position of prompts whose earlier ids are the same (the chain), as vLLM's
block hash covers the block and every block before it (vllm/v1/core/kv_cache_utils.py at commit
001cabc1, ``hash_block_tokens``: the parent block's hash is part of the key).

Three sources fill them: a Mooncake trace's ``hash_ids`` (512-token blocks, read by
:mod:`simulator.config.trace`), and :func:`stream_ids` for the synthetic workloads (shared system
prompts and multi-turn sessions, :mod:`simulator.workloads.sessions`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config.trace import MOONCAKE_BLOCK_TOKENS, TraceRows


def blocks_of(prompt: np.ndarray, unit: int) -> np.ndarray:
    """Blocks of ``unit`` tokens that cover each prompt: ceil(prompt / unit)."""
    return -(-np.asarray(prompt, dtype=np.int64) // unit)


@dataclass
class PrefixIds:
    """Per request, ids of its prompt's consecutive blocks of ``unit`` tokens; equal ids at the same
    leading positions mean a shared (reusable) prefix. The last block may be partial."""

    unit: int            # tokens per id (512 for Mooncake traces)
    offsets: np.ndarray  # int64, len n+1; request i's ids are ids[offsets[i]:offsets[i+1]]
    ids: np.ndarray      # int64 flat

    def __post_init__(self):
        self.offsets = np.asarray(self.offsets, dtype=np.int64)
        self.ids = np.asarray(self.ids, dtype=np.int64)
        if self.unit < 1:
            raise ValueError(f"unit must be at least one token, got {self.unit}")
        off = self.offsets
        if off.ndim != 1 or off.size < 1 or off[0] != 0 or off[-1] != self.ids.size or np.any(np.diff(off) < 0):
            raise ValueError("offsets must start at 0, never decrease and end at len(ids)")

    @classmethod
    def from_lists(cls, unit: int, lists) -> "PrefixIds":
        """From one sequence of ids per request."""
        lengths = np.fromiter((len(x) for x in lists), dtype=np.int64)
        offsets = np.zeros(lengths.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.fromiter((v for x in lists for v in x), dtype=np.int64, count=int(offsets[-1]))
        return cls(unit, offsets, flat)

    def of(self, rid: int) -> np.ndarray:
        """Request ``rid``'s block ids, first block first."""
        return self.ids[self.offsets[rid]:self.offsets[rid + 1]]

    def __len__(self) -> int:
        return self.offsets.size - 1

    @property
    def blocks(self) -> np.ndarray:
        """Blocks per request."""
        return np.diff(self.offsets)

    def check(self, prompt: np.ndarray) -> None:
        """Raise ValueError unless request i has exactly ceil(prompt_i / unit) ids."""
        prompt = np.asarray(prompt, dtype=np.int64)
        if prompt.size != len(self):
            raise ValueError(f"{len(self)} requests of prefix ids for {prompt.size} prompts")
        bad = np.flatnonzero(self.blocks != blocks_of(prompt, self.unit))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"request {i}: {self.blocks[i]} ids of {self.unit} tokens do not cover a prompt "
                             f"of {prompt[i]} tokens (needs {blocks_of(prompt[i:i + 1], self.unit)[0]})")

    def hit_blocks(self) -> np.ndarray:
        """Per request, its leading blocks that an earlier request already sent: the longest k such that
        some earlier request's first k ids equal this one's (a prefix tree of the ids, walked in order)."""
        ids, off = self.ids.tolist(), self.offsets.tolist()
        nodes: dict[tuple[int, int], int] = {}
        hits = np.zeros(len(self), dtype=np.int64)
        for i in range(len(self)):
            parent, h, seen = -1, 0, True
            for j in range(off[i], off[i + 1]):
                key = (parent, ids[j])
                node = nodes.get(key)
                if node is None:
                    node = nodes[key] = len(nodes)
                    seen = False  # a new node: every deeper one is new too
                elif seen:
                    h += 1
                parent = node
            hits[i] = h
        return hits

    def reuse(self) -> float:
        """Closed form: over requests in order, the fraction of all blocks that are leading blocks already
        seen (same id at same position chain) in an earlier request; what an unbounded prefix cache
        that keeps every block of every prompt hits (0 with no blocks)."""
        total = self.ids.size
        return float(self.hit_blocks().sum() / total) if total else 0.0

    def take(self, rows: np.ndarray, shift: np.ndarray | None = None) -> "PrefixIds":
        """The requests at ``rows`` (in that order), each request's ids plus ``shift[k]`` when given."""
        rows = np.asarray(rows, dtype=np.int64)
        lengths = self.blocks[rows]
        offsets = np.zeros(rows.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        src = np.repeat(self.offsets[rows] - offsets[:-1], lengths) + np.arange(offsets[-1], dtype=np.int64)
        ids = self.ids[src]
        if shift is not None:
            ids = ids + np.repeat(np.asarray(shift, dtype=np.int64), lengths)
        return PrefixIds(self.unit, offsets, ids)

    def head(self, n: int | None) -> "PrefixIds":
        """The first ``n`` requests (all for None), as copies."""
        n = len(self) if n is None else min(n, len(self))
        return PrefixIds(self.unit, self.offsets[:n + 1].copy(), self.ids[:self.offsets[n]].copy())

    def repeated(self, n: int) -> "PrefixIds":
        """n requests replayed from these: request i is row i mod rows of repetition k = i // rows, its
        ids shifted by k x (largest id + 1), so each repetition is a fresh set of users that shares no
        block with the others (as :func:`simulator.config.trace.repeated_rows` replays rows)."""
        rows = len(self)
        i = np.arange(n, dtype=np.int64)
        span = int(self.ids.max()) + 1 if self.ids.size else 0
        return self.take(i % rows, (i // rows) * span)

    def cut(self, prompt: np.ndarray) -> "PrefixIds":
        """Each request's first ceil(prompt_i / unit) ids: the ids of prompts cut at their tail (fit to the
        context). The last kept block keeps its id even where the cut leaves it partial."""
        keep = blocks_of(prompt, self.unit)
        if np.array_equal(keep, self.blocks):
            return self
        if np.any(keep > self.blocks):
            raise ValueError("a cut prompt is longer than its ids cover")
        lengths = self.blocks
        pos = np.arange(self.ids.size, dtype=np.int64) - np.repeat(self.offsets[:-1], lengths)
        offsets = np.zeros(len(self) + 1, dtype=np.int64)
        np.cumsum(keep, out=offsets[1:])
        return PrefixIds(self.unit, offsets, self.ids[pos < np.repeat(keep, lengths)])


def trace_ids(rows: TraceRows) -> PrefixIds | None:
    """The prefix ids of a trace's rows: a JSON-lines trace's ``hash_ids`` (blocks of
    :data:`~simulator.config.trace.MOONCAKE_BLOCK_TOKENS`); None for a CSV trace."""
    if rows.hash_offsets is None:
        return None
    return PrefixIds(MOONCAKE_BLOCK_TOKENS, rows.hash_offsets, rows.hash_ids)


def stream_ids(stream: np.ndarray, prompt: np.ndarray, unit: int, shared_blocks: np.ndarray | None = None,
               group: np.ndarray | None = None, group_blocks: int = 0) -> PrefixIds:
    """Ids of prompts that are each a prefix of a token stream: request i's prompt is the first
    ``prompt[i]`` tokens of stream ``stream[i]`` (a multi-turn session: each turn's prompt is the
    history so far; or one stream per request).

    Full block j of stream s has one id for the whole stream, so every turn of a session repeats its
    history's ids. With groups (shared system prompts), stream s's first ``shared_blocks[s]`` blocks are
    its group ``group[s]``'s, the same in every stream of the group (ids ``group x group_blocks + j``);
    ``shared_blocks[s] <= group_blocks``. A partial last block gets an id of its own that no other
    request has: its tokens are not a whole block of the stream, and vLLM hashes full blocks only
    (vllm/v1/core/kv_cache_utils.py at commit 001cabc1, ``get_request_block_hasher``: "We only hash full
    blocks")."""
    stream = np.asarray(stream, dtype=np.int64)
    prompt = np.asarray(prompt, dtype=np.int64)
    n = prompt.size
    streams = int(stream.max()) + 1 if n else 0
    full = prompt // unit
    partial = (prompt % unit > 0).astype(np.int64)
    shared = np.zeros(streams, dtype=np.int64) if shared_blocks is None else np.asarray(shared_blocks, np.int64)
    groups = np.zeros(streams, dtype=np.int64) if group is None else np.asarray(group, np.int64)
    # each stream's own blocks (beyond its shared ones) get a run of ids after the groups' ids
    longest = np.zeros(streams, dtype=np.int64)
    np.maximum.at(longest, stream, full)
    own = np.maximum(longest - shared, 0)
    base = (int(groups.max()) + 1 if streams else 0) * group_blocks + np.concatenate(([0], np.cumsum(own)[:-1]))
    next_free = int(base[-1] + own[-1]) if streams else 0
    counts = full + partial
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    req = np.repeat(np.arange(n, dtype=np.int64), counts)
    j = np.arange(offsets[-1], dtype=np.int64) - offsets[:-1][req]
    s = stream[req]
    ids = np.where(j < shared[s], groups[s] * group_blocks + j, base[s] + j - shared[s])
    last = j == full[req]  # only a partial block sits at position ``full``
    ids[last] = next_free + np.arange(int(last.sum()), dtype=np.int64)
    return PrefixIds(unit, offsets, ids)


@dataclass
class LeadSharedIds:
    """Prefix ids as :class:`PrefixIds` would hold them, without their flat array: request ``i`` owns
    the ids ``offsets[i] .. offsets[i + 1] - 1``, except its first ``shared[i]``, which are those of
    request ``lead[i]`` (a request's own first ones where ``shared[i]`` is 0). What a pipeline's LLM
    calls need (each call's units its own, a request's warm-up and its stage's call sharing the static
    prefix): 24 bytes a call where the flat ids take 8 a unit (``request_graph.llm_stage.call_prefixes``)."""

    unit: int
    offsets: np.ndarray  # int64, len n + 1
    lead: np.ndarray     # int64, len n
    shared: np.ndarray   # int64, len n: units taken from the lead

    def of(self, rid: int) -> np.ndarray:
        """Request ``rid``'s block ids, first block first."""
        ids = np.arange(self.offsets[rid], self.offsets[rid + 1], dtype=np.int64)
        k = int(self.shared[rid])
        if k:
            start = self.offsets[self.lead[rid]]
            ids[:k] = np.arange(start, start + k, dtype=np.int64)
        return ids

    def __len__(self) -> int:
        return self.offsets.size - 1
