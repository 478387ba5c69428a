"""Item weights of the ProRubric authors' re-weighted atomic arms, from a rubric's own weights:

* ``weighted_atomic`` (their ``data/build_weighted_atomic.py``): ``w_i * m(label_i)``, the
  multiplier of the criterion's label (:data:`WEIGHT_LABEL_MULTIPLIERS`), read from its tags
  (``critical`` or ``weight:critical``, ...; none = ``normal``, their labeller's fallback too);
* ``grouped_mean`` (their ``data/build_grouped_mean.py``): each dimension's weight split back
  to its items, ``W_d |w_i| / sum_{j in I_d} |w_j|`` with the sign of ``w_i`` (with the default
  ``W_d = sum |w|`` this is ``w_i``: it differs only for weighted dimensions).

Both then take the clipped additive sum: over per-item checks (``rewards.rubric_scoring``,
aggregators ``weighted_atomic`` / ``grouped_mean``) or, as the authors judge them, the items
in one call (``rewards.dimension_judging``, arms ``weighted_atomic_official`` /
``grouped_mean_official``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rewards.rubric import Rubric

#: The ProRubric authors' Weighted arm (``data/build_weighted_atomic.py``): each atomic weight
#: times the multiplier of its label, read from the criterion's tags (``critical`` or
#: ``weight:critical``, ...); a criterion without a label is ``normal`` (their labeller's
#: fallback too).
WEIGHT_LABEL_MULTIPLIERS: Mapping[str, float] = {
    "critical": 3.0, "normal": 1.0, "format": 0.0, "duplicate": 0.0, "overclinical": -1.0}
#: Atomic arms whose item weights are re-derived before the clipped additive sum.
REWEIGHTED = ("weighted_atomic", "grouped_mean")


def _label_multiplier(tags: Sequence[str]) -> float:
    for t in tags:
        key = t.strip().lower().removeprefix("weight:")
        if key in WEIGHT_LABEL_MULTIPLIERS:
            return WEIGHT_LABEL_MULTIPLIERS[key]
    return WEIGHT_LABEL_MULTIPLIERS["normal"]


def reweighted(name: str, rubric: Rubric) -> tuple[float, ...]:
    """Item weights of a re-weighted atomic arm (both then take the clipped additive sum):

    * ``weighted_atomic``: ``w_i * m(label_i)``, ``m`` = ``WEIGHT_LABEL_MULTIPLIERS``;
    * ``grouped_mean`` (the authors' ``build_grouped_mean.py``): the dimension weight split back
      to its items, ``W_d |w_i| / sum_{j in I_d} |w_j|`` with the sign of ``w_i`` (with the
      default ``W_d = sum |w|`` this is ``w_i``: it differs only for weighted dimensions)."""
    if name == "weighted_atomic":
        return tuple(c.weight * _label_multiplier(c.tags) for c in rubric.criteria)
    if not rubric.dimensions:
        raise ValueError(f"aggregator {name!r} needs bundled rubrics but prompt "
                         f"{rubric.prompt_id!r} has no dimensions")
    out = list(rubric.weights)
    for d, wd in zip(rubric.dimensions, rubric.dimension_weights()):
        total = sum(abs(rubric.criteria[i].weight) for i in d.criteria)
        for i in d.criteria:
            w = rubric.criteria[i].weight
            out[i] = wd * abs(w) / total * (1.0 if w >= 0 else -1.0) if total else 0.0
    return tuple(out)
