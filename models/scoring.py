"""Token log-probabilities of given sequences under the policy: the scoring passes of training
(the update's and the reference's ``log pi(y_t | x, y_<t)``), separate from sampling.

Each is of ``softmax(logits / temperature)``: at the sampling temperature these are the
sampled policy's log-probs, the ones ``models.sampler`` returns for the same tokens (verl's
and TRL's ``logits / temperature``). The logits and the attention inside come from
``models.transformer``, whose probability-forming dots run float32-true on float32 operands
(:func:`models.transformer.probability_precision`).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from models.config import ModelConfig
from models.constraints import shard_rows, whole_model_axis
from models.transformer import Params, forward, forward_with_prefix, unembed, unembedding


@functools.partial(jax.jit, static_argnames=("cfg", "remat", "with_entropy"))
def token_logprobs(cfg: ModelConfig, params: Params, tokens: jax.Array, mask: jax.Array,
                   remat: bool = False, with_entropy: bool = False,
                   temperature: float = 1.0) -> Any:
    """log p(tokens[:, t] | tokens[:, <t]), shape [B, T] (position 0 gets 0); mask [B, T]
    marks real tokens. With `with_entropy`, also the policy entropy at the same positions.
    Both of ``softmax(logits / temperature)``."""
    hidden = forward(cfg, params, tokens, mask, remat=remat, return_hidden=True)
    out = _score(cfg, params, hidden[:, :-1], tokens[:, 1:], with_entropy, temperature)
    return jax.tree.map(lambda a: jnp.pad(a, ((0, 0), (1, 0))), out)


class Scoring(NamedTuple):
    """How :func:`group_logprobs` scores (static under jit): per-layer rematerialisation,
    whether to return the entropy too, the temperature of the policy scored, and
    ``logits_chunk``: score that many positions at a time (0: all at once; see
    :func:`_score_chunked`)."""

    remat: bool = False
    with_entropy: bool = False
    temperature: float = 1.0
    logits_chunk: int = 0


PLAIN_SCORING = Scoring()  # log-probs at temperature 1, no entropy, no remat


@functools.partial(jax.jit, static_argnames=("cfg", "scoring"))
def group_logprobs(cfg: ModelConfig, params: Params, prefix: jax.Array, prefix_mask: jax.Array,
                   tokens: jax.Array, mask: jax.Array, scoring: Scoring = PLAIN_SCORING) -> Any:
    """log p(tokens[n, g, t] | prefix[n], tokens[n, g, <t]), shape [N, G, T], for G
    continuations [N,G,T] (right padded, mask) of each of N prefixes [N,P] (prefix_mask; any
    padding): a GRPO group's trajectories after their shared prompt. The prefix runs once per
    group (:func:`models.transformer.forward_with_prefix`); logits are computed for the
    continuations only, which is what RL scores. With `scoring.with_entropy`, also the
    entropy. Both of ``softmax(logits / scoring.temperature)``: the sampling temperature makes
    these the sampled policy's log-probs (verl's and TRL's ``logits / temperature``)."""
    n, g, _ = tokens.shape
    prefix_h, hidden = forward_with_prefix(cfg, params, prefix, prefix_mask, tokens, mask,
                                           remat=scoring.remat)
    last = jnp.max(jnp.where(prefix_mask, jnp.arange(prefix.shape[1]), 0), axis=1)
    first = jnp.take_along_axis(prefix_h, last[:, None, None], axis=1)  # [N,1,D]
    first = jnp.broadcast_to(first[:, None], (n, g, 1, first.shape[-1]))
    hidden = shard_rows(jnp.concatenate([first, hidden[:, :, :-1]], axis=2))
    score = functools.partial(_score, cfg, params, with_entropy=scoring.with_entropy,
                              temperature=scoring.temperature)
    if 0 < scoring.logits_chunk < tokens.shape[-1]:
        return _score_chunked(score, hidden, tokens, scoring.logits_chunk)
    return jax.tree.map(shard_rows, score(hidden, tokens))


def _score_chunked(score: Any, hidden: jax.Array, targets: jax.Array, chunk: int) -> Any:
    """``score(hidden, targets)`` over the last (position) axis ``chunk`` positions at a time,
    each chunk rematerialised: the [.., T, V] logits never exist at once, forward or
    backward, only [.., chunk, V] (Liger kernel's and MaxText's ``vocab_tiling`` idea, here
    over positions). The same values as one call up to float rounding; gradients flow to
    ``hidden`` and the unembedding through the scan."""
    t = targets.shape[-1]
    pad = -t % chunk
    lead = hidden.shape[:-2]
    h = jnp.pad(hidden, [(0, 0)] * len(lead) + [(0, pad), (0, 0)])
    y = jnp.pad(targets, [(0, 0)] * len(lead) + [(0, pad)])
    k = (t + pad) // chunk
    h = jnp.moveaxis(h.reshape(*lead, k, chunk, h.shape[-1]), -3, 0)  # [k, .., chunk, D]
    y = jnp.moveaxis(y.reshape(*lead, k, chunk), -2, 0)  # [k, .., chunk]
    body = jax.checkpoint(lambda hy: jax.tree.map(shard_rows, score(shard_rows(hy[0]), hy[1])),
                          prevent_cse=False)
    out = jax.lax.map(body, (h, y))

    def back(a: jax.Array) -> jax.Array:  # [k, .., chunk] -> [.., T]
        return shard_rows(jnp.moveaxis(a, 0, -2).reshape(*lead, k * chunk)[..., :t])

    return jax.tree.map(back, out)


def _score(cfg: ModelConfig, params: Params, hidden: jax.Array, targets: jax.Array,
           with_entropy: bool = False, temperature: float = 1.0) -> Any:
    """log p(targets) under the logits of `hidden` / temperature (same leading shape), and
    the entropy. The unembedding is gathered along D (:func:`whole_model_axis`)."""
    params = {"unembed": whole_model_axis(unembedding(cfg, params))}
    logits = unembed(cfg, params, hidden) / temperature
    logz = jax.nn.logsumexp(logits, axis=-1)
    logp = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0] - logz
    if not with_entropy:
        return logp
    probs = jnp.exp(logits - logz[..., None])
    return logp, logz - jnp.sum(probs * logits, axis=-1)
