"""Percentile summaries of latency samples, the same for every kind of run."""

from __future__ import annotations

import numpy as np

PERCENTS = (50, 90, 99)


def order_stats(v: np.ndarray, percents=PERCENTS, *, median: bool = False) -> list[float]:
    """``np.percentile(v, percents)`` (its default ``linear`` method), then ``np.median(v)`` when
    ``median``, from one partition of ``v`` in place (pass a copy to keep the order).

    The arithmetic is numpy's own (``numpy/lib/_function_base_impl.py`` of numpy 2.x: ``_quantile``,
    ``_get_indexes``, ``_lerp`` and ``_median``), so the values are the same to the last bit
    (``tests/test_observe_stats.py`` compares them); what differs is that one partition serves every
    percentile and the median (numpy partitions once per call), and that numpy's ``np.unique`` of the
    partition points, which imports ``numpy.ma`` (~10 ms) on first use, is not called. A sample
    holding a NaN gives NaN throughout, as numpy does."""
    v = np.asarray(v)
    n = v.size
    if not n:
        raise ValueError("order statistics of no samples")
    q = np.true_divide(percents, 100)
    virtual = (n - 1) * q
    prev = np.floor(virtual)
    nxt = prev + 1
    above = virtual >= n - 1
    prev[above] = -1
    nxt[above] = -1
    prev, nxt = prev.astype(np.intp), nxt.astype(np.intp)
    kth = {0, n - 1, *(int(i) % n for i in prev), *(int(i) % n for i in nxt)}
    if median:
        mid = [n // 2 - 1, n // 2] if n % 2 == 0 else [(n - 1) // 2]
        kth.update(mid)
    v.partition(sorted(kth))
    if np.isnan(v[-1]):  # NaN sorts last: the sample holds one
        return [float("nan")] * (len(q) + median)
    a, b = v[prev], v[nxt]
    gamma = np.asarray(virtual - prev, dtype=virtual.dtype)
    diff = b - a
    out = np.add(a, diff * gamma)
    np.subtract(b, diff * (1 - gamma), out=out, where=gamma >= 0.5, casting="unsafe", dtype=out.dtype.type)
    values = [float(x) for x in out]
    if median:
        values.append(float(v[mid[0]: mid[-1] + 1].mean()))
    return values


def stats(values: np.ndarray, scale: float = 1.0) -> dict:
    """p50/p90/p95/p99, mean and standard deviation (numpy's, over n) of an array, finite values only,
    scaled (e.g. 1e3 for ms).

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
        return dict.fromkeys(("p50", "p90", "p95", "p99", "mean", "std"))
    mean = float(v.mean() * scale)
    std = float(v.std() * scale)
    p50, p90, p95, p99 = order_stats(v.copy() if whole else v, (50, 90, 95, 99))
    return {"p50": p50 * scale, "p90": p90 * scale, "p95": p95 * scale, "p99": p99 * scale, "mean": mean, "std": std}
