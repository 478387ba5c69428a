"""Group-relative advantage estimators (GRPO, Dr.GRPO, RLOO, REINFORCE++-baseline) over
rewards of shape [num_groups, G].

Every estimator takes ``(rewards, eps, std_ddof)``; ``std_ddof`` (``algo.std_ddof``) is the
delta degrees of freedom of GRPO's group std and unused by the estimators without one.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from core.groups import homogeneous
from core.registry import Registry

AdvantageFn = Callable[[jax.Array, float, int], jax.Array]
ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")


def _homogeneous(rewards: jax.Array) -> jax.Array:
    """[N, 1] bool: the group is homogeneous (``core.groups``: std_G <= 1e-6)."""
    return homogeneous(rewards, xp=jnp)[..., None]


@ADVANTAGES.register("grpo")
def grpo_advantages(rewards: jax.Array, eps: float = 1e-6, std_ddof: int = 1) -> jax.Array:
    """GRPO: ``A_i = (R_i - mean_G(R)) / (std_G(R) + eps)`` with
    ``std_G(R) = sqrt(sum_i (R_i - mean_G R)^2 / (G - std_ddof))``.

    ``std_ddof=1`` (default) is the sample std, as verl (``compute_grpo_outcome_advantage``:
    ``torch.std``, unbiased) and TRL (``GRPOTrainer``: ``rewards.view(-1, G).std(dim=1)``)
    compute it; ``std_ddof=0`` is the population std (this library's value before), which
    scales every advantage by ``sqrt(G / (G - 1))`` (rewards ``[[1, 0]]``: +-1.0 instead of
    +-0.707) and so also shifts the balance between the policy gradient and ``beta * KL``.
    A homogeneous group gets exactly 0 (not the rounding residue of ``R - mean``).
    """
    rewards = jnp.asarray(rewards)
    centered = rewards - rewards.mean(axis=-1, keepdims=True)
    adv = centered / (rewards.std(axis=-1, keepdims=True, ddof=std_ddof) + eps)
    return jnp.where(_homogeneous(rewards), 0.0, adv)


@ADVANTAGES.register("drgrpo", "none")
def drgrpo_advantages(rewards: jax.Array, eps: float = 1e-6, std_ddof: int = 1) -> jax.Array:
    """Dr.GRPO (``scale=none``): ``A_i = R_i - mean_G(R)``; ``eps`` and ``std_ddof`` are
    unused (no std division).

    A homogeneous group gets exactly 0.
    """
    del eps, std_ddof
    rewards = jnp.asarray(rewards)
    adv = rewards - rewards.mean(axis=-1, keepdims=True)
    return jnp.where(_homogeneous(rewards), 0.0, adv)


@ADVANTAGES.register("rloo")
def rloo_advantages(rewards: jax.Array, eps: float = 1e-6, std_ddof: int = 1) -> jax.Array:
    """RLOO (Ahmadian et al. 2024, "Back to Basics"): each trajectory's baseline is the mean
    of the group's others, ``A_i = R_i - (sum_j R_j - R_i) / (G - 1) = G / (G - 1) *
    (R_i - mean_G R)`` (verl's ``compute_rloo_outcome_advantage``, TRL's RLOO). No std."""
    del eps, std_ddof
    rewards = jnp.asarray(rewards)
    g = rewards.shape[-1]
    if g < 2:
        raise ValueError(f"rloo needs groups of >= 2 trajectories, got {g}")
    others = (rewards.sum(axis=-1, keepdims=True) - rewards) / (g - 1)
    return jnp.where(_homogeneous(rewards), 0.0, rewards - others)


@ADVANTAGES.register("reinforce_plus_plus_baseline", "reinforce_pp")
def reinforce_pp_baseline_advantages(rewards: jax.Array, eps: float = 1e-6,
                                     std_ddof: int = 1) -> jax.Array:
    """REINFORCE++-baseline (Hu et al. 2025, arXiv:2501.03262; verl's
    ``compute_reinforce_plus_plus_baseline_outcome_advantage``): subtract the group mean,
    then whiten over the whole batch, ``A = (c - mean_batch c) / (std_batch c + eps)`` with
    ``c_i = R_i - mean_G R`` and the std over all trajectories (``std_ddof`` as GRPO's; verl
    whitens the per-token copies, weighting each trajectory by its length, here each counts
    once). A homogeneous group keeps 0: the group-centred values have batch mean 0."""
    rewards = jnp.asarray(rewards)
    centred = rewards - rewards.mean(axis=-1, keepdims=True)
    adv = (centred - centred.mean()) / (centred.std(ddof=std_ddof) + eps)
    return jnp.where(_homogeneous(rewards), 0.0, adv)


def group_advantages(rewards: jax.Array, estimator: str = "grpo", eps: float = 1e-6,
                     std_ddof: int = 1) -> jax.Array:
    """Advantages [N, G] from rewards [N, G] with the estimator registered as ``estimator``
    (``std_ddof``: see :func:`grpo_advantages`)."""
    return ADVANTAGES.get(estimator)(rewards, eps, std_ddof)
