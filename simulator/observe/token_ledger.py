"""Per-token records folded into per-request totals as they are made, instead of kept until the run ends.

The engine and the frontend hand over each step's output rows (one per request: ``req``, ``step``,
``prefill``, ``kind``, ``e``, ``R``, ``tokens``, the schema of ``observe.records``). A row's share of
its request's latency depends only on its own step's times and on the previous row of the same
request, so the ledger keeps, per request, the previous row's times and the category totals, and
adds each row's segments at once: the same partition as walking every request's rows at the end
(``llm_metrics.breakdown``), in memory that grows with requests, not tokens. The inter-token gaps
the ITL statistics need are kept (8 bytes and a request id per token, not a 30-byte row) up to
``EXACT_GAPS`` of them; beyond, the finished requests' gaps go into a quantile sketch
(``observe.sketch``, 0.1% relative error on every percentile), so their memory stops growing.

Rows of one request must arrive in step order. Every output path keeps that order except a separate
detokenizer process, whose output may be handed over after a later step's prefill-only rows; that
placement keeps every row (``keep_rows``) and its metrics walk them at the end.
"""

from __future__ import annotations

import numpy as np

from .columns import Columns, RingColumns
from .records import LLM_CATEGORIES, LLM_LAST_MILE, PREFILL_ONLY, SENT
from .sketch import QuantileSketch

ROW_COLUMNS = {"req": "i4", "step": "i4", "prefill": "i1", "kind": "i1", "e": "f8", "R": "f8", "tokens": "i4"}
"""One output row per (request, step): who, when it was made (``e``) and received (``R``)."""

EXACT_GAPS = 1 << 22
"""Inter-token gaps kept exactly (48 MB with their request ids, about 18,000 requests of 230
tokens); a run with more keeps its percentiles in a sketch."""

FOLD_ROWS = 1 << 16
"""Rows held before they are folded: numpy's per-call cost is paid per fold, not per step, and
the buffer (about 2 MB) is what the per-token record costs in memory."""


class TokenLedger:
    """Per-request category totals, last-mile totals after the first token, and ITL gaps, grown row
    batch by row batch; ``rows`` holds every row too when the output order does not allow folding."""

    def __init__(self, table, steps: Columns, keep_rows: bool = False, capacity: int = 1024):
        n = table.n
        self.table, self.steps = table, steps
        self.full = {c: np.zeros(n) for c in LLM_CATEGORIES}
        self.after = {c: np.zeros(n) for c in LLM_LAST_MILE}
        self.prev = np.full((4, n), np.nan)         # the previous row's g1, d1, e, R
        self.seen = np.zeros(n, dtype=bool)
        self.prev_sent = np.full(n, np.nan)         # R of the previous row the client received
        self.zeros = np.zeros(n, dtype=np.int64)    # tokens that arrived in a chunk after its first
        self.first_step = np.full(n, np.iinfo(np.int64).max)
        self.last_step = np.full(n, -1, dtype=np.int64)
        # sized once for the exact store (untouched pages cost nothing): no copies as it grows
        self.gaps = Columns({"gap": "f8", "req": "i4"}, min(capacity, EXACT_GAPS + FOLD_ROWS))
        self.sketch: QuantileSketch | None = None
        self.rows = Columns(ROW_COLUMNS, capacity) if keep_rows else None
        self.buffer = Columns(ROW_COLUMNS, FOLD_ROWS) if not keep_rows else None
        self._first_step = None  # the oldest step the buffered rows refer to
        self.size = 0

    def extend(self, n: int, **row) -> None:
        """Take ``n`` rows (scalars broadcast, arrays of length n), as ``Columns.extend`` takes them."""
        if n <= 0:
            return
        self.size += n
        if self.rows is not None:
            self.rows.extend(n, **row)
            return
        self.buffer.extend(n, **row)
        if self.buffer.size >= FOLD_ROWS or self._steps_leaving(row["step"]):
            self.flush()

    def _steps_leaving(self, steps) -> bool:
        """Whether the buffered rows' oldest step is about to leave a ring of steps: fold with half
        the ring of margin, more than any batch of steps recorded at once (a decode run of at most
        256)."""
        if not isinstance(self.steps, RingColumns):
            return False
        low = int(np.min(steps))
        self._first_step = low if self._first_step is None else min(self._first_step, low)
        return self.steps.size - self._first_step > self.steps.capacity // 2

    def flush(self) -> None:
        """Fold the buffered rows: request by request, each request's rows in the order they came."""
        b = self.buffer
        if b is None or not b.size:
            return
        req = b["req"].astype(np.int64)
        order = np.argsort(req, kind="stable")
        req = req[order]
        self._fold(req, b["step"][order].astype(np.int64), b["prefill"][order].astype(bool), b["kind"][order],
                   b["e"][order], b["R"][order], b["tokens"][order])
        b.size = 0
        self._first_step = None
        if self.gaps.size > EXACT_GAPS:
            self._spill()

    def _spill(self) -> None:
        """Move the gaps of requests that are done (finished, last token received) into the sketch;
        the gaps of requests still running stay exact until they are done."""
        t = self.table
        done = (t.finished & np.isfinite(t.last_R))[self.gaps["req"]]
        if self.sketch is None:
            self.sketch = QuantileSketch()
        self.sketch.add(self.gaps["gap"][done])
        self.gaps.keep(~done)

    def _fold(self, req, step, prefill, kind, e, R, tokens) -> None:
        t, st = self.table, self.steps
        g1 = st["g1"][step]
        d1 = np.where(kind == PREFILL_ONLY, g1, st["d1"][step])
        first = np.r_[True, req[1:] != req[:-1]]
        prev = np.maximum(np.arange(len(req)) - 1, 0)
        seen = self.seen[req]
        start = np.where(seen, self.prev[0, req], t.tok_end[req])  # the window after the previous row
        ws = np.where(first, start, g1[prev])
        pd1 = np.where(first, np.where(seen, self.prev[1, req], ws), d1[prev])
        pe = np.where(first, np.where(seen, self.prev[2, req], ws), e[prev])
        pR = np.where(first, np.where(seen, self.prev[3, req], ws), R[prev])
        lower = np.nan_to_num(t.first_R[req], nan=np.inf)
        cs = np.maximum(st["a0"][step], ws)
        b1 = np.clip(pd1, ws, cs)
        b2 = np.clip(pe, b1, cs)
        b3 = np.clip(pR, b2, cs)
        self._add("d2h", req, lower, (ws, b1))
        self._add("detokenize", req, lower, (b1, b2))
        self._add("stream", req, lower, (b2, b3))
        c1 = np.clip(st["a1"][step], cs, g1)
        c2 = np.clip(st["g0"][step], c1, g1)
        self._add("queue", req, lower, (b3, cs), (c1, c2))
        self._add("schedule", req, lower, (cs, c1))
        bc = np.maximum(c2, g1 - st["comm"][step])
        self._add("prefill", req[prefill], lower[prefill], (c2[prefill], bc[prefill]))
        decode = ~prefill
        self._add("decode", req[decode], lower[decode], (c2[decode], bc[decode]))
        self._add("comm", req, lower, (bc, g1))
        # each request's last row here becomes its previous row
        last = np.r_[req[1:] != req[:-1], True]
        r_last = req[last]
        self.prev[:, r_last] = (g1[last], d1[last], e[last], R[last])
        first_r = req[first]
        self.first_step[first_r] = np.minimum(self.first_step[first_r], step[first])
        self.seen[r_last] = True
        self.last_step[r_last] = step[last]
        # inter-token gaps of the rows the client received: to the previous such row of the request
        sent = kind == SENT
        if sent.any():
            rs, Rs, ks = req[sent], R[sent], tokens[sent].astype(np.int64)
            same = np.r_[False, rs[1:] == rs[:-1]]
            before = np.where(same, np.r_[np.nan, Rs[:-1]], self.prev_sent[rs])
            has = ~np.isnan(before)
            self.gaps.extend(int(has.sum()), gap=(Rs - before)[has], req=rs[has])
            np.add.at(self.zeros, rs, ks - 1)
            lst = np.r_[rs[1:] != rs[:-1], True]
            self.prev_sent[rs[lst]] = Rs[lst]

    def _acc(self, arr, req, values) -> None:
        """arr[r] += the sum of r's values, for sorted ``req`` (a subset of the fold's rows)."""
        if not len(req):
            return
        starts = np.flatnonzero(np.r_[True, req[1:] != req[:-1]])
        arr[req[starts]] += np.add.reduceat(values, starts)

    def _add(self, cat: str, req, lower, *segments) -> None:
        total = None
        for start, end in segments:
            length = np.maximum(end - start, 0.0)
            total = length if total is None else total + length
            if cat in self.after:
                self._acc(self.after[cat], req, np.maximum(end - np.maximum(start, lower), 0.0))
        self._acc(self.full[cat], req, total)

    # -- the end of the run -------------------------------------------------------------------

    def totals(self, done: np.ndarray):
        """Per-request category totals (all requests; valid for ``done`` ones) and the last-mile
        totals after each done request's first token: the rows folded so far, plus what only the
        end tells — time before the engine (queue to tokenization, tokenization) and each done
        request's last mile after its final row."""
        self.flush()
        t = self.table
        ids = np.flatnonzero(done & self.seen)
        full = {c: v.copy() for c, v in self.full.items()}
        after = {c: float(v[ids].sum()) for c, v in self.after.items()}
        lower = np.nan_to_num(t.first_R[ids], nan=np.inf)

        def add(cat, start, end):
            full[cat][ids] += np.maximum(end - start, 0.0)
            if cat in after:
                after[cat] += float(np.maximum(end - np.maximum(start, lower), 0.0).sum())

        add("queue", t.arrival[ids], t.tok_start[ids])
        add("schedule", t.tok_start[ids], t.tok_end[ids])
        g1, d1, e, R = self.prev[:, ids]
        add("d2h", g1, d1)
        add("detokenize", d1, e)
        add("stream", e, R)
        return full, after

    def itl(self, done: np.ndarray) -> np.ndarray | QuantileSketch:
        """Every done request's inter-token gaps at the client, then a zero per token that arrived in
        a chunk after its first (in the order the gaps were made); or, for a run whose gaps outgrew
        the exact store, the sketch of them all."""
        self.flush()
        keep = done[self.gaps["req"]]
        if self.sketch is not None:
            out = self.sketch.copy()
            out.add(self.gaps["gap"][keep])
            out.add_zeros(int(self.zeros[done].sum()))
            return out
        zeros = int(self.zeros[done].sum())
        if not zeros and keep.all():
            return self.gaps["gap"]  # every gap is a done request's: the store itself, not a copy
        out = np.empty(int(keep.sum()) + zeros)
        out[: len(out) - zeros] = self.gaps["gap"][keep]
        out[len(out) - zeros:] = 0.0
        return out
