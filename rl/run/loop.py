"""One training step as pure phases over one loop state.

    LoopState --collect--> (LoopState', Collected)     rollout + rewards (DAPO draws included)
              --update---> (LoopState'', metrics)       old/reference log-probs + optimizer
    step = collect, shape rewards, advantages, batch, update; the host loop folds `step`.

With trainer.off_policy_steps=1 the rollout samples from ``LoopState.behaviour`` (the weights
before the previous step's update) instead of the current ones, and its own log-probs are the
update's old log-probs (``rl.grpo.off_policy``); the host loop may then run the next step's collect
while this step updates, with the same result.

``LoopState`` is everything that changes from step to step (train state, rewarder state, data
position, step); a checkpoint is that value plus its fingerprint. ``Components`` is everything
that stays fixed over a run (config, model, task, environment, rewarder, compiled update). The
phases take both and return a new loop state; they write nothing: the host loop
(``rl.run.trainer``) logs what :func:`step` returns and saves checkpoints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from core.types import Environment, Group, Prompt, Rewarder, RewardOutput, Task
from judges.base import Judge
from judges.cost import prices, step_usage
from models.config import ModelConfig
from models.sharding import batch_sharding, batch_shards
from models.tokenizer import Tokenizer
from rl.grpo.advantages import batch_advantages
from rl.grpo.batch import build_batch
from rl.grpo.consistency import prof_keep, prof_metrics
from rl.grpo.dapo import dynamic_sample
from rl.grpo.off_policy import Behaviour, mismatch_stats, snapshot, staleness
from rl.grpo.reward_stage import (
    RewardStageOutput,
    overlong_shaped,
    run_reward_stage,
)
from rl.grpo.train_step import LossConfig, TrainState, batch_logprobs, in_compute_dtype
from rl.run.config import RunConfig, overlong_shaping, reward_stage_config
from rl.run.data import PromptStream
from rl.run.lora import LoraRun
from rl.run.multihost import Exchange
from rl.tasks.envs import SamplerPolicy


@dataclasses.dataclass(frozen=True)
class LoopState:
    """What a step changes. ``step`` is the index of the next step to run; ``behaviour``
    the weights its rollout samples from under trainer.off_policy_steps=1 (None: the current
    ones, on-policy)."""

    train: TrainState
    reward: Any  # the rewarder's host-side state (the rubric memory for ARBOR)
    data_position: int
    step: int
    behaviour: Behaviour | None = None


@dataclasses.dataclass(frozen=True)
class Components:
    """What stays fixed over a run, built once by ``rl.run.trainer.build_trainer``."""

    run: RunConfig
    model_cfg: ModelConfig
    tokenizer: Tokenizer
    task: Task
    env: Environment
    rewarder: Rewarder
    stream: PromptStream
    train_step: Callable[[TrainState, dict], tuple[TrainState, dict]]
    ref_params: Any  # the KL reference in the compute dtype (None when beta = 0)
    loss_cfg: LossConfig
    mesh: Mesh | None
    judge: Judge | None
    response_budget: int  # most tokens a trajectory holds after its prompt
    # (split, its prompts) of trainer.eval_split, read before the model loaded
    eval_prompts: tuple[tuple[str, tuple[Prompt, ...]], ...] = ()
    lora: LoraRun | None = None  # when model.lora.rank > 0: the train params are adapters
    exchange: Exchange | None = None  # in a multi-process job (None: one process)
    rollout_mesh: Mesh | None = None  # mesh.rollout_shape over the same devices (None: `mesh`)

    def policy(self, params: Any, evaluation: bool = False) -> SamplerPolicy:
        """The sampler on the train state's `params` (with LoRA: adapters merged into the
        base); training rollouts in trainer.rollout_dtype with a trainer.kv_cache_dtype KV
        cache, evaluation the same unless trainer.eval_dtype names its own dtype for both
        (float32: numbers comparable across runs that roll out in bfloat16)."""
        t = self.run.trainer
        dtype, cache = t.rollout_dtype, t.kv_cache_dtype
        if evaluation and t.eval_dtype is not None:
            dtype = cache = t.eval_dtype
        if self.lora is not None:
            params = self.lora.sampling(params)
        # on the rollout mesh the weights are resharded once here, freed with the policy
        mesh = self.mesh if self.rollout_mesh is None else self.rollout_mesh
        return SamplerPolicy(self.model_cfg, params, self.tokenizer, dtype=dtype, mesh=mesh,
                             kv_cache_dtype=cache, prefill_pin_rows=t.prefill_pin_rows,
                             sub_batches=t.rollout_sub_batches, decode_kernel=t.decode_kernel,
                             shared_prompts=t.shared_prompts)

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
    # the judge's and the retriever's cumulative counters once this rollout was scored (read
    # by the thread that ran it: the step record never reads a service another thread uses)
    services: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What the host loop writes for a step: its metrics record, the rewarder's events and
    sample trajectories (empty on steps that log none)."""

    record: dict[str, Any]
    events: tuple[Mapping[str, Any], ...]
    samples: list[dict[str, Any]]
    alerts: tuple[Mapping[str, Any], ...] = ()  # the rewarder's monitors past their thresholds


def consistency_filtered(c: Components, col: Collected) -> tuple[Collected, dict[str, float]]:
    """The step's trajectories the update trains on: all of them, or under
    ``algo.consistency_filter=prof`` the G - r per group PROF keeps (``rl.grpo.consistency``), with
    their outcomes and per-trajectory records, paid their outcome ``R_base`` alone (PROF: the
    process score selects, it is not added) or with ``algo.consistency_reward=total`` the
    rewarder's reward; and the filter's ``prof/*`` metrics."""
    a = c.run.algo
    if a.consistency_filter == "none":
        return col, {}
    out = col.out
    process = out.rubric_term()
    if process is None:
        raise RuntimeError("algo.consistency_filter=prof: the rewarder reported no rubric term "
                           "(per_traj rubric_score) to filter by")
    correct = np.asarray(out.outcome, np.float64) >= a.correct_at
    keep = prof_keep(process, correct, a.consistency_remove)
    rows = [np.flatnonzero(k) for k in keep]
    groups = [dataclasses.replace(g, trajectories=tuple(g.trajectories[i] for i in r))
              for g, r in zip(col.groups, rows)]
    per_traj = tuple(tuple(p[i] for i in r) for p, r in zip(out.per_traj, rows))
    outcome = np.stack([out.outcome[n, r] for n, r in enumerate(rows)])
    paid = out.rewards if a.consistency_reward == "total" else out.outcome
    kept = dataclasses.replace(
        out, rewards=np.stack([np.asarray(paid)[n, r] for n, r in enumerate(rows)]),
        outcome=outcome, per_traj=per_traj)
    info = prof_metrics(keep, correct) | {"prof/reward_mean_before": float(np.mean(out.rewards))}
    return dataclasses.replace(col, groups=groups, out=kept), info


def step_seed(seed: int, step: int, draw: int = 0, chunk: int = 0) -> int:
    """The rollout seed of a step's draw (and of its chunk, trainer.rollout_chunks): a pure
    function of (trainer.seed, step, draw, chunk); chunk 0's is the unchunked draw's."""
    entropy = [seed, step, draw] + ([chunk] if chunk else [])
    return int(np.random.default_rng(entropy).integers(0, 2**31 - 1))


def rollout_in_chunks(rollout: Callable[[Sequence[Prompt], int], list[Group]],
                      prompts: Sequence[Prompt], chunks: int,
                      seed_of: Callable[[int], int]) -> list[Group]:
    """The groups of `prompts` sampled in `chunks` consecutive equal parts, part k by one
    ``rollout(part, seed_of(k))`` call: the sampler holds a KV cache for one part's rows at a
    time (trainer.rollout_chunks), at the cost of decoding the parts one after another."""
    if len(prompts) % chunks:
        raise ValueError(f"trainer.rollout_chunks: {len(prompts)} prompts do not split into "
                         f"{chunks} equal parts")
    n = len(prompts) // chunks
    return [g for k in range(chunks) for g in rollout(prompts[k * n:(k + 1) * n], seed_of(k))]


# ------------------------------------------------------------------------------ phases


def rollout_params(loop: LoopState) -> Any:
    """The weights a step's rollout samples from: the behaviour snapshot off-policy, else the
    current ones."""
    return loop.train.params if loop.behaviour is None else loop.behaviour.params


def service_counters(c: Components) -> dict[str, Any]:
    """The judge's (calls, retries, fallbacks, cache hits) and the retriever's (calls,
    failures, degraded searches, breaker) cumulative counters, as ``judge/*``, ``retrieval/*``."""
    out: dict[str, Any] = {}
    if c.judge is not None:
        out |= {f"judge/{k}": v for k, v in c.judge.stats().items()}
    retrieval = getattr(c.env, "retrieval_stats", None)
    if callable(retrieval):
        out |= {f"retrieval/{k}": v for k, v in retrieval().items()}
    return out


def collect(c: Components, loop: LoopState) -> tuple[LoopState, Collected]:
    """Rollout + rewards. With DAPO dynamic sampling, keep drawing until the batch is full of
    informative groups or algo.max_gen_batches is spent (``rl.grpo.dapo.dynamic_sample``); every
    draw advances the data position and the rewarder's state."""
    a, t = c.run.algo, c.run.trainer
    spent = {"time/rollout_s": 0.0, "time/reward_s": 0.0, "rollout/generated_tokens": 0}
    before = {} if c.judge is None else {f"judge/{k}": v for k, v in c.judge.stats().items()}

    def draw(i: int, state: Any) -> tuple[list[Group], RewardOutput]:
        prompts = c.stream.batch(loop.data_position + i)
        t0 = time.perf_counter()
        policy = c.policy(rollout_params(loop))
        groups = rollout_in_chunks(
            lambda part, seed: c.env.rollout(policy, part, a.group_size, seed), prompts,
            t.rollout_chunks, lambda k: step_seed(t.seed, loop.step, i, k))
        t1 = time.perf_counter()
        out = c.rewarder(groups, state, loop.step)
        spent["time/rollout_s"] += t1 - t0
        spent["time/reward_s"] += time.perf_counter() - t1
        spent["rollout/generated_tokens"] += sum(
            tr.num_action_tokens for g in groups for tr in g.trajectories)
        return groups, out

    drawn = dynamic_sample(draw, loop.reward, t.batch_prompts, a.max_gen_batches,
                           filter_groups=a.dynamic_sampling, filter_metric=a.filter_metric)
    info = spent | {f"dapo/{k}": v for k, v in drawn.info.items()}
    loop = dataclasses.replace(loop, reward=drawn.out.state,
                               data_position=loop.data_position + drawn.draws)
    after = service_counters(c)
    info |= step_usage(before, after, *prices(c.run.judge))  # judge_step/*: this step's share
    return loop, Collected(drawn.groups, drawn.out, info, after)


def next_rollout_state(loop: LoopState) -> LoopState | None:
    """Off-policy: the loop state the next step's collect reads, known once this step's rollout
    is in (`loop` is the state after it): the next step, the rewarder state and data position
    this rollout left, and a snapshot of the weights before this step's update. Its ``train``
    is this step's, whose buffers the update donates: collect does not read it off-policy.
    None on-policy (the next rollout needs this step's update)."""
    if loop.behaviour is None:
        return None
    return dataclasses.replace(loop, step=loop.step + 1,
                               behaviour=snapshot(loop.train.params, loop.step))


def shaped_rewards(c: Components, groups: Sequence[Group], rewards: np.ndarray,
                   per_traj: Sequence[Sequence[Mapping[str, Any]]] = ()) -> np.ndarray:
    """DAPO's overlong shaping alone, on the host (``rl.grpo.reward_stage.overlong_shaped``, the
    rule the step's jitted reward stage runs): the whole response (a multi-turn one with its
    observations) against L_max (algo.overlong.max_len, null = the response budget) when
    algo.overlong.enabled; rows whose prompt group failed closed (``per_traj``
    ``judge_failed``) stay unshaped, so the group keeps zero variance."""
    shaping = overlong_shaping(c.run, c.response_budget)
    if shaping is None:
        return rewards
    lengths = response_lengths(groups)
    failed = judge_failed_rows(per_traj, lengths.shape)
    return np.asarray(overlong_shaped(shaping, jnp.asarray(rewards), jnp.asarray(lengths),
                                      jnp.asarray(failed)))


def response_lengths(groups: Sequence[Group]) -> np.ndarray:
    """[N, G] tokens of each whole response (observations included): overlong shaping's L."""
    return np.asarray([[len(tr.tokens) for tr in g.trajectories] for g in groups])


def action_token_counts(groups: Sequence[Group]) -> np.ndarray:
    """[N, G] tokens each trajectory sampled (REINFORCE++'s token whitening weights)."""
    return np.asarray([[tr.num_action_tokens for tr in g.trajectories] for g in groups])


def reward_stage(c: Components, col: Collected) -> RewardStageOutput:
    """Shaped rewards, advantages and reward statistics of a step's rollouts: the host
    gathers the inputs (lengths, action tokens, judge-failed rows), ``rl.grpo.reward_stage`` runs
    them as one jitted program and fetches its outputs with one ``jax.device_get``."""
    rewards = col.out.rewards
    return run_reward_stage(reward_stage_config(c.run, c.response_budget), rewards,
                            col.out.outcome, response_lengths(col.groups),
                            action_token_counts(col.groups),
                            judge_failed_rows(col.out.per_traj, rewards.shape))


def judge_failed_rows(per_traj: Sequence[Sequence[Mapping[str, Any]]],
                      shape: tuple[int, ...]) -> np.ndarray:
    """[N, G] bool: True where a rewarder marked the row ``judge_failed`` (all False when the
    rewarder keeps no per-row records)."""
    failed = np.zeros(shape, bool)
    for g, row in enumerate(per_traj[:shape[0]]):
        for k, rec in enumerate(row[:shape[1]]):
            failed[g, k] = bool(rec.get("judge_failed"))
    return failed


def training_batch(c: Components, groups: Sequence[Group], rewards: np.ndarray,
                   outcome: np.ndarray | None = None) -> dict:
    """Advantages from (already shaped) rewards (``rl.grpo.advantages.batch_advantages``, the rule
    the step's reward stage jits; `outcome`, default `rewards`, is their verifiable part),
    laid out by :func:`batch_layout`."""
    adv = batch_advantages(c.run.algo, rewards, rewards if outcome is None else outcome,
                           action_token_counts(groups))
    return batch_layout(c, groups, adv)


def batch_layout(c: Components, groups: Sequence[Group], advantages: np.ndarray) -> dict:
    """The update's batch from the trajectories and their advantages [N, G] on the host, laid
    out as ``rl.grpo.batch`` describes."""
    return build_batch(groups, advantages, c.tokenizer.pad_id, c.response_budget,
                       c.update_slices(), with_logprobs=c.run.trainer.off_policy_steps > 0)


def logprobs_with(c: Components, params: Any, batch: dict) -> jax.Array:
    """Per-token log-probs of the batch's trajectories under `params` (compute dtype), at the
    sampling temperature (the sampled policy's, as verl and TRL score them): one jitted pass
    (``rl.grpo.train_step.batch_logprobs``) in parts of an update's micro-batch, its batch split
    over the mesh's data axes, its output kept on device."""
    t = c.run.trainer
    keys = ("prefix", "prefix_mask", "tokens", "attn_mask")
    rows = {k: batch[k] for k in keys}
    if c.mesh is not None:
        rows = jax.device_put(rows, batch_sharding(c.mesh, 1, None))
    params = in_compute_dtype(params, c.loss_cfg.compute_dtype)
    return batch_logprobs(c.model_cfg, params, rows, c.loss_cfg.scoring(),
                          slices=t.mini_batches * t.micro_batches)


def with_old_and_reference(c: Components, loop: LoopState, batch: dict) -> dict:
    """The batch with the KL reference's log-probs (beta > 0) and the sampling policy's:
    off-policy the sampler's own (``logp_sampler``, the behaviour policy); on-policy with
    several updates per batch the current weights' (with one, logp_old = stop_gradient(logp)
    in the update)."""
    batch = dict(batch)
    if c.loss_cfg.beta > 0:
        batch["logp_ref"] = logprobs_with(c, c.ref_params, batch)
    if "logp_sampler" in batch:
        batch["logp_old"] = batch.pop("logp_sampler")
    elif not c.loss_cfg.on_policy:
        batch["logp_old"] = logprobs_with(c, c.scoring_params(loop.train.params), batch)
    return batch


def off_policy_record(c: Components, loop: LoopState, batch: dict | None) -> dict[str, Any]:
    """offpolicy/staleness, and with a batch to train on the sampler/trainer mismatch of its
    tokens under the current weights (``rl.grpo.off_policy.mismatch_stats``; one forward pass)."""
    record: dict[str, Any] = {} if loop.behaviour is None else {
        "offpolicy/staleness": staleness(loop.step, loop.behaviour)}
    if batch is not None:
        current = logprobs_with(c, c.scoring_params(loop.train.params), batch)
        record |= mismatch_stats(batch["logp_old"], current, batch["loss_mask"])
    return record


def update(c: Components, loop: LoopState, batch: dict) -> tuple[LoopState, list[dict]]:
    """trainer.ppo_epochs passes over trainer.mini_batches slices, one optimizer update each;
    a slice holding only filler groups (``rl.grpo.batch``) takes no step."""
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


def mesh_context(mesh: Any) -> contextlib.AbstractContextManager:
    """``jax.set_mesh(mesh)`` (the models' activation constraints, ``models.constraints``,
    follow it; thread-local, so an off-policy rollout thread runs without it, its sampler
    shards rows itself), or nothing without a mesh."""
    return contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh)


Collect = Callable[[], tuple[LoopState, Collected]]


def step(c: Components, loop: LoopState, collected: Collect | None = None,
         prefetch: Callable[[LoopState], None] | None = None) -> tuple[LoopState, StepResult]:
    """One whole step under the run's mesh (:func:`mesh_context`): collect, shape, batch,
    old/reference log-probs, update.

    Off-policy only: `collected` hands over this step's collect already started elsewhere
    (it returns what ``collect(c, loop)`` returns), and `prefetch` receives the next step's
    collect input (:func:`next_rollout_state`) before the update, to start it meanwhile."""
    with mesh_context(c.mesh):
        return _step(c, loop, collected, prefetch)


def _step(c: Components, loop: LoopState, collected: Collect | None,
          prefetch: Callable[[LoopState], None] | None) -> tuple[LoopState, StepResult]:
    t_start = time.perf_counter()
    if collected is None:
        loop, col = collect(c, loop)
    else:  # collected from next_rollout_state: everything but the train state, which is ours
        train = loop.train
        loop, col = collected()
        loop = dataclasses.replace(loop, train=train)
    t_collected = time.perf_counter()
    upcoming = next_rollout_state(loop)
    if prefetch is not None and upcoming is not None:
        prefetch(upcoming)
    monitored, alerts = monitor_record(c, col)  # they see every trajectory, filtered or not
    trained_on, consistency = consistency_filtered(c, col)
    stage = reward_stage(c, trained_on)  # one jitted program: shaping, advantages, group stats
    batch = batch_layout(c, trained_on.groups, stage.advantages)
    t0 = time.perf_counter()
    train_metrics: list[dict] = []
    trained = None if skips_update(c, batch) else with_old_and_reference(c, loop, batch)
    off = off_policy_record(c, loop, trained) if upcoming is not None else {}
    # JAX returns before the device finishes: without the wait the reference pass's time
    # is counted in the update's
    jax.block_until_ready(trained)
    t1 = time.perf_counter()
    if trained is not None:
        loop, train_metrics = update(c, loop, trained)
    t2 = time.perf_counter()
    times = {"time/reference_s": t1 - t0, "time/train_s": t2 - t1, "time/step_s": t2 - t_start}
    if upcoming is not None:
        off["time/rollout_wait_s"] = t_collected - t_start
    record = (step_record(c, col, stage.stats, train_metrics, times) | off | monitored
              | consistency)
    every = c.run.trainer.sample_every
    samples = (sample_records(trained_on, stage.rewards, n=4)
               if every and loop.step % every == 0 else [])
    loop = dataclasses.replace(loop, step=loop.step + 1,
                               behaviour=upcoming.behaviour if upcoming is not None else None)
    return loop, StepResult(record, col.out.events, samples, alerts)


# ------------------------------------------------------------------------------ records


def step_record(c: Components, col: Collected, stats: Mapping[str, float],
                train_metrics: Sequence[Mapping[str, Any]],
                times: Mapping[str, float]) -> dict[str, Any]:
    """The metrics of a step (metrics.jsonl / TensorBoard); `stats` the reward stage's
    (``rl.grpo.reward_stage.stage_stats``: reward/*, outcome/mean, groups/*)."""
    groups, out, info = col.groups, col.out, dict(col.info)
    lengths = np.asarray([tr.num_action_tokens for g in groups for tr in g.trajectories])
    # a skipped update (skips_update) has no loss metrics; update/skipped says so
    avg = {k: float(np.mean([m[k] for m in train_metrics])) for k in
           (train_metrics[0] if train_metrics else ())}
    tokens = sum(len(tr.prompt_tokens) + len(tr.tokens) for g in groups for tr in g.trajectories)
    record = {
        **stats,
        **avg, "update/skipped": int(not train_metrics),
        "response/length_mean": float(lengths.mean()),
        "response/length_max": int(lengths.max()),
        "prompt/length_max": max(len(tr.prompt_tokens) for g in groups for tr in g.trajectories),
        "time/rollout_s": info.pop("time/rollout_s"), "time/judge_s": info.pop("time/reward_s"),
        **times, "tokens_per_s": tokens / times["time/step_s"],
        **info, **dict(out.metrics),
    }
    record |= col.services  # cumulative judge/* and retrieval/* counters (service_counters)
    record["rollout/tokens_per_s"] = record["rollout/generated_tokens"] / max(
        record["time/rollout_s"], 1e-9)
    return record


def monitor_record(c: Components, col: Collected
                   ) -> tuple[dict[str, float], tuple[Mapping[str, Any], ...]]:
    """What the task and the rewarder add to a step's record, and the rewarder's alerts: a
    task's ``step_metrics(groups)`` (a search task's ``agent/*``) and a rewarder's
    ``monitors(groups, output)`` (ARBOR's and RaR's ``gaming/*`` monitors), each when it has
    one. The loop knows neither: it asks for what they offer."""
    record: dict[str, float] = {}
    task_metrics = getattr(c.task, "step_metrics", None)
    if task_metrics is not None:
        record |= task_metrics(col.groups)
    monitors = getattr(c.rewarder, "monitors", None)
    if monitors is None:
        return record, ()
    metrics, alerts = monitors(col.groups, col.out)
    return record | dict(metrics), tuple(alerts)


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
