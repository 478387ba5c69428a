"""Laying variable-length token rows into padded arrays.

Prompts and responses come in many lengths, and batches in many sizes; jitted functions
compile once per shape. These helpers pad to a few sizes only: :func:`round_up` rounds a
length up to a multiple of a bucket, :func:`prompt_count_bucket` rounds a count of rows, and
:func:`left_pad` lays token lists into a left-padded [rows, width] array with the mask of its
real tokens (the sampler's and the judges' prompts, the training batch's prefixes),
:func:`right_pad` into a right-padded one (the prompts of a paged KV cache, whose rows start
at slot 0).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def round_up(n: int, size: int) -> int:
    """n rounded up to a multiple of `size`, at least `size`: padded shapes come in few sizes,
    so jitted functions compile few times."""
    return max(size, -(-n // size) * size)


def prompt_count_bucket(n: int) -> int:
    """How many distinct prompts a prefill holds for `n`: the next power of two up to 8, then
    a multiple of 1/8 of the next power of two (10, 12, 14, 16, 20, 24, ...: at most 1/4 of
    filler rows). A GRPO batch's distinct prompts drop below its prompt count whenever two
    prompts coincide; without a bucket each such step compiled a new rollout program
    (seconds on a real model: the benchmarks page)."""
    if n <= 8:
        return 1 << max(0, (n - 1).bit_length())
    return round_up(n, 1 << ((n - 1).bit_length() - 3))


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int,
             bucket: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """Left-pad token lists to a common length rounded up to `bucket` (fewer recompiles)."""
    return _padded(prompts, pad_id, bucket, left=True)


def right_pad(prompts: Sequence[Sequence[int]], pad_id: int,
              bucket: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """:func:`left_pad` with the padding after each row's tokens."""
    return _padded(prompts, pad_id, bucket, left=False)


def _padded(prompts: Sequence[Sequence[int]], pad_id: int, bucket: int,
            left: bool) -> tuple[np.ndarray, np.ndarray]:
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    width = round_up(max(len(p) for p in prompts), bucket)
    tokens = np.full((len(prompts), width), pad_id, np.int32)
    mask = np.zeros((len(prompts), width), bool)
    for i, p in enumerate(prompts):
        at = slice(width - len(p), None) if left else slice(0, len(p))
        tokens[i, at] = p
        mask[i, at] = True
    return tokens, mask
