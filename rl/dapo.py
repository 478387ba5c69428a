"""DAPO pieces: dynamic-sampling filter, overlong reward shaping, host-side batch filling."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rl.group_stats import homogeneous_groups


def informative_groups(rewards: jax.Array, tol: float = 1e-6) -> jax.Array:
    """[N] bool: ``std_G(R) > tol``, i.e. the group is not homogeneous and carries a signal."""
    return ~homogeneous_groups(rewards, tol)


def overlong_penalty(
    lengths: jax.Array, max_len: int, buffer_len: int, penalty: float = 1.0
) -> jax.Array:
    """DAPO soft overlong punishment per response, [B] float.

    With ``L_exp = max_len - buffer_len``::

        0                                      if L <= L_exp
        (L_exp - L) / buffer_len * penalty     if L_exp < L <= max_len
        -penalty                               if L > max_len
    """
    lengths = jnp.asarray(lengths, dtype=jnp.result_type(float))
    expected = max_len - buffer_len
    # max(., 1): with buffer_len = 0 the middle branch is empty; avoid a 0/0 in the unused branch.
    ramp = (expected - lengths) / max(buffer_len, 1) * penalty
    out = jnp.where(lengths <= expected, 0.0, ramp)
    return jnp.where(lengths > max_len, -penalty, out)


def fill_batch(
    draw: Callable[[int], tuple[Sequence[Any], np.ndarray]],
    target_groups: int,
    max_gen_batches: int,
    tol: float = 1e-6,
) -> tuple[list[Any], np.ndarray, dict[str, Any]]:
    """DAPO dynamic sampling on the host (numpy, not jitted).

    Calls ``draw(i) -> (items, rewards[N, G])`` for i = 0, 1, ... (``items`` has one entry per
    group), keeps only groups with ``std_G(R) > tol``, and stops once ``target_groups`` are kept
    (truncating to exactly that many) or after ``max_gen_batches`` draws. If it ends short it
    returns the groups it has (possibly none, ``filled=False``); the caller decides what to do.

    Returns ``(items, rewards[K, G], {"gen_batches", "dropped_groups", "filled"})`` where
    ``dropped_groups`` counts the homogeneous groups filtered out.
    """
    items: list[Any] = []
    rewards: list[np.ndarray] = []
    dropped = 0
    n = 0
    while n < max_gen_batches and len(items) < target_groups:
        batch_items, batch_rewards = draw(n)
        n += 1
        batch_rewards = np.asarray(batch_rewards)
        if len(batch_items) != batch_rewards.shape[0]:
            raise ValueError(
                f"draw({n - 1}) gave {len(batch_items)} items for {batch_rewards.shape[0]} groups"
            )
        keep = np.std(batch_rewards, axis=-1) > tol
        dropped += int(np.sum(~keep))
        items.extend(item for item, k in zip(batch_items, keep) if k)
        rewards.append(batch_rewards[keep])
    items = items[:target_groups]
    out = np.concatenate(rewards, axis=0)[:target_groups] if rewards else np.zeros((0, 0))
    info = {"gen_batches": n, "dropped_groups": dropped, "filled": len(items) >= target_groups}
    return items, out, info
