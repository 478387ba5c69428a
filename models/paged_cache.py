"""A generation's KV cache in pages, each row reading its own tokens: the sampler's cache for
the ``paged_*`` decode kernels (``SamplingParams.decode_kernel``).

The dense cache (``models.transformer.KVCache``) holds B rows of S slots, prompts left padded
to a common width, and a decode step attends over the prefix of slots the batch's longest
row needs, for every row. With ``decode_kernel`` "paged_xla", "paged_tpu" or "paged_gpu" a
generation keeps its keys and values in pools of pages instead (``models.paged_attention``):
each row's tokens from slot 0 of its pages on, so its token count is its length, and every
forward over the cache (a decode step, a continuation's read) writes its tokens at each
row's own slots and then attends over each row's own tokens:

    "paged_xla"  by XLA, the reference (any platform; its gather copies the rows' pages)
    "paged_tpu"  a decode step by JAX's Pallas TPU paged-attention kernel (reads of
                 several tokens by the reference)
    "paged_gpu"  a decode step by JAX's Pallas GPU paged-attention kernel (likewise)

The kernels read each row's ``length`` slots and no more, so a decode loop needs no cache
extents (one loop, one copy of the step in the program). A sub-batch of rows (a multi-turn
continuation's) is rows of the page table, not a copy of their keys and values.

Layout: B rows of ``pages_per_row`` pages of :data:`PAGE_SLOTS` slots, B * pages_per_row
pages per layer. Over a mesh the rows are cut into equal blocks, one per data-parallel
shard, and a row's pages lie in its shard's block of the pools, the table counting from the
block's start: every write and read is local to its shard (one ``shard_map`` over the rows'
axes, KV heads over ``tensor`` where they divide it). Rows that pad a sub-batch point past
their shard's pages: their writes are dropped.

A GRPO group's rows (``SamplingParams.shared_prompts``) can share their prompt's full pages
(:func:`shared_prompt_pages`): the prompt stored once, each row's own pages from the one its
first new token goes to; rows then hold different numbers of slots (``DecodeState.row_slots``).
A decode step reads each group's prompt once, merged with each row's own pages by
log-sum-exp (:func:`_grouped_attention`), also in a continuation's sub-batch of more rows
than prompts (a group's members not in it ask with zeros); a smaller sub-batch and reads of
several tokens read the shared pages through each row's table.

On CPU the dense cache is faster (the reference gathers each row's pages at every step), so
the default stays dense; the kernels are checked in Pallas' interpreter only (not yet on a TPU
or GPU).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from models.config import ModelConfig
from models.constraints import BATCH_AXES, shard_rows
from models.paged_attention import (
    paged_attention,
    paged_attention_parts,
    row_pages,
    write_tokens,
)
from models.transformer import (
    KVCache,
    Params,
    Placement,
    _mask_and_positions,
    _mlp,
    _qkv,
    dense,
    forward_with_cache,
    joined_attention,
    platform_of,
    rms_norm,
    rope_inv_freq,
    unstack_layers,
)

#: Slots a page holds.
PAGE_SLOTS = 16

#: The paged decode kernels and what computes their one-token attention
#: (``models.paged_attention.paged_attention``'s kernel).
PAGED_KERNELS = {"paged_xla": "xla", "paged_tpu": "pallas_tpu", "paged_gpu": "pallas_gpu"}


def is_paged(decode_kernel: str) -> bool:
    """Whether ``decode_kernel`` keeps its cache in pages."""
    return decode_kernel in PAGED_KERNELS


def reads_own_slots(decode_kernel: str) -> bool:
    """Whether a decode step by ``decode_kernel`` reads each row's own slots (a Pallas
    kernel) rather than a prefix of the cache common to the rows."""
    return decode_kernel in ("pallas_gpu", "paged_tpu", "paged_gpu")


class SharedPrompts(NamedTuple):
    """The prompts whose full pages a paged cache's groups of rows share
    (:func:`shared_prompt_pages`), one per group of G rows: ``table`` [Q, F], each prompt's
    pages (counted like the rows' table, within its data shard's block of the pools);
    ``slots`` [Q], how many of their slots the group shares (the prompt's full pages; the
    rest of the prompt is in each row's own first page); ``rows`` [Q, G], the cache's row of
    each member of each group, counted within its shard (a sub-batch's: the shard's row
    count for a member not in it)."""

    table: jax.Array
    slots: jax.Array
    rows: jax.Array


class PagedCache(NamedTuple):
    """Keys and values in pages, per layer [KV, N, P, hd] (``models.paged_attention``), and
    ``table`` [B, pages_per_row], each row's pages in order, counted from its data shard's
    block of the pools (see the module docstring). A row's tokens are its first slots; how
    many there are is the sampler's ``next_slot``. ``prompts``: the pages each group of rows
    shares (:class:`SharedPrompts`), read once for the group by a decode step; None where
    the table says nothing of groups (unshared pages, or a continuation's sub-batch of no
    more rows than prompts)."""

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    table: jax.Array
    prompts: SharedPrompts | None = None

    @property
    def slots(self) -> int:
        """Slots a row holds."""
        return int(self.table.shape[1] * self.k[0].shape[2])


def _own_pages(rows: int, per_row: int, shards: int) -> jax.Array:
    """The table giving each row its own consecutive pages, counted within its shard's
    block of the pools (`shards` equal blocks of rows)."""
    return jnp.asarray(np.tile(row_pages(rows // shards, per_row), (shards, 1)))


def shard_specs(mesh: Any, rows: int, kv_heads: int) -> tuple[Any, Any]:
    """(the mesh axes a paged cache's rows and pages are split over, the axis its KV heads
    are split over): the data-parallel axes when they divide the rows (as
    ``models.sharding.batch_sharding`` splits the sampler's rows), ``tensor`` when it
    divides the KV heads; None for either where nothing divides."""
    shape = dict(mesh.shape)
    axes = tuple(a for a in BATCH_AXES if shape.get(a, 1) > 1)
    split = bool(axes) and rows % math.prod(shape[a] for a in axes) == 0
    row_spec = (axes[0] if len(axes) == 1 else axes) if split else None
    tensor = shape.get("tensor", 1)
    return row_spec, "tensor" if tensor > 1 and kv_heads % tensor == 0 else None


def row_shards(mesh: Any, rows: int, kv_heads: int) -> int:
    """Into how many blocks :func:`shard_specs` cuts ``rows`` rows (1 without a mesh)."""
    if mesh is None:
        return 1
    row, _ = shard_specs(mesh, rows, kv_heads)
    axes = () if row is None else (row,) if isinstance(row, str) else row
    return math.prod(dict(mesh.shape)[a] for a in axes)


def _on_shards(fn: Callable, mesh: Any, kinds: Sequence[str], out_kinds: Sequence[str],
               rows: int, kv_heads: int) -> Callable:
    """``fn`` run on each shard's rows and pages (``jax.shard_map``) over a mesh, as it is
    without one. ``kinds`` name each argument's layout, ``out_kinds`` each result's:
    "tokens" [B,T,heads,hd], "pool" [KV,N,P,hd], "table" [B,pages], "rows" [B,...]."""
    if mesh is None:
        return fn
    row, heads = shard_specs(mesh, rows, kv_heads)
    spec = {"tokens": PartitionSpec(row, None, heads), "pool": PartitionSpec(heads, row),
            "table": PartitionSpec(row), "rows": PartitionSpec(row)}
    # check_vma off: a compiled Pallas kernel's output carries no varying-axes type
    return jax.shard_map(fn, mesh=mesh, in_specs=tuple(spec[k] for k in kinds),
                         out_specs=tuple(spec[k] for k in out_kinds), check_vma=False)


def _interpret(kernel: str, mesh: Any) -> bool:
    """Whether ``kernel`` runs in Pallas' interpreter: a kernel off its own platform."""
    return kernel != "xla" and platform_of(mesh) != kernel.removeprefix("pallas_")


def _layer_attention(cache: PagedCache, start: jax.Array, kernel: str, extent: int | None,
                     mesh: Any) -> Callable:
    """``attend(q, k, v, k_pages, v_pages) -> (output, k_pages, v_pages)`` for the layers of
    :func:`forward_with_pages`: the tokens' keys and values k, v [B,T,KV,hd] written at each
    row's slots from ``start`` [B] (``cache.table`` its pages), then the queries q [B,T,H,hd]
    attending over their rows' tokens up to themselves, by ``kernel`` (T = 1; the reference
    for more) or the reference over each row's first ``extent`` pages. A one-token step over
    pages its groups share (``cache.prompts``) reads each group's prompt once
    (:func:`_grouped_attention`)."""
    def local(q: jax.Array, k: jax.Array, v: jax.Array, kp: jax.Array, vp: jax.Array,
              table: jax.Array, start: jax.Array, *shared: jax.Array
              ) -> tuple[jax.Array, jax.Array, jax.Array]:
        t = q.shape[1]
        use = kernel if t == 1 else "xla"  # the kernels take one token a row
        kp, vp = write_tokens(kp, vp, table, start, k, v)
        lengths = jnp.minimum(start + t, table.shape[1] * kp.shape[2])
        readable = jnp.minimum(table, kp.shape[1] - 1)  # a padding row reads any page
        interpret = _interpret(use, mesh)
        if shared and t == 1:
            parts = functools.partial(paged_attention_parts, kernel=use, interpret=interpret)
            out = _grouped_attention(q, kp, vp, readable, lengths, SharedPrompts(*shared), parts,
                                     extent)
        else:
            out = paged_attention(q, kp, vp, readable, lengths, use, extent, interpret)
        return out, kp, vp

    shared = () if cache.prompts is None else tuple(cache.prompts)

    def attend(q: jax.Array, k: jax.Array, v: jax.Array, kp: jax.Array,
               vp: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        kinds = ("tokens", "tokens", "tokens", "pool", "pool", "table", "rows")
        run = _on_shards(local, mesh, kinds + ("table", "rows", "table")[:len(shared)],
                         ("tokens", "pool", "pool"), q.shape[0], kp.shape[0])
        return run(q, k, v, kp, vp, cache.table, start, *shared)

    return attend


def _grouped_attention(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, table: jax.Array,
                       lengths: jax.Array, prompts: SharedPrompts, parts: Callable,
                       extent: int | None) -> jax.Array:
    """One token a row (q [B,1,H,hd]) attending over its rows' ``lengths`` [B] slots, of
    which the rows of each group share its prompt's first ones (``prompts``, whose ``rows``
    place the B rows in their groups; ``table``: the rows' pages, the shared ones first), as
    two parts merged by their log-sum-exps (``models.transformer.joined_attention``): the
    group's prompt, its G members' queries against the prompt's pages at once (a G H/KV by
    slots product for each group and KV head, the prompt read once for the group: Hydragen,
    Juravsky et al. 2024, sec. 3; a member not among the rows asks with zeros), and each
    row's own pages after it. Returns [B,1,H,hd] in q's dtype. ``parts``:
    ``models.paged_attention.paged_attention_parts`` with its kernel chosen; ``extent``: how
    many of its own pages a row's part reads (None: all)."""
    b, _, h, hd = q.shape
    (n, full), group = prompts.table.shape, prompts.rows.shape[1]
    kv = k_pages.shape[0]
    # each group's queries as one row of G H/KV queries for each KV head
    asking = jnp.concatenate([q[:, 0], jnp.zeros_like(q[:1, 0])])[prompts.rows]  # [N,G,H,hd]
    grouped = asking.reshape(n, group, kv, h // kv, hd).transpose(0, 2, 1, 3, 4)
    top, total, out = parts(grouped.reshape(n, 1, h * group, hd), k_pages, v_pages,
                            prompts.table, prompts.slots)
    # each row's member of a group (a padding row of a sub-batch: the first's; not used)
    member = jnp.zeros(b, jnp.int32).at[prompts.rows.reshape(-1)].set(
        jnp.arange(n * group, dtype=jnp.int32), mode="drop")

    def by_row(x: jax.Array) -> jax.Array:  # [N,KV,G*per,X] -> [B,KV,per,X]
        x = x.reshape(n, kv, group, h // kv, x.shape[-1]).transpose(0, 2, 1, 3, 4)
        return x.reshape(n * group, kv, h // kv, x.shape[-1])[member]

    first = prompts.slots[member // group] // k_pages.shape[2]  # [B] each row's shared pages
    own = table.shape[1] - full  # every row's own pages follow its shared ones
    mine = jnp.take_along_axis(table, first[:, None] + jnp.arange(own, dtype=jnp.int32), 1)
    own_part = parts(q, k_pages, v_pages, mine, lengths - first * k_pages.shape[2],
                     extent=None if extent is None else min(extent, own))
    prompt_part = (by_row(top), by_row(total), by_row(out))
    return joined_attention(q, (), (prompt_part, own_part)).reshape(q.shape)


def forward_with_pages(cfg: ModelConfig, params: Params, tokens: jax.Array,
                       attn_mask: jax.Array | None = None, positions: jax.Array | None = None,
                       *, cache: PagedCache, start: jax.Array,
                       placement: Placement) -> tuple[jax.Array, PagedCache]:
    """(final hidden states [B,T,D], updated cache) for tokens [B,T] that follow each row's
    tokens in a paged ``cache``: row b's tokens written at its slots from ``start[b]`` on,
    each attending over the row's tokens before it and itself (causal; every token written,
    padding too, so a row's padding must come after its real tokens and its next write
    start after those). ``models.transformer.forward_with_cache`` for a :class:`PagedCache`;
    ``placement.decode_kernel`` one of :data:`PAGED_KERNELS`, ``placement.extent`` (slots)
    how much of each row the reference reads (the kernels read each row's own)."""
    b, t = tokens.shape
    attn_mask, positions = _mask_and_positions(tokens, attn_mask, positions)
    inv_freq = jnp.asarray(rope_inv_freq(cfg))
    kernel, mesh = PAGED_KERNELS[placement.decode_kernel], placement.mesh
    extent = None if placement.extent is None else -(-placement.extent // PAGE_SLOTS)
    start = jnp.broadcast_to(jnp.asarray(start, jnp.int32), (b,))
    attend = _layer_attention(cache, start, kernel, extent, mesh)
    pin = shard_rows if placement.pin_rows else (lambda a: a)
    x, ks, vs = pin(params["embed"][tokens]), [], []
    for p, kp, vp in zip(unstack_layers(params)["layers"], cache.k, cache.v, strict=True):
        q, k, v = _qkv(cfg, p, rms_norm(x, p["attn_norm"], cfg.rms_norm_eps), positions,
                       inv_freq)
        out, kp, vp = attend(q, k, v, kp, vp)
        x = x + dense(out.reshape(b, t, -1), p["wo"])
        x = pin(x + _mlp(p, rms_norm(x, p["mlp_norm"], cfg.rms_norm_eps)))
        ks.append(kp)
        vs.append(vp)
    x = rms_norm(x, params["final_norm"], cfg.rms_norm_eps)
    return x, PagedCache(tuple(ks), tuple(vs), cache.table, cache.prompts)


def forward_cached(cfg: ModelConfig, params: Params, tokens: jax.Array,
                   attn_mask: jax.Array | None = None, positions: jax.Array | None = None,
                   *, cache: KVCache | PagedCache, cache_index: jax.Array | int,
                   placement: Placement) -> tuple[jax.Array, Any]:
    """A forward over either cache: :func:`forward_with_pages` (from ``cache_index``) for a
    :class:`PagedCache`, else ``models.transformer.forward_with_cache``."""
    if isinstance(cache, PagedCache):
        return forward_with_pages(cfg, params, tokens, attn_mask, positions, cache=cache,
                                  start=jnp.asarray(cache_index), placement=placement)
    return forward_with_cache(cfg, params, tokens, attn_mask, positions, cache=cache,
                              cache_index=cache_index, placement=placement)


def prompt_pages(keys: Sequence[jax.Array], values: Sequence[jax.Array], slots: int,
                 mesh: Any = None) -> PagedCache:
    """A paged cache of at least ``slots`` slots a row holding each row's prompt: ``keys``,
    ``values`` per layer [B,KV,W,hd], the rows' prompts right padded (the prefill's dense
    cache in the ``"slot_rows"`` layout, a copy per row; ``models.sampler.prompt_batch``).
    Each row gets its own consecutive pages, so a layer's pool is the rows' prompts padded
    with empty slots, viewed as pages: a copy, as the dense cache's prefill makes. (Left
    padded prompts, moved to slot 0 row by row, took the TPU compiler 3 times the dense
    prefill's temporaries: the benchmarks page.) The slots after a prompt hold its padding's
    keys, overwritten as the row goes on."""
    b, kv, width, hd = keys[0].shape
    per_row = -(-slots // PAGE_SLOTS)

    def pool(x: jax.Array) -> jax.Array:  # [B,KV,W,hd] -> [KV, B * per_row, P, hd]
        x = jnp.pad(x.transpose(1, 0, 2, 3),
                    ((0, 0), (0, 0), (0, per_row * PAGE_SLOTS - width), (0, 0)))
        return x.reshape(kv, b * per_row, PAGE_SLOTS, hd)

    return PagedCache(tuple(map(pool, keys)), tuple(map(pool, values)),
                      _own_pages(b, per_row, row_shards(mesh, b, kv)))


def own_pages(width: int, slots: int) -> int:
    """Pages of its own a row gets when its group shares its prompt's pages
    (:func:`shared_prompt_pages`) in a cache of ``slots`` slots a row after prompts of at
    most ``width``: the prompt's last partial page and room for ``slots - width`` more tokens
    wherever in its page the prompt ends."""
    return -(-(slots - width) // PAGE_SLOTS) + 1


def shared_row_slots(lengths: np.ndarray, width: int, slots: int) -> np.ndarray:
    """Each row's slots in :func:`shared_prompt_pages`' cache, from its prompt's length
    (host ints, [B]): its prompt's full pages and its own, at least ``slots - width`` slots
    after its prompt."""
    return (np.asarray(lengths) // PAGE_SLOTS + own_pages(width, slots)) * PAGE_SLOTS


def _shared_table(page_of: jax.Array, group: int, shards: int, full: int,
                  own: int) -> jax.Array:
    """:func:`shared_prompt_pages`' table [B, full + own]: row j of a shard (prompt
    p = j // group, whose partial page is ``page_of[p]``) reads p's shared pages before its
    partial page, then its own ``own`` pages; its entries past them point past the block."""
    per = page_of.shape[0] // shards  # prompts a shard
    j = jnp.arange(page_of.shape[0] * group) % (per * group)
    first = jnp.repeat(page_of, group)[:, None]
    entry = jnp.arange(full + own)[None]
    shared = (j // group)[:, None] * full + entry
    mine = per * full + j[:, None] * own + entry - first
    past = per * full + per * group * own
    return jnp.where(entry < first, shared, jnp.where(entry < first + own, mine, past)
                     ).astype(jnp.int32)


def shared_prompt_pages(keys: Sequence[jax.Array], values: Sequence[jax.Array],
                        lengths: jax.Array, group: int, slots: int,
                        mesh: Any = None) -> PagedCache:
    """A paged cache whose rows share their group's prompt pages: ``keys``, ``values`` per
    layer [Q,KV,W,hd], one right padded prompt per group of ``group`` consecutive rows, in
    the rows' order (over a mesh each shard's Q/S in turn), ``lengths`` [Q] their token
    counts, and ``slots`` what each row would hold unshared (:func:`prompt_pages`).

    Row r of a prompt of L tokens reads the prompt's first L // P pages, stored once for
    the group, then :func:`own_pages` pages of its own: the first a copy of the prompt's
    page L // P (its partial last page, where the row's first new token goes), then empty
    ones. A row writes after its prompt only, so only in its own pages; it holds
    :func:`shared_row_slots` slots, at least ``slots - W`` after its prompt (what every row
    has after its prompt in the dense cache). Each shard's block of the pools holds its
    prompts' W // P pages each (the ones a shorter prompt does not fill go unread), then its
    rows' own pages; table entries past a row's pages point past the block. The saving:
    G - 1 copies of every full prompt page (groups of G)."""
    q, kv, width, hd = keys[0].shape
    shards = row_shards(mesh, q * group, kv)
    full, own = width // PAGE_SLOTS, own_pages(width, slots)
    page_of = lengths.astype(jnp.int32) // PAGE_SLOTS

    def pool(x: jax.Array) -> jax.Array:  # [Q,KV,W,hd] -> [KV, N, P, hd]
        x = jnp.pad(x, ((0, 0), (0, 0), (0, (full + 1) * PAGE_SLOTS - width), (0, 0)))
        pages = x.reshape(q, kv, full + 1, PAGE_SLOTS, hd)
        partial = jnp.take_along_axis(pages, page_of[:, None, None, None, None], axis=2)
        mine = jnp.pad(jnp.repeat(partial, group, axis=0),  # [B, KV, own, P, hd]
                       ((0, 0), (0, 0), (0, own - 1), (0, 0), (0, 0)))

        def blocks(y: jax.Array) -> jax.Array:  # [n, KV, m, P, hd] -> [KV, S, n/S * m, P, hd]
            n, m = y.shape[0], y.shape[2]
            y = y.reshape(shards, n // shards, *y.shape[1:]).transpose(2, 0, 1, 3, 4, 5)
            return y.reshape(kv, shards, n // shards * m, PAGE_SLOTS, hd)

        both = jnp.concatenate([blocks(pages[:, :, :full]), blocks(mine)], axis=2)
        return both.reshape(kv, -1, PAGE_SLOTS, hd)

    prompt_table = (jnp.arange(q, dtype=jnp.int32) % (q // shards))[:, None] * full + \
        jnp.arange(full, dtype=jnp.int32)
    members = (jnp.arange(q * group, dtype=jnp.int32) % (q * group // shards)).reshape(q, group)
    return PagedCache(tuple(map(pool, keys)), tuple(map(pool, values)),
                      _shared_table(page_of, group, shards, full, own),
                      SharedPrompts(prompt_table, page_of * PAGE_SLOTS, members))


def widened(cache: PagedCache, slots: int, mesh: Any = None) -> PagedCache:
    """``cache`` with at least ``slots`` slots a row: each row's pages copied, in order, to
    the first of its new consecutive pages (a copy, like the dense cache's widening; pages
    a group shared become each row's own)."""
    rows, kv = cache.table.shape[0], cache.k[0].shape[0]
    per_row = max(-(-slots // PAGE_SLOTS), cache.table.shape[1])
    more = per_row - cache.table.shape[1]

    def local(pool: jax.Array, table: jax.Array) -> jax.Array:
        # entries past a row's pages (shared prompt pages) point past the pool: any page
        pages = pool[:, jnp.minimum(table, pool.shape[1] - 1)]  # [KV, rows, pages, P, hd]
        pages = jnp.pad(pages, ((0, 0), (0, 0), (0, more), (0, 0), (0, 0)))
        return pages.reshape(pool.shape[0], -1, *pool.shape[2:])

    grow = _on_shards(lambda p, t: (local(p, t),), mesh, ("pool", "table"), ("pool",), rows,
                      kv)
    return PagedCache(tuple(grow(k, cache.table)[0] for k in cache.k),
                      tuple(grow(v, cache.table)[0] for v in cache.v),
                      _own_pages(rows, per_row, row_shards(mesh, rows, kv)))

