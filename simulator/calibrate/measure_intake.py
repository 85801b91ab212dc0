"""Where a request's first token waits in the real vLLM server: ``measure-engine vllm --trace-intake``.

The engine's processes log perf_counter timestamps and CPU clocks at the intake points
(``engine_stubs/vllm_intake_trace.py``); the client's result file holds each request's start (the
same CLOCK_MONOTONIC) and TTFT; the stub's step log holds each step's launch and end (wall clock,
moved onto perf_counter by the offset the command took). From them, per point: the thread CPU of each
intake operation (tokenization, ``add_request``, the engine core's pick-up, a scheduler pass), and at
concurrency 1, where requests run one after another, the chain a first token waits on, piece by piece.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

OPS = {"tok": "intake_tokenize_cpu_ms", "add": "intake_add_request_cpu_ms", "cpre": "intake_core_preprocess_cpu_ms",
       "cadd": "intake_core_add_cpu_ms", "sch": "schedule_cpu_ms"}
"""Traced operation -> the column of its median thread CPU (ms) per call."""

CHAIN = ("intake_client_to_http_ms", "intake_http_to_added_ms", "intake_api_cpu_ms", "intake_added_to_launch_ms",
         "prefill_step_ms", "first_token_out_ms")
"""Concurrency 1: client start -> HTTP message parsed -> ``AsyncLLM.add_request`` returned (and the API process's
CPU over that stretch) -> the prefill step's launch -> its end -> the first token at the client (medians, ms)."""

COLUMNS = tuple(OPS.values()) + CHAIN
WARMUP = 5
"""Requests left out at the start of a concurrency-1 point (the first ones run on cold code paths)."""


def read_trace(folder: str | Path) -> pd.DataFrame:
    """Every process's trace rows: event, t (perf_counter s), thread, thread CPU s, process CPU s, pid."""
    parts = [pd.read_csv(f, names=["ev", "t", "th", "tc", "pc"]).assign(pid=f.stem.split("_")[-1])
             for f in sorted(Path(folder).glob("trace_*.csv"))]
    if not parts:
        return pd.DataFrame(columns=["ev", "t", "th", "tc", "pc", "pid"])
    return pd.concat(parts, ignore_index=True).sort_values("t", kind="stable").reset_index(drop=True)


def op_cpu_ms(trace: pd.DataFrame, tag: str) -> float:
    """Median thread CPU (ms) of operation ``tag``: each ``tag_b`` paired with the next ``tag_e`` of its thread;
    calls that overlap on one thread (coroutines suspended inside) are left out, since their CPU interleaves."""
    spent = []
    rows = trace[trace.ev.isin((tag + "_b", tag + "_e"))]
    for _, one in rows.groupby(["pid", "th"], sort=False):
        begun, overlapped = None, False
        for ev, tc in zip(one.ev, one.tc):
            if ev.endswith("_b"):
                overlapped, begun = begun is not None, tc
            elif begun is not None:
                if not overlapped:
                    spent.append(tc - begun)
                begun, overlapped = None, False
    return float(np.median(spent) * 1e3) if spent else float("nan")


def _after(times: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The first of the sorted ``times`` at or after each of ``at`` (NaN where none)."""
    j = np.searchsorted(times, at)
    out = np.full(len(at), np.nan)
    ok = j < len(times)
    out[ok] = times[j[ok]]
    return out


def chain_ms(trace: pd.DataFrame, starts: np.ndarray, ttfts: np.ndarray, launches: np.ndarray,
             ends: np.ndarray) -> dict:
    """Concurrency 1: the medians of :data:`CHAIN` over requests started at ``starts`` (perf_counter s) with
    first-token times ``ttfts`` (s), against the prefill steps launched at ``launches`` and ending at ``ends``."""
    order = np.argsort(starts)[WARMUP:]
    s, ttft = starts[order], ttfts[order]
    http = trace[trace.ev == "http_b"]
    added = trace[trace.ev == "add_e"]
    j_http, j_add = np.searchsorted(http.t.values, s), np.searchsorted(added.t.values, s)
    ok = (j_http < len(http)) & (j_add < len(added))
    s, ttft, j_http, j_add = s[ok], ttft[ok], j_http[ok], j_add[ok]
    t_http, t_add = http.t.values[j_http], added.t.values[j_add]
    cpu = added.pc.values[j_add] - http.pc.values[j_http]
    k = np.searchsorted(launches, s)
    ok = k < len(launches)
    launch, end = np.full(len(s), np.nan), np.full(len(s), np.nan)
    launch[ok], end[ok] = launches[k[ok]], ends[k[ok]]
    pieces = (t_http - s, t_add - t_http, cpu, launch - t_add, end - launch, s + ttft - end)
    return {name: round(float(np.nanmedian(v)) * 1e3, 4) for name, v in zip(CHAIN, pieces)}


def intake_columns(folder: str | Path, result: str | Path, steplog: str | Path, offset: float,
                   concurrency: int) -> dict:
    """A point's intake columns (:data:`COLUMNS`); ``offset``: time.time() - time.perf_counter() on this machine."""
    trace = read_trace(folder)
    row = {column: round(op_cpu_ms(trace, tag), 4) for tag, column in OPS.items()}
    if concurrency != 1:
        return row
    with open(result) as f:
        res = json.load(f)
    steps = pd.read_csv(steplog)
    prefill = steps[steps.prefill_tokens > 0]
    row.update(chain_ms(trace, np.asarray(res["start_times"], float), np.asarray(res["ttfts"], float),
                        prefill.launch.values - offset, prefill.end.values - offset))
    return row
