"""One LLM engine replica: continuous-batching scheduler, KV-cache blocks, GPU steps, output processing.

The engine is one SimPy process that wakes once per step; each launched step's GPU work is a
second process. The engine's CPU processes are virtual clocks (a step's schedule and launch
times are known when it is launched); the GPU computes for the cost model's time, then the
step's communication (TP all-reduces, PP sends) and the D2H copy of the sampled ids cross the
shared Fabric of the Topology, so they contend with other traffic on the same ports and show
on the ports' trace tracks. Per-request work inside a step is numpy over the batch.

How its loop overlaps CPU work with the GPU is ``overlap.OVERLAP_MODES[serving.overlap]``; where a
step's outputs are detokenized and how they reach the API servers is
``placements.PLACEMENTS[serving.detokenizer]``. Where outputs cross to another process they travel
as one message per receiving process, with a serialization cost on the sender and a
deserialization cost on the receiver (``CPUCosts.ipc_*``), booked on those processes' clocks, so an
engine core's output thread takes GIL time from its scheduling as in vLLM V1.
"""

from __future__ import annotations

from collections import deque

from dataclasses import dataclass, field

import numpy as np
import simpy

from ...hardware.cpu import CPUProcess, book
from ...hardware.gpu import step_window
from ...invariants import checking
from ...observe.attribution import ROW_MARKS, WAIT_COLUMNS, check_ordered, wait_activity
from ...observe.columns import Columns
from ...observe.llm_metrics import EngineStats
from ...observe.paged import CHUNK, Arrivals, Window
from ...observe.records import PREFILL_ONLY
from ...observe.token_ledger import TokenLedger
from .links import ReplicaLinks
from .overlap import OVERLAP_MODES
from .placements import PLACEMENTS, streaming
from .prefix_cache import PrefixCache
from .scheduler import Batch, Scheduler
from .settings import (TOKEN_ID_BYTES, EngineSettings, detokenize_cost, dispatch_cost, message_cost, outputs_cost,
                       schedule_cost)
from .run_support import declare, only

# How closed-form runs of steps cover the serving keys this module owns (run_support).
declare("engine", owner="engine")
declare("max_batch", owner="engine")
declare("max_batched_tokens", owner="engine")
declare("chunked_prefill", owner="engine")
declare("block_size", owner="engine")
declare("decode_attention", owner="engine")
declare("graph_capture", owner="engine")
declare("multi_step", only(1), "a run steps one batch at a time (multi-step scheduling prepares N steps at once)", "engine")

_EMPTY = np.empty(0, dtype=np.int64)


@dataclass
class Step:
    """A launched engine step: who is in it, and (once its GPU process has run them) when its
    GPU work started and ended and when its sampled ids reached the host."""

    index: int
    decode: np.ndarray
    completes: np.ndarray
    only_prefill: np.ndarray
    label: str
    kv_used: int
    done: simpy.Event | None = None  # triggers when the sampled ids reach the host (set at launch)
    gpu_done: simpy.Event | None = None  # made only when the next step has to wait for this GPU work
    g0: float | None = None
    g1: float | None = None
    d1: float | None = None
    accepted: np.ndarray | None = None  # with speculative decoding: each decode's accepted drafts
    emitted: np.ndarray | None = None  # tokens each emitting request got, where one may get several
    gen: np.ndarray | None = None  # each emitting request's tokens made as of this step (set by _process)
    register: list | None = None  # prefix units to cache once processed (prefix_cache_insert: after_step)


@dataclass
class Replica:
    """What one engine replica runs on: its CPU processes, its GPUs' trace tracks and its routes."""

    proc: CPUProcess
    detok_proc: CPUProcess | None
    links: ReplicaLinks
    gpu_tracks: list[str]
    first_gpu: int = 0


@dataclass
class Records:
    """The run's shared stores: one row per step, and the ledger every step's output rows go to."""

    steps: Columns
    rows: TokenLedger
    recorder: object = field(repr=False, default=None)


class RequestTable:
    """Per-request state as numpy arrays (struct of arrays), shared by the frontend and the engines.

    Every column but the inputs is a window over the request ids (``observe.paged``): ids are
    prepared as their arrivals are read (``arrival`` is an :class:`~simulator.observe.paged.Arrivals`)
    and released once the token ledger has retired them, so a long run holds only the requests in
    flight. Index the columns by request id or id arrays, as plain numpy arrays."""

    def __init__(self, arrival: np.ndarray, prompt: np.ndarray, output: np.ndarray, prefix=None, session=None):
        n = len(prompt)
        self.n = n
        w = self.window = Window(n)
        # the inputs' own arrays, not copies (a closed loop writes its arrival times into them)
        self.arrival = Arrivals(np.asarray(arrival, dtype=float), w)
        self.prompt = np.asarray(prompt, dtype=np.int64)
        self.output = np.asarray(output, dtype=np.int64)
        self.api = w.column(np.int32)
        self.replica = w.column(np.int32, -1)
        self.tok_start = w.column(float, np.nan)
        self.tok_end = w.column(float, np.nan)
        self.computed = w.column(np.int64)
        self.target = w.column(np.int64)
        self.generated = w.column(np.int64)
        self.sent = w.column(np.int64)      # tokens delivered in chunks (the frontend's)
        self.streamed = w.column(np.int64)  # tokens the engine has put in chunks, delivered or not (its own)
        self.blocks = w.column(np.int64)
        self.finished = w.column(bool)
        self.reported = w.column(bool)  # its finish reached the serving system (invariant FINISHED_ONCE)
        self.preemptions = w.column(np.int32)
        self.first_R = w.column(float, np.nan)
        self.last_R = w.column(float, np.nan)
        self.prefix = prefix    # the requests' PrefixIds, when the workload carries prefix identity
        self.session = session  # each request's session id, when the workload has sessions
        self.kv_start = self.kv_end = None  # with disaggregation: each request's KV transfer
        w.prepare(CHUNK)

    def track_kv_transfers(self) -> None:
        """Keep each request's KV transfer's start and end (a disaggregated deployment's)."""
        self.kv_start = np.full(self.n, np.nan)
        self.kv_end = np.full(self.n, np.nan)


class Engine:
    """A replica's engine loop. ``sink`` receives each step's tokens for detokenization and streaming."""

    def __init__(self, env, index: int, settings: EngineSettings, table: RequestTable, cost,
                 kv_blocks: int, replica: Replica, sink, records: Records, prefix=None, offload=None):
        self.env = env
        self.index = index
        self.sv = settings
        self.cpu = settings.cpu
        self.table = table
        self.cost = cost
        # with prefix caching (``prefix``: the requests' PrefixIds), a prefix cache in the KV pool
        # and with a host tier (``offload``: an Offloader), KV copied out to host memory and back
        self.sched = Scheduler(table, settings, kv_blocks,
                               PrefixCache(prefix, settings.block_size) if prefix is not None else None, offload)
        if offload is not None:
            offload.wake_with(self._wake_up)
        self.kv_peak = 0
        self.kv_sum = 0.0
        self.proc = replica.proc
        self.detok_proc = replica.detok_proc
        self.links = replica.links
        self.gpu_tracks = replica.gpu_tracks
        self.gpu_index = replica.first_gpu
        self.sink = sink
        self.handoff = None  # a KVHandoff when this replica is in a disaggregated prefill pool
        self.steps = records.steps
        self.rows = records.rows
        recorder = self.recorder = records.recorder
        # Per-step KV blocks in use, for the trace's counter tracks (only when spans are recorded).
        self.kv_steps = Columns({"step": "i8", "kv": "i8"}) if recorder.enabled else None
        self.outstanding = 0
        self.gpu_free = 0.0
        self.gpu_busy = 0.0
        self._launches = (cost.launch_time(True), cost.launch_time(False))  # a graph replay, each kernel
        self._dispatch = dispatch_cost(self.cpu, cost.tp * cost.pp)  # starting a step on the other workers
        self._last: Step | None = None  # the latest launched step (its GPU may still run)
        # Nothing can delay a step once launched (a booked D2H, its TP/PP traffic none or booked on
        # ports of its own): its times are closed forms, computed at launch, whenever the previous
        # step's GPU end is known.
        self.closed_form = self.links.d2h_booked and (self.links.comm_booked or not self.links.has_comm)
        self._wake = None
        self.runs = None  # a DecodeRuns when this engine may step decode runs in closed form
        self.spec = None  # a SpecDecoder with speculative decoding (set with :meth:`speculate`)
        # GPU idle between consecutive steps while the engine had work (not after an idle wait)
        self.gap_sum, self.gap_steps, self.gap_max = 0.0, 0, 0.0
        self.steps_run = 0  # GPU steps this replica ran (each reads its weights once: the energy's bytes)
        self.tokens_run = 0.0  # tokens those steps computed, and the decode context they read (the energy's FLOPs, KV)
        self.context_run = 0.0
        self._after_idle = True
        self.placement = PLACEMENTS[settings.detokenizer]
        self.held_tokens = 0  # tokens made but not yet sent on to a separate detokenizer (placements)
        # steps' outputs on their way to the API servers, in order: (when they arrive, what they do there)
        self.outputs_pending: deque = deque()
        # steps' entries on their way to a separate detokenizer, in order (as ``outputs_pending``)
        self.handoffs_pending: deque = deque()
        env.process(OVERLAP_MODES[settings.overlap](self))

    def hand_off_to(self, handoff) -> None:
        """Make this a disaggregated prefill replica: its computed prompts go to ``handoff`` (a
        KVHandoff), holding their blocks out of both queues until they are sent."""
        self.handoff = handoff
        self.sched.holders_unknown()

    def speculate(self, spec) -> None:
        """Run speculative decoding with ``spec`` (a SpecDecoder): decodes verify its drafts."""
        self.spec = spec
        self.sched.draft(spec.k)

    def request_message_cost(self, rid: int) -> float:
        """CPU seconds for this engine's process to receive request ``rid`` from its API server: its
        message, where the API server is another process (0 where none crosses or messages are free)."""
        if not (self.sv.outputs_cross_to_api and self.cpu.has_ipc):
            return 0.0
        return message_cost(self.cpu, 1, TOKEN_ID_BYTES * float(self.table.prompt[rid]))

    def enqueue(self, rid: int, received: bool = False) -> None:
        """A tokenized request reaches this engine: its message is received on the engine's process
        (unless ``received``: a closed-form run booked it on the clock it plays), then it waits."""
        if not received:  # a message that costs nothing books nothing
            book(self.proc, self.env.now, self.request_message_cost(rid), "receive request")
        self.sched.waiting.append(rid)
        self.outstanding += 1
        self._wake_up()

    def receive_prefilled(self, rid: int) -> None:
        """A request whose KV cache arrived from a prefill replica joins the queue (the router
        counted it as outstanding when it chose this replica)."""
        self.sched.waiting.append(rid)
        self._wake_up()

    def _wake_up(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    # -- the loop ----------------------------------------------------------------------------

    def launch(self):
        """Schedule and launch one step; returns the Step or None if there is nothing to run."""
        plan = self.sched.schedule()
        if plan is None:
            return None
        sched = self.host_cost(len(plan.decode) + len(plan.chunks))
        if self.spec is not None and len(plan.decode):  # a CPU proposer's drafts for this step
            sched += self.spec.proposer.cpu_time(plan.comp + 1, self.spec.k)
        return self._start(plan, sched)

    def launch_run(self) -> list:
        """The steps launched now: one, or with ``multi_step: N`` and a decode-only batch, up to N
        of them on the same requests, scheduled and prepared once (vLLM 0.6's multi-step
        scheduling, PR #7000: the GPU advances the inputs itself between them; each costs only its
        graph launch). They end where the KV cache runs out of blocks for the next token."""
        step = self.launch()
        if step is None or self.sv.multi_step == 1 or len(step.completes) or len(step.only_prefill):
            return [] if step is None else [step]
        steps = [step]
        while len(steps) < self.sv.multi_step:
            decode = step.decode
            comp = self.table.computed[decode]
            if not self.sched.extend(decode, comp):
                break
            steps.append(self._start(Batch(decode, comp, []), 0.0))
        return steps

    def host_cost(self, batch: int) -> float:
        """CPU seconds before a step of ``batch`` requests can start on the GPUs: scheduling, then input
        preparation (``schedule_cost``), then, with several GPUs, starting it on the other workers
        (``dispatch_cost``); kernel launches come after and overlap the GPU."""
        return schedule_cost(self.cpu, batch) + self._dispatch

    def launch_cost(self, tokens: int, prefill: bool) -> float:
        """CPU seconds to launch a step of ``tokens`` tokens (``prefill``: with prompt chunks): one graph
        replay where the engine captured a graph for such a step, else a launch per kernel."""
        return self._launches[0] if self.sv.replays_graph(tokens, prefill) else self._launches[1]

    def _start(self, plan: Batch, sched: float) -> Step:
        """Launch a scheduled batch after ``sched`` seconds of CPU work on the engine process."""
        env, t = self.env, self.table
        decode, comp, chunks = plan.decode, plan.comp, plan.chunks
        ctx = float(comp.sum()) + len(decode)
        a0 = env.now
        batch = len(decode) + len(chunks)
        completes, partial = [], []
        new_tokens = 0
        for rid, p, n in chunks:
            new_tokens += n
            (completes if p + n >= t.target[rid] else partial).append(rid)
        spec = self.spec
        tokens = len(decode) * (1 if spec is None else spec.k + 1) + new_tokens  # what the step's model runs over
        # Scheduling, then the launches; kernels run as they are launched, so the GPU starts
        # after scheduling and the step cannot end before its last launch.
        start, launched = self.proc.submit(a0, sched + self.launch_cost(tokens, bool(chunks)), "schedule+launch")
        a1 = start + sched
        wdet, wout, wipc, wstr = wait_activity(self.proc, a0, start)  # what held its process (a GIL) meanwhile
        sampled = len(decode) + len(completes)
        if self.handoff is not None and completes:
            # a prefill replica's computed prompts leave the running set at once (their KV stays
            # until it is sent), so no later step decodes them here
            self.sched.leave(np.array(completes, dtype=np.int64))
        accepted = None
        if spec is None:
            # a decode-only step's time is the cost model's decode function (``decode_time``: the same
            # arithmetic as ``step(...).compute``, bound once)
            compute = (self.cost.step(ctx, len(decode), [(p, n) for _, p, n in chunks], sampled).compute if chunks
                       else self.cost.decode_time(ctx, len(decode)))
            t.computed[decode] = comp + 1
        else:
            # every decode verifies its k drafts: k + 1 tokens through the target, logits for each
            accepted = spec.draw(len(decode))
            verified = len(decode) * (spec.k + 1)
            compute = spec.step_time(self.cost, comp, [(p, n) for _, p, n in chunks], sampled, verified
                                     + len(completes))
            t.computed[decode] = comp + 1 + accepted
            sampled = verified + len(completes)  # every verified position's id is copied to the host
        for rid, p, n in chunks:
            t.computed[rid] = p + n
        self.tokens_run += tokens
        self.context_run += ctx
        nan = float("nan")
        index = self.steps.append(a0=a0, a1=a1, s0=start, g0=nan, g1=nan, comm=nan, d1=nan, wdet=wdet, wout=wout,
                                  wipc=wipc, wstr=wstr, batch=batch, decode=len(decode), prefill_tokens=new_tokens)
        used = self.sched.pool.used
        self.kv_peak = max(self.kv_peak, used)
        if accepted is not None and len(decode):
            # the rejected drafts' slots are free again once the step has verified them
            self.sched.pool.trim(decode, -(-t.computed[decode] // self.sv.block_size))
        step = Step(index, decode, np.array(completes, dtype=np.int64) if completes else _EMPTY,
                    np.array(partial, dtype=np.int64) if partial else _EMPTY,
                    f"step {index} ({len(decode)}d+{new_tokens}p)", used, accepted=accepted)
        if self.sched.to_register:
            step.register = self.sched.take_registrations()
        prev, self._last = self._last, step
        category = "prefill" if chunks else "decode"
        if self.closed_form and (prev is None or prev.g1 is not None):
            self._gpu_closed_form(step, a1, launched, compute, tokens, sampled, category)
        else:
            step.done = env.event()
            env.process(self._run_gpu(step, prev, a1, launched, compute, tokens, sampled, category))
        return step

    def _run_gpu(self, step: Step, prev: Step | None, a1: float, launched: float, compute: float,
                 tokens: int, sampled: int, category: str):
        """The step on the GPUs: after the previous step and the scheduling, compute, then the
        step's communication on the Fabric; it ends no earlier than its last kernel launch; then
        the sampled ids are copied to the host."""
        env = self.env
        if prev is not None and prev.g1 is None:  # async overlap: the GPU still runs step n-1
            prev.gpu_done = env.event()
            yield prev.gpu_done
        g0 = max(a1, self.gpu_free)
        g1 = g0 + compute
        comm = 0.0
        if self.links.comm_booked:  # on ports of its own: booked, its end known at once
            end = self.links.book_comm(tokens, step.label, g1)
            comm, g1 = end - g1, end
        elif self.links.has_comm:
            yield env.timeout(g1 - env.now)
            yield from self.links.step_comm(tokens, step.label)
            comm, g1 = env.now - g1, env.now
        g1 = max(g1, launched)
        if g1 > env.now:
            yield env.timeout(g1 - env.now)
        self._gpu_ran(step, g0, g1, category)
        yield from self.links.d2h(sampled, "d2h", g1)
        self._copied(step, comm, env.now)
        step.done.succeed()

    def _gpu_closed_form(self, step: Step, a1: float, launched: float, compute: float, tokens: int,
                         sampled: int, category: str) -> None:
        """The same step as :meth:`_run_gpu` where nothing can delay it once launched (a booked D2H,
        its TP/PP traffic none or booked, the previous step's GPU end known): its times are computed
        now and ``step.done`` is one timeout at the copy's end, instead of a process of several events."""
        links = self.links
        comm = (lambda begin: links.book_comm(tokens, step.label, begin)) if links.comm_booked else None
        g0, g1, comm_s = step_window(a1, self.gpu_free, compute, launched, comm)
        self._gpu_ran(step, g0, g1, category)
        d1 = links.booked_d2h(sampled, "d2h", g1)
        self._copied(step, comm_s, d1)
        step.done = self.env.timeout(d1 - self.env.now)

    def _gpu_ran(self, step: Step, g0: float, g1: float, category: str) -> None:
        if not self._after_idle:
            gap = g0 - self.gpu_free
            self.gap_sum += gap
            self.gap_steps += 1
            if gap > self.gap_max:
                self.gap_max = gap
        self._after_idle = False
        step.g0, step.g1 = g0, g1
        self.gpu_free = g1
        self.gpu_busy += g1 - g0
        self.steps_run += 1
        self.kv_sum += step.kv_used * (g1 - g0)
        if step.gpu_done is not None:
            step.gpu_done.succeed()
        if self.recorder.enabled:
            for track in self.gpu_tracks:
                self.recorder.add_span_only(track, step.label, g0, g1, category)
        if self.kv_steps is not None:
            self.kv_steps.append(step=step.index, kv=step.kv_used)

    def finished_run(self, n: int) -> None:
        """``n`` requests finished in a closed-form run: no longer outstanding here."""
        self.outstanding -= n

    def settle_run(self, k: int, times: dict, counts, gpu_free0: float) -> None:
        """After a closed-form run of ``k`` steps (``decode_runs``): their rows in the step table
        (``times``: the columns of ``STEP_TIMES`` and ``d1``; ``counts``: batch, decodes, prefill
        tokens, KV blocks used, sampled ids, decode context per step) and what they add to the GPU's
        statistics, as :meth:`_gpu_ran` adds one step's (the GPU was free from ``gpu_free0``)."""
        g0, g1 = times["g0"], times["g1"]
        used = counts[:, 3]
        self.tokens_run += float(counts[:, 1].sum() + counts[:, 2].sum())
        self.context_run += float(counts[:, 5].sum())
        first_step = self.steps.size
        self.steps.extend(k, a0=times["a0"], a1=times["a1"], s0=times["s0"], g0=g0, g1=g1, comm=times["comm"],
                          d1=times["d1"], **{w: times[w] for w in WAIT_COLUMNS}, batch=counts[:, 0],
                          decode=counts[:, 1], prefill_tokens=counts[:, 2])
        if self.kv_steps is not None:
            self.kv_steps.extend(k, step=np.arange(first_step, first_step + k), kv=used)
        gaps = g0 - np.concatenate(([gpu_free0], g1[:-1]))  # GPU idle before each step
        if self._after_idle:
            gaps = gaps[1:]  # the engine had waited for work: its first step's wait is no gap
        if len(gaps):
            self.gap_sum += float(gaps.sum())
            self.gap_steps += len(gaps)
            self.gap_max = max(self.gap_max, float(gaps.max()))
        self._after_idle = False
        busy = g1 - g0
        self.gpu_free = float(g1[-1])
        self.gpu_busy += float(busy.sum())
        self.steps_run += k
        self.kv_sum += float((used * busy).sum())
        self.kv_peak = max(self.kv_peak, int(used.max()))

    def _copied(self, step: Step, comm: float, d1: float) -> None:
        step.d1 = d1
        if checking():
            a0, s0, a1 = (float(v[0]) for v in self.steps.gather(np.array([step.index]), ("a0", "s0", "a1")))
            check_ordered(a0, s0, a1, step.g0, step.g1, d1)
        for key, value in (("g0", step.g0), ("g1", step.g1), ("comm", comm), ("d1", d1)):
            self.steps.set(key, step.index, value)

    def _process(self, step: Step):
        """Turn a finished step into tokens: who emitted, who sends a chunk, who finished.

        Returns (emit, send mask or None if all send, prefill flags or None if all decode,
        done mask or None if nobody finished).
        """
        t, sv = self.table, self.sv
        if step.register:
            self.sched.register_computed(step.register)
        if self.handoff is not None:  # a prefill replica: computed prompts left for the decode pool
            self.outstanding -= len(step.completes)
            return _EMPTY, None, None, None
        if len(step.completes):
            emit = np.concatenate([step.decode, step.completes])
            prefill_flag = np.zeros(len(emit), dtype=np.int8)
            prefill_flag[len(step.decode):] = 1
        else:
            emit, prefill_flag = step.decode, None
        add = None
        if step.accepted is not None:  # a verified decode emits its accepted drafts and the bonus token
            add = np.ones(len(emit), dtype=np.int64)
            add[:len(step.decode)] = step.accepted + 1
        if sv.overlap != "sync" or sv.multi_step > 1:  # a finished request may sit in later steps
            live = ~t.finished[emit]
            if not live.all():
                emit = emit[live]
                prefill_flag = None if prefill_flag is None else prefill_flag[live]
                add = None if add is None else add[live]
        if add is None:
            gen = t.generated[emit] + 1
        else:  # ... never beyond the request's output length
            gen = np.minimum(t.generated[emit] + add, t.output[emit])
            emitted = step.emitted = gen - t.generated[emit]
            verified = (prefill_flag == 0) if prefill_flag is not None else slice(None)
            self.spec.record(add[verified] - 1, emitted[verified])
        t.generated[emit] = gen
        done = gen >= t.output[emit]
        # the stream rule reads what the engine has streamed, not what has been delivered yet (with
        # async overlap a step's chunk may still be on its way when the next step is processed)
        send = None if sv.stream_interval == 1 else done | (gen == 1) | (gen - t.streamed[emit] >= sv.stream_interval)
        t.streamed[streaming(emit, send)] = streaming(gen, send)
        step.gen = gen
        if done.any():
            finished = emit[done]
            t.finished[finished] = True
            self.sched.finish(finished)
            self.outstanding -= len(finished)
        else:
            done = None
        return emit, send, prefill_flag, done

    @staticmethod
    def tokens_of(step: Step, emit) -> int:
        """Tokens a step's outputs carry: one per emitting request, or as many as each emitted."""
        return len(emit) if step.emitted is None else int(step.emitted.sum())

    def output_work(self, proc: CPUProcess, at: float, n_tokens: int, send) -> tuple[float, float]:
        """Detokenize ``n_tokens`` on ``proc`` from ``at``, then build the outputs of the chunks that
        ``send`` marks (all when None); returns when each ends."""
        _, detokenized = proc.submit(at, detokenize_cost(self.cpu, n_tokens), "detokenize")
        chunks = n_tokens if send is None else int(send.sum())
        return detokenized, book(proc, detokenized, outputs_cost(self.cpu, chunks), "output")

    def send_outputs(self, proc: CPUProcess, at: float, emit) -> float:
        """Serialize and send a step's outputs to the API servers (one message per server that
        holds some of ``emit``); returns when the last is sent (``at`` if nothing crosses)."""
        return book(proc, at, self.outputs_message_cost(self.sink.counts(emit)), "send outputs")

    def outputs_message_cost(self, counts: dict) -> float:
        """CPU seconds to serialize a step's outputs for the API servers (``counts``: entries per API
        server that holds some): one message each, where they are other processes (else 0)."""
        if not self.sv.outputs_cross_to_api or not self.cpu.has_ipc:
            return 0.0
        return self.sink.messages_cost(counts)

    def finish_step(self, step: Step, wait: bool = True):
        """Output processing after the step's D2H: hand the tokens over to where they are
        detokenized (``self.placement``), then to the API servers.

        Waits for the step's sampled ids to reach the host (unless ``wait`` is False: with async
        output processing the loop has waited already and goes on at once). The engine's own CPU
        and the detokenizer are used by this engine alone, so their work is booked there and then.
        """
        # The scheduler's view of who finished is updated when the step is handed over (as
        # engines do with their output queues), before its results reach the host.
        emit, send, prefill_flag, done = self._process(step)
        if not step.done.processed:
            yield step.done
        if len(step.only_prefill):  # a chunk that emits nothing: every milestone its GPU end
            self.placement.in_order(self, lambda: self.rows.extend(
                len(step.only_prefill), req=step.only_prefill, step=step.index, prefill=1, kind=PREFILL_ONLY,
                **dict.fromkeys(ROW_MARKS, step.g1), tokens=0), step.only_prefill)
        if self.handoff is not None and len(step.completes):
            self.rows.extend(len(step.completes), req=step.completes, step=step.index, prefill=1,
                             kind=PREFILL_ONLY, **dict.fromkeys(ROW_MARKS, step.g1), tokens=0)
            self.handoff.send(self, step.completes, step)
        if len(emit):
            yield from self.placement.hand_over(self, step, emit, send, prefill_flag, done,
                                                max(step.d1, self.env.now), wait)

    def deliver(self, at: float, action, queue: deque | None = None) -> None:
        """Call ``action(now)`` when a step's outputs reach the API servers at ``at`` (at once, if that
        is not in the future); until then they are pending in ``queue``
        (``outputs_pending``, or ``handoffs_pending`` for entries on their way to a separate
        detokenizer), and a closed-form run that starts before may deliver them first
        (:meth:`deliver_pending`)."""
        env = self.env
        if not at > env.now:
            action(env.now)
            return
        queue = self.outputs_pending if queue is None else queue
        queue.append((env.now + (at - env.now), action))  # the time the timeout fires at
        env.timeout(at - env.now).callbacks.append(lambda _ev: self._deliver_due(queue, env.now))

    @staticmethod
    def _deliver_due(queue: deque, now: float) -> None:
        """A delivery's time came: the first pending item of ``queue`` arrives, if it is due (a
        closed-form run may have delivered it already; the others are later, sends being FIFO)."""
        if queue and queue[0][0] <= now:
            at, action = queue.popleft()
            action(at)

    def after_pending(self, action) -> None:
        """Call ``action()`` once every step's outputs now on their way have reached the API servers
        (at once, where none are): rows recorded by it come after theirs, so each request's rows reach
        the ledger in step order. Entries on their way to a separate detokenizer carry it on to the
        outputs they become (``after``: a list on their action)."""
        if self.handoffs_pending:
            self.handoffs_pending[-1][1].after.append(action)
        elif self.outputs_pending:
            at, last = self.outputs_pending[-1]
            self.outputs_pending[-1] = (at, lambda now: (last(now), action()))
        else:
            action()

    def deliver_handoffs(self) -> None:
        """Every step's entries on their way to a separate detokenizer arrive now, in order, each at the
        time it was due: the detokenizer's process is this engine's alone, so nothing else books there
        meanwhile (what it sends on is pending in ``outputs_pending``)."""
        self._drain(self.handoffs_pending)

    def deliver_pending(self) -> None:
        """Every pending step's outputs reach the API servers now, in order, each at the time it was due."""
        self.deliver_handoffs()
        self._drain(self.outputs_pending)

    @staticmethod
    def _drain(queue: deque) -> None:
        """Every item of ``queue`` arrives now, in order, each at the time it was due."""
        while queue:
            at, action = queue.popleft()
            action(at)

    def hold_tokens(self, tokens: int, streams: bool) -> int:
        """A step's ``tokens`` join those held for a separate detokenizer; where it ``streams`` (some
        request sends a chunk), all held go on: returns how many (0 where none streams)."""
        held = self.held_tokens + tokens
        self.held_tokens = 0 if streams else held
        return held if streams else 0

    def use_runs(self, runs) -> None:
        """Step in closed-form runs where they cover the step (``runs``: a :class:`~.decode_runs.DecodeRuns`)."""
        self.runs = runs

    def left_in_flight(self, step: Step) -> None:
        """A closed-form run left ``step`` launched and not processed: the latest launched step."""
        self._last = step

    def expect(self, requests: int) -> None:
        """``requests`` were routed here and are on their way (a disaggregated decode replica's: their KV):
        the router counts them as this replica's from now."""
        self.outstanding += requests

    def settle_held(self, tokens: int) -> None:
        """After a closed-form run (``detok_runs``): the tokens it left held for the separate detokenizer."""
        self.held_tokens = tokens

    def stats(self) -> EngineStats:
        """What this engine reports to the metrics when the run ends."""
        self.sched.pool.check()  # BLOCKS_CONSERVED, at the end of every run
        return EngineStats(self.index, tuple(self.gpu_tracks), self.gpu_busy, self.kv_peak, self.kv_sum,
                           self.kv_steps, self.gap_sum, self.gap_steps, self.gap_max, self.steps_run,
                           self.tokens_run, self.context_run, self.cost.work_per_step_and_token())

    def idle(self):
        """Wait until a request arrives (the loop found nothing to run)."""
        self._wake = self.env.event()
        self._after_idle = True
        yield self._wake
        self._wake = None
