"""Where each mesh position's device sits: meshes that follow the network.

A job's devices talk over two networks: a fast one inside a *granule* (the chips of a TPU
slice over ICI, the GPUs of a node over NVLink) and a slow one between granules (the
data-centre network between slices, InfiniBand or Ethernet between nodes). A mesh axis whose
collectives cross granules pays the slow network at every one of them, so the mesh is built
as MaxText and tunix build theirs (``jax.experimental.mesh_utils``):

- the granules: TPU slices (``slice_index``; the hosts of one slice are one granule); GPU or
  CPU nodes, each ``processes_per_node`` consecutive processes (SLURM's and Open MPI's
  default block placement of ranks; a process is its own node where the count is unknown);
- the mesh's axes split into a DCN part (across granules) and an ICI part (inside one):
  ``dcn_shape`` when given, else the granules go to the outermost axes first (data, then
  fsdp, then tensor: :func:`default_dcn`), so FSDP's per-layer gathers and tensor
  parallelism stay inside a node or slice whenever the data axis can take the granules;
- each granule's devices laid out by ``mesh_utils.create_device_mesh`` (a TPU slice's
  physical torus order; GPUs by id; other devices in their order), and the granules' blocks
  placed along the DCN axes, as ``mesh_utils.create_hybrid_device_mesh`` does.

On one granule of CPU or GPU devices the order is the device list's, so a one-process run's
mesh is what a plain reshape gives.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from jax.experimental import mesh_utils


def device_granules(devices: Sequence[Any], processes_per_node: int | None = None
                    ) -> list[list[Any]]:
    """`devices` grouped by the slow network's units, in order: TPU chips by their slice
    (``slice_index``: the hosts of one slice share its ICI, so a slice is one group whatever
    its process count); other devices by node, `processes_per_node` consecutive processes
    each (None: each process its own node)."""
    if getattr(devices[0], "platform", "") == "tpu":
        key = lambda d: getattr(d, "slice_index", 0)  # noqa: E731
    else:
        per = max(1, processes_per_node or 1)
        key = lambda d: getattr(d, "process_index", 0) // per  # noqa: E731
    groups: dict[int, list[Any]] = {}
    for d in devices:
        groups.setdefault(key(d), []).append(d)
    return [groups[k] for k in sorted(groups)]


def default_dcn(sizes: Mapping[str, int], granules: int) -> dict[str, int]:
    """The default DCN part of each axis: the granule count placed on the outermost axes
    first (its greatest common divisor with each in turn). It always places them all: the
    granule count divides the device count, the product of the sizes, so each prime's
    power in it is covered by the sizes' powers taken in turn."""
    dcn, left = {}, granules
    for axis, size in sizes.items():
        dcn[axis] = math.gcd(left, size)
        left //= dcn[axis]
    return dcn


def check_dcn(sizes: Mapping[str, int], dcn_shape: Mapping[str, int], granules: int
              ) -> dict[str, int]:
    """An explicit DCN shape, checked: known axes, each dividing its mesh axis, their product
    the granule count."""
    unknown = set(dcn_shape) - set(sizes)
    if unknown:
        raise ValueError(f"mesh.dcn_shape: unknown axes {sorted(unknown)}; use {tuple(sizes)}")
    dcn = {a: int(dcn_shape.get(a, 1)) for a in sizes}
    bad = [a for a in sizes if dcn[a] < 1 or sizes[a] % dcn[a]]
    if bad:
        raise ValueError(f"mesh.dcn_shape: {dcn} does not divide the mesh {dict(sizes)} "
                         f"along {bad}")
    if math.prod(dcn.values()) != granules:
        raise ValueError(f"mesh.dcn_shape: {dcn} spans {math.prod(dcn.values())} nodes or "
                         f"slices; the job has {granules}")
    return dcn


def granule_grid(shape: Sequence[int], devices: Sequence[Any]) -> np.ndarray:
    """One granule's devices as a grid of `shape`: ``create_device_mesh`` (a TPU's physical
    order, splitting its physical axes where a logical one needs it), else their order."""
    if getattr(devices[0], "platform", "") == "tpu":
        for split in (False, True):
            try:
                return mesh_utils.create_device_mesh(
                    shape, list(devices), allow_split_physical_axes=split)
            except (ValueError, NotImplementedError, AssertionError):
                continue
    if getattr(devices[0], "platform", "") == "gpu":
        devices = sorted(devices, key=lambda d: d.id)
    return np.asarray(devices, dtype=object).reshape(shape)


def device_grid(sizes: Mapping[str, int], devices: Sequence[Any],
                dcn_shape: Mapping[str, int] | None = None,
                processes_per_node: int | None = None) -> tuple[np.ndarray, dict[str, int]]:
    """(the devices as a grid of the mesh's `sizes`, the DCN part of each axis): each
    granule's block (:func:`granule_grid` of the ICI shape, sizes / DCN) placed at its
    position along the DCN axes."""
    granules = device_granules(devices, processes_per_node)
    if len({len(g) for g in granules}) > 1:
        raise ValueError(f"mesh: the nodes or slices hold different device counts "
                         f"{[len(g) for g in granules]}")
    dcn = (check_dcn(sizes, dcn_shape, len(granules)) if dcn_shape
           else default_dcn(sizes, len(granules)))
    ici = [sizes[a] // dcn[a] for a in sizes]
    blocks = [granule_grid(ici, g) for g in granules]
    grid = np.empty([sizes[a] for a in sizes], dtype=object)
    for i, position in enumerate(np.ndindex(*dcn.values())):
        index = tuple(slice(p * n, (p + 1) * n) for p, n in zip(position, ici))
        grid[index] = blocks[i]
    return grid, dcn
