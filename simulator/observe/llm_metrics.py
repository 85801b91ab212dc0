"""LLM run metrics at the client: TTFT, ITL, TPOT, E2E, throughput, goodput, and the latency breakdown.

Every completed request's E2E is partitioned into ``CATEGORIES``. The partition walks the
request's GPU steps: the interval between two consecutive step ends is covered by the new
step's own chain (schedule, wait, GPU compute and communication) and, before that chain
starts, by what remained of the previous token's last mile (D2H, messages, detokenize, output, stream).
Work that overlaps the request's own GPU compute is hidden and not counted; whatever is
not covered is queueing. The final token's last mile closes the request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..invariants import checking, require
from . import attribution, energy
from .perfetto import Counter, trace_events
from .records import BUFFERED, LLM_CATEGORIES, LLM_LAST_MILE, PREFILL_ONLY, SENT  # noqa: F401
from .columns import Columns
from .token_ledger import complete
from .stats import order_stats, stats as stats_of
from .result import Result
from .itl import ITL
from .sketch import QuantileSketch

if TYPE_CHECKING:  # pandas is imported where a frame is built, not to load the module
    import pandas as pd

CATEGORIES, LAST_MILE = LLM_CATEGORIES, LLM_LAST_MILE


class _Accumulator:
    """Per-request totals of each category, plus last-mile totals clipped to t >= lower[request].

    The clipped totals give the last-mile share of the inter-token time: the part of each
    request's timeline after its first token.
    """

    def __init__(self, n: int, lower: np.ndarray):
        self.n = n
        self.lower = lower
        self.full = {c: np.zeros(n) for c in CATEGORIES}
        self.after = {c: 0.0 for c in LAST_MILE}

    def add(self, cat: str, req: np.ndarray, *segments: tuple[np.ndarray, np.ndarray]) -> None:
        """Add the lengths of one or more (start, end) segment arrays, all belonging to ``req``."""
        total = None
        for start, end in segments:
            length = np.maximum(end - start, 0.0)
            total = length if total is None else total + length
            if cat in self.after:
                self.after[cat] += float(np.maximum(end - np.maximum(start, self.lower[req]), 0.0).sum())
        self.full[cat] += np.bincount(req, weights=total, minlength=self.n)

    def add_lengths(self, cat: str, req: np.ndarray, length: np.ndarray) -> None:
        """Add lengths already cut (their last-mile part after the first token is added apart)."""
        self.full[cat] += np.bincount(req, weights=length, minlength=self.n)


CHUNK_ROWS = 1 << 18


def _request_blocks(req: np.ndarray, n: int) -> list[tuple[int, int]]:
    """Ranges [lo, hi) of request ids holding about ``CHUNK_ROWS`` rows each (a request is never split)."""
    cum = np.cumsum(np.bincount(req, minlength=n))
    total = int(cum[-1]) if len(cum) else 0
    cuts = np.searchsorted(cum, np.arange(CHUNK_ROWS, total, CHUNK_ROWS), side="left") + 1
    edges = np.unique(np.r_[0, cuts, n])
    return list(zip(edges[:-1].tolist(), edges[1:].tolist()))


def _request_step_order(rows, keep: np.ndarray, n: int, n_steps: int):
    """The rows where ``keep`` holds, ordered by (request, step), as index arrays block by block of requests.

    Rows are recorded when their output is handled, not in step order. Sorting one block of requests
    at a time gives the same order as one stable sort of them all (a block holds whole requests, in
    order), without whole-record index and key arrays.
    """
    req, step = rows["req"], rows["step"]
    for lo, hi in _request_blocks(req, n):
        m = req >= lo
        m &= req < hi
        m &= keep
        idx = np.flatnonzero(m)
        del m
        key = req[idx].astype(np.int64)
        key *= n_steps + 1
        key += step[idx]
        yield idx[np.argsort(key, kind="stable")]


def breakdown(table, steps, rows, done: np.ndarray):
    """Per-request category totals over E2E and over the ITL window (after the first token).

    Rows are processed in request order, in chunks, so memory stays bounded on long traces.
    """
    n = table.n
    acc = _Accumulator(n, np.nan_to_num(table.first_R, nan=np.inf))
    ids = np.flatnonzero(done)
    acc.add("queue", ids, (table.arrival[ids], table.tok_start[ids]))
    acc.add("schedule", ids, (table.tok_start[ids], table.tok_end[ids]))

    req_all = rows["req"]
    keep = done[req_all]
    order = np.empty(int(np.count_nonzero(keep)), dtype=np.int32 if rows.size < 2**31 else np.int64)
    at = 0
    for block in _request_step_order(rows, keep, n, len(steps["g1"])):
        order[at: at + len(block)] = block
        at += len(block)
    del keep
    for lo in range(0, len(order), CHUNK_ROWS):
        hi = min(lo + CHUNK_ROWS, len(order))
        following = int(req_all[order[hi]]) if hi < len(order) else -1
        _breakdown_rows(acc, table, steps, rows, order[max(lo - 1, 0):hi], lo > 0, following)
    return acc


def _breakdown_rows(acc, table, steps, rows, idx, skip_first: bool, following: int) -> None:
    """Add the windows of rows ``idx`` (sorted by request, then step), cut by ``attribution``.

    With ``skip_first`` the first row only serves as the previous row of the second;
    ``following`` is the request of the row after this chunk (-1 at the end).
    """
    req = rows["req"][idx].astype(np.int64)
    step = rows["step"][idx]
    g1 = steps["g1"][step]
    marks = {m: rows[m][idx] for m in attribution.ROW_MARKS}
    marks["d1"] = np.where(rows["kind"][idx] == PREFILL_ONLY, g1, steps["d1"][step])
    first = np.r_[True, req[1:] != req[:-1]]
    last = np.r_[req[1:] != req[:-1], req[-1] != following]
    prev = np.maximum(np.arange(len(req)) - 1, 0)
    ws = np.where(first, table.tok_end[req], g1[prev])
    before = {m: np.where(first, ws, v[prev]) for m, v in marks.items()}
    del prev, first
    prefill = rows["prefill"][idx].astype(bool)
    if skip_first:
        s = slice(1, None)
        req, step, g1, last, prefill, ws = req[s], step[s], g1[s], last[s], prefill[s], ws[s]
        marks = {m: v[s] for m, v in marks.items()}
        before = {m: v[s] for m, v in before.items()}
    c = attribution.cut(ws, *(before[m] for m in ("d1", "i", "o", "e")),
                        *(steps[k][step] for k in ("a0", "a1", "s0", "g0")), g1,
                        *(steps[k][step] for k in ("comm",) + attribution.WAIT_COLUMNS))
    bx, b3 = attribution.receipt(before["x"], before["R"], c)
    parts = attribution.step_parts(c)
    ipc, stream, queue = attribution.receipt_parts(bx, b3, c)
    parts["ipc"], parts["stream"], parts["queue"] = parts["ipc"] + ipc, parts["stream"] + stream, parts["queue"] + queue
    compute = parts.pop("compute")
    parts["prefill"], parts["decode"] = compute * prefill, compute * ~prefill
    for cat, length in parts.items():
        acc.add_lengths(cat, req, length)
    lower = acc.lower[req]
    for cat, length in zip(LAST_MILE, attribution.after_parts(c, bx, b3, lower)):
        acc.after[cat] += float(length.sum())
    tail = attribution.tail_parts(g1[last], *(marks[m][last] for m in attribution.PREV), lower[last])
    for cat, (length, after) in zip(LAST_MILE, tail):
        acc.add_lengths(cat, req[last], length)
        acc.after[cat] += float(after.sum())


def itl_samples(rows, done: np.ndarray) -> ITL:
    """Inter-token gaps at the client: each chunk's gap to the previous chunk, in (request, step)
    order, built block by block of requests into one array; and the further tokens of the chunks."""
    req = rows["req"]
    keep = rows["kind"] == SENT
    keep &= done[req]
    n_sel = int(np.count_nonzero(keep))
    if not n_sel:
        return ITL(np.empty(0))
    zeros = int(rows["tokens"].sum(where=keep, dtype=np.int64)) - n_sel
    out = np.empty(n_sel)  # at most n_sel - 1 gaps
    at = 0
    R_all = rows["R"]
    for sel in _request_step_order(rows, keep, len(done), int(rows["step"].max(initial=0)) + 1):
        r, R = req[sel], R_all[sel]
        same = r[1:] == r[:-1]
        gaps = (R[1:] - R[:-1])[same]
        out[at: at + len(gaps)] = gaps
        at += len(gaps)
    return ITL(out[:at], zeros)


@dataclass(frozen=True)
class EngineStats:
    """What one engine reports when the run ends; the metrics read this, never the engine."""

    index: int
    gpu_tracks: tuple[str, ...]
    gpu_busy: float  # seconds its GPUs ran steps
    kv_peak: int  # most KV blocks in use at once
    kv_sum: float  # KV blocks in use x GPU seconds, for the occupancy averaged over GPU time
    kv_steps: Columns | None  # (step, blocks in use) per step, when spans are recorded
    gap_sum: float = 0.0  # GPU idle between consecutive steps while the engine had work, summed
    gap_steps: int = 0
    gap_max: float = 0.0
    steps_run: int = 0
    tokens_run: float = 0.0   # tokens its steps computed (prompt chunks, decodes, verified drafts)
    context_run: float = 0.0  # context tokens its decode steps read, summed over the steps
    work: tuple = (0.0, 0.0, 0.0, 1.0, 1.0)  # ``LLMCostModel.work_per_step_and_token``


@dataclass(frozen=True)
class ServingStats:
    """The engines' reports and the API servers' CPU tracks of one LLM run."""

    engines: tuple[EngineStats, ...]
    server_tracks: tuple[str, ...]
    cpu_activity: dict = field(default_factory=dict)  # CPU seconds per task label, every process


ACTIVITY = {"tokenize": "api_server", "stream": "api_server", "receive outputs": "api_server",
            "schedule+launch": "schedule", "receive request": "schedule",
            "detokenize": "output", "output": "output", "send outputs": "output", "detokenizer receive": "output"}
"""The activity each CPU task label belongs to, for the share of engine time: the API server's
work (parse, tokenize, receive, stream), scheduling and input preparation (and launches), and
output processing (detokenize, build and send the outputs), wherever each runs."""


def engine_time_share(stats: ServingStats) -> dict:
    """Shares of the engine's time by activity: GPU busy, schedule+input prep, output processing,
    API server (the split of vLLM's 2024-09-05 profile: 38% GPU, 29% scheduling, 33% API server).
    Activities that overlap (async modes, separate processes) each count in full."""
    totals = {"gpu": sum(e.gpu_busy for e in stats.engines), "schedule": 0.0, "output": 0.0, "api_server": 0.0}
    for label, seconds in stats.cpu_activity.items():
        totals[ACTIVITY.get(label, "output")] += seconds
    whole = sum(totals.values())
    return {k: (v / whole if whole > 0 else None) for k, v in totals.items()}


def step_gaps(stats: ServingStats) -> dict:
    """GPU idle between consecutive steps of an engine that had work: the host-path bubble."""
    n = sum(e.gap_steps for e in stats.engines)
    total = sum(e.gap_sum for e in stats.engines)
    return {"mean": total / n * 1e3 if n else None, "max": max((e.gap_max for e in stats.engines), default=0.0) * 1e3,
            "steps": n}


def _latencies(t, store, lo: int = 0, hi: int | None = None) -> tuple:
    """TTFT, TPOT and E2E (s) of requests ``lo..hi`` (NaN where undefined), with no temporaries
    beyond the three arrays (each as ``np.where(output > 1, (e2e - ttft) / (output - 1), nan)``)."""
    hi = t.n if hi is None else hi
    arrival, output = t.arrival.values[lo:hi], t.output[lo:hi]
    ttft = store.column("first_R", lo, hi)
    ttft -= arrival
    e2e = store.column("last_R", lo, hi)
    e2e -= arrival
    tpot = np.subtract(e2e, ttft)
    many = output > 1
    with np.errstate(invalid="ignore", divide="ignore"):
        np.divide(tpot, output - 1, out=tpot, where=many)
    tpot[~many] = np.nan
    return ttft, tpot, e2e


def category(t, store, name: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
    """Requests ``lo..hi``'s seconds in one breakdown category. A disaggregated request waits
    between its prefill and its first decode step while its KV crosses to the decode replica: that
    wait is the transfer (``kv_transfer``), not queueing."""
    out = store.column(f"cat_{name}", lo, hi)
    if t.kv_start is not None and name in ("kv_transfer", "queue"):
        hi = t.n if hi is None else hi
        kv = np.nan_to_num(t.kv_end[lo:hi] - t.kv_start[lo:hi])
        if name == "kv_transfer":
            out += kv
        else:
            out -= kv
    return out


def _request_frames(t, store, done: np.ndarray) -> tuple:
    """Builders of one row per request (times in seconds) and of the breakdown of each completed one,
    from the request store: the frames are made when first read (:class:`~simulator.observe.result.Result`),
    so a run that only prints its summary never imports pandas, and a run folder's CSVs are written
    from them a range of requests at a time (:class:`Chunked`)."""
    arrival, prompt, output = t.arrival.values, t.prompt, t.output

    def requests(lo=0, hi=None):
        import pandas as pd

        hi = t.n if hi is None else hi
        col = store.column
        ttft, tpot, e2e = _latencies(t, store, lo, hi)
        return pd.DataFrame({
            "arrival_s": arrival[lo:hi], "prompt_tokens": prompt[lo:hi], "output_tokens": output[lo:hi],
            "api_server": col("api", lo, hi), "replica": col("replica", lo, hi),
            "tokenized_s": col("tok_end", lo, hi), "first_token_s": col("first_R", lo, hi),
            "last_token_s": col("last_R", lo, hi), "ttft_s": ttft, "tpot_s": tpot,
            "e2e_s": e2e, "preemptions": col("preemptions", lo, hi), "completed": done[lo:hi],
        }, index=pd.RangeIndex(lo, hi, name="request"))

    def breakdown_frame(lo=0, hi=None):
        import pandas as pd

        hi = t.n if hi is None else hi
        mine = done[lo:hi]
        e2e = store.column("last_R", lo, hi)[mine] - arrival[lo:hi][mine]
        return pd.DataFrame({**{c: category(t, store, c, lo, hi)[mine] for c in CATEGORIES}, "e2e_s": e2e},
                            index=pd.Index(lo + np.flatnonzero(mine), name="request"))

    return Chunked(requests, t.n), Chunked(breakdown_frame, t.n)


class Chunked:
    """A per-request frame built when first called, or a range of requests at a time (``chunk``)."""

    def __init__(self, build, n: int):
        self.build, self.n = build, n

    def __call__(self):
        return self.build()

    def chunks(self, size: int = 1 << 16):
        for lo in range(0, max(self.n, 1), size):
            yield self.build(lo, min(lo + size, self.n))


def _utilization(recorder, stats: ServingStats, horizon: float) -> dict:
    for engine in stats.engines:
        for track in engine.gpu_tracks:
            recorder.add_busy(track, engine.gpu_busy)
    util = recorder.utilization(horizon)
    for track in stats.server_tracks:
        util.setdefault(track, 0.0)
    return util


def _kv_summary(stats: ServingStats, kv_blocks: int) -> dict:
    engines = stats.engines
    busy = max(sum(en.gpu_busy for en in engines), 1e-12)
    return {"blocks_per_replica": kv_blocks,
            "peak_occupancy": max(en.kv_peak for en in engines) / kv_blocks,
            "mean_occupancy": sum(en.kv_sum for en in engines) / busy / kv_blocks}


def _itl_summary(itl) -> tuple[dict, dict]:
    """(p50/p90/p95/p99/mean/std of the gaps in ms, their stalls: p99/p50 and how many exceed twice the
    median), from their sketch or from one partitioned copy of the gaps (millions at 10k requests)."""
    if isinstance(itl, QuantileSketch):
        if not itl.count:
            return (dict.fromkeys(("p50", "p90", "p95", "p99", "mean", "std")),
                    {"p99_over_p50": None, "gaps_over_2x_median": 0})
        p50, p90, p95, p99 = (itl.quantile(q) for q in (0.5, 0.9, 0.95, 0.99))
        return ({"p50": p50 * 1e3, "p90": p90 * 1e3, "p95": p95 * 1e3, "p99": p99 * 1e3,
                 "mean": itl.total / itl.count * 1e3, "std": None},
                {"p99_over_p50": float(p99 / p50) if p50 > 0 else None,
                 "gaps_over_2x_median": itl.count_above(2 * p50)})
    if not len(itl):
        return stats_of(itl, 1e3), {"p99_over_p50": None, "gaps_over_2x_median": 0}
    if np.isfinite(itl).all():  # every run's: one copy, one partition for the percentiles and the median
        mean, std = float(itl.mean() * 1e3), float(itl.std() * 1e3)
        p50, p90, p95, p99, median = order_stats(itl.copy(), (50, 90, 95, 99), median=True)
        ms = {"p50": p50 * 1e3, "p90": p90 * 1e3, "p95": p95 * 1e3, "p99": p99 * 1e3, "mean": mean, "std": std}
    else:  # the percentiles in ms are of the finite gaps, the stalls of them all
        ms = stats_of(itl, 1e3)
        p50, p99, median = order_stats(itl.copy(), (50, 99), median=True)
    return ms, {"p99_over_p50": float(p99 / p50) if p50 > 0 else None,
                "gaps_over_2x_median": int(np.count_nonzero(itl > 2 * median))}


def request_stages(workload, n: int) -> np.ndarray | None:
    """The load stage each of the first n requests arrived in; None without ``workload.stages``.

    Requests are numbered in arrival order and each stage sends ``Stage.requests`` of them
    (``workloads.arrivals.staged_times``), so stage k holds a contiguous block of ids."""
    if not workload.stages:
        return None
    counts = [s.requests for s in workload.stages]
    return np.repeat(np.arange(len(counts)), counts)[:n]


def stage_summaries(workload, arrival: np.ndarray, done: np.ndarray, good: np.ndarray, ttft, tpot, e2e) -> list[dict]:
    """One block per load stage (``workload.stages``), over the requests that ARRIVED in it.

    A request that arrived late in stage k and finished in stage k+1 counts in stage k: that is
    how inference-perf files its ``stage_N_lifecycle_metrics.json`` (by the stage that sent it)."""
    stage = request_stages(workload, len(arrival))
    out, start = [], 0.0
    for k, spec in enumerate(workload.stages):
        sent = stage == k
        ids = np.flatnonzero(sent & done)
        out.append({"rate": spec.rate, "start_s": start, "duration_s": spec.duration, "requests": int(sent.sum()),
                    "requests_completed": int(len(ids)),
                    "ttft_ms": stats_of(ttft[ids], 1e3), "tpot_ms": stats_of(tpot[ids], 1e3),
                    "e2e_ms": stats_of(e2e[ids], 1e3),
                    "slo_attainment": float(good[ids].sum()) / len(ids) if len(ids) else None})
        start += spec.duration
    return out


def _check_breakdown(t, store, done, e2e, total: dict, e2e_total: float) -> None:
    """BREAKDOWN_SUMS: the categories' totals sum to the requests' E2E (every run), and each request's
    to its own (debug runs); not where the times overflowed to infinity."""
    parts = sum(total.values())
    if not np.isfinite(e2e_total):  # absurd timings overflow: the summary reports them as undefined
        return
    require("BREAKDOWN_SUMS", abs(parts - e2e_total) <= 1e-6 * max(e2e_total, 1.0),
            lambda: f"the categories sum to {parts} s, the requests' E2E to {e2e_total} s")
    if checking() and done.any():
        each = sum(category(t, store, c)[done] for c in CATEGORIES)
        worst = float(np.max(np.abs(each - e2e[done])))
        require("BREAKDOWN_SUMS", worst <= 1e-6, lambda: f"a request's categories miss its E2E by {worst} s")


def _cost_energy(scenario, stats: ServingStats, wall: float, output_tokens: float, total_tokens: float,
                 requests: int) -> dict:
    """The run's ``cost`` and ``energy`` (``observe.energy``) from the engines' counts of their work."""
    engines = stats.engines
    gpus = sum(len(e.gpu_tracks) for e in engines)
    busy = sum(e.gpu_busy * len(e.gpu_tracks) for e in engines)
    flops = sum(e.tokens_run * e.work[1] for e in engines)
    hbm = sum(e.steps_run * e.work[0] + e.context_run * e.work[2] for e in engines)
    peak, bandwidth = (engines[0].work[3], engines[0].work[4]) if engines else (1.0, 1.0)
    return energy.blocks(scenario, gpus, wall, busy, flops, hbm, peak, bandwidth, output_tokens, total_tokens,
                         requests)


def build_result(scenario, table, steps, rows, recorder, stats: ServingStats, memory, kv_blocks,
                 horizon) -> Result:
    """Assemble the summary and the trace; the per-request frames are built from the request store
    when first read. Every request's results are read back from the store a column at a time, and
    the completed requests are picked by a mask (no index array): at a million requests each
    column is 8 MB."""
    t = table
    store, after, itl = _finished(t, steps, rows)
    # the table's columns are released: what is read of them after the run comes from the store
    t.finished, t.last_R, t.first_R = store.column("finished"), store.column("last_R"), store.column("first_R")
    done = t.finished & np.isfinite(t.last_R)
    n_done = int(np.count_nonzero(done))
    ttft, tpot, e2e = _latencies(t, store)
    window = np.subtract(t.last_R, store.column("first_R"))  # each request's time after its first token
    itl_sum = float(window[done].sum())
    del window
    total = {c: float(category(t, store, c)[done].sum()) for c in CATEGORIES}
    e2e_total = float(e2e[done].sum())
    _check_breakdown(t, store, done, e2e, total, e2e_total)
    slo = scenario.slo
    good = done & (ttft <= slo.ttft) & (np.nan_to_num(tpot, nan=0.0) <= slo.tpot)
    if slo.e2el is not None:
        good &= e2e <= slo.e2el
    arrival = t.arrival.values
    start, end = (float(np.nanmin(arrival[done])), float(np.nanmax(t.last_R[done]))) if n_done else (0.0, 0.0)
    span = max(end - start, 1e-12) if n_done else 1.0
    out_tokens = float(t.output[done].sum())
    itl_ms, itl_stalls = _itl_summary(itl.chunks)
    itl_per_token_ms, _ = _itl_summary(itl.per_token()) if itl.zeros else (itl_ms, None)
    summary = {
        "kind": "llm", "scenario": scenario.name, "requests_total": int(t.n), "requests_completed": n_done,
        "duration_s": end - start,
        "ttft_ms": stats_of(ttft[done], 1e3), "itl_ms": itl_ms, "tpot_ms": stats_of(tpot[done], 1e3),
        "e2e_ms": stats_of(e2e[done], 1e3), "itl_per_token_ms": itl_per_token_ms,
        "throughput": {"output_tokens_per_s": out_tokens / span, "requests_per_s": n_done / span,
                       "total_tokens_per_s": (out_tokens + float(t.prompt[done].sum())) / span},
        "tokens": {"input_total": int(t.prompt[done].sum()), "output_total": int(out_tokens)},
        "goodput": {"requests_per_s": float(good.sum()) / span,
                    "slo_attainment": float(good.sum()) / max(n_done, 1),
                    "slo": {"ttft_ms": slo.ttft * 1e3, "tpot_ms": slo.tpot * 1e3,
                            "e2el_ms": None if slo.e2el is None else slo.e2el * 1e3}},
        "breakdown_share": {c: (total[c] / e2e_total if e2e_total else 0.0) for c in CATEGORIES},
        "last_mile_share": sum(total[c] for c in LAST_MILE) / e2e_total if e2e_total else 0.0,
        "itl_last_mile_share": sum(after.values()) / itl_sum if itl_sum else 0.0,
        "itl_stalls": itl_stalls,
        "utilization": _utilization(recorder, stats, horizon),
        "engine_time_share": engine_time_share(stats),
        "step_gap_ms": step_gaps(stats),
        "kv_cache": _kv_summary(stats, kv_blocks),
        "memory_per_gpu_gib": memory, "steps": int(steps.size),
        "preemptions": int(store.column("preemptions").sum()),
        **_cost_energy(scenario, stats, span if n_done else 0.0, out_tokens, out_tokens + float(t.prompt[done].sum()),
                       n_done),
    }
    itl = itl.chunks
    if isinstance(itl, QuantileSketch):  # too many gaps to keep: their percentiles come from a sketch
        summary["itl_quantile_error"] = itl.rel_error
        itl = None
    if scenario.workload.stages:
        summary["stages"] = stage_summaries(scenario.workload, arrival, done, good, ttft, tpot, e2e)
    del good, ttft, tpot, e2e
    requests, bd = _request_frames(t, store, done)
    if recorder.enabled:
        spans = recorder.frame  # the trace reads them back a track at a time
        # made when the trace is written: a run without a run folder never needs them (nor pandas)
        trace = trace_events(recorder, lambda: engine_counters(stats, steps, kv_blocks),
                             lambda: request_flows(stats, store, steps, done))
    else:
        spans, trace = recorder.frame, []
    return Result("llm", scenario, summary, requests, bd, spans, trace, itl=itl)


def engine_counters(stats: ServingStats, steps, kv_blocks: int) -> list[Counter]:
    """Batch size and KV-cache occupancy of each engine, step by step (0 while its GPU idles)."""
    out = []
    for engine in stats.engines:
        rec = engine.kv_steps
        if rec is None or not rec.size:
            continue
        idx = rec["step"]
        g0, g1 = steps["g0"][idx], steps["g1"][idx]
        gap = np.r_[g0[1:] > g1[:-1], True]  # the GPU idles after this step
        times = np.concatenate([g0, g1[gap]])
        order = np.argsort(times, kind="stable")
        batch = np.concatenate([steps["batch"][idx], np.zeros(int(gap.sum()))])[order]
        kv = rec["kv"] / max(kv_blocks, 1)
        kv_t = np.concatenate([g0, g1[gap]])
        kv_v = np.concatenate([kv, kv[gap]])  # occupancy holds while idle
        track = engine.gpu_tracks[0]
        out.append(Counter(f"replica{engine.index} batch size", track, times[order], batch))
        out.append(Counter(f"replica{engine.index} KV-cache occupancy", track, kv_t[order], kv_v[order]))
    return out


def _finished(t, steps, ledger):
    """(the request store with every request, the last-mile totals after each done request's first
    token, the ITL gaps) from the run's token ledger: its folded totals, or a walk over its rows where
    it had to keep them."""
    rows = ledger.rows
    if rows is not None:
        t.window.prepare(t.n)  # nothing was retired: the whole table is still in memory
        n = t.n
        done = complete(t, slice(None)) & np.isfinite(t.last_R)
        first = np.full(n, np.iinfo(np.int64).max)
        last = np.full(n, -1)
        if rows.size:
            np.minimum.at(first, rows["req"], rows["step"])
            np.maximum.at(last, rows["req"], rows["step"])
        acc = breakdown(t, steps, rows, done)
        itl = itl_samples(rows, done)
        store = ledger.finish(acc.full, first, last)
        return store, acc.after, itl
    store = ledger.finish()
    done = np.isfinite(store.column("last_R"))
    done &= store.column("finished")
    ids = done & store.column("seen")
    after = {}
    for c in LAST_MILE:
        after[c] = float(store.column(f"after_{c}")[ids].sum())
        after[c] += float(store.column(f"after_end_{c}")[ids].sum())
    return store, after, ledger.itl(done)


def request_flows(stats: ServingStats, store, steps, done: np.ndarray) -> pd.DataFrame:
    """Each completed request's path: its tokenization on the API server, its first GPU step and
    its last GPU step (on its replica's first GPU track)."""
    ids = np.flatnonzero(done)
    first, last = store.column("first_step")[ids], store.column("last_step")[ids]
    keep = last >= 0
    ids, first, last = ids[keep], first[keep], last[keep]
    import pandas as pd

    if not len(ids):
        return pd.DataFrame(columns=["flow", "track", "time"])
    mid = (steps["g0"] + steps["g1"]) / 2
    api = np.array(stats.server_tracks, dtype=object)[store.column("api")[ids]]
    gpu = np.array([e.gpu_tracks[0] for e in stats.engines], dtype=object)[store.column("replica")[ids]]
    tok = (store.column("tok_start")[ids] + store.column("tok_end")[ids]) / 2
    frame = pd.DataFrame({"flow": np.tile(ids, 3), "order": np.repeat([0, 1, 2], len(ids)),
                          "track": np.concatenate([api, gpu, gpu]),
                          "time": np.concatenate([tok, mid[first], mid[last]])})
    frame = frame.sort_values(["flow", "order"], kind="stable").drop_duplicates(["flow", "track", "time"])
    return frame[["flow", "track", "time"]].reset_index(drop=True)
