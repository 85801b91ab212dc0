"""A DiT request trace: when each image or video request arrived and what it asked for, read and checked at load time.

A CSV with ``arrived_at`` (seconds from the trace's start, non-decreasing), ``width`` and ``height`` (pixels),
and optionally ``steps`` and ``frames`` (the scenario's where a column is absent); the header names the
columns, in any order. No public trace of image or video generation requests with arrival times was found, so
the format follows the LLM traces' ``arrived_at`` (the Splitwise/Vidur CSVs) and the request fields of the
OpenAI-style image and video endpoints (size, steps, frames).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from .trace import KEY, MAX_TRACE_SECONDS, _fail, _first, _numbers, _read_columns, trace_file

SHAPE_COLUMNS = ("width", "height", "steps", "frames")
FORMATS = {
    "video": ("arrived_at", "width", "height", "steps", "frames"),
    "steps": ("arrived_at", "width", "height", "steps"),
    "frames": ("arrived_at", "width", "height", "frames"),
    "image": ("arrived_at", "width", "height"),
}
"""The column sets a DiT trace may have, the fullest first (the first whose columns the header holds is read)."""
MAX_VALUE = {"width": 16_384, "height": 16_384, "steps": 10_000, "frames": 4097}
"""Bounds of each shape column (the scenario's own: MAX_SIDE, steps, MAX_FRAMES)."""


@dataclass(frozen=True)
class DiTTraceRows:
    """A checked DiT trace: arrival (s) and each request's shape column (None where the trace has no such column)."""

    arrived_at: np.ndarray
    width: np.ndarray
    height: np.ndarray
    steps: np.ndarray | None
    frames: np.ndarray | None

    def __len__(self) -> int:
        return len(self.arrived_at)


def read_dit_trace(path: str | Path) -> DiTTraceRows:
    """Load and check a DiT trace (cached per file version); any problem is a ConfigError naming the file,
    the row and the column."""
    p, st = trace_file(path)
    return _read_checked(str(p.resolve()), st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=8)
def _read_checked(path: str, mtime_ns: int, size: int) -> DiTTraceRows:
    p = Path(path)
    texts, rows, fmt = _read_columns(p, FORMATS)
    if rows == 0:
        raise _fail(p, None, "has no rows")
    cols = dict(zip(FORMATS[fmt], texts))
    out = {}
    for col, text in cols.items():
        values = _numbers(text)
        row = _first(~np.isfinite(values))
        if row is not None:
            raise _fail(p, row, f"{col} = {text[row].strip()[:40]!r} is not a number")
        if col != "arrived_at":
            row = _first((values != np.floor(values)) | (values < 1) | (values > MAX_VALUE[col]))
            if row is not None:
                raise _fail(p, row, f"{col} must be a whole number from 1 to {MAX_VALUE[col]:,}, got {values[row]:g}")
            values = values.astype(np.int64)
        values.flags.writeable = False
        out[col] = values
    arrivals = out["arrived_at"]
    row = _first(np.r_[arrivals[:1] < 0, np.diff(arrivals) < 0])
    if row is not None:
        raise _fail(p, row, "arrived_at must be non-negative and non-decreasing")
    row = _first(arrivals > MAX_TRACE_SECONDS)
    if row is not None:
        raise _fail(p, row, f"arrived_at must be at most {MAX_TRACE_SECONDS:g} s, got {arrivals[row]:g}")
    return DiTTraceRows(arrivals, out["width"], out["height"], out.get("steps"), out.get("frames"))


def trace_shapes(rows: DiTTraceRows, n: int, steps: int, frames: int | None) -> list[tuple[int, int, int, int | None]]:
    """The first ``n`` rows' (width, height, steps, frames), the scenario's steps and frames where the trace
    has no such column."""
    s = rows.steps[:n].tolist() if rows.steps is not None else [steps] * n
    f = rows.frames[:n].tolist() if rows.frames is not None else [frames] * n
    return list(zip(rows.width[:n].tolist(), rows.height[:n].tolist(), s, f))


def check_dit_trace(scenario, check_shape) -> None:
    """Reject a DiT trace that cannot serve the scenario: too few rows, or a shape the model or layout cannot
    run (``check_shape(width, height, steps, frames)`` raises the scenario's own error), named by its row."""
    w = scenario.workload
    rows = read_dit_trace(w.trace)
    name = Path(w.trace).name
    if w.arrival != "trace":
        raise ConfigError(f"a DiT trace carries its own arrival times: set workload.arrival to trace (got "
                          f"{w.arrival!r})", path="workload.arrival")
    if len(rows) < w.requests:
        raise ConfigError(f"{w.requests:,} requests asked of trace {name}, which has {len(rows):,} rows; set "
                          f"workload.requests to at most {len(rows):,}", path="workload.requests")
    if float(rows.arrived_at[w.requests - 1]) * w.trace_time_scale > MAX_TRACE_SECONDS:
        raise ConfigError(f"trace {name} spans beyond {MAX_TRACE_SECONDS:g} s once scaled; lower "
                          "workload.trace_time_scale", path="workload.trace_time_scale")
    seen: dict = {}
    for row, shape in enumerate(trace_shapes(rows, w.requests, scenario.steps, scenario.frames)):
        if shape in seen:
            continue
        seen[shape] = row
        try:
            check_shape(*shape)
        except ConfigError as exc:
            raise ConfigError(f"trace {name} row {row + 2}: {exc.message}", path=KEY) from None
