"""The quantile sketch: every percentile within its relative error of the exact one, zeros and
maxima kept, the count above a threshold to bucket resolution."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.observe.sketch import QuantileSketch


def test_percentiles_are_within_the_relative_error_of_order_statistics():
    rng = np.random.default_rng(3)
    values = rng.lognormal(np.log(0.02), 1.0, 200_000)
    sk = QuantileSketch()
    for part in np.array_split(values, 7):  # added in batches, as the ledger spills
        sk.add(part)
    ordered = np.sort(values)
    for q in (0.01, 0.5, 0.9, 0.99, 0.999):
        true = ordered[int(q * (len(values) - 1))]
        assert sk.quantile(q) == pytest.approx(true, rel=1e-3)
    assert sk.count == len(values) and sk.total == pytest.approx(values.sum(), rel=1e-12)
    assert sk.max == values.max()


def test_zeros_and_counts_above():
    sk = QuantileSketch()
    sk.add(np.array([0.0, 0.0, 1e-3, 2e-3, 4e-3]))
    sk.add_zeros(5)
    assert sk.count == 10 and sk.zeros == 7
    assert sk.quantile(0.5) == 0.0
    assert sk.quantile(1.0) == pytest.approx(4e-3, rel=1e-3)
    assert sk.count_above(0) == 3 and sk.count_above(1.5e-3) == 2 and sk.count_above(-1) == 10
