"""Runs of engine steps in closed form: K steps computed in one pass instead of one SimPy wake-up each.

In an engine whose every step is a closed form of its batch (which set-ups those are, each serving
key's owning module declares in ``run_support``, with the engine's own conditions there: today
any overlap (a step of lag with async scheduling or async output processing: ``lagged_runs``),
detokenization in the engine, the API server or a process of its own (``detok_runs``), any stream
interval, one replica, an open-loop workload, a step whose TP/PP traffic is booked on ports of its own
(``ReplicaLinks.comm_booked``: one replica alone on its topology, over NVLink), no CPU-core
contention, no speculative decoding or host KV tier, any prefix cache (``_Admission``); several API
servers' parts of the outputs: ``api_runs``),
nothing outside the engine changes its world but the requests arriving, and their arrival times
are known. So a run of steps can be played forward at once: before each step, the requests whose
tokenization has ended join the waiting queue (where the API server is another process, each
request's message is received on the engine's clock at its tokenization's end, in time order
between the steps' own work, and each step's outputs are sent and received as a message; where
the API server is the engine's process, the arrivals are tokenized on the engine's own clock;
where the API server detokenizes, the engine sends the sampled ids on and the API server receives,
detokenizes, builds the outputs and streams them; where a detokenizer process does, the engine
hands it the streaming requests' entries and it sends the outputs on); the step is scheduled as vLLM V1's scheduler would (the running
decodes, the one partial prefill, then the waiting requests in order while the token budget, the
batch limit and the KV blocks allow); its GPU time is the cost model's closed form; and the
arrivals it overlaps are tokenized on the API servers' clocks in time order with its stream
chunks. This module computes those times with the rules the step-by-step engine calls (the
admission rule, the step's CPU costs, the booked copy, the decode step time), in the same order as
the step-by-step engine (a scalar loop over the steps' time chain, each request's state as counters:
its decode start, its finish step, the step its KV needs a new block); the busy times, KV-time and
bytes the run adds are summed over its steps at its end (equal to rounding), its tokens and spans
are recorded with numpy (``run_records``), and the engine sleeps until the run's last step is done.

A run ends before a step the closed form does not cover — a preemption (the blocks of the decodes
do not fit), a partial prefill whose chunk finds no blocks, the horizon, nothing left to run —
and the step-by-step path takes it; tests compare both on real traces and on set-ups drawn at
random from the covered space (every request's times within 1 ns), and every run's own count of
free KV blocks is checked against the block pool's (invariant RUN_MATCHES_POOL). Where a scenario's
setup does not allow runs at all, every step is stepped. With spans recorded, a run records the
same spans, each track's in time order (the spans frame is in time order, whoever recorded it).
"""

from __future__ import annotations

import heapq
from functools import partial
from itertools import chain
from typing import NamedTuple

import numpy as np

from ...hardware.gpu import step_window
from ...hardware.link import booked_copy, copy_seconds
from ...invariants import require
from ...observe.attribution import WAIT_COLUMNS, check_ordered, wait_activity
from .run_records import record_spans, record_tokens
from .api_runs import ServerOutputs
from .detok_runs import DetokClock
from .run_support import engine_blockers, serving_blockers
from .scheduler import admit_waiting
from .settings import detokenize_cost, outputs_cost

ROW = ("a0", "a1", "g0", "g1", "d1", "e", "stream start", "start", "launched", "copy begin", "detokenize start",
       "schedule+launch", "detokenize", "output", "sent", "x", "send start", "i", "comm start", "batch", "decodes",
       "prefill tokens", "KV blocks used", "sampled", "decode context", "emitted", "chunks")
"""A run's step row: the step's times (its done event a0 .. outputs made e, the first API server's stream
start, the engine process's start and launch end, the copy's begin, the detokenization's start), its CPU
work (scheduling and launch, detokenization, output objects), when its outputs were sent and were at the
first API server (its message received there: ``x``), when their message began to be sent, when they were
at the process that detokenizes them (``i``), when its TP/PP communication began (its kernels' end), then
its counts (the last: the tokens its outputs carry).
Where the API server detokenizes, the detokenization's start, its work, the outputs' and ``e`` are the
API server's. With a step of lag (``lagged_runs``), a row's outputs are the step before's. Its last
count: the chunks the step streams (its emitting requests', but for a stream interval above 1)."""

EMITTED = ROW.index("emitted") - ROW.index("batch")
"""The count column of the tokens a row's outputs carry (its own step's sampled ids, or with a step of
lag the live ones of the step before)."""

CHUNKS = ROW.index("chunks") - ROW.index("batch")
"""The count column of the chunks a row's step streams."""

COUNTS = ROW.index("batch")
"""The first integer column of a run's step table."""

MAX_STEPS = 256
"""Steps in one run at most: what the token ledger's step ring and retirement lag allow for
(``observe.token_ledger``); a longer stretch is several runs."""


def launch(a0: float, free: float, gpu_free: float, booked: float, sched: float, sched_launch: float,
           compute: float, lat: float, secs: float, comm_end=None, tokens: int = 0) -> tuple:
    """A step submitted at ``a0`` to its engine's process (free from ``free``), as the engine launches
    it: scheduled after ``sched`` seconds and launched after ``sched_launch``; its GPU work from then
    (or once the GPU is free, at ``gpu_free``) for ``compute`` seconds, then its communication for
    ``tokens`` tokens (``comm_end``: its end from its start, none without), never ending before its last launch; its sampled
    ids copied on the booked port (``booked``: busy until; ``lat``, ``secs``: the copy's latency and
    time). Returns (start, launched, scheduled, GPU start, GPU end, copy begin, copied)."""
    start = a0 if a0 > free else free
    launched = start + sched_launch
    a1 = start + sched
    g0, g1, _ = step_window(a1, gpu_free, compute, launched, partial(comm_end, tokens) if comm_end else None)
    return (start, launched, a1, g0, g1, *booked_copy(booked, g1, lat, secs))


class DecodeRuns:
    """Closed-form runs of one :class:`~simulator.pipelines.llm.engine.Engine`."""

    def __init__(self, engine, frontend, horizon: float | None):
        self.e = engine
        self.fe = frontend
        self.horizon = float("inf") if horizon is None else horizon
        self.shapes: dict[int, tuple] = {}  # decode-only batch size -> its step's fixed parts

    @staticmethod
    def blockers(serving, engine, open_loop: bool, replicas: int) -> list[str]:
        """Why runs cannot cover this engine's set-up (empty: they can; the per-step conditions come
        later): its serving keys as their owning modules declared them (``run_support``), then the
        engine's own conditions."""
        return serving_blockers(serving) + engine_blockers(engine, open_loop, replicas)

    def run(self) -> float | None:
        """Commit the longest run of steps that can start now; returns when its last step's
        outputs were handed to the frontend (the time the engine's loop resumes), or None if not
        even the first step can be run in closed form."""
        eng, t, sched = self.e, self.e.table, self.e.sched
        sv = eng.sv
        budget, bs = sv.max_batched_tokens, sv.block_size
        running = sched.running
        if len(running) > budget or (not running and not sched.waiting):
            return None
        now = eng.env.now
        if now >= self.horizon or not self._outputs_delivered():
            return None
        run = np.fromiter(running, dtype=np.int64, count=len(running))
        comp = t.computed[run]
        target = t.target[run]
        gen = t.generated[run]
        if (t.sent[run] != (gen if sv.stream_interval == 1 else t.streamed[run])).any() or (
                t.blocks[run] != -(-comp // bs)).any():
            return None  # a chunk on its way, or blocks the closed form does not count
        partial = comp < target
        if partial[:-1].any():
            return None  # a partial prefill that is not the last running request: the general rule
        return Run(self, run, comp, target, gen, bool(len(run) and partial[-1])).play(now)

    def run_lagged(self, pending):
        """With a step of lag (async scheduling, async output processing): commit the longest run of the loop's iterations that
        can start now, ``pending`` (the step in flight) processed in its first; returns (when the loop
        resumes, the step the run left in flight), or None where not even one iteration can be run."""
        from .lagged_runs import LaggedRun  # (it builds on this module's Run)

        eng, t, sched = self.e, self.e.table, self.e.sched
        sv = eng.sv
        running = sched.running
        now = eng.env.now
        if (pending is None or pending.g1 is None or pending.d1 is None or pending.accepted is not None
                or len(running) > sv.max_batched_tokens or now >= self.horizon
                or not self._outputs_delivered()):
            return None
        run = np.fromiter(running, dtype=np.int64, count=len(running))
        comp, target, gen = t.computed[run], t.target[run], t.generated[run]
        if (t.sent[run] != (gen if sv.stream_interval == 1 else t.streamed[run])).any() or (
                t.blocks[run] != -(-comp // sv.block_size)).any():
            return None
        partial = comp < target
        if partial[:-1].any():
            return None
        # the step in flight holds the running requests (its live decodes, the prefills it completed,
        # the chunk of the partial one) and no other: its outputs are the run's first
        live = pending.decode[~t.finished[pending.decode]] if len(pending.decode) else pending.decode
        members = np.concatenate([live, pending.completes, pending.only_prefill])
        n_last = bool(len(run) and partial[-1])
        if len(members) != len(run) or not np.array_equal(np.sort(members), np.sort(run)):
            return None
        if len(pending.only_prefill) and (not n_last or pending.only_prefill[0] != run[-1]):
            return None
        done_first = len(run) - n_last - len(pending.completes)  # the prefills it completed: the tail
        if len(pending.completes) and not np.array_equal(run[done_first:len(run) - n_last], pending.completes):
            return None
        return LaggedRun(self, run, comp, target, gen, n_last, pending, done_first).play(now)

    def _outputs_delivered(self) -> bool:
        """Whether no step's outputs are on their way to the API server, after delivering those that are
        now where nothing else reaches the API server before they do (no arrival): what they book there
        comes before any work of the run's, as it would stepped."""
        eng, fe = self.e, self.fe
        eng.deliver_handoffs()  # a separate detokenizer's: its process is the engine's alone
        pending = eng.outputs_pending
        if not pending:
            return True
        t = eng.table
        if fe.next_rid < t.n and t.arrival.values[fe.next_rid] <= pending[-1][0]:
            return False
        eng.deliver_pending()
        return True


class Run:
    """One run's state while it is played and recorded: the requests as slots in running order."""

    lagged = False  # a row's outputs are its own step's (``lagged_runs``: the step before's)
    later = False  # (``lagged_runs``: async output processing; the outputs reach the API server later)

    def __init__(self, owner: DecodeRuns, run, comp, target, gen, last_partial: bool):
        self.o = owner
        eng = owner.e
        t = eng.table
        self.budget, self.bs, self.waiting, self.shapes = (eng.sv.max_batched_tokens, eng.sv.block_size,
                                                          eng.sched.waiting, owner.shapes)
        self.pool = eng.sched.pool  # the replica's KV blocks (and its prefix cache's, where there is one)
        self.loose, self.loose_k = 0, -1  # blocks evicted for step ``loose_k`` (``room``)
        # SGLang's prefix cache caches a step's units once the step is processed (``registered``)
        self.after_step = self.pool.cache is not None and eng.sv.prefix_cache_insert == "after_step"
        self.left: set[int] = set()  # with it: the requests that left the run (their KV released)
        # requests and outputs cross between the engine's and the API server's processes as messages
        self.ipc = eng.sv.outputs_cross_to_api and eng.cpu.has_ipc
        # or the API server runs in the engine's process: one clock for both (vLLM <= 0.5)
        self.shared = owner.fe.sv.shared
        # the API server detokenizes and builds the outputs (vLLM V1, TensorRT-LLM's serve)
        self.in_api = eng.sv.detokenizer == "api_server"
        # or a detokenizer process of its own, between the engine and the API server (SGLang)
        self.sep = eng.sv.detokenizer == "separate"
        self.detok = None
        self.outs = None  # several API servers that receive their parts as messages or detokenize them
        bs = eng.sv.block_size
        ids = run.tolist()
        n = len(ids) - last_partial
        out = t.output[run]
        # slots: every request of the run, in running order (those running, then those admitted)
        self.rid = ids
        self.c0 = comp.tolist()                           # computed tokens when it started decoding
        self.s = [0] * n + [MAX_STEPS] * last_partial     # the step it started decoding
        self.first = [0] * n + [MAX_STEPS] * last_partial  # its first emitting step in the run
        self.last = (out[:n] - gen[:n] - 1).tolist() + [MAX_STEPS] * last_partial  # its last one
        self.gen0 = gen.tolist()                          # tokens generated before the run
        self.api = t.api[run].tolist()
        self.partial = n if last_partial else -1          # the slot of the partial prefill, if any
        self.p_comp = int(comp[-1]) if last_partial else 0
        self.p_target = int(target[-1]) if last_partial else 0
        # slots from ``prefilling`` on complete a prefill in the run (the partial one, those admitted):
        # their first row carries its first token; from ``admitted`` on, the scheduler set no target yet
        self.prefilling, self.admitted = n, len(ids)
        rho = (-comp[:n]) % bs
        self.rho = rho.tolist() + [0] * last_partial       # a decode needs a block at steps k = rho mod bs
        self.cnt = np.bincount(rho, minlength=bs).tolist()  # decodes per rho
        self.S = int(comp[:n].sum())                      # computed tokens of the decodes
        self.nd = n
        self.ending: dict[int, list[int]] = {}
        for slot in np.flatnonzero(out[:n] - gen[:n] - 1 < MAX_STEPS).tolist():
            self.ending.setdefault(self.last[slot], []).append(slot)
        self.finished: list[int] = []                     # slots, in the order the frontend sees them
        self.prefill_rows: list[tuple[int, int]] = []     # (step, request) of chunks that did not complete
        nserv = len(owner.fe.servers)
        self.nd_api = None
        if nserv > 1:
            self.nd_api = [0] * nserv
            for j in self.api[:n]:
                self.nd_api[j] += 1
        self.every = eng.sv.stream_interval
        self.scnt_api = None  # with several API servers and a stream interval: each one's decodes per phase
        if self.every > 1:
            self._stream_phases(t.streamed[run], gen, n, last_partial)

    def _stream_phases(self, streamed, gen, n: int, last_partial: bool) -> None:
        """With a stream interval N above 1 (``Engine._emit``'s rule: a request streams its first token,
        its last, and each N-th since its last chunk): each decode's phase, the steps k = phase mod N of
        the run at which it streams, and the decodes per phase."""
        N = self.every
        self.streamed0 = streamed.tolist()  # tokens streamed before the run
        phase = (streamed[:n] - gen[:n] - 1) % N
        self.phase = phase.tolist() + [0] * last_partial
        self.scnt = np.bincount(phase, minlength=N).tolist()
        self.chunk_parts: dict[int, tuple] = {}  # chunks -> the step's work that depends on them
        self.server_phases(n)

    def server_phases(self, n: int) -> None:
        """With several API servers, each one's decodes per phase (``scnt_api``), from the first ``n`` slots."""
        self.scnt_api = None
        if self.nd_api is not None:
            self.scnt_api = [[0] * self.every for _ in self.nd_api]
            for slot in range(n):
                self.scnt_api[self.api[slot]][self.phase[slot]] += 1

    def play(self, now: float) -> float | None:
        """Walk the run's time chain step by step until a step the closed form does not cover, then
        record the steps played (a row of ``ROW`` each); returns when the engine's loop resumes (None:
        no step played). The step's own work runs inline, on locals; the rest is in the helpers."""
        eng, sched, horizon = self.o.e, self.o.e.sched, self.o.horizon
        lat, booked, decode_time, clocks, intake = self._begin()
        free, gpu_free, kv_free, kv_total = eng.proc.free_at, eng.gpu_free, sched.pool.free, sched.pool.total
        srv0, single, comm_end = clocks.srv[0], clocks.single, self.comm_end
        ending, S, nd, shared, in_api = self.ending, self.S, self.nd, self.shared, self.in_api
        sep, outs, after_step = self.sep, self.outs, self.after_step
        apart = in_api or sep  # the outputs reach the API server after the engine's loop went on
        rows, k, special, every = [], 0, intake.mode is not None or in_api or sep, self.every
        while k < MAX_STEPS:
            a0 = now
            if intake.next_route <= a0 or intake.joining:  # tokenized (and received) by now: they join the queue
                free = intake.join(a0, free)
            got = self._schedule(k, nd, S, kv_free, decode_time)
            if got is None:
                break
            plan, free_kv, new_tokens, nchunks, sampled, compute, fixed, ctx = got
            sched_c, sl, nbytes, secs, det, out, dur, msg, recv = fixed
            chunks, per = sampled, None
            if every > 1:  # only the requests that stream this step have outputs built and streamed
                chunks = self._chunks(k, plan)
                out, dur, msg, recv = self._streamed(chunks, msg, recv)
            if outs is not None and sampled:  # several API servers: a message to each that holds some
                per = self._chunks_per_server(plan)
                sent_per, msg = self.server_sends(per, k % every, self.ending.get(k, ()), plan)
            start, launched, a1, g0, g1, begin, d1 = launch(a0, free, gpu_free, booked, sched_c, sl, compute, lat, secs,
                                                            comm_end, nd + new_tokens)
            t_done = s2 = e = sent = ss = i = resume = a0 + (d1 - a0)  # the step's done event
            if sampled:
                if special:  # messages, one clock with the API server, detokenizing elsewhere
                    got = self._engine_outputs(t_done, d1, launched, det, out, msg, chunks, sampled)
                    if got is None:
                        break
                    s2, e, sent, ss, resume, after, i, det = got
                else:
                    s2 = d1 if d1 > launched else launched
                    e = ss = sent = after = s2 + det + out  # detokenized at s2 + det, as the engine books it
                    resume = t_done + (e - t_done) if e > t_done else t_done
            if not resume < horizon or (apart and not sent < horizon):
                intake.undo()
                break
            free = after if sampled else launched  # committed (busy times, KV-time, bytes summed at the end)
            if sep:
                self.detok.commit(sampled > 0)
            if intake.mode is not None:
                intake.commit(free)
            gpu_free, booked = g1, (d1 if nbytes > 0 else booked)
            if intake.next_t <= (sent if apart else resume):  # the arrivals this step overlaps, in time order
                intake.tokenize(sent if apart else resume)
            if in_api and sampled and single:  # the API server receives the ids, detokenizes them, builds the outputs
                i, s2, e = clocks.detokenize(sent, recv, det, out)
            x = e  # the step's outputs: each API server serializes its requests' chunks at e
            if chunks and single:  # the common case: one API server streams every chunk
                st0 = sent if sent > srv0[0] else srv0[0]
                if recv > 0 and not in_api:  # it receives the outputs' message first
                    x = st0 = clocks.receive(st0, recv)
                srv0[0] = st0 + dur
            elif per is not None:  # each receives its part (and detokenizes it), then streams
                st0 = outs.play(k, sent, per, i, s2 + det, e, sent_per)
            else:
                st0 = clocks.stream(k, e, chunks, self._chunks_per_server(plan))
            if shared:  # the API server's clock is the engine's
                free = srv0[0]
            rows.append((a0, a1, g0, g1, d1, e, st0, start, launched, begin, s2, sl, det, out, sent, x, ss, i,
                         g0 + compute, nd + nchunks, nd, new_tokens, kv_total - free_kv, sampled, ctx, sampled, chunks))
            if after_step:  # the step is processed: its units join the cache, before anyone leaves
                self.registered(sched.take_registrations())
            kv_free, S = free_kv, S + nd  # the requests' state after the step
            if k in ending or plan is not None:
                nd, S, kv_free = self._after(k, plan, nd, S, kv_free)
            now = resume
            k += 1
        return self._settle(k, rows, free, booked, kv_free + self.uncommitted(k), now)

    def _stream_phase(self, k: int, slot: int) -> None:
        """Slot ``slot`` made its first token of the run in step ``k``: it streams there if that is its
        first token ever, then every N-th after its last chunk (its phase mod N, counted)."""
        gen0, N = self.gen0[slot], self.every
        ph = self.phase[slot] = k % N if gen0 == 0 else (self.streamed0[slot] - gen0 - 1 + k) % N
        self.scnt[ph] += 1
        if self.scnt_api is not None:
            self.scnt_api[self.api[slot]][ph] += 1

    def _chunks(self, k: int, plan) -> int:
        """With a stream interval above 1, the chunks step ``k`` streams: the decodes in their phase, those
        that end there out of it, and the prefills it completes whose first token streams (a first
        token ever, a last one, or the N-th since the request's last chunk)."""
        N, phase = self.every, self.phase
        chunks = self.scnt[k % N] + sum(1 for slot in self.ending.get(k, ()) if phase[slot] != k % N)
        if plan is None:
            return chunks
        return chunks + sum(streams for _, streams in self._first_streams(plan))

    def _first_streams(self, plan) -> list:
        """The prefills step ``plan`` completes, each (request, whether its first token streams: a first
        token ever, a last one, or the N-th since the request's last chunk)."""
        if plan is None:
            return []
        t, N = self.o.e.table, self.every
        firsts = [(self.gen0[self.partial], self.streamed0[self.partial], self.rid[self.partial])] if plan.p_done else []
        firsts += [(int(t.generated[rid]), int(t.streamed[rid]), rid) for rid, target, n, c in plan.admit
                   if c + n >= target]
        return [(rid, bool(gen0 == 0 or gen0 + 1 - streamed >= N or gen0 + 1 >= t.output[rid]))
                for gen0, streamed, rid in firsts]

    def server_chunks(self, phase_k: int, ending, firsts) -> list:
        """With several API servers and a stream interval above 1, each one's chunks of a step: its decodes
        in phase ``phase_k``, its slots among ``ending`` (their last token) out of it, and its prefills among
        ``firsts`` (:meth:`_first_streams`) whose first token streams."""
        out = [row[phase_k] for row in self.scnt_api]
        phase, api, nserv = self.phase, self.api, len(out)
        for slot in ending:
            if phase[slot] != phase_k:
                out[api[slot]] += 1
        for rid, streams in firsts:
            out[rid % nserv] += streams
        return out

    def server_sends(self, per: list, phase_k: int, ending, plan=None) -> tuple:
        """With several API servers, a step's outputs whose emitting requests per server are ``per``: (those
        that stream, per server: :meth:`server_chunks` of phase ``phase_k``, ``ending`` and the prefills
        ``plan`` completes; the seconds to send the messages, one per server that holds some entries: the
        emitting requests' ids where the API servers detokenize, else the streaming ones' outputs)."""
        if self.every == 1:
            return per, self.outs.message(per)
        sent = self.server_chunks(phase_k, ending, self._first_streams(plan))
        return sent, self.outs.message(per if self.in_api else sent)

    def _streamed(self, chunks: int, msg: float, recv: float) -> tuple:
        """A step's outputs' work where ``chunks`` of them stream (a stream interval above 1): the output
        objects, the stream, and the outputs' message at each end (``msg``, ``recv`` as they are where
        the API server detokenizes: the sampled ids' message carries every request's)."""
        parts = self.chunk_parts.get(chunks) or self._chunk_parts(chunks)
        return (*parts[:2], msg, recv) if self.in_api else parts

    def _chunk_parts(self, chunks: int) -> tuple:
        """The work of a step that streams ``chunks`` chunks (with a stream interval above 1): its output
        objects (the API server's, where it detokenizes), its stream, its outputs' message at the
        engine's end and at the API server's (where the engine detokenizes: the message carries the
        streaming requests' entries alone)."""
        eng, fe = self.o.e, self.o.fe
        counts = {0: chunks} if chunks else {}
        parts = self.chunk_parts[chunks] = (
            outputs_cost(fe.cpu if self.in_api else eng.cpu, chunks), chunks * fe.cpu.stream_per_chunk,
            eng.outputs_message_cost(counts) if self.ipc else 0.0,
            fe.receive_costs(counts).get(0, 0.0) if self.ipc else 0.0)
        return parts

    def _engine_outputs(self, t_done: float, d1: float, launched: float, det: float, out: float,
                        msg: float, chunks: int, tokens: int) -> tuple | None:
        """A step's work on the engine's clock after its copy (``d1``; ``t_done``: its done event)
        where more than the engine's own tasks run there or the API server detokenizes: what reached
        the clock before ``d1`` first (the requests' messages in, or tokenizations on the one clock),
        then the detokenization and the outputs (or, for the API server, the sampled ids' message).
        Returns (detokenization start, outputs made, sent, send start, when the loop resumes, the
        clock after, at the process that detokenizes, the detokenization's seconds), or None where the
        horizon comes first. With a separate detokenizer, the engine hands the streaming entries over
        and goes on; the times from the detokenization on are the detokenizer's (``detok_runs``)."""
        ready = launched
        if self.intake.mode is not None:
            if not d1 < self.o.horizon:
                return None
            ready = self.intake.before_outputs(d1, launched)
        # a separate detokenizer's entries are handed over at the step's done event (its copy's end, or later)
        at = t_done if self.sep and t_done > d1 else d1
        return self._outputs(at, ready, t_done, t_done, chunks, tokens, det, out, msg)

    def _outputs(self, at: float, ready: float, woke: float, i: float, chunks: int, tokens: int, det: float,
                 out: float, msg: float) -> tuple:
        """A step's outputs on the engine's clock (free from ``ready``), its ids there at ``at``, the loop
        awake at ``woke`` (``i``: when the ids are where they are detokenized, unless a message carries
        them): the engine detokenizes and sends them, sends the ids on to the API server, or hands the
        streaming entries to a separate detokenizer. Returns (detokenization start, outputs made, sent,
        send start, when the loop resumes, the clock after, at the process that detokenizes, the
        detokenization's seconds); the sync and the lagged runs' one rule."""
        s2 = at if at > ready else ready
        if self.in_api:  # the engine sends the ids on (a message that costs nothing is none) and goes on
            sent = s2 + msg if msg > 0 else at
            return s2, woke, sent, s2, woke, sent if msg > 0 else ready, i, det
        if self.sep:  # the engine hands the streaming entries to the detokenizer and goes on
            i, s2, det, e, sent, after = self.detok.hand(at, ready, chunks, tokens, out, msg)
            return s2, e, sent, e, woke, after, i, det
        e = s2 + det + out  # detokenized at s2 + det (as the engine books its two tasks)
        sent = e + msg if msg > 0 else e  # the outputs' message to the API servers
        return s2, e, sent, e, woke + (sent - woke) if sent > woke else woke, sent, i, det

    def _schedule(self, k: int, nd: int, S: int, kv_free: int, decode_time):
        """Step ``k`` as vLLM V1's scheduler would make it of the run's state (``nd`` decodes with ``S``
        computed tokens, ``kv_free`` blocks free): (the admissions' plan or None, the blocks free after
        it, new prefill tokens, prefill chunks, sampled ids, GPU compute, its fixed parts, the decode
        context), or None where the closed form stops (a preemption: the decodes' blocks do not fit;
        the budget; nothing runs)."""
        budget, partial = self.budget, self.partial
        alloc = self.cnt[k % self.bs]
        if nd + (partial >= 0) > budget:
            return None
        if alloc > kv_free:  # idle cached prefixes evicted where they make room (else: preempt, stepped)
            freed = self.room(alloc, kv_free, k)
            if freed is None:
                return None
            kv_free += freed
        free_kv, ctx = kv_free - alloc, float(S) + nd
        if partial < 0 and not self.waiting:  # decodes only
            if not nd:
                return None  # nothing runs: the engine waits
            return self._decodes(nd, S, free_kv, decode_time)
        plan = self._mixed(k, nd, ctx, free_kv, budget)
        if plan is None:
            return None
        return (plan, *plan.step, ctx)

    def _decodes(self, nd: int, S: int, free_kv: int, decode_time) -> tuple:
        """A step of the run's ``nd`` decodes alone (``S`` computed tokens; ``free_kv`` blocks free once
        their new ones are taken), as :meth:`_schedule` returns a step: its compute is
        ``cost.step(ctx, nd).compute`` to the last bit."""
        ctx = float(S) + nd
        fixed = self.shapes.get(nd) or self.shapes.setdefault(nd, self.shape(nd, nd))
        return None, free_kv, 0, 0, nd, decode_time(ctx, nd), fixed, ctx

    def computed_through(self, k: int) -> np.ndarray:
        """Each slot's last step of the run's ``k`` that computed a token for it (its last token's)."""
        return np.minimum(np.asarray(self.last, dtype=np.int64), k - 1)

    def _after(self, k: int, plan, nd: int, S: int, kv_free: int) -> tuple[int, int, int]:
        """After step ``k``: the decodes that ended there leave, the prefills it ran progress or join."""
        if k in self.ending:
            nd, S, kv_free = self._finish(k, nd, S, kv_free)
        if plan is not None:
            nd, S, kv_free = self._join(k, plan, nd, S, kv_free)
        return nd, S, kv_free

    def _begin(self) -> tuple:
        """The run's constants and helpers: the copy's latency, when its port is booked until, the
        decode step's closed form, the API servers' clocks, the arrivals' intake."""
        eng = self.o.e
        lat, self.bw_min = eng.links.d2h_terms()
        self.comm_end = eng.links.comm_end if eng.links.comm_booked else None  # the step's TP/PP traffic, booked
        booked = max(p.booked_until for p in eng.links.d2h_route[0])
        self.gpu_free0 = eng.gpu_free
        self.admission = _Admission(eng.sched, eng.sv.block_size, self.room)
        clocks = self.clocks = _Clocks(eng, self.o.fe)
        if self.sep:
            self.detok = DetokClock(eng)
        if not clocks.single and (self.ipc or self.in_api or self.lagged or self.every > 1):
            self.outs = ServerOutputs(eng, self.o.fe, clocks, self.in_api)
        intake = self.intake = _Intake(self.o.fe, eng.table, clocks, eng if self.ipc else None)
        return lat, booked, eng.cost.decode_timer(), clocks, intake  # runs are ineligible with hardware.step_time

    def shape(self, batch: int, sampled: int, tokens: int | None = None) -> tuple:
        """A step's parts that depend on its size alone (``tokens``: those of a step with prompt chunks;
        None: a decode-only step's, one per request): scheduling and preparation, that plus the
        launches, the sampled ids' bytes and copy time, the detokenization and the output objects'
        work, a chunk stream's time, the outputs' message at the engine's end and at the API
        server's (one server: with several, runs have no messages)."""
        eng, fe = self.o.e, self.o.fe
        cpu = eng.cpu
        sched_c = eng.host_cost(batch)
        nbytes = eng.links.d2h_bytes(sampled)
        counts = {0: sampled} if sampled else {}
        if self.in_api:  # the detokenization and the output objects are the API server's work
            cpu = fe.cpu
        launch = eng.launch_cost(batch, False) if tokens is None else eng.launch_cost(tokens, True)
        return (sched_c, sched_c + launch, nbytes, copy_seconds(nbytes, self.bw_min),
                detokenize_cost(cpu, sampled) if sampled else 0.0, outputs_cost(cpu, sampled) if sampled else 0.0,
                sampled * fe.cpu.stream_per_chunk, eng.outputs_message_cost(counts) if self.ipc else 0.0,
                fe.receive_costs(counts).get(0, 0.0) if self.ipc else 0.0)

    def _mixed(self, k: int, nd: int, ctx: float, free_kv: int, budget: int):
        """A step that runs the partial prefill's next chunk or admits waiting requests, as the
        scheduler's rule computes it for the run's state; None where the closed form stops (the
        partial prefill's chunk finds no blocks, nothing runs)."""
        eng = self.o.e
        P, p_comp, p_target = self.partial, self.p_comp, self.p_target
        left = budget - nd
        nrun = nd + (P >= 0)
        pairs = []
        p_take = 0
        if P >= 0:
            p_take = p_target - p_comp
            if p_take > left:
                p_take = left
            if p_take > 0:
                need = -(-(p_comp + p_take) // eng.sv.block_size) - -(-p_comp // eng.sv.block_size)
                if need > free_kv:
                    freed = self.room(need, free_kv, k)
                    if freed is None:
                        return None  # its chunk finds no blocks: the engine's deviation, stepped
                    free_kv += freed
                free_kv -= need
                left -= p_take
                pairs.append((p_comp, p_take))
                if self.pool.cache is not None:
                    eng.sched.register_covered(self.rid[P], p_comp + p_take)
        admission = self.admission
        admit = admission.start(free_kv, k)
        if admission.waiting:  # the scheduler's admission rule over the queue as this run stands
            admit_waiting(admission.head, left, nrun, eng.sv, admission.lacks, admission.take)
            free_kv = admission.free_kv
            pairs.extend((c, n) for _, _, n, c in admit)
        if pairs:
            p_done = P >= 0 and p_take > 0 and p_comp + p_take >= p_target
            ncomp = p_done + sum(1 for _, target, n, c in admit if c + n >= target)
            sampled = nd + ncomp
            new = p_take + sum(n for _, _, n, _ in admit)
            step = (free_kv, new, len(pairs), sampled, eng.cost.step(ctx, nd, pairs, sampled).compute,
                    self.shape(nd + len(pairs), sampled, nd + new))
        elif nd:  # nobody could be admitted: the decodes run alone
            p_done = False
            step = (free_kv, 0, 0, nd, eng.cost.decode_time(ctx, nd), self.shape(nd, nd))
        else:
            return None  # nothing runs: the engine waits
        return _Plan(step, p_take, p_done, admit)

    def _chunks_per_server(self, plan) -> list[int]:
        """With several API servers, the chunks each streams this step: its decodes', and those of
        the prefills the step completed."""
        counts = self.nd_api
        if counts is None or plan is None:
            return counts
        counts = list(counts)
        nserv = len(counts)
        if plan.p_done:
            counts[self.api[self.partial]] += 1
        for rid, target, n, c in plan.admit:
            if c + n >= target:
                counts[rid % nserv] += 1
        return counts

    def _finish(self, k: int, nd: int, S: int, kv_free: int) -> tuple[int, int, int]:
        """The decodes whose last token was step ``k``'s leave the run: their context and blocks."""
        bs = self.o.e.sv.block_size
        c0, s_l, rho, cnt = self.c0, self.s, self.rho, self.cnt
        for slot in self.ending.pop(k):
            nd -= 1
            after = c0[slot] + k - s_l[slot] + 1
            S -= after
            cnt[rho[slot]] -= 1
            if self.every > 1:
                self.scnt[self.phase[slot]] -= 1
                if self.scnt_api is not None:
                    self.scnt_api[self.api[slot]][self.phase[slot]] -= 1
            kv_free += self._freed(slot, after)
            self.finished.append(slot)
            if self.nd_api is not None:
                self.nd_api[self.api[slot]] -= 1
        return nd, S, kv_free

    def room(self, need: int, free: int, k: int) -> int | None:
        """Room for ``need`` blocks for step ``k`` where the run counts ``free`` (``BlockPool.make_room``:
        idle cached prefixes evicted); what it freed is kept by step, so that the run's count includes it
        even where step ``k`` is not committed (:meth:`uncommitted`: the scheduler, taking that step one
        event at a time, finds the room made)."""
        freed = self.pool.make_room(need, free)
        if freed:
            if self.loose_k != k:
                self.loose, self.loose_k = 0, k
            self.loose += freed
        return freed

    def uncommitted(self, k: int) -> int:
        """Blocks evicted for step ``k`` of a run that committed ``k`` steps: the step it did not commit."""
        return self.loose if self.loose_k == k else 0

    def _freed(self, slot: int, computed: int) -> int:
        """The blocks free again once slot ``slot`` leaves with ``computed`` tokens of KV: all of them, or,
        with prefix caching, its private ones (its cached prefix units go back to the cache now, in the
        order the scheduler releases them: ``BlockPool.leave``)."""
        blocks = -(-computed // self.bs)
        if self.pool.cache is None:
            return blocks
        self.left.add(self.rid[slot])
        return self.pool.leave(self.rid[slot], blocks)

    def registered(self, pairs: list) -> None:
        """A processed step's prefix units join the cache (``Scheduler.register_computed``), for the requests
        that have not left the run."""
        if pairs:
            self.o.e.sched.register_computed(pairs, lambda rid, covered: rid not in self.left)

    def _join(self, k: int, plan, nd: int, S: int, kv_free: int) -> tuple[int, int, int]:
        """After a step that prefilled: the partial prefill's progress, the admitted requests as new
        slots, and those whose prefill completed as decodes from the next step."""
        t = self.o.e.table
        joined = []  # slots that completed their prefill in this step
        if self.partial >= 0 and plan.p_take > 0:
            self.p_comp += plan.p_take
            if plan.p_done:
                joined.append((self.partial, self.p_target))
                self.partial = -1
            else:
                self.prefill_rows.append((k, self.rid[self.partial]))
        waiting = self.admission.waiting
        for rid, target, n, c in plan.admit:
            waiting.popleft()
            slot = len(self.rid)
            self.rid.append(rid)
            self.gen0.append(int(t.generated[rid]))
            self.api.append(int(t.api[rid]))
            self.first.append(MAX_STEPS)
            self.last.append(MAX_STEPS)
            self.rho.append(0)
            if self.every > 1:
                self.phase.append(0)
                self.streamed0.append(int(t.streamed[rid]))
            if c + n >= target:
                self.c0.append(target)
                self.s.append(k + 1)
                joined.append((slot, target))
            else:  # the budget's last tokens: the partial prefill, the last running request
                self.c0.append(c + n)
                self.s.append(MAX_STEPS)
                self.partial, self.p_comp, self.p_target = slot, c + n, target
                self.prefill_rows.append((k, rid))
        for slot, target in joined:  # a completed prefill emits its first token in this step
            nd, S, kv_free = self._first_token(k, slot, target, nd, S, kv_free)
        return nd, S, kv_free

    def _first_token(self, k: int, slot: int, target: int, nd: int, S: int, kv_free: int) -> tuple[int, int, int]:
        """Slot ``slot`` completed its prefill of ``target`` tokens in step ``k`` and emitted its first
        token: it finishes there if that was its only one, else decodes from step ``k + 1``."""
        bs = self.o.e.sv.block_size
        self.first[slot] = k
        self.c0[slot] = target
        self.s[slot] = k + 1
        out_left = int(self.o.e.table.output[self.rid[slot]]) - self.gen0[slot] - 1
        if out_left <= 0:  # its only token: it finishes here
            self.last[slot] = k
            self.finished.append(slot)
            return nd, S, kv_free + self._freed(slot, target)
        r = (k + 1 - target) % bs
        self.rho[slot] = r
        self.cnt[r] += 1
        if self.every > 1:
            self._stream_phase(k, slot)
        last = self.last[slot] = k + out_left
        self.ending.setdefault(last, []).append(slot)
        if self.nd_api is not None:
            self.nd_api[self.api[slot]] += 1
        return nd + 1, S + target, kv_free

    def _settle(self, k: int, rows: list, free: float, booked: float, kv_free: int, now: float) -> float | None:
        """Hand the run's ``k`` steps back to the components that own their state: the processes'
        and the port's totals, the engine's step table, the spans and tokens, the queue's state;
        returns ``now``, when the engine's loop resumes (None, with nothing changed, if no step ran)."""
        o, eng = self.o, self.o.e
        if self.after_step:  # a step not committed: the scheduler registers its units again when it takes it
            eng.sched.take_registrations()
        if self.ipc and k == MAX_STEPS:  # what reached the engine before it resumes, as the next step would see it
            free = self.intake.receive_and_join(now, free)
        if k == 0 and not self.intake.took:
            o.fe.give_back_routes(self.intake.routes)
            return None
        first_step = eng.steps.size
        # k x len(ROW), every column as floats (read as one flat stream: twice as fast as np.array's type discovery)
        times = np.fromiter(chain.from_iterable(rows), np.float64, len(rows) * len(ROW)).reshape(len(rows), len(ROW))
        counts = times[:, COUNTS:].astype(np.int64)
        hands = self.detok.table() if self.sep else None
        # the steps' TP/PP traffic first: on a PCIe box it shares the D2H copies' port, which the
        # engine's settlement books until the run's last copy ends (after the last step's traffic)
        comm = self._book_comm(k, first_step, times, counts) if self.comm_end is not None and k else None
        self._settle_engine(k, times, counts, free, booked, hands)
        if self.sep:
            self.detok.settle(times, counts, hands, CHUNKS)
        self.clocks.settle(times, counts)
        o.fe.took_arrivals(self.intake.nxt)
        o.fe.give_back_routes(self.intake.routes)
        if k == 0:  # no step ran, but arrivals were tokenized and requests received: the engine steps on
            return None
        if (self.in_api or self.later or self.sep) and times[-1, 14] > now:  # the API server's last work began after the engine resumed:
            o.fe.env.timeout(float(times[-1, 14]) - o.fe.env.now)  # the simulation lasts until then, as stepped
        # a run's engine process runs nothing but its own steps' work and the requests' messages in: no
        # step's scheduling waits behind the last mile's there (the wait columns: 0, but for ``_waits``);
        # its tokens are detokenized where they were copied (i: the copy's end) or at the API server;
        # x: the outputs made, or at the API server after the outputs' message where one crosses
        zeros, d1_, e_ = np.zeros(k), times[:, 4], times[:, 5]
        o_ = times[:, 10] + times[:, 12]
        comm = zeros if comm is None else comm
        step_times = {"a0": times[:, 0], "a1": times[:, 1], "s0": times[:, 7], "g0": times[:, 2], "g1": times[:, 3],
                      "comm": comm, "d1": d1_, "i": times[:, 17] if self.in_api or self.lagged or self.sep else d1_,
                      "o": o_, "e": e_,
                      "x": times[:, 15] if self.ipc and not self.in_api else e_,
                      **dict.fromkeys(WAIT_COLUMNS, zeros)}
        waits = self._waits(times, counts, hands)
        if waits is not None:
            step_times.update(waits)
        eng.settle_run(k, step_times, counts, self.gpu_free0)
        srv_start = self.clocks.starts
        srv_start[0] = times[:, 6]
        if self.clocks.spans:
            record_spans(self, k, first_step, times, counts, hands)
        self._record(k, first_step, step_times, srv_start)
        check_ordered(times[:, 0], times[:, 7], times[:, 1], times[:, 2], times[:, 3], times[:, 4])
        pool = eng.sched.pool
        require("RUN_MATCHES_POOL", pool.free == kv_free, lambda: f"the run counts {kv_free} free blocks, the pool {pool.free}")
        pool.check()
        return now

    def _book_comm(self, k: int, first_step: int, times, counts):
        """The steps' TP/PP communication booked on the replica's ports from their kernels' end
        (``ReplicaLinks.settle_comm``); returns its seconds per step."""
        links = self.o.e.links
        rec = links.fabric.recorder
        nd, new = counts[:, 1], counts[:, 2]
        labels = None
        if rec is not None and rec.enabled:
            labels = [f"step {first_step + j} ({a}d+{b}p)" for j, a, b in zip(range(k), nd.tolist(), new.tolist())]
        return links.settle_comm(nd + new, times[:, ROW.index("comm start")], labels)

    def _waits(self, times, counts, hands) -> dict | None:
        """What each step's scheduling waited behind on the engine's process (``attribution.wait_activity``)
        where the step before left last-mile work there past its end (:meth:`_left_work`). The first
        step's is read from the process's history, and the last step's tasks go into it, for the step
        after the run. None where no step leaves such work (the columns are 0)."""
        left = self._left_work(times, counts, hands)
        if not left:
            return None
        proc = self.o.e.proc
        a0, start = times[:, 0], times[:, 7]
        waits = {w: np.zeros(len(a0)) for w in WAIT_COLUMNS}
        for w, seconds in zip(WAIT_COLUMNS, wait_activity(proc, float(a0[0]), float(start[0]))):
            waits[w][0] = seconds
        for begin, end, held, column, label in left:
            overlap = np.minimum(end[:-1], start[1:]) - np.maximum(begin[:-1], a0[1:])
            waited = held[:-1] & (start[1:] > a0[1:]) & (overlap > 0)
            waits[column][1:][waited] += overlap[waited]
            if held[-1]:
                proc.ran(float(begin[-1]), float(end[-1]), label)
        return waits

    def _left_work(self, times, counts, hands) -> list:
        """The last-mile tasks each step leaves on the engine's process, in their order there, as
        (begins, ends, whether booked, wait column, label): its stream, where the API server is the
        engine's process; the sampled ids' message, where the API server detokenizes; the entries and
        their message, where a separate process detokenizes."""
        if self.shared:
            dur = counts[:, CHUNKS] * self.o.fe.cpu.stream_per_chunk
            return [(times[:, 6], times[:, 6] + dur, dur > 0, "wstr", "stream")]
        if self.in_api and self.ipc:
            begin, end = times[:, 16], times[:, 14]
            return [(begin, end, (counts[:, EMITTED] > 0) & (end > begin), "wipc", "send outputs")]
        if self.sep:
            hs, built, ms, handed = hands[:, 0], hands[:, 1], hands[:, 2], hands[:, 3]
            return [(hs, built, hands[:, 5] > 0, "wout", "output"), (ms, handed, hands[:, 6] > 0, "wipc", "send outputs")]
        return []

    def _settle_engine(self, k: int, times, counts, free: float, booked: float, hands) -> None:
        """What the run's steps add to the engine process's totals and to the copy's port."""
        eng = self.o.e
        proc = eng.proc
        e_, start_, launched_, s2_ = (times[:, c] for c in (5, 7, 8, 10))
        sampled_ = counts[:, 4]
        emits = counts[:, EMITTED] > 0  # rows whose outputs carry tokens
        sl_, det_, out_ = times[:, 11], times[:, 12], times[:, 13]
        # where the API server detokenizes, the engine process schedules, launches and sends the ids only;
        # where a separate process does, it hands the streaming entries over (``detok_runs``)
        mine = np.zeros(k, dtype=bool) if self.in_api or self.sep else emits
        o_ = s2_ + det_  # detokenized (the engine's first output task's end)
        sched_total = float(sl_.sum())
        det_total, out_total = float(det_[mine].sum()), float(out_[mine].sum())
        built = mine & (out_ > 0)  # an output task booked (one that costs nothing is not)
        busy = proc.busy + (sched_total + det_total + out_total)
        tasks = proc.tasks + k + int(mine.sum()) + int(built.sum())
        rbusy = proc.recorded_busy() + (float((launched_ - start_)[sl_ > 0].sum())
                                        + float((o_ - s2_)[mine & (det_ > 0)].sum()) + float((e_ - o_)[built].sum()))
        labels = {"schedule+launch": sched_total}
        if not (self.in_api or self.sep):
            labels["detokenize"] = det_total
        if built.any():
            labels["output"] = out_total
        if self.sep:
            hand_busy, hand_tasks, hand_rbusy, hand_labels = self.detok.engine_totals(hands)
            busy, tasks, rbusy = busy + hand_busy, tasks + hand_tasks, rbusy + hand_rbusy
            labels.update(hand_labels)
        if self.ipc:  # the outputs' messages out (but to a separate detokenizer), the requests' messages in
            sent_total = 0.0
            if not self.sep:
                msg = times[:, 14][emits] - times[:, 16][emits]
                sent = msg > 0
                sent_total = float(msg[sent].sum())
                if sent.any():
                    labels["send outputs"] = sent_total
                tasks += int(sent.sum())
            intake = self.intake
            busy += sent_total + intake.received[0]
            tasks += intake.received[1]
            rbusy += sent_total + intake.received[2]
            if intake.received[1]:
                labels["receive request"] = intake.received[0]
        proc.settle_run(free, busy, tasks, rbusy, labels)
        nbytes_ = eng.links.d2h_bytes(sampled_[sampled_ > 0])
        secs_total = moved = 0.0
        if len(nbytes_):
            moved, secs_total = float(nbytes_.sum()), float(copy_seconds(nbytes_, self.bw_min).sum())
        eng.links.fabric.settle_run(eng.links.d2h_route[0], booked, secs_total, moved)

    def _record(self, *args) -> None:
        """The run's tokens and the requests' state after it (:func:`run_records.record_tokens`)."""
        record_tokens(self, *args)


class _Plan(NamedTuple):
    """A step that prefills or admits: ``step`` is (free blocks after it, new tokens, prefill chunks,
    sampled ids, GPU compute, its fixed parts); the partial prefill's tokens taken and whether they
    complete it; the admissions (request, target, tokens)."""

    step: tuple
    p_take: int
    p_done: bool
    admit: list


class _Clocks:
    """The API servers' clocks and totals ([free at, busy, tasks, recorded busy] each) while a run plays
    them forward with :meth:`CPUProcess.submit`'s rule and in its order, handed back at the run's end."""

    def __init__(self, eng, fe):
        self.servers = fe.servers
        self.pc = fe.cpu.stream_per_chunk
        # where the API server is the engine's process, what its tasks add (the engine's are added apart)
        self.shared = fe.sv.shared
        self.srv = [[sv.free_at, 0.0, 0, 0.0] if self.shared else [sv.free_at, sv.busy, sv.tasks, sv.recorded_busy()]
                    for sv in self.servers]
        n = len(self.srv)
        self.single = n == 1
        # the one API server detokenizes (several: ``api_runs.ServerOutputs`` plays their work)
        self.in_api = eng.sv.detokenizer == "api_server" and self.single
        self.labels = [{} for _ in range(n)]  # per server: seconds by label that ``ServerOutputs`` booked
        self.starts = [[] for _ in range(n)]  # per server after the first: when each step's stream task began
        self.stream_total = [0.0] * n
        self.tok_total = [0.0] * n
        rec = eng.proc.recorder
        self.spans = rec is not None and rec.enabled  # the steps' spans are made from their times at the end
        self.stream_spans = []  # with spans and several API servers: (server, start, end)
        self.task_spans = []  # with spans and several API servers: (server, label, start, end) of their other tasks
        self.recv_spans = []  # with spans: the one server's receipts of the outputs' messages (start, end)
        self.received = [0.0, 0, 0.0]  # one server's outputs' messages received: busy, tasks, recorded busy

    def detokenize(self, at: float, recv: float, det: float, out: float) -> tuple[float, float, float]:
        """The one API server, from ``at`` (the sampled ids' message sent): receives it (``recv``
        seconds, if any), detokenizes (``det``, always booked) and builds the outputs (``out``, if
        any), before any chunk streams (as ``Frontend.stream_with_detok`` books them; the totals of
        the last two are summed over the run at its end); returns when the ids were there, when
        their detokenization began, and when the outputs were made."""
        state = self.srv[0]
        base = at if at > state[0] else state[0]
        i, ds = (self.receive(base, recv),) * 2 if recv > 0 else (at, base)
        o = ds + det
        state[0] = e = o + out if out > 0 else o
        return i, ds, e

    def receive(self, at: float, seconds: float) -> float:
        """The one API server receives a step's outputs' message, queued at ``at`` (its clock's turn
        taken already: ``at`` is when it starts); returns when it ends."""
        state, got = self.srv[0], self.received
        end = at + seconds
        state[0] = end
        got[0] += seconds
        got[1] += 1
        got[2] += end - at
        if self.spans:
            self.recv_spans.append((at, end))
        return end

    def stream(self, k: int, e: float, sampled: int, counts) -> float:
        """Step ``k``'s chunks from ``e`` on each API server that holds some (``counts``: chunks per
        server; the common case of one server with chunks is inline in :meth:`Run.play`); returns the
        first server's stream start (0 where it streamed nothing)."""
        starts = self.starts
        if not sampled:
            for j in range(1, len(self.srv)):
                starts[j].append(0.0)
            return 0.0
        st0 = 0.0
        for j, c in enumerate(counts):
            st = self.stream_on(j, e, c) if c else 0.0
            if j:
                starts[j].append(st)
            else:
                st0 = st
        return st0

    def stream_on(self, j: int, at: float, chunks: int) -> float:
        """API server ``j`` streams ``chunks`` chunks queued at ``at`` (its clock's turn, as ``submit``
        takes it); returns when the stream began."""
        state = self.srv[j]
        dur = chunks * self.pc
        st = at if at > state[0] else state[0]
        state[0] = st + dur
        state[1] += dur
        self.stream_total[j] += dur
        state[2] += 1
        if dur > 0:
            state[3] += state[0] - st
            if self.spans:
                self.stream_spans.append((j, st, state[0]))
        return st

    def _detokenized(self, times, emits) -> dict:
        """Where the one API server detokenized: its detokenizations' and output objects' totals over
        the run's emitting steps ``emits``, added to its state; returns them by label."""
        state = self.srv[0]
        ds, det, out, e = times[:, 10][emits], times[:, 12][emits], times[:, 13][emits], times[:, 5][emits]
        o = ds + det
        built = out > 0
        state[1] += float(det.sum()) + float(out[built].sum())
        state[2] += len(det) + int(built.sum())
        state[3] += float((o - ds)[det > 0].sum()) + float((e - o)[built].sum())
        labels = {"detokenize": float(det.sum())} if len(det) else {}
        if built.any():
            labels["output"] = float(out[built].sum())
        return labels

    def settle(self, times, counts) -> None:
        """Hand each server's clock and totals back (one server's chunks summed over the run here)."""
        srv = self.srv
        if self.single:
            chunks_ = counts[:, CHUNKS]
            streams = chunks_ > 0
            if self.in_api:  # after its detokenization, a step's stream task is booked, chunks or none
                streams |= counts[:, EMITTED] > 0
            st0_ = times[:, 6]
            dur_ = (chunks_ * self.pc)[streams]
            streamed = float(dur_.sum())
            state = srv[0]
            state[1] += streamed
            state[2] += int(streams.sum())
            state[3] += float(((st0_[streams] + dur_) - st0_[streams])[dur_ > 0].sum())
            self.stream_total[0] = streamed
        labels0 = self._detokenized(times, counts[:, EMITTED] > 0) if self.in_api else {}
        got = self.received
        if got[1]:
            state = srv[0]
            state[1] += got[0]
            state[2] += got[1]
            state[3] += got[2]
        for j, (sv, (f, busy, tasks, rbusy), streamed, tokenized) in enumerate(zip(self.servers, srv, self.stream_total,
                                                                                 self.tok_total)):
            labels = {"receive outputs": got[0]} if j == 0 and got[1] else {}
            if j == 0:
                labels.update(labels0)
            labels.update(self.labels[j])
            if streamed:
                labels["stream"] = streamed
            if tokenized or "tokenize" in sv.by_label:
                labels["tokenize"] = tokenized
            if self.shared:  # added to what the engine's own work left there
                busy, tasks, rbusy = sv.busy + busy, sv.tasks + tasks, sv.recorded_busy() + rbusy
            sv.settle_run(f, busy, tasks, rbusy, labels)


class _Intake:
    """The open loop's arrivals during a run: tokenized on the API servers' clocks in time order as
    the steps they overlap are played, and routed to the queue once their tokenization has ended."""

    def __init__(self, fe, table, clocks: _Clocks, engine=None):
        self.fe, self.t, self.clocks = fe, table, clocks
        self.engine = engine  # where requests cross to the engine as messages: it, to price their receipt
        # what the engine's clock runs between a step's launch and its outputs, if anything: the
        # requests' messages in ("ipc"), or, where the API server is the engine's process, tokenizations
        self.mode = "ipc" if engine is not None else "shared" if fe.sv.shared else None
        self.received = [0.0, 0, 0.0]  # the requests' messages received on the engine: busy, tasks, recorded busy
        self.pending: list = []  # received for a step not yet committed: (route, seconds, start, end)
        self.joining: list = []  # received, not yet queued: their requests in order
        self.saved = None  # with the API server in the engine's process: the state before a step's tokenizations
        self.arr, self.n = table.arrival.values, table.n
        self.nxt = fe.next_rid  # the next arrival the open loop has not handed over
        self.next_t = float(self.arr[self.nxt]) if self.nxt < self.n else float("inf")
        self.routes = fe.take_routes()  # tokenizations still to route: [(tok_end, seq, rid)], a heap
        self.next_route = self.routes[0][0] if self.routes else float("inf")  # when the first of them ends
        self.seq = len(self.routes)
        self.tok_spans = []  # with spans: (server, start, end)
        self.recv_spans = []  # with spans: the requests' messages received on the engine (start, end)

    @property
    def took(self) -> bool:
        """Whether the run took arrivals from the open loop or received requests on the engine."""
        return self.nxt != self.fe.next_rid or self.received[1] > 0

    def receive_before(self, at: float, free: float) -> float:
        """Before the engine's work at ``at`` (a step's start or its copy's end):
        the arrivals until then tokenized, and the requests whose tokenization ended by then
        received on the engine's clock ``free`` in that order; returns the clock after them
        (received for the step: :meth:`keep` commits them, :meth:`unreceive` takes them back)."""
        if self.next_t <= at:
            self.tokenize(at)
        routes, pending, cost = self.routes, self.pending, self.engine.request_message_cost
        while routes and routes[0][0] <= at:
            route = heapq.heappop(routes)
            seconds = cost(route[2])
            st = route[0] if route[0] > free else free
            free = st + seconds
            pending.append((route, seconds, st, free))
        self.next_route = routes[0][0] if routes else float("inf")
        return free

    def keep(self) -> None:
        """The step is committed: what was received for it stays received."""
        got, spans = self.received, self.clocks.spans
        for route, seconds, st, en in self.pending:
            got[0] += seconds
            got[1] += 1
            got[2] += en - st
            self.joining.append(route[2])
            if spans and seconds > 0:
                self.recv_spans.append((st, en))
        self.pending.clear()

    def unreceive(self) -> None:
        """The step is not committed: what was received for it waits to be routed again."""
        for route, *_ in self.pending:
            heapq.heappush(self.routes, route)
        self.pending.clear()
        self.next_route = self.routes[0][0] if self.routes else float("inf")

    def tokenize_on(self, at: float, free: float) -> float:
        """With the API server in the engine's process (one clock, ``free``): the arrivals until
        ``at`` (a step's copy end) tokenized there before the engine's work at ``at``; returns
        the clock after them (for the step: :meth:`commit` keeps them, :meth:`untokenize` undoes them)."""
        clocks = self.clocks
        state = clocks.srv[0]
        self.saved = (state[:], self.nxt, self.next_t, list(self.routes), self.next_route, self.seq,
                      clocks.tok_total[:], len(self.tok_spans))
        state[0] = free
        if self.next_t <= at:
            self.tokenize(at)
        return state[0]

    def before_outputs(self, at: float, free: float) -> float:
        """What the engine's clock ``free`` runs from a step's launch until its outputs at ``at``
        (:meth:`receive_before` or :meth:`tokenize_on`); returns the clock after it, for the step."""
        if self.mode == "ipc":
            return self.receive_before(at, free)
        return self.tokenize_on(at, free)

    def commit(self, free: float) -> None:
        """The step is committed (``free``: the engine's clock after it): what it received stays
        received; where the API server is the engine's process, its clock is the engine's."""
        if self.mode == "ipc":
            self.keep()
        else:
            self.saved = None
            self.clocks.srv[0][0] = free

    def undo(self) -> None:
        """The step is not committed: what it received or tokenized on the engine's clock is undone."""
        if self.mode == "ipc":
            self.unreceive()
        elif self.mode == "shared" and self.saved is not None:
            self.untokenize()

    def untokenize(self) -> None:
        """The step is not committed: its tokenizations are undone (the event path makes them again;
        the table's times it wrote are written again then)."""
        state, self.nxt, self.next_t, self.routes, self.next_route, self.seq, tok_total, spans = self.saved
        self.clocks.srv[0][:] = state
        self.clocks.tok_total[:] = tok_total
        del self.tok_spans[spans:]
        self.saved = None

    def receive_and_join(self, a0: float, free: float) -> float:
        """At a step's start ``a0``: the requests tokenized by then received on the engine's clock
        ``free`` (in order, after those received earlier), then all of them queued; returns the clock."""
        free = self.receive_before(a0, free) if self.routes and self.routes[0][0] <= a0 else free
        self.keep()
        for rid in self.joining:
            self.fe.route(rid, received=True)
        self.joining.clear()
        return free

    def join(self, a0: float, free: float) -> float:
        """At a step's start ``a0``: the requests tokenized by then join the queue (where they cross to
        the engine as messages, received first on its clock ``free``); returns the clock."""
        if self.mode == "ipc":
            return self.receive_and_join(a0, free)
        self.route_due(a0)
        return free

    def route_due(self, a0: float) -> None:
        """The tokenizations that ended by ``a0`` join the waiting queue."""
        routes = self.routes
        while routes and routes[0][0] <= a0:
            self.fe.route_tokenized(heapq.heappop(routes)[2])
        self.next_route = routes[0][0] if routes else float("inf")

    def tokenize(self, resume: float) -> None:
        """The arrivals up to ``resume`` (a step's end, or when its outputs reach the API server), each
        parsed and tokenized on its API server's clock and queued for routing at its end."""
        fe, t, clocks, arr = self.fe, self.t, self.clocks, self.arr
        while self.next_t <= resume:
            rid, at = self.nxt, self.next_t
            t.arrival.reach(rid)
            j, _, tok = fe.tokenize_cost(rid)
            clocks.tok_total[j] += tok
            state = clocks.srv[j]
            st = at if at > state[0] else state[0]
            en = st + tok
            state[0] = en
            state[1] += tok
            state[2] += 1
            if tok > 0:
                state[3] += en - st
                if clocks.spans:
                    self.tok_spans.append((j, st, en))
            t.api[rid] = j
            t.tok_start[rid], t.tok_end[rid] = st, en
            heapq.heappush(self.routes, (en, self.seq, rid))
            if en < self.next_route:
                self.next_route = en
            self.seq += 1
            self.nxt += 1
            self.next_t = float(arr[self.nxt]) if self.nxt < self.n else float("inf")


class _Admission:
    """The run's side of :func:`~.scheduler.admit_waiting`: the queue as the run stands (requests
    it admitted are still in it, from ``at`` on the next step's candidates) and its free blocks; what
    a waiting request lacks is the scheduler's rule (``Scheduler.lacks``: with prefix caching, its
    cached prefix is looked up once), and its blocks are taken as the scheduler takes them (evicting
    idle cached prefixes where the free ones fall short: ``BlockPool.make_room``; with prefix caching,
    the units its KV will cover are cached at once: ``Scheduler.register_covered``). A step that is
    not committed leaves what the scheduler itself would do again at that step as done: the
    scheduler finds the look-up made, the room made and the units cached."""

    def __init__(self, sched, block_size: int, room):
        self.sched, self.waiting, self.t, self.bs = sched, sched.waiting, sched.table, block_size
        self.lacks, self.cache = sched.lacks, sched.cache
        self.room = room  # the run's eviction (``Run.room``)
        self.at, self.k = 0, 0
        self.free_kv = 0
        self.admit: list = []  # this step's admissions: (request, its target, tokens, computed before)

    def start(self, free_kv: int, k: int) -> list:
        """Step ``k``'s admission begins with ``free_kv`` blocks free; returns its (empty) list of admissions."""
        self.at, self.free_kv, self.admit, self.k = 0, free_kv, [], k
        return self.admit

    def head(self):
        return self.waiting[self.at] if self.at < len(self.waiting) else None

    def take(self, rid: int, n: int) -> bool:
        t = self.t
        c = int(t.computed[rid])  # its cached prefix (0 without one)
        need = -(-(c + n) // self.bs) - int(t.blocks[rid])
        if need > self.free_kv:
            freed = self.room(need, self.free_kv, self.k)
            if freed is None:
                return False
            self.free_kv += freed
        self.free_kv -= need
        self.at += 1
        self.admit.append((rid, int(t.target[rid]), n, c))
        if self.cache is not None:
            self.sched.register_covered(rid, c + n)
        return True
