"""Which trajectories the rubric term is paid to: all of them, or only those whose answer is
correct (``algo.rubric_gate``).

A rubric reward can be gamed by a trajectory whose answer is wrong: LongTraceRL
(arXiv:2605.31584) saw search policies list the retrieved passages' entities to inflate
their rubric scores, and stopped it with a "positive-only strategy", the rubric reward given
only on condition of a correct answer. ``positive_only`` is that rule as this library reads
it: a trajectory's rubric term (ARBOR's ``lambda * s~``, RaR's ``lambda * (s - mean_G s)``)
is kept when its outcome ``R_base`` reaches ``algo.correct_at`` and is 0 otherwise; ``R_base``
is untouched. ``algo.correct_at`` is the library's one definition of a correct answer, which
PROF's split (``rl.grpo.consistency``) and the gaming monitors (``rewards.gaming``) read too.
For ARBOR's outcome (``R_base`` = the answer's F1 with a valid format, -1 without) its default
1.0 means a valid format and every answer token right. The threshold is ours to choose (the
source gives none); the rubric memory's own statistics (admission, activation, drift) still
see every trajectory's score.

What the gate costs: ARBOR's most direct evidence is that the rubric term turns groups whose
answers are all wrong into groups with reward variance (``groups/converted_frac``); under
``positive_only`` an all-wrong group gets no rubric term, so that conversion is switched off
(only groups with some correct answers can be converted), and gaming among correct answers
(padding a right answer to please the rubric) stays open.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

RUBRIC_GATES = ("none", "positive_only")


def check_gate(gate: str, correct_at: float) -> None:
    if gate not in RUBRIC_GATES:
        raise ValueError(f"rubric_gate must be one of {list(RUBRIC_GATES)}, got {gate!r}")
    if not math.isfinite(correct_at):
        raise ValueError(f"correct_at must be a finite outcome value, got {correct_at}")


def paid_mask(groups: Sequence[Any], gate: str, correct_at: float,
              shape: tuple[int, int]) -> np.ndarray:
    """[N, G_max] bool: whose rubric term is paid. `groups`: ``memory.reward.GroupInput``
    (``r_base``); padding past a group's size is False."""
    check_gate(gate, correct_at)
    paid = np.zeros(shape, bool)
    for n, g in enumerate(groups):
        if gate == "none":
            paid[n, :g.size] = True
        else:
            paid[n, :g.size] = [r >= correct_at for r in g.r_base]
    return paid


def gated_total(r_base: np.ndarray, term: np.ndarray, paid: np.ndarray,
                rubric_lambda: float) -> np.ndarray:
    """``R_base + lambda * term`` where `paid`, ``R_base`` elsewhere (NaN padding stays NaN)."""
    return r_base + rubric_lambda * np.where(paid, term, np.where(np.isnan(term), np.nan, 0.0))
