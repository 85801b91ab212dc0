"""Percentile summaries of latency samples, the same for every kind of run."""

from __future__ import annotations

import numpy as np


def stats(values: np.ndarray, scale: float = 1.0) -> dict:
    """p50/p90/p99/mean of an array (NaN-free), scaled (e.g. 1e3 for ms)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if not len(v):
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    p50, p90, p99 = np.percentile(v, [50, 90, 99]) * scale
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "mean": float(v.mean() * scale)}
