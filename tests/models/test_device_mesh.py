"""Meshes that follow the network (``models.device_mesh``): devices grouped into nodes or
slices, each axis split into a part across them and a part inside one. Fake devices carry
the attributes JAX's have (id, process_index, slice_index, platform); the expected grids are
written out by hand."""

from types import SimpleNamespace

import numpy as np
import pytest

from models.device_mesh import default_dcn, device_granules, device_grid
from models.sharding import make_mesh

SIZES = ("data", "fsdp", "tensor")


def _devices(processes: int, per: int) -> list:
    return [SimpleNamespace(id=p * 100 + i, process_index=p, platform="cpu")
            for p in range(processes) for i in range(per)]


def _ids(grid: np.ndarray) -> list:
    return np.vectorize(lambda d: d.id)(grid).tolist()


def test_the_data_axis_goes_across_nodes_first():
    """2 nodes (one process each) x 4 devices, data 2 x fsdp 4: each data row is one node,
    so FSDP's gathers stay inside a node."""
    grid, dcn = device_grid(dict(zip(SIZES, (2, 4, 1))), _devices(2, 4))
    assert dcn == {"data": 2, "fsdp": 1, "tensor": 1}
    assert _ids(grid[:, :, 0]) == [[0, 1, 2, 3], [100, 101, 102, 103]]


def test_fsdp_over_every_device_crosses_nodes_in_the_device_order():
    """data 1: the 2 nodes go to fsdp, and the order is the device list's (what a plain
    reshape gave before: a 2-process job still trains like 1 x 4)."""
    devices = _devices(2, 2)
    grid, dcn = device_grid(dict(zip(SIZES, (1, 4, 1))), devices)
    assert dcn == {"data": 1, "fsdp": 2, "tensor": 1}
    assert _ids(grid.reshape(-1)) == [0, 1, 100, 101]
    assert default_dcn({"data": 6, "fsdp": 2, "tensor": 1}, 4) == {"data": 2, "fsdp": 2,
                                                                      "tensor": 1}


def test_processes_sharing_a_node_are_one_granule_whatever_the_list_order():
    """4 processes, 2 per node (SLURM's block placement: ranks 0-1 on node 0), 2 devices
    each, listed interleaved: node 0 holds processes 0 and 1, and data row 0 is its 4
    devices."""
    devices = _devices(4, 2)
    shuffled = devices[::2] + devices[1::2]
    assert [[d.id for d in g] for g in device_granules(shuffled, 2)] == [
        [0, 100, 1, 101], [200, 300, 201, 301]]
    grid, _ = device_grid(dict(zip(SIZES, (2, 4, 1))), shuffled, processes_per_node=2)
    assert _ids(grid[:, :, 0]) == [[0, 100, 1, 101], [200, 300, 201, 301]]


def test_tpu_slices_are_the_granules_whatever_their_hosts():
    """Two slices of 2 hosts: 2 granules; one slice of 4 hosts (a v5e-16: 4 processes on one
    ICI): 1 granule, the whole slice laid out as one torus."""
    tpu = [SimpleNamespace(**{**vars(d), "platform": "tpu", "slice_index": d.process_index // 2})
           for d in _devices(4, 2)]
    assert [[d.id for d in g] for g in device_granules(tpu)] == [[0, 1, 100, 101],
                                                                 [200, 201, 300, 301]]
    one_slice = [SimpleNamespace(**{**vars(d), "slice_index": 0}) for d in tpu]
    assert len(device_granules(one_slice)) == 1


def test_an_explicit_dcn_shape_puts_that_axis_across():
    """mesh.dcn_shape={fsdp: 2}: data inside a node, fsdp across: node 0's 4 devices fill
    the first half of the fsdp axis for both data rows."""
    grid, dcn = device_grid(dict(zip(SIZES, (2, 4, 1))), _devices(2, 4), {"fsdp": 2})
    assert dcn == {"data": 1, "fsdp": 2, "tensor": 1}
    assert _ids(grid[:, :, 0]) == [[0, 1, 100, 101], [2, 3, 102, 103]]


@pytest.mark.parametrize("dcn, message", [
    ({"data": 3}, r"does not divide the mesh .* along \['data'\]"),
    ({"data": 1}, r"spans 1 nodes or slices; the job has 2"),
    ({"pipeline": 2}, r"unknown axes \['pipeline'\]"),
])
def test_a_dcn_shape_that_does_not_fit_is_refused_naming_the_key(dcn, message):
    with pytest.raises(ValueError, match=r"^mesh\.dcn_shape: .*" + message):
        make_mesh({"data": 2, "fsdp": 4}, devices=_devices(2, 4), dcn_shape=dcn)


def test_nodes_of_unequal_size_are_refused():
    devices = _devices(2, 2)[:3]
    with pytest.raises(ValueError, match=r"different device counts \[2, 1\]"):
        make_mesh({"data": -1}, devices=devices)


def test_one_process_keeps_the_device_order():
    devices = _devices(1, 8)
    mesh_grid, _ = device_grid(dict(zip(SIZES, (2, 2, 2))), devices)
    assert _ids(mesh_grid.reshape(-1)) == [d.id for d in devices]
