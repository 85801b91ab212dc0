"""Per-token records folded into per-request totals as they are made, instead of kept until the run ends.

The engine and the frontend hand over each step's output rows (one per request: ``req``, ``step``,
``prefill``, ``kind``, ``e``, ``R``, ``tokens``, the schema of ``observe.records``). A row's share of
its request's latency depends only on its own step's times and on the previous row of the same
request, so the ledger keeps, per request, the previous row's times and the category totals, and
adds each row's segments at once: the same partition as walking every request's rows at the end
(``llm_metrics.breakdown``). Its per-request columns live in the request table's window
(``observe.paged``): once a request is done (and ``RETIRE_LAG`` more steps are made), its results go
to the run's :class:`~simulator.observe.request_store.RequestStore` on disk, in id order, and its
memory is handed back, so memory follows the requests in flight, not the run's length. The
inter-token gaps the ITL statistics need are kept (8 bytes and a request id per token, not a 30-byte
row) up to ``EXACT_GAPS`` of them; a run that will make more keeps the done requests' gaps in a
quantile sketch (``observe.sketch``, 0.1% relative error on every percentile) from the start.

Rows of one request must arrive in step order (with a separate detokenizer process, the rows made
apart from its outputs wait for the outputs on their way: ``Engine.after_pending``). A disaggregated
deployment, whose requests' rows lie on two replicas far apart in steps, keeps every row
(``keep_rows``) and its metrics walk them at the end.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from . import attribution
from .columns import Columns, RingColumns
from .itl import ITL
from .paged import CHUNK
from .records import LLM_CATEGORIES, LLM_LAST_MILE, PREFILL_ONLY, SENT
from .request_store import RequestStore
from .sketch import QuantileSketch

ROW_COLUMNS = {"req": "i4", "step": "i4", "prefill": "i1", "kind": "i1", "i": "f8", "o": "f8", "e": "f8", "x": "f8",
               "R": "f8", "tokens": "i4"}
"""One output row per (request, step): who, its token's milestones after the copy (``attribution.PREV``:
at the detokenizing process, detokenized, its output made, at the API server, received)."""

EXACT_GAPS = 1 << 22
"""Inter-token gaps kept exactly (48 MB with their request ids, about 18,000 requests of 230
tokens); a run whose requests ask for more output tokens keeps its percentiles in a sketch."""

FOLD_SLICE = 1 << 14
"""Rows folded by one numpy pass (whole requests at a time): its temporaries are what a fold costs."""

SKETCH_GAPS = 1 << 18
"""Gaps held before the done requests' go into the sketch, once the run keeps them there (3 MB)."""

RETIRE_LAG = 1 << 12
"""Steps per engine replica made between a request being seen done and its retirement from memory:
far more than a step launched before it finished can take to be processed (multi-step runs 64 at
most, async overlap one ahead, a decode run 256 at once), with the replicas its requests went to
making steps in turn (all replicas' steps share one count)."""

RESULT_COLUMNS = {"api": "i4", "replica": "i4", "tok_start": "f8", "tok_end": "f8", "first_R": "f8",
                  "last_R": "f8", "preemptions": "i4", "finished": "?", "seen": "?", "zeros": "i8",
                  "first_step": "i8", "last_step": "i8",
                  **{f"cat_{c}": "f8" for c in LLM_CATEGORIES}, **{f"after_{c}": "f8" for c in LLM_LAST_MILE},
                  **{f"after_end_{c}": "f8" for c in LLM_LAST_MILE}}
"""What the store keeps of each request: its timestamps and places, its category totals (``cat_``), its
last-mile time after its first token folded (``after_``) and added at its end (``after_end_``)."""

ROW_MARKS = attribution.ROW_MARKS

FOLD_ROWS = 1 << 16
"""Rows held before they are folded: numpy's per-call cost is paid per fold, not per step, and
the buffer (about 2 MB) is what the per-token record costs in memory."""


def complete(t, which):
    """Whether requests ``which`` (of the request table ``t``) are complete: the engine finished them and
    the client received the whole response (at a horizon, a request the engine finished may still have
    its last chunk on its way: with a step of lag, or held back by a stream interval). The one rule of
    what a run counts as completed."""
    return t.finished[which] & (t.sent[which] >= t.output[which])


class TokenLedger:
    """Per-request category totals, last-mile totals after the first token, and ITL gaps, grown row
    batch by row batch; ``rows`` holds every row too when the output order does not allow folding."""

    def __init__(self, table, steps: Columns, keep_rows: bool = False, capacity: int = 1024):
        w = table.window
        self.table, self.steps = table, steps
        self.full = {c: w.column("f8") for c in LLM_CATEGORIES}
        self.after = {c: w.column("f8") for c in LLM_LAST_MILE}
        # the previous row's g1 and its milestones (``attribution.PREV``)
        self.prev_g1 = w.column("f8", np.nan)
        self.prev = {m: w.column("f8", np.nan) for m in attribution.PREV}
        self.seen = w.column(bool)
        self.prev_sent = w.column("f8", np.nan)     # R of the previous row the client received
        self.zeros = w.column(np.int64)             # tokens that arrived in a chunk after its first
        self.first_step = w.column(np.int64, np.iinfo(np.int64).max)
        self.last_step = w.column(np.int64, -1)
        # a run that will make more gaps than the exact store holds keeps them in the sketch from
        # the start (only the running requests' gaps are held); otherwise the store is sized once
        # (untouched pages cost nothing): no copies as it grows
        planned = max(capacity - table.n, 0)
        self.sketch: QuantileSketch | None = QuantileSketch() if planned > EXACT_GAPS else None
        size = SKETCH_GAPS if self.sketch is not None else min(capacity, EXACT_GAPS + FOLD_ROWS)
        self.gaps = Columns({"gap": "f8", "req": "i4"}, max(size, 1))
        self.rows = Columns(ROW_COLUMNS, capacity) if keep_rows else None
        self.buffer = Columns(ROW_COLUMNS, FOLD_ROWS) if not keep_rows else None
        self._first_step = None  # the oldest step the buffered rows refer to
        self.size = 0
        self.store = RequestStore(RESULT_COLUMNS)
        self.retired = 0  # requests below this id are in the store and out of memory
        self._marks: deque = deque()  # (steps made, requests done below this id) at each fold
        self._replicas = 1  # replicas the requests not yet retired went to (the lag scales with them)
        self._retire_size = 0  # rows folded when a decode run's rows last looked for requests to retire

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

    def fold_run(self, first_step: int, times: dict, slot_req, first, last, first_prefill, prefill_rows, R,
                 row_req, row_step) -> None:
        """A closed-form decode run's rows, folded as they are made: the run's steps are
        ``first_step`` on (``times``: their a0, a1, g0, g1, comm, d1, e, one value per step), emitting
        request ``slot_req[j]`` made one row at each step ``first[j]..last[j]`` (steps of the run;
        its row at ``first[j]`` carries a prefill's first token where ``first_prefill[j]``),
        received at ``R`` (the rows request by request, each's in step order: ``row_req`` and
        ``row_step`` say whose and which step each is); ``prefill_rows``: (step of the run, request)
        of chunks that did not complete their prompt.

        Each request's first row of the run, and the prefill chunks, are folded as any rows are.
        Its later rows each follow its own row of the step before, in the same run: their windows'
        cut points are the steps' (the previous step's GPU end, copy end and detokenization end, cut
        at this step's start), so every category but the stream's part and the queue's before the
        step is the step's alone and its total over a request's rows is a difference of the steps'
        running sums; the rest is per row. The same partition as :meth:`_fold` (totals summed in
        another order: equal to rounding)."""
        if self.rows is not None:  # every row is kept: the run's rows go there, as any others
            self._keep_run(first_step, times, first, last, first_prefill, prefill_rows, R, row_req, row_step)
            return
        if self.buffer.size:
            self.flush()  # rows made before the run come first
        counts = last - first + 1
        starts = np.cumsum(counts) - counts             # each request's first row
        self.size += len(R) + len(prefill_rows)
        self._fold_run_heads(first_step, times, slot_req, first, first_prefill, prefill_rows, R[starts])
        n_rows = len(R)
        more = counts > 1
        if not more.any():
            self._retire_now()
            return
        t = self.table
        g1, d1 = times["g1"], times["d1"]
        # each step after the run's first, following a row of the step before it: the one attribution's
        # cuts (``observe.attribution``), the same for every request in the step but for its receipt
        pd1 = d1[:-1]
        pi = pd1 if times["i"] is d1 else times["i"][:-1]  # a milestone that is the copy's end stays it
        c = attribution.cut(g1[:-1], pd1, pi, times["o"][:-1], times["e"][:-1],
                            *(times[k][1:] for k in attribution.STEP_TIMES))
        per_step = attribution.step_parts(c)
        compute = per_step.pop("compute")
        per_step["decode"] = compute  # a run's later rows are decodes
        # the later rows: request by request, each's steps first+1..last (index i = step - 1 into the
        # arrays above); each's first row is computed along and left out of the sums (zeroed)
        i = row_step - 1
        r_prev = np.empty(n_rows)
        r_prev[1:] = R[:-1]
        r_prev[0] = R[0]
        ci = c.take(i)
        bx, b3 = attribution.receipt(None if times["x"] is times["e"] else times["x"][i], r_prev, ci)
        lower = np.repeat(_unset_as_inf(t.first_R[slot_req]), counts)
        per_row = np.empty((3 + len(LLM_LAST_MILE), n_rows))
        per_row[0], per_row[1], per_row[2] = attribution.receipt_parts(bx, b3, ci)  # ipc, stream, queue
        per_row[3:] = attribution.after_parts(ci, bx, b3, lower)
        per_row[:, starts] = 0.0
        sums = np.add.reduceat(per_row, starts, axis=1)[:, more]
        groups = np.flatnonzero(more)
        reqs = slot_req[groups]
        for cat, total in zip(("ipc", "stream", "queue"), sums[:3]):
            self.full[cat][reqs] += total
        for cat, total in zip(LLM_LAST_MILE, sums[3:]):
            self.after[cat][reqs] += total
        lo, hi = first[groups], last[groups]  # the steps lo+1..hi: running sums hi - lo
        for cat, length in per_step.items():
            run_sum = np.concatenate(([0.0], np.cumsum(length)))
            self.full[cat][reqs] += run_sum[hi] - run_sum[lo]
        # each request's last row becomes its previous row; its gaps at the client
        end_rows = starts[groups] + counts[groups] - 1
        self.prev_g1[reqs] = g1[hi]
        for m in attribution.PREV[:-1]:
            self.prev[m][reqs] = times[m][hi]
        self.prev["R"][reqs] = self.prev_sent[reqs] = R[end_rows]
        self.last_step[reqs] = first_step + hi
        later = np.ones(n_rows, dtype=bool)
        later[starts] = False
        self.gaps.extend(n_rows - len(starts), gap=(R - r_prev)[later], req=row_req[later])
        if self.gaps.size > (EXACT_GAPS if self.sketch is None else SKETCH_GAPS):
            self._spill()
        self._retire_now()

    def _fold_run_heads(self, first_step, times, slot_req, first, first_prefill, prefill_rows, first_R) -> None:
        """A run's rows folded as any rows (:meth:`_fold`), request by request in step order: each
        request's first row of the run (after its previous row, wherever that was; ``first_R``: its
        receipt) and the prefill chunks that did not complete their prompt."""
        req, step, prefill = slot_req, first, first_prefill
        kind = np.full(len(slot_req), SENT, dtype=np.int8)
        marks = {m: times[m][first] for m in ROW_MARKS[:-1]}
        marks["R"] = first_R
        if prefill_rows:
            ps, pr = (np.asarray(c, dtype=np.int64) for c in zip(*prefill_rows))
            g1p = times["g1"][ps]
            req, step = np.concatenate([req, pr]), np.concatenate([step, ps])
            prefill = np.concatenate([prefill, np.ones(len(pr), dtype=bool)])
            kind = np.concatenate([kind, np.full(len(pr), PREFILL_ONLY, dtype=np.int8)])
            o = np.lexsort((step, req))
            req, step, prefill, kind = req[o], step[o], prefill[o], kind[o]
            marks = {m: np.concatenate([v, g1p])[o] for m, v in marks.items()}
        if len(req):
            self._fold(req, first_step + step, prefill, kind, marks, (kind == SENT).astype(np.int64))

    def _keep_run(self, first_step, times, first, last, first_prefill, prefill_rows, R, row_req, row_step) -> None:
        """A run's rows as :meth:`extend` takes them (a ledger that keeps every row)."""
        self.add_run(first_step, times, first, last, first_prefill, prefill_rows, R, row_req, row_step)

    def add_run(self, first_step, times, first, last, first_prefill, prefill_rows, R, row_req, row_step,
                kind=SENT, tokens=1, marks=None) -> None:
        """A closed-form decode run's rows (as :meth:`fold_run` describes them) taken as any rows are,
        by :meth:`extend`: where some are not streamed chunks (``kind``: each row's, BUFFERED for a token
        a stream interval holds back; ``tokens``: the tokens each row's chunk carries), where rows of
        one step have milestones of their own (``marks``: each row's, by name, where they are not its
        step's: its output at its API server, or, with several API servers, when its server received,
        detokenized and built it), or where every row is kept."""
        if prefill_rows:
            ps, pr = (np.asarray(c, dtype=np.int64) for c in zip(*prefill_rows))
            g1p = times["g1"][ps]
            self.extend(len(pr), req=pr, step=first_step + ps, prefill=1, kind=PREFILL_ONLY,
                        **dict.fromkeys(ROW_MARKS, g1p), tokens=0)
        counts = last - first + 1
        prefill = np.zeros(len(R), dtype=np.int8)
        prefill[(np.cumsum(counts) - counts)[first_prefill]] = 1  # a prefill's first token: its request's first row
        own = marks or {}
        marks = {m: own[m] if m in own else times[m][row_step] for m in ROW_MARKS[:-1]}
        self.extend(len(R), req=row_req, step=first_step + row_step, prefill=prefill, kind=kind, **marks, R=R,
                    tokens=tokens)

    def _retire_now(self) -> None:
        """Retire the done requests once as many rows as a buffer's fold were folded since the last
        time (as often as :meth:`flush` does: each look at the table costs a pass over the requests
        in flight)."""
        if self.size - self._retire_size >= FOLD_ROWS:
            self._retire_size = self.size
            self._retire_done()

    def _steps_leaving(self, steps) -> bool:
        """Whether the buffered rows' oldest step is about to leave a ring of steps: fold with half
        the ring of margin, more than any batch of steps recorded at once (a decode run of at most
        256)."""
        if not isinstance(self.steps, RingColumns):
            return False
        low = int(steps) if isinstance(steps, (int, np.integer)) else int(np.min(steps))  # a step's rows: its index
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
        # a slice of whole requests at a time: the same totals and gaps, a quarter of the temporaries
        cuts = np.searchsorted(req, req[np.arange(FOLD_SLICE, len(req), FOLD_SLICE)], side="left")
        for lo, hi in zip(np.r_[0, cuts].tolist(), np.r_[cuts, len(req)].tolist()):
            if hi > lo:
                o = order[lo:hi]
                self._fold(req[lo:hi], b["step"][o].astype(np.int64), b["prefill"][o].astype(bool), b["kind"][o],
                           {m: b[m][o] for m in ROW_MARKS}, b["tokens"][o])
        b.size = 0
        self._first_step = None
        if self.gaps.size > (EXACT_GAPS if self.sketch is None else SKETCH_GAPS):
            self._spill()
        self._retire_done()

    def _spill(self) -> None:
        """Move the gaps of requests that are done (finished, last token received) into the sketch,
        a slice at a time; the gaps of requests still running stay exact until they are done. The
        first time, the exact store is replaced by one sized for the running requests' gaps."""
        t = self.table
        req = self.gaps["req"]
        done = req < self.retired
        live = ~done
        live_req = req[live]
        done[live] = complete(t, live_req) & np.isfinite(t.last_R[live_req])
        del live
        first = self.sketch is None
        if first:
            self.sketch = QuantileSketch()
        gap = self.gaps["gap"]
        for lo in range(0, len(gap), FOLD_ROWS):
            hi = lo + FOLD_ROWS
            self.sketch.add(gap[lo:hi][done[lo:hi]])
        keep = ~done
        if first:  # the exact store, sized for every gap: replace it
            small = Columns({"gap": "f8", "req": "i4"}, max(SKETCH_GAPS, 2 * int(keep.sum())))
            small.extend(int(keep.sum()), gap=gap[keep], req=req[keep])
            self.gaps = small
        else:
            self.gaps.keep(keep)

    # -- requests retire as they are done --------------------------------------------------------

    def _retire_done(self) -> None:
        """Retire the requests done so far, in id order, ``RETIRE_LAG`` steps per replica after they
        were seen done (a done request may still sit in a step launched before it finished: async
        overlap, multi-step; every such step is processed long before that many more are made)."""
        t, w = self.table, self.table.window
        lo, hi = self.retired, w.prepared
        if hi > lo:
            self._replicas = max(self._replicas, int(t.replica[lo:hi].max()) + 1)
            whole = complete(t, slice(lo, hi))
            first_open = lo + (int(np.argmin(whole)) if not whole.all() else hi - lo)
            if not self._marks or first_open > self._marks[-1][1]:
                self._marks.append((self.steps.size, first_open))
        upto = None
        while self._marks and self._marks[0][0] <= self.steps.size - RETIRE_LAG * self._replicas:
            upto = self._marks.popleft()[1]
        if upto is not None and upto > self.retired:
            self._retire(self.retired, upto)

    def _retire(self, lo: int, hi: int, full: dict | None = None, first=None, last=None) -> None:
        """Append requests ``lo..hi`` to the store and release their memory. Their category totals
        get what only their end tells (time before the engine: queue to tokenization, tokenization;
        the last mile after their final row) if they are done; ``full``/``first``/``last``: totals
        and steps found by a walk over kept rows instead."""
        t = self.table
        w = t.window
        w.prepare(hi)
        s = slice(lo, hi)
        finished = complete(t, s)
        last_R, first_R = t.last_R[s].copy(), t.first_R[s].copy()
        done = finished & np.isfinite(last_R)
        out = {"api": t.api[s], "replica": t.replica[s], "tok_start": t.tok_start[s], "tok_end": t.tok_end[s],
               "first_R": first_R, "last_R": last_R, "preemptions": t.preemptions[s], "finished": finished}
        if full is not None:
            out.update({f"cat_{c}": full[c][s] for c in LLM_CATEGORIES})
            out.update({f"after_{c}": 0.0 for c in LLM_LAST_MILE})
            out.update({f"after_end_{c}": 0.0 for c in LLM_LAST_MILE})
            out.update(seen=done, zeros=0, first_step=first[s], last_step=last[s])
        else:
            seen = self.seen[s].copy()
            ids = done & seen
            cat = {c: self.full[c][s].copy() for c in LLM_CATEGORIES}
            end = {c: np.zeros(hi - lo) for c in LLM_LAST_MILE}
            lower = np.nan_to_num(first_R[ids], nan=np.inf)

            def add(c, start, stop):
                cat[c][ids] += np.maximum(stop - start, 0.0)
                if c in end:
                    end[c][ids] = np.maximum(stop - np.maximum(start, lower), 0.0)

            tok_start, tok_end = t.tok_start[s][ids], t.tok_end[s][ids]
            add("queue", t.arrival.values[s][ids], tok_start)
            add("schedule", tok_start, tok_end)
            marks = (self.prev[m][s][ids] for m in attribution.PREV)
            for c, (length, after) in zip(LLM_LAST_MILE, attribution.tail_parts(self.prev_g1[s][ids], *marks, lower)):
                cat[c][ids] += length
                end[c][ids] = after
            out.update({f"cat_{c}": v for c, v in cat.items()})
            out.update({f"after_{c}": self.after[c][s] for c in LLM_LAST_MILE})
            out.update({f"after_end_{c}": v for c, v in end.items()})
            out.update(seen=seen, zeros=self.zeros[s], first_step=self.first_step[s], last_step=self.last_step[s])
        self.store.append(hi - lo, **out)
        self.retired = hi
        w.release(hi)

    def _fold(self, req, step, prefill, kind, marks: dict, tokens) -> None:
        """Add rows (sorted by request, each request's in order; ``marks``: their milestones, the
        ``ROW_MARKS``) to their requests' totals: every request's per-row values are summed by one
        ``reduceat`` over the requests' groups."""
        t = self.table
        a0, a1, s0, g0, g1, comm, d1, *waits = self.steps.gather(
            step, ("a0", "a1", "s0", "g0", "g1", "comm", "d1") + attribution.WAIT_COLUMNS)
        only = kind == PREFILL_ONLY
        if only.any():  # a prefill-only row is made when its GPU work ends
            d1[only] = g1[only]
        n = len(req)
        starts, last = _groups(req)
        rf = req[starts]                            # each group's request
        seen = self.seen[rf]
        start = np.where(seen, self.prev_g1[rf], t.tok_end[rf])  # the window after the previous row

        def after_previous(values, before):
            """Each row's previous row's value: the request's previous row, or ``before`` at a group's first."""
            out = np.empty(n)
            out[1:] = values[:-1]
            out[starts] = before
            return out

        # the row's window [ws, g1], cut by the one attribution (``observe.attribution``) at the
        # previous row's milestones
        ws = after_previous(g1, start)
        now = dict(marks, d1=d1)
        prev = {m: after_previous(now[m], np.where(seen, self.prev[m][rf], start)) for m in attribution.PREV}
        lower = np.repeat(_unset_as_inf(t.first_R[rf]), np.diff(np.append(starts, n)))
        c = attribution.cut(ws, prev["d1"], prev["i"], prev["o"], prev["e"], a0, a1, s0, g0, g1, comm, *waits)
        bx, b3 = attribution.receipt(prev["x"], prev["R"], c)
        parts = attribution.step_parts(c)
        ipc, stream, queue = attribution.receipt_parts(bx, b3, c)
        parts["ipc"], parts["stream"], parts["queue"] = parts["ipc"] + ipc, parts["stream"] + stream, parts["queue"] + queue
        compute = parts.pop("compute")
        parts["prefill"], parts["decode"] = compute * prefill, compute * ~prefill
        # per row: the categories' lengths, then the last mile's parts after the first token
        names = list(parts)
        rows = np.empty((len(names) + len(LLM_LAST_MILE), n))
        for r, name in enumerate(names):
            rows[r] = parts[name]
        rows[len(names):] = attribution.after_parts(c, bx, b3, lower)
        sums = np.add.reduceat(rows, starts, axis=1)
        for cat, total in zip(names, sums):
            self.full[cat][rf] += total
        for cat, total in zip(LLM_LAST_MILE, sums[len(names):]):
            self.after[cat][rf] += total
        # each request's last row here becomes its previous row
        r_last = req[last]
        self.prev_g1[r_last] = g1[last]
        for m in attribution.PREV:
            self.prev[m][r_last] = now[m][last]
        self.first_step[rf] = np.minimum(self.first_step[rf], step[starts])
        self.seen[r_last] = True
        self.last_step[r_last] = step[last]
        self._add_gaps(req, kind, marks["R"], tokens, starts, last)

    def _add_gaps(self, req, kind, R, tokens, starts, last) -> None:
        """The inter-token gaps of the rows the client received (``_fold``'s rows, grouped by request
        at ``starts``/``last``): each to the previous such row of its request."""
        sent = kind == SENT
        if sent.all():  # the common case: the gaps are over the same groups
            rs, Rs, ks, s_starts, s_last = req, R, tokens, starts, last
        elif sent.any():
            rs, Rs, ks = req[sent], R[sent], tokens[sent]
            s_starts, s_last = _groups(rs)
        else:
            return
        before = np.empty(len(rs))
        before[1:] = Rs[:-1]
        before[s_starts] = self.prev_sent[rs[s_starts]]
        has = ~np.isnan(before)
        self.gaps.extend(int(has.sum()), gap=(Rs - before)[has], req=rs[has])
        extra = ks.astype(np.int64) - 1
        if extra.any():
            self.zeros[rs[s_starts]] += np.add.reduceat(extra, s_starts)
        self.prev_sent[rs[s_last]] = Rs[s_last]

    # -- the end of the run -------------------------------------------------------------------

    def finish(self, full: dict | None = None, first=None, last=None) -> RequestStore:
        """Every request in the store, in id order: the rows folded so far, then the rest retired a
        chunk at a time (``full``/``first``/``last``: from a walk over kept rows)."""
        self.flush()
        n = self.table.n
        while self.retired < n:
            self._retire(self.retired, min(n, (self.retired // CHUNK + 1) * CHUNK), full, first, last)
        self.store.close()
        return self.store

    def itl(self, done: np.ndarray):
        """Every done request's inter-token gaps at the client, one per received chunk after its
        first (in the order they were made), and the further tokens of its chunks
        (``llm_metrics.ITL``); for a run whose gaps outgrew the exact store, their sketch.
        ``done``: one flag per request (after :meth:`finish`); called once, at the end."""
        self.flush()
        keep = done[self.gaps["req"]]
        self.gaps.drop("req")  # the last read: its memory goes before the percentiles copy the gaps
        zeros = sum(int(self.store.column("zeros", lo, hi)[done[lo:hi]].sum())  # whole numbers: any order
                    for lo, hi in self.store.chunks())
        if self.sketch is not None:
            out = self.sketch.copy()
            out.add(self.gaps["gap"][keep])
            return ITL(out, zeros)
        if keep.all():
            return ITL(self.gaps["gap"], zeros)  # every gap is a done request's: the store itself, not a copy
        return ITL(self.gaps["gap"][keep], zeros)


def _groups(req) -> tuple:
    """Runs of equal request ids in ``req`` (sorted by request): each run's first index, and a mask
    of each run's last row."""
    first = np.empty(len(req), dtype=bool)
    first[0] = True
    np.not_equal(req[1:], req[:-1], out=first[1:])
    last = np.empty(len(req), dtype=bool)
    last[:-1] = first[1:]
    last[-1] = True
    return np.flatnonzero(first), last


def _unset_as_inf(first_R: np.ndarray) -> np.ndarray:
    """First receipts with the unset ones (NaN: no token received yet) as +inf: nothing is after them."""
    out = first_R.copy()
    out[np.isnan(out)] = np.inf
    return out
