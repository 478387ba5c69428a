"""Admission of query-local drafts into ``D`` (ARBOR, arXiv:2606.03239: admission).

A draft scored on its group's trajectories (scores ``s_i``, outcomes ``y_i``) is admitted
iff (ARBOR: ``Var_i(s_i) >= delta_v`` and ``Pearson({s_i}, {F1(tau_i)}) >= rho_min``)::

    Var_i(s_i) >= delta_v            (it discriminates; population variance, ddof = 0)
    Pearson(s, y) >= rho_min         (it points the same way as the outcome)

``y`` is ``MemoryConfig.rubric_outcome``: by default the token F1 of each trajectory's answer
(``GroupInput.f1``), as the paper states; "r_base" correlates with ``R_base`` (-1 for an
invalid format) instead.

Pearson is undefined when either side has zero variance (``<= 1e-12``). We define it as
``rho = 0`` there: such a draft fails the correlation gate unless ``rho_min <= 0``. In
particular a draft can never be admitted from an outcome-homogeneous group with ``rho_min > 0``
(the reward step therefore skips induction on those groups).

Gates are checked in this order and the first failure is the rejection reason:
``empty_text`` (title and description blank: nothing to score), ``group_too_small`` (< 2
members), ``judge_fallback`` (a member's score rests on judge fallbacks only: the judge failed,
so there is no evidence the draft discriminates), ``nan_scores`` (a non-finite score),
``low_variance``, ``low_correlation``. Scores are computed from real verdicts only (a fallback
verdict's defined score, e.g. P(met) = 0.5, never enters ``Var`` or ``Pearson``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from judges.types import Draft
from memory.events import Admitted, Event, Rejected
from memory.state import MIN_GROUP_SIZE, VAR_EPS, DraftRubric, MemoryConfig, RubricMemory


def pearson(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float:
    """Pearson correlation; 0.0 when undefined (fewer than 2 points or a zero-variance side).

    ``rho = sum((x - mx)(y - my)) / sqrt(sum((x - mx)^2) sum((y - my)^2))``, clipped to [-1, 1].
    """
    xa = np.asarray(x, dtype=np.float64)
    ya = np.asarray(y, dtype=np.float64)
    if xa.shape != ya.shape or xa.ndim != 1:
        raise ValueError("pearson: x and y must be 1-D of equal length")
    if xa.size < 2:
        return 0.0
    dx, dy = xa - xa.mean(), ya - ya.mean()
    vx, vy = float(np.mean(dx * dx)), float(np.mean(dy * dy))
    if vx <= VAR_EPS or vy <= VAR_EPS:
        return 0.0
    return float(np.clip(np.mean(dx * dy) / math.sqrt(vx * vy), -1.0, 1.0))


def is_empty(draft: Draft) -> bool:
    return not (draft.title or "").strip() and not (draft.description or "").strip()


@dataclass(frozen=True)
class AdmissionResult:
    """Outcome of the two gates. ``reason`` is None when admitted; ``var`` / ``rho`` are NaN
    when the draft was not scored."""

    admitted: bool
    reason: str | None
    var: float
    rho: float


def judge_admission(
    draft: Draft,
    scores: Sequence[float] | np.ndarray | None,
    outcome: Sequence[float] | np.ndarray,
    cfg: MemoryConfig,
    fallback_members: int = 0,
) -> AdmissionResult:
    """Apply the gates to one draft (``scores`` may be None when it was not scored;
    ``fallback_members`` counts members whose score rests on judge fallbacks only)."""
    nan = float("nan")
    if is_empty(draft):
        return AdmissionResult(False, "empty_text", nan, nan)
    if len(outcome) < MIN_GROUP_SIZE:
        return AdmissionResult(False, "group_too_small", nan, nan)
    if fallback_members > 0:
        return AdmissionResult(False, "judge_fallback", nan, nan)
    s = np.asarray(scores if scores is not None else [nan] * len(outcome), dtype=np.float64)
    if s.shape != (len(outcome),) or not np.all(np.isfinite(s)):
        return AdmissionResult(False, "nan_scores", nan, nan)
    var = float(np.var(s))
    rho = pearson(s, outcome)
    if var < cfg.delta_v:
        return AdmissionResult(False, "low_variance", var, rho)
    if rho < cfg.rho_min:
        return AdmissionResult(False, "low_correlation", var, rho)
    return AdmissionResult(True, None, var, rho)


@dataclass(frozen=True)
class Candidate:
    """A draft induced from group ``qid``, with its scores on that group (None = unscored).

    ``scores`` are evidence scores (real verdicts only, NaN where a member has none);
    ``fallback_members`` counts the members whose score the judge could only give as a
    fallback (rejected ``judge_fallback``)."""

    qid: str
    draft: Draft
    scores: tuple[float, ...] | None
    outcome: tuple[float, ...]
    fallback_members: int = 0


def admit(
    memory: RubricMemory,
    candidates: Sequence[Candidate],
    cfg: MemoryConfig,
    step: int,
    keep: bool = True,
) -> tuple[RubricMemory, tuple[DraftRubric, ...], tuple[Event, ...]]:
    """Run the gates on every candidate, in order.

    Returns the new memory (admitted drafts appended to ``D`` when ``keep``; with
    ``keep=False``, the "w/o memory" ablation, ``D`` is left as is but ids are still drawn),
    the admitted ``DraftRubric`` values, and one ``Admitted`` / ``Rejected`` event per candidate.
    """
    admitted: list[DraftRubric] = []
    events: list[Event] = []
    for c in candidates:
        res = judge_admission(c.draft, c.scores, c.outcome, cfg, c.fallback_members)
        if not res.admitted:
            events.append(Rejected(step=step, qid=c.qid, title=c.draft.title,
                                   reason=str(res.reason), var=res.var, rho=res.rho))
            continue
        did, memory = memory.new_id("d")
        dr = DraftRubric(id=did, draft=c.draft, qid=c.qid, step=step, var=res.var, rho=res.rho)
        admitted.append(dr)
        events.append(Admitted(step=step, draft_id=did, qid=c.qid, title=c.draft.title,
                               var=res.var, rho=res.rho))
    if keep and admitted:
        memory = replace(memory, drafts=memory.drafts + tuple(admitted))
    return memory, tuple(admitted), tuple(events)
