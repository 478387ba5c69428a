"""A training step's reward stage as one jitted device program: DAPO's overlong shaping, the
advantages and the group statistics, from the rewarder's rewards and what the host knows of
each trajectory.

    (rewards, outcome, lengths, token_counts, judge_failed)   [N, G] each, from the host
        --overlong_shaped--> shaped rewards                   (rl.grpo.dapo.overlong_penalty)
        --algo_advantages--> advantages                       (rl.grpo.advantages: GRPO, Dr.GRPO,
                                                               RLOO vmapped over groups;
                                                               REINFORCE++ / GDPO batch-wide)
        --stage_stats------> reward/*, outcome/mean, groups/* (rl.grpo.group_stats, vmapped)

Everything the program branches on (estimator, eps, std_ddof, whitening, components and their
weights, the overlong settings) is a field of the frozen :class:`RewardStageConfig`, static
under ``jax.jit``: :func:`compiled_reward_stage` builds one program per config, which XLA
compiles once per array shape. The host half of the step (texts, judge and retriever calls,
the rubric memory) computes the inputs; :func:`run_reward_stage` dispatches the program once
and brings its outputs back with one ``jax.device_get``. The stage takes its settings as a
value: the run's config builds one (``rl.run.config.reward_stage_config``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rl.grpo.advantages import algo_advantages
from rl.grpo.dapo import overlong_penalty
from rl.grpo.group_stats import group_fractions


@dataclasses.dataclass(frozen=True)
class OverlongShaping:
    """DAPO's soft overlong punishment: L_max, the buffer B before it, the full penalty."""

    max_len: int
    buffer_len: int
    penalty: float


@dataclasses.dataclass(frozen=True)
class RewardStageConfig:
    """The reward stage's static settings (``algo.*``; the field names are ``AlgoConfig``'s,
    so it is the ``algo`` :func:`rl.grpo.advantages.algo_advantages` reads). ``overlong`` is None
    when algo.overlong.enabled is false."""

    advantage: str
    eps: float
    std_ddof: int
    whiten: str
    reward_components: str
    component_weights: tuple[float, ...]
    overlong: OverlongShaping | None


class RewardStageOutput(NamedTuple):
    """The program's outputs: shaped rewards [N, G], advantages [N, G] and the step record's
    reward statistics (scalars; a pytree, so one ``jax.device_get`` fetches it whole)."""

    rewards: Any
    advantages: Any
    stats: dict[str, Any]


def overlong_shaped(overlong: OverlongShaping | None, rewards: jax.Array, lengths: jax.Array,
                    judge_failed: jax.Array) -> jax.Array:
    """``R + overlong_penalty(L)`` (``rl.grpo.dapo``) with ``L`` the whole response's tokens (a
    multi-turn one with its observations), except on rows a judge failed closed
    (``judge_failed``): they stay unshaped, so their group keeps zero variance. ``overlong``
    None: the rewards unchanged."""
    rewards = jnp.asarray(rewards, jnp.float32)
    if overlong is None:
        return rewards
    pen = overlong_penalty(lengths, overlong.max_len, overlong.buffer_len, overlong.penalty)
    return rewards + jnp.where(jnp.asarray(judge_failed, bool), 0.0, pen).astype(rewards.dtype)


def stage_stats(rewards: jax.Array, outcome: jax.Array,
                shaped: jax.Array) -> dict[str, jax.Array]:
    """``reward/mean``, ``reward/std`` (population) of the shaped rewards, ``outcome/mean``,
    and the ``groups/*`` fractions of the outcome and of the total reward before length
    shaping (the rubric term alone decides which groups it converted;
    ``rl.grpo.group_stats.group_fractions``)."""
    return {"reward/mean": shaped.mean(), "reward/std": shaped.std(),
            "outcome/mean": outcome.mean(), **group_fractions(outcome, rewards)}


def reward_stage(cfg: RewardStageConfig, rewards: jax.Array, outcome: jax.Array,
                 lengths: jax.Array, token_counts: jax.Array,
                 judge_failed: jax.Array) -> RewardStageOutput:
    """The whole stage, traceable: shaping (:func:`overlong_shaped`), the advantages of the
    shaped rewards (``rl.grpo.advantages.algo_advantages``; gdpo's outcome component is
    `outcome`, the rest ``shaped - outcome``) and :func:`stage_stats`. Inputs [N, G]:
    rewards and outcome from the rewarder, ``lengths`` the response tokens overlong shaping
    reads, ``token_counts`` the action tokens REINFORCE++'s token whitening weights by,
    ``judge_failed`` the rows to leave unshaped."""
    rewards = jnp.asarray(rewards, jnp.float32)
    outcome = jnp.asarray(outcome, jnp.float32)
    shaped = overlong_shaped(cfg.overlong, rewards, lengths, judge_failed)
    adv = algo_advantages(cfg, shaped, outcome, token_counts, cfg.eps)
    return RewardStageOutput(shaped, adv, stage_stats(rewards, outcome, shaped))


@functools.cache
def compiled_reward_stage(cfg: RewardStageConfig) -> Callable[..., RewardStageOutput]:
    """:func:`reward_stage` under ``jax.jit``, closed over `cfg` (static): one program per
    config (cached, so every step of a run reuses it), compiled once per array shape."""
    return jax.jit(functools.partial(reward_stage, cfg))


def run_reward_stage(cfg: RewardStageConfig, rewards: np.ndarray, outcome: np.ndarray,
                     lengths: np.ndarray, token_counts: np.ndarray,
                     judge_failed: np.ndarray) -> RewardStageOutput:
    """The compiled stage on host arrays [N, G] (checked for one shape; integer and bool
    inputs cast to fixed dtypes so a step's shape alone picks the compiled program), its
    outputs back on the host as NumPy arrays and floats by one ``jax.device_get``."""
    inputs = {"rewards": np.asarray(rewards, np.float32),
              "outcome": np.asarray(outcome, np.float32),
              "lengths": np.asarray(lengths, np.int32),
              "token_counts": np.asarray(token_counts, np.int32),
              "judge_failed": np.asarray(judge_failed, bool)}
    shape = inputs["rewards"].shape
    for name, value in inputs.items():
        if value.shape != shape or value.ndim != 2:
            raise ValueError(f"reward stage: {name} has shape {value.shape}, rewards "
                             f"{shape}; every input is [groups, group_size]")
    out = jax.device_get(compiled_reward_stage(cfg)(**inputs))
    return RewardStageOutput(out.rewards, out.advantages,
                             {k: float(v) for k, v in out.stats.items()})
