"""Retirement statistics of common rubrics (ARBOR, arXiv:2606.03239: retirement).

One *activation* of a common rubric ``r`` is one batch in which it is active; it scores every
group of the batch (scores ``s`` in [0, 1], outcomes ``y``: ``MemoryConfig.rubric_outcome``,
by default the answer's token F1 as in the paper). Per activation::

    v = mean over groups g of Var_g(s)          (population variance; groups of >= 2 members
                                                 with finite scores only)
    n_r <- 0        if v >= delta_v             (it still discriminates)
    n_r <- n_r + 1  if v <  delta_v             (consecutive low-variance activations)
    rho_r <- Pearson over ALL pairs of all activations so far (running sums, see state.py)

Pairs added to ``rho_r`` (``MemoryConfig.rho_r``): "cumulative" (default; the paper's
"cumulative Pearson correlation over the whole activation period") the raw pairs
``(s_i, y_i)`` of every usable group; "centred" the within-group centred pairs
``(s_i - mean_g s, y_i - mean_g y)`` of groups whose outcome varies. An activation that adds
pairs is *informative*.

Retire ``r`` when, after an activation (ARBOR: "remove if n_r > k or rho_r < rho_min")::

    n_r > retire_k                                                   -> "mastered"
    rho_r defined, rho_r < rho_min, informative activations >= m     -> "drifted"

with ``m = MemoryConfig.min_drift_activations`` (default 1, the paper's rule; a larger ``m``
waits until ``rho_r`` rests on more than a batch or two). ``rho_r`` is undefined while one side
is constant (e.g. every activation so far saw only all-wrong groups): that says nothing about
the rubric's direction, so it is not drift (a rubric whose scores never vary is "mastered" by
``n_r``). "Mastered" is checked first. An activation with no usable group (all groups too
small or with NaN scores) changes nothing but ``uses`` (counted by selection).

Low variance cannot tell all-pass from all-fail: a rubric every trajectory meets and one none
meets both stop separating them (in pairwise judging both are all ties). So a low-variance
retirement is settled by the judge's pass rate (``settle_low_variance``): the reward step checks
the retiring rubric on the members of up to ``PASS_RATE_GROUPS`` of the step's groups
(``judge.check``, real verdicts only) and calls it "mastered" when at least
``MASTERED_PASS_RATE`` of them meet it, "abandoned" below (the policy gave up on what it asks,
or the rubric asks for something no trajectory does). Without a verdict it stays "mastered"
with no pass rate. Only mastered rubrics enter the lineage's order of mastery.

Only evidence counts: the reward step passes ``pairwise.evidence_scores`` (real verdicts only),
so a member compared through judge fallbacks alone has a NaN score and its group is not usable.
A judge outage therefore leaves ``n_r``, ``rho_r`` and the informative-activation count as they
were, instead of reading its fallback ties as "no variance" and "rho = 0".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from memory.events import Event, Retired
from memory.state import MIN_GROUP_SIZE, VAR_EPS, CommonRubric, MemoryConfig, RubricMemory

#: groups whose members the judge checks to settle a low-variance retirement
PASS_RATE_GROUPS = 8
#: the judge's pass rate at or above which a low-variance retirement is "mastered"
MASTERED_PASS_RATE = 0.5


@dataclass(frozen=True)
class GroupScores:
    """One group's scores under a rubric and its outcomes (same length)."""

    scores: tuple[float, ...]
    outcome: tuple[float, ...]


def _usable(g: GroupScores) -> bool:
    return (
        len(g.scores) == len(g.outcome) >= MIN_GROUP_SIZE
        and bool(np.all(np.isfinite(g.scores)))
        and bool(np.all(np.isfinite(g.outcome)))
    )


def activation_variance(groups: Sequence[GroupScores]) -> float | None:
    """Mean within-group population variance of the usable groups; None if there are none."""
    vs = [float(np.var(np.asarray(g.scores, dtype=np.float64))) for g in groups if _usable(g)]
    return float(np.mean(vs)) if vs else None


def update_stats(rubric: CommonRubric, groups: Sequence[GroupScores],
                 cfg: MemoryConfig) -> CommonRubric:
    """The rubric after one activation (``n_r``, running correlation sums, history)."""
    v = activation_variance(groups)
    if v is None:
        return rubric
    n_low = 0 if v >= cfg.delta_v else rubric.n_low_var + 1
    corr = rubric.corr
    informative = False
    for g in groups:
        if not _usable(g):
            continue
        s = np.asarray(g.scores, dtype=np.float64)
        y = np.asarray(g.outcome, dtype=np.float64)
        if cfg.rho_r == "centred":
            if float(np.var(y)) <= VAR_EPS:
                continue  # no information about direction in an outcome-homogeneous group
            s, y = s - s.mean(), y - y.mean()
        corr = corr.add(s.tolist(), y.tolist())
        informative = True
    hist = rubric.rho_history
    if cfg.rho_history_len > 0:
        hist = (hist + (corr.rho,))[-cfg.rho_history_len:]
    return replace(
        rubric,
        n_low_var=n_low,
        corr=corr,
        rho_activations=rubric.rho_activations + int(informative),
        rho_history=hist,
    )


def retirement_reason(rubric: CommonRubric, cfg: MemoryConfig) -> str | None:
    """"mastered", "drifted" or None (see module docstring)."""
    if rubric.n_low_var > cfg.retire_k:
        return "mastered"
    if (rubric.rho_activations >= cfg.min_drift_activations and rubric.corr.defined
            and rubric.rho < cfg.rho_min):
        return "drifted"
    return None


def apply_activation(
    memory: RubricMemory,
    rubric_id: str,
    groups: Sequence[GroupScores],
    cfg: MemoryConfig,
    step: int,
) -> tuple[RubricMemory, tuple[Event, ...]]:
    """Update ``rubric_id`` with one activation and retire it if a rule fires: it then moves
    from ``P`` to ``retired`` with ``retired_step`` / ``retired_reason`` set."""
    rubric = update_stats(memory.common(rubric_id), groups, cfg)
    reason = retirement_reason(rubric, cfg)
    if reason is None:
        return memory.with_common(rubric), ()
    gone = replace(rubric, retired_step=step, retired_reason=reason)
    new = replace(
        memory,
        commons=tuple(c for c in memory.commons if c.id != rubric_id),
        retired=memory.retired + (gone,),
    )
    event = Retired(step=step, common_id=rubric_id, reason=reason, n_low_var=rubric.n_low_var,
                    rho=rubric.rho, uses=rubric.uses)
    return new, (event,)


def settle_low_variance(memory: RubricMemory, event: Retired, pass_rate: float | None
                        ) -> tuple[RubricMemory, Retired]:
    """A "mastered" (low-variance) retirement read by the judge's pass rate of the retired
    rubric: "mastered" at or above ``MASTERED_PASS_RATE``, "abandoned" below, unchanged
    without one (module docstring); the pass rate recorded on the rubric and the event."""
    if event.reason != "mastered" or pass_rate is None:
        return memory, event
    reason = "mastered" if pass_rate >= MASTERED_PASS_RATE else "abandoned"
    retired = tuple(replace(c, retired_reason=reason, retired_pass_rate=pass_rate)
                    if c.id == event.common_id and c.retired_step == event.step else c
                    for c in memory.retired)
    return replace(memory, retired=retired), replace(event, reason=reason, pass_rate=pass_rate)
