"""A log-bucket quantile sketch: percentiles of millions of samples in a fixed few hundred kilobytes.

Positive samples fall into buckets whose bounds grow by a factor gamma = (1 + a) / (1 - a); a
bucket's representative value, 2 gamma^k / (gamma + 1), is within a relative error ``a`` of every
sample in it (the DDSketch construction: Masson, Rim and Lee, "DDSketch: a fast and fully-mergeable
quantile sketch with relative-error guarantees", VLDB 2019). Zeros are counted apart; the count,
the sum (so the mean is exact up to summation order) and the maximum are kept as well.
"""

from __future__ import annotations

import math

import numpy as np

REL_ERROR = 1e-3
"""Relative error of every percentile the sketch reports."""

LOWEST = 1e-9
"""Samples below this (1 ns, for times in seconds) share the lowest bucket."""

HIGHEST = 1e6
"""Samples above this share the highest bucket."""


class QuantileSketch:
    """Counts of samples per log bucket, plus zeros, count, sum and max."""

    def __init__(self, rel_error: float = REL_ERROR, lowest: float = LOWEST, highest: float = HIGHEST):
        self.rel_error = rel_error
        self.log_gamma = math.log((1 + rel_error) / (1 - rel_error))
        self.offset = math.ceil(math.log(lowest) / self.log_gamma)
        self.counts = np.zeros(math.ceil(math.log(highest) / self.log_gamma) - self.offset + 1, dtype=np.int64)
        self.zeros = 0
        self.count = 0
        self.total = 0.0
        self.max = -math.inf

    def add(self, values: np.ndarray) -> None:
        """Add non-negative samples."""
        v = np.asarray(values, dtype=float)
        if not len(v):
            return
        self.count += len(v)
        self.total += float(v.sum())
        self.max = max(self.max, float(v.max()))
        positive = v[v > 0]
        self.zeros += len(v) - len(positive)
        k = np.ceil(np.log(positive) / self.log_gamma).astype(np.int64) - self.offset
        np.clip(k, 0, len(self.counts) - 1, out=k)
        self.counts += np.bincount(k, minlength=len(self.counts))

    def add_zeros(self, n: int) -> None:
        self.count += n
        self.zeros += n
        if n:
            self.max = max(self.max, 0.0)

    def copy(self) -> "QuantileSketch":
        out = QuantileSketch(self.rel_error)
        out.counts = self.counts.copy()
        out.zeros, out.count, out.total, out.max = self.zeros, self.count, self.total, self.max
        return out

    def quantile(self, q: float) -> float:
        """The q-quantile (0..1) of the samples, within ``rel_error`` of the true one."""
        rank = q * (self.count - 1)
        if rank < self.zeros:
            return 0.0
        cum = np.cumsum(self.counts)
        k = int(np.searchsorted(cum, rank - self.zeros, side="right"))
        gamma = math.exp(self.log_gamma)
        return 2 * gamma ** (k + self.offset) / (gamma + 1)

    def count_above(self, x: float) -> int:
        """How many samples exceed x (to the sketch's resolution)."""
        if x < 0:
            return self.count
        if x == 0:
            return self.count - self.zeros
        k = math.ceil(math.log(x) / self.log_gamma) - self.offset
        return int(self.counts[max(k + 1, 0):].sum())
