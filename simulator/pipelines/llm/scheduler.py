"""How an engine builds a step: vLLM V1's scheduler (token budget, chunked prefill, KV blocks, preemption).

The policy follows ``Scheduler.schedule`` in vLLM's ``vllm/v1/core/sched/scheduler.py``
(github.com/vllm-project/vllm, commit 00024d314514900f361ad072af6931e403b7f589, the V1 engine
that vLLM 0.15.1 runs). There is no prefill or decode phase: every request has a number of
computed tokens and a number it must catch up to, and each step hands out at most
``max_num_batched_tokens`` of them:

1. **The running requests first, in admission order.** Each asks for what it lacks (1 token for a
   decode, the rest of its prompt for a partial prefill), clamped to
   ``long_prefill_token_threshold`` when that is set, then to what is left of the budget; once the
   budget is spent the rest of the running requests sit the step out. A decode whose KV block
   cannot be allocated preempts the *last* running request (FCFS: ``self.running.pop()``) and
   retries, until it fits or it preempted itself. One deviation: a partial prefill whose chunk
   finds no free blocks sits the step out keeping its blocks, where vLLM preempts the tail —
   usually that prefill itself, which then recomputes its prompt from scratch each time the cache
   refills (a loop that costs the TensorRT-LLM max-throughput 20000/2000 rows 50-75% of their
   throughput; TensorRT-LLM's GUARANTEED_NO_EVICT admission never enters it). Choosing between
   the two needs an engine-policy scenario key.
2. **Then the waiting queue, in order** — but only if nothing was preempted in this step, while
   the running set is below ``max_num_seqs`` and budget remains. A new request gets
   ``min(prompt left, threshold, budget left)`` tokens (chunked prefill), or, with chunked prefill
   off, stops the admission when its prompt does not fit the budget. A request whose blocks
   cannot be allocated stops the admission (no preemption for waiting requests).

So a prompt longer than the budget is split into chunks that share their steps with the running
decodes, and the budget sets how many prompt tokens a step can carry next to its decodes: it
moves step composition, and with it TTFT (how fast a prompt gets through) and ITL (how long the
decodes' steps are). The per-request work is numpy over the running set; the step is one
schedule call, never one per token.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from ...invariants import checking
from .block_pool import BlockPool
from .prefix_cache import PrefixCache
from .settings import EngineSettings


@dataclass
class Batch:
    """One step as the scheduler built it.

    ``decode`` are the requests decoding one token (``comp``: their computed tokens before the
    step); ``chunks`` are prefill chunks as (request, computed before, new tokens), for partial
    prefills of running requests and for newly admitted ones, in scheduling order.
    """

    decode: np.ndarray
    comp: np.ndarray
    chunks: list[tuple[int, int, int]]

    @property
    def tokens(self) -> int:
        """Tokens the step computes: one per decode plus every chunk's new tokens."""
        return len(self.decode) + sum(n for _, _, n in self.chunks)


def admit_waiting(head, budget: int, running: int, sv: EngineSettings, lacks, take) -> int:
    """vLLM V1's step 2, the one admission rule (the scheduler and the closed-form runs call it):
    while budget remains and the running set is below ``max_num_seqs``, the request at the queue's
    head (``head()``; None: the queue is empty) gets what it lacks (``lacks(rid)``; None: it left
    the queue, as a load from the host tier began), capped by ``long_prefill_token_threshold``,
    then by the budget (with chunked prefill off, a prompt that does not fit stops the admission);
    ``take(rid, n)`` admits it with ``n`` tokens, or, returning False (its blocks do not fit),
    stops the admission. Returns the budget left."""
    threshold, chunked, max_batch = sv.long_prefill_token_threshold, sv.chunked_prefill, sv.max_batch
    while budget > 0 and running < max_batch:
        rid = head()
        if rid is None:
            break
        n = lacks(rid)
        if n is None:
            continue
        if 0 < threshold < n:
            n = threshold
        if not chunked and n > budget:
            break
        if n > budget:
            n = budget
        if not take(rid, n):
            break
        budget -= n
        running += 1
    return budget


class Scheduler:
    """A replica's waiting queue, running set and KV-cache blocks, and vLLM V1's policy over them.

    ``table`` is the shared :class:`RequestTable`: ``computed`` (tokens with KV), ``target``
    (tokens to catch up to: prompt plus tokens generated before a preemption), ``blocks`` (KV
    blocks held, which ``pool``, the replica's :class:`BlockPool`, alone changes). Blocks always
    cover ceil(computed / block_size) tokens.
    """

    def __init__(self, table, settings: EngineSettings, kv_blocks: int, cache: PrefixCache | None = None,
                 offload=None):
        self.table = table
        self.sv = settings
        # With prefix caching, blocks of cached prefix units belong to the cache: the pool's
        # ``shared[rid]`` of a request's ``blocks`` are references to it, freed by releasing them.
        self.cache = cache
        self.pool = BlockPool(table, kv_blocks, cache)
        # False on a disaggregated prefill replica: prompts waiting to be sent hold blocks but are
        # in neither queue, so only the pool's own count is checked there
        self.holders_known = True
        # With a host-memory tier (``offload``: an engine's Offloader), evicted prefix units and
        # preempted requests' KV are copied out, and a request whose KV is there loads it back,
        # waiting out of the queue (``loading``) while the copy runs.
        self.offload = offload
        self.loading: set[int] = set()
        self.to_register: list[tuple[int, int]] = []  # with prefix_cache_insert after_step: this step's units
        if offload is not None and cache is not None:
            cache.notify(on_evict=offload.unit_evicted, on_register=offload.unit_evicted if offload.write_through else None)
        # With speculative decoding, a decode carries ``lookahead`` draft tokens besides its own:
        # it takes 1 + lookahead tokens of the budget and KV blocks for them (vLLM V1's scheduler
        # schedules ``1 + len(spec_token_ids)`` tokens per running request and allocates slots for
        # them, vllm/v1/core/sched/scheduler.py ``schedule``); the engine frees the rejected ones' blocks.
        self.lookahead = 0
        self.waiting: deque[int] = deque()
        self.running: list[int] = []
        self._run_arr: np.ndarray | None = None

    def holders_unknown(self) -> None:
        """Requests may hold blocks in neither queue (a disaggregated prefill replica's, waiting to be
        sent): only the pool's own count is checked."""
        self.holders_known = False

    def draft(self, lookahead: int) -> None:
        """Each decode carries ``lookahead`` draft tokens (speculative decoding)."""
        self.lookahead = lookahead

    def take_registrations(self) -> list:
        """This step's prefix units to register once it is processed; the list starts anew."""
        got, self.to_register = self.to_register, []
        return got

    @property
    def kv_total(self) -> int:
        """The replica's KV blocks."""
        return self.pool.total

    @property
    def kv_free(self) -> int:
        """Its blocks not allocated to a request or held by the prefix cache."""
        return self.pool.free

    def holders(self) -> np.ndarray:
        """Every request that may hold blocks here: running, waiting (a preempted one holds none) or loading."""
        return np.fromiter([*self.running, *self.waiting, *self.loading], dtype=np.int64)

    def _running_array(self) -> np.ndarray:
        if self._run_arr is None:
            self._run_arr = np.fromiter(self.running, dtype=np.int64, count=len(self.running))
        return self._run_arr

    def schedule(self) -> Batch | None:
        """Build the next step (allocating its KV blocks), or None if nothing can run."""
        t, sv = self.table, self.sv
        budget = sv.max_batched_tokens
        threshold = sv.long_prefill_token_threshold

        # 1. Running requests, in order: what each lacks, clamped, then cut by the budget.
        run = self._running_array()
        comp = t.computed[run]
        if len(run) and (t.target[run] <= comp).all():
            plan = self._decodes_only(run, comp, budget)
            if plan is not None:
                return plan
        want = np.maximum(t.target[run] - comp, 1)
        la = self.lookahead
        if la:
            want = np.where(t.target[run] <= comp, 1 + la, want)
        if threshold > 0:
            np.minimum(want, threshold, out=want)
        take = np.minimum(want, budget - (np.cumsum(want) - want))
        if la:  # a decode the budget cannot give all its draft tokens sits the step out
            take[(t.target[run] <= comp) & (take < 1 + la)] = 0
        k = int(np.count_nonzero(take > 0))  # the budget reaches a prefix of the running list
        ids, comp, take = run[:k], comp[:k], take[:k]
        need = -(-(comp + take) // sv.block_size) - t.blocks[ids]
        is_decode = comp >= t.target[ids]
        total = int(need[is_decode].sum())
        preempted = False
        while not self._fits(total) and len(self.running) > 1:
            victim = self.running.pop()
            self._run_arr = None
            self.preempt(victim)
            preempted = True
            if len(self.running) < k:  # the victim was one of this step's: it leaves the step
                k -= 1
                ids, comp, take, need, is_decode = ids[:k], comp[:k], take[:k], need[:k], is_decode[:k]
                total = int(need[is_decode].sum())
        if not self._fits(total):  # one request left and its blocks do not fit: nothing runs
            ids, comp, take, need, is_decode, total = ids[:0], comp[:0], take[:0], need[:0], is_decode[:0], 0
        if total:
            self.pool.grant(ids[is_decode], need[is_decode])
        decode = ids if is_decode.all() else ids[is_decode]
        dcomp = comp if len(decode) == len(ids) else comp[is_decode]
        budget -= len(decode) * (1 + la) if la else len(decode)
        chunks: list[tuple[int, int, int]] = []
        if len(decode) != len(ids):
            # A partial prefill whose chunk finds no free blocks sits the step out, keeping its
            # blocks (vLLM would preempt the tail here, usually the prefill itself: see KV_FULL_PARTIAL).
            for r, c, n, b in zip(ids[~is_decode], comp[~is_decode], take[~is_decode], need[~is_decode]):
                if self._fits(int(b)):
                    self.pool.grant(r, b)
                    chunks.append((int(r), int(c), int(n)))
                    if self.cache is not None:
                        self.register_covered(int(r), int(c) + int(n))
                    budget -= int(n)

        return self._admit(decode, dcomp, chunks, budget, preempted)

    def _decodes_only(self, run: np.ndarray, comp: np.ndarray, budget: int) -> Batch | None:
        """Step 1 when every running request decodes and their blocks fit (the common step): the
        same outcome as the general rule in a few array operations; None when it must preempt."""
        t, bs, la = self.table, self.sv.block_size, self.lookahead
        if la:
            k = min(len(run), budget // (1 + la))
            ids, comp = run[:k], comp[:k]
            need = (comp + la + bs) // bs - t.blocks[ids]  # blocks covering computed + 1 + lookahead tokens
            used = k * (1 + la)
        else:
            k = min(len(run), budget)
            ids, comp = run[:k], comp[:k]
            need = (comp + bs) // bs - t.blocks[ids]  # blocks covering computed + 1 tokens
            used = k
        total = int(need.sum())
        if not self._fits(total):
            return None
        if total:
            self.pool.grant(ids, need)
        return self._admit(ids, comp, [], budget - used, False)

    def _admit(self, decode: np.ndarray, dcomp: np.ndarray, chunks: list, budget: int,
               preempted: bool) -> Batch | None:
        """Step 2: waiting requests join, in order, unless this step preempted (:func:`admit_waiting`)."""
        if not preempted and self.waiting:
            t = self.table
            waiting = self.waiting

            def take(rid: int, n: int) -> bool:
                if not self._alloc(rid, n):
                    return False
                waiting.popleft()
                self.running.append(rid)
                self._run_arr = None
                chunks.append((rid, int(t.computed[rid]), n))
                if self.cache is not None:
                    self.register_covered(rid, int(t.computed[rid]) + n)
                return True

            admit_waiting(lambda: waiting[0] if waiting else None, budget, len(self.running), self.sv, self.lacks, take)
        if self.holders_known and checking():  # BLOCKS_CONSERVED over the holders' own blocks, in debug runs
            self.pool.check(self.holders())
        if len(decode) == 0 and not chunks:
            return None
        return Batch(decode, dcomp, chunks)

    def lacks(self, rid: int) -> int | None:
        """What waiting request ``rid`` lacks to catch up to its target, as :func:`admit_waiting` asks:
        a request with nothing computed gets its target and, with prefix caching, its cached prefix
        (looked up once); None where it left the queue to load KV from the host tier. The scheduler's
        and the closed-form runs' one rule."""
        t = self.table
        if t.computed[rid] == 0:
            t.target[rid] = t.prompt[rid] + t.generated[rid]
            if self.offload is not None and self._load_swapped(rid):
                return None
            if self.cache is not None and rid not in self.cache.settled:
                self._look_up(rid)
                if self.offload is not None and self._load_units(rid):
                    return None
        return int(t.target[rid] - t.computed[rid])

    def _fits(self, n: int) -> bool:
        return self.pool.fits(n)

    def _look_up(self, rid: int) -> None:
        """A request about to be admitted takes its cached prefix: those tokens count as computed
        and their blocks as its own (shared with the cache)."""
        t = self.table
        tokens, blocks = self.cache.match(rid, int(t.prompt[rid]), count=t.preemptions[rid] == 0)
        t.computed[rid] = tokens
        self.pool.adopt(rid, blocks)

    def _load_swapped(self, rid: int) -> bool:
        """A preempted request whose KV was swapped out loads it back (when its blocks fit) instead
        of recomputing; True when it left the queue to wait for the copy."""
        tier = self.offload.tier
        key = ("swap", rid)
        if not tier.has(key):
            return False
        tokens = tier.entries[key][1]
        blocks = -(-tokens // self.sv.block_size)
        if not self._fits(blocks):
            return False
        self._start_load(rid, [key], tokens, blocks)
        return True

    def _load_units(self, rid: int) -> bool:
        """After the GPU cache's hit, the prefix units that follow it in the host tier are loaded
        back (when their blocks fit); True when the request left the queue to wait for the copy."""
        tier, cache, t = self.offload.tier, self.cache, self.table
        prompt = int(t.prompt[rid])
        ids = cache.prefix.of(rid).tolist()
        first = cache.settled[rid]
        keys, tokens = [], 0
        for i in range(first, len(ids)):
            if int(ids[i]) in cache.blocks or not tier.has(int(ids[i])):
                break
            keys.append(int(ids[i]))
            tokens += cache.unit_tokens(rid, i, prompt)
        if not keys:
            return False
        done = min(first * cache.prefix.unit + tokens, prompt - 1)
        blocks = -(-done // self.sv.block_size) - int(t.blocks[rid])
        if not self._fits(blocks):
            return False
        self._start_load(rid, keys, done, blocks)
        return True

    def _start_load(self, rid: int, keys: list, tokens: int, blocks: int) -> None:
        """Reserve the blocks and copy ``keys`` back; the request rejoins the queue's head with
        ``tokens`` computed when the copy ends."""
        self.pool.grant(rid, blocks)
        self.waiting.popleft()
        self.loading.add(rid)
        nbytes = sum(self.offload.tier.take(k)[0] for k in keys)

        def loaded() -> None:
            # at least one token is left to compute (its logits give the next token)
            self.loading.discard(rid)
            self.table.computed[rid] = min(tokens, int(self.table.target[rid]) - 1)
            self.offload.tier.loaded(tokens)
            self.waiting.appendleft(rid)

        self.offload.load(rid, nbytes, loaded)

    def register_covered(self, rid: int, covered: int) -> None:
        """Units of the prompt that the request's KV covers once this step is computed join the cache:
        now (``prefix_cache_insert: allocate``, vLLM V1 caches blocks as it allocates them), or once
        the step's results are processed (``after_step``: SGLang's ``process_batch_result_prefill``
        calls ``tree_cache.cache_unfinished_req`` after the forward, so requests of one batch do not
        hit each other's prefixes); then the engine calls :meth:`register_computed`."""
        if self.sv.prefix_cache_insert == "after_step":
            self.to_register.append((rid, covered))
            return
        self._insert(rid, covered)

    def register_computed(self, pairs: list, holds=None) -> None:
        """A processed step's (request, tokens covered) pairs join the cache, for requests that still
        hold that KV (one preempted since has dropped it; ``holds(rid, covered)`` says so where the table
        does not yet: a closed-form run's view)."""
        t = self.table
        for rid, covered in pairs:
            if (t.computed[rid] >= covered and t.blocks[rid] > 0) if holds is None else holds(rid, covered):
                self._insert(rid, covered)

    def _insert(self, rid: int, covered: int) -> None:
        self.pool.to_cache(rid, self.cache.register(rid, covered, int(self.table.prompt[rid])))

    def _alloc(self, rid: int, n: int) -> bool:
        t = self.table
        need = -(-(int(t.computed[rid]) + n) // self.sv.block_size) - int(t.blocks[rid])
        if not self._fits(need):
            return False
        self.pool.grant(rid, need)
        return True

    def extend(self, decode: np.ndarray, comp: np.ndarray) -> bool:
        """Blocks for one more token of each of ``decode`` (computed ``comp``), for a further step
        of a multi-step run; False, allocating nothing, when they do not fit."""
        t, bs = self.table, self.sv.block_size
        need = (comp + bs) // bs - t.blocks[decode]
        total = int(need.sum())
        if not self._fits(total):
            return False
        self.pool.grant(decode, need)
        return True

    def preempt(self, rid: int) -> None:
        """Recompute preemption: drop the request's KV and put it back at the head of the queue."""
        t = self.table
        if self.offload is not None and t.computed[rid] > 0:
            self.offload.swap_out(rid, int(t.blocks[rid]), int(t.computed[rid]))
        self.pool.release(rid)
        t.computed[rid] = 0
        t.preemptions[rid] += 1
        self.waiting.appendleft(rid)

    def finish(self, finished: np.ndarray) -> None:
        """Finished requests leave the running set and free their blocks.

        With overlapped scheduling (``serving.overlap`` async), step n+1 is scheduled before step n's
        outputs are processed, so a request whose last token is in step n can be preempted by step
        n+1 and sit in the waiting queue when it finishes: it leaves the queue too, as vLLM V1's
        ``update_from_output`` removes its ``stopped_preempted_reqs`` from ``self.waiting``
        (vllm/v1/core/sched/scheduler.py, commit 00024d314514900f361ad072af6931e403b7f589).
        Left there, it was admitted again and decoded forever (its tokens dropped as finished),
        holding KV blocks until the cache could hold nothing else."""
        self.leave(finished)
        if self.waiting:
            fin = set(finished.tolist())
            if any(r in fin for r in self.waiting):  # rare: only a preempted request that finished
                keep = [r for r in self.waiting if r not in fin]
                self.waiting.clear()
                self.waiting.extend(keep)
        self.release(finished)

    def set_running(self, ids: list) -> None:
        """The running set after a closed-form run played its steps (``ids``, in admission order)."""
        self.running = ids
        self._run_arr = None

    def leave(self, finished: np.ndarray) -> None:
        """Requests leave the running set (their blocks stay held until :meth:`release`)."""
        fin = set(finished.tolist())
        self.running = [r for r in self.running if r not in fin]
        self._run_arr = None

    def release(self, finished: np.ndarray) -> None:
        """Free the KV blocks of requests that left the running set."""
        self.pool.release(finished)
