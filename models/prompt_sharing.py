"""One prompt per group: the rows that continue one prompt read one copy of its KV cache.

GRPO samples a group of G continuations of every prompt, and the sampler's rows come in
those groups, G consecutive rows a prompt. By default a fresh generation gives every row a
copy of its prompt's keys and values (``models.sampler.prefill``), and every decode step
reads G copies of each prompt. With ``SamplingParams.shared_prompts`` the prefilled prompts
stay one per group (:func:`grouped_prompts`), the rows' own cache holds what they generate,
and a decode step attends over the two as parts merged by their log-sum-exps: the group's
prompt by one matrix-matrix product per group (Hydragen, Juravsky et al. 2024;
``models.transformer.shared_prefix_part``), its rows' own slots as before.

Which rows share is read off the prompt batch (:func:`prompt_group`): the sampler shares
only when each data-parallel shard's rows are whole groups in order, so every group's prompt
lies on the shard of its rows. A continuation (a multi-turn rollout's next turn) reads and
writes each row's cache in place: it first gives each row its own copy of its prompt
(:func:`rows_cache`, once per rollout), so the sharing saves the first turn's reads only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from numpy.typing import ArrayLike

from models.transformer import KVCache, slot_axes


def prompt_group(rows: ArrayLike) -> int:
    """G, how many consecutive rows share each prompt, from a prompt batch's ``rows`` (row b
    continues distinct prompt ``rows[b]``; [S, B/S] over S shards, indexing the shard's own
    prompts): the largest G dividing each shard's rows such that row j of every shard
    continues its shard's prompt j // G; 1 when no G > 1 does (then every row has its own
    copy)."""
    per_shard = np.asarray(rows).reshape(-1, np.shape(rows)[-1])
    n = per_shard.shape[1]
    for group in range(n, 1, -1):
        if n % group == 0 and (per_shard == np.arange(n) // group).all():
            return group
    return 1


def grouped_prompts(cache: KVCache, rows: jax.Array, group: int) -> KVCache:
    """The prefilled prompts' cache (P prompts, or S shards' P each: [S*P, ...]) as the
    decode reads it: the prompt of each group of ``group`` consecutive rows, [B/G, ...] in
    the rows' order, where ``rows`` ([B] or [S, B/S]) has :func:`prompt_group` ``group``.
    Without filler prompts (a prompt count not rounded up) the prompts are these already;
    otherwise each shard's first B/(S G) are kept (a copy of them)."""
    shards = rows.shape[0] if rows.ndim == 2 else 1
    groups = rows.shape[-1] // group  # per shard

    def kept(x: jax.Array) -> jax.Array:
        per = x.reshape(shards, -1, *x.shape[1:])
        if per.shape[1] == groups:
            return x
        return per[:, :groups].reshape(shards * groups, *x.shape[1:])

    return jax.tree.map(kept, cache)


def rows_cache(prompt: KVCache, own: KVCache, layout: str) -> KVCache:
    """Every row's cache as one buffer: its group's prompt (``prompt``, one per group of
    B/N consecutive rows), then its own slots (``own``, [B, ...]), in ``layout``
    (``models.transformer.kv_layout``): what a continuation reads and writes in place, a
    row's slots numbered from its prompt's first."""
    group = own.valid.shape[0] // prompt.valid.shape[0]
    key_axis, value_axis = slot_axes(layout)

    def joined(shared: jax.Array, mine: jax.Array, axis: int) -> jax.Array:
        return jnp.concatenate([jnp.repeat(shared, group, axis=0), mine], axis=axis)

    return KVCache(tuple(joined(p, o, key_axis) for p, o in zip(prompt.k, own.k, strict=True)),
                   tuple(joined(p, o, value_axis) for p, o in zip(prompt.v, own.v,
                                                                  strict=True)),
                   joined(prompt.valid, own.valid, 1))
