"""Percentile bootstrap CI: against a numpy reference written here, and analytic cases."""

import math

import numpy as np
import pytest

from rewards.bootstrap import bootstrap_ci


def _reference(x, n_boot, level, seed):
    rng = np.random.default_rng(seed)
    means = np.array([np.mean(np.asarray(x)[rng.integers(0, len(x), len(x))])
                      for _ in range(n_boot)])
    return tuple(np.quantile(means, [(1 - level) / 2, (1 + level) / 2]))


def test_matches_a_resample_by_resample_reference_with_the_same_seed():
    x = [0.0, 0.25, -0.5, 1.0, 0.0, 0.75, -0.25]
    # rng.integers(0, n, (B, n)) draws the same stream as B calls of rng.integers(0, n, n)
    assert bootstrap_ci(x, n_boot=500, level=0.9, seed=3) == pytest.approx(
        _reference(x, 500, 0.9, 3))


def test_constant_values_give_a_point_interval_and_one_value_itself():
    assert bootstrap_ci([0.4] * 9) == pytest.approx((0.4, 0.4))
    assert bootstrap_ci([-2.0]) == (-2.0, -2.0)
    lo, hi = bootstrap_ci([])
    assert math.isnan(lo) and math.isnan(hi)


def test_large_sample_interval_is_the_normal_one():
    # CLT: the mean's bootstrap distribution ~ N(mean, sd^2 / n), sd with ddof 0; 95%: +-1.96
    x = np.random.default_rng(0).normal(1.0, 2.0, 4000)
    half = 1.959964 * x.std() / math.sqrt(x.size)
    lo, hi = bootstrap_ci(x, n_boot=4000, seed=1)
    assert lo == pytest.approx(x.mean() - half, abs=0.1 * half)
    assert hi == pytest.approx(x.mean() + half, abs=0.1 * half)


def test_bad_level_is_refused():
    with pytest.raises(ValueError, match="level"):
        bootstrap_ci([1.0, 2.0], level=1.0)
