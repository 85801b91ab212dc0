"""Runs of decode steps in closed form: K engine steps computed at once instead of one SimPy wake-up each.

Between two events that change a batch (a request arriving, the budget or the KV cache running
out, the horizon) an engine whose running requests all decode steps through a fixed sequence:
each step's batch is the running set minus the requests that finished before it, its GPU time is
the cost model's closed form of that batch, and every CPU process and port the step touches is
used by this engine alone. So the whole run is known at its start: this module computes its steps'
times with the same arithmetic, in the same order, as the step-by-step engine (a short scalar loop
over the steps' time chain; numpy over the requests), records them as that engine would, and lets
the engine sleep until the run's last step is done. Eligible only where that reasoning holds —
synchronous overlap, detokenization in the engine, every token streamed, one replica, an open-loop
workload, a GPU with no step communication, no CPU-core contention, no speculative decoding (a
step's tokens per request are random draws) — anything else takes the
step-by-step path, and a test compares both on real traces. With spans recorded, a run records the
same spans in the same order.
"""

from __future__ import annotations

import numpy as np

from ...observe.records import SENT
from .links import SAMPLED_ID_BYTES


class DecodeRuns:
    """Closed-form decode runs of one :class:`~simulator.pipelines.llm.engine.Engine`."""

    def __init__(self, engine, frontend, horizon: float | None):
        self.e = engine
        self.fe = frontend
        self.horizon = float("inf") if horizon is None else horizon
        self.shortest = 0.0  # the shortest step seen in a run: what bounds how many fit before an event
        self.latest = 0.0    # the latest such step: a run is not tried where not even it would fit

    @staticmethod
    def eligible(engine, frontend, open_loop: bool, replicas: int) -> bool:
        """Whether the engine's set-up allows runs at all (the per-run conditions come later)."""
        sv = engine.sv
        cpu = engine.cpu
        return (open_loop and replicas == 1 and sv.overlap == "sync" and sv.detokenizer == "engine"
                and sv.stream_interval == 1 and engine.closed_form and not engine.proc.pool.contended
                and sv.api_server_process == "own" and not cpu.has_ipc
                and sv.multi_step == 1 and engine.sched.cache is None and engine.spec is None)

    def run(self) -> float | None:
        """Commit the longest decode run that can start now; returns when its last step's output
        was handed to the frontend (the time the engine's loop resumes), or None if no step of
        the current state can run in closed form."""
        eng, t = self.e, self.e.table
        sched = eng.sched
        if sched.waiting or not sched.running or len(sched.running) > eng.sv.max_batched_tokens:
            return None
        bound = min(self.fe.next_event(), self.horizon)  # nothing else may happen before this
        room = bound - eng.env.now
        if room <= self.shortest or room < 0.9 * self.latest:
            return None  # one step would not fit before the next event (the run would be empty)
        run = np.fromiter(sched.running, dtype=np.int64, count=len(sched.running))
        comp0 = t.computed[run]
        if (t.target[run] > comp0).any() or (t.sent[run] != t.generated[run]).any():
            return None
        left = t.output[run] - t.generated[run]          # steps each request still decodes
        # Plan no further than the steps that could fit (the rest is planned when this run ends).
        fit = int(room / self.shortest) + 1 if self.shortest > 0 and room < float("inf") else 256
        plan = self._plan(run, comp0, left, min(int(left.max()), fit, 256))
        if plan is None:
            return None
        steps, active, n, ctx, used, blocks = plan
        return self._commit(run, comp0, left, steps, active, n, ctx, used, blocks, bound)

    def _plan(self, run, comp0, left, k_max: int):
        """Up to ``k_max`` steps the KV cache allows: per step, who is active, the batch, the
        context sum, the blocks in use after the step's allocation, and the blocks each step
        allocates and frees."""
        eng, t, sched = self.e, self.e.table, self.e.sched
        bs = eng.sv.block_size
        ks = np.arange(k_max)
        active = left[None, :] > ks[:, None]                        # step x request
        n = active.sum(axis=1)
        comp_sum = (active * comp0[None, :]).sum(axis=1)
        ctx = comp_sum.astype(float) + ks * n                      # computed tokens before each step
        ctx = ctx + n                                               # ... plus the token each adds
        blocks0 = t.blocks[run]
        need0 = (comp0 + bs) // bs - blocks0                        # step 0: as the scheduler computes it
        if (need0 < 0).any():
            return None
        # later steps: a request needs one more block when its computed count reaches a multiple
        newblk = ((comp0[None, :] + ks[:, None]) % bs == 0) & active
        newblk[0] = False
        alloc = newblk.sum(axis=1)
        alloc[0] = int(need0.sum())
        # a request finishing at step k frees its blocks before step k+1 is scheduled
        final_blocks = np.maximum(blocks0, (comp0 + left - 1 + bs) // bs)
        freed = np.zeros(k_max + 1, dtype=np.int64)
        ending = left <= k_max
        np.add.at(freed, left[ending], final_blocks[ending])        # freed after step left-1, i.e. before step `left`
        free_before = sched.kv_free - np.cumsum(alloc) + alloc + np.cumsum(freed[:k_max])
        ok = alloc <= free_before
        steps = k_max if ok.all() else int(np.argmin(ok))
        if steps == 0:
            return None
        used = sched.kv_total - (free_before - alloc)
        return steps, active, n, ctx, used, (alloc, freed)

    def _commit(self, run, comp0, left, steps, active, n, ctx, used, blocks, bound):
        """Walk the run's time chain, stop before the first step that would reach ``bound``, and
        record the steps that fit as the step-by-step engine would. Every accumulator (busy time,
        KV-time, bytes) grows by the same additions in the same order as there."""
        eng, fe, t = self.e, self.fe, self.e.table
        cpu, proc, cost = eng.cpu, eng.proc, eng.cost
        compute = cost.decode_compute(ctx[:steps], n[:steps]).tolist()
        nn = n[:steps].tolist()
        used_l = used[:steps].tolist()
        # scheduling and input preparation, per step and per request, summed as the engine sums them
        sps, spr, launch = cpu.schedule_per_step, cpu.schedule_per_request, eng.launch_cost
        pps, ppr = cpu.prepare_per_step, cpu.prepare_per_request
        dsf, dpt, opr = cpu.detokenize_step_fixed, cpu.detokenize_per_token, cpu.output_per_request
        ports, lat = eng.links.d2h_route
        bw_min = min(p.bandwidth for p in ports)
        booked = max(p.booked_until for p in ports)
        servers, pc = fe.servers, fe.cpu.stream_per_chunk
        if len(servers) == 1:
            counts = [nn]
        else:
            api = t.api[run]
            counts = [(active[:steps] & (api == j)[None, :]).sum(axis=1).tolist() for j in range(len(servers))]
        # the state the chain reads and the accumulators it grows, as locals
        free, p_busy, p_tasks = proc.free_at, proc.busy, proc.tasks
        rec = proc.recorder
        p_track = proc.track
        p_rbusy = rec.busy.get(p_track, 0.0) if rec is not None else 0.0
        gpu_free, gpu_busy, kv_sum, kv_peak = eng.gpu_free, eng.gpu_busy, eng.kv_sum, eng.kv_peak
        gap_sum, gap_steps, gap_max = eng.gap_sum, eng.gap_steps, eng.gap_max
        sched_total = work_total = 0.0
        stream_total = [0.0] * len(servers)
        frec = eng.links.fabric.recorder
        port_state = [[p.busy_time, p.bytes_moved, frec.busy.get(p.track, 0.0) if frec is not None else 0.0]
                      for p in ports]
        srv = [[sv.free_at, sv.busy, sv.tasks, sv.recorder.busy.get(sv.track, 0.0) if sv.recorder is not None
                else 0.0] for sv in servers]
        srv_start = [[] for _ in servers]
        cols = [[] for _ in range(6)]  # a0, a1, g0, g1, d1, e
        spans = [] if rec is not None and rec.enabled else None  # (track, name, start, end, category)
        first = eng.steps.size
        gpu_tracks = eng.gpu_tracks
        s_tracks = [sv.track for sv in servers]
        now = eng.env.now
        shortest = self.shortest
        k = 0
        while k < steps:
            nk = nn[k]
            a0 = now
            sched = sps + spr * nk + pps + ppr * nk
            start = a0 if a0 > free else free
            launched = start + (sched + launch)
            a1 = start + sched
            g0 = a1 if a1 > gpu_free else gpu_free
            g1 = g0 + compute[k]
            if launched > g1:
                g1 = launched
            begin = (g1 if g1 > booked else booked) + lat
            nbytes = SAMPLED_ID_BYTES * nk
            secs = nbytes / bw_min
            d1 = begin + secs
            work = dsf + dpt * nk + opr * nk
            s2 = d1 if d1 > launched else launched
            e = s2 + work
            if not e < bound:
                break
            # the engine process: schedule+launch, then detokenize
            sched_total += sched + launch
            work_total += work
            p_busy += sched + launch
            p_tasks += 1
            if sched + launch > 0:
                p_rbusy += launched - start
            p_busy += work
            p_tasks += 1
            if work > 0:
                p_rbusy += e - s2
            free = e
            # the GPU and the booked D2H copy (a run's steps follow one another: every gap counts)
            gap = g0 - gpu_free
            gap_sum += gap
            gap_steps += 1
            if gap > gap_max:
                gap_max = gap
            gpu_free = g1
            gpu_busy += g1 - g0
            kv_sum += used_l[k] * (g1 - g0)
            if used_l[k] > kv_peak:
                kv_peak = used_l[k]
            booked = d1
            for st in port_state:
                st[0] += secs
                st[1] += nbytes
                st[2] += secs
            # each API server serializes its requests' chunks at the detokenization's end
            for j, state in enumerate(srv):
                c = counts[j][k]
                if c:
                    dur = c * pc
                    st = e if e > state[0] else state[0]
                    state[0] = st + dur
                    state[1] += dur
                    stream_total[j] += dur
                    state[2] += 1
                    if dur > 0:
                        state[3] += state[0] - st
                    srv_start[j].append(st)
                else:
                    srv_start[j].append(0.0)
            for col, v in zip(cols, (a0, a1, g0, g1, d1, e)):
                col.append(v)
            if spans is not None:
                label = f"step {first + k} ({nk}d+0p)"
                if sched + launch > 0:
                    spans.append((p_track, "schedule+launch", start, launched, "cpu"))
                spans.extend((g, label, g0, g1, "decode") for g in gpu_tracks)
                if nbytes > 0:
                    spans.extend((p.track, "d2h", begin, d1, "link") for p in ports)
                if work > 0:
                    spans.append((p_track, "detokenize", s2, e, "cpu"))
                for j, state in enumerate(srv):
                    c = counts[j][k]
                    if c and c * pc > 0:
                        spans.append((s_tracks[j], "stream", srv_start[j][-1], state[0], "cpu"))
            t_done = a0 + (d1 - a0)  # the step's done event; then the engine waits for e
            now = t_done + (e - t_done) if e > t_done else t_done
            if shortest == 0.0 or e - a0 < shortest:
                shortest = e - a0
            k += 1
        self.shortest = shortest
        if k == 0:
            return None
        self.latest = cols[5][-1] - cols[0][-1]
        proc.free_at, proc.busy, proc.tasks = free, p_busy, p_tasks
        for label, total in (("schedule+launch", sched_total), ("detokenize", work_total)):
            proc.by_label[label] = proc.by_label.get(label, 0.0) + total
        eng.gap_sum, eng.gap_steps, eng.gap_max = gap_sum, gap_steps, gap_max
        eng._after_idle = False
        if rec is not None:
            rec.busy[p_track] = p_rbusy
        eng.gpu_free, eng.gpu_busy, eng.kv_sum, eng.kv_peak = gpu_free, gpu_busy, kv_sum, kv_peak
        for p, (busy_time, moved, rbusy) in zip(ports, port_state):
            p.booked_until, p.busy_time, p.bytes_moved = booked, busy_time, moved
            if frec is not None:
                frec.busy[p.track] = rbusy
        for sv, (f, busy, tasks, rbusy), streamed in zip(servers, srv, stream_total):
            sv.free_at, sv.busy, sv.tasks = f, busy, tasks
            if streamed:
                sv.by_label["stream"] = sv.by_label.get("stream", 0.0) + streamed
            if sv.recorder is not None:
                sv.recorder.busy[sv.track] = rbusy
        if spans:
            for track, name, start, end, cat in spans:
                rec.add_span_only(track, name, start, end, cat)
        if eng.kv_steps is not None:
            eng.kv_steps.extend(k, step=np.arange(first, first + k), kv=used[:k])
        self._record(run, comp0, left, k, active, n, blocks, cols, srv_start)
        return now

    def _record(self, run, comp0, left, k, active, n, blocks, cols, srv_start):
        """The run's steps and tokens in the column stores, and the requests' and scheduler's state."""
        eng, fe, t, sched = self.e, self.fe, self.e.table, self.e.sched
        steps_col = eng.steps
        first = steps_col.size
        a0, a1, g0, g1, d1, e_arr = (np.array(c) for c in cols)
        nk = n[:k]
        steps_col.extend(k, a0=a0, a1=a1, g0=g0, g1=g1, comm=0.0, d1=d1, batch=nk, decode=nk, prefill_tokens=0)
        # the tokens: step-major, each step's requests in running order (as the engine emits them)
        act = active[:k]
        step_of, col = np.nonzero(act)
        req = run[col]
        pc = fe.cpu.stream_per_chunk
        rank = np.cumsum(act, axis=1)  # each request's place among the step's requests, from 1
        if len(fe.servers) == 1:
            serialized = np.array(srv_start[0])[step_of] + pc * rank[step_of, col]
        else:
            serialized = np.empty(len(req))
            api = t.api[run]
            for j in range(len(fe.servers)):
                pos_j = np.cumsum(act & (api == j)[None, :], axis=1)
                sel = api[col] == j
                serialized[sel] = np.array(srv_start[j])[step_of[sel]] + pc * pos_j[step_of[sel], col[sel]]
        client, fsv = fe.client, fe.sv
        bw = client.bandwidth
        ntok = np.ones(len(req), dtype=np.int64)  # every token is sent as it is made
        received = (serialized + (client.latency + fsv.response_header_bytes / bw)
                    + ntok * (fsv.chunk_bytes_per_token / bw))
        fe.rows.extend(len(req), req=req, step=first + step_of, prefill=0, kind=SENT, e=e_arr[step_of], R=received,
                       tokens=ntok)
        # per-request state after the run
        took = np.minimum(left, k)
        t.computed[run] = comp0 + took
        t.generated[run] += took
        t.sent[run] = t.generated[run]
        # each request's last row: its last step's first row plus its place in that step
        step_rows = np.r_[0, np.cumsum(n[:k])[:-1]]
        last_step = took - 1
        t.last_R[run] = received[step_rows[last_step] + rank[last_step, np.arange(len(run))] - 1]
        bs = eng.sv.block_size
        done = left <= k
        t.blocks[run] = np.maximum(t.blocks[run], (comp0 + took - 1 + bs) // bs)
        alloc, _ = blocks
        sched.kv_free -= int(alloc[:k].sum())
        if done.any():
            finished = run[done]
            t.finished[finished] = True
            sched.finish(finished)  # frees their blocks, as after each of their last steps
            eng.outstanding -= len(finished)
            # in the order the frontend saw them finish: by step, then running order
            order = np.lexsort((np.nonzero(done)[0], left[done]))
            for rid, receipt in zip(finished[order].tolist(), t.last_R[finished[order]].tolist()):
                fe.on_finish(rid, receipt)
