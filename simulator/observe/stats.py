"""Percentile summaries of latency samples, the same for every kind of run."""

from __future__ import annotations

import numpy as np


def stats(values: np.ndarray, scale: float = 1.0) -> dict:
    """p50/p90/p99/mean of an array (NaN-free), scaled (e.g. 1e3 for ms).

    One copy of the samples at most (they can be millions of inter-token gaps): the finite ones,
    or, when all are, the copy the percentiles partition; the mean is taken before, in sample order.
    """
    v = np.asarray(values, dtype=float)
    finite = np.isfinite(v)
    whole = bool(finite.all())
    if not whole:
        v = v[finite]
    del finite
    if not len(v):
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    mean = float(v.mean() * scale)
    p50, p90, p99 = np.percentile(v, [50, 90, 99], overwrite_input=not whole) * scale
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "mean": mean}
