"""Group-relative advantage estimators (GRPO, Dr.GRPO) over rewards of shape [num_groups, G]."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from core.groups import homogeneous
from core.registry import Registry

AdvantageFn = Callable[[jax.Array, float], jax.Array]
ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")


def _homogeneous(rewards: jax.Array) -> jax.Array:
    """[N, 1] bool: the group is homogeneous (``core.groups``: std_G <= 1e-6)."""
    return homogeneous(rewards, xp=jnp)[..., None]


@ADVANTAGES.register("grpo")
def grpo_advantages(rewards: jax.Array, eps: float = 1e-6) -> jax.Array:
    """GRPO: ``A_i = (R_i - mean_G(R)) / (std_G(R) + eps)``, std is the population std (ddof=0).

    A homogeneous group gets exactly 0 (not the rounding residue of ``R - mean``).
    """
    rewards = jnp.asarray(rewards)
    centered = rewards - rewards.mean(axis=-1, keepdims=True)
    adv = centered / (rewards.std(axis=-1, keepdims=True) + eps)
    return jnp.where(_homogeneous(rewards), 0.0, adv)


@ADVANTAGES.register("drgrpo", "none")
def drgrpo_advantages(rewards: jax.Array, eps: float = 1e-6) -> jax.Array:
    """Dr.GRPO (``scale=none``): ``A_i = R_i - mean_G(R)``; ``eps`` is unused.

    A homogeneous group gets exactly 0.
    """
    del eps
    rewards = jnp.asarray(rewards)
    adv = rewards - rewards.mean(axis=-1, keepdims=True)
    return jnp.where(_homogeneous(rewards), 0.0, adv)


def group_advantages(rewards: jax.Array, estimator: str = "grpo", eps: float = 1e-6) -> jax.Array:
    """Advantages [N, G] from rewards [N, G] with the estimator registered as ``estimator``."""
    return ADVANTAGES.get(estimator)(rewards, eps)
