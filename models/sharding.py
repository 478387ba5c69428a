"""Logical axes -> a device mesh: the same code on one CPU, one GPU or a multi-host TPU pod.

Every parameter dimension has a logical name ("vocab", "embed", "heads", "mlp", ...); rules map
logical names to mesh axes ("data", "fsdp", "tensor"). jit then propagates the shardings of
parameters and batch through the whole step (GSPMD), so model code carries no device logic.
A dimension that a mesh axis does not divide evenly stays replicated rather than failing.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from models.constraints import dividing_axes
from models.device_mesh import device_grid
from models.paged_cache import PagedCache, shard_specs
from models.transformer import KVCache, Params

log = logging.getLogger(__name__)

MESH_AXES = ("data", "fsdp", "tensor")

# logical axis -> mesh axis (or tuple of mesh axes, or None = replicated)
DEFAULT_RULES: dict[str, Any] = {
    "batch": ("data", "fsdp"),
    "vocab": "tensor",
    "embed": "fsdp",
    "heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
    "layers": None,
    "norm": None,
}

LAYER_AXES = {
    "attn_norm": ("layers", "norm"),
    "mlp_norm": ("layers", "norm"),
    "q_norm": ("layers", "norm"),
    "k_norm": ("layers", "norm"),
    "wq": ("layers", "embed", "heads"),
    "wk": ("layers", "embed", "kv_heads"),
    "wv": ("layers", "embed", "kv_heads"),
    "bq": ("layers", "heads"),
    "bk": ("layers", "kv_heads"),
    "bv": ("layers", "kv_heads"),
    "wo": ("layers", "heads", "embed"),
    "w_gate": ("layers", "embed", "mlp"),
    "w_up": ("layers", "embed", "mlp"),
    "w_down": ("layers", "mlp", "embed"),
}


def logical_axes(params: Params) -> Params:
    """The logical axis names of every parameter, as a pytree shaped like `params`."""
    axes: Params = {"embed": ("vocab", "embed"), "final_norm": ("norm",),
                    "layers": {k: LAYER_AXES[k] for k in params["layers"]}}
    if "lm_head" in params:
        axes["lm_head"] = ("embed", "vocab")
    return axes


def host_copy(tree: Any) -> Any:
    """`tree`'s arrays as numpy on this host, whole: ``jax.device_get`` where this process
    holds every shard, otherwise an all-gather across the job's processes
    (``multihost_utils.process_allgather``; every process must call it, in the same order)."""
    def one(x: Any) -> Any:
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            if x.is_fully_replicated:
                return np.asarray(x.addressable_data(0))
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return jax.device_get(x)

    return jax.tree.map(one, tree)


def make_mesh(shape: Mapping[str, int] | None = None, devices: list | None = None,
              dcn_shape: Mapping[str, int] | None = None,
              processes_per_node: int | None = None) -> Mesh:
    """A mesh over (data, fsdp, tensor). One axis may be -1: it takes the remaining devices.
    The devices are placed following the network (``models.device_mesh.device_grid``): each
    axis's part across nodes or slices is `dcn_shape`'s (None: data first), the rest inside
    one."""
    devices = devices if devices is not None else jax.devices()
    shape = dict(shape or {"data": -1})
    unknown = set(shape) - set(MESH_AXES)
    if unknown:
        raise ValueError(f"mesh: unknown axes {sorted(unknown)}; use {MESH_AXES}")
    sizes = {a: int(shape.get(a, 1)) for a in MESH_AXES}
    free = [a for a, s in sizes.items() if s == -1]
    if len(free) > 1:
        raise ValueError(f"mesh: at most one axis may be -1, got {free}")
    known = math.prod(s for s in sizes.values() if s != -1)
    if free:
        if len(devices) % known:
            raise ValueError(f"mesh: {len(devices)} devices not divisible by {known}")
        sizes[free[0]] = len(devices) // known
    if math.prod(sizes.values()) != len(devices):
        raise ValueError(f"mesh: shape {sizes} needs {math.prod(sizes.values())} devices, "
                         f"have {len(devices)}")
    grid, _ = device_grid(sizes, devices, dcn_shape, processes_per_node)
    return Mesh(grid, MESH_AXES)


def _spec(shape: tuple[int, ...], names: tuple[str | None, ...], mesh: Mesh,
          rules: Mapping[str, Any]) -> PartitionSpec:
    parts: list[str | tuple[str, ...] | None] = []
    used: set[str] = set()
    for dim, name in zip(shape, names):
        target = rules.get(name) if name else None
        axes = (target,) if isinstance(target, str) else tuple(target or ())
        axes = tuple(a for a in axes if a not in used and mesh.shape[a] > 1)
        size = math.prod(mesh.shape[a] for a in axes)
        if not axes or dim % size:
            parts.append(None)
            continue
        used.update(axes)
        parts.append(axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*parts)


def param_shardings(params: Params, mesh: Mesh,
                    rules: Mapping[str, Any] = DEFAULT_RULES) -> Params:
    """NamedSharding for every parameter, from its logical axes and the rules."""
    axes = logical_axes(params)
    return jax.tree.map(lambda x, names: NamedSharding(mesh, _spec(x.shape, names, mesh, rules)),
                        params, axes, is_leaf=lambda x: isinstance(x, tuple))


def sharding_like(shape: tuple[int, ...], sharding: NamedSharding) -> NamedSharding:
    """`sharding`'s split for an array of `shape` of the same rank (a quantized weight's codes
    or block maxima beside the weight): each dimension split by the same mesh axes where
    they divide it, else whole."""
    parts = []
    for dim, part in zip(shape, sharding.spec + (None,) * (len(shape) - len(sharding.spec))):
        axes = () if part is None else (part,) if isinstance(part, str) else tuple(part)
        size = math.prod(sharding.mesh.shape[a] for a in axes)
        parts.append(part if axes and dim % size == 0 else None)
    return NamedSharding(sharding.mesh, PartitionSpec(*parts))


def batch_sharding(mesh: Mesh, ndim: int = 2, batch_size: int | None = None,
                   rules: Mapping[str, Any] = DEFAULT_RULES) -> NamedSharding:
    """Shard the leading (batch) axis over the data-parallel mesh axes."""
    shape = (batch_size if batch_size is not None else 0,) + (1,) * (ndim - 1)
    names = ("batch",) + (None,) * (ndim - 1)
    if batch_size is None:  # caller promises divisibility
        rule = rules["batch"]
        axes = tuple(a for a in ((rule,) if isinstance(rule, str) else rule) if mesh.shape[a] > 1)
        return NamedSharding(mesh, PartitionSpec(axes or None))
    return NamedSharding(mesh, _spec(shape, names, mesh, rules))


def batch_shards(mesh: Mesh, rules: Mapping[str, Any] = DEFAULT_RULES) -> int:
    """How many shards :func:`batch_sharding` cuts the batch axis into."""
    rule = rules["batch"]
    return math.prod(mesh.shape[a] for a in ((rule,) if isinstance(rule, str) else rule))


def shard(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(jax.device_put, tree, shardings)


def decode_param_shardings(params: Params, mesh: Mesh,
                           rules: Mapping[str, Any] = DEFAULT_RULES) -> Params:
    """NamedSharding for the sampler's form of the weights (``models.sampler.decode_params``:
    "layers" a tuple of per-layer dicts, and an "unembed" [D,V] in a narrower decode dtype):
    each layer's weights by the rules of the stacked ones without their layers axis."""
    def spec(x: Any, names: tuple) -> NamedSharding:
        return NamedSharding(mesh, _spec(x.shape, names, mesh, rules))

    out: Params = {"embed": spec(params["embed"], ("vocab", "embed")),
                   "final_norm": spec(params["final_norm"], ("norm",)),
                   "layers": tuple({k: spec(a, LAYER_AXES[k][1:]) for k, a in layer.items()}
                                   for layer in params["layers"])}
    if "lm_head" in params:
        out["lm_head"] = spec(params["lm_head"], ("embed", "vocab"))
    if "unembed" in params:  # as the sampler uses it (models.sampler.row_logits)
        out["unembed"] = (vocab_sharding(mesh, params["unembed"].shape[1])
                          or spec(params["unembed"], ("embed", "vocab")))
    return out


def vocab_sharding(mesh: Mesh, vocab: int) -> NamedSharding | None:
    """A [D,V] unembedding split along its vocabulary over the mesh axes that split weights
    (``fsdp``, ``tensor``; in order, while V still divides), replicated over ``data``; None
    when no such axis divides V (or the weights are replicated: nothing to gather)."""
    axes = dividing_axes(dict(mesh.shape), vocab, ("fsdp", "tensor"))
    if not axes:
        return None
    return NamedSharding(mesh, PartitionSpec(None, axes[0] if len(axes) == 1 else axes))


def cache_shardings(cache: Any, mesh: Mesh, rules: Mapping[str, Any] = DEFAULT_RULES) -> Any:
    """NamedSharding for a KV cache (``models.transformer.KVCache``: keys [B,KV,hd,S], values
    [B,KV,S,hd] per layer, valid [B,S]): rows over the data-parallel axes, KV heads by the
    rules."""
    return type(cache)(tuple(cache_layer_sharding(k, mesh, rules) for k in cache.k),
                       tuple(cache_layer_sharding(v, mesh, rules) for v in cache.v),
                       NamedSharding(mesh, _spec(cache.valid.shape, ("batch", None), mesh,
                                                 rules)))


def cache_layer_sharding(layer: Any, mesh: Mesh,
                         rules: Mapping[str, Any] = DEFAULT_RULES) -> NamedSharding:
    """NamedSharding for one layer's keys or values of a KV cache (:func:`cache_shardings`)."""
    return NamedSharding(mesh, _spec(layer.shape, ("batch", "kv_heads", None, None), mesh,
                                     rules))


def paged_shardings(cache: Any, mesh: Mesh) -> Any:
    """NamedSharding for a paged KV cache (``models.paged_cache``): each layer's pools
    [KV,N,P,hd] with their pages over the axes its rows' table [B,pages] is split over,
    KV heads over ``tensor`` where it divides them (``models.paged_cache.shard_specs``); the
    prompts its groups share by the same rows' axes."""
    rows, heads = shard_specs(mesh, cache.table.shape[0], cache.k[0].shape[0])
    pool, by_rows = NamedSharding(mesh, PartitionSpec(heads, rows)), NamedSharding(
        mesh, PartitionSpec(rows))
    prompts = None if cache.prompts is None else type(cache.prompts)(by_rows, by_rows, by_rows)
    return type(cache)(tuple(pool for _ in cache.k), tuple(pool for _ in cache.v), by_rows,
                       prompts)


def row_shardings(tree: Any, mesh: Mesh, rules: Mapping[str, Any] = DEFAULT_RULES) -> Any:
    """NamedSharding for every array of `tree` whose leading axis is rows (a batch): rows over
    the data-parallel axes (:func:`batch_sharding`), a ``KVCache`` by :func:`cache_shardings`,
    a paged cache by :func:`paged_shardings`, scalars replicated. What the sampler constrains
    its prompts, cache and outputs to."""
    def one(x: Any) -> Any:
        if isinstance(x, PagedCache):
            return paged_shardings(x, mesh)
        if isinstance(x, KVCache):
            return cache_shardings(x, mesh, rules)
        if x.ndim == 0:
            return NamedSharding(mesh, PartitionSpec())
        return batch_sharding(mesh, x.ndim, x.shape[0], rules)

    return jax.tree.map(one, tree, is_leaf=lambda x: isinstance(x, (KVCache, PagedCache)))


def place_rows(tree: Any, mesh: Mesh | None, abstract: bool = False) -> Any:
    """`tree`'s host arrays laid out as the sampler keeps its rows (:func:`row_shardings`;
    the default device without a mesh; None stays None): on the devices, or with
    ``abstract`` as ``jax.ShapeDtypeStruct`` carrying those shardings, which is what
    ``rl.plan`` compiles for devices it does not hold."""
    return _placed(tree, None if mesh is None else row_shardings(tree, mesh), abstract)


def place_replicated(tree: Any, mesh: Mesh | None, abstract: bool = False) -> Any:
    """`tree`'s host arrays as :func:`place_rows` places them, but whole on every device."""
    return _placed(tree, None if mesh is None else jax.tree.map(
        lambda _: NamedSharding(mesh, PartitionSpec()), tree), abstract)


def _placed(tree: Any, shardings: Any, abstract: bool) -> Any:
    """`tree` on `shardings` (None: unplaced, the default device), or as abstract arrays."""
    if shardings is None:
        one = ((lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype)) if abstract
               else jnp.asarray)
        return jax.tree.map(one, tree)
    if abstract:
        return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                            tree, shardings)
    return jax.device_put(tree, shardings)


def constrain_rows(tree: Any, mesh: Mesh | None) -> Any:
    """`tree` under jit with :func:`row_shardings` (``with_sharding_constraint``); unchanged
    without a mesh."""
    if mesh is None:
        return tree
    return jax.lax.with_sharding_constraint(tree, row_shardings(tree, mesh))
