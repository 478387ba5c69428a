"""Jittable per-step group metrics over rewards / outcomes of shape [N, G]."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from core.groups import HOMOGENEOUS_TOL, homogeneous


def homogeneous_groups(rewards: jax.Array, tol: float = HOMOGENEOUS_TOL) -> jax.Array:
    """[N] bool: ``std_G(R) <= tol`` (population std; ``core.groups``)."""
    return homogeneous(rewards, tol, xp=jnp)


def homogeneous_frac(rewards: jax.Array, tol: float = HOMOGENEOUS_TOL) -> jax.Array:
    """Fraction of groups with ``std_G(R) <= tol``."""
    return jnp.mean(homogeneous_groups(rewards, tol).astype(jnp.float32))


def all_wrong_frac(outcome: jax.Array, wrong_threshold: float = 0.0) -> jax.Array:
    """Fraction of groups where every member has ``outcome <= wrong_threshold``.

    With the default threshold 0 this counts groups that are all F1 = 0 or invalid (-1).
    """
    return jnp.mean(jnp.all(outcome <= wrong_threshold, axis=-1).astype(jnp.float32))


def converted_frac(outcome: jax.Array, total: jax.Array,
                   tol: float = HOMOGENEOUS_TOL) -> jax.Array:
    """Among outcome-homogeneous groups, the fraction whose total reward has ``std > tol``.

    0 when no group is outcome-homogeneous.
    """
    homog = homogeneous_groups(outcome, tol)
    converted = homog & ~homogeneous_groups(total, tol)
    return jnp.sum(converted) / jnp.maximum(jnp.sum(homog), 1).astype(jnp.float32)

