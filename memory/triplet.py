"""Contrastive triplet of a query group (ARBOR, arXiv:2606.03239: contrastive induction).

For outcomes ``y`` (``MemoryConfig.rubric_outcome``: by default the answer's token F1, as the
paper ranks the triplet; or ``R_base``, F1 if the format is valid else -1)::

    tau+       = argmax_i y_i
    tau-_worst = argmin_i y_i
    tau-_hard  = argmax_{i : y_i != y(tau+)} y_i        (None if every y_i == y(tau+))

Ties in ``y`` are broken by a secondary signal (our choice, ``MemoryConfig.tie_break``). The
default "format_then_length" prefers a valid format, then a shorter response, then the lower
index, for the *better* end; the worst end uses the exact reverse order, so ``tau+ != tau-``
whenever the group has two or more members. In an outcome-homogeneous group (all ``y`` equal)
the whole triplet rests on the secondary signal and is flagged ``tied``.

Outcomes are compared with a tolerance of ``1e-9`` (F1 values are ratios of small integers; the
tolerance only guards against float noise).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from core.registry import Registry

TOL = 1e-9

#: tie-break policy -> key(valid, length, index); a SMALLER key is BETTER.
TieKey = Callable[[bool, int, int], tuple]
TIE_BREAKS: Registry[TieKey] = Registry("tie break")
TIE_BREAKS.register("format_then_length")(lambda v, n, i: (not v, n, i))
TIE_BREAKS.register("length")(lambda v, n, i: (n, i))
TIE_BREAKS.register("format")(lambda v, n, i: (not v, i))
TIE_BREAKS.register("index")(lambda v, n, i: (i,))


@dataclass(frozen=True)
class Triplet:
    """Member indices of the contrastive triplet. ``tied``: the group is outcome-homogeneous,
    so best and worst were chosen by the tie-break signal alone."""

    best: int
    hard: int | None
    worst: int
    tied: bool


def select_triplet(
    outcome: Sequence[float],
    valid: Sequence[bool] | None = None,
    lengths: Sequence[int] | None = None,
    tie_break: str = "format_then_length",
) -> Triplet | None:
    """The triplet of one group, or ``None`` for a group of fewer than two members.

    ``valid`` defaults to ``outcome >= 0`` and ``lengths`` to all zeros.
    """
    n = len(outcome)
    if n < 2:
        return None
    y = [float(v) for v in outcome]
    ok = list(valid) if valid is not None else [v >= 0 for v in y]
    ln = list(lengths) if lengths is not None else [0] * n
    if len(ok) != n or len(ln) != n:
        raise ValueError("select_triplet: outcome, valid and lengths differ in length")
    key2 = TIE_BREAKS.get(tie_break)

    def key(i: int) -> tuple:  # smaller = better
        return (-y[i], *key2(bool(ok[i]), int(ln[i]), i))

    order = sorted(range(n), key=key)
    best, worst = order[0], order[-1]
    hard = next((i for i in order if abs(y[i] - y[best]) > TOL), None)
    return Triplet(best=best, hard=hard, worst=worst, tied=abs(y[best] - y[worst]) <= TOL)
