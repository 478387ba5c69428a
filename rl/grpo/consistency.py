"""Consistency filtering: PROF, the PRocess cOnsistency Filter (Ye et al., "Beyond
Correctness: Harmonizing Process and Outcome Rewards through RL Training", arXiv:2509.03403),
``algo.consistency_filter=prof``.

A weighted sum of a process and an outcome reward (ARBOR's ``R_base + lambda * s~``) also pays
right answers reached by a wrong process. PROF does not add the process score to the reward;
it uses it to choose which trajectories a group trains on. In each group of G it removes
``algo.consistency_remove`` of them (r): the correct ones the process score supports least and
the wrong ones it supports most, with the counts chosen to balance correct and wrong:

    P, W = the group's correct and wrong trajectories, delta = |P| - |W|
    r_P  = min(r, round((delta + r) / 2))            (Python's round: half to even)
    r_P > 0:  remove the min(r_P, |P|) correct ones of lowest process score, then the
              r - (those) wrong ones of highest process score
    r_P <= 0: remove the min(r, |W|) wrong ones of highest process score

This is the authors' rule as their training code applies it (``filter_trajectories`` in
amazon-science/PROF-GRPO, "Both" variant: it ranks each side by its mean step value v in
[0, 1] made signed by the outcome, ``(2v - 1)(2y - 1)``; an order-preserving map of our score
gives the same ranks), with ties removed in group order as their stable sort does. It removes
exactly r from every group (the arithmetic above never runs out of trajectories), so the
update trains on [N, G - r] trajectories, one shape every step, and the advantages are
computed over the kept ones alone, as theirs are (they drop the rows before the advantage).

The kept trajectories are paid their outcome ``R_base`` alone, as PROF's are (its reward is
the outcome reward; the process score only chooses): ``algo.consistency_reward=outcome``, the
default. ``total`` keeps the rewarder's ``R_base + lambda * s~``, which pays the process score
twice (once in the choice, once in the reward) and is not PROF.

What this library reads as the process score is the rubric rewarder's per-trajectory term
(``per_traj[...]["rubric_score"]``: ARBOR's ``s~``, RaR's ``s - mean_G s``); a trajectory
counts as correct when its outcome (``R_base``) reaches ``algo.correct_at``. A
missing score (its judge call failed) is read as the least consistent on either side, so it
goes first. Their step-count penalty (``len_step_reward_coef``) has no counterpart: our
process scores are per trajectory, not per reasoning step.
"""

from __future__ import annotations

import numpy as np

CONSISTENCY_FILTERS = ("none", "prof")
# what the kept trajectories are paid (module docstring)
CONSISTENCY_REWARDS = ("outcome", "total")
# rewarders that report a per-trajectory process score (rl.rewarders.arbor's per_traj)
PROCESS_SCORED = ("arbor", "static_rubrics")


def prof_keep(process: np.ndarray, correct: np.ndarray, remove: int) -> np.ndarray:
    """[N, G] bool: the trajectories PROF keeps (module docstring) from [N, G] process scores
    (NaN: none) and [N, G] correctness, removing `remove` per group."""
    process, correct = np.asarray(process, np.float64), np.asarray(correct, bool)
    keep = np.ones(process.shape, bool)
    for n in range(process.shape[0]):
        right, wrong = np.flatnonzero(correct[n]), np.flatnonzero(~correct[n])
        r = min(remove, process.shape[1])
        if r <= 0:
            continue
        from_right = min(r, round((len(right) - len(wrong) + r) / 2))
        if from_right > 0:
            from_right = min(from_right, len(right))
            support = np.nan_to_num(process[n, right], nan=-np.inf)
            keep[n, right[np.argsort(support, kind="stable")[:from_right]]] = False
            from_wrong = min(r - from_right, len(wrong))
        else:
            from_wrong = min(r, len(wrong))
        support = np.nan_to_num(process[n, wrong], nan=np.inf)
        keep[n, wrong[np.argsort(-support, kind="stable")[:from_wrong]]] = False
    return keep


def prof_metrics(keep: np.ndarray, correct: np.ndarray) -> dict[str, float]:
    """``prof/*``: how many correct and wrong trajectories the filter removed, and the share
    of correct ones before and after it."""
    keep, correct = np.asarray(keep, bool), np.asarray(correct, bool)
    return {"prof/removed_correct": float((~keep & correct).sum()),
            "prof/removed_wrong": float((~keep & ~correct).sum()),
            "prof/correct_frac_before": float(correct.mean()),
            "prof/correct_frac_after": float(correct[keep].mean())}
