"""An API server as the asyncio event loop it runs (``serving.api_server_loop: asyncio``): vLLM V1's,
and SGLang's tokenizer manager with the same structure.

One thread runs every coroutine of the API server in turns (Python's ``asyncio`` ``BaseEventLoop._run_once``):
each iteration runs the callbacks that were ready when it began, each until its next suspension,
then polls the sockets and queues the callbacks of what arrived meanwhile behind those made ready
during the iteration. vLLM V1's coroutines (vllm/v1/engine/async_llm.py, core_client.py):

- the *reader* (``process_outputs_socket``) takes every engine-core message that has arrived and
  puts it on the outputs queue;
- the *output handler* (``output_handler``) takes the queued messages one after another without
  suspending while the queue is not empty (``asyncio.Queue.get`` returns at once then), detokenizes
  each and builds its outputs (``OutputProcessor.process_outputs``) in slices of at most 128
  (``VLLM_V1_OUTPUT_PROC_CHUNK_SIZE``, ``np.array_split``), yielding (``asyncio.sleep(0)``) between
  slices; each output goes into its request's ``RequestOutputCollector``, which *merges* it with
  one its stream has not taken yet, and wakes that stream if it was waiting;
- each request's *stream* (``AsyncLLM.generate`` and the OpenAI server's SSE generator) takes what
  its collector holds and writes one SSE chunk, carrying every token merged there;
- a new request's *intake* (HTTP parsing, tokenization, ``add_request``) runs when its socket is polled.

So when the loop lags behind the engine, several steps' outputs reach the handler before a stream
runs and leave as one chunk, which no FIFO of whole tasks reproduces. Where the outputs come built (a
separate detokenizer, SGLang's: tokenizer_manager.py ``handle_loop`` sets each request's event and
``_wait_one_response`` coalesces what a lagging stream holds), the handler only files them; SGLang's
``handle_loop`` receives and files in one coroutine, which the reader and handler here approximate (a
message arriving while the handler runs waits for the next turn). Each callback is booked on the
server's CPU process (its clock, totals, spans and cores); the loop only waits for the simulation at
the poll that ends an iteration, since what arrives before it decides what runs next.

vLLM 0.6.0's API server runs the same turns with no collector (``asyncio_per_output``,
:class:`PerOutputAsyncioServer`): each output the engine sent is a chunk of its own.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from ...config.dit_models import layer_split
from .placements import streaming
from .settings import detokenize_cost, outputs_cost

OUTPUT_SLICE = 128
"""``VLLM_V1_OUTPUT_PROC_CHUNK_SIZE``'s default (vllm/envs.py): the most outputs the handler processes between yields."""


def slices(n: int) -> list[tuple[int, int]]:
    """The handler's slices of a message of ``n`` outputs, as ``np.array_split(outputs, cdiv(n, 128))``
    cuts them (one slice up to 128; else near-equal parts, the longer first): the contiguous near-equal
    split pipeline stages take of layers."""
    return layer_split(n, max(1, -(-n // OUTPUT_SLICE)))


class Message:
    """One step's outputs for one API server. An entry's row is recorded once its token has left in a
    chunk (its own step's or a later one's, merged) or is held by the stream interval; a request's
    rows are recorded in step order."""

    __slots__ = ("step", "emit", "send", "prefill", "done", "gen", "tokens", "marks", "sent_at", "built")

    def __init__(self, step, emit, send, prefill, done, gen, tokens, made=None):
        self.step, self.emit, self.send, self.prefill, self.done, self.gen = step, emit, send, prefill, done, gen
        self.tokens = tokens  # tokens each entry carries (speculative decoding: several), for the detokenizer
        n = len(emit)
        self.marks = {m: np.empty(n) for m in ("i", "o", "e", "x")}
        # ``made``: (i, o, e) where the outputs were built before the message (in the engine or a separate
        # detokenizer, SGLang's): the API server only receives them; None: it detokenizes them (vLLM V1)
        self.built = made is not None
        if self.built:
            for m, at in zip(("i", "o", "e"), made):
                self.marks[m][:] = at
        self.sent_at = np.full(n, np.nan)  # when the chunk that carries it was written (NaN: held or merged)


class AsyncioServer:
    """One API server's event loop: engine messages and requests arrive on its sockets (:meth:`message`,
    :meth:`request`); it runs the reader, the output handler, the streams and the intakes in turns."""

    def __init__(self, frontend, j: int):
        self.fe, self.j, self.proc, self.env = frontend, j, frontend.servers[j], frontend.env
        self.io: deque = deque()  # (arrival, kind, payload) not polled yet: "msg" a Message, "req" a request id
        self.ready: deque = deque()  # the next iteration's callbacks: ("reader",), ("handler",), ("stream", rid), ("intake", rid)
        self.arrived: deque = deque()  # messages on the socket, polled, not yet read
        self.queue: deque = deque()  # messages the reader put on the outputs queue
        self.t = 0.0  # when the loop has run what it ran
        self.polling = False  # an iteration ended at ``t``: the poll there waits for what arrives by ``t``
        self.wake_at: float | None = None  # when a scheduled resumption fires
        self.handler_waits = True  # the output handler awaits the outputs queue
        self.reader_ready = False
        self.inside: tuple | None = None  # (message, its next slice) the handler yielded inside
        # request -> its (message, entry, output made) not recorded yet: the outputs its stream has not
        # taken, and the tokens held by the stream interval after them
        self.collector: dict[int, list] = {}
        self.waiters: dict[int, list] = {}  # request -> what waits for its rows (``after_rows``)

    # -- what arrives
    def message(self, at: float, msg: Message) -> None:
        """A step's outputs for this server reach its socket at ``at``."""
        self.io.append((at, "msg", msg))
        self.run()

    def request(self, at: float, rid: int) -> None:
        """Request ``rid`` reaches this server's socket at ``at``."""
        self.io.append((at, "req", rid))
        self.run()

    # -- the loop
    def run(self) -> None:
        """Run iterations as far as what has arrived decides them."""
        now = self.env.now
        while True:
            if self.polling:
                if self.t > now:  # what arrives before then is not known yet
                    self._wake(self.t)
                    return
                self._poll(self.t)
                self.polling = False
            if not self.ready:
                if not self.io:
                    return
                self.t = max(self.t, self.io[0][0])
                self._poll(self.t)
            batch, self.ready = self.ready, deque()
            self._iterate(batch)
            self.polling = True

    def _wake(self, at: float) -> None:
        """Go on at ``at`` (once; the timeout fires at ``now + (at - now)``, which rounding may set apart from ``at``)."""
        now = self.env.now
        fire = now + (at - now)
        if self.wake_at == fire:
            return
        self.wake_at = fire
        self.env.timeout(at - now).callbacks.append(self._woken)

    def _woken(self, _ev) -> None:
        if self.wake_at == self.env.now:
            self.wake_at = None
            self.run()

    def _poll(self, t: float) -> None:
        """Queue the callbacks of what arrived by ``t``, in arrival order (one reader for all messages)."""
        io, ready = self.io, self.ready
        while io and io[0][0] <= t:
            _, kind, payload = io.popleft()
            if kind == "msg":
                self.arrived.append(payload)
                if not self.reader_ready:
                    self.reader_ready = True
                    ready.append(("reader",))
            else:
                ready.append(("intake", payload))

    def _iterate(self, batch: deque) -> None:
        """Run one iteration's callbacks in order; consecutive streams are booked as one task."""
        streams: list[int] = []
        for cb in batch:
            if cb[0] == "stream":
                streams.append(cb[1])
                continue
            if streams:
                self._streams(streams)
                streams = []
            getattr(self, "_" + cb[0])(*cb[1:])
        if streams:
            self._streams(streams)

    def book(self, seconds: float, label: str) -> tuple[float, float]:
        """``seconds`` of ``label`` on the server's process as the loop reaches it; the loop goes on at its end."""
        start, end = self.proc.submit(self.t, seconds, label)
        self.t = end
        return start, end

    # -- the callbacks
    def _reader(self) -> None:
        """``process_outputs_socket``: receive every message that has arrived, onto the outputs queue."""
        self.reader_ready = False
        fe = self.fe
        while self.arrived:
            msg = self.arrived.popleft()
            carried = len(streaming(msg.emit, msg.send) if msg.built else msg.emit)  # built: the streaming ones'
            cost = fe.receive_costs({self.j: carried}).get(self.j, 0.0)
            if cost > 0:
                self.book(cost, "receive outputs")
            msg.marks["x"][:] = self.t
            if not msg.built:
                msg.marks["i"][:] = self.t
            self.queue.append(msg)
        if self.handler_waits:
            self.handler_waits = False
            self.ready.append(("handler",))

    def _handler(self) -> None:
        """``output_handler``: process queued messages slice by slice; yield between a message's slices,
        go straight on to the next message while the queue holds one, else wait for the reader."""
        cpu = self.fe.cpu
        while True:
            if self.inside is None:
                if not self.queue:
                    self.handler_waits = True
                    return
                msg = self.queue.popleft()
                self.inside = (msg, 0, slices(len(msg.emit)))
                fixed = True
            else:
                fixed = False
            msg, k, parts = self.inside
            a, b = parts[k]
            self._process(msg, a, b, cpu, fixed)
            if k + 1 < len(parts):
                self.inside = (msg, k + 1, parts)
                self.ready.append(("handler",))  # asyncio.sleep(0): behind the streams it woke
                return
            self.inside = None

    def _process(self, msg: Message, a: int, b: int, cpu, fixed: bool) -> None:
        """Detokenize entries ``a:b`` of ``msg`` and build the outputs of those that stream (unless they
        came built); each output goes into its request's collector (merged with one not yet taken),
        waking its stream."""
        send = msg.send
        if not msg.built:
            tokens = int(msg.tokens[a:b].sum()) if msg.tokens is not None else b - a
            streams = b - a if send is None else int(send[a:b].sum())
            det = detokenize_cost(cpu, tokens) if fixed else cpu.detokenize_per_token * tokens
            msg.marks["o"][a:b] = self.book(det, "detokenize")[1]
            out = outputs_cost(cpu, streams)
            if out > 0:
                self.book(out, "output")
            msg.marks["e"][a:b] = msg.marks["x"][a:b] = self.t
        collector, ready, now = self.collector, self.ready, []
        for idx in range(a, b):
            rid = int(msg.emit[idx])
            output = send is None or bool(send[idx])  # else held back by the stream interval: no output made
            held = collector.get(rid)
            if held is not None:  # merged with what its stream has not taken, or held behind it
                held.append((msg, idx, output))
            elif output:
                collector[rid] = [(msg, idx, True)]
                ready.append(("stream", rid))
            else:
                now.append((msg, idx, False))
        self._record(now)

    def _streams(self, rids: list[int]) -> None:
        """Each request's stream takes its collector's outputs and writes them as chunks (:meth:`_chunks`),
        booked as one task; then the rows of everything it took are recorded."""
        per = self.fe.cpu.stream_per_chunk
        held_by = [self.collector.pop(rid) for rid in rids]
        chunks = [self._chunks(held) for held in held_by]
        start, _ = self.book(per * sum(map(len, chunks)), "stream")
        n = 0
        for chunk in chunks:
            for msg, idx in chunk:
                n += 1
                msg.sent_at[idx] = start + per * n
        self._record([entry for held in held_by for entry in held])
        for rid in rids:
            for action in self.waiters.pop(rid, ()):
                action(rid)

    @staticmethod
    def _chunks(held: list) -> list[tuple]:
        """vLLM V1 (and SGLang): one SSE chunk carrying every token its collector merged; the last output's
        row is the chunk's, the others' tokens are merged into it."""
        last = max(i for i, (_, _, output) in enumerate(held) if output)
        return [held[last][:2]]

    def _record(self, entries: list) -> None:
        """Record the rows of ``entries`` (message, entry, _), each message's together, earlier steps first
        (a request's messages come from its replica, in its steps' order)."""
        if not entries:
            return
        by_msg: dict = {}
        for msg, idx, _ in entries:
            by_msg.setdefault(id(msg), (msg, []))[1].append(idx)
        for msg, idx in sorted(by_msg.values(), key=lambda group: group[0].step):
            self.fe.deliver_entries(msg, np.asarray(idx, dtype=np.int64))

    def _intake(self, rid: int) -> None:
        """A request's HTTP handler: parse, tokenize, hand to the engine core."""
        self.fe.take_in(rid, self)

    def after_rows(self, rid: int, action) -> bool:
        """Call ``action(rid)`` once request ``rid``'s rows held here are recorded; False when none is held."""
        if rid not in self.collector:
            return False
        self.waiters.setdefault(rid, []).append(action)
        return True


class PerOutputAsyncioServer(AsyncioServer):
    """vLLM 0.6.0's API server on the same loop (``serving.api_server_loop: asyncio_per_output``): each
    request's coroutine (``AsyncEngineRPCClient.generate`` on the request's own ZeroMQ socket, then the
    OpenAI SSE generator) writes one chunk per output the engine sent, with nothing merged: 0.6's
    ``RequestOutput`` is cumulative and each is streamed as it comes (vllm/entrypoints/openai/rpc/client.py,
    serving_completion.py). When the loop lags, each turn's streams write their requests' backlogs,
    so every request in flight shares the lag, and a new request's intake runs at the next poll."""

    @staticmethod
    def _chunks(held: list) -> list[tuple]:
        """One chunk per output the stream holds, in step order (nothing merged)."""
        return [(msg, idx) for msg, idx, output in held if output]
