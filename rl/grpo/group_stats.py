"""Jittable per-step group metrics over rewards / outcomes of shape [N, G].

Each predicate (``*_groups``) reads the last axis alone, so one group [G] is a valid input;
:func:`group_fractions` writes the step's statistics per group (:func:`group_flags`) and maps
them over the groups with ``jax.vmap`` (``rl.grpo.reward_stage`` runs it inside its jitted program).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from core.groups import HOMOGENEOUS_TOL, homogeneous


def homogeneous_groups(rewards: jax.Array, tol: float = HOMOGENEOUS_TOL) -> jax.Array:
    """[..., G] -> [...] bool: ``std_G(R) <= tol`` (population std; ``core.groups``)."""
    return homogeneous(rewards, tol, xp=jnp)


def all_wrong_groups(outcome: jax.Array, wrong_threshold: float = 0.0) -> jax.Array:
    """[..., G] -> [...] bool: every member has ``outcome <= wrong_threshold``."""
    return jnp.all(jnp.asarray(outcome) <= wrong_threshold, axis=-1)


def converted_groups(outcome: jax.Array, total: jax.Array,
                     tol: float = HOMOGENEOUS_TOL) -> jax.Array:
    """[..., G] -> [...] bool: outcome-homogeneous, but the total reward has ``std > tol`` (a
    rubric or process term gave the group a signal its outcome lacks)."""
    return homogeneous_groups(outcome, tol) & ~homogeneous_groups(total, tol)


def homogeneous_frac(rewards: jax.Array, tol: float = HOMOGENEOUS_TOL) -> jax.Array:
    """Fraction of groups with ``std_G(R) <= tol``."""
    return jnp.mean(homogeneous_groups(rewards, tol).astype(jnp.float32))


def all_wrong_frac(outcome: jax.Array, wrong_threshold: float = 0.0) -> jax.Array:
    """Fraction of groups where every member has ``outcome <= wrong_threshold``.

    With the default threshold 0 this counts groups that are all F1 = 0 or invalid (-1).
    """
    return jnp.mean(all_wrong_groups(outcome, wrong_threshold).astype(jnp.float32))


def converted_frac(outcome: jax.Array, total: jax.Array,
                   tol: float = HOMOGENEOUS_TOL) -> jax.Array:
    """Among outcome-homogeneous groups, the fraction whose total reward has ``std > tol``.

    0 when no group is outcome-homogeneous.
    """
    return _converted_share(homogeneous_groups(outcome, tol),
                            converted_groups(outcome, total, tol))


def _converted_share(homog: jax.Array, converted: jax.Array) -> jax.Array:
    """``sum(converted) / max(sum(homog), 1)`` over the groups' flags."""
    return jnp.sum(converted) / jnp.maximum(jnp.sum(homog), 1).astype(jnp.float32)


def group_flags(outcome: jax.Array, total: jax.Array) -> dict[str, jax.Array]:
    """One group's flags from its outcome [G] and total reward [G] (before length shaping)."""
    return {"homogeneous": homogeneous_groups(outcome),
            "total_homogeneous": homogeneous_groups(total),
            "all_wrong": all_wrong_groups(outcome),
            "converted": converted_groups(outcome, total)}


def group_fractions(outcome: jax.Array, total: jax.Array) -> dict[str, jax.Array]:
    """The step's ``groups/*`` statistics over [N, G]: :func:`group_flags` per group, mapped
    over the groups with ``jax.vmap``; the same values as :func:`homogeneous_frac` (of the
    outcome and of the total), :func:`all_wrong_frac` and :func:`converted_frac`."""
    flags = jax.vmap(group_flags)(jnp.asarray(outcome), jnp.asarray(total))
    mean = {k: jnp.mean(v.astype(jnp.float32)) for k, v in flags.items()}
    return {"groups/homogeneous_frac": mean["homogeneous"],
            "groups/total_homogeneous_frac": mean["total_homogeneous"],
            "groups/all_wrong_frac": mean["all_wrong"],
            "groups/converted_frac": _converted_share(flags["homogeneous"], flags["converted"])}
