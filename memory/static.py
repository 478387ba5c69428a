"""RaR-style ablation: a fixed rubric list, scored additively per trajectory (ARBOR's RaR ablation).

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
rubric per line (always for a ``.jsonl`` file, so a one-line file is one rubric). ``weight``
defaults to 1; RaR's string labels (Essential, Important, Optional, Pitfall) map via
``rewards.rubric.RAR_WEIGHT_LABELS``. Every error names the file and the line (JSON Lines) or
row (a JSON list, 1-based) and the field at fault.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from core.files import read_utf8
from judges.base import Judge
from judges.types import CheckRequest, CheckResult, Draft
from memory.gating import gated_total, paid_mask
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
    """A number, a numeric string, or a RaR label (case and a trailing "criteria" /
    "criterion" ignored); absent = 1. ``ValueError`` naming the allowed values otherwise."""
    if w is None:
        return 1.0
    if isinstance(w, int | float) and not isinstance(w, bool):
        value = float(w)
    else:
        s = str(w).strip()
        try:
            value = float(s)
        except ValueError:
            key = s.lower().removesuffix("criteria").removesuffix("criterion").strip()
            if key not in RAR_WEIGHT_LABELS:
                labels = ", ".join(k.capitalize() for k in RAR_WEIGHT_LABELS)
                raise ValueError(f"unknown weight {w!r}: give a number or one of {labels}"
                                 ) from None
            value = float(RAR_WEIGHT_LABELS[key])
    if not math.isfinite(value):
        raise ValueError(f"weight {w!r} is not finite")
    return value


def _rubric(row: Any, where: str) -> StaticRubric:
    """One rubric from one parsed row; ``where`` (file and line / row) prefixes every error."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: a rubric is a JSON object, got {type(row).__name__}")
    title = str(row.get("title", "") or "").strip()
    desc = str(row.get("description", row.get("criterion", "")) or "").strip()
    if not title and not desc:
        raise ValueError(f"{where}: empty 'title' and 'description'")
    try:
        weight = _weight(row.get("weight"))
    except ValueError as e:
        raise ValueError(f"{where}: field 'weight': {e}") from None
    return StaticRubric(title=title or desc, description=desc if title else "", weight=weight)


def parse_static_rubrics(
    rows: Sequence[dict[str, Any]], source: str = "static rubrics"
) -> tuple[StaticRubric, ...]:
    """Rubrics from parsed rows; a row without a title and a description, or with a bad
    weight, is an error naming ``source`` and the row (1-based)."""
    return _rubrics([(f"{source}: row {k + 1}", r) for k, r in enumerate(rows)], source)


def _rubrics(located: Sequence[tuple[str, Any]], source: str) -> tuple[StaticRubric, ...]:
    out = tuple(_rubric(row, where) for where, row in located)
    if not out:
        raise ValueError(f"{source}: no static rubrics")
    seen: dict[str, str] = {}
    for (where, _), r in zip(located, out):  # a rubric listed twice would count twice
        key = " ".join(f"{r.title} {r.description}".split()).casefold()
        if key in seen:
            raise ValueError(f"{where}: duplicate of {seen[key]} ({r.title[:80]!r})")
        seen[key] = where
    return out


def _json_lines(path: str, text: str) -> list[tuple[str, Any]]:
    rows = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append((f"{path}: line {lineno}", json.loads(line)))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: line {lineno} column {e.colno}: invalid JSON ({e.msg})"
                             ) from None
    return rows


def load_static_rubrics(path: str | os.PathLike[str]) -> tuple[StaticRubric, ...]:
    """Load a static rubric list (formats in the module docstring). A ``.jsonl`` file is read
    as JSON Lines, a ``.json`` file as one JSON value; any other name is tried as JSON, then
    as JSON Lines."""
    name = str(path)
    text = read_utf8(Path(path))
    suffix = Path(name).suffix.lower()
    if suffix == ".jsonl":
        return _rubrics(_json_lines(name, text), name)
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError as e:
        if suffix == ".json":
            raise ValueError(f"{name}: line {e.lineno} column {e.colno}: invalid JSON ({e.msg})"
                             ) from None
        return _rubrics(_json_lines(name, text), name)
    if isinstance(data, dict):
        listed = data.get("rubrics", data.get("rubric"))
        if isinstance(listed, list):
            data = listed
        elif {"title", "description", "criterion"} & set(data):
            data = [data]  # a single rubric (e.g. a one-line JSON Lines file)
        else:
            raise ValueError(f"{name}: a JSON object with neither a 'rubrics' / 'rubric' list "
                             "nor a rubric's 'title' / 'description'")
    if not isinstance(data, list):
        raise ValueError(f"{name}: expected a JSON list of rubrics, got {type(data).__name__}")
    return _rubrics([(f"{name}: row {k + 1}", r) for k, r in enumerate(data)], name)


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
    rubric_gate: str = "none",
    correct_at: float = 1.0,
) -> StaticOutput:
    """Score every trajectory against the fixed rubrics (one batched ``judge.check``); the
    rubric term paid as ``rubric_gate`` says (``memory.gating``)."""
    groups = list(groups)
    n_groups = len(groups)
    gmax = max((g.size for g in groups), default=0)
    norm = sum(abs(r.weight) for r in rubrics) or 1.0
    weights = np.array([r.weight for r in rubrics], dtype=np.float64)
    reqs = [CheckRequest(context=g.question, response=t, criterion=r.text())
            for g in groups for t in g.texts for r in rubrics]
    results: list[CheckResult | None] = list(judge.check(reqs)) if reqs else []
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
    paid = paid_mask(groups, rubric_gate, correct_at, cen.shape)
    total = gated_total(r_base, cen, paid, rubric_lambda)
    metrics = {
        "static/judge_calls_check": float(len(reqs)),
        "static/check_fallbacks": float(fallbacks),
        "static/nan_score_groups": float(nan_groups),
        "static/groups_too_small": float(too_small),
        **conversion_metrics(groups, total, "static/"),
    }
    return StaticOutput(total_rewards=total, raw=raw, centred=cen, metrics=metrics)
