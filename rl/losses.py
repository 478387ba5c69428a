"""PPO-clip policy loss, masked reductions, loss aggregation modes and entropy."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from core.registry import Registry

AggFn = Callable[..., jax.Array]
Axis = int | tuple[int, ...] | None
LOSS_AGG: Registry[AggFn] = Registry("loss aggregation mode")


def masked_sum(x: jax.Array, mask: jax.Array, axis: Axis = None) -> jax.Array:
    """``sum(x * mask)`` over ``axis``; masked entries never contribute (even if inf/NaN)."""
    mask = jnp.broadcast_to(mask, x.shape).astype(bool)
    return jnp.sum(jnp.where(mask, x, 0.0), axis=axis)


def masked_mean(x: jax.Array, mask: jax.Array, axis: Axis = None) -> jax.Array:
    """``sum(x * mask) / sum(mask)`` over ``axis``; 0 where the mask is empty."""
    count = masked_sum(jnp.ones_like(x), mask, axis=axis)
    return masked_sum(x, mask, axis=axis) / jnp.maximum(count, 1.0)


def ppo_clip_loss(
    logp: jax.Array,
    logp_old: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Per-token PPO-clip loss [B, T] (0 on masked tokens) and stats.

    ``ratio = exp(logp - logp_old)``,
    ``L = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)``;
    with dual clip ``c > 1``: ``L = min(L, -c * A)`` where ``A < 0`` (verl's compute_policy_loss).
    ``advantages`` is [B] (broadcast over tokens) or [B, T].
    Stats (masked means): ``clip_frac`` (clipped branch active), ``dual_clip_frac``,
    ``approx_kl = mean(logp_old - logp)``.
    """
    if isinstance(dual_clip, int | float) and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    adv = advantages[:, None] if advantages.ndim == logp.ndim - 1 else advantages
    mask = jnp.broadcast_to(mask, logp.shape).astype(bool)
    # Clamped like verl so a stale token cannot overflow exp; irrelevant for sane ratios.
    log_ratio = jnp.clip(logp - logp_old, -20.0, 20.0)
    ratio = jnp.exp(log_ratio)
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    loss = jnp.maximum(loss_unclipped, loss_clipped)
    clipped = loss_clipped > loss_unclipped
    if dual_clip is None:
        dual = jnp.zeros_like(clipped)
    else:
        cap = -adv * dual_clip
        dual = (adv < 0) & (loss > cap)
        loss = jnp.where(adv < 0, jnp.minimum(loss, cap), loss)
    stats = {
        "clip_frac": masked_mean(clipped.astype(logp.dtype), mask),
        "dual_clip_frac": masked_mean(dual.astype(logp.dtype), mask),
        "approx_kl": masked_mean(logp_old - logp, mask),
    }
    stats = jax.lax.stop_gradient(stats)
    return jnp.where(mask, loss, 0.0), stats


def _over_seqs(per_seq: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(sum of per-sequence values, count) over sequences with at least one unmasked token."""
    has_tokens = jnp.any(mask.astype(bool), axis=-1)
    return masked_sum(per_seq, has_tokens), jnp.sum(has_tokens, dtype=per_seq.dtype)


# Each mode is a sum over units (tokens or sequences) divided by their count. A mode returns
# the two parts, so that micro-batches of one mini-batch can share the mini-batch's count and
# add up to exactly its loss (see agg_loss's `count`).


@LOSS_AGG.register("token-mean")
def agg_token_mean(per_token: jax.Array, mask: jax.Array,
                   max_len: int | None = None) -> tuple[jax.Array, jax.Array]:
    """``sum_{b,t} m L / sum_{b,t} m`` over the whole batch."""
    return masked_sum(per_token, mask), masked_sum(jnp.ones_like(per_token), mask)


@LOSS_AGG.register("seq-mean-token-mean")
def agg_seq_mean_token_mean(per_token: jax.Array, mask: jax.Array,
                            max_len: int | None = None) -> tuple[jax.Array, jax.Array]:
    """``mean_b (sum_t m L / sum_t m)`` over sequences with at least one token."""
    return _over_seqs(masked_mean(per_token, mask, axis=-1), mask)


@LOSS_AGG.register("seq-mean-token-sum")
def agg_seq_mean_token_sum(per_token: jax.Array, mask: jax.Array,
                           max_len: int | None = None) -> tuple[jax.Array, jax.Array]:
    """``mean_b (sum_t m L)`` over sequences with at least one token."""
    return _over_seqs(masked_sum(per_token, mask, axis=-1), mask)


@LOSS_AGG.register("seq-mean-token-sum-norm")
def agg_seq_mean_token_sum_norm(per_token: jax.Array, mask: jax.Array,
                                max_len: int | None = None) -> tuple[jax.Array, jax.Array]:
    """``mean_b (sum_t m L / max_len)`` (Dr.GRPO); ``max_len`` defaults to ``T``."""
    norm = per_token.shape[-1] if max_len is None else max_len
    return _over_seqs(masked_sum(per_token, mask, axis=-1) / norm, mask)


def agg_loss(per_token: jax.Array, mask: jax.Array, mode: str = "token-mean",
             max_len: int | None = None, count: jax.Array | None = None) -> jax.Array:
    """Scalar loss from per-token losses [B, T] and mask [B, T]; 0 when the mask is empty.

    ``count`` replaces the mode's own count of units (tokens or sequences) in the division:
    a micro-batch divided by its mini-batch's count (:func:`agg_count`) contributes its share,
    and the micro-batches' losses add up to the mini-batch's."""
    total, own = LOSS_AGG.get(mode)(per_token, mask, max_len=max_len)
    return total / jnp.maximum(own if count is None else count, 1.0)


def agg_count(mask: jax.Array, mode: str = "token-mean") -> jax.Array:
    """The number of units (tokens or sequences) that ``mode`` averages over in ``mask``."""
    return LOSS_AGG.get(mode)(jnp.zeros(mask.shape), mask)[1]

