"""The serving frontend: API-server processes (tokenize, detokenize, stream), the router and the client link."""

from __future__ import annotations

import heapq

import numpy as np

from ...hardware.cpu import CPUProcess
from ...hardware.topology import LinkParams
from ...observe.records import BUFFERED, SENT
from .engine import RequestTable
from .settings import FrontendSettings


class Frontend:
    """API servers take requests in, route them to engines, and stream chunks to the clients.

    Every submission happens at the current simulated time, so each API server is a FIFO
    virtual clock; a chunk's receipt time is its serialization end plus the client link's
    latency and transfer time (a closed form per chunk, on the Topology's client link: a
    Fabric transfer per chunk would cost events per token).
    """

    def __init__(self, env, settings: FrontendSettings, client: LinkParams, table: RequestTable,
                 servers: list[CPUProcess], rows, on_finish):
        self.env = env
        self.sv = settings
        self.cpu = settings.cpu
        self.client = client
        self.table = table
        self.servers = servers
        self.rows = rows
        self.on_finish = on_finish
        self.engines = []
        self._rr = 0
        self.next_arrival = float("inf")  # the open-loop arrival the workload waits for (set by it)
        self._routes: list[float] = []   # tokenizations that end in the future: when they route

    def next_event(self) -> float:
        """When the frontend next changes an engine's world: the next arrival or routing."""
        return min(self.next_arrival, self._routes[0]) if self._routes else self.next_arrival

    def arrive(self, rid: int) -> None:
        """A request reaches an API server: parse and tokenize it, then hand it to an engine."""
        t = self.table
        j = rid % len(self.servers)
        t.api[rid] = j
        cost = self.cpu.request_overhead + self.cpu.tokenize_per_token * float(t.prompt[rid])
        s, e = self.servers[j].submit(self.env.now, cost, "tokenize")
        t.tok_start[rid], t.tok_end[rid] = s, e
        if e > self.env.now:
            heapq.heappush(self._routes, e)
            self.env.timeout(e - self.env.now).callbacks.append(lambda _ev: self._route_later(rid))
        else:
            self._route(rid)

    def _route_later(self, rid: int) -> None:
        heapq.heappop(self._routes)
        self._route(rid)

    def _route(self, rid: int) -> None:
        if self.sv.router == "least_outstanding":
            k = min(range(len(self.engines)), key=lambda i: (self.engines[i].outstanding, i))
        else:
            k = self._rr
            self._rr = (self._rr + 1) % len(self.engines)
        self.table.replica[rid] = k
        self.engines[k].enqueue(rid)

    def _deliver(self, step: int, emit, send, prefill_flag, done, e_tok, done_send) -> None:
        """Record every emitted token's row; sent chunks reach the client over its link.

        ``send`` is a mask over ``emit`` or None when all are sent; ``prefill_flag`` marks first
        tokens after a prefill (None: all decode); ``done`` marks finished requests (None: none);
        ``e_tok`` is each token's (or every token's) detokenization end.
        """
        t, sv, client = self.table, self.sv, self.client
        sent_ids = emit if send is None else emit[send]
        gen = t.generated[sent_ids]
        before = t.sent[sent_ids]
        ntok = gen - before
        bw = client.bandwidth
        received = done_send + (client.latency + sv.response_header_bytes / bw) + ntok * (sv.chunk_bytes_per_token / bw)
        if send is None:
            R, kind, tokens = received, SENT, ntok
        else:
            R = np.broadcast_to(e_tok, emit.shape).astype(float)
            R[send] = received
            kind = np.where(send, SENT, BUFFERED).astype(np.int8)
            tokens = np.zeros(len(emit), dtype=np.int64)
            tokens[send] = ntok
        if prefill_flag is not None:
            first = before == 0
            t.first_R[sent_ids[first]] = received[first]
        t.sent[sent_ids] = gen
        t.last_R[sent_ids] = received
        self.rows.extend(len(emit), req=emit, step=step, prefill=0 if prefill_flag is None else prefill_flag,
                         kind=kind, e=e_tok, R=R, tokens=tokens)
        if done is not None:
            fin = done if send is None else done[send]
            for rid, receipt in zip(sent_ids[fin].tolist(), received[fin].tolist()):
                self.on_finish(rid, receipt)

    def _serialize(self, sent_ids, now: float, per_chunk: float, lead: dict | None = None):
        """Serialize one chunk per request on its API server, after ``lead[j]`` seconds of other work there.

        Returns each chunk's end time and each server's task start.
        """
        lead = lead or {}
        starts = {}
        if len(self.servers) == 1:
            first = lead.get(0, 0.0)
            if len(sent_ids) or first:
                starts[0], _ = self.servers[0].submit(now, first + len(sent_ids) * per_chunk, "stream")
            return starts.get(0, now) + first + per_chunk * np.arange(1, len(sent_ids) + 1), starts
        done = np.empty(len(sent_ids))
        api = self.table.api[sent_ids]
        for j, server in enumerate(self.servers):
            mask = api == j
            n = int(mask.sum())
            first = lead.get(j, 0.0)
            if n or first:
                starts[j], _ = server.submit(now, first + n * per_chunk, "stream")
                done[mask] = starts[j] + first + per_chunk * np.arange(1, n + 1)
        return done, starts

    def stream(self, step: int, emit, send, prefill_flag, done, e: float) -> None:
        """Detokenized tokens arrive at time e (= now): serialize one SSE chunk per sending request."""
        sent_ids = emit if send is None else emit[send]
        serialized, _ = self._serialize(sent_ids, e, self.cpu.stream_per_chunk)
        self._deliver(step, emit, send, prefill_flag, done, e, serialized)

    def stream_with_detok(self, step: int, emit, send, prefill_flag, done, now: float) -> None:
        """vLLM V1 layout: each API server detokenizes its own requests, builds outputs and streams."""
        t, c = self.table, self.cpu
        per_chunk = c.output_per_request + c.stream_per_chunk
        api = t.api[emit]
        counts = np.bincount(api, minlength=len(self.servers))
        detok = {j: c.detokenize_step_fixed + c.detokenize_per_token * int(n) for j, n in enumerate(counts) if n}
        sent_ids = emit if send is None else emit[send]
        serialized, starts = self._serialize(sent_ids, now, per_chunk, detok)
        e_tok = np.empty(len(emit))
        for j in detok:
            e_tok[api == j] = starts[j] + detok[j]
        self._deliver(step, emit, send, prefill_flag, done, e_tok, serialized)
