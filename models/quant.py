"""Frozen weights stored quantized (QLoRA, Dettmers et al. 2023, arXiv:2305.14314): the base
model of a LoRA run held as 8-bit integers or 4-bit NormalFloat codes, dequantized inside each
matmul (``models.transformer.dense``), while the adapters train in float32.

Both formats quantize a weight W [..., D, F] (``x @ W``) in blocks of :data:`BLOCK` = 64
consecutive values along its contraction axis D, each block with its own absolute maximum
m = max |w| (QLoRA section 2, "block-wise k-bit quantization"; block size 64, their choice
for NF4):

    int8   code = round(127 w / m)                in [-127, 127]   w' = code m / 127
    nf4    code = argmin_i |w / m - q_i|           in [0, 15]       w' = q_i m

with q the 16 NormalFloat levels of QLoRA's appendix E (the quantiles of N(0, 1) scaled to
[-1, 1], with an exact 0), as bitsandbytes ships them. Two NF4 codes share a byte (the even
row of a D pair in the low nibble). The block maxima are kept in float32: QLoRA's "double
quantization" of them (8-bit maxima in blocks of 256) is not done here, so they cost 0.5 bits
per parameter instead of 0.127.

Why our own and not qwix's quantized arrays: qwix quantizes inside a Flax module's
``dot_general`` (the same interception its LoRA provider uses, see ``models.lora``); our
forward is plain functions over a dict under ``lax.scan``, so a weight is a pytree here
(:class:`Quantized`) that ``dense`` dequantizes, and scans slice like any other.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

BLOCK = 64
QUANT_KINDS = ("none", "int8", "nf4")

# QLoRA's NF4 levels (appendix E), as bitsandbytes' functional.py lists them
NF4_LEVELS = np.asarray([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], np.float32)


@functools.partial(jax.tree_util.register_dataclass, data_fields=("codes", "scales"),
                   meta_fields=("kind",))
@dataclasses.dataclass(frozen=True)
class Quantized:
    """A weight W [..., D, F] stored quantized: `codes` int8 [..., D, F] (``int8``) or uint8
    [..., D / 2, F] (``nf4``, two codes a byte), `scales` float32 [..., D / 64, F] (each
    block's absolute maximum). Leading axes (the layers) slice like any array's."""

    codes: jax.Array
    scales: jax.Array
    kind: str

    @property
    def shape(self) -> tuple[int, ...]:
        *lead, d, f = self.codes.shape
        return (*lead, d * (2 if self.kind == "nf4" else 1), f)


def check_blocks(shape: tuple[int, ...], name: str) -> None:
    """ValueError naming `name` when its contraction axis is not whole blocks."""
    if shape[-2] % BLOCK:
        raise ValueError(f"{name}: its contraction axis ({shape[-2]}) is not a multiple of the "
                         f"quantization block ({BLOCK})")


def _blocks(w: jax.Array) -> tuple[jax.Array, jax.Array]:
    """w [..., D, F] as [..., D / 64, 64, F] and each block's absolute maximum (1 where a
    block is all zeros, so that it divides)."""
    *lead, d, f = w.shape
    blocks = w.astype(jnp.float32).reshape(*lead, d // BLOCK, BLOCK, f)
    m = jnp.max(jnp.abs(blocks), axis=-2)
    return blocks, jnp.where(m > 0, m, 1.0)


def quantize(w: jax.Array, kind: str) -> Quantized:
    """`w` [..., D, F] in `kind` (``int8`` or ``nf4``; the module docstring's formulas)."""
    blocks, m = _blocks(w)
    x = blocks / m[..., None, :]
    if kind == "int8":
        codes = jnp.round(127.0 * x).astype(jnp.int8).reshape(w.shape)
        return Quantized(codes, m, kind)
    if kind != "nf4":
        raise ValueError(f"quantize: unknown kind {kind!r}; expected int8 or nf4")
    idx = jnp.argmin(jnp.abs(x[..., None] - jnp.asarray(NF4_LEVELS)), axis=-1)
    idx = idx.astype(jnp.uint8).reshape(*w.shape[:-2], w.shape[-2] // 2, 2, w.shape[-1])
    return Quantized(idx[..., 0, :] | (idx[..., 1, :] << 4), m, kind)


def dequantize(q: Quantized, dtype: Any = jnp.float32) -> jax.Array:
    """The weight `q` stands for, in `dtype` (computed in float32)."""
    if q.kind == "int8":
        values = q.codes.astype(jnp.float32) / 127.0
    else:
        low, high = q.codes & 0xF, q.codes >> 4
        idx = jnp.stack([low, high], axis=-2).reshape(q.shape)
        values = jnp.asarray(NF4_LEVELS)[idx]
    *lead, d, f = q.shape
    blocks = values.reshape(*lead, d // BLOCK, BLOCK, f) * q.scales[..., None, :]
    return blocks.reshape(q.shape).astype(dtype)
