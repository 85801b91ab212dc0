"""Reading request traces (CSV: arrived_at, num_prefill_tokens, num_decode_tokens) and checking them
against the scenario that replays them, at load time, so a bad row is a one-line error before any run."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import ConfigError
from .models import MAX_CONTEXT

COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
KEY = "workload.trace"
MAX_TRACE_SECONDS = 1e8
"""Latest arrival a trace may hold, scaled: the simulated horizon's bound (``max_sim_time``)."""


def _fail(p: Path, row: int | None, what: str) -> ConfigError:
    where = f" row {row + 2}" if row is not None else ""  # +2: the header line, and rows count from 1
    return ConfigError(f"trace {p.name}{where}: {what}", path=KEY)


def _first(mask: np.ndarray) -> int | None:
    bad = np.flatnonzero(mask)
    return int(bad[0]) if bad.size else None


def _read_csv(p: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(p, encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(p, None, f"is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError, OSError) as exc:
        raise _fail(p, None, f"is not a readable CSV ({' '.join(str(exc).split())[:120]})") from None


@lru_cache(maxsize=4)
def _read_checked(path: str, mtime_ns: int, size: int) -> pd.DataFrame:
    """Every row of the file checked, so a corrupt trace is an error even in rows a short run leaves unread."""
    p = Path(path)
    df = _read_csv(p)
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise _fail(p, None, f"lacks column(s) {', '.join(missing)}; expected {', '.join(COLUMNS)}")
    if df.empty:
        raise _fail(p, None, "has no rows")
    out = pd.DataFrame()
    for col in COLUMNS:
        values = pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
        row = _first(~np.isfinite(values))
        if row is not None:
            what = "is not a number" if np.isnan(values[row]) else "is not finite"
            raise _fail(p, row, f"{col} = {str(df[col].iloc[row])[:40]!r} {what}")
        out[col] = values
    for col in COLUMNS[1:]:
        values = out[col].to_numpy()
        row = _first(values != np.floor(values))
        if row is not None:
            raise _fail(p, row, f"{col} must be a whole number of tokens, got {values[row]:g}")
        row = _first((values < 1) | (values > MAX_CONTEXT))
        if row is not None:
            raise _fail(p, row, f"{col} must be between 1 and {MAX_CONTEXT:,} tokens, got {values[row]:g}")
    arrivals = out["arrived_at"].to_numpy()
    row = _first(np.r_[arrivals[:1] < 0, np.diff(arrivals) < 0])
    if row is not None:
        raise _fail(p, row, "arrived_at must be non-negative and non-decreasing")
    row = _first(arrivals > MAX_TRACE_SECONDS)
    if row is not None:
        raise _fail(p, row, f"arrived_at must be at most {MAX_TRACE_SECONDS:g} s (about 3 years), "
                            f"got {arrivals[row]:g}")
    out["num_prefill_tokens"] = out["num_prefill_tokens"].astype(np.int64)
    out["num_decode_tokens"] = out["num_decode_tokens"].astype(np.int64)
    return out


def read_trace(path: str | Path, *, limit: int | None = None) -> pd.DataFrame:
    """Load and check a trace (cached per file version); any problem is a ConfigError naming the file and row.

    ``limit``: only the first rows are returned (all rows are checked)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"trace file {str(p)!r} does not exist", path=KEY)
    st = p.stat()
    return _read_checked(str(p.resolve()), st.st_mtime_ns, st.st_size).iloc[:limit].copy()


def repeat_period(arrived_at: np.ndarray) -> float:
    """Time (trace units) between a repetition's first arrival and the next repetition's: the trace's span
    plus its mean inter-arrival gap (``span x rows / (rows - 1)``; 0 for a one-row trace)."""
    rows = len(arrived_at)
    if rows < 2:
        return 0.0
    span = float(arrived_at[-1] - arrived_at[0])
    return span + span / (rows - 1)


def repeated_rows(rows: int, n: int) -> np.ndarray:
    """Row of each of n requests replayed from a ``rows``-row trace: request i is row i mod rows."""
    return np.arange(n, dtype=np.int64) % rows


def repeated_arrivals(arrived_at: np.ndarray, n: int) -> np.ndarray:
    """Arrival times (trace units, the first at 0) of n requests replayed from a trace: request i is row
    i mod rows of repetition k = i // rows, at ``arrived_at[i mod rows] - arrived_at[0] + k x period``
    (:func:`repeat_period`), so times keep increasing from one repetition to the next."""
    rows = len(arrived_at)
    i = np.arange(n, dtype=np.int64)
    base = np.asarray(arrived_at, dtype=float) - float(arrived_at[0])
    return base[i % rows] + (i // rows) * repeat_period(arrived_at)


def check_trace(scenario) -> None:
    """Reject a trace that cannot serve the scenario: too few rows, or requests beyond the model's context."""
    w = scenario.workload
    if not w.trace:
        return
    df = read_trace(w.trace)
    name = Path(w.trace).name
    repeat = getattr(w, "trace_repeat", False)
    if len(df) < w.requests and not repeat:
        raise ConfigError(f"{w.requests:,} requests asked of trace {name}, which has {len(df):,} rows; "
                          f"set workload.requests to at most {len(df):,}, or workload.trace_repeat: true to "
                          "replay the trace again and again", path="workload.requests")
    df = df.iloc[: w.requests]  # with trace_repeat, the rows the repetitions cycle through
    span = float(repeated_arrivals(df["arrived_at"].to_numpy(float), w.requests)[-1]) * w.trace_time_scale
    if w.arrival == "trace" and span > MAX_TRACE_SECONDS:
        raise ConfigError(f"trace {name} spans {span:g} s once scaled, beyond {MAX_TRACE_SECONDS:g} s (about 3 "
                          "years); lower workload.trace_time_scale", path="workload.trace_time_scale")
    context = getattr(scenario.model, "context_length", None)
    if context is None:
        return
    output = df["num_decode_tokens"].to_numpy()
    window = f"{scenario.model.name}'s {context:,}-token context"
    if w.over_context == "truncate_prompt":  # prompts are cut to fit; an output alone must leave room
        row = _first(output >= context)
        if row is not None:
            raise _fail(Path(w.trace), row, f"num_decode_tokens {output[row]:,} leave no room for a prompt in "
                                            f"{window}")
        return
    total = df["num_prefill_tokens"].to_numpy() + output
    row = _first(total > context)
    if row is not None:
        raise _fail(Path(w.trace), row, f"prompt + output = {total[row]:,} tokens exceed {window}; set "
                                        "workload.over_context: truncate_prompt to cut prompts to fit (as Vidur does)")


def fit_to_context(prompt: np.ndarray, output: np.ndarray, context: int | None, over_context: str) -> np.ndarray:
    """Prompts cut so prompt + output fits the context (``truncate_prompt``, Vidur's trace rule), else as given."""
    if context is None or over_context != "truncate_prompt":
        return prompt
    return np.minimum(prompt, context - output).astype(np.int64)
