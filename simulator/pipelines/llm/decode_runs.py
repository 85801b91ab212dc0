"""Runs of engine steps in closed form: K steps computed in one pass instead of one SimPy wake-up each.

In an engine whose every step is a closed form of its batch (which set-ups those are, each serving
key's owning module declares in ``run_support``, with the engine's own conditions there: today
synchronous overlap, detokenization in the engine, every token streamed, one replica, an open-loop
workload, a GPU with no step communication, no CPU-core contention, no speculative decoding, no
prefix cache or host KV tier), nothing outside the engine changes its world but the requests
arriving, and their arrival times are known. So a run of steps can be played forward at once: before each step, the requests whose tokenization has
ended join the waiting queue; the step is scheduled as vLLM V1's scheduler would (the running
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
free KV blocks is checked against the block pool's (invariant RUN_MATCHES_POOL). Where a scenario's setup does not allow runs at all, every step is stepped. With
spans recorded, a run records the same spans in the same order.
"""

from __future__ import annotations

import heapq

import numpy as np

from ...hardware.link import booked_copy, copy_seconds
from ...invariants import require
from ...observe.attribution import WAIT_COLUMNS, check_ordered
from .run_records import record_spans, record_tokens
from .run_support import engine_blockers, serving_blockers
from .scheduler import admit_waiting
from .settings import detokenize_cost, outputs_cost, schedule_cost

COUNTS = 14
"""The first integer column of a run's step table (batch, decodes, prefill tokens, KV blocks used, sampled ids,
the decodes' context tokens)."""

MAX_STEPS = 256
"""Steps in one run at most: what the token ledger's step ring and retirement lag allow for
(``observe.token_ledger``); a longer stretch is several runs."""


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
        if now >= self.horizon:
            return None
        run = np.fromiter(running, dtype=np.int64, count=len(running))
        comp = t.computed[run]
        target = t.target[run]
        gen = t.generated[run]
        if (t.sent[run] != gen).any() or (t.blocks[run] != -(-comp // bs)).any():
            return None
        partial = comp < target
        if partial[:-1].any():
            return None  # a partial prefill that is not the last running request: the general rule
        return Run(self, run, comp, target, gen, bool(len(run) and partial[-1])).play(now)


class Run:
    """One run's state while it is played and recorded: the requests as slots in running order."""

    def __init__(self, owner: DecodeRuns, run, comp, target, gen, last_partial: bool):
        self.o = owner
        eng = owner.e
        t = eng.table
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

    def play(self, now: float) -> float | None:
        """Walk the run's time chain step by step until a step the closed form does not cover, then
        record the steps played; returns when the engine's loop resumes (None: no step played)."""
        o = self.o
        eng, fe, t, sched = o.e, o.fe, o.e.table, o.e.sched
        sv, cpu, cost = eng.sv, eng.cpu, eng.cost
        budget, bs = sv.max_batched_tokens, sv.block_size
        horizon = o.horizon
        proc = eng.proc
        launch = eng.launch_cost
        ports, _ = eng.links.d2h_route
        lat, bw_min = eng.links.d2h_terms()
        d2h_bytes = eng.links.d2h_bytes
        booked = max(p.booked_until for p in ports)
        servers, pc = fe.servers, fe.cpu.stream_per_chunk
        nserv = len(servers)
        decode_time = cost.decode_timer()  # runs are ineligible with hardware.step_time
        shapes = o.shapes  # decode-only batch size -> its step's fixed parts (see ``shape``)

        def shape(batch: int, sampled: int) -> tuple:
            """A step's parts that depend on its size alone: scheduling and preparation, that plus the
            launches, the sampled ids' bytes and copy time, the detokenization and the output objects'
            work, a chunk stream's time."""
            sched_c = schedule_cost(cpu, batch)
            nbytes = d2h_bytes(sampled)
            return (sched_c, sched_c + launch, nbytes, copy_seconds(nbytes, bw_min),
                    detokenize_cost(cpu, sampled) if sampled else 0.0, outputs_cost(cpu, sampled) if sampled else 0.0,
                    sampled * pc)

        prompt_col, gen_col, arrival = t.prompt, t.generated, t.arrival
        arr = arrival.values
        n_req = t.n
        # the state the chain reads and the accumulators it grows, as locals
        free, p_busy, p_tasks = proc.free_at, proc.busy, proc.tasks
        rec = proc.recorder
        p_rbusy = proc.recorded_busy()
        gpu_free = gpu_free0 = eng.gpu_free
        kv_free, kv_total = sched.pool.free, sched.pool.total
        srv = [[sv_.free_at, sv_.busy, sv_.tasks, sv_.recorded_busy()] for sv_ in servers]
        srv_start = [[] for _ in servers]  # per server after the first: when each step's stream task began
        single = nserv == 1  # one API server: its clock and totals as locals
        s0_free, s0_busy, s0_tasks, s0_rbusy = srv[0]
        s0_stream = 0.0
        stream_total = [0.0] * nserv
        tok_total = [0.0] * nserv
        # per step: a0, a1, g0, g1, d1, e, the first API server's stream start, the engine's start,
        # launch end, the copy's begin, the detokenization start, the scheduling and launch time, the
        # detokenization's and the output objects' work; batch, decodes, prefill tokens, KV blocks
        # used, sampled ids, the decodes' context
        rows = []
        spans = rec is not None and rec.enabled  # the steps' spans are made from their times at the end
        tok_spans = []     # with spans: (step, after the detokenization began, server, start, end)
        stream_spans = []  # with spans and several API servers: (step, server, start, end)
        first_step = eng.steps.size
        waiting = sched.waiting
        # arrivals: the next one the open loop has not handed over; tokenizations still to route
        nxt = fe.next_rid
        next_t = float(arr[nxt]) if nxt < n_req else float("inf")
        routes = fe.take_routes()  # [(tok_end, seq, rid)], a heap
        inf = float("inf")
        next_route = routes[0][0] if routes else inf  # when the first of them ends
        seq = len(routes)
        rid_l, c0, s_l, first_l, last_l = self.rid, self.c0, self.s, self.first, self.last
        gen0, api_l, cnt, rho, ending = self.gen0, self.api, self.cnt, self.rho, self.ending
        nd_api = self.nd_api
        S, nd = self.S, self.nd
        P = self.partial
        p_comp, p_target = self.p_comp, self.p_target
        admission = _Admission(waiting, prompt_col, gen_col, bs)
        k = 0
        while k < MAX_STEPS:
            a0 = now
            if next_route <= a0:  # tokenized before this step: they join the queue
                while routes and routes[0][0] <= a0:
                    fe.route(heapq.heappop(routes)[2])
                next_route = routes[0][0] if routes else inf
            # -- schedule (vLLM V1's rule for this state, as Scheduler.schedule computes it) --
            nrun = nd + (P >= 0)
            if nrun > budget:
                break
            alloc = cnt[k % bs]
            if alloc > kv_free:
                break  # the decodes' blocks do not fit: the step-by-step path preempts
            free_kv = kv_free - alloc
            ctx = float(S) + nd
            if P < 0 and not waiting:  # decodes only: ``cost.step(ctx, nd).compute`` to the last bit
                if not nd:
                    break  # nothing runs: the engine waits
                pairs = None
                new_tokens = nchunks = 0
                sampled = nd
                fixed = shapes.get(nd)
                if fixed is None:
                    fixed = shapes[nd] = shape(nd, nd)
                sched_c, sl, nbytes, secs, det, out, dur = fixed
                compute = decode_time(ctx, nd)
            else:
                left = budget - nd
                pairs = []
                p_take = 0
                if P >= 0:
                    p_take = p_target - p_comp
                    if p_take > left:
                        p_take = left
                    if p_take > 0:
                        need = -(-(p_comp + p_take) // bs) - -(-p_comp // bs)  # beyond the blocks it holds
                        if need > free_kv:
                            break  # its chunk finds no blocks: the engine's deviation, stepped
                        free_kv -= need
                        left -= p_take
                        pairs.append((p_comp, p_take))
                admit = admission.start(free_kv)
                if waiting:  # the scheduler's admission rule over the queue as this run stands
                    left = admit_waiting(admission.head, left, nrun, sv, admission.lacks, admission.take)
                    free_kv = admission.free_kv
                    nrun += len(admit)
                    pairs.extend((0, n) for _, _, n in admit)
                if pairs:
                    p_done = P >= 0 and p_take > 0 and p_comp + p_take >= p_target
                    ncomp = p_done + sum(1 for _, target, n in admit if n >= target)
                    new_tokens = p_take + sum(n for _, _, n in admit)
                    nchunks = len(pairs)
                    sampled = nd + ncomp
                    compute = cost.step(ctx, nd, pairs, sampled).compute
                    fixed = shape(nd + nchunks, sampled)
                elif nd:  # nobody could be admitted: the decodes run alone
                    p_done = False
                    new_tokens = nchunks = 0
                    sampled = nd
                    compute = cost.decode_time(ctx, nd)
                    fixed = shape(nd, nd)
                else:
                    break  # nothing runs: the engine waits
                sched_c, sl, nbytes, secs, det, out, dur = fixed
            batch = nd + nchunks
            start = a0 if a0 > free else free
            launched = start + sl
            a1 = start + sched_c
            g0 = a1 if a1 > gpu_free else gpu_free
            g1 = g0 + compute
            if launched > g1:
                g1 = launched
            begin, d1 = booked_copy(booked, g1, lat, secs)
            t_done = a0 + (d1 - a0)  # the step's done event
            if sampled:
                s2 = d1 if d1 > launched else launched
                e = s2 + det + out  # detokenized at s2 + det (as the engine books its two tasks)
                resume = t_done + (e - t_done) if e > t_done else t_done
            else:
                e = resume = t_done
            if not resume < horizon:
                break
            # -- committed (its busy times, KV-time, bytes are summed over the run at its end) --
            free = e if sampled else launched
            gpu_free = g1
            used = kv_total - free_kv
            if nbytes > 0:
                booked = d1
            # -- the arrivals this step overlaps: tokenized on the API servers in time order --
            while next_t <= resume:
                rid = nxt
                arrival.reach(rid)
                j, _, tok = fe.tokenize_cost(rid)
                tok_total[j] += tok
                if single:
                    st = next_t if next_t > s0_free else s0_free
                    en = s0_free = st + tok
                    s0_busy += tok
                    s0_tasks += 1
                    if tok > 0:
                        s0_rbusy += en - st
                else:
                    state = srv[j]
                    st = next_t if next_t > state[0] else state[0]
                    en = st + tok
                    state[0] = en
                    state[1] += tok
                    state[2] += 1
                    if tok > 0:
                        state[3] += en - st
                if spans and tok > 0:
                    tok_spans.append((k, next_t > t_done, j, st, en))
                t.api[rid] = j
                t.tok_start[rid], t.tok_end[rid] = st, en
                heapq.heappush(routes, (en, seq, rid))
                if en < next_route:
                    next_route = en
                seq += 1
                nxt += 1
                next_t = float(arr[nxt]) if nxt < n_req else float("inf")
            # -- the step's outputs: each API server serializes its requests' chunks at e --
            if sampled and single:  # the common case: one API server streams every chunk
                st0 = e if e > s0_free else s0_free
                s0_free = st0 + dur
            elif sampled:
                st0 = 0.0
                for j in range(nserv):
                    state = srv[j]
                    c = nd_api[j]
                    if pairs:  # and the prefills this step completed, on this server
                        c += (p_done and api_l[P] == j) + sum(
                            1 for rid, target, n in admit if n >= target and rid % nserv == j)
                    if c:
                        dur = c * pc
                        st = e if e > state[0] else state[0]
                        state[0] = st + dur
                        state[1] += dur
                        stream_total[j] += dur
                        state[2] += 1
                        if dur > 0:
                            state[3] += state[0] - st
                            if spans:
                                stream_spans.append((k, j, st, state[0]))
                    else:
                        st = 0.0
                    if j:
                        srv_start[j].append(st)
                    else:
                        st0 = st
            else:
                st0 = 0.0
                for j in range(1, nserv):
                    srv_start[j].append(0.0)
            rows.append((a0, a1, g0, g1, d1, e, st0, start, launched, begin, s2 if sampled else e, sl, det, out,
                         batch, nd, new_tokens, used, sampled, ctx))
            # -- the requests' state after the step --
            kv_free = free_kv
            S += nd
            for slot in ending.pop(k, ()):
                nd -= 1
                after = c0[slot] + k - s_l[slot] + 1
                S -= after
                cnt[rho[slot]] -= 1
                kv_free += -(-after // bs)
                self.finished.append(slot)
                if nd_api is not None:
                    nd_api[api_l[slot]] -= 1
            if pairs is None:
                now = resume
                k += 1
                continue
            joined = []  # slots that completed their prefill in this step
            if P >= 0 and p_take > 0:
                p_comp += p_take
                if p_done:
                    joined.append((P, p_target))
                    P = -1
                else:
                    self.prefill_rows.append((k, rid_l[P]))
            for rid, target, n in admit:
                waiting.popleft()
                slot = len(rid_l)
                rid_l.append(rid)
                gen0.append(int(gen_col[rid]))
                api_l.append(int(t.api[rid]))
                if n >= target:
                    c0.append(target)
                    s_l.append(k + 1)
                    first_l.append(MAX_STEPS)
                    last_l.append(MAX_STEPS)
                    rho.append(0)
                    joined.append((slot, target))
                else:  # the budget's last tokens: the partial prefill, the last running request
                    c0.append(n)
                    s_l.append(MAX_STEPS)
                    first_l.append(MAX_STEPS)
                    last_l.append(MAX_STEPS)
                    rho.append(0)
                    P, p_comp, p_target = slot, n, target
                    self.prefill_rows.append((k, rid))
            for slot, target in joined:  # a completed prefill emits its first token in this step
                first_l[slot] = k
                g = gen0[slot] + 1
                out_left = int(t.output[rid_l[slot]]) - g
                if out_left <= 0:  # its only token: it finishes here
                    last_l[slot] = k
                    s_l[slot] = k + 1
                    c0[slot] = target
                    kv_free += -(-target // bs)
                    self.finished.append(slot)
                    continue
                c0[slot] = target
                s_l[slot] = k + 1
                r = (k + 1 - target) % bs
                rho[slot] = r
                cnt[r] += 1
                nd += 1
                S += target
                last = k + out_left
                last_l[slot] = last
                ending.setdefault(last, []).append(slot)
                if nd_api is not None:
                    nd_api[api_l[slot]] += 1
            now = resume
            k += 1
        if k == 0:
            fe.give_back_routes(routes)
            return None
        times = np.array(rows)  # k x 20, every column as floats (whole numbers exactly)
        counts = times[:, COUNTS:].astype(np.int64)
        # -- the run's sums: what each step adds to the processes' and the ports' totals --
        e_, st0_, start_, launched_, s2_ = (times[:, c] for c in (5, 6, 7, 8, 10))
        sampled_ = counts[:, 4]
        emits = sampled_ > 0
        sl_, det_, out_ = times[:, 11], times[:, 12], times[:, 13]
        o_ = s2_ + det_  # detokenized (the engine's first output task's end)
        sched_total = float(sl_.sum())
        det_total, out_total = float(det_[emits].sum()), float(out_[emits].sum())
        built = emits & (out_ > 0)  # an output task booked (one that costs nothing is not)
        p_busy += sched_total + det_total + out_total
        p_tasks += k + int(emits.sum()) + int(built.sum())
        p_rbusy += (float((launched_ - start_)[sl_ > 0].sum()) + float((o_ - s2_)[emits & (det_ > 0)].sum())
                    + float((e_ - o_)[built].sum()))
        nbytes_ = eng.links.d2h_bytes(sampled_[emits])
        secs_total = moved = 0.0
        if len(nbytes_):
            moved, secs_total = float(nbytes_.sum()), float(copy_seconds(nbytes_, bw_min).sum())
        if single:
            dur_ = (sampled_ * pc)[emits]
            streamed = float(dur_.sum())
            s0_busy += streamed
            s0_stream += streamed
            s0_tasks += int(emits.sum())
            s0_rbusy += float(((st0_[emits] + dur_) - st0_[emits])[dur_ > 0].sum())
            srv[0] = [s0_free, s0_busy, s0_tasks, s0_rbusy]
            stream_total[0] = s0_stream
        # -- the run handed back to the components that own its state --
        labels = {"schedule+launch": sched_total, "detokenize": det_total}
        if built.any():
            labels["output"] = out_total
        proc.settle_run(free, p_busy, p_tasks, p_rbusy, labels)
        eng.links.fabric.settle_run(ports, booked, secs_total, moved)
        for sv_, (f, busy, tasks, rbusy), streamed, tokenized in zip(servers, srv, stream_total, tok_total):
            labels = {"stream": streamed} if streamed else {}
            if tokenized or "tokenize" in sv_.by_label:
                labels["tokenize"] = tokenized
            sv_.settle_run(f, busy, tasks, rbusy, labels)
        fe.took_arrivals(nxt)
        fe.give_back_routes(routes)
        self.p_comp, self.partial = p_comp, P
        # a run's engine process runs nothing but its own steps' work: no step's scheduling waits behind
        # the last mile's there (the wait columns: 0); its tokens cross no process (i: the copy's end,
        # x: the outputs made)
        zeros, d1_ = np.zeros(k), times[:, 4]
        step_times = {"a0": times[:, 0], "a1": times[:, 1], "s0": times[:, 7], "g0": times[:, 2], "g1": times[:, 3],
                      "comm": zeros, "d1": d1_, "i": d1_, "o": o_, "e": e_, "x": e_, **dict.fromkeys(WAIT_COLUMNS, zeros)}
        eng.settle_run(k, step_times, counts, gpu_free0)
        srv_start[0] = times[:, 6]
        if spans:
            record_spans(self, k, first_step, times, counts, tok_spans, stream_spans)
        self._record(k, first_step, step_times, srv_start)
        check_ordered(times[:, 0], times[:, 7], times[:, 1], times[:, 2], times[:, 3], times[:, 4])
        pool = sched.pool
        require("RUN_MATCHES_POOL", pool.free == kv_free, lambda: f"the run counts {kv_free} free blocks, the pool {pool.free}")
        pool.check()
        return now

    def _record(self, *args) -> None:
        """The run's tokens and the requests' state after it (:func:`run_records.record_tokens`)."""
        record_tokens(self, *args)


class _Admission:
    """The run's side of :func:`~.scheduler.admit_waiting`: the queue as the run stands (requests
    it admitted are still in it, from ``at`` on the next step's candidates) and its free blocks; a
    waiting request lacks its whole target (no prefix cache, no host tier in a run)."""

    def __init__(self, waiting, prompt, generated, block_size: int):
        self.waiting, self.prompt, self.generated, self.bs = waiting, prompt, generated, block_size
        self.at = 0
        self.free_kv = 0
        self.admit: list = []  # this step's admissions: (request, its target, tokens)

    def start(self, free_kv: int) -> list:
        """A step's admission begins with ``free_kv`` blocks free; returns its (empty) list of admissions."""
        self.at, self.free_kv, self.admit = 0, free_kv, []
        return self.admit

    def head(self):
        return self.waiting[self.at] if self.at < len(self.waiting) else None

    def lacks(self, rid: int) -> int:
        return int(self.prompt[rid] + self.generated[rid])

    def take(self, rid: int, n: int) -> bool:
        need = -(-n // self.bs)
        if need > self.free_kv:
            return False
        self.free_kv -= need
        self.at += 1
        self.admit.append((rid, int(self.prompt[rid] + self.generated[rid]), n))
        return True
