"""Per-token KL estimators between the policy and a frozen reference (Schulman's k1/k2/k3).

verl's names are accepted too (``verl/trainer/ppo/core_algos.py`` ``kl_penalty``): ``kl`` is
k1, ``mse`` is k2, ``low_var_kl`` is k3 (clamped to [-10, 10] as there), and ``abs`` is
``|logp - logp_ref|``, so a verl config's ``kl_loss_type`` is one override away.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from core.registry import Registry

KLFn = Callable[[jax.Array, jax.Array], jax.Array]
KL_ESTIMATORS: Registry[KLFn] = Registry("kl estimator")


@KL_ESTIMATORS.register("k1", "kl")
def kl_k1(logp: jax.Array, logp_ref: jax.Array) -> jax.Array:
    """``k1 = logp - logp_ref``."""
    return logp - logp_ref


@KL_ESTIMATORS.register("k2", "mse")
def kl_k2(logp: jax.Array, logp_ref: jax.Array) -> jax.Array:
    """``k2 = 0.5 * (logp - logp_ref)^2``."""
    return 0.5 * jnp.square(logp - logp_ref)


@KL_ESTIMATORS.register("abs")
def kl_abs(logp: jax.Array, logp_ref: jax.Array) -> jax.Array:
    """``|logp - logp_ref|`` (verl's ``abs``)."""
    return jnp.abs(logp - logp_ref)


@KL_ESTIMATORS.register("k3", "low_var_kl")
def kl_k3(logp: jax.Array, logp_ref: jax.Array) -> jax.Array:
    """``k3 = exp(logp_ref - logp) - (logp_ref - logp) - 1``, clamped to [-10, 10]."""
    # Clamping the log-ratio first keeps exp finite, so the backward pass never sees inf * 0.
    d = jnp.clip(logp_ref - logp, -20.0, 20.0)
    return jnp.clip(jnp.exp(d) - d - 1.0, -10.0, 10.0)


def kl_penalty(logp: jax.Array, logp_ref: jax.Array, kind: str = "k3") -> jax.Array:
    """Per-token KL estimate (same shape as ``logp``) with the estimator named ``kind``."""
    return KL_ESTIMATORS.get(kind)(logp, logp_ref)
