"""Percentile bootstrap confidence interval of a mean (Efron & Tibshirani 1993, ch. 13).

For values ``x_1..x_n`` (one per prompt: a reward change, a pairwise score), draw ``n_boot``
resamples of ``n`` indices with replacement, ``idx ~ rng.integers(0, n, (n_boot, n))`` with
``rng = numpy.random.default_rng(seed)``, take each resample's mean ``m_r``, and return the
``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of ``m_1..m_B`` (numpy's default linear
interpolation).  The ProRubric authors' incentive audit reports its reward changes this way
(95 %, 2,000 resamples over prompts, seed 0), which are the defaults here.

Resampling several statistics of the same units with one ``indices`` array keeps them paired
(``bootstrap_means``), e.g. win, tie and loss rates of the same pairs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

N_BOOT = 2000
LEVEL = 0.95


def bootstrap_indices(n: int, n_boot: int = N_BOOT, seed: int = 0) -> np.ndarray:
    """``[n_boot, n]`` resample indices with replacement (seeded)."""
    if n < 1 or n_boot < 1:
        raise ValueError(f"bootstrap needs n >= 1 and n_boot >= 1, got n={n}, n_boot={n_boot}")
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def bootstrap_means(x: Sequence[float] | np.ndarray, indices: np.ndarray,
                    level: float = LEVEL) -> tuple[float, float]:
    """Percentile interval of the mean of ``x`` over the resamples ``indices``."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"confidence level must be in (0, 1), got {level}")
    means = np.asarray(x, np.float64)[indices].mean(axis=1)
    lo, hi = np.quantile(means, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return float(lo), float(hi)


def bootstrap_ci(x: Sequence[float] | np.ndarray, n_boot: int = N_BOOT, level: float = LEVEL,
                 seed: int = 0) -> tuple[float, float]:
    """``(lo, hi)``: the percentile bootstrap interval of ``mean(x)``; ``(nan, nan)`` for no
    values."""
    x = np.asarray(x, np.float64)
    if x.size == 0:
        return math.nan, math.nan
    return bootstrap_means(x, bootstrap_indices(x.size, n_boot, seed), level)
