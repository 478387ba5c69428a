"""Group-relative advantage estimators (GRPO, Dr.GRPO, RLOO, REINFORCE++-baseline) over
rewards of shape [num_groups, G], and GDPO's per-component normalisation of a reward with
several terms (:func:`gdpo_advantages`).

Every estimator takes ``(rewards, eps, std_ddof, token_counts=None)``; ``std_ddof``
(``algo.std_ddof``) is the delta degrees of freedom of GRPO's group std and unused by the
estimators without one; ``token_counts`` [N, G] (response tokens) weights REINFORCE++'s batch
whitening when ``algo.whiten=token`` and is unused by the others. The group-local ones
(GRPO, Dr.GRPO, RLOO: :data:`GROUP_LOCAL`) are written over the last axis, so one group [G]
is a valid input, and :func:`group_advantages` maps them over groups with ``jax.vmap``;
REINFORCE++'s and GDPO's whitening stays batch-wide. :func:`algo_advantages` is the batch's
advantages under the ``algo.*`` options, traceable: ``rl.grpo.reward_stage`` jits it with the
overlong shaping and the group statistics into one program.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from core.groups import homogeneous
from core.registry import Registry

AdvantageFn = Callable[..., jax.Array]  # (rewards, eps, std_ddof, token_counts=None)
ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")
#: estimators whose advantage of a trajectory reads its own group alone: :func:`group_advantages`
#: computes them one group at a time (``jax.vmap`` over groups); the others whiten batch-wide
GROUP_LOCAL: set[AdvantageFn] = set()
#: the ``eps`` of every std division (GRPO's group std, the batch whitening)
ADVANTAGE_EPS = 1e-6


def _group_local(fn: AdvantageFn) -> AdvantageFn:
    GROUP_LOCAL.add(fn)
    return fn


def _homogeneous(rewards: jax.Array) -> jax.Array:
    """[N, 1] bool: the group is homogeneous (``core.groups``: std_G <= 1e-6)."""
    return homogeneous(rewards, xp=jnp)[..., None]


@ADVANTAGES.register("grpo")
@_group_local
def grpo_advantages(rewards: jax.Array, eps: float = 1e-6, std_ddof: int = 1,
                    token_counts: jax.Array | None = None) -> jax.Array:
    """GRPO: ``A_i = (R_i - mean_G(R)) / (std_G(R) + eps)`` with
    ``std_G(R) = sqrt(sum_i (R_i - mean_G R)^2 / (G - std_ddof))``.

    ``std_ddof=1`` (default) is the sample std, as verl (``compute_grpo_outcome_advantage``:
    ``torch.std``, unbiased) and TRL (``GRPOTrainer``: ``rewards.view(-1, G).std(dim=1)``)
    compute it; ``std_ddof=0`` is the population std (this library's value before), which
    scales every advantage by ``sqrt(G / (G - 1))`` (rewards ``[[1, 0]]``: +-1.0 instead of
    +-0.707) and so also shifts the balance between the policy gradient and ``beta * KL``.
    A homogeneous group gets exactly 0 (not the rounding residue of ``R - mean``).
    """
    del token_counts
    rewards = jnp.asarray(rewards)
    centered = rewards - rewards.mean(axis=-1, keepdims=True)
    adv = centered / (rewards.std(axis=-1, keepdims=True, ddof=std_ddof) + eps)
    return jnp.where(_homogeneous(rewards), 0.0, adv)


@ADVANTAGES.register("drgrpo", "none")
@_group_local
def drgrpo_advantages(rewards: jax.Array, eps: float = 1e-6, std_ddof: int = 1,
                      token_counts: jax.Array | None = None) -> jax.Array:
    """Dr.GRPO (``scale=none``): ``A_i = R_i - mean_G(R)``; ``eps`` and ``std_ddof`` are
    unused (no std division).

    A homogeneous group gets exactly 0.
    """
    del eps, std_ddof, token_counts
    rewards = jnp.asarray(rewards)
    adv = rewards - rewards.mean(axis=-1, keepdims=True)
    return jnp.where(_homogeneous(rewards), 0.0, adv)


@ADVANTAGES.register("rloo")
@_group_local
def rloo_advantages(rewards: jax.Array, eps: float = 1e-6, std_ddof: int = 1,
                    token_counts: jax.Array | None = None) -> jax.Array:
    """RLOO (Ahmadian et al. 2024, "Back to Basics"): each trajectory's baseline is the mean
    of the group's others, ``A_i = R_i - (sum_j R_j - R_i) / (G - 1) = G / (G - 1) *
    (R_i - mean_G R)`` (verl's ``compute_rloo_outcome_advantage``, TRL's RLOO). No std."""
    del eps, std_ddof, token_counts
    rewards = jnp.asarray(rewards)
    g = rewards.shape[-1]
    if g < 2:
        raise ValueError(f"rloo needs groups of >= 2 trajectories, got {g}")
    others = (rewards.sum(axis=-1, keepdims=True) - rewards) / (g - 1)
    return jnp.where(_homogeneous(rewards), 0.0, rewards - others)


@ADVANTAGES.register("reinforce_plus_plus_baseline", "reinforce_pp")
def reinforce_pp_baseline_advantages(rewards: jax.Array, eps: float = 1e-6,
                                     std_ddof: int = 1,
                                     token_counts: jax.Array | None = None) -> jax.Array:
    """REINFORCE++-baseline (Hu et al. 2025, arXiv:2501.03262; verl's
    ``compute_reinforce_plus_plus_baseline_outcome_advantage``): subtract the group mean,
    then whiten over the whole batch, ``A = (c - m) / (s + eps)`` with ``c_i = R_i - mean_G R``.

    Without ``token_counts`` (``algo.whiten=trajectory``) every trajectory counts once:
    ``m = mean(c)``, ``s = std(c, ddof=std_ddof)``. With ``token_counts`` ``l_i``
    (``algo.whiten=token``, verl's: it whitens the per-token copies with ``masked_whiten``)
    trajectory ``i`` counts ``l_i`` times: ``m = sum_i l_i c_i / L``,
    ``s^2 = sum_i l_i (c_i - m)^2 / (L - std_ddof)``, ``L = sum_i l_i`` (verl's unbiased
    ``masked_var`` is ``std_ddof=1``). A homogeneous group keeps 0 (the formula would give it
    ``-m / s`` under token weights)."""
    rewards = jnp.asarray(rewards)
    centred = rewards - rewards.mean(axis=-1, keepdims=True)
    if token_counts is None:
        adv = (centred - centred.mean()) / (centred.std(ddof=std_ddof) + eps)
    else:
        w = jnp.asarray(token_counts, centred.dtype)
        total = w.sum()
        mean = (w * centred).sum() / total
        var = (w * (centred - mean) ** 2).sum() / jnp.maximum(total - std_ddof, 1.0)
        adv = (centred - mean) / (jnp.sqrt(var) + eps)
    return jnp.where(_homogeneous(rewards), 0.0, adv)


def gdpo_advantages(components: jax.Array, weights: jax.Array, eps: float = ADVANTAGE_EPS,
                    std_ddof: int = 1) -> jax.Array:
    """GDPO (Liu et al. 2026, "Group reward-Decoupled Normalization Policy Optimization",
    arXiv:2601.05242; NVlabs/GDPO's verl and TRL versions): normalise each reward component
    within its group first, then sum and whiten over the batch::

        A_k = grpo(r_k)                      # (r_k - mean_G r_k) / (std_G r_k + eps)
        S = sum_k w_k A_k
        A = (S - mean_batch S) / (std_batch S + eps)

    ``components`` [K, N, G], ``weights`` [K]. Summing first (GRPO on ``sum_k r_k``) lets the
    term with the larger spread decide every advantage; here each counts by ``w_k`` alone. A
    component homogeneous in a group contributes 0 there; a group homogeneous in every
    component keeps 0 (not ``-mean/std`` of the batch). ``A_k`` is computed one group at a
    time (:func:`per_group`), the sum's whitening over the batch."""
    components = jnp.asarray(components)
    per = jax.vmap(lambda r: per_group(grpo_advantages, r, eps, std_ddof))(components)
    summed = jnp.tensordot(jnp.asarray(weights, per.dtype), per, axes=1)
    adv = (summed - summed.mean()) / (summed.std(ddof=std_ddof) + eps)
    flat = jnp.all(jax.vmap(_homogeneous)(components), axis=0)
    return jnp.where(flat, 0.0, adv)


def per_group(fn: AdvantageFn, rewards: jax.Array, eps: float, std_ddof: int) -> jax.Array:
    """A group-local estimator ``fn`` (:data:`GROUP_LOCAL`) on rewards [N, G], written for one
    group [G] and mapped over the N groups with ``jax.vmap``."""
    return jax.vmap(lambda group: fn(group, eps, std_ddof))(jnp.asarray(rewards))


def group_advantages(rewards: jax.Array, estimator: str = "grpo", eps: float = ADVANTAGE_EPS,
                     std_ddof: int = 1, token_counts: jax.Array | None = None) -> jax.Array:
    """Advantages [N, G] from rewards [N, G] with the estimator registered as ``estimator``
    (``std_ddof``: see :func:`grpo_advantages`; ``token_counts``: see
    :func:`reinforce_pp_baseline_advantages`): a group-local one group by group
    (:func:`per_group`), a batch-wide one (REINFORCE++'s whitening) on the whole batch."""
    fn = ADVANTAGES.get(estimator)
    if fn in GROUP_LOCAL:
        return per_group(fn, rewards, eps, std_ddof)
    return fn(rewards, eps, std_ddof, token_counts)


def algo_advantages(algo: Any, rewards: jax.Array, outcome: jax.Array,
                    token_counts: jax.Array, eps: float = ADVANTAGE_EPS) -> jax.Array:
    """The training batch's advantages [N, G] under ``algo`` (its ``advantage``, ``std_ddof``,
    ``whiten``, ``reward_components``, ``component_weights``), traceable under ``jax.jit``:
    ``algo.reward_components=sum`` gives ``algo.advantage`` of the total reward; ``gdpo``
    normalises the outcome and the rest of the reward (``rewards - outcome``: a rubric or
    process term, overlong shaping) apart, weighted by ``algo.component_weights``
    (:func:`gdpo_advantages`). ``algo.whiten=token`` weights REINFORCE++'s whitening by
    ``token_counts``."""
    rewards = jnp.asarray(rewards, jnp.float32)
    if algo.reward_components == "gdpo":
        outcome = jnp.asarray(outcome, jnp.float32)
        parts = jnp.stack([outcome, rewards - outcome])
        return gdpo_advantages(parts, jnp.asarray(algo.component_weights, jnp.float32), eps,
                               std_ddof=algo.std_ddof)
    counts = jnp.asarray(token_counts) if algo.whiten == "token" else None
    return group_advantages(rewards, algo.advantage, eps, std_ddof=algo.std_ddof,
                            token_counts=counts)


def batch_advantages(algo: Any, rewards: np.ndarray, outcome: np.ndarray,
                     token_counts: np.ndarray) -> np.ndarray:
    """:func:`algo_advantages` run eagerly, on the host as a NumPy array (the training step
    runs it inside ``rl.grpo.reward_stage``'s one jitted program)."""
    return np.asarray(algo_advantages(algo, jnp.asarray(rewards), jnp.asarray(outcome),
                                      jnp.asarray(token_counts)))
