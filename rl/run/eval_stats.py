"""Evaluation statistics over prompts and samples: mean@k, pass@k and percentile bootstrap
intervals (``python -m rl.eval``, ``eval.samples``, ``eval.confidence``, ``eval.bootstrap``).

With k samples per prompt (``eval.samples=k``, sampled at ``eval.temperature``), every metric m
is reported as its **mean@k**, the mean over prompts of the mean over the prompt's k samples
(under the metric's own name), and for the correctness metrics (:data:`PASS_METRICS`) also as
**pass@k** (``{m}_pass@{k}``), the mean over prompts of the best of the k samples: for a 0/1
metric the share of prompts with at least one correct sample, i.e. the unbiased pass@k
estimator of Chen et al. (2021) at n = k; for F1 the best-of-k F1. With k = 1 (greedy, the
default) only the metric itself is reported.

Every reported value gets a percentile bootstrap interval over prompts (``rewards.bootstrap``:
``eval.bootstrap`` resamples, level ``eval.confidence``, seed 0). A split's metrics share one
set of resampled prompts, so their intervals are paired; the average over splits is
bootstrapped stratified: each resample draws every split's prompts from that split and
averages the split means, as the reported average does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from rewards.bootstrap import LEVEL, N_BOOT, bootstrap_indices

#: metrics whose best of k samples means something (a right answer among them)
PASS_METRICS = ("outcome", "em", "f1", "subem", "judge_acc")


def prompt_values(rows: Sequence[Sequence[Mapping[str, float]]], k: int
                  ) -> dict[str, np.ndarray]:
    """metric -> [P] per-prompt values from ``rows[prompt][sample]`` (k samples each): the
    mean over the samples, and with k > 1 ``{m}_pass@{k}``, their maximum (module docstring).
    Metric order: the rows' own."""
    keys = list(dict.fromkeys(key for samples in rows for r in samples for key in r))
    out: dict[str, np.ndarray] = {}
    for key in keys:
        values = np.asarray([[float(r[key]) for r in samples] for samples in rows], np.float64)
        out[key] = values.mean(axis=1)
        if k > 1 and key in PASS_METRICS:
            out[f"{key}_pass@{k}"] = values.max(axis=1)
    return out


def intervals(values: Mapping[str, Mapping[str, np.ndarray]], n_boot: int = N_BOOT,
              level: float = LEVEL, seed: int = 0) -> dict[str, dict[str, list[float]]]:
    """``{split: {metric: [lo, hi]}, "average": {...}}``: percentile bootstrap intervals of
    each split's metric means (``values[split][metric]``: [P] per-prompt values) and of their
    average over the splits that report the metric (module docstring)."""
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
        means[split] = {m: np.asarray(v, np.float64)[idx].mean(axis=1) for m, v in metrics.items()}
        out[split] = {m: [float(x) for x in np.quantile(b, q)] for m, b in means[split].items()}
    names = list(dict.fromkeys(m for split in means for m in means[split]))
    out["average"] = {m: [float(x) for x in np.quantile(
        np.mean([means[s][m] for s in means if m in means[s]], axis=0), q)] for m in names}
    return out
