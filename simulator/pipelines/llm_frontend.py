"""The serving frontend: API-server processes (tokenize, detokenize, stream), the router and the client link."""

from __future__ import annotations

import numpy as np

from ..hardware.cpu import CPUProcess
from .llm_engine import BUFFERED, SENT, RequestTable


class Frontend:
    """API servers take requests in, route them to engines, and stream chunks to the clients.

    Every submission happens at the current simulated time, so each API server is a FIFO
    virtual clock; a chunk's receipt time is its serialization end plus the client link's
    latency and transfer time.
    """

    def __init__(self, env, scenario, table: RequestTable, servers: list[CPUProcess], rows, on_finish):
        self.env = env
        self.sv = scenario.serving
        self.cpu = scenario.hardware.cpu
        self.client = scenario.hardware.client_link
        self.table = table
        self.servers = servers
        self.rows = rows
        self.on_finish = on_finish
        self.engines = []
        self._rr = 0

    def arrive(self, rid: int) -> None:
        """A request reaches an API server: parse and tokenize it, then hand it to an engine."""
        t = self.table
        j = rid % len(self.servers)
        t.api[rid] = j
        cost = self.cpu.request_overhead + self.cpu.tokenize_per_token * float(t.prompt[rid])
        s, e = self.servers[j].submit(self.env.now, cost, "tokenize")
        t.tok_start[rid], t.tok_end[rid] = s, e
        if e > self.env.now:
            self.env.timeout(e - self.env.now).callbacks.append(lambda _ev: self._route(rid))
        else:
            self._route(rid)

    def _route(self, rid: int) -> None:
        if self.sv.router == "least_outstanding":
            k = min(range(len(self.engines)), key=lambda i: (self.engines[i].outstanding, i))
        else:
            k = self._rr
            self._rr = (self._rr + 1) % len(self.engines)
        self.table.replica[rid] = k
        self.engines[k].enqueue(rid)

    def _deliver(self, step: int, emit, send, prefill_flag, e_tok, done_send, now: float) -> None:
        """Record every emitted token's row; sent chunks reach the client over its link."""
        t = self.table
        R = e_tok.copy()
        kind = np.full(len(emit), BUFFERED, dtype=np.int8)
        tokens = np.zeros(len(emit), dtype=np.int64)
        sent_ids = emit[send]
        if len(sent_ids):
            ntok = t.generated[sent_ids] - t.sent[sent_ids]
            nbytes = self.sv.response_header_bytes + ntok * self.sv.chunk_bytes_per_token
            R[send] = done_send + self.client.latency + nbytes / self.client.effective_bandwidth
            kind[send] = SENT
            tokens[send] = ntok
            t.sent[sent_ids] = t.generated[sent_ids]
            first = np.isnan(t.first_R[sent_ids])
            t.first_R[sent_ids[first]] = R[send][first]
            t.last_R[sent_ids] = R[send]
        self.rows.extend(len(emit), req=emit, step=step, prefill=prefill_flag.astype(np.int8), kind=kind,
                         e=e_tok, R=R, tokens=tokens)
        fin = sent_ids[t.finished[sent_ids]]
        for rid in fin.tolist():
            self.on_finish(rid, float(t.last_R[rid]))

    def stream(self, step: int, emit, send, prefill_flag, e: float) -> None:
        """Detokenized tokens arrive at time e (= now): serialize one SSE chunk per sending request."""
        t = self.table
        sent_ids = emit[send]
        done = np.empty(len(sent_ids))
        if len(sent_ids):
            api = t.api[sent_ids]
            for j, server in enumerate(self.servers):
                mask = api == j
                n = int(mask.sum())
                if n:
                    s, _ = server.submit(self.env.now, n * self.cpu.stream_per_chunk, "stream")
                    done[mask] = s + self.cpu.stream_per_chunk * np.arange(1, n + 1)
        self._deliver(step, emit, send, prefill_flag, np.full(len(emit), e), done, e)

    def stream_with_detok(self, step: int, emit, send, prefill_flag, now: float) -> None:
        """vLLM V1 layout: each API server detokenizes its own requests, builds outputs and streams."""
        t, c = self.table, self.cpu
        api = t.api[emit]
        e_tok = np.empty(len(emit))
        done = np.empty(len(emit))
        for j, server in enumerate(self.servers):
            mask = api == j
            n = int(mask.sum())
            if not n:
                continue
            n_send = int((mask & send).sum())
            detok = c.detokenize_step_fixed + c.detokenize_per_token * n
            per_chunk = c.output_per_request + c.stream_per_chunk
            s, _ = server.submit(now, detok + n_send * per_chunk, "detokenize+stream")
            e_tok[mask] = s + detok
            done[mask & send] = s + detok + per_chunk * np.arange(1, n_send + 1)
        self._deliver(step, emit, send, prefill_flag, e_tok, done[send], now)
