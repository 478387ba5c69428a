"""The host loop: prompts -> rollout -> rewards -> advantages -> reference -> updates -> logs.

It knows nothing task-specific: the task supplies prompts, an environment and an outcome
score; the rewarder (outcome, ARBOR, rubric aggregators) turns groups into rewards and carries
its own immutable state (the rubric memory) from step to step.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from core.types import Group, RewardOutput
from models import load_params
from models.sampler import SamplingParams, group_logprobs
from models.sharding import (
    batch_sharding,
    batch_shards,
    initialize_distributed,
    make_mesh,
    param_shardings,
    shard,
)
from rl.advantages import ADVANTAGES, group_advantages
from rl.batch import build_batch
from rl.checkpoint import Checkpointer
from rl.dapo import overlong_penalty
from rl.data import PromptStream
from rl.envs import SamplerPolicy
from rl.eval import greedy_rollouts
from rl.group_stats import all_wrong_frac, converted_frac, homogeneous_frac
from rl.kl import KL_ESTIMATORS
from rl.losses import LOSS_AGG
from rl.optim import OptimConfig, lr_schedule, make_optimizer
from rl.rewarders import make_rewarder
from rl.runlog import RunLog
from rl.tasks import make_task
from rl.train_step import (
    LossConfig,
    TrainState,
    in_compute_dtype,
    init_train_state,
    make_train_step,
)

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """An invalid configuration value; raised before any compute starts."""


def _require(ok: bool, key: str, msg: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {msg}")


ROLLOUT_DTYPES = ("float32", "bfloat16")  # the sampler's weights (decode_params)


def validate(cfg: Mapping[str, Any]) -> None:
    """Check the values the loop relies on, naming the offending key."""
    a, t = cfg["algo"], cfg["trainer"]
    _require(int(a["group_size"]) >= 2, "algo.group_size", f"must be >= 2, got {a['group_size']}")
    for key in ("eps_low", "eps_high", "beta"):
        _require(float(a[key]) >= 0, f"algo.{key}", f"must be >= 0, got {a[key]}")
    _require(a.get("dual_clip") is None or float(a["dual_clip"]) > 1, "algo.dual_clip",
             "must be > 1 or null")
    for key in ("max_steps", "batch_prompts", "ppo_epochs", "mini_batches", "micro_batches",
                "max_new_tokens"):
        _require(int(t[key]) >= 1, f"trainer.{key}", f"must be >= 1, got {t[key]}")
    _require(int(t.get("eval_batch_size", 64)) >= 1, "trainer.eval_batch_size",
             f"must be >= 1, got {t.get('eval_batch_size')}")
    _require(float(t["temperature"]) > 0, "trainer.temperature", "must be > 0 for RL sampling")
    _require(0 < float(t["top_p"]) <= 1, "trainer.top_p", "must be in (0, 1]")
    _require(t.get("rollout_dtype", "float32") in ROLLOUT_DTYPES, "trainer.rollout_dtype",
             f"must be one of {', '.join(ROLLOUT_DTYPES)}, got {t.get('rollout_dtype')}")
    rows = int(t["batch_prompts"]) * int(a["group_size"])
    per_update = int(t["mini_batches"]) * int(t["micro_batches"])
    _require(rows % per_update == 0, "trainer.mini_batches",
             f"batch of {rows} trajectories does not split into mini_batches x micro_batches "
             f"= {per_update}")
    if a.get("dynamic_sampling"):
        _require(int(a["max_gen_batches"]) >= 1, "algo.max_gen_batches", "must be >= 1")
    for key, registry in (("advantage", ADVANTAGES), ("kl_estimator", KL_ESTIMATORS),
                          ("loss_agg", LOSS_AGG)):
        _require(str(a[key]) in registry, f"algo.{key}",
                 f"must be one of {registry.names()}, got {a[key]!r}")
    ov = a.get("overlong") or {}
    if ov.get("enabled"):
        _require(float(ov["penalty"]) >= 0, "algo.overlong.penalty",
                 f"must be >= 0, got {ov['penalty']}")


def response_budget(cfg: Mapping[str, Any], task: Any) -> int:
    """Most tokens a trajectory holds after its prompt: the task's budget for multi-turn tasks
    (actions and observations), else trainer.max_new_tokens."""
    return int(getattr(task, "max_response_tokens", 0) or cfg["trainer"]["max_new_tokens"])


def overlong_buffer(cfg: Mapping[str, Any], budget: int) -> int:
    """DAPO's soft-punishment buffer: algo.overlong.buffer_len tokens before the response
    budget (null: a quarter of it; DAPO used 4,096 of 20,480)."""
    value = (cfg["algo"].get("overlong") or {}).get("buffer_len")
    buffer = budget // 4 if value is None else int(value)
    _require(0 <= buffer < budget, "algo.overlong.buffer_len",
             f"must be in [0, {budget}) (the response budget), got {buffer}")
    return buffer


def fingerprint(cfg: Mapping[str, Any], model_cfg: Any) -> dict[str, Any]:
    """What a checkpoint must agree with to be resumed by this config."""
    return {"model": str(cfg["model"]["path"]),
            "model_config": hashlib.sha1(json.dumps(model_cfg.to_dict(), sort_keys=True,
                                                    default=str).encode()).hexdigest()[:16],
            "algo": str(cfg["algo"]["name"]), "task": str(cfg["task"]["name"]),
            "group_size": int(cfg["algo"]["group_size"]),
            "batch_prompts": int(cfg["trainer"]["batch_prompts"]),
            # the prompt order and every step's sampling seed derive from it
            "seed": int(cfg["trainer"]["seed"]),
            # the starting weights, and with beta > 0 the KL reference
            "init_from": str(cfg["trainer"].get("init_from") or "")}


def _step_seed(seed: int, step: int, draw: int = 0) -> int:
    return int(np.random.default_rng([seed, step, draw]).integers(0, 2**31 - 1))


@dataclasses.dataclass
class Trainer:
    """Holds what the loop needs; `run()` executes it. Built by :func:`build_trainer`."""

    cfg: Mapping[str, Any]
    model_cfg: Any
    tokenizer: Any
    task: Any
    env: Any
    rewarder: Any
    stream: PromptStream
    train_step: Any
    state: TrainState
    ref_params: Any
    loss_cfg: LossConfig
    mesh: Any
    runlog: RunLog
    ckpt: Checkpointer
    data_position: int = 0
    reward_state: Any = None
    start_step: int = 0
    judge: Any = None

    # ------------------------------------------------------------------------- phases

    def response_budget(self) -> int:
        return response_budget(self.cfg, self.task)

    def policy(self, evaluation: bool = False) -> SamplerPolicy:
        """The sampler on the current weights; training rollouts in trainer.rollout_dtype,
        evaluation always in float32 (numbers comparable across runs)."""
        dtype = "float32" if evaluation else self.cfg["trainer"].get("rollout_dtype", "float32")
        return SamplerPolicy(self.model_cfg, self.state.params, self.tokenizer, dtype=dtype)

    def collect(self, step: int) -> tuple[list[Group], RewardOutput, dict[str, float]]:
        """Rollout + rewards; with DAPO dynamic sampling, keep drawing until the batch is full
        of informative groups or max_gen_batches is spent (then train on what we have)."""
        a, t = self.cfg["algo"], self.cfg["trainer"]
        target = int(t["batch_prompts"])
        keep_groups: list[Group] = []
        outs: list[RewardOutput] = []
        events: list = []  # every draw's rubric-memory events, kept or not
        drawn: list[tuple[np.ndarray, np.ndarray]] = []  # every draw's (outcome, rewards)
        info = {"time/rollout_s": 0.0, "time/reward_s": 0.0, "dapo/gen_batches": 0,
                "dapo/dropped_groups": 0, "rollout/generated_tokens": 0}
        state = self.reward_state
        max_draws = int(a["max_gen_batches"]) if a.get("dynamic_sampling") else 1
        for draw in range(max_draws):
            prompts = self.stream.batch(self.data_position)
            self.data_position += 1
            t0 = time.perf_counter()
            groups = self.env.rollout(self.policy(), prompts, int(a["group_size"]),
                                      _step_seed(int(t["seed"]), step, draw))
            t1 = time.perf_counter()
            out = self.rewarder(groups, state, step)
            state = out.state
            events.extend(out.events)
            info["time/rollout_s"] += t1 - t0
            info["time/reward_s"] += time.perf_counter() - t1
            info["dapo/gen_batches"] += 1
            info["rollout/generated_tokens"] += sum(
                tr.num_action_tokens for g in groups for tr in g.trajectories)
            if not a.get("dynamic_sampling"):
                return groups, out, info | {"_state": state}
            keep = np.std(out.rewards, axis=1) > 1e-6
            info["dapo/dropped_groups"] += int((~keep).sum())
            drawn.append((out.outcome, out.rewards))
            for i in np.flatnonzero(keep)[: target - len(keep_groups)]:
                keep_groups.append(groups[i])
                outs.append(_row(out, i))
            if len(keep_groups) >= target:
                break
        info["dapo/filled"] = float(len(keep_groups) >= target)
        # the group statistics of everything drawn, before dynamic sampling dropped the
        # homogeneous groups (the kept batch's own read ~0 by construction)
        outcome, total = (jnp.asarray(np.concatenate(x)) for x in zip(*drawn))
        info |= {"dapo/drawn_homogeneous_frac": float(homogeneous_frac(outcome)),
                 "dapo/drawn_total_homogeneous_frac": float(homogeneous_frac(total)),
                 "dapo/drawn_all_wrong_frac": float(all_wrong_frac(outcome))}
        if not keep_groups:  # nothing informative: train on the last draw (zero advantages)
            return groups, dataclasses.replace(out, events=tuple(events)), info | {
                "_state": state}
        merged = RewardOutput(rewards=np.concatenate([o.rewards for o in outs]),
                              outcome=np.concatenate([o.outcome for o in outs]),
                              metrics=out.metrics, state=state, events=tuple(events),
                              per_traj=tuple(p for o in outs for p in o.per_traj))
        return keep_groups, merged, info | {"_state": state}

    def shaped_rewards(self, groups: Sequence[Group], rewards: np.ndarray) -> np.ndarray:
        ov = self.cfg["algo"].get("overlong") or {}
        if not ov.get("enabled"):
            return rewards
        # the whole response (a multi-turn one with its observations) against its budget
        lengths = np.asarray([[len(tr.tokens) for tr in g.trajectories] for g in groups])
        budget = self.response_budget()
        pen = overlong_penalty(jnp.asarray(lengths), budget, overlong_buffer(self.cfg, budget),
                               float(ov["penalty"]))
        return rewards + np.asarray(pen)

    def update(self, batch: dict) -> tuple[list[dict], float]:
        t = self.cfg["trainer"]
        mb = batch["tokens"].shape[0] // int(t["mini_batches"])  # groups per mini-batch
        metrics = []
        t0 = time.perf_counter()
        for _ in range(int(t["ppo_epochs"])):
            for k in range(int(t["mini_batches"])):
                sl = {key: v[k * mb:(k + 1) * mb] for key, v in batch.items()}
                if not sl["loss_mask"].any() and batch["loss_mask"].any():
                    continue  # only filler groups (rl.batch): an optimizer step on nothing
                sl = jax.device_put(sl, batch_sharding(self.mesh, 1, None)
                                    if self.mesh is not None else None)
                self.state, m = self.train_step(self.state, sl)
                metrics.append(m)
        metrics = jax.device_get(metrics)
        return metrics, time.perf_counter() - t0

    def logprobs_with(self, params: Any, batch: dict) -> np.ndarray:
        keys = ("prefix", "prefix_mask", "tokens", "attn_mask")
        params = in_compute_dtype(params, self.loss_cfg.compute_dtype)
        return np.asarray(group_logprobs(self.model_cfg, params,
                                         *(jnp.asarray(batch[k]) for k in keys),
                                         remat=self.loss_cfg.remat))

    def update_slices(self) -> int:
        """How many equal parts an update cuts the batch into along its group axis: mini-
        batches x micro-batches x the mesh's data-parallel shards."""
        t = self.cfg["trainer"]
        shards = 1 if self.mesh is None else batch_shards(self.mesh)
        return int(t["mini_batches"]) * int(t["micro_batches"]) * shards

    # ------------------------------------------------------------------------- loop

    def step(self, step: int) -> dict[str, Any]:
        t_start = time.perf_counter()
        groups, out, info = self.collect(step)
        self.reward_state = info.pop("_state")
        rewards = self.shaped_rewards(groups, out.rewards)
        adv = np.asarray(group_advantages(jnp.asarray(rewards, jnp.float32),
                                          str(self.cfg["algo"]["advantage"])))
        batch = build_batch(groups, adv, self.tokenizer.pad_id, self.response_budget(),
                            self.update_slices())
        t0 = time.perf_counter()
        if self.loss_cfg.beta > 0:
            batch["logp_ref"] = self.logprobs_with(self.ref_params, batch)
        if not self.loss_cfg.on_policy:
            batch["logp_old"] = self.logprobs_with(self.state.params, batch)
        ref_s = time.perf_counter() - t0
        train_metrics, train_s = self.update(batch)
        step_s = time.perf_counter() - t_start

        lengths = np.asarray([tr.num_action_tokens for g in groups for tr in g.trajectories])
        # before length shaping: the rubric term alone decides which groups it converted
        out_j, tot_j = jnp.asarray(out.outcome), jnp.asarray(out.rewards)
        avg = {k: float(np.mean([m[k] for m in train_metrics])) for k in train_metrics[0]}
        record = {
            "reward/mean": float(rewards.mean()), "reward/std": float(rewards.std()),
            "outcome/mean": float(out.outcome.mean()),
            "groups/homogeneous_frac": float(homogeneous_frac(out_j)),
            "groups/total_homogeneous_frac": float(homogeneous_frac(tot_j)),
            "groups/all_wrong_frac": float(all_wrong_frac(out_j)),
            "groups/converted_frac": float(converted_frac(out_j, tot_j)),
            **avg,
            "response/length_mean": float(lengths.mean()),
            "response/length_max": int(lengths.max()),
            "time/rollout_s": info.pop("time/rollout_s"), "time/judge_s": info.pop(
                "time/reward_s"), "time/reference_s": ref_s, "time/train_s": train_s,
            "time/step_s": step_s,
            "tokens_per_s": sum(len(tr.prompt_tokens) + len(tr.tokens) for g in groups
                                for tr in g.trajectories) / step_s,
            **info, **dict(out.metrics),
        }
        if self.judge is not None:  # cumulative counters: calls, retries, fallbacks, cache hits
            record |= {f"judge/{k}": v for k, v in self.judge.stats().items()}
        record["rollout/tokens_per_s"] = record["rollout/generated_tokens"] / max(
            record["time/rollout_s"], 1e-9)
        if out.events:
            self.runlog.events(step, out.events)
        every = int(self.cfg["trainer"]["sample_every"])
        if every and step % every == 0:
            self.runlog.samples(step, _samples(groups, out, rewards, n=4))
        return self.runlog.metrics(step, record)

    def checkpoint(self, step: int) -> None:
        meta = {"step": step, "data_position": self.data_position,
                "reward_state": self.rewarder.state_to_json(self.reward_state),
                "fingerprint": fingerprint(self.cfg, self.model_cfg),
                "seed": int(self.cfg["trainer"]["seed"])}
        self.ckpt.save(step, {"state": self.state._asdict(),
                              "rng": jax.random.key_data(jax.random.key(
                                  int(self.cfg["trainer"]["seed"])))}, meta)

    def evaluate(self, step: int) -> dict[str, Any]:
        """Greedy rollouts on the eval split: mean outcome, logged as eval/* at `step`."""
        t = self.cfg["trainer"]
        prompts = self.task.prompts(str(t["eval_split"]))
        sampling = SamplingParams(max_new_tokens=int(t["max_new_tokens"]), temperature=0.0)
        env = self.task.make_env(self.tokenizer, sampling)
        t0 = time.perf_counter()
        groups = greedy_rollouts(env, self.policy(evaluation=True), prompts,
                                 int(t.get("eval_batch_size", 64)))
        scores = np.asarray([self.task.outcome(g.prompt, g.trajectories[0]) for g in groups])
        lengths = [g.trajectories[0].num_action_tokens for g in groups]
        extra = {}
        if hasattr(self.task, "evaluate"):  # task-specific metrics (e.g. coverage and fitness)
            report = self.task.evaluate([g.prompt for g in groups],
                                        [g.trajectories[0].text for g in groups])
            extra = {f"eval/{k}": float(v) for k, v in report.summary.items()}
        return self.runlog.metrics(step, {
            "eval/outcome_mean": float(scores.mean()), "eval/n": len(scores),
            "eval/length_mean": float(np.mean(lengths)), **extra,
            "eval/time_s": time.perf_counter() - t0})

    def run_with_eval(self) -> list[dict[str, Any]]:
        """`run()` with greedy evaluations before the first and after the last step."""
        t = self.cfg["trainer"]
        every = int(t.get("eval_every", 0))
        ends = bool(t.get("eval_at_ends", True))
        if ends and self.start_step == 0:
            rec = self.evaluate(0)
            log.info("eval before training: %.3f", rec["eval/outcome_mean"])
        history = self.run(eval_every=every)
        if ends and (not every or int(t["max_steps"]) % every):
            rec = self.evaluate(int(t["max_steps"]))
            log.info("eval after training: %.3f", rec["eval/outcome_mean"])
        self.close()
        return history

    def close(self) -> None:
        self.runlog.close()
        self.ckpt.close()

    def run(self, eval_every: int = 0, until: int | None = None) -> list[dict[str, Any]]:
        """Train from start_step to trainer.max_steps (or stop early at `until`)."""
        t = self.cfg["trainer"]
        total = int(t["max_steps"])
        save_every = int(t["save_every"])
        history = []
        bar = tqdm(range(self.start_step, total), initial=self.start_step, total=total,
                   desc="train", dynamic_ncols=True, disable=not bool(t.get("progress", True)))
        for step in bar:
            if until is not None and step >= until:
                break
            rec = self.step(step)
            history.append(rec)
            bar.set_postfix(reward=f"{rec['reward/mean']:.3f}", kl=f"{rec['kl']:.4f}",
                            tok_s=f"{rec['tokens_per_s']:.0f}")
            # evaluate, then save: the evaluation at a checkpoint's step describes that
            # checkpoint's weights, and a run resumed from it keeps the record (RunLog)
            if eval_every and (step + 1) % eval_every == 0:
                self.evaluate(step + 1)
            if (save_every and (step + 1) % save_every == 0) or step + 1 == total:
                self.checkpoint(step + 1)
        bar.close()
        return history


def _row(out: RewardOutput, i: int) -> RewardOutput:
    return RewardOutput(rewards=out.rewards[i:i + 1], outcome=out.outcome[i:i + 1],
                        metrics=out.metrics, state=out.state,
                        per_traj=out.per_traj[i:i + 1] if out.per_traj else ())


def _samples(groups: Sequence[Group], out: RewardOutput, rewards: np.ndarray,
             n: int) -> list[dict]:
    recs = []
    for gi, g in enumerate(groups[:n]):
        for ti, tr in enumerate(g.trajectories):
            recs.append({"prompt_id": g.prompt.id, "question": g.prompt.question,
                         "answer": g.prompt.answer, "response": tr.text, "finish": tr.finish,
                         "outcome": float(out.outcome[gi, ti]),
                         "reward": float(rewards[gi, ti])})
    return recs


def loss_config(cfg: Mapping[str, Any], budget: int) -> LossConfig:
    """The loss settings; `budget` is the response budget (Dr.GRPO's constant normaliser)."""
    a, t = cfg["algo"], cfg["trainer"]
    updates = int(t["ppo_epochs"]) * int(t["mini_batches"])
    return LossConfig(
        eps_low=float(a["eps_low"]), eps_high=float(a["eps_high"]),
        dual_clip=None if a.get("dual_clip") is None else float(a["dual_clip"]),
        beta=float(a["beta"]), kl_estimator=str(a["kl_estimator"]),
        loss_agg=str(a["loss_agg"]), max_len_norm=budget,
        entropy_coef=float(a.get("entropy_coef", 0.0)), on_policy=updates == 1,
        micro_batches=int(t["micro_batches"]), remat=bool(t["remat"]),
        compute_dtype=str(cfg["model"].get("dtype", "float32")))


def optim_config(cfg: Mapping[str, Any]) -> OptimConfig:
    o, t = cfg["optim"], cfg["trainer"]
    updates = int(t["max_steps"]) * int(t["ppo_epochs"]) * int(t["mini_batches"])
    return OptimConfig(lr=float(o["lr"]), weight_decay=float(o["weight_decay"]),
                       grad_clip=float(o["grad_clip"]), warmup_steps=int(o["warmup_steps"]),
                       schedule=str(o["schedule"]), total_steps=updates,
                       min_lr_ratio=float(o.get("min_lr_ratio", 0.1)))


def init_from_run(run_dir: str, cfg: Mapping[str, Any], params: Any) -> Any:
    """Start from another run's latest weights (e.g. an ``rl.sft`` warm-up) instead of the
    base model's; only the parameters are taken, not its optimizer state or step."""
    from rl.eval import restore_run_params, run_config

    try:
        theirs = str(run_config(run_dir)["model"]["path"])
    except FileNotFoundError as e:
        raise ConfigError(f"trainer.init_from: {e}") from None
    if theirs != str(cfg["model"]["path"]):
        raise ConfigError(f"trainer.init_from: {run_dir} trained model {theirs!r}, this run "
                          f"uses {cfg['model']['path']!r}")
    try:
        params, step = restore_run_params(run_dir, params)
    except FileNotFoundError as e:
        raise ConfigError(f"trainer.init_from: {e}") from None
    log.info("initialised from %s (step %d)", run_dir, step)
    return params


def build_trainer(cfg: Mapping[str, Any], config_text: str = "") -> Trainer:
    """Validate, load, restore: everything up to the first step."""
    validate(cfg)
    task = make_task(cfg["task"])
    budget = response_budget(cfg, task)
    if (cfg["algo"].get("overlong") or {}).get("enabled"):
        overlong_buffer(cfg, budget)
    lc, oc = loss_config(cfg, budget), optim_config(cfg)  # bad values fail before any loading
    t = cfg["trainer"]
    run_dir = Path(str(t["run_dir"]))
    ckpt = Checkpointer(run_dir / "checkpoints", keep=int(t["keep_checkpoints"]))
    latest = ckpt.latest_step()
    if latest is not None and not bool(t["resume"]):
        raise ConfigError(f"trainer.run_dir: {run_dir} already holds checkpoints (latest step "
                          f"{latest}); set trainer.resume=true to continue it or choose "
                          f"another run_dir")
    mesh_cfg = cfg.get("mesh") or {}
    initialize_distributed(mesh_cfg.get("coordinator"), mesh_cfg.get("num_processes"),
                           mesh_cfg.get("process_id"))
    # float32 master weights and optimizer state whatever model.dtype says: that is the
    # forward/backward dtype (LossConfig.compute_dtype), and bfloat16 weights would round
    # small updates away
    model_cfg, params, tokenizer = load_params(str(cfg["model"]["path"]), jnp.float32,
                                               seed=int(t["seed"]))
    if t.get("init_from"):  # on resume too: the KL reference is these weights, not the base
        params = init_from_run(str(t["init_from"]), cfg, params)
    meta = None
    if latest is not None:
        meta = ckpt.read_meta(latest)
        want, have = fingerprint(cfg, model_cfg), meta.get("fingerprint", {})
        diff = sorted(k for k in want if want[k] != have.get(k))
        if diff:
            raise ConfigError(
                f"trainer.run_dir: the checkpoint in {run_dir} belongs to an incompatible run "
                f"(differs in {', '.join(diff)}: {[(k, have.get(k), want[k]) for k in diff]})")
    mesh = None
    if len(jax.devices()) > 1:
        mesh = make_mesh(dict(mesh_cfg.get("shape") or {"data": -1}))
        params = shard(params, param_shardings(params, mesh))
    optimizer = make_optimizer(oc)
    # the reference only runs forward passes: kept in the compute dtype
    ref_params = (jax.tree.map(jnp.copy, in_compute_dtype(params, lc.compute_dtype))
                  if lc.beta > 0 else None)
    state = init_train_state(params, optimizer)
    sampling = SamplingParams(max_new_tokens=int(t["max_new_tokens"]),
                              temperature=float(t["temperature"]), top_p=float(t["top_p"]),
                              ignore_eos=bool(t.get("ignore_eos", False)))
    from judges import make_judge

    judge = make_judge(dict(cfg["judge"])) if cfg.get("judge") and cfg["judge"].get(
        "name", "none") != "none" else None
    rewarder = make_rewarder(str(cfg["algo"].get("rewarder", "outcome")), task,
                             dict(cfg["algo"].get("rewarder_options") or {}), judge)
    trainer = Trainer(
        cfg=cfg, model_cfg=model_cfg, tokenizer=tokenizer, task=task,
        env=task.make_env(tokenizer, sampling), rewarder=rewarder,
        stream=PromptStream(task.prompts("train"), int(t["batch_prompts"]), int(t["seed"])),
        train_step=make_train_step(model_cfg, lc, optimizer, lr_schedule(oc)), state=state,
        ref_params=ref_params, loss_cfg=lc, mesh=mesh,
        runlog=RunLog(run_dir, resume_step=latest, tensorboard=bool(t.get("tensorboard", True))),
        ckpt=ckpt, reward_state=rewarder.init_state(), judge=judge)
    if latest is not None:
        restored, meta = ckpt.restore(latest, {"state": state._asdict(),
                                               "rng": jax.random.key_data(jax.random.key(0))})
        trainer.state = TrainState(**restored["state"])
        trainer.data_position = int(meta["data_position"])
        trainer.reward_state = rewarder.state_from_json(meta.get("reward_state"))
        trainer.start_step = int(meta["step"])
        log.info("resumed %s at step %d", run_dir, latest)
    if config_text:
        trainer.runlog.write_config(config_text)
    if judge is not None:  # which prompt templates produced this run's judgments
        trainer.runlog.write_config(json.dumps(judge.versions(), indent=1), "judge_versions.json")
    return trainer
