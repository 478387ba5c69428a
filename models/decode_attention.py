"""One new token's attention over a KV cache, each row reading only its own slots: the
cache part of a decode step, computed by a kernel that takes per-row bounds.

``models.transformer.forward_with_cache`` attends over the cache as it was and over the new
tokens' own keys and values, and merges the two by their log-sum-exps
(``models.transformer.joined_attention``). Its own computation of the cache part (the XLA
path, the default) reads a static prefix of the cache for every row, the longest any row
needs (``models.transformer.while_in_extents``). With ``decode_kernel="pallas_gpu"`` the cache
part of a one-token step is instead JAX's Pallas GPU decode-attention kernel
(``jax.experimental.pallas.ops.gpu.decode_attention``, flash-decoding: the slots split into
blocks whose partial softmaxes are merged), which reads each row's slots ``[start, end)``
only, and returns the part's maximum score, sum of exponentials and unnormalised output for
the merge.

The kernel wants each layer's keys and values as [B,KV,S,hd]: a cache for it is kept in the
``"slot_rows"`` layout (``models.transformer.kv_layout``). On a platform other than a GPU the
kernel runs in Pallas' interpreter (how the tests check it on CPU; slow, for checks only).

Not yet checked on a GPU: whether the compiled kernel is faster than the XLA path, and its
rounding on a bfloat16 cache (the query is cast to the cache's dtype for the kernel's dots;
the partial outputs are kept in that dtype). Hence not the default.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from models.constraints import row_axes

#: What computes a decode step's attention over the cache (``SamplingParams.decode_kernel``):
#: over the dense cache, XLA or the Pallas GPU decode kernel (this module); over a paged
#: cache, XLA or the Pallas TPU or GPU paged-attention kernel (``models.paged_cache``).
DECODE_KERNELS = ("xla", "pallas_gpu", "paged_xla", "paged_tpu", "paged_gpu")


def row_bounds(valid: jax.Array, written: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(start [B], end [B]): the cache slots each row's new token attends over, its first
    valid slot up to the slot it writes (``written``, [B] or one for all rows). A row's real
    tokens are contiguous from its prompt on (``models.continuation``), so these bounds
    select what the mask ``valid & (slot < written)`` selects for every row that is still
    decoding (a finished row's output is discarded; it may read the padding it wrote). A row
    with no valid slot gets an empty range."""
    b, s = valid.shape
    start = jnp.where(jnp.any(valid, axis=1), jnp.argmax(valid, axis=1), s).astype(jnp.int32)
    end = jnp.broadcast_to(jnp.clip(written, 0, s), (b,)).astype(jnp.int32)
    return start, jnp.maximum(end, start)


def kernel_blocks(slots: int) -> tuple[int, int] | None:
    """(k_splits, block_k) for the Pallas kernel over a cache of `slots`: the slots cut into
    k_splits equal parts (run in parallel, merged after), each read in blocks of block_k.
    A part must be a multiple of 128 slots or 16, 32 or 64 of them (block sizes a GPU kernel
    takes): the smallest part that leaves at most 16 parts (the kernel's default count),
    else the smallest part. None: no such cut (slots not a multiple of 16)."""
    parts = [p for p in (16, 32, 64, *range(128, slots + 1, 128)) if slots % p == 0]
    if not parts:
        return None
    few = [p for p in parts if slots // p <= 16]
    part = few[0] if few else parts[0]
    return slots // part, min(part, 128)


def bounded_attention(q: jax.Array, k: jax.Array, v: jax.Array, start: jax.Array,
                      end: jax.Array, interpret: bool | None = None
                      ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One token's attention over each row's cache slots ``[start, end)``, by the Pallas GPU
    decode kernel: q [B,H,hd]; k, v [B,KV,S,hd] (``"slot_rows"`` layout); start, end [B].
    Returns (top [B,KV,G,1], total [B,KV,G,1], out [B,KV,G,hd]), G = H / KV, in float32:
    the largest scaled score m = max q.k / sqrt(hd), l = sum exp(q.k / sqrt(hd) - m) and the
    unnormalised output sum exp(q.k / sqrt(hd) - m) v, as
    ``models.transformer.joined_attention`` merges parts (an empty range: m the float32
    minimum, l and the output 0). Under a context mesh the kernel runs on each device's
    rows and KV heads (``jax.shard_map``: a kernel is opaque to GSPMD). ``interpret``: run
    in Pallas' interpreter (None: unless the arrays live on a GPU)."""
    from jax.experimental.pallas.ops.gpu import decode_attention as pallas_decode

    b, h, hd = q.shape
    kv, slots = k.shape[1], k.shape[2]
    blocks = kernel_blocks(slots)
    if blocks is None:
        raise ValueError(f"decode_kernel=pallas_gpu: a cache of {slots} slots does not cut "
                         "into the kernel's blocks (a multiple of 16 slots)")
    splits, block_k = blocks
    if interpret is None:
        interpret = jax.default_backend() != "gpu"

    def local(q: jax.Array, k: jax.Array, v: jax.Array, start: jax.Array, end: jax.Array):
        n, heads = q.shape[0], q.shape[1]
        # the kernel's layout [B,S,KV,hd]: a view of ours ([B,KV,S,hd]) it swaps back
        out, (total, top) = pallas_decode.gqa(
            q.astype(k.dtype), k.swapaxes(1, 2), v.swapaxes(1, 2), start, end,
            sm_scale=float(1.0 / np.sqrt(hd)), k_splits=splits, block_k=block_k,
            interpret=interpret, return_residuals=True, normalize_output=False)
        g = heads // k.shape[1]
        shape = (n, k.shape[1], g)
        return (top.reshape(*shape, 1).astype(jnp.float32),
                total.reshape(*shape, 1).astype(jnp.float32),
                out.reshape(*shape, hd).astype(jnp.float32))

    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return local(q, k, v, start, end)
    shape = dict(mesh.shape)
    rows = row_axes(shape, b)
    heads = "tensor" if shape.get("tensor", 1) > 1 and kv % shape["tensor"] == 0 else None
    batch: Any = None if not rows else rows[0] if len(rows) == 1 else rows
    spec = PartitionSpec(batch, heads)
    # check_vma off: a compiled Pallas kernel's output carries no varying-axes type (with
    # it on, tracing the kernel for a GPU fails)
    return jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec, PartitionSpec(batch),
                                                     PartitionSpec(batch)),
                         out_specs=(spec, spec, spec), check_vma=False)(q, k, v, start, end)
