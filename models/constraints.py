"""Activation sharding constraints for the mesh in context (``jax.set_mesh``).

Model code stays device-free: :func:`shard_rows` is a no-op unless the caller (``rl.run.loop``,
``rl.plan``) runs it under ``jax.set_mesh(mesh)``. There it pins an activation's batch axis to
the data-parallel mesh axes, which GSPMD's propagation alone does not keep: with FSDP the
weights' ``embed`` axis is sharded over ``fsdp`` too, and the log-prob pass then computed the
whole batch's logits on every device (ten times the temporaries; the measurement is on the
benchmarks page, "Design measurements").
"""

from __future__ import annotations

import math

import jax
from jax.sharding import PartitionSpec

#: Mesh axes the batch is split over (``models.sharding.DEFAULT_RULES["batch"]``).
BATCH_AXES = ("data", "fsdp")


def dividing_axes(shape: dict[str, int], size: int,
                  candidates: tuple[str, ...]) -> tuple[str, ...]:
    """The axes among ``candidates`` of a mesh of axis sizes ``shape`` that split ``size``
    evenly, in order, each used only while ``size`` still divides."""
    axes: list[str] = []
    for a in candidates:
        n = shape.get(a, 1)
        if n > 1 and size % (math.prod(shape[b] for b in axes) * n) == 0:
            axes.append(a)
    return tuple(axes)


def row_axes(shape: dict[str, int], size: int) -> tuple[str, ...]:
    """The batch axes of a mesh of axis sizes ``shape`` that split ``size`` rows evenly."""
    return dividing_axes(shape, size, BATCH_AXES)


def shard_rows(x: jax.Array, axis: int = 0) -> jax.Array:
    """``x`` with its ``axis`` sharded over the context mesh's batch axes (the others
    replicated); ``x`` unchanged without a context mesh or when no batch axis divides it."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    axes = row_axes(dict(mesh.shape), x.shape[axis])
    if not axes:
        return x
    spec: list[str | tuple[str, ...] | None] = [None] * x.ndim
    spec[axis] = axes[0] if len(axes) == 1 else axes
    return jax.lax.with_sharding_constraint(x, PartitionSpec(*spec))


def shard_tree_rows(tree: object, axis: int = 0) -> object:
    """:func:`shard_rows` on every array leaf of ``tree``."""
    return jax.tree.map(lambda a: shard_rows(a, axis), tree)


def whole_model_axis(w: jax.Array) -> jax.Array:
    """A [D,V] unembedding with its model axis D whole on every device under the context
    mesh (V left to the compiler: split over ``tensor`` where the rules split it); ``w``
    unchanged without a context mesh.

    Why: FSDP splits D over ``fsdp``, the axis the scored rows are split over too, and GSPMD
    picks how to contract them. At 8 fsdp shards (Qwen3-14B's reference pass on v5p:2x2x2,
    libtpu 0.0.42.1) it chose a windowed einsum, a ring of collective-permutes of W's D
    slices, and the TPU compiler's layout assignment then ran for over 25 min without
    finishing; at 4 shards it gathered W, and the whole compile took 53 s. Pinned, every
    mesh gathers W (one [D,V] per device for the scoring), as GSPMD already did on the
    slices ``rl.plan`` compiled before."""
    if jax.sharding.get_abstract_mesh().empty:
        return w
    return jax.lax.with_sharding_constraint(w, PartitionSpec(None, PartitionSpec.UNCONSTRAINED))
