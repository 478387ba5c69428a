"""Evaluation statistics over prompts and samples: mean@k, pass@j, maj@k and percentile
bootstrap intervals (``python -m rl.eval``, ``eval.samples``, ``eval.confidence``,
``eval.bootstrap``).

With n samples per prompt (``eval.samples=n``, sampled at ``eval.temperature``), every metric m
is reported as its **mean@n**, the mean over prompts of the mean over the prompt's n samples
(under the metric's own name). The correctness metrics (:data:`PASS_METRICS`) are also
reported as:

* **pass@j** for every j = 1..n (``{m}_pass@{j}``): the mean over prompts of the expected best
  of j samples drawn without replacement from the prompt's n,
  ``sum_i v_(i) C(i-1, j-1) / C(n, j)`` over the values in ascending order. For a 0/1 metric
  with c correct samples this is the unbiased pass@j estimator of Chen et al. (2021),
  ``1 - C(n-c, j) / C(n, j)``; for F1 the expected best-of-j F1. pass@1 equals mean@n.
* **maj@n** (``{m}_maj@{n}``), where the task reads each sample's final answer
  (``task.answer``): the value of a sample holding the prompt's most common answer (ties: the
  answer seen first; samples without an answer do not vote; none: 0).

With n = 1 (greedy, the default) only the metric itself is reported.

Every reported value gets a percentile bootstrap interval over prompts (``rewards.bootstrap``:
``eval.bootstrap`` resamples, level ``eval.confidence``, seed 0). A split's metrics share one
set of resampled prompts, so their intervals are paired; the average over splits is
bootstrapped stratified: each resample draws every split's prompts from that split and
averages the split means, as the reported average does.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from rewards.bootstrap import LEVEL, N_BOOT, bootstrap_indices

#: metrics whose best of k samples means something (a right answer among them)
PASS_METRICS = ("outcome", "em", "f1", "subem", "judge_acc")


def best_of(values: np.ndarray, j: int) -> np.ndarray:
    """[P] expected best of `j` of each prompt's n sample values ``values`` [P, n], drawn
    without replacement (module docstring: the unbiased pass@j for 0/1 values)."""
    n = values.shape[1]
    weights = np.asarray([math.comb(i, j - 1) for i in range(n)], np.float64) / math.comb(n, j)
    return np.sort(values, axis=1) @ weights


def majority_sample(answers: Sequence[str | None]) -> int | None:
    """The index of the first sample holding the most common answer (None: no answers)."""
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return None
    top = max(votes.values())
    return next(i for i, a in enumerate(answers) if a is not None and votes[a] == top)


def prompt_values(rows: Sequence[Sequence[Mapping[str, float]]], k: int,
                  answers: Sequence[Sequence[str | None]] | None = None
                  ) -> dict[str, np.ndarray]:
    """metric -> [P] per-prompt values from ``rows[prompt][sample]`` (k samples each): the
    mean over the samples, and with k > 1 for :data:`PASS_METRICS` ``{m}_pass@{j}`` for
    j = 1..k and, given each sample's final answer (``answers[prompt][sample]``, None: none),
    ``{m}_maj@{k}`` (module docstring). Metric order: the rows' own."""
    keys = list(dict.fromkeys(key for samples in rows for r in samples for key in r))
    majority = None if answers is None else [majority_sample(a) for a in answers]
    out: dict[str, np.ndarray] = {}
    for key in keys:
        values = np.asarray([[float(r[key]) for r in samples] for samples in rows], np.float64)
        out[key] = values.mean(axis=1)
        if k > 1 and key in PASS_METRICS:
            out |= {f"{key}_pass@{j}": best_of(values, j) for j in range(1, k + 1)}
            if majority is not None:
                out[f"{key}_maj@{k}"] = np.asarray(
                    [0.0 if m is None else v[m] for v, m in zip(values, majority)], np.float64)
    return out


def intervals(values: Mapping[str, Mapping[str, np.ndarray]], n_boot: int = N_BOOT,
              level: float = LEVEL, seed: int = 0) -> dict[str, dict[str, list[float]]]:
    """``{split: {metric: [lo, hi]}, "average": {...}}``: percentile bootstrap intervals of
    each split's metric means (``values[split][metric]``: [P] per-prompt values) and of their
    average over the splits that report the metric (module docstring). A NaN value (a metric
    undefined on that prompt) is left out of its resample's mean, and a resample with no
    defined value out of the quantiles."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"confidence level must be in (0, 1), got {level}")
    q = [(1.0 - level) / 2.0, (1.0 + level) / 2.0]
    means: dict[str, dict[str, np.ndarray]] = {}  # split -> metric -> [n_boot] resample means
    out: dict[str, dict[str, list[float]]] = {}
    for i, (split, metrics) in enumerate(values.items()):
        n = len(next(iter(metrics.values()))) if metrics else 0
        if n == 0:
            continue
        idx = bootstrap_indices(n, n_boot, seed + i)
        means[split] = {m: _defined_means(np.asarray(v, np.float64)[idx])
                        for m, v in metrics.items()}
        out[split] = {m: _quantiles(b, q) for m, b in means[split].items()}
    names = list(dict.fromkeys(m for split in means for m in means[split]))
    out["average"] = {m: _quantiles(np.mean([means[s][m] for s in means if m in means[s]],
                                            axis=0), q) for m in names}
    return out


def _defined_means(resampled: np.ndarray) -> np.ndarray:
    """[B] each resample's mean over its finite values (NaN: none)."""
    finite = np.isfinite(resampled)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(finite, resampled, 0.0).sum(axis=1) / finite.sum(axis=1)


def _quantiles(means: np.ndarray, q: list[float]) -> list[float]:
    """The `q` quantiles of the defined resample means (NaN, NaN without any)."""
    defined = means[np.isfinite(means)]
    return [float(x) for x in np.quantile(defined, q)] if defined.size else [math.nan] * 2
