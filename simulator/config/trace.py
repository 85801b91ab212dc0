"""Reading request traces (CSV: arrived_at, num_prefill_tokens, num_decode_tokens)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import ConfigError

COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")


def read_trace(path: str | Path, *, key: str = "workload.trace", limit: int | None = None) -> pd.DataFrame:
    """Load and check a trace; any problem is a ConfigError naming the trace file and row."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"trace file {str(p)!r} does not exist", path=key)
    try:
        df = pd.read_csv(p, nrows=limit)
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as exc:
        raise ConfigError(f"trace {p.name} is not a readable CSV ({str(exc).splitlines()[0]})", path=key) from None
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ConfigError(f"trace {p.name} lacks column(s) {', '.join(missing)}; expected {', '.join(COLUMNS)}",
                          path=key)
    if df.empty:
        raise ConfigError(f"trace {p.name} has no rows", path=key)
    out = pd.DataFrame()
    for col in COLUMNS:
        values = pd.to_numeric(df[col], errors="coerce")
        bad = np.flatnonzero(values.isna().to_numpy() | ~np.isfinite(values.to_numpy(dtype=float, na_value=np.nan)))
        if bad.size:
            row = int(bad[0])
            raise ConfigError(f"trace {p.name} row {row + 2}: {col} = {df[col].iloc[row]!r} is not a number", path=key)
        out[col] = values.astype(float)
    for col in COLUMNS[1:]:
        bad = np.flatnonzero(out[col].to_numpy() < (1 if col == "num_decode_tokens" else 1))
        if bad.size:
            row = int(bad[0])
            raise ConfigError(f"trace {p.name} row {row + 2}: {col} must be at least 1, got {out[col].iloc[row]:g}",
                              path=key)
    arrivals = out["arrived_at"].to_numpy()
    if (arrivals < 0).any() or (np.diff(arrivals) < 0).any():
        row = int(np.flatnonzero(np.r_[arrivals[:1] < 0, np.diff(arrivals) < 0])[0])
        raise ConfigError(f"trace {p.name} row {row + 2}: arrived_at must be non-negative and non-decreasing", path=key)
    out["num_prefill_tokens"] = out["num_prefill_tokens"].astype(np.int64)
    out["num_decode_tokens"] = out["num_decode_tokens"].astype(np.int64)
    return out
