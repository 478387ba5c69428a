"""Reward-gaming monitors: is the rubric term paying for something other than good answers?

ARBOR's gates look at correlations over a group. A trajectory can still inflate its rubric
score while its answer is wrong, e.g. by listing the retrieved passages' entities in its
own text (what LongTraceRL saw). These monitors read what a step already has: each
trajectory's rubric term ``s~`` (a rubric rewarder's ``per_traj[...]["rubric_score"]``), its
outcome, its length and its text. An answer is wrong when its outcome is below
``algo.correct_at`` (the library's one definition of a correct answer, which the
positive-only gate and PROF read too). Per step, in ``metrics.jsonl``:

* ``gaming/outcome_corr``: Pearson correlation of the rubric term with the outcome, inside
  the informative groups (outcome and term both vary). Each group is centred first, then
  the pairs of all such groups are pooled. A rubric that rewards good answers keeps this
  above 0.
* ``gaming/wrong_top_frac``: among the trajectories whose rubric term is in the batch's top
  quartile (at or above its 75th percentile, above its minimum; none while the term is
  constant), the share whose answer is wrong; ``gaming/wrong_frac``: the share of wrong
  answers in the whole batch, what the top quartile is compared with (a rubric unrelated to
  correctness puts the batch's wrong rate in its top quartile too).
* ``gaming/copied_titles``: for search tasks, the mean number of distinct retrieved titles
  (from the ``<information>`` blocks) that a trajectory repeats in its own text, outside its
  ``<search>`` queries and the retrieved text. ``gaming/copy_corr`` is the pooled
  within-group correlation of that count with the rubric term.
* ``gaming/length_corr``: the pooled within-group correlation of response length (action
  tokens) with the rubric term.

A correlation is left out when it is undefined (no group where both sides vary).

**Alarms need evidence.** A value past a fixed line fires on noise: with no relation at all
between rubric and outcome, ``outcome_corr < 0`` holds in about half the steps, and
``wrong_top_frac > 0.5`` whenever accuracy is below 50 %. So each alarm tests the step's own
pairs, one-sided at level :data:`ALPHA`, against a margin (:data:`MARGINS`), and the bound it
tests is recorded beside the value (:data:`BOUNDS`: ``<metric>_bound``):

* a correlation r from n pairs in m centred groups: Fisher's ``z = atanh r`` with standard
  error ``1 / sqrt(n - m - 2)`` (each group's centring takes one degree of freedom; no bound
  below 3 residual degrees of freedom); bound ``tanh(z -+ z_alpha se)``. ``outcome_corr``
  alarms when its upper bound is below -0.1, ``copy_corr`` and ``length_corr`` when their
  lower bound is above 0.3.
* ``wrong_top_frac``: the Wilson lower bound of the top quartile's wrong share (k wrong of t),
  ``(p + z^2/2t - z sqrt(p(1-p)/t + z^2/4t^2)) / (1 + z^2/t)``; alarm when it exceeds
  ``gaming/wrong_frac + 0.1``. Under no relation the top quartile is a random draw from the
  batch (hypergeometric, narrower than the binomial the bound assumes), so this errs quiet.

The margins and the level are ours, chosen as "clearly wrong, and not by chance"; they are not
calibrated on runs. Each step is tested alone: a step of a paper-sized run holds hundreds of
pairs, while a small CPU run's step rarely holds the evidence to fire.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

import numpy as np

from core.search_r1 import copied_titles
from core.types import Group, RewardOutput

#: one-sided level of every alarm's test
ALPHA = 0.01
#: metric -> (direction, margin): an alert when the metric's bound at level ALPHA
#: (``<metric>_bound``) is beyond the margin; for wrong_top_frac the margin is over
#: ``gaming/wrong_frac``
MARGINS: dict[str, tuple[str, float]] = {
    "gaming/outcome_corr": ("below", -0.1),
    "gaming/wrong_top_frac": ("above", 0.1),
    "gaming/copy_corr": ("above", 0.3),
    "gaming/length_corr": ("above", 0.3),
}
#: where each alarm's bound is recorded
BOUNDS = {"gaming/outcome_corr": "gaming/outcome_corr_bound",
          "gaming/wrong_top_frac": "gaming/wrong_top_frac_bound",
          "gaming/copy_corr": "gaming/copy_corr_bound",
          "gaming/length_corr": "gaming/length_corr_bound"}
Z_ALPHA = NormalDist().inv_cdf(1.0 - ALPHA)


def _centred_pairs(x: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray, int] | None:
    """The within-group centred pairs of the groups (rows) where both sides vary, and how
    many groups they come from; None when there is no such group."""
    xs, ys = [], []
    for n in range(x.shape[0]):
        if groups is not None and not groups[n]:
            continue
        ok = np.isfinite(x[n]) & np.isfinite(y[n])
        a, b = x[n][ok], y[n][ok]
        if a.size < 2 or np.ptp(a) <= 1e-12 or np.ptp(b) <= 1e-12:
            continue
        xs.append(a - a.mean())
        ys.append(b - b.mean())
    return None if not xs else (np.concatenate(xs), np.concatenate(ys), len(xs))


def pooled_corr(x: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None) -> float | None:
    """Pearson correlation of the pairs of the groups (rows of `x`, `y` [N, G]; NaN = padding)
    where both vary, each group centred first (selected rows: `groups`, a bool [N]). None when
    no such group exists."""
    got = _centred_pairs(x, y, groups)
    return None if got is None else _pearson(got[0], got[1])


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    """The correlation of already centred pairs."""
    return float(np.dot(a, b) / np.sqrt(np.dot(a, a) * np.dot(b, b)))


def corr_bound(r: float, pairs: int, groups: int, side: str, z: float = Z_ALPHA
               ) -> float | None:
    """The one-sided Fisher bound (`side`: "lower" | "upper") of a pooled within-group
    correlation `r` of `pairs` pairs from `groups` centred groups (module docstring); None
    below 3 residual degrees of freedom."""
    dof = pairs - groups
    if dof < 3:
        return None
    centre = math.atanh(min(max(r, -1.0 + 1e-12), 1.0 - 1e-12))
    step = z / math.sqrt(dof - 2)
    return math.tanh(centre - step if side == "lower" else centre + step)


def wilson_lower(k: int, t: int, z: float = Z_ALPHA) -> float:
    """The Wilson score lower bound of a proportion of `k` in `t` (module docstring)."""
    p = k / t
    spread = z * math.sqrt(p * (1 - p) / t + z * z / (4 * t * t))
    return (p + z * z / (2 * t) - spread) / (1 + z * z / t)


def _corr_metric(out: dict[str, float], key: str, x: np.ndarray, y: np.ndarray,
                 groups: np.ndarray | None = None) -> None:
    """``out[key]`` and its bound (``BOUNDS[key]``, the side its alarm tests) when defined."""
    got = _centred_pairs(x, y, groups)
    if got is None:
        return
    a, b, m = got
    r = out[key] = _pearson(a, b)
    side = "upper" if MARGINS[key][0] == "below" else "lower"
    if (bound := corr_bound(r, a.size, m, side)) is not None:
        out[BOUNDS[key]] = bound


def gaming_metrics(term: np.ndarray, outcome: np.ndarray, lengths: np.ndarray,
                   texts: Sequence[Sequence[str]], search: bool, correct_at: float = 1.0
                   ) -> dict[str, float]:
    """The ``gaming/*`` metrics and their alarm bounds (module docstring) of one step's [N, G]
    rubric term, outcome, lengths and texts; ``search``: count the copied titles; an answer
    is wrong when its outcome is below ``correct_at``."""
    out: dict[str, float] = {}
    informative = np.asarray([np.ptp(o[np.isfinite(o)]) > 1e-12 if np.isfinite(o).sum() > 1
                              else False for o in outcome])
    _corr_metric(out, "gaming/outcome_corr", term, outcome, informative)
    finite = np.isfinite(term) & np.isfinite(outcome)
    if finite.sum() >= 4 and np.ptp(term[finite]) > 1e-12:  # a constant term has no top
        low = term[finite].min()
        top = finite & (term >= np.quantile(term[finite], 0.75)) & (term > low)
        wrong = outcome < correct_at
        out["gaming/wrong_top_frac"] = float(np.mean(wrong[top]))
        out[BOUNDS["gaming/wrong_top_frac"]] = wilson_lower(int(wrong[top].sum()), int(top.sum()))
        out["gaming/wrong_frac"] = float(np.mean(wrong[finite]))
    if search:
        copied = np.full(term.shape, np.nan)
        for n, g in enumerate(texts):
            copied[n, :len(g)] = [copied_titles(t) for t in g]
        out["gaming/copied_titles"] = float(np.nanmean(copied))
        _corr_metric(out, "gaming/copy_corr", copied, term)
    _corr_metric(out, "gaming/length_corr", lengths.astype(np.float64), term)
    return out


def alerts(metrics: dict[str, float]) -> list[dict[str, Any]]:
    """One alert per ``gaming/*`` metric whose bound is beyond its margin (:data:`MARGINS`;
    ``wrong_top_frac``'s margin is over ``gaming/wrong_frac``): ``metric``, ``value``,
    ``bound``, ``threshold`` (what the bound crossed), ``direction``, ``alpha``."""
    found = []
    for key, (direction, margin) in MARGINS.items():
        bound = metrics.get(BOUNDS[key])
        if bound is None:
            continue
        limit = margin + metrics["gaming/wrong_frac"] if key == "gaming/wrong_top_frac" else margin
        if (bound < limit) if direction == "below" else (bound > limit):
            found.append({"kind": "gaming_alert", "metric": key, "value": metrics[key],
                          "bound": bound, "threshold": limit, "direction": direction,
                          "alpha": ALPHA})
    return found


def step_monitors(groups: Sequence[Group], out: RewardOutput, correct_at: float = 1.0
                  ) -> tuple[dict[str, float], tuple[dict[str, Any], ...]]:
    """A step's ``gaming/*`` metrics and their alerts, from every group the rewarder scored
    and its output (({}, ()) when it reports no rubric term per trajectory); an answer is
    wrong below ``correct_at``. The copied-titles monitors run when the trajectories are
    search rollouts (their ``info`` counts ``searches``)."""
    shape = np.shape(out.rewards)
    term = out.rubric_term()
    if term is None:
        return {}, ()
    lengths = np.full(shape, np.nan)
    for n, g in enumerate(groups):
        lengths[n, :len(g.trajectories)] = [tr.num_action_tokens for tr in g.trajectories]
    texts = [[tr.text for tr in g.trajectories] for g in groups]
    search = any("searches" in tr.info for g in groups for tr in g.trajectories)
    metrics = gaming_metrics(term, np.asarray(out.outcome, np.float64), lengths, texts, search,
                             correct_at)
    return metrics, tuple(alerts(metrics))
