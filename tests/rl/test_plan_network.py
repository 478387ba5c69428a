"""rl.plan's network model (``rl.plan_network``): a hierarchical ring's bytes per chip over
the fast interconnect and over the network, and the step's collectives, by hand."""

import pytest

from rl.plan_network import StepShape, Traffic, gather, step_traffic

SIZES = {"data": 2, "fsdp": 4, "tensor": 1}


def test_a_hierarchical_gather_by_hand():
    # 800 bytes over 4 chips in each of 2 granules: a chip holds 100; it receives 1 x 100
    # across the network and 3 x 2 x 100 inside its granule; 700 = 800 x 7/8 in all
    assert gather(800, 4, 2) == Traffic(ici=600, dcn=100)
    assert gather(800, 8, 1) == Traffic(ici=700, dcn=0)
    assert gather(800, 1, 8) == Traffic(ici=0, dcn=700)


def _shape(**kw):
    base = dict(weights=2000.0, grads=4000.0, updates=2, micro_batches=4, reference_parts=0,
                decode_steps=10, decode_gathered=70.0)
    return StepShape(**(base | kw))


def test_data_across_nodes_keeps_fsdp_inside_by_hand():
    """data 2 across 2 nodes, fsdp 4 inside: 1,000 parameters, bfloat16 compute, 2 updates
    of 4 micro-batches. Weight gathers: 2,000 bytes x 3/4 = 1,500 per pass, forward and
    backward of 8 micro-batches: 24,000 inside. Gradients, float32: 4,000 x 3/4 x 8 = 24,000
    inside. The data all-reduce of each chip's 1,000-byte shard over 2 nodes: 500 each way,
    twice per update: 2,000 over the network. The decode's 70 bytes a step over the 4 fsdp
    chips, all inside, x 10 steps."""
    t = step_traffic(_shape(), SIZES, {"data": 2, "fsdp": 1, "tensor": 1}, SIZES,
                     {"data": 2, "fsdp": 1, "tensor": 1})
    assert t["update weight gathers (fsdp)"] == Traffic(24_000, 0)
    assert t["gradient reduce-scatter (fsdp)"] == Traffic(24_000, 0)
    assert t["gradient all-reduce (data)"] == Traffic(0, 2_000)
    assert t["rollout decode gathers"] == Traffic(700, 0)
    assert t["reference weight gathers (fsdp)"] == Traffic(0, 0)


def test_fsdp_across_nodes_sends_its_gathers_over_the_network_by_hand():
    """mesh.dcn_shape={fsdp: 2}: fsdp 4 = 2 inside x 2 across. A weight gather of 2,000
    bytes: 500 across, 2 x 1 x 500 = 1,000 inside; the decode's 70 bytes (3 shards of 4
    received) split 1 : 2 between the networks. The reference pass, in 8 parts, gathers 8
    times."""
    dcn = {"data": 1, "fsdp": 2, "tensor": 1}
    t = step_traffic(_shape(reference_parts=8), SIZES, dcn, SIZES, dcn)
    assert t["update weight gathers (fsdp)"] == Traffic(16_000, 8_000)
    assert t["reference weight gathers (fsdp)"] == Traffic(8_000, 4_000)
    assert t["rollout decode gathers"].dcn == pytest.approx(70 / 3 * 10)
    assert t["rollout decode gathers"].ici == pytest.approx(140 / 3 * 10)
    # data 2 inside a node: the shard's 500 bytes each way, twice per update, all inside
    assert t["gradient all-reduce (data)"] == Traffic(2_000, 0)


def test_lora_gradients_are_all_reduced_over_every_chip_by_hand():
    """Adapters replicated: their 400 float32 gradient bytes are all-reduced over all 8 chips
    (2 across x 4 inside) once per update: 400 x 1/8 across and 400 x 2 x 3/8 inside, each
    way, twice per update x 2 updates; nothing reduce-scattered."""
    dcn = {"data": 2, "fsdp": 1, "tensor": 1}
    t = step_traffic(_shape(grads=400.0, grads_sharded=False), SIZES, dcn, SIZES, dcn)
    assert t["gradient reduce-scatter (fsdp)"] == Traffic(0, 0)
    assert t["gradient all-reduce (data)"] == Traffic(ici=300 * 4, dcn=50 * 4)
