"""Parameters placed on a mesh shard by shard, each read only by the processes that hold it.

    params = place_sharded(weights.leaves, weights.read, mesh, jnp.float32)

For every parameter ``jax.make_array_from_callback`` asks for the slice each of this
process's devices holds (``models.sharding.param_shardings``), and the slice is read from
its source, cast to the run's dtype, and handed over: no host holds the whole model in
float32, and nothing is gathered across processes (a ``jax.device_put`` of a host array
onto a global sharding first checks that every process holds the same value, an all-gather
of the whole array onto every device). A slice two local devices share (replicated axes) is
read once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from models.sharding import param_shardings
from models.transformer import Params

Index = tuple[slice, ...]


def place_sharded(leaves: Params, read: Callable[[Any, Index], np.ndarray], mesh: Mesh,
                  dtype: Any) -> Params:
    """`leaves` (a parameter tree whose leaves have a ``shape``: ``models.loaders.LeafSource``
    or host arrays) as global arrays of `dtype` over `mesh`; ``read(leaf, index)`` returns
    the leaf's ``[index]`` (any float dtype)."""
    is_leaf = lambda x: hasattr(x, "shape")  # noqa: E731
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(tuple(x.shape), dtype), leaves,
                          is_leaf=is_leaf)
    shardings = param_shardings(shapes, mesh)

    def one(leaf: Any, sharding: Any) -> jax.Array:
        slices: dict[tuple, np.ndarray] = {}

        def shard(index: Index | None) -> np.ndarray:
            index = index or ()  # None: the whole (scalar) leaf
            key = tuple((s.start, s.stop, s.step) for s in index)
            if key not in slices:
                slices[key] = np.asarray(read(leaf, index), dtype)
            return slices[key]

        return jax.make_array_from_callback(tuple(leaf.shape), sharding, shard)

    return jax.tree.map(one, leaves, shardings, is_leaf=is_leaf)


def host_slice(leaf: np.ndarray, index: Index) -> np.ndarray:
    """A ``read`` for :func:`place_sharded` over host arrays (the presets: a small model
    every process builds the same way)."""
    return leaf[index]
