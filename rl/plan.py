"""Ahead-of-time plan: ``python -m rl.plan [rl.train overrides] plan.topology=v5e:4x4``.

Compiles, for a TPU topology and with abstract weights (``jax.ShapeDtypeStruct`` with a
``NamedSharding`` for every argument, optimizer state included; shapes from a ``config.json``,
nothing downloaded or allocated), the programs of one RL step as ``rl.train`` would run them:

    prefill    the rollout's prompts into a KV cache of prompt + response budget slots
    decode     the rollout's decode loop over the response budget (``models.sampler``)
    read       a chunked multi-turn task's read of an observation by every row, in place in
               the rollout's one cache (``models.continuation.read_in_place``, donated)
    continue   that task's decoding of a chunk by every row, in place
               (``models.continuation.decode_in_place``, the cache donated)
    part       the same for half the rows, gathered out of the cache and put back
    reference  the reference / old-policy log-prob pass (``rl.grpo.train_step.batch_logprobs``)
    update     one optimizer update (``rl.grpo.train_step.make_train_step``) on a mini-batch
    start-up   not a compiled program: what the chips hold when loading ends, before step 0
               (:func:`startup_row`), so "fits" also means the run starts
    eval ...   the evaluation during training (before step 0, every trainer.eval_every
               steps, after the last): the rollout's programs for trainer.eval_batch_size
               greedy trajectories in trainer.eval_dtype (:func:`evaluation_programs`)

and prints per program the per-chip memory (arguments, temporaries, outputs: XLA's
``memory_analysis``, on TPU totalled by the compiler's own peak) against the chip's HBM, the
FLOPs and a lower bound of its time, and which keys help when it does not fit. The rollout
is laid out as the sampler lays it out over the mesh (each data-parallel shard prefills its
own distinct prompts into a trainer.kv_cache_dtype cache), and the plan finds the largest
rollout batch that fits (:func:`rollout_fit`): its peaks are affine in the rows per shard,
so two compiles predict the largest batch, which is then compiled, and the prediction
refined, until a batch that fits and the next one up that does not are both compiled. The
same approach as MaxText's ``train_compile.py``
(``jax.experimental.topologies.get_topology_desc``). libtpu compiles for the topology on a
CPU-only host (``pip install -e '.[tpu-plan]'``); ``plan.topology=cpu`` plans for this
host's devices instead (what the tests do).

FLOPs are derived, not read from ``cost_analysis`` (which counts a ``lax.scan`` body, the
layer stack and the micro-batch loop, once). Per token of a forward pass, with the layers'
matmul parameters M = L (d hd (h + 2 kv) + h hd d + 3 d f):
    2 M  +  4 L h hd K  (attention: scores and weighted values over the K keys it scores)
    + 2 d V for each token whose logits are computed
(the implementation scores every cache slot or key, masked, so K is the full key length; for a
decode step, the slots it reads, below).
The update is forward + backward = 3 forwards (Kaplan et al. 2020, "6 N per token"), plus the
recomputed attention (remat=false keeps only the weight matmuls' outputs) or the recomputed
layer stack (remat=true). The time bound is max(FLOPs / (chips x peak FLOP/s),
bytes / HBM bandwidth, gathered weights / ICI bandwidth) with bytes per chip the program's
arguments and outputs (read and written once) or, for the decode loop, at every step its
arguments other than the KV cache and the cache slots the decode kernel reads (the XLA path: the
cache prefix of the loop a step is in, ``models.transformer.while_in_extents``, for every row;
trainer.decode_kernel=pallas_gpu: each row's own slots), and the gathered weights the
rollout's split layer matrices each chip receives at every pass over them (a decode step, the
prefill, a read's block of a group of rows); other collectives are not counted.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import math
import os
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from models.config import ModelConfig, ModelLoadError
from models.continuation import bucket_kernel, line_width, read_kernel, row_buckets
from models.device_mesh import device_grid
from models.lora import init_adapters, quantized_base
from models.padding import round_up
from models.paged_cache import PAGE_SLOTS, PagedCache, is_paged, reads_own_slots
from models.quant import Quantized
from models.sampler import Frontier, SamplingParams, decode_params, generation_kernels
from models.shapes import model_shapes
from models.sharding import (
    batch_sharding,
    batch_shards,
    decode_param_shardings,
    make_mesh,
    param_shardings,
    sharding_like,
)
from models.transformer import cache_slots_read, init_params, platform_of
from rl.grpo.batch import split_groups
from rl.grpo.optim import lr_schedule, make_optimizer
from rl.grpo.train_step import (
    batch_logprobs,
    in_compute_dtype,
    init_train_state,
    make_train_step,
    train_state_shardings,
)
from rl.plan_network import StepShape, Traffic, step_traffic
from rl.run.config import ConfigError, PlanConfig, RunConfig, parse_plan
from rl.run.resolve import resolved_config

log = logging.getLogger("rl.plan")  # one line per compile: a large slice takes minutes to hours

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
    """An accelerator's peak dense bfloat16 FLOP/s, memory capacity and bandwidth, and its
    bidirectional chip-to-chip bandwidth (TPU ICI, GPU NVLink); `usable`: the memory a run
    may fill where it is less than the capacity (None: see :func:`usable_bytes`)."""

    name: str
    peak_flops: float | None   # FLOP/s, bfloat16 (None: unknown, no time bound)
    hbm_bytes: float
    hbm_bandwidth: float | None  # bytes/s
    ici_bandwidth: float | None = None  # bytes/s, bidirectional, per chip (None: unknown)
    usable: float | None = None
    source: str = "Cloud TPU docs"
    link: str = "ICI"  # the chip-to-chip interconnect's name


# Per chip, from the Google Cloud TPU documentation's system-architecture pages
# (cloud.google.com/tpu/docs/v4, /v5e, /v5p, /v6e: "Peak compute per chip (bf16)", "HBM
# capacity", "HBM bandwidth", "Bidirectional inter-chip interconnect (ICI) bandwidth (per
# chip)": v5e 400, v5p 1,200, v6e 800 GBps; v4's page states no such figure); the one table
# rl.plan reads.
CHIPS: dict[str, Chip] = {
    "v4": Chip("TPU v4", 275e12, 32 * GiB, 1200e9),
    "v5e": Chip("TPU v5e", 197e12, 16 * GiB, 819e9, 400e9),
    "v5p": Chip("TPU v5p", 459e12, 95 * GiB, 2765e9, 1200e9),
    "v6e": Chip("TPU v6e", 918e12, 32 * GiB, 1640e9, 800e9),
}
TOPOLOGY = re.compile(r"^(v4|v5e|v5p|v6e):\d+x\d+(x\d+)?$")

# Per GPU, from NVIDIA's H100 and H200 datasheets (SXM): dense bfloat16 Tensor Core FLOP/s
# (the "with sparsity" figure halved), memory bandwidth, NVLink 900 GB/s bidirectional; the
# memory as nvidia-smi reports the 80 GB and 141 GB parts (81,559 and 143,771 MiB).
GPUS: dict[str, Chip] = {
    "h100": Chip("NVIDIA H100 SXM 80GB", 989e12, 81559 * 2**20, 3.35e12, 900e9,
                 source="NVIDIA datasheet", link="NVLink"),
    "h200": Chip("NVIDIA H200 SXM 141GB", 989e12, 143771 * 2**20, 4.8e12, 900e9,
                 source="NVIDIA datasheet", link="NVLink"),
}
GPU_TOPOLOGY = re.compile(r"^(h100|h200):(\d+)$")
# No GPU compiler runs without a GPU: a GPU plan compiles its programs with libtpu for a TPU
# v5p slice of as many chips (95 GiB each: programs an 80 GB GPU holds compile there), the
# same SPMD partitioning of the same programs, and holds the sizes against the GPU's memory.
STAND_IN = "v5p"
# JAX preallocates this share of a GPU's memory and fits every buffer in it
# (XLA_PYTHON_CLIENT_MEM_FRACTION, default .75)
GPU_MEM_FRACTION = 0.75
# what the TPU compiler lets a program use, where known: libtpu 0.0.42's "available HBM" in
# its out-of-memory message on v5e (15.75G); other chips: their HBM capacity
USABLE_HBM: dict[str, float] = {"TPU v5e": 15.75 * GiB}


# ------------------------------------------------------------------------------ topology


def host_chip(devices: int) -> Chip:
    """This host's devices (plan.topology=cpu): an equal share of its RAM each, no peak
    figures."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return Chip(f"host CPU device (1/{devices} of {ram / GiB:.0f} GiB RAM)", None,
                ram / devices, None, link="host memory")


# a TPU's device_kind as JAX reports it -> its CHIPS entry
TPU_KINDS = {"TPU v4": "v4", "TPU v5 lite": "v5e", "TPU v5e": "v5e", "TPU v5": "v5p",
             "TPU v5p": "v5p", "TPU v6 lite": "v6e", "TPU v6e": "v6e"}


def device_chip(devices: Sequence[Any]) -> Chip:
    """The chip of a job's own `devices` (``rl.smoke``): a TPU or an H100/H200 by its device
    kind, with the memory the runtime lets a program use (``memory_stats``' bytes_limit)
    where it reports one; else (CPU devices, another GPU) their memory without peak
    figures, so no time bound."""
    here = jax.process_index()  # memory_stats answers for this process's devices only
    d = next(x for x in devices if getattr(x, "process_index", here) == here)
    limit = (d.memory_stats() or {}).get("bytes_limit")
    kind = str(getattr(d, "device_kind", ""))
    known = CHIPS.get(TPU_KINDS.get(kind, "")) if d.platform == "tpu" else next(
        (c for name, c in GPUS.items() if name in kind.lower()), None)
    if known is not None:
        return dataclasses.replace(known, usable=limit) if limit else known
    if limit:
        return Chip(f"{kind or d.platform} (no peak figures, no time bound)", None, limit, None)
    return host_chip(len(devices))


def check_topology(name: str) -> Chip | None:
    """The chip of a topology name (None for ``cpu``: see :func:`host_chip`), or a
    ConfigError naming plan.topology; checked before anything compiles."""
    if name == "cpu":
        return None
    gpu = GPU_TOPOLOGY.match(name)
    if not (gpu or TOPOLOGY.match(name)):
        raise ConfigError(f"plan.topology: unknown topology {name!r}; expected cpu, "
                          f"<{'|'.join(CHIPS)}>:<AxB[xC]> (e.g. v5e:4x4 or v5p:2x2x4) or "
                          f"<{'|'.join(GPUS)}>:<GPUs> (e.g. h100:8, an estimate)")
    if gpu and (int(gpu.group(2)) < 4 or int(gpu.group(2)) % 4):
        raise ConfigError(f"plan.topology: {name}: a GPU estimate compiles for a TPU "
                          f"{STAND_IN} slice of as many chips, which comes in multiples of 4 "
                          "(h100:8 for one node of 8)")
    if importlib.util.find_spec("libtpu") is None:
        raise ConfigError(f"plan.topology: {name} needs libtpu to compile for TPU"
                          f"{' (the GPU estimate compiles for a TPU stand-in)' if gpu else ''}: "
                          "pip install -e '.[tpu-plan]' (or plan.topology=cpu)")
    if gpu:
        fraction = gpu_mem_fraction()
        chip = GPUS[gpu.group(1)]
        return dataclasses.replace(chip, usable=fraction * chip.hbm_bytes)
    return CHIPS[name.split(":")[0]]


def gpu_mem_fraction() -> float:
    """The share of a GPU's memory JAX lets a run use: XLA_PYTHON_CLIENT_MEM_FRACTION when
    set (as it should be on the GPU hosts too), else JAX's default .75."""
    raw = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
    try:
        return GPU_MEM_FRACTION if raw is None else float(raw)
    except ValueError:
        raise ConfigError(f"XLA_PYTHON_CLIENT_MEM_FRACTION: not a number: {raw!r}") from None


GPUS_PER_NODE = 8  # a GPU estimate of more than 8 GPUs plans nodes of 8 (h100:16: 2 nodes)


def gpu_nodes(name: str) -> int:
    """The nodes of a GPU topology: GPUs / 8 when more than 8 divide into nodes of 8, else 1;
    1 for a TPU or cpu topology."""
    if not (gpu := GPU_TOPOLOGY.match(name)):
        return 1
    count = int(gpu.group(2))
    return count // GPUS_PER_NODE if count > GPUS_PER_NODE and not count % GPUS_PER_NODE else 1


def stand_in_topology(name: str) -> str | None:
    """The TPU slice a GPU plan compiles for, one per node (:data:`STAND_IN`: h100:8 ->
    v5p:2x2x2; h100:16 -> two of them, :func:`gpu_nodes`); None for a TPU or cpu
    topology."""
    if not (gpu := GPU_TOPOLOGY.match(name)):
        return None
    return f"{STAND_IN}:2x2x{int(gpu.group(2)) // gpu_nodes(name) // 4}"


def chip_is_gpu(plan: Any) -> bool:
    return stand_in_topology(plan.topology) is not None


def usable_bytes(chip: Chip) -> float:
    """The memory a program may fill on `chip`: a GPU's preallocated share, the TPU
    compiler's available HBM where known (:data:`USABLE_HBM`), else the capacity."""
    return chip.usable or USABLE_HBM.get(chip.name, chip.hbm_bytes)


def topology_devices(name: str, slices: int = 1) -> list:
    """The devices of a topology: `slices` TPU slices described by libtpu (a GPU estimate:
    a stand-in slice per node), or this host's."""
    if name == "cpu":
        if slices != 1:
            raise ConfigError("plan.slices: plan.topology=cpu plans this host's devices, "
                              f"one granule; got {slices} slices")
        return jax.devices()
    from jax.experimental import topologies

    if stand_in_topology(name):
        if slices != 1:
            raise ConfigError(f"plan.slices: a GPU estimate's nodes come from its count "
                              f"({name}: {gpu_nodes(name)} node(s) of up to 8); got {slices}")
        name, slices = stand_in_topology(name) or name, gpu_nodes(name)
    try:
        return list(topologies.get_topology_desc(platform="tpu", topology_name=name,
                                                 num_slices=slices).devices)
    except Exception as e:  # libtpu refuses the shape: name the key
        raise ConfigError(f"plan.topology: libtpu cannot describe {name!r} x {slices}: {e}"
                          ) from None


# ------------------------------------------------------------------------------ shapes


@dataclasses.dataclass(frozen=True)
class Layout:
    """The step's shapes as ``rl.grpo.batch`` lays them out: `groups` (sub-)groups of `size`
    trajectories after a prompt of `prompt` tokens (rounded up to 32), `response` tokens
    each (rounded up to 16), cut into `mini_batches` updates; the rollout samples `rows`
    trajectories from `prompts` distinct prompts. `filler`: copies of a group with loss mask
    0 that ``rl.grpo.batch.build_batch`` adds when the trajectories do not cut into equal slices
    (counted in `groups` after the split)."""

    prompts: int
    rows: int
    groups: int
    size: int
    prompt: int
    response: int
    mini_batches: int
    filler: int = 0

    @property
    def update_groups(self) -> int:
        return self.groups // self.mini_batches

    @property
    def cache_len(self) -> int:
        return self.prompt + self.response


def batch_groups(prompts: int, size: int, slices: int) -> tuple[int, int, int]:
    """(groups, trajectories per group, filler groups) of the update batch of `prompts`
    groups of `size` cut into `slices` equal parts, as ``rl.grpo.batch.build_batch`` lays it out:
    filler copies of a group first when the trajectories do not divide, then sub-groups."""
    filler = -prompts % slices if (prompts * size) % slices else 0
    groups = split_groups([[0] * size] * (prompts + filler), slices)  # type: ignore[list-item]
    return len(groups), len(groups[0]), filler


def even_micro_batches(prompts: int, size: int, mini: int, shards: int, most: int) -> int:
    """The micro-batch count in 1..`most` whose layout adds the fewest filler groups
    (:func:`batch_groups` over mini x micro x `shards` slices), the largest of those. Where
    `most` leaves filler on a slice (Search-R1's 16 micro-batches of 2 mini-batches on 128
    shards: 4,096 slices of 2,560 trajectories, 3,584 filler groups), this is the count that
    does not (10: one trajectory per shard per micro-batch)."""
    return min(range(1, most + 1),
               key=lambda m: (batch_groups(prompts, size, mini * m * shards)[2], -m))


def layout(run: RunConfig, plan: PlanConfig, mesh: Mesh) -> Layout:
    """The layout of the configured batch (``rl.grpo.batch``: mini-batches x micro-batches x the
    mesh's data-parallel shards equal slices)."""
    t, g = run.trainer, run.algo.group_size
    slices = t.mini_batches * t.micro_batches * batch_shards(mesh)
    groups, size, filler = batch_groups(t.batch_prompts, g, slices)
    return Layout(prompts=t.batch_prompts, rows=t.batch_prompts * g, groups=groups,
                  size=size, prompt=round_up(plan.prompt_len, 32),
                  response=round_up(plan.response_budget, 16), mini_batches=t.mini_batches,
                  filler=filler)


def _abstract(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        tree, shardings)


def _rows(shape: tuple[int, ...], dtype: Any, mesh: Mesh) -> jax.ShapeDtypeStruct:
    """An abstract array sharded along its leading (batch) axis when the shards divide it."""
    return jax.ShapeDtypeStruct(shape, dtype,
                                sharding=batch_sharding(mesh, len(shape), shape[0]))


def abstract_params(cfg: ModelConfig, mesh: Mesh) -> Any:
    """The float32 master weights as sharded shapes (``jax.eval_shape``: nothing allocated)."""
    shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0), jnp.float32))
    return _abstract(shapes, param_shardings(shapes, mesh))


def abstract_state(params: Any, optimizer: optax.GradientTransformation, mesh: Mesh) -> Any:
    """The train state (step, weights, optimizer state) as sharded shapes
    (``rl.grpo.train_step.train_state_shardings``: Adam's moments sharded like their parameters,
    the rest replicated)."""
    state = jax.eval_shape(lambda p: init_train_state(p, optimizer), params)
    state = state._replace(params=params)
    return _abstract(state, train_state_shardings(state, optimizer, mesh))


def bytes_per_chip(tree: Any) -> int:
    """Bytes one device holds of a tree of sharded abstract arrays."""
    return sum(math.prod(x.sharding.shard_shape(x.shape)) * _itemsize(x.dtype)
               for x in jax.tree.leaves(tree))


def _itemsize(dtype: Any) -> int:
    """Bytes per element; a PRNG key (an extended dtype) holds two uint32 (threefry)."""
    if jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
        return 8
    return jnp.dtype(dtype).itemsize


def update_batch(run: RunConfig, lay: Layout, mesh: Mesh) -> dict[str, Any]:
    """One mini-batch of the update (``rl.grpo.batch``'s arrays), as sharded shapes."""
    n, g, p, r = lay.update_groups, lay.size, lay.prompt, lay.response
    batch = {"prefix": _rows((n, p), jnp.int32, mesh),
             "prefix_mask": _rows((n, p), jnp.bool_, mesh),
             "tokens": _rows((n, g, r), jnp.int32, mesh),
             "attn_mask": _rows((n, g, r), jnp.bool_, mesh),
             "loss_mask": _rows((n, g, r), jnp.float32, mesh),
             "advantages": _rows((n, g), jnp.float32, mesh)}
    if run.updates_per_batch > 1:
        batch["logp_old"] = _rows((n, g, r), jnp.float32, mesh)
    if run.algo.beta > 0:
        batch["logp_ref"] = _rows((n, g, r), jnp.float32, mesh)
    return batch


# ------------------------------------------------------------------------------ FLOPs


def matmul_params(cfg: ModelConfig) -> int:
    """M: the layer stack's weight-matmul parameters (embeddings and norms excluded)."""
    d, f, h, kv, hd = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads,
                       cfg.num_kv_heads, cfg.head_dim)
    return cfg.num_layers * (d * hd * (h + 2 * kv) + h * hd * d + 3 * d * f)


def forward_flops(cfg: ModelConfig, tokens: int, scored_keys: float,
                  logit_rows: int) -> tuple[float, float, float]:
    """(layer matmuls, attention, output layer) FLOPs of a forward pass over `tokens`
    tokens that score `scored_keys` (query, key) pairs in every layer and compute the
    logits of `logit_rows` tokens: 2 M tokens, 4 L h hd scored_keys, 2 d V logit_rows."""
    return (2.0 * matmul_params(cfg) * tokens,
            4.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim * scored_keys,
            2.0 * cfg.hidden_size * cfg.vocab_size * logit_rows)


def scoring_flops(cfg: ModelConfig, n: int, g: int, p: int, r: int) -> tuple[float, ...]:
    """A ``group_logprobs`` forward over n prompts of p tokens (read once, keys: p each) and
    their n g continuations of r tokens (keys: the prompt's p and the row's r each); logits
    for the continuations only."""
    return forward_flops(cfg, n * p + n * g * r, n * p * p + n * g * r * (p + r), n * g * r)


def update_flops(cfg: ModelConfig, n: int, g: int, p: int, r: int, remat: bool) -> float:
    """3 forwards (forward, backward = 2 forwards) plus the recomputation: the attention
    (remat=false) or the whole layer stack (remat=true)."""
    layers, attention, output = scoring_flops(cfg, n, g, p, r)
    return 3 * (layers + attention + output) + attention + (layers if remat else 0.0)


def prefill_flops(cfg: ModelConfig, lay: Layout) -> float:
    """The distinct prompts through a cache of cache_len slots (every slot scored); logits
    of each row's last prompt token."""
    return sum(forward_flops(cfg, lay.prompts * lay.prompt,
                             lay.prompts * lay.prompt * lay.cache_len, lay.rows))


def decode_flops(cfg: ModelConfig, lay: Layout, scored: float | None = None) -> float:
    """`response` steps of one token for every row, each scoring `scored` cache slots (on
    average over the steps; None: all cache_len)."""
    steps = lay.rows * lay.response
    keys = lay.cache_len if scored is None else scored
    return sum(forward_flops(cfg, steps, steps * keys, steps))


# ------------------------------------------------------------------------------ programs


@dataclasses.dataclass(frozen=True)
class Program:
    """One compiled program's per-chip memory (bytes) and derived cost."""

    name: str
    arguments: int
    temporaries: int  # held at the program's peak beyond its arguments and outputs
    outputs: int
    aliased: int
    resident: int   # held by the step outside this program (train state, reference weights)
    flops: float
    min_bytes: float  # HBM traffic per chip the program cannot avoid
    runs: bool        # whether this config runs the program each step
    refused: str = ""  # the compiler's out-of-memory message when it would not compile it
    ici_bytes: float = 0.0  # weight bytes a chip receives from the others (gathered_per_step)
    calls: int = 1  # runs per step (the rollout's in trainer.rollout_chunks parts)
    failed: str = ""  # the compiler's error when it failed on the program (not for memory)
    reads: DecodeReads | None = None  # a decode loop's reads per step (decode_reads)

    @property
    def total(self) -> int:
        return self.arguments + self.temporaries + self.outputs - self.aliased

    @property
    def peak(self) -> int:
        return self.total + self.resident


UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
# The TPU compiler refuses a program larger than HBM; its message carries the program's whole
# size, arguments included, in one of two forms (libtpu 0.0.42: a program of 1 GiB arguments
# and 2 GiB temporaries, refused at 2.44 GiB of HBM, reads "HLO temporaries (3.00G)").
REFUSED = re.compile(r"Used ([\d.]+)([KMGT]) of [\d.]+[KMGT] hbm"
                     r"|required for HLO temporaries \(([\d.]+)([KMGT])\) exceeds")


@dataclasses.dataclass(frozen=True)
class Sizes:
    """memory_analysis()'s fields that a plan reads (bytes per device)."""

    argument_size_in_bytes: int
    temp_size_in_bytes: int
    output_size_in_bytes: int
    alias_size_in_bytes: int
    peak_memory_in_bytes: int = 0


def refused_sizes(message: str, arguments: int) -> Sizes | None:
    """The sizes in a TPU out-of-memory refusal ('Used X of Y hbm' or 'HLO temporaries (X)
    exceeds': X is everything the program holds, its arguments included); None when the
    message is neither."""
    if not (m := REFUSED.search(message)):
        return None
    number, unit = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    total = int(float(number) * UNITS[unit])
    return Sizes(arguments, max(0, total - arguments), 0, 0, total)


@dataclasses.dataclass(frozen=True)
class DecodeReads:
    """What one decode step reads per chip at least (bytes): the loop's arguments other
    than the KV cache (the weights, the stopping tables, the loop's state) and, of the
    cache's `capacity` slots a row (`cache` bytes per chip, the validity mask included),
    those the configured kernel reads (`read`, averaged over the steps) where the rows hold
    `held` (``models.transformer.cache_slots_read``). Prompts shared by their groups
    (trainer.shared_prompts: `shared` bytes per chip) are read whole at every step; the
    rows' cache then holds what they generate. On a paged cache whose groups share their
    prompts' pages, `reuse`, the rows' table entries per page of the pools, scales the bytes
    a row's slot takes in the pools, and a decode step reads each group's full prompt pages
    once (`shared`) and each row's `read` slots after them."""

    fixed: float
    cache: float
    capacity: int
    held: float
    read: float
    kernel: str
    shared: float = 0.0
    reuse: float = 1.0

    @property
    def cache_read(self) -> float:
        return self.cache * self.read / self.capacity * self.reuse

    @property
    def per_step(self) -> float:
        return self.fixed + self.shared + self.cache_read


def decode_reads(run: RunConfig, lay: Layout, dec: Any) -> DecodeReads:
    """The decode loop `dec`'s reads per step (:class:`DecodeReads`): its arguments per
    chip, of which its frontier's cache (``dec.args[1].cache``); prompts of `lay.prompt`
    tokens padded to its first slot, `lay.response` new tokens; trainer.decode_kernel's
    reads (the XLA path: each extent's prefix for every row; ``pallas_gpu`` and the paged
    kernels: each row's own slots), on the cache the plan compiles (:func:`planned_kernel`:
    dense or paged)."""
    cache, prompt = dec.args[1].cache, dec.args[1].prompt  # prompt: shared by the groups
    capacity = cache.slots
    own = lay.prompt if prompt is None else 0  # the prompt tokens in the rows' cache
    first = dec.static["first_slot"]  # None: each row's own (a paged cache, from slot 0)
    held, read = cache_slots_read(own, own if first is None else first, lay.response,
                                  capacity, run.trainer.decode_kernel, _platform(dec.args))
    cache_bytes = bytes_per_chip(cache)
    shared = 0.0 if prompt is None else float(bytes_per_chip(prompt))
    fixed = float(bytes_per_chip(dec.args) - cache_bytes - shared)
    if not isinstance(cache, PagedCache):
        return DecodeReads(fixed, float(cache_bytes), capacity, held, read,
                           run.trainer.decode_kernel, shared)
    reuse = math.prod(cache.table.shape) / cache.k[0].shape[1]
    if cache.prompts is not None:
        # each group's full prompt pages read once for the group, the rows their own after
        slots = lay.prompt // PAGE_SLOTS * PAGE_SLOTS
        group = cache.table.shape[0] / cache.prompts.table.shape[0]
        shared = cache_bytes * reuse / capacity * slots / group
        read -= slots
    return DecodeReads(fixed, float(cache_bytes), capacity, held, read,
                       run.trainer.decode_kernel, shared, reuse)


def compiled_program(name: str, lowered: Any, args: Any, *, resident: int, flops: float,
                     min_bytes: Callable[[Any], float], runs: bool = True,
                     ici_bytes: float = 0.0) -> Program:
    """Compile `lowered` (its abstract arguments `args`) and read its memory analysis (per
    device); a program the TPU compiler refuses for lack of HBM is reported with the sizes
    its message states. ``ici_bytes``: the layer weights it gathers per chip (its passes
    over them x :func:`gathered_per_step`).

    On TPU the temporaries are what the compiler's peak (``peak_memory_in_bytes``, the
    figure it fits a program to HBM by) holds beyond the arguments and outputs, so that the
    total is that peak: its ``temp_size_in_bytes`` can count a buffer twice (the v5e-16
    search plan's ``part``, Qwen3-4B, libtpu 0.0.42: 9.97 GiB of temporaries, 16.9 GiB in
    all, yet it compiled within an HBM limit of 12.5 GiB and was refused at 11.7; its peak
    11.94). XLA:CPU's peak leaves out buffers its runtime allocates (the same program's
    gathered rows), so elsewhere the temporaries are ``temp_size_in_bytes``."""
    refused = ""
    log.info("rl.plan: compiling %s ...", name)
    start = time.monotonic()
    try:
        mem = lowered.compile().memory_analysis()
    except jax.errors.JaxRuntimeError as e:
        sizes = refused_sizes(str(e), bytes_per_chip(args))
        if "RESOURCE_EXHAUSTED" in str(e) and sizes is not None:
            mem, refused = sizes, str(e).split("\n")[0]
        elif "INTERNAL" in str(e):  # the compiler failed: say so, plan the other programs
            log.warning("rl.plan: the compiler failed on %s: %s", name, str(e)[:300])
            return Program(name, bytes_per_chip(args), 0, 0, 0, resident, flops, 0.0, runs,
                           failed=str(e).split("\n")[0][:300])
        else:
            raise
    # JAX's lowering cache keeps each program's executable (for a large model on a slice,
    # gigabytes of host memory each): a plan compiles a dozen and needs none of them again
    jax.clear_caches()
    log.info("rl.plan: compiled %s in %.0f s%s", name, time.monotonic() - start,
             " (refused for lack of HBM)" if refused else "")
    arguments, outputs = int(mem.argument_size_in_bytes), int(mem.output_size_in_bytes)
    aliased, temporaries = int(mem.alias_size_in_bytes), int(mem.temp_size_in_bytes)
    peak = int(getattr(mem, "peak_memory_in_bytes", 0))
    if peak and _platform(args) == "tpu":
        temporaries = max(0, peak - (arguments + outputs - aliased))
    return Program(name, arguments, temporaries, outputs, aliased, resident, flops,
                   min_bytes(mem), runs, refused, ici_bytes)


def _platform(args: Any) -> str:
    """The platform of the devices the abstract arrays `args` are laid out on (JAX's
    default backend for none)."""
    for x in jax.tree.leaves(args):
        if sharding := getattr(x, "sharding", None):
            return next(iter(sharding.device_set)).platform
    return jax.default_backend()


def rollout_sampling(run: RunConfig, lay: Layout, mesh: Mesh | None = None) -> SamplingParams:
    """The sampling a rollout of `lay` runs: the trainer's, for the planned response budget,
    with its KV cache dtype, prefill layout, sub-batches, decode kernel (as planned on
    `mesh`'s devices: :func:`planned_kernel`) and shared prompts (as
    ``rl.tasks.envs.SamplerPolicy`` sets them)."""
    t = run.trainer
    return dataclasses.replace(run.sampling(), max_new_tokens=lay.response,
                               kv_cache_dtype=t.kv_cache_dtype,
                               prefill_pin_rows=t.prefill_pin_rows,
                               sub_batches=t.rollout_sub_batches,
                               decode_kernel=planned_kernel(t.decode_kernel, platform_of(mesh)),
                               shared_prompts=t.shared_prompts)


def planned_kernel(decode_kernel: str, platform: str) -> str:
    """The decode kernel a plan compiles for trainer.decode_kernel on `platform`'s devices:
    that kernel on its own chip; off it (a GPU estimate compiles for TPU stand-ins, which
    cannot lower a GPU kernel) XLA's attention over the same cache, dense or paged. The
    decode's reads are still counted as the configured kernel's (:func:`decode_reads`)."""
    chip = {"pallas_gpu": "gpu", "paged_gpu": "gpu", "paged_tpu": "tpu"}.get(decode_kernel)
    if chip is None or chip == platform:
        return decode_kernel
    return "paged_xla" if is_paged(decode_kernel) else "xla"


def sampler_rows(prompts: int, size: int, shards: int) -> int:
    """Rows per shard of `prompts` groups of `size` rows over `shards` data-parallel shards,
    as ``models.sampler.prompt_batch`` cuts them (padding rows at the end)."""
    return -(-prompts * size // shards)


def rollout_programs(run: RunConfig, cfg: ModelConfig, lay: Layout, mesh: Mesh, dparams: Any,
                     resident: int) -> list[Program]:
    """The rollout's prefill and decode loop as ``models.sampler.generate`` runs them over the
    mesh (``models.sampler.generation_kernels``: `lay.prompts` distinct prompts of
    `lay.prompt` tokens, each sampled by a group), on the sampler's weights `dparams`
    (trainer.rollout_dtype, ``decode_params``) with a trainer.kv_cache_dtype KV cache."""
    sampling = rollout_sampling(run, lay, mesh)
    prompts = [[p + 1] * lay.prompt for p in range(lay.prompts)
               for _ in range(lay.rows // lay.prompts)]
    pre, dec = generation_kernels(cfg, dparams, prompts, sampling, mesh)
    gathered = gathered_per_step(dparams)  # per pass: the prefill one, each decode step one
    reads = decode_reads(run, lay, dec)
    prefill = compiled_program("prefill", pre.lower(), pre.args, resident=resident,
                               flops=prefill_flops(cfg, lay), min_bytes=_in_and_out,
                               ici_bytes=gathered)
    decode = compiled_program("decode", dec.lower(), dec.args, resident=resident,
                              flops=decode_flops(cfg, lay, reads.read),
                              min_bytes=lambda m: lay.response * reads.per_step,
                              ici_bytes=gathered * lay.response)
    programs = [prefill, dataclasses.replace(decode, reads=reads)]
    if chunk := int(run.task.get("chunk_tokens") or 0):  # a multi-turn task's chunked decode
        start = dec.args[1]
        programs += continue_programs(run, cfg, lay, mesh, dparams, start, resident, chunk)
    return programs


def evaluation_run(run: RunConfig) -> RunConfig:
    """`run` as its evaluation during training samples (``rl.run.trainer.Trainer.evaluate``):
    greedy, with the sampler's weights and KV cache in trainer.eval_dtype (None: the
    rollout's, ``rl.run.loop.RunParts.policy``)."""
    t = run.trainer
    dtype, cache = t.rollout_dtype, t.kv_cache_dtype
    if t.eval_dtype is not None:
        dtype = cache = t.eval_dtype
    return dataclasses.replace(run, trainer=dataclasses.replace(
        t, rollout_dtype=dtype, kv_cache_dtype=cache, temperature=0.0))


def evaluation_programs(run: RunConfig, cfg: ModelConfig, lay: Layout, mesh: Mesh,
                        params: Any, resident: int) -> list[Program]:
    """The evaluation's rollout programs (:func:`rollout_programs`, named ``eval <name>``):
    one greedy trajectory for each of trainer.eval_batch_size prompts at a time
    (``rl.run.evaluation.greedy_rollouts``), over the same response budget, on the rollout
    mesh, with the train state resident; run when the config evaluates during training
    (trainer.eval_at_ends or trainer.eval_every)."""
    erun, n = evaluation_run(run), run.trainer.eval_batch_size
    dparams = sampler_weights(erun, params, mesh)
    programs = rollout_programs(erun, cfg, dataclasses.replace(lay, prompts=n, rows=n), mesh,
                                dparams, resident)
    runs = run.trainer.eval_at_ends or run.trainer.eval_every > 0
    return [dataclasses.replace(p, name=f"eval {p.name}", runs=runs) for p in programs]


def continue_programs(run: RunConfig, cfg: ModelConfig, lay: Layout, mesh: Mesh,
                      dparams: Any, state: Frontier, resident: int,
                      chunk: int) -> list[Program]:
    """A multi-turn rollout's continuation at its largest, as
    ``models.continuation.continue_generation`` runs it over the mesh for the search
    environment: every row, in the rollout's one cache of prompt + budget slots, which each
    program takes over (donated). ``read``: every row reads an observation line
    (task.max_obs_tokens, as ``line_width`` pads it), in blocks of the sampling's read_block,
    a group of rows at a time gathered out of the cache (``models.continuation.read_group``;
    without trainer.rollout_sub_batches all rows at once, in place); ``continue``: in place
    (the bucket of all rows: no gather), every row decodes one chunk
    (task.chunk_tokens); ``part``: the same chunk decoded by the largest bucket of rows that
    is gathered out of the cache (half of each shard's rows: the cache and half of it in
    memory, see ``models.continuation.row_buckets``)."""
    b = state.logits.shape[0]
    sampling = dataclasses.replace(rollout_sampling(run, lay, mesh), max_new_tokens=chunk)
    slots, shards = lay.cache_len, batch_shards(mesh)
    per = b // shards
    obs = line_width(int(run.task.get("max_obs_tokens") or 1), sampling.read_block)
    gathered = gathered_per_step(dparams)  # the layer weights every pass over them gathers
    read = read_kernel(cfg, dparams, state, obs, sampling, mesh, abstract=True)
    readers = read.args[2]  # [S, K, G]: a pass per block of each group; None: all in place
    passes = (1 if readers is None else readers.shape[1]) * -(-obs // min(obs, sampling.read_block))
    programs = [compiled_program(
        "read", read.lower(), read.args, resident=resident,
        flops=sum(forward_flops(cfg, b * obs, b * obs * slots, b)), min_bytes=_in_and_out,
        ici_bytes=gathered * passes)]

    def chunk_program(part: int) -> Program:
        """A chunk decoded by `part` rows of each shard (all of them: in place, no gather)."""
        n = shards * part
        kernel = bucket_kernel(cfg, dparams, state, part, sampling, mesh, abstract=True)
        return compiled_program(
            kernel.name, kernel.lower(), kernel.args, resident=resident,
            flops=chunk * sum(forward_flops(cfg, n, n * slots, n)), min_bytes=_in_and_out,
            ici_bytes=gathered * chunk)

    programs.append(chunk_program(per))
    # the largest bucket that gathers its rows (none without trainer.rollout_sub_batches)
    part = row_buckets(per, sampling.sub_batches)[-2:][0]
    return programs + ([chunk_program(part)] if part < per else [])


def _in_and_out(memory: Any) -> int:
    """A program's bytes read and written at least once: its arguments and outputs."""
    return memory.argument_size_in_bytes + memory.output_size_in_bytes


def sampler_weights(run: RunConfig, params: Any, mesh: Mesh) -> Any:
    """The sampler's weights (trainer.rollout_dtype, ``decode_params``) as sharded shapes."""
    dtype = None if run.trainer.rollout_dtype == "float32" else run.trainer.rollout_dtype
    shapes = jax.eval_shape(lambda p: decode_params(p, dtype), params)
    return _abstract(shapes, decode_param_shardings(shapes, mesh))


def gathered_per_step(dparams: Any) -> int:
    """Bytes of layer weights each chip receives from the others at every decode step: each
    split layer matrix's part a chip computes with (the whole of it, less its split over
    ``tensor``) less the chip's own shard. An ``fsdp`` split is gathered to run the layer; a
    ``tensor`` split is not: the heads and the MLP's columns are computed where they are and
    the activations all-reduced (Megatron's layout, which GSPMD gives the sampler when the
    KV heads divide the tensor axis). The unembedding is not gathered
    (``models.sampler.row_logits`` computes logits by vocabulary slices); weights replicated
    on the rollout mesh gather nothing."""
    def gathered(x: Any) -> int:
        kept = tensor_split(x.sharding)
        return (math.prod(x.shape) // kept - math.prod(x.sharding.shard_shape(x.shape))) \
            * _itemsize(x.dtype)

    return sum(gathered(x) for x in jax.tree.leaves(dparams["layers"]))


def tensor_split(sharding: Any) -> int:
    """How many ways a NamedSharding splits its array over the ``tensor`` mesh axis."""
    spec, mesh = getattr(sharding, "spec", ()), getattr(sharding, "mesh", None)
    if mesh is None:
        return 1
    axes = [a for part in spec if part is not None
            for a in ((part,) if isinstance(part, str) else part)]
    return dict(mesh.shape).get("tensor", 1) if "tensor" in axes else 1


# ------------------------------------------------------------------------------ rollout fit


@dataclasses.dataclass(frozen=True)
class Affine:
    """bytes = fixed + per_row x rows per shard (a program's peak per chip)."""

    fixed: float
    per_row: float

    def at(self, rows_per_shard: float) -> float:
        return self.fixed + self.per_row * rows_per_shard


def affine_fit(x0: float, y0: float, x1: float, y1: float) -> Affine:
    """The line through (x0, y0) and (x1, y1), x0 != x1."""
    slope = (y1 - y0) / (x1 - x0)
    return Affine(y0 - slope * x0, slope)


def largest_batch(lines: Sequence[Affine], usable: float, shards: int, group: int) -> int:
    """The most trajectories N with every line's bytes at N / shards rows per shard within
    `usable`, N a multiple of both the shards (every shard as many rows) and the group size
    (whole groups): N = floor(shards x r / unit) x unit, unit = lcm(shards, group), r the
    smallest of (usable - fixed) / per_row (a line that does not grow with the rows bounds
    nothing; one over `usable` at 0 rows: 0). -1: no line grows with the rows."""
    unit = math.lcm(shards, group)
    bounds = []
    for line in lines:
        if line.fixed > usable:
            return 0
        if line.per_row > 0:
            bounds.append((usable - line.fixed) / line.per_row)
    if not bounds:
        return -1
    return int(shards * min(bounds) // unit) * unit


@dataclasses.dataclass(frozen=True)
class RolloutFit:
    """The largest rollout batch that fits `usable` bytes per chip. `measured`: every batch
    compiled, (trajectories, then the peak of each program in `names`, with the resident
    bytes), in compile order; `trajectories`: the largest compiled batch that fits (0:
    none; -1: the peaks do not grow with the rows), `exact` when the next batch up (`unit`
    more) was compiled and does not fit; `lines`: the affine fit (bytes against rows per
    shard) that predicted the last batch compiled."""

    usable: float
    shards: int
    unit: int
    measured: tuple[tuple[int, *tuple[float, ...]], ...]
    lines: tuple[Affine, ...]
    trajectories: int
    exact: bool = False
    names: tuple[str, ...] = ("prefill", "decode")  # the programs of each measured peak

    def compiled(self, trajectories: int) -> tuple[float, ...] | None:
        return next((tuple(y) for n, *y in self.measured if n == trajectories), None)


FIT_COMPILES = 4  # rollout compiles at predicted batches, after the fit's first two


def second_batch(prompts: int, group: int, shards: int) -> int:
    """The other prompt count the rollout is compiled at for the fit: about half the
    configured count, whole shard-aligned units of lcm(shards, group) / group prompts (twice
    the count when half would be none or the same)."""
    unit = math.lcm(shards, group) // group
    half = (prompts // 2) // unit * unit
    return half if 0 < half != prompts else max(2 * prompts, unit)


def rollout_fit(run: RunConfig, cfg: ModelConfig, lay: Layout, mesh: Mesh, dparams: Any,
                resident: int, usable: float, configured: list[Program]) -> RolloutFit:
    """The largest rollout batch that fits `usable`: fit the prefill's and the decode loop's
    peaks affinely in the rows per shard through two compiled batches (the configured one and
    :func:`second_batch`), predict the largest batch that fits (:func:`largest_batch`),
    compile the rollout there, and repeat with the line through the closest batches that fit
    and do not (regula falsi, at most FIT_COMPILES compiles) until a fitting batch and the
    one a unit above it that does not are both compiled."""
    g, shards = run.algo.group_size, batch_shards(mesh)
    unit = math.lcm(shards, g)

    def compile_at(prompts: int) -> tuple[float, ...]:
        programs = rollout_programs(run, cfg, dataclasses.replace(
            lay, prompts=prompts, rows=prompts * g), mesh, dparams, resident)
        return tuple(float(p.peak) for p in programs)

    names = tuple(p.name for p in configured)

    known = {lay.prompts * g: tuple(float(p.peak) for p in configured)}
    known[second_batch(lay.prompts, g, shards) * g] = compile_at(second_batch(lay.prompts, g,
                                                                              shards))
    lines: tuple[Affine, ...] = ()
    for _ in range(FIT_COMPILES):
        fits = sorted(n for n, y in known.items() if max(y) <= usable and n % unit == 0)
        over = sorted(n for n, y in known.items() if max(y) > usable)
        lo, hi = (fits or [0])[-1], (over or [math.inf])[0]  # type: ignore[list-item]
        pair = [n for n in (lo, hi) if 0 < n < math.inf]
        pair = pair if len(pair) == 2 else sorted(known)[-2:]
        (n0, y0), (n1, y1) = ((n, known[n]) for n in pair)
        lines = tuple(affine_fit(sampler_rows(n0 // g, g, shards), a,
                                 sampler_rows(n1 // g, g, shards), b)
                      for a, b in zip(y0, y1))
        n = largest_batch(lines, usable, shards, g)
        if n < 0:
            return RolloutFit(usable, shards, unit, _measured(known), lines, -1, False, names)
        n = min(max(n, lo + unit), hi - unit)
        if n <= lo or n in known:
            break
        known[n] = compile_at(n // g)
    fits = [n for n, y in known.items() if max(y) <= usable and n % unit == 0]
    best = max(fits, default=0)
    above = known.get(best + unit)
    exact = above is not None and max(above) > usable
    return RolloutFit(usable, shards, unit, _measured(known), lines, best, exact, names)


def _measured(known: Mapping[int, tuple[float, ...]]) -> tuple[tuple[int, *tuple[float, ...]], ...]:
    return tuple((n, *y) for n, y in known.items())


def reference_program(run: RunConfig, cfg: ModelConfig, lay: Layout, mesh: Mesh, weights: Any,
                      resident: int) -> Program:
    """The reference / old-policy pass as ``rl.run.loop.logprobs_with`` runs it: the whole
    rollout batch in mini-batches x micro-batches strided parts (``batch_logprobs``) on
    `weights`, the reference's in the compute dtype (:class:`TrainSide`)."""
    n, g, p, r = lay.groups, lay.size, lay.prompt, lay.response
    scoring = run.loss_config(r).scoring()
    batch = {"prefix": _rows((n, p), jnp.int32, mesh),
             "prefix_mask": _rows((n, p), jnp.bool_, mesh),
             "tokens": _rows((n, g, r), jnp.int32, mesh),
             "attn_mask": _rows((n, g, r), jnp.bool_, mesh)}
    slices = run.trainer.mini_batches * run.trainer.micro_batches
    lowered = batch_logprobs.lower(cfg, weights, batch, scoring, slices=slices)
    runs = run.algo.beta > 0 or run.updates_per_batch > 1
    return compiled_program(
        "reference", lowered, (weights, batch), resident=resident,
        flops=sum(scoring_flops(cfg, n, g, p, r)),
        min_bytes=_in_and_out, runs=runs)


def update_program(run: RunConfig, cfg: ModelConfig, lay: Layout, mesh: Mesh, side: TrainSide,
                   resident: int) -> Program:
    """One optimizer update on a mini-batch, the train state donated, as rl.train builds it
    (a LoRA run's: the adapters' state, the frozen base an argument)."""
    oc = run.optim_config()
    lora = run.model.lora if side.base is not None else None
    step = make_train_step(cfg, run.loss_config(lay.response), make_optimizer(oc),
                           lr_schedule(oc), lora=lora)
    batch = update_batch(run, lay, mesh)
    args = (side.state, batch) if side.base is None else (side.state, batch, side.base)
    lowered = step.lower(*args)  # type: ignore[attr-defined]
    flops = update_flops(cfg, lay.update_groups, lay.size, lay.prompt, lay.response,
                         run.trainer.remat)
    return compiled_program(
        "update", lowered, args, resident=resident, flops=flops, min_bytes=_in_and_out)


# ------------------------------------------------------------------------------ report


@dataclasses.dataclass(frozen=True)
class TrainSide:
    """What the update and the reference pass run on, as sharded shapes: the train `state`
    (all the weights, or a LoRA run's adapters), a LoRA run's frozen `base` (None otherwise;
    stored quantized under model.lora.quant), the `reference` pass's weights (the compute
    dtype's; a LoRA run's base, shared where no cast copies it), and the bytes per chip that
    stay resident between programs: `state_bytes`, `base_bytes` and `ref_bytes` (the
    reference's copies, 0 without a KL term)."""

    state: Any
    base: Any | None
    reference: Any
    state_bytes: int
    base_bytes: int
    ref_bytes: int

    @property
    def resident(self) -> int:
        return self.state_bytes + self.base_bytes + self.ref_bytes


def train_side(run: RunConfig, cfg: ModelConfig, params: Any, mesh: Mesh) -> TrainSide:
    """The :class:`TrainSide` of the config over the loaded float32 `params` (shapes)."""
    optimizer = make_optimizer(run.optim_config())
    lora = run.model.lora
    base = None if not lora.enabled else abstract_base(params, lora, mesh)
    weights = params if base is None else base
    shapes = jax.eval_shape(lambda p: in_compute_dtype(p, run.model.dtype), weights)
    reference = jax.tree.map(  # a leaf the cast leaves alone is the weights' own buffer
        lambda x, w: w if x.dtype == w.dtype else jax.ShapeDtypeStruct(
            x.shape, x.dtype, sharding=w.sharding), shapes, weights)
    copies = sum(math.prod(x.sharding.shard_shape(x.shape)) * _itemsize(x.dtype)
                 for x, w in zip(jax.tree.leaves(reference), jax.tree.leaves(weights))
                 if x is not w)
    if base is None:  # full weights: the reference is always a copy (the step donates them)
        copies = bytes_per_chip(reference)
    trained = params if base is None else abstract_adapters(params, lora, mesh)
    state = abstract_state(trained, optimizer, mesh)
    return TrainSide(state, base, reference, bytes_per_chip(state),
                     0 if base is None else bytes_per_chip(base),
                     copies if run.algo.beta > 0 else 0)


def abstract_base(params: Any, lora: Any, mesh: Mesh) -> Any:
    """A LoRA run's frozen base (``models.lora.quantized_base``) as sharded shapes: each
    quantized weight's codes and block maxima split like the weight where they divide."""
    if lora.quant == "none":
        return params  # the loaded weights themselves, frozen
    shapes = jax.eval_shape(lambda p: quantized_base(p, lora), params)
    layers = {}
    for name, w in params["layers"].items():
        q = shapes["layers"][name]
        if not isinstance(q, Quantized):
            layers[name] = w
            continue
        codes, scales = (jax.ShapeDtypeStruct(x.shape, x.dtype,
                                              sharding=sharding_like(x.shape, w.sharding))
                         for x in (q.codes, q.scales))
        layers[name] = Quantized(codes, scales, q.kind)  # type: ignore[arg-type]
    return params | {"layers": layers}


def abstract_adapters(params: Any, lora: Any, mesh: Mesh) -> Any:
    """A LoRA run's adapters as shapes, replicated (``rl.run.lora.fresh_adapters``)."""
    shapes = jax.eval_shape(lambda p: init_adapters(p, lora, jax.random.key(0)), params)
    whole = NamedSharding(mesh, PartitionSpec())
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=whole),
                        shapes)


def startup_row(params: Any, side: TrainSide) -> Program:
    """The per-chip memory of loading, from the shapes (nothing to compile): each parameter
    goes from its file slice straight to the chips that own it (``models.sharded_load``), so
    a chip receives its shards of the float32 weights (the arguments column) and nothing
    else; start-up then creates the optimizer's state, sharded like the weights, and with
    algo.beta > 0 the reference weights in the compute dtype
    (``rl.run.trainer.reference_weights``; the outputs column). A LoRA run's start-up makes
    its frozen base from the loaded weights (a quantized copy, beside them until they are
    freed, under model.lora.quant), the adapters and their optimizer state. A resume
    restores the same train state from the checkpoint, each chip its shards. No
    temporaries: the step's programs, below, are where the temporaries are."""
    loaded = bytes_per_chip(params)
    made = side.state_bytes + side.ref_bytes
    made += -loaded if side.base is None else (
        side.base_bytes if side.base is not params else 0)
    return Program("start-up", loaded, 0, made, 0, 0, 0.0, 0.0, True)


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything the report prints."""

    model: str
    cfg: ModelConfig
    topology: str
    chip: Chip
    chips: int
    mesh: Mapping[str, int]
    lay: Layout
    state_bytes: int
    ref_bytes: int
    programs: tuple[Program, ...]
    fit: RolloutFit | None = None  # the largest rollout batch that fits (rollout_fit)
    rollout_mesh: Mapping[str, int] | None = None  # mesh.rollout_shape (None: the training's)
    gathered: int = 0  # layer-weight bytes a chip gathers per decode step (gathered_per_step)
    layer_bytes: int = 0  # the rollout's layer weights, whole (rollout dtype)
    base_bytes: int = 0  # a LoRA run's frozen base per chip (quantized: model.lora.quant)
    dcn: Mapping[str, int] | None = None  # each mesh axis's part across nodes or slices
    traffic: Mapping[str, Traffic] | None = None  # bytes per chip per step (rl.plan_network)


def make_plan(run: RunConfig, plan: PlanConfig) -> Plan:
    """Compile the step's programs for plan.topology (checked first) and collect the
    figures."""
    chip = check_topology(plan.topology)
    try:
        cfg = model_shapes(plan.model_shapes)
    except ModelLoadError as e:
        raise ConfigError(f"plan.model_shapes: {e}") from None
    devices = topology_devices(plan.topology, plan.slices)
    return plan_on(run, plan, cfg, devices, chip or host_chip(len(devices)))


def plan_on(run: RunConfig, plan: PlanConfig, cfg: ModelConfig, devices: list[Any],
            chip: Chip) -> Plan:
    """The plan of model `cfg` on `devices` (a described TPU slice, or a job's own devices:
    ``rl.smoke``), each a `chip`; plan.topology names them in the report."""
    mesh, rmesh = plan_meshes(run, plan, devices)
    lay = layout(run, plan, mesh)
    chunks = run.trainer.rollout_chunks  # the rollout: this many sampler calls of a part each
    rlay = dataclasses.replace(lay, prompts=lay.prompts // chunks, rows=lay.rows // chunks)
    params = abstract_params(cfg, mesh)
    side = train_side(run, cfg, params, mesh)
    resident = side.resident
    dparams = sampler_weights(run, params, rmesh)
    with jax.set_mesh(rmesh):  # the activation constraints (models.constraints), as rl.run.loop
        rollout = rollout_programs(run, cfg, rlay, rmesh, dparams, resident)
        fit = rollout_fit(run, cfg, rlay, rmesh, dparams, resident, usable_bytes(chip),
                          rollout) if plan.rollout_fit else None
        evaluation = evaluation_programs(run, cfg, lay, rmesh, params, resident)
    rollout = [dataclasses.replace(p, calls=chunks) for p in rollout]
    gathered = gathered_per_step(dparams)
    dcn = mesh_dcn(mesh, run.mesh.dcn_shape)
    with jax.set_mesh(mesh):
        reference = reference_program(run, cfg, lay, mesh, side.reference,
                                      resident - bytes_per_chip(side.reference))
        programs = [*rollout, reference,
                    update_program(run, cfg, lay, mesh, side, side.ref_bytes),
                    startup_row(params, side), *evaluation]
    return Plan(plan.model_shapes, cfg, plan.topology, chip, len(devices), dict(mesh.shape),
                lay, side.state_bytes, side.ref_bytes, tuple(programs), fit,
                None if rmesh is mesh else dict(rmesh.shape), gathered,
                sum(math.prod(x.shape) * _itemsize(x.dtype)
                    for x in jax.tree.leaves(dparams["layers"])),
                side.base_bytes, dcn, network(run, cfg, lay, mesh, rmesh, gathered, side, dcn))


def plan_meshes(run: RunConfig, plan: PlanConfig, devices: list[Any]) -> tuple[Mesh, Mesh]:
    """The training mesh and the rollout's (the same without mesh.rollout_shape) over
    `devices`, placed following the network (``models.device_mesh``: the slices of a
    multi-slice topology, the nodes of a GPU estimate, are its granules)."""
    try:
        mesh = make_mesh(dict(run.mesh.shape or {"data": -1}), devices=devices,
                         dcn_shape=run.mesh.dcn_shape)
    except ValueError as e:
        key = "" if str(e).startswith("mesh.dcn_shape") else "mesh.shape: "
        raise ConfigError(f"{key}{e} (plan.topology={plan.topology})") from None
    if run.mesh.rollout_shape is None:
        return mesh, mesh
    try:
        return mesh, make_mesh(dict(run.mesh.rollout_shape), devices=devices)
    except ValueError as e:
        raise ConfigError(f"mesh.rollout_shape: {e} (plan.topology={plan.topology})") from None


def mesh_dcn(mesh: Mesh, dcn_shape: Mapping[str, int] | None) -> dict[str, int]:
    """Each axis's part across nodes or slices, as ``models.device_mesh`` placed `mesh`
    with `dcn_shape` (None: the default placement)."""
    return device_grid(dict(mesh.shape), list(mesh.devices.flat), dcn_shape)[1]


def network(run: RunConfig, cfg: ModelConfig, lay: Layout, mesh: Mesh, rmesh: Mesh,
            gathered: int, side: TrainSide, dcn: dict[str, int]) -> dict[str, Traffic]:
    """The step's bytes per chip over each network (``rl.plan_network``), the training
    mesh's axes split `dcn` across nodes or slices."""
    t = run.trainer
    lora = run.model.lora.enabled
    whole = lambda tree: sum(math.prod(x.shape) * _itemsize(x.dtype)  # noqa: E731
                             for x in jax.tree.leaves(tree))
    weights = whole(side.base) if lora and run.model.lora.quant != "none" else (
        cfg.num_params * _itemsize(run.model.dtype))
    grads = 4.0 * (whole(side.state.params) / 4 if lora else cfg.num_params)
    reference = run.algo.beta > 0 or run.updates_per_batch > 1
    shape = StepShape(weights=weights, grads=grads, grads_sharded=not run.model.lora.enabled,
                      updates=run.updates_per_batch, micro_batches=t.micro_batches,
                      reference_parts=t.mini_batches * t.micro_batches if reference else 0,
                      decode_steps=lay.response * t.rollout_chunks, decode_gathered=gathered)
    return step_traffic(shape, dict(mesh.shape), dcn, dict(rmesh.shape),
                        dcn if rmesh is mesh else mesh_dcn(rmesh, None))


def time_bound(plan: Plan, prog: Program) -> float | None:
    """Seconds at least: max(FLOPs / (chips x peak), bytes per chip / HBM bandwidth, weight
    bytes gathered per chip / ICI bandwidth): each a floor the program cannot beat, the
    largest its bound (they may overlap, so not their sum), times the program's calls a step
    (the rollout's trainer.rollout_chunks). The ICI floor counts the layer
    weights the rollout gathers (:func:`gathered_per_step`) against the chip's bidirectional
    bandwidth, where the docs state one; other collectives are not counted."""
    if plan.chip.peak_flops is None or plan.chip.hbm_bandwidth is None or not (
            prog.flops or prog.min_bytes):  # start-up: nothing to bound
        return None
    ici = prog.ici_bytes / plan.chip.ici_bandwidth if plan.chip.ici_bandwidth else 0.0
    return prog.calls * max(prog.flops / (plan.chips * plan.chip.peak_flops),
                            prog.min_bytes / plan.chip.hbm_bandwidth, ici)


def step_bound(run: RunConfig, plan: Plan) -> tuple[float, dict[str, float]] | None:
    """Seconds a training step takes at least, and its parts: the rollout's prefill and
    decode loop (x trainer.rollout_chunks calls; a multi-turn task's continuation programs
    replace part of that loop and are not added), the reference pass where the config runs
    it, and the update x its updates per step (mini-batches x epochs). None without the
    chip's peak figures."""
    def bound(name: str) -> float | None:
        prog = next((p for p in plan.programs if p.name == name and p.runs), None)
        return None if prog is None else time_bound(plan, prog)

    if plan.chip.peak_flops is None:
        return None
    parts = {"rollout": (bound("prefill") or 0.0) + (bound("decode") or 0.0),
             "reference": bound("reference") or 0.0,
             "update": (bound("update") or 0.0) * run.updates_per_batch}
    return sum(parts.values()), parts


def step_line(run: RunConfig, plan: Plan) -> str:
    """The report's line of :func:`step_bound`."""
    if (bound := step_bound(run, plan)) is None:
        return "step: no time bound (no peak figures for this chip)"
    total, parts = bound
    return (f"step: >= {_seconds(total).strip()} (rollout {_seconds(parts['rollout']).strip()}, "
            f"reference {_seconds(parts['reference']).strip()}, update "
            f"{_seconds(parts['update']).strip()} for {run.updates_per_batch} update(s); "
            "the sum of the bounds above)")


def network_lines(plan: Plan) -> list[str]:
    """Where the mesh's axes run (across nodes or slices, or inside one) and the step's bytes
    per chip over each network (``rl.plan_network``'s model), by collective."""
    if plan.dcn is None or plan.traffic is None:
        return []
    granules = math.prod(plan.dcn.values())
    link = plan.chip.link
    across = " ".join(f"{a}={n}" for a, n in plan.dcn.items() if n > 1) or "none"
    total = sum(plan.traffic.values(), Traffic())
    parts = "; ".join(f"{name} {_size(t.ici)} / {_size(t.dcn)}"
                      for name, t in plan.traffic.items() if t.ici or t.dcn)
    return [f"network: {granules} {'slice(s)' if link == 'ICI' else 'node(s)'}; mesh axes "
            f"across them: {across} (mesh.dcn_shape), the rest inside one over {link}",
            f"  per chip per step (a ring model, rl.plan_network): {_size(total.ici)} over "
            f"{link}, {_size(total.dcn)} over the network between them"
            + (f" ({link} / network: {parts})" if parts else "")]


def _size(n: float) -> str:
    """Bytes as GiB, or MiB below a tenth of one."""
    return f"{n / GiB:.2f} GiB" if n >= GiB / 10 or n == 0 else f"{n / 2**20:.1f} MiB"


def splits(groups: int, size: int, slices: int) -> bool:
    """Whether `groups` groups of `size` cut into `slices` equal parts without filler."""
    return batch_groups(groups, size, slices)[2] == 0


def remedies(run: RunConfig, plan: Plan, name: str) -> list[str]:
    """The keys that lower a program's memory, as the user would type them: only values the
    batch layout accepts (mini x micro x data-parallel shards must cut it evenly)."""
    t, g = run.trainer, run.algo.group_size
    shards = plan.mesh["data"] * plan.mesh["fsdp"]
    ok = lambda prompts, mini, micro: splits(prompts, g, mini * micro * shards)  # noqa: E731
    micro = next((m for m in range(t.micro_batches + 1, 8 * t.micro_batches + 1)
                  if ok(t.batch_prompts, t.mini_batches, m)), None)
    if micro is None and plan.lay.filler:  # fewer micro-batches, cut evenly: no filler rows
        micro = fewer_micro_batches(run, plan)
    mini = next((m for m in range(t.mini_batches + 1, 8 * t.mini_batches + 1)
                 if ok(t.batch_prompts, m, t.micro_batches)), None)
    fewer = next((b for b in range(t.batch_prompts // 2, 0, -1)
                  if ok(b, t.mini_batches, t.micro_batches)), None)
    more_fsdp = (f"mesh.shape={{data:1,fsdp:{plan.chips},tensor:1}} (weights, gradients and "
                 f"Adam state over all {plan.chips} chips)" if plan.mesh["fsdp"] < plan.chips
                 else None)
    rows = f"trainer.batch_prompts={fewer} (fewer rows)" if fewer else None
    logits = (None if 0 < t.logits_chunk <= 128 else
              f"trainer.logits_chunk={t.logits_chunk // 2 if t.logits_chunk else 256} (the logits "
              "of fewer positions at a time)")
    if name.startswith("eval "):
        return evaluation_remedies(run, name.removeprefix("eval "), more_fsdp)
    if name == "start-up":
        keys = [more_fsdp, "algo.beta=0 (no reference weights)" if run.algo.beta > 0 else None]
    elif name == "update":
        keys = [f"trainer.micro_batches={micro}" if micro else None,
                None if t.remat else "trainer.remat=true", more_fsdp,
                f"trainer.mini_batches={mini} (smaller updates)" if mini else None, rows, logits]
    elif name == "reference":
        keys = [rows, more_fsdp, None if t.remat else "trainer.remat=true",
                f"trainer.micro_batches={micro} (the reference pass runs in mini x micro "
                "parts)" if micro else None, logits]
    else:
        fit = plan.fit.trajectories // g if plan.fit and plan.fit.trajectories > 0 else 0
        if (t.rollout_chunks == 1 and 0 < fit < t.batch_prompts
                and ok(fit, t.mini_batches, t.micro_batches)):
            rows = f"trainer.batch_prompts={fit} (the largest rollout batch that fits)"
        chunks = more_chunks(t.batch_prompts, t.rollout_chunks, fit)
        in_parts = (f"trainer.rollout_chunks={chunks} (the same batch, rolled out in {chunks} "
                    f"sampler calls of {t.batch_prompts // chunks} prompts one after another)"
                    if chunks else None)
        pin = [f"trainer.prefill_pin_rows={str(not t.prefill_pin_rows).lower()} (the "
               "prefill's other activation layout)"] if name == "prefill" else []
        keys = [None if t.kv_cache_dtype == "bfloat16" else "trainer.kv_cache_dtype=bfloat16 "
                "(half the KV cache)", *pin, in_parts, rows,
                None if t.rollout_dtype == "bfloat16" else "trainer.rollout_dtype=bfloat16",
                more_fsdp, "a smaller response budget (plan.response_budget, the task's)"]
        if name in ("read", "continue", "part"):
            keys.append("a smaller task.max_obs_tokens (the observation the continuation "
                        "reads)")
        if name == "part":
            keys.insert(0, "trainer.rollout_sub_batches=false (continuations run every row "
                           "in place: no gathered copy of the cache)")
    return [k for k in keys if k]


def evaluation_remedies(run: RunConfig, name: str, more_fsdp: str | None) -> list[str]:
    """The keys that lower an evaluation program's memory (`name`: its rollout program)."""
    t = run.trainer
    dtype = t.eval_dtype or t.rollout_dtype
    cache = t.eval_dtype or t.kv_cache_dtype
    keys = [f"trainer.eval_batch_size={t.eval_batch_size // 2} (fewer prompts evaluated "
            "together)" if t.eval_batch_size > 1 else None,
            None if dtype == cache == "bfloat16" else "trainer.eval_dtype=bfloat16 (bfloat16 "
            "weights and KV cache for the evaluation)", more_fsdp,
            "a smaller response budget (trainer.max_new_tokens)"]
    if name in ("read", "continue", "part"):
        keys.append("a smaller task.max_obs_tokens (the observation the continuation reads)")
    return [k for k in keys if k]


def more_chunks(prompts: int, chunks: int, fit: int) -> int | None:
    """The fewest rollout chunks above `chunks` that split `prompts` evenly into parts of at
    most `fit` prompts (the largest rollout that fits; 0: unknown, then just the next
    count that splits them); None when no count does."""
    counts = [k for k in range(chunks + 1, prompts + 1) if prompts % k == 0]
    return next((k for k in counts if not fit or prompts // k <= fit), None)


def _gib(n: float) -> str:
    return f"{n / GiB:7.3f}"


def _seconds(s: float | None) -> str:
    if s is None:
        return "      n/a"
    return f"{s * 1e3:7.1f} ms" if s < 1 else f"{s:8.2f} s"


def header(run: RunConfig, plan: Plan) -> list[str]:
    cfg, lay, chip = plan.cfg, plan.lay, plan.chip
    hbm = (f"{chip.name}: {chip.hbm_bytes / GiB:.{int(chip.hbm_bytes % GiB > 0)}f} GiB HBM, "
           f"{chip.peak_flops / 1e12:.0f} TFLOP/s bf16, {chip.hbm_bandwidth / 1e9:.0f} GB/s "
           f"({chip.source})" if chip.peak_flops and chip.hbm_bandwidth else
           f"{chip.name}: no peak figures, no time bound")
    mesh = " ".join(f"{k}={v}" for k, v in plan.mesh.items())
    rollout_mesh = ("the training mesh" if plan.rollout_mesh is None else "mesh.rollout_shape "
                    + " ".join(f"{k}={v}" for k, v in plan.rollout_mesh.items()))
    t = run.trainer
    n = gpu_nodes(plan.topology)
    nodes = f" per node, {n} of them" if n > 1 else ""
    stored = "float32" if run.model.lora.quant == "none" else run.model.lora.quant
    return [
        f"rl.plan: {plan.model} ({cfg.arch}, {cfg.num_params / 1e9:.3f} B parameters) on "
        f"{plan.topology}: {plan.chips} chips, {hbm}; mesh {mesh}",
        *([f"  ESTIMATE: no GPU compiler runs here; the programs were compiled by libtpu for "
           f"a TPU slice of as many chips ({stand_in_topology(plan.topology)}{nodes}) "
           f"standing in "
           f"for the GPUs: the same programs, sharded the same way; XLA:GPU's own fusions, "
           f"buffer assignment and library workspaces differ and were not compiled. Held "
           f"against {usable_bytes(chip) / chip.hbm_bytes:.0%} of each GPU's memory "
           f"({usable_bytes(chip) / GiB:.1f} GiB: XLA_PYTHON_CLIENT_MEM_FRACTION, JAX's "
           f"preallocation; set it on the GPU hosts and here alike)"]
          if stand_in_topology(plan.topology) else []),
        f"  batch: {lay.prompts} prompts x {run.algo.group_size} = {lay.rows} trajectories; "
        f"prompt {lay.prompt} tokens, response budget {lay.response}; update: "
        f"{lay.mini_batches} mini-batch(es) of {lay.update_groups} groups x {lay.size}, "
        f"{t.micro_batches} micro-batches, remat {str(t.remat).lower()}, compute "
        f"{run.model.dtype}; rollout {t.rollout_dtype} weights, {t.kv_cache_dtype} KV cache, "
        f"prefill rows {'pinned' if t.prefill_pin_rows else 'left to the compiler'}"
        + (f"; the rollout in {t.rollout_chunks} sampler calls of "
           f"{lay.prompts // t.rollout_chunks} prompts (trainer.rollout_chunks: the rollout "
           f"rows below are one call's)" if t.rollout_chunks > 1 else ""),
        *([f"  filler: rl.grpo.batch adds {lay.filler} filler group(s) (loss mask 0) so that "
           f"{lay.rows} trajectories cut into {t.mini_batches} x {t.micro_batches} x "
           f"{plan.mesh['data'] * plan.mesh['fsdp']} equal slices: the update computes "
           f"{lay.filler * run.algo.group_size} trajectories for nothing{_even(run, plan)}"]
          if lay.filler else []),
        (f"  resident per chip: train state (float32 weights + optimizer) "
         f"{plan.state_bytes / GiB:.2f} GiB, reference weights {plan.ref_bytes / GiB:.2f} GiB"
         if not run.model.lora.enabled else
         f"  resident per chip: LoRA rank {run.model.lora.rank} on "
         f"{', '.join(run.model.lora.targets)}: adapters + optimizer "
         f"{plan.state_bytes / GiB:.3f} GiB, frozen base ({stored}) "
         f"{plan.base_bytes / GiB:.2f} GiB, reference copies {plan.ref_bytes / GiB:.2f} GiB"),
        f"  rollout on {rollout_mesh}: each decode step gathers {plan.gathered / 2**20:.1f} "
        f"MiB of layer weights per chip from the others"
        + (f", >= {plan.gathered / chip.ici_bandwidth * 1e3:.2f} ms at {chip.name}'s "
           f"{chip.ici_bandwidth / 1e9:.0f} GB/s bidirectional "
           f"{chip.link} (in the decode's time bound)"
           if chip.ici_bandwidth else " (no ICI figure for this chip: not in the time bound)"),
    ]


def fewer_micro_batches(run: RunConfig, plan: Plan) -> int | None:
    """The largest micro-batch count below the configured one that cuts the batch with no
    filler on the plan's shards (:func:`even_micro_batches`), or None where none does."""
    t, g, shards = run.trainer, run.algo.group_size, plan.mesh["data"] * plan.mesh["fsdp"]
    even = even_micro_batches(t.batch_prompts, g, t.mini_batches, shards, t.micro_batches)
    return even if splits(t.batch_prompts, g, t.mini_batches * even * shards) else None


def _even(run: RunConfig, plan: Plan) -> str:
    """The filler line's advice: the micro-batch count that leaves none, where one does."""
    even = fewer_micro_batches(run, plan)
    return f" (trainer.micro_batches={even} cuts it evenly)" if even else ""


def report(run: RunConfig, plan: Plan) -> str:
    """The plan as text: a table per program, then the verdicts."""
    lines = header(run, plan)
    lines.append(f"  {'program':<{name_width(plan)}}{'args':>8}{'temp':>8}{'out':>8}{'total':>8}"
                 f"{'+resid.':>9}  {'of HBM':>7}{'FLOPs':>11}  {'time >=':>10}   (GiB per chip)")
    lines += [_row(plan, p) for p in plan.programs]
    lines += reads_lines(plan)
    if plan.fit is not None:
        lines.append(fit_line(run, plan.fit))
    lines.append(step_line(run, plan))
    lines += network_lines(plan)
    lines.append(rollout_advice(plan))
    lines.append(verdict(run, plan))
    return "\n".join(lines)


def tensor_options(cfg: ModelConfig | None, chips: int) -> list[int]:
    """The tensor-parallel widths a rollout mesh ``{data:-1,tensor:t}`` can take for `cfg`
    on `chips`: t dividing the query and KV heads (each chip then holds whole KV heads for
    its query heads: no cache moves between chips), the MLP width and the chip count."""
    if cfg is None:
        return []
    return [t for t in (2, 4, 8, 16) if not (cfg.num_kv_heads % t or cfg.num_heads % t
                                            or cfg.intermediate_size % t or chips % t)]


def rollout_advice(plan: Plan) -> str:
    """Which rollout layout to use. When the rollout gathers layer weights, replicating them
    (``mesh.rollout_shape={data:-1}``) holds the whole layer weights on every chip (the bytes
    they gather a step more than the chip's shard) and removes the gathers; a
    tensor-parallel layout ``{data:-1,tensor:t}`` holds a t-th of them and removes the
    gathers too (heads and MLP columns computed in place, activations all-reduced:
    :func:`gathered_per_step`). The narrowest layout whose rollout peak (the training
    layout's, plus the extra weight bytes) stays within the usable HBM is recommended."""
    if plan.gathered == 0:
        return ("rollout layout: the sampler's layer weights are whole or tensor-split on every "
                "chip; decoding gathers none")
    decode = next((p for p in plan.programs if p.name == "decode"), None)
    peak = max((p.peak for p in plan.programs if p.runs and p.name.removeprefix("eval ")
                in ("prefill", "decode", "read", "continue", "part")), default=0)
    usable = usable_bytes(plan.chip)
    link = plan.chip.link
    saved = (f", saving >= {plan.gathered / plan.chip.ici_bandwidth * 1e3:.2f} ms of {link} per "
             f"decode step ({decode.ici_bytes / plan.chip.ici_bandwidth:.2f} s per rollout)"
             if plan.chip.ici_bandwidth and decode is not None else "")
    whole = plan.layer_bytes or plan.gathered  # the layer weights, whole
    own = whole - plan.gathered  # what a chip holds of them on the training layout
    options = [(1, whole - own)] + [(t, whole // t - own)
                                    for t in tensor_options(plan.cfg, plan.chips)]
    for t, extra in options:
        if peak + max(extra, 0) <= usable:
            shape = "{data:-1}" if t == 1 else f"{{data:-1,tensor:{t}}}"
            held = ("the layer weights whole on every chip" if t == 1 else
                    f"the heads and MLP columns split {t} ways, computed in place "
                    "(activations all-reduced)")
            return (f"rollout layout: recommended mesh.rollout_shape={shape}: {held}, "
                    f"{extra / GiB:.2f} GiB more per chip (rollout peak "
                    f"{(peak + extra) / GiB:.2f} of {usable / GiB:.2f} GiB), resharded once per "
                    f"step{saved}")
    t, extra = options[-1]
    return (f"rollout layout: keep the training layout: the narrowest other one, "
            f"{'{data:-1}' if t == 1 else f'{{data:-1,tensor:{t}}}'}, would need "
            f"{extra / GiB:.2f} GiB more per chip ({(peak + extra) / GiB:.2f} > "
            f"{usable / GiB:.2f} GiB)")


def fit_line(run: RunConfig, fit: RolloutFit) -> str:
    """The largest rollout batch that fits, and how it was found."""
    g = run.algo.group_size
    seen = ", ".join(f"{n}" for n, *_ in fit.measured)
    how = (f"the rollout compiled at {seen} trajectories, the next batch predicted by an "
           f"affine fit in the rows per shard; against {fit.usable / GiB:.2f} GiB per chip "
           f"with the resident bytes; batches in units of lcm(shards, group) = {fit.unit}")
    if fit.trajectories < 0:
        return f"rollout: its memory does not grow with the batch ({how})"
    if fit.trajectories == 0:
        return f"rollout: no rollout batch that fits was found ({how})"
    peaks = ", ".join(f"{name} {y / GiB:.2f} GiB"
                      for name, y in zip(fit.names, fit.compiled(fit.trajectories) or ()))
    text = (f"rollout: largest rollout batch that fits: {fit.trajectories} trajectories "
            f"({fit.trajectories // g} prompts x {g}; {peaks} per chip")
    if fit.exact:
        up = fit.compiled(fit.trajectories + fit.unit) or (0.0,)
        text += f"; {fit.trajectories + fit.unit} needs {max(up) / GiB:.2f} GiB"
    else:
        text += "; the largest compiled, a larger one may fit"
    return f"{text}; {how})"


def name_width(plan: Plan) -> int:
    """The program column's width: 10, or the longest name and a space ("eval continue")."""
    return max(10, 1 + max((len(p.name) for p in plan.programs), default=0))


def _row(plan: Plan, p: Program) -> str:
    notes = ("" if p.runs else "   (not run by this config)") + (
        f"   (x{p.calls} a step: trainer.rollout_chunks)" if p.calls > 1 else "") + (
        f"   (refused by {'the stand-in' if chip_is_gpu(plan) else 'the'} compiler: sizes from "
        "its message)" if p.refused else "") + (
        "   (the compiler FAILED on it: arguments only; see the verdict)" if p.failed else "")
    return (f"  {p.name:<{name_width(plan)}}{_gib(p.arguments)} {_gib(p.temporaries)} "
            f"{_gib(p.outputs)} {_gib(p.total)}  {_gib(p.peak)}  "
            f"{100 * p.peak / plan.chip.hbm_bytes:6.0f}%"
            f"{p.flops:11.3e}  {_seconds(time_bound(plan, p))}{notes}")


def reads_lines(plan: Plan) -> list[str]:
    """What a rollout decode step reads per chip (its time bound's bytes): the line of
    each decode program with :class:`DecodeReads`."""
    out = []
    for p in plan.programs:
        if (r := p.reads) is None:
            continue
        own = ("each row's own slots" if reads_own_slots(r.kernel) else
               "for every row the cache prefix its decode loop is in: "
               "trainer.decode_kernel=pallas_gpu or a paged kernel reads each row's own")
        shared = (f", the groups' shared prompts {_size(r.shared)}" if r.shared else "")
        pages = ("" if r.reuse <= 1 else ", their groups' full prompt pages read once a group"
                 if r.shared else "; a group's shared prompt pages read by each row")
        out.append(f"  {p.name}: a step reads >= {_size(r.per_step)} per chip: weights and "
                   f"loop state {_size(r.fixed)}{shared}, KV cache {_size(r.cache_read)}"
                   f" of {_size(r.cache)} ({r.read:.0f} of {r.capacity} slots a row on "
                   f"average, {own}; the rows hold {r.held:.0f}{pages})")
    return out


def verdict(run: RunConfig, plan: Plan) -> str:
    """'fits' when every program the config runs fits, and a line per program that does
    not (or would not, for a pass this config skips) with the keys that help."""
    hbm = plan.chip.usable or plan.chip.hbm_bytes
    # a GPU estimate's stand-in refuses what its own HBM cannot hold, which an H200 may
    estimate = stand_in_topology(plan.topology) is not None
    over = [p for p in plan.programs if p.peak > hbm or (p.refused and not estimate)]
    failed = [p for p in plan.programs if p.failed]
    out = []
    if not any(p.runs for p in over) and not any(p.runs for p in failed):
        out.append(f"verdict: fits: every program this config runs is within "
                   f"{hbm / GiB:.1f} GiB per chip")
    for p in over:
        status = "does NOT fit" if p.runs else (
            "would NOT fit if run (trainer.eval_at_ends or trainer.eval_every)"
            if p.name.startswith("eval ") else
            "would NOT fit if run (algo.beta > 0 or several updates per batch)")
        out.append(f"verdict: {p.name} {status}: {p.peak / GiB:.2f} GiB per chip (program "
                   f"{p.total / GiB:.2f} + resident {p.resident / GiB:.2f}) > "
                   f"{hbm / GiB:.1f} GiB; " + ("try " + "; ".join(keys) if (
                       keys := remedies(run, plan, p.name)) else "no key of this config lowers "
                       "it on this slice (a larger slice, or a smaller batch or model)"))
        if p.refused:
            out.append(f"  the compiler: {p.refused}")
    for p in failed:
        out.append(f"verdict: {p.name} was not sized: the {'stand-in ' if estimate else ''}"
                   f"compiler failed on it ({p.failed})")
    if estimate:
        out.append("verdict: an ESTIMATE (above): confirm on one GPU host with rl.smoke")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    """The hydra entry point (``conf/plan.yaml``: rl.train's config plus ``plan``)."""
    import hydra

    # compile for the topology without a TPU: JAX itself on the CPU (unless JAX_PLATFORMS
    # says otherwise), and libtpu loaded even while another process on this host holds its
    # lock (/tmp/libtpu_lockfile)
    if not os.environ.get("JAX_PLATFORMS"):
        jax.config.update("jax_platforms", "cpu")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

    @hydra.main(config_path="../conf", config_name="plan", version_base="1.3")
    def entry(cfg: Any) -> None:
        try:
            run, plan = parse_plan(resolved_config(cfg))
            print(report(run, make_plan(run, plan)), flush=True)
        except ConfigError as e:
            sys.exit(f"rl.plan: {e}")

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    entry()


if __name__ == "__main__":
    from rl.run.resolve import print_help_first

    print_help_first(__doc__)
    main()
