"""One training step as pure phases over one loop state.

    LoopState --collect--> (LoopState', Collected)     rollout + rewards (DAPO draws included)
              --update---> (LoopState'', metrics)       old/reference log-probs + optimizer
    step = collect, shape rewards, advantages, batch, update; the host loop folds `step`.

``LoopState`` is everything that changes from step to step (train state, rewarder state, data
position, step); a checkpoint is that value plus its fingerprint. ``Components`` is everything
that stays fixed over a run (config, model, task, environment, rewarder, compiled update). The
phases take both and return a new loop state; they write nothing: the host loop
(``rl.trainer``) logs what :func:`step` returns and saves checkpoints.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from core.types import Environment, Group, Prompt, Rewarder, RewardOutput, Task
from models.sampler import Scoring, group_logprobs
from models.sharding import batch_sharding, batch_shards
from rl.advantages import group_advantages
from rl.batch import build_batch
from rl.config import RunConfig, overlong_buffer
from rl.dapo import dynamic_sample, overlong_penalty
from rl.data import PromptStream
from rl.envs import SamplerPolicy
from rl.group_stats import all_wrong_frac, converted_frac, homogeneous_frac
from rl.train_step import LossConfig, TrainState, in_compute_dtype


@dataclasses.dataclass(frozen=True)
class LoopState:
    """What a step changes. ``step`` is the index of the next step to run."""

    train: TrainState
    reward: Any  # the rewarder's host-side state (the rubric memory for ARBOR)
    data_position: int
    step: int


@dataclasses.dataclass(frozen=True)
class Components:
    """What stays fixed over a run, built once by ``rl.trainer.build_trainer``."""

    run: RunConfig
    model_cfg: Any
    tokenizer: Any
    task: Task
    env: Environment
    rewarder: Rewarder
    stream: PromptStream
    train_step: Callable[[TrainState, dict], tuple[TrainState, dict]]
    ref_params: Any  # the KL reference in the compute dtype (None when beta = 0)
    loss_cfg: LossConfig
    mesh: Any
    judge: Any
    response_budget: int  # most tokens a trajectory holds after its prompt
    eval_prompts: tuple[Prompt, ...] = ()  # trainer.eval_split, read before the model loaded
    lora: Any = None  # rl.lora.LoraRun when model.lora.rank > 0: train params are adapters

    def policy(self, params: Any, evaluation: bool = False) -> SamplerPolicy:
        """The sampler on the train state's `params` (with LoRA: adapters merged into the
        base); training rollouts in trainer.rollout_dtype, evaluation always in float32
        (numbers comparable across runs)."""
        dtype = "float32" if evaluation else self.run.trainer.rollout_dtype
        if self.lora is not None:
            params = self.lora.sampling(params)
        return SamplerPolicy(self.model_cfg, params, self.tokenizer, dtype=dtype)

    def scoring_params(self, params: Any) -> Any:
        """The model parameters the update's forward runs for the train state's `params`."""
        return params if self.lora is None else self.lora.scoring(params)

    def update_slices(self) -> int:
        """How many equal parts an update cuts the batch into along its group axis: mini-
        batches x micro-batches x the mesh's data-parallel shards."""
        t = self.run.trainer
        shards = 1 if self.mesh is None else batch_shards(self.mesh)
        return t.mini_batches * t.micro_batches * shards


@dataclasses.dataclass(frozen=True)
class Collected:
    """A step's rollouts and rewards, with what collecting them cost and saw."""

    groups: list[Group]
    out: RewardOutput
    info: Mapping[str, float]


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What the host loop writes for a step: its metrics record, the rewarder's events and
    sample trajectories (empty on steps that log none)."""

    record: dict[str, Any]
    events: tuple[Mapping[str, Any], ...]
    samples: list[dict[str, Any]]


def step_seed(seed: int, step: int, draw: int = 0) -> int:
    """The rollout seed of a step's draw: a pure function of (trainer.seed, step, draw)."""
    return int(np.random.default_rng([seed, step, draw]).integers(0, 2**31 - 1))


# ------------------------------------------------------------------------------ phases


def collect(c: Components, loop: LoopState) -> tuple[LoopState, Collected]:
    """Rollout + rewards. With DAPO dynamic sampling, keep drawing until the batch is full of
    informative groups or algo.max_gen_batches is spent (``rl.dapo.dynamic_sample``); every
    draw advances the data position and the rewarder's state."""
    a, t = c.run.algo, c.run.trainer
    spent = {"time/rollout_s": 0.0, "time/reward_s": 0.0, "rollout/generated_tokens": 0}

    def draw(i: int, state: Any) -> tuple[list[Group], RewardOutput]:
        prompts = c.stream.batch(loop.data_position + i)
        t0 = time.perf_counter()
        groups = c.env.rollout(c.policy(loop.train.params), prompts, a.group_size,
                               step_seed(t.seed, loop.step, i))
        t1 = time.perf_counter()
        out = c.rewarder(groups, state, loop.step)
        spent["time/rollout_s"] += t1 - t0
        spent["time/reward_s"] += time.perf_counter() - t1
        spent["rollout/generated_tokens"] += sum(
            tr.num_action_tokens for g in groups for tr in g.trajectories)
        return groups, out

    drawn = dynamic_sample(draw, loop.reward, t.batch_prompts, a.max_gen_batches,
                           filter_groups=a.dynamic_sampling)
    info = spent | {f"dapo/{k}": v for k, v in drawn.info.items()}
    loop = dataclasses.replace(loop, reward=drawn.out.state,
                               data_position=loop.data_position + drawn.draws)
    return loop, Collected(drawn.groups, drawn.out, info)


def shaped_rewards(c: Components, groups: Sequence[Group], rewards: np.ndarray) -> np.ndarray:
    """DAPO's overlong shaping when algo.overlong.enabled: the whole response (a multi-turn
    one with its observations) against the response budget."""
    ov = c.run.algo.overlong
    if not ov.enabled:
        return rewards
    lengths = np.asarray([[len(tr.tokens) for tr in g.trajectories] for g in groups])
    budget = c.response_budget
    pen = overlong_penalty(jnp.asarray(lengths), budget, overlong_buffer(c.run, budget),
                           ov.penalty)
    return rewards + np.asarray(pen)


def training_batch(c: Components, groups: Sequence[Group], rewards: np.ndarray) -> dict:
    """Advantages from the (shaped) rewards, laid out as ``rl.batch`` describes."""
    algo = c.run.algo
    adv = np.asarray(group_advantages(jnp.asarray(rewards, jnp.float32), algo.advantage,
                                      std_ddof=algo.std_ddof))
    return build_batch(groups, adv, c.tokenizer.pad_id, c.response_budget, c.update_slices())


def logprobs_with(c: Components, params: Any, batch: dict) -> np.ndarray:
    """Per-token log-probs of the batch's trajectories under `params` (compute dtype), at the
    sampling temperature (the sampled policy's, as verl and TRL score them)."""
    keys = ("prefix", "prefix_mask", "tokens", "attn_mask")
    params = in_compute_dtype(params, c.loss_cfg.compute_dtype)
    scoring = Scoring(remat=c.loss_cfg.remat, temperature=c.loss_cfg.temperature)
    return np.asarray(group_logprobs(c.model_cfg, params, *(jnp.asarray(batch[k]) for k in keys),
                                     scoring=scoring))


def with_old_and_reference(c: Components, loop: LoopState, batch: dict) -> dict:
    """The batch with the KL reference's log-probs (beta > 0) and the sampling policy's
    (several updates per batch; with one, logp_old = stop_gradient(logp) in the update)."""
    batch = dict(batch)
    if c.loss_cfg.beta > 0:
        batch["logp_ref"] = logprobs_with(c, c.ref_params, batch)
    if not c.loss_cfg.on_policy:
        batch["logp_old"] = logprobs_with(c, c.scoring_params(loop.train.params), batch)
    return batch


def update(c: Components, loop: LoopState, batch: dict) -> tuple[LoopState, list[dict]]:
    """trainer.ppo_epochs passes over trainer.mini_batches slices, one optimizer update each;
    a slice holding only filler groups (``rl.batch``) takes no step."""
    t = c.run.trainer
    per_slice = batch["tokens"].shape[0] // t.mini_batches  # groups per mini-batch
    sharding = batch_sharding(c.mesh, 1, None) if c.mesh is not None else None
    state, metrics = loop.train, []
    for _ in range(t.ppo_epochs):
        for k in range(t.mini_batches):
            sl = {key: v[k * per_slice:(k + 1) * per_slice] for key, v in batch.items()}
            if not sl["loss_mask"].any() and batch["loss_mask"].any():
                continue
            state, m = c.train_step(state, jax.device_put(sl, sharding))
            metrics.append(m)
    return dataclasses.replace(loop, train=state), jax.device_get(metrics)


def skips_update(c: Components, batch: dict) -> bool:
    """trainer.skip_zero_advantage: a batch in which every advantage is 0 (every group
    outcome-homogeneous) takes no optimizer step. Its policy gradient is exactly 0, so a step
    would only apply Adam's momentum and the normalised float noise of the KL and entropy
    terms at the full learning rate (#22: weights moved 2.8e-5 in 2 such steps at beta > 0)."""
    return c.run.trainer.skip_zero_advantage and not np.any(batch["advantages"])


def step(c: Components, loop: LoopState) -> tuple[LoopState, StepResult]:
    """One whole step: collect, shape, batch, old/reference log-probs, update."""
    t_start = time.perf_counter()
    loop, col = collect(c, loop)
    rewards = shaped_rewards(c, col.groups, col.out.rewards)
    batch = training_batch(c, col.groups, rewards)
    t0 = t1 = time.perf_counter()
    train_metrics: list[dict] = []
    if not skips_update(c, batch):
        batch = with_old_and_reference(c, loop, batch)
        t1 = time.perf_counter()
        loop, train_metrics = update(c, loop, batch)
    t2 = time.perf_counter()
    times = {"time/reference_s": t1 - t0, "time/train_s": t2 - t1, "time/step_s": t2 - t_start}
    record = step_record(c, col, rewards, train_metrics, times)
    every = c.run.trainer.sample_every
    samples = sample_records(col, rewards, n=4) if every and loop.step % every == 0 else []
    return dataclasses.replace(loop, step=loop.step + 1), StepResult(record, col.out.events,
                                                                     samples)


# ------------------------------------------------------------------------------ records


def step_record(c: Components, col: Collected, rewards: np.ndarray,
                train_metrics: Sequence[Mapping[str, Any]],
                times: Mapping[str, float]) -> dict[str, Any]:
    """The metrics of a step (metrics.jsonl / TensorBoard)."""
    groups, out, info = col.groups, col.out, dict(col.info)
    lengths = np.asarray([tr.num_action_tokens for g in groups for tr in g.trajectories])
    # before length shaping: the rubric term alone decides which groups it converted
    out_j, tot_j = jnp.asarray(out.outcome), jnp.asarray(out.rewards)
    # a skipped update (skips_update) has no loss metrics; update/skipped says so
    avg = {k: float(np.mean([m[k] for m in train_metrics])) for k in
           (train_metrics[0] if train_metrics else ())}
    tokens = sum(len(tr.prompt_tokens) + len(tr.tokens) for g in groups for tr in g.trajectories)
    record = {
        "reward/mean": float(rewards.mean()), "reward/std": float(rewards.std()),
        "outcome/mean": float(out.outcome.mean()),
        "groups/homogeneous_frac": float(homogeneous_frac(out_j)),
        "groups/total_homogeneous_frac": float(homogeneous_frac(tot_j)),
        "groups/all_wrong_frac": float(all_wrong_frac(out_j)),
        "groups/converted_frac": float(converted_frac(out_j, tot_j)),
        **avg, "update/skipped": int(not train_metrics),
        "response/length_mean": float(lengths.mean()),
        "response/length_max": int(lengths.max()),
        "time/rollout_s": info.pop("time/rollout_s"), "time/judge_s": info.pop("time/reward_s"),
        **times, "tokens_per_s": tokens / times["time/step_s"],
        **info, **dict(out.metrics),
    }
    if c.judge is not None:  # cumulative counters: calls, retries, fallbacks, cache hits
        record |= {f"judge/{k}": v for k, v in c.judge.stats().items()}
    retrieval = getattr(c.env, "retrieval_stats", None)
    if callable(retrieval):  # cumulative too: calls, failures, degraded searches, breaker
        record |= {f"retrieval/{k}": v for k, v in retrieval().items()}
    record["rollout/tokens_per_s"] = record["rollout/generated_tokens"] / max(
        record["time/rollout_s"], 1e-9)
    return record


def sample_records(col: Collected, rewards: np.ndarray, n: int) -> list[dict]:
    """The first `n` groups' trajectories with their outcome and reward (samples.jsonl)."""
    recs = []
    for gi, g in enumerate(col.groups[:n]):
        for ti, tr in enumerate(g.trajectories):
            recs.append({"prompt_id": g.prompt.id, "question": g.prompt.question,
                         "answer": g.prompt.answer, "response": tr.text, "finish": tr.finish,
                         "outcome": float(col.out.outcome[gi, ti]),
                         "reward": float(rewards[gi, ti])})
    return recs
