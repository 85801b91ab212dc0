"""observe.stats.order_stats: numpy's percentiles and median, bit for bit, from one partition."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.observe.stats import order_stats, stats


def _samples():
    rng = np.random.default_rng(7)
    yield np.array([3.5])
    yield np.array([2.0, 1.0])
    yield np.array([0.1, 0.2, 0.3])
    yield rng.lognormal(-4, 1.2, 10)
    yield rng.lognormal(-4, 1.2, 1001)
    yield rng.lognormal(-4, 1.2, 100_000)
    yield np.round(rng.exponential(0.02, 5000), 3)  # many ties
    yield np.r_[np.zeros(900), rng.random(100)]  # mostly zeros (ITL's zero gaps)
    yield np.r_[rng.random(50), np.inf, -np.inf]


@pytest.mark.parametrize("percents", [(50, 90, 99), (50, 99), (0, 25, 100), (12.5, 99.9)])
def test_order_stats_are_numpys_percentiles_and_median_to_the_bit(percents):
    for v in _samples():
        with np.errstate(invalid="ignore"):
            expected = [*np.percentile(v, percents), np.median(v)]
            got = order_stats(v.copy(), percents, median=True)
        assert np.array_equal(np.array(got), np.array(expected), equal_nan=True), (len(v), percents)
        assert [x.hex() for x in got] == [float(x).hex() for x in expected]


def test_order_stats_of_no_samples_is_an_error():
    with pytest.raises(ValueError):
        order_stats(np.empty(0))


def test_a_nan_in_the_sample_gives_nan_as_numpy_does():
    v = np.array([1.0, np.nan, 3.0, 2.0])
    assert np.isnan(order_stats(v.copy(), median=True)).all()
    assert np.isnan(np.percentile(v, [50, 90, 99])).all() and np.isnan(np.median(v))


def test_stats_scales_numpys_percentiles_and_skips_non_finite_samples():
    rng = np.random.default_rng(3)
    v = rng.lognormal(-3, 1, 2001)
    p50, p90, p95, p99 = np.percentile(v, [50, 90, 95, 99]) * 1e3
    assert stats(v, 1e3) == {"p50": float(p50), "p90": float(p90), "p95": float(p95), "p99": float(p99),
                             "mean": float(v.mean() * 1e3), "std": float(v.std() * 1e3)}
    before = v.copy()
    assert stats(np.r_[v, np.nan, np.inf], 1e3) == stats(v, 1e3)
    assert np.array_equal(v, before)  # the caller's samples keep their order
    assert stats(np.array([np.nan])) == dict.fromkeys(("p50", "p90", "p95", "p99", "mean", "std"))
