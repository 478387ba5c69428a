"""``rl.plan``'s network estimate: the bytes each chip moves per training step over the fast
interconnect inside a node or slice (ICI, NVLink) and over the network between them (DCN,
InfiniBand), for the mesh as ``models.device_mesh`` places it.

A model, not a measurement: the step's large collectives, each costed as a hierarchical
ring over the chips of its mesh axis (n = n_ici x n_dcn of them, ``models.device_mesh``'s
split of the axis). An all-gather of a buffer of B bytes (whole) first exchanges across the
DCN with the chips at the same position in the other granules, then inside the granule, so
a chip receives

    over the DCN   B (n_dcn - 1) / n
    over the ICI   B n_dcn (n_ici - 1) / n          (together B (n - 1) / n)

and a reduce-scatter sends as much; an all-reduce is both. The collectives counted, per
step, for P parameters, T tensor shards, U updates (mini-batches x epochs) of M
micro-batches each:

- the update's weight all-gathers over fsdp: the forward and the backward pass of every
  micro-batch each gather the weights in the compute dtype (B = P x its bytes / T; a QLoRA
  base's codes and block maxima); the reference pass gathers them once per part (mini x
  micro parts) where it runs;
- the gradients' reduce-scatter over fsdp, once per micro-batch (float32: B = 4 P / T);
- the gradients' all-reduce over data, once per update, of each chip's float32 shard
  (B = 4 P / (T x fsdp)); a LoRA run's adapters are replicated, so their gradients are
  all-reduced over every chip instead, and nothing is reduce-scattered;
- the rollout's decode: the layer weights a chip gathers at every decode step
  (``rl.plan.gathered_per_step``, exact for the rollout mesh), split between the networks
  as a gather over the rollout mesh's fsdp and tensor axes is, x the response budget x the
  rollout's calls.

What XLA emits can differ (it may keep a gathered weight across micro-batches, or gather in
float32 before casting); the model says where the mesh puts each axis's traffic.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class Traffic:
    """Bytes per chip over the fast interconnect (`ici`) and over the network (`dcn`)."""

    ici: float = 0.0
    dcn: float = 0.0

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(self.ici + other.ici, self.dcn + other.dcn)

    def __mul__(self, times: float) -> Traffic:
        return Traffic(self.ici * times, self.dcn * times)


def gather(whole: float, n_ici: int, n_dcn: int) -> Traffic:
    """A hierarchical all-gather of `whole` bytes over n_ici x n_dcn chips (module
    docstring): what one chip receives over each network."""
    n = n_ici * n_dcn
    return Traffic(ici=whole * n_dcn * (n_ici - 1) / n, dcn=whole * (n_dcn - 1) / n)


@dataclasses.dataclass(frozen=True)
class StepShape:
    """What the step's collectives depend on: the bytes of the `weights` the passes gather
    (whole: P x the compute dtype's bytes, or a QLoRA base's codes and maxima) and of the
    float32 `grads` (whole: 4 P, or a LoRA run's adapters', which are replicated: all-reduced
    over every chip, no reduce-scatter, when `grads_sharded` is false), U `updates` of M
    `micro_batches`, the reference pass's `reference_parts` (0: not run), the rollout's
    `decode_steps` (response budget x calls) and `decode_gathered` bytes per chip per decode
    step."""

    weights: float
    grads: float
    updates: int
    micro_batches: int
    reference_parts: int
    decode_steps: int
    decode_gathered: float
    grads_sharded: bool = True


def step_traffic(step: StepShape, sizes: Mapping[str, int], dcn: Mapping[str, int],
                 rollout_sizes: Mapping[str, int], rollout_dcn: Mapping[str, int]
                 ) -> dict[str, Traffic]:
    """Per chip per step, by collective (module docstring), for a training mesh of `sizes`
    whose DCN parts are `dcn`, and the rollout's mesh."""
    f_ici, f_dcn = sizes["fsdp"] // dcn["fsdp"], dcn["fsdp"]
    d_ici, d_dcn = sizes["data"] // dcn["data"], dcn["data"]
    t = sizes["tensor"]
    weights, grads = step.weights / t, step.grads / t
    passes = step.updates * step.micro_batches
    model = rollout_sizes["fsdp"] * rollout_sizes["tensor"]  # the axes a decode gathers over
    model_dcn = rollout_dcn["fsdp"] * rollout_dcn["tensor"]
    per_decode = (Traffic() if model == 1 else
                  Traffic(ici=step.decode_gathered * (model - model_dcn) / (model - 1),
                          dcn=step.decode_gathered * (model_dcn - 1) / (model - 1)))
    return {
        "update weight gathers (fsdp)": gather(weights, f_ici, f_dcn) * (2 * passes),
        "reference weight gathers (fsdp)": gather(weights, f_ici, f_dcn)
        * step.reference_parts,
        "gradient reduce-scatter (fsdp)": gather(grads, f_ici, f_dcn) * passes
        if step.grads_sharded else Traffic(),
        "gradient all-reduce (data)": gather(grads / sizes["fsdp"], d_ici, d_dcn)
        * (2 * step.updates) if step.grads_sharded else
        gather(grads, d_ici * f_ici, d_dcn * f_dcn) * (2 * step.updates),
        "rollout decode gathers": per_decode * step.decode_steps,
    }
