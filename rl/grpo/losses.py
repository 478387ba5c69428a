"""Policy losses by name (PPO-clip, GSPO, GSPO-token, CISPO), masked reductions and loss
aggregation modes.

Every policy loss takes ``(logp, logp_old, advantages, mask, eps_low, eps_high, dual_clip)``
and returns the per-token loss [B, T] (0 on masked tokens) and its stats (``clip_frac``,
``dual_clip_frac``, ``approx_kl``); ``algo.policy_loss`` picks one from ``POLICY_LOSSES``."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from core.registry import Registry

AggFn = Callable[..., tuple[jax.Array, jax.Array]]  # (sum over units, their count)
Axis = int | tuple[int, ...] | None
LOSS_AGG: Registry[AggFn] = Registry("loss aggregation mode")
PolicyLoss = Callable[..., tuple[jax.Array, dict[str, jax.Array]]]
POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")
LOG_RATIO_CAP = 20.0  # clamp on log-ratios, as verl, so a stale token cannot overflow exp


def masked_sum(x: jax.Array, mask: jax.Array, axis: Axis = None) -> jax.Array:
    """``sum(x * mask)`` over ``axis``; masked entries never contribute (even if inf/NaN)."""
    mask = jnp.broadcast_to(mask, x.shape).astype(bool)
    return jnp.sum(jnp.where(mask, x, 0.0), axis=axis)


def masked_mean(x: jax.Array, mask: jax.Array, axis: Axis = None) -> jax.Array:
    """``sum(x * mask) / sum(mask)`` over ``axis``; 0 where the mask is empty."""
    count = masked_sum(jnp.ones_like(x), mask, axis=axis)
    return masked_sum(x, mask, axis=axis) / jnp.maximum(count, 1.0)


@POLICY_LOSSES.register("ppo")
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
    adv = _per_token(advantages, logp)
    mask = jnp.broadcast_to(mask, logp.shape).astype(bool)
    # Clamped like verl so a stale token cannot overflow exp; irrelevant for sane ratios.
    ratio = jnp.exp(jnp.clip(logp - logp_old, -LOG_RATIO_CAP, LOG_RATIO_CAP))
    loss, clipped = _clip_objective(ratio, adv, eps_low, eps_high)
    if dual_clip is None:
        dual = jnp.zeros_like(clipped)
    else:
        cap = -adv * dual_clip
        dual = (adv < 0) & (loss > cap)
        loss = jnp.where(adv < 0, jnp.minimum(loss, cap), loss)
    return jnp.where(mask, loss, 0.0), _stats(clipped, dual, logp_old, logp, mask)


def _clip_objective(ratio: jax.Array, adv: jax.Array, eps_low: float, eps_high: float
                    ) -> tuple[jax.Array, jax.Array]:
    """``max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))`` and where the clipped term wins."""
    unclipped = -adv * ratio
    clipped = -adv * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    return jnp.maximum(unclipped, clipped), clipped > unclipped


def _stats(clipped: jax.Array, dual: jax.Array, logp_old: jax.Array, logp: jax.Array,
           mask: jax.Array) -> dict[str, jax.Array]:
    """A policy loss's stats (masked token means), outside the gradient."""
    return jax.lax.stop_gradient({
        "clip_frac": masked_mean(clipped.astype(logp.dtype), mask),
        "dual_clip_frac": masked_mean(dual.astype(logp.dtype), mask),
        "approx_kl": masked_mean(logp_old - logp, mask)})


def _per_token(advantages: jax.Array, logp: jax.Array) -> jax.Array:
    return advantages[:, None] if advantages.ndim == logp.ndim - 1 else advantages


def _no_dual_clip(name: str, dual_clip: float | None) -> None:
    if dual_clip is not None:
        raise ValueError(f"algo.dual_clip is a PPO-clip option; {name} has none (set null)")


def _clipped_ratio_loss(ratio: jax.Array, adv: jax.Array, logp_old: jax.Array,
                        logp: jax.Array, mask: jax.Array, eps_low: float, eps_high: float
                        ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """``max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))`` per token and its stats."""
    mask = jnp.broadcast_to(mask, logp.shape).astype(bool)
    loss, clipped = _clip_objective(ratio, adv, eps_low, eps_high)
    return jnp.where(mask, loss, 0.0), _stats(clipped, jnp.zeros_like(clipped), logp_old,
                                              logp, mask)


def _sequence_log_ratio(logp: jax.Array, logp_old: jax.Array, mask: jax.Array) -> jax.Array:
    """[B] ``mean_t (logp - logp_old)`` over each sequence's response tokens (GSPO's log s_i)."""
    maskf = jnp.broadcast_to(mask, logp.shape).astype(logp.dtype)
    return masked_mean(logp - logp_old, maskf, axis=-1)


@POLICY_LOSSES.register("gspo")
def gspo_loss(logp: jax.Array, logp_old: jax.Array, advantages: jax.Array, mask: jax.Array,
              eps_low: float = 3e-4, eps_high: float = 4e-4, dual_clip: float | None = None
              ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """GSPO (Zheng et al. 2025, arXiv:2507.18071, eq. 5-7): the sequence-level importance
    ratio ``s_i = exp(mean_t (logp - logp_old))`` over the response's tokens, clipped per
    sequence: ``L_i = -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)``, written on every
    token of the sequence (so ``seq-mean-token-mean`` gives the paper's ``mean_i L_i``; the
    paper's ranges are 3e-4 / 4e-4). Advantages [B] (sequence-level, as GSPO defines them)."""
    _no_dual_clip("gspo", dual_clip)
    log_s = _sequence_log_ratio(logp, logp_old, mask)
    ratio = jnp.exp(jnp.minimum(log_s, 10.0))[:, None]  # verl caps log s at 10
    return _clipped_ratio_loss(jnp.broadcast_to(ratio, logp.shape), _per_token(advantages, logp),
                               logp_old, logp, mask, eps_low, eps_high)


@POLICY_LOSSES.register("gspo_token")
def gspo_token_loss(logp: jax.Array, logp_old: jax.Array, advantages: jax.Array,
                    mask: jax.Array, eps_low: float = 3e-4, eps_high: float = 4e-4,
                    dual_clip: float | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """GSPO-token (arXiv:2507.18071, eq. 13-14; verl's ``compute_policy_loss_gspo``):
    ``s_{i,t} = sg[s_i] * pi(y_t) / sg[pi(y_t)]``, equal to ``s_i`` in value, clipped per token
    with a per-token advantage allowed. With a sequence-level advantage and
    ``seq-mean-token-mean`` its value and gradient equal GSPO's."""
    _no_dual_clip("gspo_token", dual_clip)
    log_s = jax.lax.stop_gradient(_sequence_log_ratio(logp, logp_old, mask))[:, None]
    log_ratio = jnp.minimum(logp - jax.lax.stop_gradient(logp) + log_s, 10.0)
    return _clipped_ratio_loss(jnp.exp(log_ratio), _per_token(advantages, logp), logp_old,
                               logp, mask, eps_low, eps_high)


@POLICY_LOSSES.register("cispo")
def cispo_loss(logp: jax.Array, logp_old: jax.Array, advantages: jax.Array, mask: jax.Array,
               eps_low: float = 1.0, eps_high: float = 0.28, dual_clip: float | None = None
               ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """CISPO (MiniMax-M1, arXiv:2506.13585, eq. 4-5): the importance weight is clipped and
    stopped, never the token's gradient:
    ``L_t = -sg(clip(r_t, 1 - eps_low, 1 + eps_high)) * A * logp_t``. MiniMax set no lower
    bound (``eps_low = 1``: the weight is clipped at 0 only) and tuned the upper one (0.28 in
    Trinity-RFT's and the MiniMax recipe ports). ``clip_frac``: tokens whose weight was clipped."""
    _no_dual_clip("cispo", dual_clip)
    mask = jnp.broadcast_to(mask, logp.shape).astype(bool)
    adv = _per_token(advantages, logp)
    ratio = jnp.exp(jnp.clip(logp - logp_old, -LOG_RATIO_CAP, LOG_RATIO_CAP))
    weight = jax.lax.stop_gradient(jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high))
    loss = -weight * adv * logp
    outside = (ratio < 1.0 - eps_low) | (ratio > 1.0 + eps_high)
    return jnp.where(mask, loss, 0.0), _stats(outside, jnp.zeros_like(outside), logp_old,
                                              logp, mask)


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

