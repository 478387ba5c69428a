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


def _clipped_mean(values: Sequence[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return None if not got else float(np.clip(np.mean(got), 0.0, 1.0))


def _name(tag: str) -> str:
    """A tag as a metric name part: its prefix dropped, spaces as underscores."""
    for prefix in PREFIXES:
        if tag.startswith(prefix):
            tag = tag[len(prefix):]
            break
    return tag.replace(" ", "_")


def healthbench_scores(points: Sequence[Sequence[float]], met: Sequence[Sequence[float]],
                       item_tags: Sequence[Sequence[Sequence[str]]],
                       example_tags: Sequence[Sequence[str]]) -> dict[str, float]:
    """``{"healthbench": overall, "axis/<t>": ..., "theme/<t>": ...}`` (module docstring) for
    examples b with criterion points ``points[b]``, met values ``met[b]``, each criterion's
    tags ``item_tags[b][i]`` and the example's tags ``example_tags[b]``; a tag whose score is
    undefined everywhere is left out."""
    overall = [example_score(p, m) for p, m in zip(points, met)]
    out: dict[str, float] = {}
    if (value := _clipped_mean(overall)) is not None:
        out["healthbench"] = value
    for tag in sorted({t for tags in item_tags for item in tags for t in item}):
        scores = []
        for p, m, tags in zip(points, met, item_tags):
            keep = np.asarray([tag in item for item in tags], bool)
            scores.append(example_score(np.asarray(p)[keep], np.asarray(m)[keep])
                          if keep.any() else None)
        if (value := _clipped_mean(scores)) is not None:
            out[f"axis/{_name(tag)}"] = value
    for tag in sorted({t for tags in example_tags for t in tags}):
        value = _clipped_mean([s for s, tags in zip(overall, example_tags) if tag in tags])
        if value is not None:
            out[f"theme/{_name(tag)}"] = value
    return out
