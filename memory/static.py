"""RaR-style ablation: a fixed rubric list, scored additively per trajectory (SPEC 3, ablations).

A static rubric ``k`` has a title, a description and a weight ``w_k`` (negative = pitfall: "met"
means the undesirable behaviour is present). Each trajectory ``i`` of a group is checked
against every rubric (``judge.check``, ``p_ik = P(met)``) and scored::

    s_i  = sum_k w_k p_ik / sum_k |w_k|        (in [-1, 1]; our normalisation, so that lambda
                                                 has the same scale as ARBOR's [0, 1] scores)
    s~_i = s_i - mean_G(s)
    R_total_i = R_base_i + lambda * s~_i

No memory, no induction: the same rubrics score every group. Groups of size < 2 get ``s~ = 0``;
a non-finite ``p_ik`` (malformed judge output) zeroes that group's rubric term, counted.

File formats (``load_static_rubrics``): a JSON list of ``{title, description, weight}``, a JSON
object with such a list under ``"rubrics"`` or ``"rubric"`` (a RaR row), or JSON Lines with one
rubric per line. ``weight`` defaults to 1; RaR's string labels (Essential, Important, Optional,
Pitfall) map via ``rewards.rubric.RAR_WEIGHT_LABELS``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from judges.base import Judge
from judges.types import CheckRequest, CheckResult, Draft
from memory.pairwise import centre
from memory.reward import GroupInput, conversion_metrics
from memory.state import MIN_GROUP_SIZE
from rewards.rubric import RAR_WEIGHT_LABELS


@dataclass(frozen=True)
class StaticRubric:
    title: str
    description: str
    weight: float = 1.0

    def text(self) -> str:
        """The criterion as shown to the judge (as ``Draft.text()``)."""
        return Draft(self.title, self.description).text()


def _weight(w: Any) -> float:
    if w is None:
        return 1.0
    if isinstance(w, int | float):
        return float(w)
    s = str(w).strip()
    try:
        return float(s)
    except ValueError:
        pass
    key = s.lower().removesuffix("criteria").removesuffix("criterion").strip()
    if key not in RAR_WEIGHT_LABELS:
        raise ValueError(f"unknown rubric weight {w!r}")
    return float(RAR_WEIGHT_LABELS[key])


def parse_static_rubrics(rows: Sequence[dict[str, Any]]) -> tuple[StaticRubric, ...]:
    """Rubrics from parsed rows; rows without a title and a description are an error."""
    out = []
    for k, r in enumerate(rows):
        title = str(r.get("title", "") or "").strip()
        desc = str(r.get("description", r.get("criterion", "")) or "").strip()
        if not title and not desc:
            raise ValueError(f"static rubric {k}: empty title and description")
        out.append(StaticRubric(title=title or desc, description=desc if title else "",
                                weight=_weight(r.get("weight"))))
    if not out:
        raise ValueError("no static rubrics")
    return tuple(out)


def load_static_rubrics(path: str | os.PathLike[str]) -> tuple[StaticRubric, ...]:
    """Load a static rubric list (formats in the module docstring)."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError:
        data = [json.loads(line) for line in text.splitlines() if line.strip()]
    if isinstance(data, dict):
        data = data.get("rubrics", data.get("rubric"))
        if not isinstance(data, list):
            raise ValueError(f"{path}: no 'rubrics' / 'rubric' list")
    return parse_static_rubrics(data)


@dataclass(frozen=True)
class StaticOutput:
    """``total_rewards`` / ``raw`` / ``centred``: [N, G] (NaN padding for ragged groups)."""

    total_rewards: np.ndarray
    raw: np.ndarray
    centred: np.ndarray
    metrics: dict[str, float]


def static_rubric_step(
    groups: Sequence[GroupInput],
    rubrics: Sequence[StaticRubric],
    judge: Judge,
    rubric_lambda: float = 0.1,
) -> StaticOutput:
    """Score every trajectory against the fixed rubrics (one batched ``judge.check``)."""
    groups = list(groups)
    n_groups = len(groups)
    gmax = max((g.size for g in groups), default=0)
    norm = sum(abs(r.weight) for r in rubrics) or 1.0
    weights = np.array([r.weight for r in rubrics], dtype=np.float64)
    reqs = [CheckRequest(context=g.question, response=t, criterion=r.text())
            for g in groups for t in g.texts for r in rubrics]
    results = list(judge.check(reqs)) if reqs else []
    results += [None] * (len(reqs) - len(results))
    probs = np.array([float(r.prob) if isinstance(r, CheckResult) else np.nan for r in results])
    fallbacks = sum(bool(getattr(r, "fallback", False)) for r in results)

    raw = np.full((n_groups, gmax), np.nan)
    cen = np.full((n_groups, gmax), np.nan)
    r_base = np.full((n_groups, gmax), np.nan)
    k = 0
    nan_groups = too_small = 0
    for n, g in enumerate(groups):
        p = probs[k:k + g.size * len(rubrics)].reshape(g.size, len(rubrics))
        k += g.size * len(rubrics)
        s = p @ weights / norm if len(rubrics) else np.zeros(g.size)
        raw[n, :g.size] = s
        r_base[n, :g.size] = g.r_base
        if g.size < MIN_GROUP_SIZE:
            too_small += 1
            cen[n, :g.size] = 0.0
        elif not np.all(np.isfinite(s)):
            nan_groups += 1
            cen[n, :g.size] = 0.0
        else:
            cen[n, :g.size] = centre(s)
    total = r_base + rubric_lambda * cen
    metrics = {
        "static/judge_calls_check": float(len(reqs)),
        "static/check_fallbacks": float(fallbacks),
        "static/nan_score_groups": float(nan_groups),
        "static/groups_too_small": float(too_small),
        **conversion_metrics(groups, total, "static/"),
    }
    return StaticOutput(total_rewards=total, raw=raw, centred=cen, metrics=metrics)
