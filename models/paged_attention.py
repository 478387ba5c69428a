"""A KV cache kept in pages, and one attention over it with per-row lengths.

Each layer's keys and values live in a pool of fixed-size pages, ``k_pages`` and
``v_pages`` [KV, N, P, hd] (N pages of P slots for each KV head: the layout JAX's Pallas
paged-attention kernels for TPU and GPU both read). A row's tokens are its page table's
pages in order, ``table`` [B, pages_per_row] of page indices, its token i in slot i % P of
page ``table[b, i // P]``, from the row's first token on (no padding before it), and
``lengths`` [B] says how many it has. So a row reads only its own tokens (vLLM's
PagedAttention, Kwon et al. 2023, sec. 4.1), a sub-batch of rows is a few rows of the table
(not a copy of their keys and values), and rows may share pages (a group's prompt).

:func:`write_tokens` writes new tokens at each row's own slots; :func:`paged_attention`
attends each row's new tokens over its first ``lengths[b]`` slots, computed by

    "xla"         the reference: the rows' pages gathered (up to ``extent`` of them), a
                  masked softmax in float32 (any platform, any number of new tokens)
    "pallas_tpu"  JAX's Pallas TPU paged-attention kernel
                  (``jax.experimental.pallas.ops.tpu.paged_attention``); it rounds keys and
                  values to bfloat16 as it loads them (meant for a bfloat16 cache)
    "pallas_gpu"  JAX's Pallas GPU paged-attention kernel
                  (``jax.experimental.pallas.ops.gpu.paged_attention``, flash-decoding)

The kernels take one new token per row (a decode step); on a platform other than theirs
they run in Pallas' interpreter (how the tests check them on CPU; slow, for checks only).
:func:`paged_attention_parts` gives one token's attention as the parts a log-sum-exp merge
takes (by the reference or either kernel's body), so that a group's shared prompt can be
attended once for the group and merged with each row's own pages
(``models.paged_cache``). The sampler's cache for the paged decode kernels is
``models.paged_cache``; not yet checked on a TPU or GPU.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from models.transformer import NEG_INF, probability_precision

#: What computes :func:`paged_attention` (see the module docstring).
PAGE_KERNELS = ("xla", "pallas_tpu", "pallas_gpu")


def empty_pages(kv_heads: int, pages: int, page_size: int, head_dim: int,
                dtype: Any = jnp.float32) -> tuple[jax.Array, jax.Array]:
    """(k_pages, v_pages), each [KV, N, P, hd] of zeros: a layer's pool of `pages` pages."""
    shape = (kv_heads, pages, page_size, head_dim)
    return jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)


def row_pages(rows: int, pages_per_row: int, first: int = 0) -> np.ndarray:
    """The page table [rows, pages_per_row] that gives each row its own consecutive pages,
    row b pages ``first + b * pages_per_row`` on (a dense cache's rows, as pages)."""
    return (first + np.arange(rows * pages_per_row, dtype=np.int32)).reshape(rows, -1)


def write_tokens(k_pages: jax.Array, v_pages: jax.Array, table: jax.Array, start: jax.Array,
                 k: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The pools with each row's T new keys and values k, v [B,T,KV,hd] written at its slots
    ``start[b] + t``: page ``table[b, slot // P]``, offset ``slot % P`` (cast to the pools'
    dtype). Slots past a row's last page are dropped, not written elsewhere; rows sharing a
    page must not write the same slot (the result would be either's)."""
    b, t = k.shape[:2]
    n, size = k_pages.shape[1], k_pages.shape[2]
    slot = start[:, None] + jnp.arange(t, dtype=jnp.int32)  # [B,T]
    page = slot // size
    inside = page < table.shape[1]
    physical = jnp.take_along_axis(table, jnp.minimum(page, table.shape[1] - 1), axis=1)
    physical = jnp.where(inside, physical, n)  # past the pool: dropped
    offset = slot % size

    # one [hd] vector per head, page and slot: a scatter of [KV, hd] windows made the TPU
    # compiler keep the pools in another layout than the kernels read and copy every
    # layer's pools into theirs and back at each step
    heads = jnp.arange(k_pages.shape[0], dtype=jnp.int32)[:, None, None]

    def put(pages: jax.Array, new: jax.Array) -> jax.Array:  # new [B,T,KV,hd]
        return pages.at[heads, physical[None], offset[None]].set(
            new.transpose(2, 0, 1, 3).astype(pages.dtype), mode="drop")

    return put(k_pages, k), put(v_pages, v)


def paged_attention(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, table: jax.Array,
                    lengths: jax.Array, kernel: str = "xla", extent: int | None = None,
                    interpret: bool | None = None) -> jax.Array:
    """Each row's attention over its own slots: q [B,T,H,hd] are row b's last T tokens of
    its ``lengths[b]`` (already written, :func:`write_tokens`), query t attending over slots
    ``[0, lengths[b] - T + t]`` (causal); pools [KV,N,P,hd], ``table`` [B, pages_per_row].
    Returns [B,T,H,hd] in q's dtype: softmax(q.k / sqrt(hd)) v, grouped-query (query head
    h reads KV head h // (H / KV)).

    ``kernel``: "xla", the reference (float32 scores, float32-true on a float32 cache:
    ``models.transformer.probability_precision``), reading each row's first ``extent`` pages
    (None: all; every row's tokens must lie in them); "pallas_tpu" or "pallas_gpu", JAX's
    kernels (T = 1), reading each row's ``lengths[b]`` slots; ``interpret``: run a kernel in
    Pallas' interpreter (None: unless on its platform)."""
    if kernel not in PAGE_KERNELS:
        raise ValueError(f"paged_attention: kernel must be one of {PAGE_KERNELS}, got "
                         f"{kernel!r}")
    if kernel == "xla":
        return _reference(q, k_pages, v_pages, table, lengths, extent)
    if q.shape[1] != 1:
        raise ValueError(f"paged_attention: the {kernel} kernel takes one new token per row "
                         f"(a decode step), got {q.shape[1]}")
    platform, interpret = _kernel_platform(kernel, q.shape[-1], interpret)
    run = _tpu_kernel if platform == "tpu" else _gpu_kernel
    scaled = q[:, 0] * jnp.asarray(1.0 / np.sqrt(q.shape[-1]), q.dtype)  # kernels don't scale
    return run(scaled, k_pages, v_pages, table, lengths, interpret)[:, None].astype(q.dtype)


def _kernel_platform(kernel: str, head_dim: int, interpret: bool | None) -> tuple[str, bool]:
    """(the platform of a Pallas ``kernel``, whether it runs in Pallas' interpreter: None,
    unless on its platform); a TPU kernel compiled for a TPU takes heads of 128 lanes'
    multiples."""
    platform = kernel.split("_")[1]
    if interpret is None:
        interpret = jax.default_backend() != platform
    if platform == "tpu" and not interpret and head_dim % 128:
        raise ValueError(f"paged_attention: the Pallas TPU kernel takes heads of a multiple "
                         f"of 128 dimensions (the TPU's lanes), got {head_dim}; use the "
                         "reference (decode_kernel=paged_xla) for this model")
    return platform, interpret


def _scored(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, table: jax.Array,
            lengths: jax.Array, extent: int | None) -> tuple[jax.Array, jax.Array, jax.Array, Any]:
    """The reference's scores: the rows' first ``extent`` pages gathered (None: all), each
    query's q.k / sqrt(hd) in float32, [B,KV,H/KV,T,S], and whether it sees each slot (its
    row's slots up to its own, causal); with the gathered values [KV,B,S,hd] and the dots'
    precision."""
    b, t, h, hd = q.shape
    kv = k_pages.shape[0]
    pages = table if extent is None else table[:, :extent]
    keys = k_pages[:, pages].reshape(kv, b, -1, hd)  # [KV,B,S,hd], S = pages * P
    values = v_pages[:, pages].reshape(kv, b, -1, hd)
    precision = probability_precision(keys.dtype)
    qg = q.reshape(b, t, kv, h // kv, hd).astype(keys.dtype)
    scores = jnp.einsum("btkgd,kbsd->bkgts", qg, keys, preferred_element_type=jnp.float32,
                        precision=precision) * (1.0 / np.sqrt(hd))
    last = lengths[:, None] - t + jnp.arange(t, dtype=jnp.int32)  # [B,T] each query's slot
    seen = jnp.arange(keys.shape[2]) <= last[:, :, None]  # [B,T,S]
    return scores, seen[:, None, None], values, precision


def _reference(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, table: jax.Array,
               lengths: jax.Array, extent: int | None) -> jax.Array:
    """:func:`paged_attention` by XLA: the rows' pages gathered, then a masked softmax."""
    b, t, h, hd = q.shape
    scores, seen, values, precision = _scored(q, k_pages, v_pages, table, lengths, extent)
    probs = jax.nn.softmax(jnp.where(seen, scores, NEG_INF), axis=-1)
    out = jnp.einsum("bkgts,kbsd->btkgd", probs.astype(values.dtype), values,
                     preferred_element_type=jnp.float32, precision=precision)
    return out.reshape(b, t, h, hd).astype(q.dtype)


def paged_attention_parts(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array,
                          table: jax.Array, lengths: jax.Array, kernel: str = "xla",
                          extent: int | None = None, interpret: bool | None = None
                          ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One new token a row attending over its row's first ``lengths[b]`` slots (q [B,1,H,hd],
    the rest as :func:`paged_attention`), reduced to what a merge by log-sum-exp takes
    (``models.transformer.joined_attention``'s reduced parts; flash-decoding): each query's
    largest score m [B,KV,H/KV,1], sum of exponentials l = sum exp(s - m) [B,KV,H/KV,1] and
    unnormalised output o = sum exp(s - m) v [B,KV,H/KV,hd], float32, s = q.k / sqrt(hd).
    A row of no slots gives l = 0 and o = 0 (it weighs nothing in a merge).

    ``kernel``: one of :data:`PAGE_KERNELS`, "xla" (the reference, reading each row's first
    ``extent`` pages), or the body of JAX's TPU or GPU kernel with what it keeps of each
    query's maximum and sum of exponentials returned (its public function drops them)."""
    if kernel not in PAGE_KERNELS:
        raise ValueError(f"paged_attention_parts: kernel must be one of {PAGE_KERNELS}, got "
                         f"{kernel!r}")
    if q.shape[1] != 1:
        raise ValueError(f"paged_attention_parts: one new token per row, got {q.shape[1]}")
    hd = q.shape[-1]
    if kernel != "xla":
        platform, interpret = _kernel_platform(kernel, hd, interpret)
        scaled = q[:, 0] * jnp.asarray(1.0 / np.sqrt(hd), q.dtype)  # kernels don't scale
        run = _tpu_kernel_parts if platform == "tpu" else _gpu_kernel_parts
        return run(scaled, k_pages, v_pages, table, lengths, interpret)
    scores, seen, values, precision = _scored(q, k_pages, v_pages, table, lengths, extent)
    scores, seen = scores[:, :, :, 0], seen[:, :, :, 0]  # one token: [B,KV,H/KV,S]
    top = jnp.max(jnp.where(seen, scores, NEG_INF), axis=-1, keepdims=True)
    weights = jnp.where(seen, jnp.exp(scores - top), 0.0)
    out = jnp.einsum("bkgs,kbsd->bkgd", weights.astype(values.dtype), values,
                     preferred_element_type=jnp.float32, precision=precision)
    return top, jnp.sum(weights, axis=-1, keepdims=True), out


def compute_block(pages_per_row: int, most: int = 8) -> int:
    """Pages a kernel reads per block: the largest divisor of `pages_per_row` up to `most`
    (the kernels want the row's pages cut into whole blocks)."""
    return max(d for d in range(1, min(most, pages_per_row) + 1) if pages_per_row % d == 0)


def _tpu_kernel(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, table: jax.Array,
                lengths: jax.Array, interpret: bool) -> jax.Array:
    """JAX's Pallas TPU paged-attention kernel on q [B,H,hd] (already scaled)."""
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention as tpu

    return _on_tpu(lambda: tpu(q, k_pages, v_pages, lengths.astype(jnp.int32),
                               table.astype(jnp.int32),
                               pages_per_compute_block=compute_block(table.shape[1])),
                   interpret)


def _on_tpu(run: Callable[[], Any], interpret: bool) -> Any:
    """``run()``, its Pallas TPU calls in Pallas' interpreter if ``interpret`` (the mode is
    read where a call is built and traced, so both happen inside ``run``)."""
    from jax.experimental.pallas import tpu as pltpu

    if not interpret:
        return run()
    with pltpu.force_tpu_interpret_mode():
        return run()


def _splits(pages: int) -> int:
    """Into how many parts the GPU kernel cuts a row's `pages` (read in parallel, merged
    after): the most, up to its default 16, that divide them."""
    return max(d for d in range(1, min(16, pages) + 1) if pages % d == 0)


def _tpu_kernel_parts(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array,
                      table: jax.Array, lengths: jax.Array, interpret: bool
                      ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """:func:`paged_attention_parts` by the body of JAX's Pallas TPU paged-attention kernel
    (``paged_flash_attention_kernel_inline_seq_dim``) on q [B,H,hd] (already scaled), called
    as JAX's ``paged_attention`` calls it (no megacore split, no quantized pages) but with
    the running maximum and sum of exponentials it keeps in its outputs returned, each as
    wide as q (every lane the same). Its output is normalised: the unnormalised one is it
    times the sum. A row of no slots leaves the outputs as the kernel starts them (m = -inf,
    l = 0, o = 0)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu
    from jax.experimental.pallas.ops.tpu.paged_attention.paged_attention_kernel import (
        DEFAULT_MASK_VALUE,
        paged_flash_attention_kernel_inline_seq_dim,
    )

    b, h, hd = q.shape
    kv, _, size, _ = k_pages.shape
    per, pages = h // kv, table.shape[1]
    block = compute_block(pages)
    if per % 8:  # as JAX does: a [1, 128] layout for fewer than 8 queries a KV head
        q, spec = q.reshape(b, h, 1, hd).astype(jnp.float32), pl.BlockSpec(
            (None, per, None, hd), lambda core, i, j, *_: (i, j, 0, 0))
    else:
        spec = pl.BlockSpec((None, per, hd), lambda core, i, j, *_: (i, j, 0))
    any_space = pl.BlockSpec(memory_space=pl.ANY)
    buffers = [pltpu.VMEM((2, block, size, hd), x.dtype) for x in (k_pages, v_pages)]
    kernel = functools.partial(paged_flash_attention_kernel_inline_seq_dim,
                               pages_per_sequence=pages, batch_size=b,
                               pages_per_compute_block=block, mask_value=DEFAULT_MASK_VALUE,
                               attn_logits_soft_cap=None, megacore_mode=None)

    def run() -> list[jax.Array]:
        call = pl.pallas_call(
            kernel, grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=4, in_specs=[spec, any_space, None, any_space, None],
                out_specs=[spec, spec, spec], grid=(1, b, kv),
                scratch_shapes=(buffers[0], None, buffers[1], None,
                                pltpu.SemaphoreType.DMA((2,)), pltpu.SemaphoreType.DMA((2,)))),
            compiler_params=pltpu.CompilerParams(
                dimension_semantics=("parallel", "arbitrary", "arbitrary")),
            out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                       jax.ShapeDtypeStruct(q.shape, jnp.float32),
                       jax.ShapeDtypeStruct(q.shape, jnp.float32)],
            name="paged_attention_parts")
        return call(lengths.astype(jnp.int32), table.astype(jnp.int32).reshape(-1),
                    jnp.zeros((1,), jnp.int32), jnp.ones((1,), jnp.int32), q, k_pages, None,
                    v_pages, None)

    out, top, total = (x.reshape(b, kv, per, hd) for x in _on_tpu(run, interpret))
    top, total = jnp.maximum(top[..., :1], NEG_INF), total[..., :1]
    return top, total, out.astype(jnp.float32) * total


def _gpu_kernel(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array, table: jax.Array,
                lengths: jax.Array, interpret: bool) -> jax.Array:
    """JAX's Pallas GPU paged-attention kernel on q [B,H,hd] (already scaled): the row's
    pages in k_splits parts (read in parallel, merged after), each in blocks of pages."""
    from jax.experimental.pallas.ops.gpu import paged_attention as gpu

    pages = table.shape[1]
    splits = _splits(pages)
    return gpu.paged_attention(q, k_pages, v_pages, table.astype(jnp.int32),
                               lengths.astype(jnp.int32),
                               pages_per_compute_block=compute_block(pages // splits),
                               k_splits=splits, interpret=interpret)


GPU_HEAD_BLOCK = 16  # query heads a GPU kernel instance takes (the kernel's block_h)


def _gpu_kernel_parts(q: jax.Array, k_pages: jax.Array, v_pages: jax.Array,
                      table: jax.Array, lengths: jax.Array, interpret: bool
                      ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """:func:`paged_attention_parts` by the body of JAX's Pallas GPU paged-attention kernel
    (``paged_attention_kernel``) on q [B,H,hd] (already scaled), called as JAX's
    ``paged_attention`` calls it but with its residuals, each of the k_splits parts' largest
    score and sum of exponentials, kept; the parts are merged here instead of normalised.
    Each KV head's H/KV queries are one block (padded to :data:`GPU_HEAD_BLOCK`): M of them
    against the row's pages is a matrix-matrix product."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu
    from jax.experimental.pallas.ops.gpu.paged_attention import (
        DEFAULT_MASK_VALUE,
        paged_attention_kernel,
    )

    b, h, hd = q.shape
    kv, n, size, _ = k_pages.shape
    per, splits = h // kv, _splits(table.shape[1])
    part = table.shape[1] // splits
    heads = -(-per // GPU_HEAD_BLOCK) * GPU_HEAD_BLOCK
    kernel = functools.partial(paged_attention_kernel, num_heads=per,
                               pages_per_compute_block=compute_block(part),
                               mask_value=DEFAULT_MASK_VALUE, attn_logits_soft_cap=None)
    pool = pl.BlockSpec((None, n, size, hd), lambda i, j, k: (i, 0, 0, 0))
    call = pl.pallas_call(
        kernel, grid=(kv, heads // GPU_HEAD_BLOCK, splits),
        in_specs=[pl.BlockSpec((None, GPU_HEAD_BLOCK, hd), lambda i, j, k: (i, j, 0)), pool,
                  None, pool, None, pl.BlockSpec((None, part), lambda i, j, k: (k, 0)),
                  pl.BlockSpec((1,), lambda i, j, k: (0,))],
        out_specs=[pl.BlockSpec((None, None, GPU_HEAD_BLOCK, hd), lambda i, j, k: (k, i, j, 0)),
                   pl.BlockSpec((None, None, GPU_HEAD_BLOCK), lambda i, j, k: (k, i, j)),
                   pl.BlockSpec((None, None, GPU_HEAD_BLOCK), lambda i, j, k: (k, i, j))],
        out_shape=[jax.ShapeDtypeStruct((splits, kv, heads, hd), q.dtype),
                   jax.ShapeDtypeStruct((splits, kv, heads), jnp.float32),
                   jax.ShapeDtypeStruct((splits, kv, heads), jnp.float32)],
        interpret=interpret, compiler_params=plgpu.CompilerParams(num_warps=8, num_stages=2),
        name="paged_attention_parts")

    def row(q_row: jax.Array, pages: jax.Array, length: jax.Array
            ) -> tuple[jax.Array, jax.Array, jax.Array]:
        grouped = jnp.pad(q_row.reshape(kv, per, hd), ((0, 0), (0, heads - per), (0, 0)))
        out, total, top = call(grouped, k_pages, None, v_pages, None,
                               pages.reshape(splits, part), length)
        out, total, top = out[:, :, :per], total[:, :, :per], top[:, :, :per]
        best = jnp.max(top, axis=0)  # the parts merged: [KV, per]
        scale = jnp.exp(top - best)
        return (best[..., None], jnp.sum(total * scale, axis=0)[..., None],
                jnp.sum(out.astype(jnp.float32) * scale[..., None], axis=0))

    return jax.vmap(row)(q, table.astype(jnp.int32), lengths.astype(jnp.int32)[:, None])
