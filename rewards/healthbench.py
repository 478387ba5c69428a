"""HealthBench's aggregate scores over any rubric task's criterion checks (Arora et al. 2025,
"HealthBench"; OpenAI simple-evals ``healthbench_eval.py``), restated:

    score(example, items) = sum over met items of points / sum over items with points > 0
                            (undefined when no item has positive points)
    overall               = clip(mean over examples of score(example, all items), 0, 1)
    a criterion tag t     = clip(mean over the examples where it is defined of
                                 score(example, the items tagged t), 0, 1)      ("axis:...")
    an example tag t      = clip(mean over the examples tagged t of
                                 score(example, all items), 0, 1)               ("theme:...")

Only the means are clipped, never an example's score (a pitfall can make it negative);
``rewards.aggregate.healthbench_dataset_score`` is the overall score of per-example rewards.
A met value may be a probability (a judge's P(met)), which weights the points.

Each score is a mean over examples of a per-example value (:func:`healthbench_values`: NaN where
it is undefined), so it gets a bootstrap interval over examples like any mean: resample the
examples, take each resample's mean over the defined values, and clip the interval's ends to
[0, 1] as the score is clipped (clipping is monotone, so the clipped quantiles are the
quantiles of the clipped means).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# tag prefixes HealthBench writes ("axis:accuracy", "theme:emergency_referrals"), dropped in
# the reported names
PREFIXES = ("axis:", "theme:")


def example_score(points: Sequence[float] | np.ndarray, met: Sequence[float] | np.ndarray
                  ) -> float | None:
    """``sum(points * met) / sum(points > 0)``; None without positive points."""
    points, met = np.asarray(points, np.float64), np.asarray(met, np.float64)
    possible = points[points > 0].sum()
    return None if possible <= 0 else float((points * met).sum() / possible)


def _name(tag: str) -> str:
    """A tag as a metric name part: its prefix dropped, spaces as underscores."""
    for prefix in PREFIXES:
        if tag.startswith(prefix):
            tag = tag[len(prefix):]
            break
    return tag.replace(" ", "_")


def is_healthbench_score(name: str) -> bool:
    """Whether a metric name is one of :func:`healthbench_scores`' clipped means."""
    return name == "healthbench" or name.startswith(("axis/", "theme/"))


def healthbench_values(points: Sequence[Sequence[float]], met: Sequence[Sequence[float]],
                       item_tags: Sequence[Sequence[Sequence[str]]],
                       example_tags: Sequence[Sequence[str]]) -> dict[str, np.ndarray]:
    """Per example b, the value each score averages (module docstring), NaN where undefined:
    ``healthbench``: ``score(b, all items)``; ``axis/<t>``: ``score(b, the items tagged t)``;
    ``theme/<t>``: ``score(b, all items)`` where b is tagged t. Examples as in
    :func:`healthbench_scores`."""
    nan = float("nan")
    overall = np.asarray([nan if (v := example_score(p, m)) is None else v
                          for p, m in zip(points, met)], np.float64)
    out: dict[str, np.ndarray] = {"healthbench": overall}
    for tag in sorted({t for tags in item_tags for item in tags for t in item}):
        values = []
        for p, m, tags in zip(points, met, item_tags):
            keep = np.asarray([tag in item for item in tags], bool)
            v = example_score(np.asarray(p)[keep], np.asarray(m)[keep]) if keep.any() else None
            values.append(nan if v is None else v)
        out[f"axis/{_name(tag)}"] = np.asarray(values, np.float64)
    for tag in sorted({t for tags in example_tags for t in tags}):
        out[f"theme/{_name(tag)}"] = np.where([tag in tags for tags in example_tags], overall, nan)
    return out


def clipped_means(values: dict[str, np.ndarray]) -> dict[str, float]:
    """``clip(mean of the defined values, 0, 1)`` of each key with any defined value."""
    return {k: float(np.clip(np.mean(v[np.isfinite(v)]), 0.0, 1.0))
            for k, v in values.items() if np.isfinite(v).any()}


def healthbench_scores(points: Sequence[Sequence[float]], met: Sequence[Sequence[float]],
                       item_tags: Sequence[Sequence[Sequence[str]]],
                       example_tags: Sequence[Sequence[str]]) -> dict[str, float]:
    """``{"healthbench": overall, "axis/<t>": ..., "theme/<t>": ...}`` (module docstring) for
    examples b with criterion points ``points[b]``, met values ``met[b]``, each criterion's
    tags ``item_tags[b][i]`` and the example's tags ``example_tags[b]``; a tag whose score is
    undefined everywhere is left out."""
    return clipped_means(healthbench_values(points, met, item_tags, example_tags))
