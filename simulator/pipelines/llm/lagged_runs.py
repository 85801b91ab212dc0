"""Closed-form runs of an engine with a step of lag between a step and its outputs: async scheduling
and async output processing.

With ``overlap: async`` (vLLM V1's async scheduling, SGLang's and TensorRT-LLM's overlap schedulers)
the engine's loop launches step k, then processes step k-1: it waits for k-1's sampled ids, then
detokenizes and hands its outputs over while step k runs (``overlap.async_scheduling_loop``). Step
k is scheduled before step k-1 is processed, so a request whose last token was step k-1's is still
in step k's batch (its token there is computed and dropped) and frees its blocks only after step
k's scheduling. With ``overlap: async_output`` (vLLM 0.6) the loop is the same but for when it goes
on: once step k's ids are on the host, the outputs of step k-1 reaching the API server later
(``overlap.async_output_loop``). A :class:`LaggedRun` is a :class:`~.decode_runs.Run` whose iterations are those of
that loop: the step in flight when it starts (``pending``) is processed in its first iteration, and
the one it launches last is left in flight, as a :class:`~.engine.Step` the loop processes next.
Every rule is the sync run's (the admission, the step's costs, the copy, the clocks); what differs
is when a slot leaves the batch (one step after its last token), when a step's outputs are made
(an iteration later, after the next launch on the engine's process), and how the rows are read
back (a row's outputs are the step before's).
"""

from __future__ import annotations

import numpy as np

from .decode_runs import COUNTS, MAX_STEPS, Run, launch
from .engine import Step
from .settings import detokenize_cost, outputs_cost

_EMPTY = np.empty(0, dtype=np.int64)
NO_PARTS = (0.0, 0.0, 0.0, 0.0, 0.0)


class LaggedRun(Run):
    """One run with a step of lag: slot ``j``'s tokens are its steps ``first..last`` (step -1: the
    step in flight at the start), and it stays in the batch until step ``last + 1``."""

    lagged = True  # a row's outputs are the step before's

    def __init__(self, owner, run, comp, target, gen, last_partial: bool, pending: Step, prefilled: int):
        super().__init__(owner, run, comp, target, gen, last_partial)
        # vLLM 0.6's async output processing: the loop waits for the step it launched, not for the
        # outputs it made (those reach the API server later)
        self.later = owner.e.sv.overlap == "async_output"
        n = len(self.rid) - last_partial
        # every slot but the partial prefill made a token in the pending step: its first; the sync
        # run's "last" (its outputs left after the step in flight) is when it leaves the batch
        for slot in range(n):
            self.first[slot] = -1
            self.last[slot] -= 1
        if self.every > 1:  # the phases from the step in flight (-1): a first token there streams at once
            N, gen0 = self.every, self.gen0
            phase = [N - 1 if gen0[j] == 0 else (self.streamed0[j] - gen0[j] - 2) % N for j in range(n)]
            self.phase[:n] = phase
            self.scnt = np.bincount(np.asarray(phase, dtype=np.int64), minlength=N).tolist()
            self.server_phases(n)
        self.prefilling = prefilled  # the slots whose first token the pending step made from a prefill
        self.pending = pending
        if len(pending.only_prefill):
            self.prefill_rows.append((-1, int(pending.only_prefill[0])))
        self.parts: dict[int, tuple] = {}  # tokens -> their outputs' CPU seconds (``_parts``)
        self.reg_prev = list(pending.register or ())  # the prefix units the step in flight caches once processed

    def _first_token(self, k: int, slot: int, target: int, nd: int, S: int, kv_free: int) -> tuple[int, int, int]:
        """Slot ``slot`` completed its prefill in step ``k`` and made its first token there: it decodes
        from step ``k + 1`` on, its only token or not (step ``k + 1`` is scheduled before step ``k``
        is processed), and leaves the batch one step after its last token."""
        bs = self.o.e.sv.block_size
        self.first[slot] = k
        self.c0[slot] = target
        self.s[slot] = k + 1
        out_left = int(self.o.e.table.output[self.rid[slot]]) - self.gen0[slot] - 1
        r = (k + 1 - target) % bs
        self.rho[slot] = r
        self.cnt[r] += 1
        if self.every > 1:
            self._stream_phase(k, slot)
        last = self.last[slot] = k + max(out_left, 0)
        self.ending.setdefault(last + 1, []).append(slot)
        if self.nd_api is not None:
            self.nd_api[self.api[slot]] += 1
        return nd + 1, S + target, kv_free

    def _streamed_of(self, p: int, msg: float, recv: float) -> tuple:
        """With a stream interval above 1, the chunks of step ``p``'s outputs — its decodes in their phase
        (its first tokens among them: a slot's phase is counted once its prefill completes) and those
        whose last token it made out of it — and their work (``Run._streamed``)."""
        N, phase = self.every, self.phase
        chunks = self.scnt[p % N] + sum(1 for j in self.ending.get(p + 1, ()) if phase[j] != p % N)
        return (chunks, *self._streamed(chunks, msg, recv))

    def _processed(self) -> None:
        """The step before the one just scheduled is processed: with SGLang's caching after the step, its
        prefix units join the cache; the units of the step just scheduled wait for the next iteration."""
        done, self.reg_prev = self.reg_prev, self.o.e.sched.take_registrations()
        self.registered(done)

    def _live_per_server(self, k: int, plan) -> list:
        """Per API server, the requests whose step ``k`` made a token that is not dropped: the batch's
        decodes and the prefills it completes, but those whose last token was the step before's."""
        per = list(self._chunks_per_server(plan))
        api = self.api
        for slot in self.ending.get(k, ()):
            per[api[slot]] -= 1
        return per

    def _parts(self, tokens: int) -> tuple:
        """The CPU seconds of outputs carrying ``tokens`` tokens: detokenization, output objects (the
        API server's, where it detokenizes), stream, the outputs' message at the engine's end and at
        the API server's."""
        got = self.parts.get(tokens)
        if got is None:
            eng, fe = self.o.e, self.o.fe
            cpu = fe.cpu if self.in_api else eng.cpu
            counts = {0: tokens}
            got = self.parts[tokens] = (detokenize_cost(cpu, tokens), outputs_cost(cpu, tokens),
                                        tokens * fe.cpu.stream_per_chunk,
                                        eng.outputs_message_cost(counts) if self.ipc else 0.0,
                                        fe.receive_costs(counts).get(0, 0.0) if self.ipc else 0.0)
        return got

    def play(self, now: float):
        """Walk the loop's iterations (launch step k, then process step k-1) until one the closed form
        does not cover; returns (when the loop resumes, the step left in flight), or None."""
        eng, sched, horizon = self.o.e, self.o.e.sched, self.o.horizon
        lat, booked, decode_time, clocks, intake = self._begin()
        free, gpu_free, kv_free, kv_total = eng.proc.free_at, eng.gpu_free, sched.pool.free, sched.pool.total
        srv0, ending, S, nd, ipc, in_api = clocks.srv[0], self.ending, self.S, self.nd, self.ipc, self.in_api
        parts, later, every, sep, outs, after_step = self.parts, self.later, self.every, self.sep, self.outs, self.after_step
        per = sent_per = list(self.nd_api) if outs is not None else None  # several API servers: each one's outputs of the step before
        apart = in_api or later or sep  # the outputs reach the API server after the loop went on
        p = self.pending  # the step in flight: its copy's end, its done event, the tokens its outputs carry
        a0_p = float(eng.steps.gather(np.array([p.index]), ("a0",))[0][0])  # its done event: made at its launch
        prev = (p.d1, a0_p + (p.d1 - a0_p), len(self.rid) - (self.partial >= 0))
        rows, k = [], 0
        while k < MAX_STEPS:
            a0 = now
            if intake.next_route <= a0 or intake.joining:  # tokenized (and received) by now: they join the queue
                free = intake.join(a0, free)
            got = self._schedule(k, nd, S, kv_free, decode_time)
            if got is None:
                break
            plan, free_kv, new_tokens, nchunks, sampled, compute, (sched_c, sl, nbytes, secs, *_), ctx = got
            start, launched, a1, g0, g1, begin, d1 = launch(a0, free, gpu_free, booked, sched_c, sl, compute, lat,
                                                            secs, self.comm_end, nd + new_tokens)
            t_done = a0 + (d1 - a0)
            pd1, p_done, tokens = prev  # then process step k-1: wait for its ids, make its outputs
            woke = p_done if p_done > a0 else a0
            if not woke < horizon:
                break
            at = pd1 if pd1 > woke else woke
            ready = launched  # the requests' messages that reached the engine by then are received first
            if ipc and (intake.next_route <= woke or intake.next_t <= woke):
                ready = intake.receive_before(woke, launched)
            det, out, dur, msg, recv = (parts.get(tokens) or self._parts(tokens)) if tokens else NO_PARTS
            chunks, out, dur, msg, recv = (self._streamed_of(k - 1, msg, recv) if every > 1 and tokens
                                           else (tokens, out, dur, msg, recv))  # those of step k-1 that stream
            if outs is not None and tokens:  # a message to each API server that holds some
                sent_per, msg = self.server_sends(per, (k - 1) % every, ending.get(k, ()))  # step k-1's
            s2, e, sent, ss, resume, after, i, det = (self._outputs(at, ready, woke, pd1, chunks, tokens, det, out, msg)
                                                      if tokens else (woke, woke, woke, woke, woke, ready, pd1, det))
            if later:  # async output processing: the loop goes on once step k's ids are on the host
                resume = t_done if t_done > a0 else a0
            if not resume < horizon or (apart and not sent < horizon):
                intake.undo()
                break
            free = after
            if sep:
                self.detok.commit(tokens > 0)
            if intake.pending:
                intake.keep()
            gpu_free, booked = g1, (d1 if nbytes > 0 else booked)
            if intake.next_t <= (sent if apart else resume):  # the arrivals before the outputs reach the API server
                intake.tokenize(sent if apart else resume)
            x = st0 = 0.0
            if outs is not None:  # several API servers: each receives its part (and detokenizes it), then streams
                st0 = outs.play(k, sent, per if tokens else (), i, s2 + det, e, sent_per)
                per = self._live_per_server(k, plan)
            elif tokens:
                if in_api:  # the API server receives the ids, detokenizes them, builds the outputs
                    i, s2, e = clocks.detokenize(sent, recv, det, out)
                x = e
                if chunks or in_api:  # (where the API server detokenizes, its stream task is booked all the same)
                    st0 = sent if sent > srv0[0] else srv0[0]
                    if recv > 0 and not in_api:
                        x = st0 = clocks.receive(st0, recv)
                    srv0[0] = st0 + dur
            if later and intake.next_t <= resume:  # then those until the loop goes on
                intake.tokenize(resume)
            rows.append((a0, a1, g0, g1, d1, e, st0, start, launched, begin, s2, sl, det, out, sent, x, ss, i,
                         g0 + compute, nd + nchunks, nd, new_tokens, kv_total - free_kv, sampled, ctx, tokens, chunks))
            if after_step:  # step k-1 is processed: its units join the cache, before anyone leaves
                self._processed()
            lag = len(ending.get(k, ()))  # in step k for a token already their last: dropped
            kv_free, S = free_kv, S + nd
            if k in ending or plan is not None:
                nd, S, kv_free = self._after(k, plan, nd, S, kv_free)
            prev = (d1, t_done, sampled - lag)
            now = resume
            k += 1
        return self._settle_lagged(k, rows, free, booked, kv_free + self.uncommitted(k), now)

    def _settle_lagged(self, k: int, rows: list, free: float, booked: float, kv_free: int, now: float):
        """The sync run's settling for the ``k`` steps launched, then the step left in flight."""
        if k == 0:  # (arrivals it tokenized or requests it received are handed back all the same)
            return self._settle(0, rows, free, booked, kv_free, now)
        self._in_flight_at_end = rows[-1]
        resume = self._settle(k, rows, free, booked, kv_free, now)
        return resume, self._left_in_flight(k)

    def _left_in_flight(self, k: int) -> Step:
        """The run's last step as the loop holds a launched step it has not processed: who is in it,
        its times, its done event."""
        eng = self.o.e
        row = self._in_flight_at_end
        last_step = k - 1
        rid, s_l, first = self.rid, self.s, self.first
        decode = [rid[j] for j in range(len(rid)) if s_l[j] <= last_step <= self.last[j] + 1
                  and first[j] != last_step and j != self.partial]
        completes = [rid[j] for j in range(len(rid)) if first[j] == last_step and s_l[j] == k]
        only = [r for step, r in self.prefill_rows if step == last_step]
        index = eng.steps.size - 1
        nd, new_tokens = int(row[COUNTS + 1]), int(row[COUNTS + 2])
        step = Step(index, np.array(decode, dtype=np.int64), np.array(completes, dtype=np.int64) if completes else _EMPTY,
                    np.array(only, dtype=np.int64) if only else _EMPTY, f"step {index} ({nd}d+{new_tokens}p)",
                    int(row[COUNTS + 3]))
        step.g0, step.g1, step.d1 = row[2], row[3], row[4]
        if self.reg_prev:  # its units, cached once the loop processes it
            step.register = self.reg_prev
        t_done = row[0] + (row[4] - row[0])
        step.done = eng.env.timeout(t_done - eng.env.now)
        eng.left_in_flight(step)
        return step

    def _record(self, k: int, first_step: int, times: dict, srv_start) -> None:
        """The tokens of the steps processed: the pending one and the run's but its last (row ``j``'s
        outputs are step ``j - 1``'s), as the sync run records its own."""
        eng = self.o.e
        p = self.pending.index
        columns = ("a0", "a1", "s0", "g0", "g1", "comm", "d1", "wdet", "wout", "wipc", "wstr")  # a step's launch
        before = dict(zip(columns, eng.steps.gather(np.array([p]), columns)))
        processed = {key: np.concatenate([before[key][:1], times[key][:-1]]) for key in columns}
        processed.update({key: times[key] for key in ("i", "o", "e", "x")})
        Run._record(_Shifted(self, k), k, p, processed, srv_start)  # the sync run's recording, on the shifted view


class _Shifted:
    """A lagged run's slots seen as a sync run's over the steps it processed (index 0: the step in
    flight at its start), for :func:`~.run_records.record_tokens`; each slot's computed tokens run to
    the run's last launched step."""

    def __init__(self, run: LaggedRun, k: int):
        self.o, self.rid, self.gen0, self.api, self.c0 = run.o, run.rid, run.gen0, run.api, run.c0
        self.outs = run.outs
        self.first = [f + 1 for f in run.first]
        self.last = [min(last + 1, MAX_STEPS) for last in run.last]
        self.prefilling, self.admitted, self.finished = run.prefilling, run.admitted, run.finished
        self.prefill_rows = [(step + 1, r) for step, r in run.prefill_rows if step + 1 < k]
        self.partial, self.p_comp = run.partial, run.p_comp
        self.every = run.every
        if run.every > 1:
            self.streamed0 = run.streamed0
        # computed through the last launched step: a slot's decode start and its last step in the batch
        self.s = [s + 1 for s in run.s]
        self.computed_last = [min(last + 2, k) for last in run.last]

    def computed_through(self, k: int) -> np.ndarray:
        return np.asarray(self.computed_last, dtype=np.int64)
