"""Reward-gaming monitors: is the rubric term paying for something other than good answers?

ARBOR's gates look at correlations over a group. A trajectory can still inflate its rubric
score while its answer is wrong, e.g. by listing the retrieved passages' entities in its
own text (what LongTraceRL saw). These monitors read what a step already has: each
trajectory's rubric term ``s~`` (a rubric rewarder's ``per_traj[...]["rubric_score"]``), its
outcome, its length and its text. Per step, in ``metrics.jsonl``:

* ``gaming/outcome_corr``: Pearson correlation of the rubric term with the outcome, inside
  the informative groups (outcome and term both vary). Each group is centred first, then
  the pairs of all such groups are pooled. A rubric that rewards good answers keeps this
  above 0.
* ``gaming/wrong_top_frac``: among the trajectories whose rubric term is in the batch's top
  quartile (at or above its 75th percentile, above its minimum; none while the term is
  constant), the share whose answer is wrong (outcome <= 0: no outcome reward).
* ``gaming/copied_titles``: for search tasks, the mean number of distinct retrieved titles
  (from the ``<information>`` blocks) that a trajectory repeats in its own text, outside its
  ``<search>`` queries and the retrieved text. ``gaming/copy_corr`` is the pooled
  within-group correlation of that count with the rubric term.
* ``gaming/length_corr``: the pooled within-group correlation of response length (action
  tokens) with the rubric term.

A correlation is left out when it is undefined (no group where both sides vary). Crossing a
threshold in :data:`THRESHOLDS` writes an alert (``alerts.jsonl`` in the run folder). The
thresholds are ours, chosen as "clearly wrong", not calibrated on runs:

* ``outcome_corr`` below 0: the rubric pays for worse answers;
* ``wrong_top_frac`` above 0.5: most of the best-paid trajectories answered wrong;
* ``copy_corr`` above 0.5: copying titles is what the rubric pays for;
* ``length_corr`` above 0.5: length is what the rubric pays for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from core.search_r1 import copied_titles
from core.types import Group, RewardOutput

#: metric -> (direction, threshold): an alert when the value is beyond it
THRESHOLDS: dict[str, tuple[str, float]] = {
    "gaming/outcome_corr": ("below", 0.0),
    "gaming/wrong_top_frac": ("above", 0.5),
    "gaming/copy_corr": ("above", 0.5),
    "gaming/length_corr": ("above", 0.5),
}
def pooled_corr(x: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None) -> float | None:
    """Pearson correlation of the pairs of the groups (rows of `x`, `y` [N, G]; NaN = padding)
    where both vary, each group centred first (selected rows: `groups`, a bool [N]). None when
    no such group exists."""
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
    if not xs:
        return None
    a, b = np.concatenate(xs), np.concatenate(ys)
    return float(np.dot(a, b) / np.sqrt(np.dot(a, a) * np.dot(b, b)))


def gaming_metrics(term: np.ndarray, outcome: np.ndarray, lengths: np.ndarray,
                   texts: Sequence[Sequence[str]], search: bool) -> dict[str, float]:
    """The ``gaming/*`` metrics (module docstring) of one step's [N, G] rubric term, outcome,
    lengths and texts; ``search``: count the copied titles."""
    out: dict[str, float] = {}
    informative = np.asarray([np.ptp(o[np.isfinite(o)]) > 1e-12 if np.isfinite(o).sum() > 1
                              else False for o in outcome])
    if (c := pooled_corr(term, outcome, informative)) is not None:
        out["gaming/outcome_corr"] = c
    finite = np.isfinite(term) & np.isfinite(outcome)
    if finite.sum() >= 4 and np.ptp(term[finite]) > 1e-12:  # a constant term has no top
        low = term[finite].min()
        top = finite & (term >= np.quantile(term[finite], 0.75)) & (term > low)
        out["gaming/wrong_top_frac"] = float(np.mean(outcome[top] <= 0))
    if search:
        copied = np.full(term.shape, np.nan)
        for n, g in enumerate(texts):
            copied[n, :len(g)] = [copied_titles(t) for t in g]
        out["gaming/copied_titles"] = float(np.nanmean(copied))
        if (c := pooled_corr(copied, term)) is not None:
            out["gaming/copy_corr"] = c
    if (c := pooled_corr(lengths.astype(np.float64), term)) is not None:
        out["gaming/length_corr"] = c
    return out


def alerts(metrics: dict[str, float]) -> list[dict[str, Any]]:
    """One alert per ``gaming/*`` metric beyond its threshold (:data:`THRESHOLDS`)."""
    found = []
    for key, (direction, limit) in THRESHOLDS.items():
        value = metrics.get(key)
        if value is None:
            continue
        if (value < limit) if direction == "below" else (value > limit):
            found.append({"kind": "gaming_alert", "metric": key, "value": value,
                          "threshold": limit, "direction": direction})
    return found


def step_monitors(groups: Sequence[Group], out: RewardOutput
                  ) -> tuple[dict[str, float], tuple[dict[str, Any], ...]]:
    """A step's ``gaming/*`` metrics and the alerts past their thresholds, from every group the
    rewarder scored and its output (({}, ()) when it reports no rubric term per trajectory).
    The copied-titles monitors run when the trajectories are search rollouts (their ``info``
    counts ``searches``)."""
    shape = np.shape(out.rewards)
    term = out.rubric_term()
    if term is None:
        return {}, ()
    lengths = np.full(shape, np.nan)
    for n, g in enumerate(groups):
        lengths[n, :len(g.trajectories)] = [tr.num_action_tokens for tr in g.trajectories]
    texts = [[tr.text for tr in g.trajectories] for g in groups]
    search = any("searches" in tr.info for g in groups for tr in g.trajectories)
    metrics = gaming_metrics(term, np.asarray(out.outcome, np.float64), lengths, texts, search)
    return metrics, tuple(alerts(metrics))
