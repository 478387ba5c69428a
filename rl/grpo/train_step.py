"""The jitted policy update: ``train_step(state, batch) -> (state, metrics)``.

One call is one optimizer update on one mini-batch (``rl.grpo.batch``'s layout: each group's
prompt once), accumulating gradients over `micro_batches` slices of its groups with
``lax.scan``. The host loop calls it for every PPO epoch and
mini-batch of a rollout batch.

Loss per token (only where loss_mask = 1):
    L = policy_loss(logp, logp_old, A) + beta * KL(logp, logp_ref) - entropy_coef * H
with the policy loss named by ``algo.policy_loss`` (PPO-clip, GSPO, GSPO-token, CISPO)
aggregated with the configured mode. With a single update per rollout batch the policy that
sampled is the policy being updated, so logp_old = stop_gradient(logp) exactly (ratio 1, no
extra forward pass); otherwise the batch carries logp_old from a forward before the updates.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from models.config import ModelConfig
from models.constraints import shard_rows
from models.lora import LoraConfig, adapted
from models.quant import Quantized
from models.scoring import Scoring, group_logprobs
from models.transformer import Params
from rl.grpo.kl import kl_penalty
from rl.grpo.losses import POLICY_LOSSES, agg_count, agg_loss, masked_mean

Batch = dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class LossConfig:
    policy_loss: str = "ppo"  # a name in rl.grpo.losses.POLICY_LOSSES
    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float | None = None
    beta: float = 0.0
    kl_estimator: str = "k3"
    loss_agg: str = "token-mean"
    max_len_norm: int | None = None
    entropy_coef: float = 0.0
    on_policy: bool = True  # logp_old = stop_gradient(logp): exact when one update per batch
    micro_batches: int = 1
    remat: bool = False
    compute_dtype: str = "float32"  # forward/backward dtype; the weights stay float32 masters
    temperature: float = 1.0  # the rollouts' sampling temperature: log-probs of that policy
    logits_chunk: int = 0  # positions scored at a time (models.scoring.Scoring)

    def scoring(self, with_entropy: bool = False) -> Scoring:
        """The log-prob passes' settings: the update's (with entropy), the reference's."""
        return Scoring(remat=self.remat, with_entropy=with_entropy,
                       temperature=self.temperature, logits_chunk=self.logits_chunk)


def in_compute_dtype(params: Params, dtype: Any) -> Params:
    """The float32 master weights cast to the compute dtype (e.g. bfloat16) for a forward
    pass; gradients flow back through the cast to the float32 weights, so updates far below
    bfloat16's resolution (lr 1e-6) still move them."""
    dtype = jnp.dtype(dtype)
    if dtype == jnp.float32:
        return params
    # a QLoRA base weight stays as stored: dequantized in the matmul's dtype (models.quant)
    return jax.tree.map(lambda a: a if isinstance(a, Quantized) else a.astype(dtype)
                        if jnp.issubdtype(a.dtype, jnp.floating) else a, params,
                        is_leaf=lambda a: isinstance(a, Quantized))


class TrainState(NamedTuple):
    step: jax.Array
    params: Params
    opt_state: Any


def init_train_state(params: Params, optimizer: optax.GradientTransformation,
                     mesh: Mesh | None = None) -> TrainState:
    """Step 0, `params`, the optimizer's fresh state, on the params' device. With a `mesh`
    (and `params` placed on it) the state is placed by :func:`train_state_shardings`, so that
    every leaf is one array over the job's devices (a multi-host checkpoint cannot save an
    array that lives on one device of one process)."""
    state = TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params))
    if mesh is None:
        # committed to the params' device, as a restored checkpoint's arrays are: committed
        # and uncommitted arguments compile apart, and a resumed run would miss the compile
        # cache of the programs the run compiled before (params placed by hand over several
        # devices are left as they are)
        devices = {d for x in jax.tree.leaves(params)
                   for d in getattr(x, "sharding", jax.sharding.SingleDeviceSharding(
                       jax.devices()[0])).device_set}
        return jax.device_put(state, devices.pop()) if len(devices) == 1 else state
    return jax.device_put(state, train_state_shardings(state, optimizer, mesh))


def abstract_train_state(params: Params, optimizer: optax.GradientTransformation,
                         mesh: Mesh | None = None) -> TrainState:
    """The shapes, dtypes and shardings :func:`init_train_state` gives `params` (here
    ``jax.ShapeDtypeStruct`` leaves carrying their shardings), computing nothing: the target
    a resume restores its checkpoint onto without the model's weights in memory."""
    state = jax.eval_shape(
        lambda p: TrainState(jnp.zeros((), jnp.int32), p, optimizer.init(p)), params)
    state = state._replace(params=params)
    if mesh is None:
        one = jax.tree.leaves(params)[0].sharding
        shardings = jax.tree.map(lambda _: one, state)
    else:
        shardings = train_state_shardings(state, optimizer, mesh)
    return jax.tree.map(lambda x, sharding: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                                 sharding=sharding),
                        state, shardings)


def train_state_shardings(state: Any, optimizer: optax.GradientTransformation,
                          mesh: Mesh) -> TrainState:
    """Shardings of a train state (concrete, or shapes with shardings) whose params carry
    theirs: the optimizer's per-parameter leaves (Adam's moments) sharded like their
    parameters (``optax.tree_map_params``), the step and the other optimizer leaves
    replicated."""
    replicated = NamedSharding(mesh, PartitionSpec())
    opt = optax.tree_map_params(optimizer, lambda _, p: p.sharding, state.opt_state,
                                state.params, transform_non_params=lambda _: replicated)
    return TrainState(replicated, jax.tree.map(lambda p: p.sharding, state.params),  # type: ignore[arg-type]
                      opt)


def policy_loss(cfg: ModelConfig, lc: LossConfig, params: Params, batch: Batch,
                count: jax.Array | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Scalar loss and metrics for one (micro-)batch, laid out as ``rl.grpo.batch`` describes.

    batch: prefix, prefix_mask [N,P]; tokens, attn_mask, loss_mask [N,G,R]; advantages [N,G];
    logp_old [N,G,R] unless on_policy; logp_ref [N,G,R] when beta > 0. The loss sees the
    N*G trajectories as rows. ``count``: the mini-batch's count of the units the aggregation
    averages over, when this is one of its micro-batches (``rl.grpo.losses.agg_loss``).
    """
    params = in_compute_dtype(params, lc.compute_dtype)
    logp, entropy = group_logprobs(cfg, params, batch["prefix"], batch["prefix_mask"],
                                   batch["tokens"], batch["attn_mask"],
                                   scoring=lc.scoring(with_entropy=True))
    rows = lambda a: a.reshape(-1, a.shape[-1])  # noqa: E731  [N,G,R] -> [N*G,R]
    logp, entropy = rows(logp), rows(entropy)
    mask = rows(batch["loss_mask"]).astype(jnp.float32)
    logp_old = jax.lax.stop_gradient(logp) if lc.on_policy else rows(batch["logp_old"])
    per_token, stats = POLICY_LOSSES.get(lc.policy_loss)(
        logp, logp_old, batch["advantages"].reshape(-1), mask, eps_low=lc.eps_low,
        eps_high=lc.eps_high, dual_clip=lc.dual_clip)
    agg = functools.partial(agg_loss, mask=mask, mode=lc.loss_agg, max_len=lc.max_len_norm,
                            count=count)
    pg_loss = agg(per_token)
    loss = pg_loss
    metrics = {"pg_loss": pg_loss, "clip_frac": stats["clip_frac"],
               "approx_kl": stats["approx_kl"], "entropy": masked_mean(entropy, mask)}
    if lc.beta > 0:
        kl = kl_penalty(logp, rows(batch["logp_ref"]), lc.kl_estimator)
        kl_loss = agg(kl)
        loss = loss + lc.beta * kl_loss
        metrics["kl"] = masked_mean(kl, mask)
    else:
        metrics["kl"] = jnp.zeros(())
    if lc.entropy_coef > 0:
        loss = loss - lc.entropy_coef * agg(entropy)
    metrics["loss"] = loss
    return loss, metrics


def micro_slices(x: jax.Array, m: int) -> jax.Array:
    """[N, ...] -> [m, N/m, ...]: micro-batch k holds groups k, m + k, 2m + k, ... A
    data-parallel shard holds consecutive groups, so every micro-batch takes N/(m x shards)
    groups from each shard and stays split over all of them (cutting [N] into m consecutive
    blocks would leave each block on 1/m of the shards); under a context mesh the
    constraint keeps it so."""
    return shard_rows(jnp.swapaxes(x.reshape(x.shape[0] // m, m, *x.shape[1:]), 0, 1), axis=1)


def micro_joined(x: jax.Array) -> jax.Array:
    """The inverse of :func:`micro_slices`: [m, N/m, ...] -> [N, ...] in the groups' order."""
    m, per = x.shape[:2]
    return shard_rows(jnp.swapaxes(x, 0, 1).reshape(m * per, *x.shape[2:]))


@functools.partial(jax.jit, static_argnames=("cfg", "scoring", "slices"))
def batch_logprobs(cfg: ModelConfig, params: Params, batch: Batch, scoring: Scoring,
                   slices: int = 1) -> jax.Array:
    """The reference / old-policy pass: ``group_logprobs`` of the whole rollout batch [N,G,R]
    in `slices` strided parts one after another (``lax.map``; each the size of an update's
    micro-batch when `slices` = mini-batches x micro-batches), the result left on device
    for the update. Without a host round trip its peak is one part's activations."""
    keys = ("prefix", "prefix_mask", "tokens", "attn_mask")
    if slices == 1:
        return group_logprobs(cfg, params, *(batch[k] for k in keys), scoring=scoring)
    parts = tuple(micro_slices(batch[k], slices) for k in keys)
    out = jax.lax.map(lambda p: group_logprobs(cfg, params, *p, scoring=scoring), parts)
    return micro_joined(out)


SUMMED = ("loss", "pg_loss")  # metrics that are micro-batch shares of the mini-batch's value


def make_train_step(cfg: ModelConfig, lc: LossConfig, optimizer: optax.GradientTransformation,
                    lr_fn: Callable[[Any], Any] | None = None, donate: bool = True,
                    lora: LoraConfig | None = None,
                    ) -> Callable[..., tuple[TrainState, dict]]:
    """Build the jitted ``train_step(state, batch) -> (state, metrics)``.

    With ``lora`` (``models.lora``) the state's params are the adapters alone and the step
    is ``train_step(state, batch, base)``: the frozen base weights are an argument (not a
    compiled-in constant, not donated), the loss runs on ``adapted(base, adapters)`` with the
    base behind stop_gradient, so gradients and the optimizer state cover the adapters only.
    """

    def loss_of(base: Params | None) -> Callable[..., Any]:
        def loss(p: Params, b: Batch, c: jax.Array | None = None):
            weights = p if lora is None or base is None else adapted(base, p, lora)
            return policy_loss(cfg, lc, weights, b, c)
        return jax.value_and_grad(loss, has_aux=True)

    def train_step(state: TrainState, batch: Batch,
                   base: Params | None = None) -> tuple[TrainState, dict]:
        grad_fn = loss_of(base)
        m = lc.micro_batches
        if m == 1:
            (_, metrics), grads = grad_fn(state.params, batch)
        else:
            # Each micro-batch divides by the whole mini-batch's count of tokens (or
            # sequences), so losses and gradients add up to exactly the mini-batch's; token
            # means among the metrics are weighted by each micro-batch's share of the tokens.
            micro = jax.tree.map(lambda x: micro_slices(x, m), batch)
            loss_mask = batch["loss_mask"].reshape(-1, batch["loss_mask"].shape[-1])
            count = agg_count(loss_mask, lc.loss_agg)
            tokens = jnp.maximum(jnp.sum(loss_mask), 1.0)

            def acc(carry, mb):
                (_, met), g = grad_fn(state.params, mb, count)
                share = jnp.sum(mb["loss_mask"]) / tokens
                met = {k: v if k in SUMMED else v * share for k, v in met.items()}
                return jax.tree.map(jnp.add, carry, (g, met)), None

            zeros = jax.tree.map(jnp.zeros_like, (state.params, jax.eval_shape(
                lambda: grad_fn(state.params, jax.tree.map(lambda x: x[0], micro))[0][1])))
            (grads, metrics), _ = jax.lax.scan(acc, zeros, micro)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = dict(metrics, grad_norm=optax.tree.norm(grads))
        if lr_fn is not None:
            metrics["lr"] = jnp.asarray(lr_fn(state.step), jnp.float32)
        return TrainState(state.step + 1, params, opt_state), metrics

    return jax.jit(train_step, donate_argnums=(0,) if donate else ())
