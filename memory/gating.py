"""Which trajectories the rubric term is paid to: all of them, or only those whose answer is
correct (``algo.rubric_gate``).

A rubric reward can be gamed by a trajectory whose answer is wrong: LongTraceRL
(arXiv:2605.31584) saw search policies list the retrieved passages' entities to inflate
their rubric scores, and stopped it with a "positive-only strategy", the rubric reward given
only on condition of a correct answer. ``positive_only`` is that rule as this library reads
it: a trajectory's rubric term (ARBOR's ``lambda * s~``, RaR's ``lambda * (s - mean_G s)``)
is kept when its format is valid and the F1 of its answer reaches ``algo.rubric_gate_f1``
(default 1.0: every answer token right), and is 0 otherwise; ``R_base`` is untouched. The
threshold is ours to choose (the source gives none); the rubric memory's own statistics
(admission, activation, drift) still see every trajectory's score.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

RUBRIC_GATES = ("none", "positive_only")


def check_gate(gate: str, f1_threshold: float) -> None:
    if gate not in RUBRIC_GATES:
        raise ValueError(f"rubric_gate must be one of {list(RUBRIC_GATES)}, got {gate!r}")
    if not 0.0 <= f1_threshold <= 1.0:
        raise ValueError(f"rubric_gate_f1 must be in [0, 1], got {f1_threshold}")


def paid_mask(groups: Sequence[Any], gate: str, f1_threshold: float,
              shape: tuple[int, int]) -> np.ndarray:
    """[N, G_max] bool: whose rubric term is paid. `groups`: ``memory.reward.GroupInput``
    (``valid``, ``f1``); padding past a group's size is False."""
    check_gate(gate, f1_threshold)
    paid = np.zeros(shape, bool)
    for n, g in enumerate(groups):
        if gate == "none":
            paid[n, :g.size] = True
        else:
            paid[n, :g.size] = [v and f >= f1_threshold for v, f in zip(g.valid, g.f1)]
    return paid


def gated_total(r_base: np.ndarray, term: np.ndarray, paid: np.ndarray,
                rubric_lambda: float) -> np.ndarray:
    """``R_base + lambda * term`` where `paid`, ``R_base`` elsewhere (NaN padding stays NaN)."""
    return r_base + rubric_lambda * np.where(paid, term, np.where(np.isnan(term), np.nan, 0.0))
