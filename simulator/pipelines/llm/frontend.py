"""The serving frontend: API-server processes (tokenize, detokenize, stream), the router and the client link."""

from __future__ import annotations

import heapq

import numpy as np

from ...hardware.cpu import CPUProcess
from ...hardware.topology import LinkParams
from ...observe.records import BUFFERED, SENT
from .engine import RequestTable
from .event_loop import AsyncioServer, Message, PerOutputAsyncioServer
from .placements import streaming
from .routers import make_router
from .settings import TOKEN_ID_BYTES, FrontendSettings, detokenize_cost, message_cost, output_message_cost, outputs_cost
from .run_support import declare, only

# How closed-form runs of steps cover the serving keys this module owns (run_support).
declare("api_server_process", owner="frontend")
declare("api_servers", owner="frontend")
declare("stream_interval", owner="frontend")  # above 1 with the layouts run_support.ENGINE_CONDITIONS names
declare("chunk_bytes_per_token", owner="frontend")
declare("response_header_bytes", owner="frontend")
declare("api_server_loop", only("fifo"), "the asyncio loop decides each chunk's tokens as the loop reaches it",
        owner="frontend")

API_SERVER_LOOPS = {"fifo": None, "asyncio": AsyncioServer, "asyncio_per_output": PerOutputAsyncioServer}
"""``serving.api_server_loop`` -> the loop each API server runs its work in (None: whole tasks on its FIFO clock)."""


class Frontend:
    """API servers take requests in, route them to engines, and stream chunks to the clients.

    Every submission happens at the current simulated time, so each API server is a FIFO
    virtual clock; a chunk's receipt time is its serialization end plus the client link's
    latency and transfer time (a closed form per chunk, on the Topology's client link: a
    Fabric transfer per chunk would cost events per token). Where the API servers run in their
    own processes, requests and outputs cross to and from the engines as messages
    (``settings.message_cost`` at each end); where each runs inside its replica's engine process
    (``api_server_process: engine``, vLLM <= 0.5), the router picks the replica on arrival and
    the request is parsed, tokenized and streamed on that engine's clock.
    """

    def __init__(self, env, settings: FrontendSettings, client: LinkParams, table: RequestTable,
                 servers: list[CPUProcess], rows, on_finish, loadgen: CPUProcess | None = None):
        self.env = env
        self.sv = settings
        self.cpu = settings.cpu
        self.client = client
        # a chunk's time on the client link: a fixed part per chunk and a part per token it carries
        bw = client.bandwidth
        self.chunk_delay = client.latency + settings.response_header_bytes / bw
        self.token_delay = settings.chunk_bytes_per_token / bw
        self.table = table
        self.servers = servers
        self.rows = rows
        self.on_finish = on_finish
        self.engines = []
        self.router = make_router(settings.router, table, settings.seed)
        self.next_rid = 0  # the open loop's next request: the workload's, or a decode run's that took it
        self._pending: dict[int, float] = {}  # tokenizations that end in the future: request -> when it routes
        self.loadgen = loadgen  # the load generator's process on the host's cores (``workload.client_cpu``), or None
        loop = API_SERVER_LOOPS[settings.loop]
        self.loops = None if loop is None else [loop(self, j) for j in range(len(servers))]

    def tokenize_cost(self, rid: int) -> tuple[int, int | None, float]:
        """Where request ``rid`` is parsed and tokenized and what it costs: (API server, replica
        chosen on arrival or None, CPU seconds)."""
        cpu = self.cpu
        prompt = float(self.table.prompt[rid])
        cost = cpu.request_overhead + cpu.tokenize_per_token * prompt
        if self.sv.shared:
            j = k = self._pick(rid)  # API server j is replica j's engine process
        else:
            j, k = self.server_of(rid), None
            cost += message_cost(cpu, 1, TOKEN_ID_BYTES * prompt)  # the request goes to the engine
        return j, k, cost

    def server_of(self, rid: int) -> int:
        """The API server request ``rid`` reaches where they are processes of their own (in turn)."""
        return rid % len(self.servers)

    def send(self, rid: int) -> None:
        """The client sends request ``rid`` now: it reaches an API server at once, or, with the load
        generator on the host, once that process has built and sent it (its latency counts from when
        the client began, as ``vllm bench serve`` times a request from before its POST)."""
        if self.loadgen is None:
            self.arrive(rid)
            return
        start, end = self.loadgen.submit(self.env.now, self.sv.client_cpu.per_request, "send request")
        self.table.arrival[rid] = start
        if end > self.env.now:
            self.env.timeout(end - self.env.now).callbacks.append(lambda _ev: self.arrive(rid))
        else:
            self.arrive(rid)

    def arrive(self, rid: int) -> None:
        """A request reaches an API server: parse and tokenize it, then hand it to an engine."""
        if self.loops is not None:
            self.loops[self.server_of(rid)].request(self.env.now, rid)
            return
        self._tokenized(rid, lambda j, cost: self.servers[j].submit(self.env.now, cost, "tokenize"))

    def take_in(self, rid: int, loop) -> None:
        """An event loop's intake of request ``rid`` (``event_loop``): tokenized on its clock, then routed."""
        self._tokenized(rid, lambda _j, cost: loop.book(cost, "tokenize"))

    def _tokenized(self, rid: int, book) -> None:
        """Parse and tokenize request ``rid`` with ``book(server, seconds) -> (start, end)``, then route it."""
        t = self.table
        j, k, cost = self.tokenize_cost(rid)
        t.api[rid] = j
        start, end = book(j, cost)
        t.tok_start[rid], t.tok_end[rid] = start, end
        self._routed_at(rid, end, k)

    def _routed_at(self, rid: int, e: float, k: int | None) -> None:
        """Route ``rid`` once its tokenization ends at ``e`` (at once if that is now)."""
        if e > self.env.now:
            self._route_at(rid, e, k)
        else:
            self.route(rid, k)

    def _route_at(self, rid: int, at: float, k: int | None = None) -> None:
        self._pending[rid] = at
        self.env.timeout(at - self.env.now).callbacks.append(lambda _ev: self._route_later(rid, k))

    def _route_later(self, rid: int, k: int | None) -> None:
        if self._pending.pop(rid, None) is not None:  # else a decode run routed it, or will again
            self.route(rid, k)

    def took_arrivals(self, upto: int) -> None:
        """The open loop's requests below ``upto`` have arrived (handed over by the loop or taken by a run)."""
        self.next_rid = upto

    def take_routes(self) -> list:
        """The tokenizations not yet routed, for a decode run to route as its steps pass their
        ends: a heap of (end, order, request)."""
        routes = [(at, i, rid) for i, (rid, at) in enumerate(self._pending.items())]
        self._pending.clear()
        heapq.heapify(routes)
        return routes

    def give_back_routes(self, routes: list) -> None:
        """What a decode run did not route: routed at their ends, in their order."""
        for at, _, rid in sorted(routes):
            self._route_at(rid, at, self._chosen(rid))

    def route_tokenized(self, rid: int) -> None:
        """Route request ``rid``, tokenized in a decode run: to the replica chosen on its arrival
        where the API servers are engine processes, else to the router's choice now (as :meth:`arrive`)."""
        self.route(rid, self._chosen(rid))

    def _chosen(self, rid: int) -> int | None:
        return int(self.table.api[rid]) if self.sv.shared else None  # API server j is replica j's

    def _pick(self, rid: int) -> int:
        """The replica the router sends request ``rid`` to."""
        return self.router.pick(self.engines, rid)

    def route(self, rid: int, k: int | None = None, received: bool = False) -> None:
        """Hand tokenized request ``rid`` to replica ``k`` (the router's choice when None; ``received``:
        a closed-form run booked its message on the engine's process)."""
        if k is None:
            k = self._pick(rid)
        self.table.replica[rid] = k
        self.engines[k].enqueue(rid, received)

    def _deliver(self, step: int, emit, send, prefill_flag, done, marks: dict, done_send, gen) -> None:
        """Record every emitted token's row; sent chunks reach the client over its link.

        ``send`` is a mask over ``emit`` or None when all are sent; ``prefill_flag`` marks first
        tokens after a prefill (None: all decode); ``done`` marks finished requests (None: none);
        ``marks`` holds each token's (or every token's) milestones ``i``, ``o``, ``e``, ``x``
        (``observe.attribution.PREV``); ``done_send``: when each sent chunk was serialized; ``gen``:
        each of ``emit``'s tokens made as of its step (a chunk carries those, not any made since).
        """
        t = self.table
        sent_ids, gen = streaming(emit, send), streaming(gen, send)
        before = t.sent[sent_ids]
        ntok = gen - before
        received = self.receipt_time(done_send, ntok)
        if send is None:
            R, kind, tokens = received, SENT, ntok
        else:  # a token held back by the stream interval is "received" when its output is made
            R = np.broadcast_to(marks["e"], emit.shape).astype(float)
            R[send] = received
            x = np.broadcast_to(marks["x"], emit.shape).astype(float)
            x[~send] = R[~send]
            marks = dict(marks, x=x)
            kind = np.where(send, SENT, BUFFERED).astype(np.int8)
            tokens = np.zeros(len(emit), dtype=np.int64)
            tokens[send] = ntok
        if prefill_flag is not None:
            first = before == 0
            t.first_R[sent_ids[first]] = received[first]
        t.sent[sent_ids] = gen
        t.last_R[sent_ids] = received
        self.rows.extend(len(emit), req=emit, step=step, prefill=0 if prefill_flag is None else prefill_flag,
                         kind=kind, **marks, R=R, tokens=tokens)
        if done is not None:
            fin = done if send is None else done[send]
            for rid, receipt in zip(sent_ids[fin].tolist(), received[fin].tolist()):
                self.on_finish(rid, receipt)

    def receipt_time(self, serialized, ntok):
        """When chunks written at ``serialized`` carrying ``ntok`` tokens each reach the client over its link
        (and, with the load generator on the host, when its process has read each, in arrival order)."""
        at = serialized + self.chunk_delay + ntok * self.token_delay
        if self.loadgen is None:
            return at
        read, cost = np.empty(len(at)), self.sv.client_cpu.per_chunk
        for i in np.argsort(at, kind="stable").tolist():
            read[i] = self.loadgen.submit(float(at[i]), cost, "read chunk")[1]
        return read

    def messages_cost(self, counts: dict) -> float:
        """CPU seconds to serialize a step's outputs for the API servers: one message per server
        that holds some (``counts``: entries per such server; the receiving end costs as much,
        booked by :meth:`receive_costs`)."""
        return sum(output_message_cost(self.sv, n) for n in counts.values())

    def receive_costs(self, counts: dict) -> dict:
        """Per API server, the seconds to receive and deserialize its part of a step's outputs."""
        if self.sv.shared or not self.cpu.has_ipc:
            return {}
        return {j: cost for j, n in counts.items() if (cost := output_message_cost(self.sv, n)) > 0}

    def counts(self, emit) -> dict[int, int]:
        """Requests of ``emit`` per API server that holds some (in server order): the work of a step
        grows with the servers it touches, never with the servers there are."""
        if len(self.servers) == 1:
            return {0: len(emit)} if len(emit) else {}
        counts = np.bincount(self.table.api[emit], minlength=len(self.servers))
        held = np.flatnonzero(counts)
        return dict(zip(held.tolist(), counts[held].tolist()))

    def _token_counts(self, emit, emitted, counts: dict) -> dict[int, int]:
        """Tokens per API server (those of ``counts``, :meth:`counts` of ``emit``) of a step whose
        requests emitted ``emitted`` tokens each."""
        if len(self.servers) == 1:
            return {0: int(emitted.sum())}
        tokens = np.bincount(self.table.api[emit], weights=emitted, minlength=len(self.servers)).astype(int)
        return {j: int(tokens[j]) for j in counts}

    def _serialize(self, sent_ids, now: float, per_chunk: float, lead: dict | None = None):
        """Serialize one chunk per request on its API server, after ``lead[j]`` — a list of
        (label, seconds, milestone) tasks — there: receiving the outputs, detokenizing them, building
        them (a task that costs nothing is not booked; the detokenization always is).

        Returns each chunk's end time and, per server, the end of each lead task by the milestone
        it sets (``observe.attribution.PREV``).
        """
        marks = {}
        if not lead and len(self.servers) == 1:  # the common case: one server, nothing before the chunks
            if not len(sent_ids):
                return np.empty(0), marks
            s, _ = self.servers[0].submit(now, len(sent_ids) * per_chunk, "stream")
            return s + per_chunk * np.arange(1, len(sent_ids) + 1), marks
        lead = lead or {}
        if len(self.servers) == 1:
            groups = {0: None} if len(sent_ids) or lead else {}
        else:  # the chunks of each server that has some, in their order (a stable sort by server)
            api = self.table.api[sent_ids]
            order = np.argsort(api, kind="stable")
            held, first, count = np.unique(api[order], return_index=True, return_counts=True)
            groups = {j: order[a:a + n] for j, a, n in zip(held.tolist(), first.tolist(), count.tolist())}
            groups.update((j, groups.get(j, order[:0])) for j in lead)
        done = np.empty(len(sent_ids))
        for j in sorted(groups):
            server, index = self.servers[j], groups[j]
            n = len(sent_ids) if index is None else len(index)
            ends = marks[j] = {}
            for label, seconds, mark in lead.get(j, ()):
                if seconds > 0 or label == "detokenize":
                    ends[mark] = server.submit(now, seconds, label)[1]
            s, _ = server.submit(now, n * per_chunk, "stream")
            chunk_ends = s + per_chunk * np.arange(1, n + 1)
            if index is None:
                done = chunk_ends
            else:
                done[index] = chunk_ends
        return done, marks

    def _per_row(self, emit, marks: dict, name: str, default):
        """Milestone ``name`` of each of ``emit``'s rows from its API server's lead tasks (``default``
        where its server booked none that sets it)."""
        if len(self.servers) == 1:
            return marks.get(0, {}).get(name, default)
        at = np.broadcast_to(np.asarray(default, dtype=float), emit.shape).copy()
        api = self.table.api[emit]
        for j, ends in marks.items():
            if name in ends:
                at[api == j] = ends[name]
        return at

    def stream(self, step: int, emit, send, prefill_flag, done, made: tuple, gen, now: float | None = None) -> None:
        """Outputs built in the engine or a detokenizer process (``made``: when their ids reached
        it, were detokenized and their outputs built) reach the API servers now (or at ``now``, when
        they were due): each receives its part of the step's outputs and serializes one SSE chunk per
        sending request."""
        if self.loops is not None:
            self._to_loops(step, emit, send, prefill_flag, done, self.env.now if now is None else now, None, gen, made)
            return
        i, o, e = made
        sent_ids = streaming(emit, send)
        receive = self.receive_costs(self.counts(sent_ids)) if self.cpu.has_ipc else {}
        lead = {j: [("receive outputs", c, "x")] for j, c in receive.items()}
        serialized, marks = self._serialize(sent_ids, self.env.now if now is None else now, self.cpu.stream_per_chunk,
                                            lead)
        x = self._per_row(emit, marks, "x", e)
        self._deliver(step, emit, send, prefill_flag, done, {"i": i, "o": o, "e": e, "x": x}, serialized, gen)

    def stream_with_detok(self, step: int, emit, send, prefill_flag, done, now: float, emitted, gen) -> None:
        """vLLM V1 layout: each API server receives its requests' sampled ids, detokenizes them and
        builds their outputs (OutputProcessor.process_outputs, before any stream runs), then streams
        (``emitted``: tokens per request where one may emit several, as with speculative decoding;
        None: one each)."""
        if self.loops is not None:
            self._to_loops(step, emit, send, prefill_flag, done, now, emitted, gen)
            return
        c = self.cpu
        counts = self.counts(emit)
        receive = self.receive_costs(counts)
        tokens = counts if emitted is None else self._token_counts(emit, emitted, counts)
        sent_ids = streaming(emit, send)
        chunks = counts if send is None else self.counts(sent_ids)
        lead = {}
        for j in counts:
            lead[j] = ([("receive outputs", receive[j], "i")] if j in receive else []) + [
                ("detokenize", detokenize_cost(c, int(tokens[j])), "o"), ("output", outputs_cost(c, chunks.get(j, 0)), "e")]
        serialized, marks = self._serialize(sent_ids, now, c.stream_per_chunk, lead)
        o = self._per_row(emit, marks, "o", now)
        e = self._per_row(emit, marks, "e", o)
        made = {"i": self._per_row(emit, marks, "i", now), "o": o, "e": e, "x": e}
        self._deliver(step, emit, send, prefill_flag, done, made, serialized, gen)

    def _to_loops(self, step: int, emit, send, prefill_flag, done, now: float, emitted, gen, made=None) -> None:
        """The step's outputs on the API servers' asyncio loops: each server's part reaches its socket at
        ``now`` as one message (``event_loop.Message``), as ids to detokenize (vLLM V1) or as outputs
        ``made`` elsewhere (their (i, o, e) milestones)."""
        if not len(emit):
            return
        n = len(self.servers)
        api = self.table.api[emit] if n > 1 else None
        for j in range(n):
            part = slice(None) if api is None else np.flatnonzero(api == j)
            if api is not None and not len(part):
                continue
            cut = (lambda a: None if a is None else np.asarray(a)[part])  # noqa: E731 - the server's entries
            mine = None if made is None else tuple(np.broadcast_to(m, emit.shape)[part] for m in made)
            self.loops[j].message(now, Message(step, emit[part], cut(send), cut(prefill_flag), cut(done), gen[part],
                                               cut(emitted), mine))

    def deliver_entries(self, msg: Message, idx) -> None:
        """Rows ``idx`` of a loop's message, each token gone in a chunk or held: a chunk's own row carries
        every token made by then (``sent_at``); a token merged into a later chunk, or held by the stream
        interval, is held (``_deliver``'s rule)."""
        sent_at = msg.sent_at[idx]
        sent = ~np.isnan(sent_at)
        cut = (lambda a: None if a is None else a[idx])  # noqa: E731 - these entries'
        marks = {m: msg.marks[m][idx] for m in ("i", "o", "e", "x")}
        self._deliver(msg.step, msg.emit[idx], None if sent.all() else sent, cut(msg.prefill), cut(msg.done), marks,
                      sent_at[sent], msg.gen[idx])

    def after_delivered(self, action, rids) -> None:
        """Call ``action()`` once the API servers' loops have recorded the rows they hold of requests
        ``rids`` (at once where they hold none, or without loops): rows recorded apart (a prefill chunk's,
        after a preemption) stay behind the request's earlier rows."""
        loops, api = self.loops, self.table.api
        waiting = [r for r in rids.tolist() if r in loops[api[r]].collector] if loops else []
        if not waiting:
            action()
            return
        left = set(waiting)

        def done(rid: int) -> None:
            left.discard(rid)
            if not left:
                action()

        for r in waiting:
            loops[api[r]].after_rows(r, done)
