"""The host loop: build the run's components once, then fold ``rl.run.loop.step`` over the steps.

It knows nothing task-specific: the task supplies prompts, an environment and an outcome
score; the rewarder (outcome, ARBOR, rubric aggregators) turns groups into rewards and carries
its own immutable state (the rubric memory) from step to step inside the loop state. This
module owns the side effects: the run folder (``rl.run.runlog``), checkpoints
(``rl.run.checkpoint``), evaluation and progress.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh
from omegaconf import DictConfig
from tqdm.auto import tqdm

from core.cluster import join_cluster
from core.local_devices import local_device_ids, processes_per_node
from core.types import Prompt, Rewarder, Task
from judges.base import Judge
from judges.cost import cost, prices
from models import ModelLoadError, load_params, load_shapes
from models.hub import hub_commit, is_hub_id
from models.sampler import SamplingParams
from models.sharding import make_mesh
from rl.grpo.off_policy import Behaviour, RolloutPrefetch, snapshot
from rl.grpo.optim import lr_schedule, make_optimizer
from rl.grpo.train_step import (
    TrainState,
    abstract_train_state,
    in_compute_dtype,
    init_train_state,
    make_train_step,
)
from rl.run import loop as L
from rl.run.checkpoint import Checkpointer, CheckpointError, json_digest
from rl.run.config import (
    ConfigError,
    RunConfig,
    check_devices,
    check_job_size,
    eval_splits,
    overlong_buffer,
    parse,
)
from rl.run.data import PromptStream
from rl.run.evaluation import (
    greedy_rollouts,
    outcomes,
    restore_run_params,
    run_config,
    task_report,
)
from rl.run.folder import check_shared, is_url, local_mirror, run_path
from rl.run.lora import BASE_META, fresh_adapters, lora_run
from rl.run.mirror import RunMirror
from rl.run.multihost import KEY_ROOT, Exchange, is_leader, shared, shared_env
from rl.run.provenance import provenance
from rl.run.resolve import resolved_config
from rl.run.resume import SETTINGS, refuse_changes, settings
from rl.run.runlog import RunLog
from rl.run.wiring import (
    bind_judge,
    import_user_modules,
    make_judge,
    make_rewarder,
    make_task,
)

log = logging.getLogger(__name__)

_BUILDS = itertools.count()  # this process's trainers with a job exchange (join_job)

__all__ = ["CheckpointError", "ConfigError", "Trainer", "build_trainer", "fingerprint",
           "response_budget"]


def response_budget(run: RunConfig, task: Task) -> int:
    """Most tokens a trajectory holds after its prompt: the task's budget for multi-turn tasks
    (actions and observations), else trainer.max_new_tokens."""
    return int(getattr(task, "max_response_tokens", 0) or run.trainer.max_new_tokens)


def model_config_hash(model_cfg: Any) -> str:
    """A short hash of the model architecture (what the saved arrays' shapes follow)."""
    return hashlib.sha1(json.dumps(model_cfg.to_dict(), sort_keys=True,
                                   default=str).encode()).hexdigest()[:16]


def fingerprint(run: RunConfig, model_cfg: Any) -> dict[str, Any]:
    """What a checkpoint written before settings were recorded (``rl.run.resume``) must agree
    with to be resumed by this config."""
    return {"model": run.model.path, "model_config": model_config_hash(model_cfg),
            "algo": run.algo.name,
            "task": str(run.task["name"]), "group_size": run.algo.group_size,
            "batch_prompts": run.trainer.batch_prompts,
            # the prompt order and every step's sampling seed derive from it
            "seed": run.trainer.seed,
            # the starting weights, and with beta > 0 the KL reference
            "init_from": run.trainer.init_from or ""}


@dataclasses.dataclass
class Trainer:
    """The run's fixed components, its current loop state, and where it writes.
    Built by :func:`build_trainer`; ``run()`` folds the steps."""

    parts: L.Components
    loop: L.LoopState
    runlog: RunLog
    ckpt: Checkpointer
    start_step: int = 0
    settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # rl.run.resume
    # judge counters of the steps before this process started (restored from a checkpoint):
    # the judge/* metrics continue the run's totals across resumes
    # the services' counters (judge/*, retrieval/*) of the steps before a resume
    counter_base: Mapping[str, float] = dataclasses.field(default_factory=dict)
    # trainer.off_policy_steps=1: the next step's rollout, started while this step updates
    prefetcher: RolloutPrefetch | None = None
    # eval/outcome_mean of each evaluation this process ran, by step (the closing lines)
    evaluations: dict[int, float] = dataclasses.field(default_factory=dict)

    # read-only views for callers and tests
    @property
    def run_cfg(self) -> RunConfig:
        return self.parts.run

    @property
    def state(self) -> TrainState:
        return self.loop.train

    @property
    def reward_state(self) -> Any:
        return self.loop.reward

    @property
    def loss_cfg(self) -> Any:
        return self.parts.loss_cfg

    def step(self, prefetch: bool = False) -> dict[str, Any]:
        """Run the next step and log it; returns its metrics record. Off-policy, `prefetch`
        starts the next step's rollout on the background thread while this step updates (the
        same values as collecting it in the next step): the caller must take it with the next
        ``step()`` before evaluating, saving or closing."""
        step = self.loop.step
        pending = self.prefetcher.take(step, self.loop.data_position) if self.prefetcher else None
        start = self.prefetcher.start if prefetch and self.prefetcher else None
        self.loop, result = L.step(self.parts, self.loop, collected=pending, prefetch=start)
        self._agree_on_host_state()
        if result.events:
            self.runlog.events(step, result.events)
        if result.samples:
            self.runlog.samples(step, result.samples)
        for alert in result.alerts:  # rewards.gaming: a monitor's bound past its margin
            log.warning("step %d: %s = %.3f, its %g-level bound %.3f %s %.3f (rewards.gaming)",
                        step, alert["metric"], alert["value"], 1 - alert["alpha"],
                        alert["bound"], alert["direction"], alert["threshold"])
        if result.alerts:
            self.runlog.alerts(step, result.alerts)
        lineage = getattr(self.parts.rewarder, "lineage", None)  # ARBOR: memory.lineage
        if callable(lineage) and (retired := lineage(self.loop.reward, step)):
            self.runlog.lineage(step, retired)
        record = dict(result.record)
        for k, v in self.counter_base.items():
            record[k] = record.get(k, 0) + v
        spent = cost(record.get("judge/prompt_tokens", 0), record.get("judge/completion_tokens", 0),
                     *prices(self.parts.run.judge))
        if spent is not None and "judge/prompt_tokens" in record:  # the run's, across resumes
            record["judge/cost"] = spent
        return self.runlog.metrics(step, record)

    def _agree_on_host_state(self) -> None:
        """Multi-process: every process holds the same rewarder state (the rubric memory),
        data position and step after a step, or the run stops (``rl.run.multihost``)."""
        if self.parts.exchange is None:
            return
        lp = self.loop
        self.parts.exchange.agree(json_digest({
            "reward_state": self.parts.rewarder.state_to_json(lp.reward),
            "data_position": lp.data_position, "step": lp.step}),
            f"the host state after step {lp.step - 1} (rubric memory / rewarder state, data "
            f"position)")

    def counter_totals(self) -> dict[str, float]:
        """The judge's and the retriever's counters (``judge/*``, ``retrieval/*``) over the
        whole run, across resumes."""
        now = {f"judge/{k}": v for k, v in
               (self.parts.judge.stats() if self.parts.judge is not None else {}).items()}
        retrieval = getattr(self.parts.env, "retrieval_stats", None)
        if callable(retrieval):
            now |= {f"retrieval/{k}": v for k, v in retrieval().items()}
        keys = set(now) | set(self.counter_base)
        return {k: self.counter_base.get(k, 0) + now.get(k, 0) for k in sorted(keys)
                if isinstance(now.get(k, 0), int | float)}

    def checkpoint(self) -> None:
        """Save the loop state, the run's settings and the judge's counters at its step."""
        lp = self.loop
        self._nothing_in_flight("a checkpoint")
        meta = {"step": lp.step, "data_position": lp.data_position,
                "reward_state": self.parts.rewarder.state_to_json(lp.reward),
                "fingerprint": fingerprint(self.parts.run, self.parts.model_cfg),
                "seed": self.parts.run.trainer.seed, SETTINGS: dict(self.settings),
                "counter_totals": self.counter_totals(),
                "judge_sampling": _judge_sampling(self.parts.judge)}
        tree = {"state": lp.train._asdict()}
        # the weights the next rollout samples from (rl.grpo.off_policy)
        if lp.behaviour is not None:
            tree["behaviour"] = lp.behaviour.params
            meta["behaviour_version"] = lp.behaviour.version
        if self.parts.lora is not None:  # the params saved are adapters: name their base
            meta[BASE_META] = self.parts.lora.meta()
        self.ckpt.save(lp.step, tree, meta)
        self.runlog.sync(force=True)  # a run folder on object storage: its log beside it

    def evaluate(self, step: int) -> dict[str, Any]:
        """Greedy rollouts on the eval split(s), logged as eval/* at `step`: the outcome mean,
        prompt count, length and the task's own metrics; with several splits each one's under
        eval/<split>/* and eval/* their average (eval/n their total)."""
        self._nothing_in_flight("an evaluation")
        c, t = self.parts, self.parts.run.trainer
        splits = c.eval_prompts or tuple((s, tuple(c.task.prompts(s))) for s in eval_splits(t))
        env = shared_env(c.task.make_env(c.tokenizer, SamplingParams(
            max_new_tokens=t.max_new_tokens, temperature=0.0)), c.exchange)
        policy = c.policy(self.loop.train.params, evaluation=True)
        t0 = time.perf_counter()
        per_split = {name: self._evaluate_split(env, policy, prompts) for name, prompts in splits}
        values = next(iter(per_split.values()))
        if len(per_split) > 1:
            keys = list(dict.fromkeys(k for v in per_split.values() for k in v))
            values = {k: float(np.mean([v[k] for v in per_split.values() if k in v]))
                      for k in keys}
            values["n"] = sum(v["n"] for v in per_split.values())
            values |= {f"{name}/{k}": x for name, v in per_split.items() for k, x in v.items()}
        self.evaluations[step] = values["outcome_mean"]
        return self.runlog.metrics(step, {**{f"eval/{k}": v for k, v in values.items()},
                                          "eval/time_s": time.perf_counter() - t0})

    def _evaluate_split(self, env: Any, policy: Any, prompts: Sequence[Prompt]
                        ) -> dict[str, Any]:
        c, t = self.parts, self.parts.run.trainer
        groups = greedy_rollouts(env, policy, list(prompts), t.eval_batch_size)
        report = task_report(c.task, groups)  # the task's metrics (coverage, fitness, ...)
        scores = np.asarray(outcomes(c.task, groups, report)).reshape(-1)
        lengths = [g.trajectories[0].num_action_tokens for g in groups]
        extra = {} if report is None else {k: float(v) for k, v in report.summary.items()}
        return {"outcome_mean": float(scores.mean()), "n": len(scores),
                "length_mean": float(np.mean(lengths)), **extra}

    def run_with_eval(self) -> list[dict[str, Any]]:
        """`run()` with greedy evaluations before the first and after the last step."""
        t = self.parts.run.trainer
        if t.eval_at_ends and self.start_step == 0:
            rec = self.evaluate(0)
            log.info("eval before training: %.3f", rec["eval/outcome_mean"])
        history = self.run(eval_every=t.eval_every)
        if t.eval_at_ends and (not t.eval_every or t.max_steps % t.eval_every):
            rec = self.evaluate(t.max_steps)
            log.info("eval after training: %.3f", rec["eval/outcome_mean"])
        self.close()
        return history

    def close(self) -> None:
        if self.prefetcher is not None:
            self.prefetcher.close()
        self.runlog.close()
        self.ckpt.close()

    def run(self, eval_every: int = 0, until: int | None = None) -> list[dict[str, Any]]:
        """Train from the loop state's step to trainer.max_steps (or stop early at `until`)."""
        t = self.parts.run.trainer
        history = []
        bar = tqdm(range(self.loop.step, t.max_steps), initial=self.loop.step,
                   total=t.max_steps, desc="train", dynamic_ncols=True, disable=not t.progress)
        for step in bar:
            if until is not None and step >= until:
                break
            rec = self.step(prefetch=self._prefetches_after(step, eval_every, until))
            history.append(rec)
            bar.set_postfix(reward=f"{rec['reward/mean']:.3f}", kl=f"{rec.get('kl', 0):.4f}",
                            tok_s=f"{rec['tokens_per_s']:.0f}")
            # evaluate, then save: the evaluation at a checkpoint's step describes that
            # checkpoint's weights, and a run resumed from it keeps the record (RunLog)
            if eval_every and (step + 1) % eval_every == 0:
                self.evaluate(step + 1)
            if (t.save_every and (step + 1) % t.save_every == 0) or step + 1 == t.max_steps:
                self.checkpoint()
        bar.close()
        return history

    def _nothing_in_flight(self, what: str) -> None:
        """A checkpoint must not hold a rollout in flight (its resume would not be exact), and
        an evaluation must not share the retriever with one."""
        if self.prefetcher is not None and self.prefetcher.in_flight:
            raise RuntimeError(f"{what} while the next step's rollout is in flight; take it "
                               f"with step() first")

    def _prefetches_after(self, step: int, eval_every: int, until: int | None) -> bool:
        """Off-policy: start the next rollout during this step's update unless a checkpoint
        or an evaluation follows this step, or the run stops after it (a checkpoint holds no
        rollout in flight, and the judge and retriever serve one thread at a time)."""
        t, after = self.parts.run.trainer, step + 1
        saves = (t.save_every and after % t.save_every == 0) or after == t.max_steps
        evaluates = eval_every and after % eval_every == 0
        return bool(t.off_policy_steps and not saves and not evaluates
                    and (until is None or after < until))


# ------------------------------------------------------------------------------ building


def init_from_run(run_dir: str, run: RunConfig, params: Any) -> Any:
    """Start from another run's latest weights (e.g. an ``rl.sft`` warm-up) instead of the
    base model's; only the parameters are taken, not its optimizer state or step."""
    try:
        theirs = str(run_config(run_dir)["model"]["path"])
    except FileNotFoundError as e:
        raise ConfigError(f"trainer.init_from: {e}") from None
    if theirs != run.model.path:
        raise ConfigError(f"trainer.init_from: {run_dir} trained model {theirs!r}, this run "
                          f"uses {run.model.path!r}")
    try:
        params, step = restore_run_params(run_dir, params)
    except FileNotFoundError as e:
        raise ConfigError(f"trainer.init_from: {e}") from None
    log.info("initialised from %s (step %d)", run_dir, step)
    return params


def _run_log(run: RunConfig, resume_step: int | None) -> RunLog:
    """The run log, in trainer.run_dir or, for a run folder on object storage, in its local
    folder copied there (written by process 0 alone)."""
    t = run.trainer
    url = is_url(t.run_dir)
    local = local_mirror(t.run_dir) if url else Path(t.run_dir)
    mirror = RunMirror(local, run_path(t.run_dir)) if url else None
    return RunLog(local, resume_step=resume_step, loggers=t.loggers, wandb=t.wandb,
                  config=run.raw, active=is_leader(), mirror=mirror)


def _open_checkpoints(run: RunConfig, exchange: Exchange | None = None
                      ) -> tuple[Checkpointer, list[int]]:
    """The run folder's checkpoints and their steps, newest first, as trainer.resume wants
    them: true needs one, false refuses them, auto takes them when there are some. An error
    leaves the folder as it was. In a job, what process 0 sees decides."""
    t = run.trainer
    folder = run_path(t.run_dir) / "checkpoints"

    def has_steps() -> bool:
        return folder.is_dir() and any(p.name.isdigit() for p in folder.iterdir())

    found = has_steps() if exchange is None else exchange.from_leader(
        has_steps, "process 0's look at the checkpoints")
    if t.resume is True and not found:
        raise ConfigError(f"trainer.resume=true: {t.run_dir} holds no checkpoint ({folder} "
                          f"is missing or empty), nothing to resume; check trainer.run_dir, "
                          f"or set trainer.resume=auto to start afresh when there is none")
    ckpt = Checkpointer(folder, keep=None if t.keep_checkpoints == "all" else t.keep_checkpoints,
                        exchange=exchange)
    steps = ckpt.step_dirs()
    if steps and t.resume is False:
        ckpt.close()
        raise ConfigError(f"trainer.run_dir: {t.run_dir} already holds checkpoints "
                          f"(latest step {steps[0]}); set trainer.resume=true to continue it "
                          f"(or trainer.resume=auto) or choose another run_dir")
    return ckpt, steps


def _check_fingerprint(run: RunConfig, meta: Mapping[str, Any], where: str,
                       model_cfg: Any) -> None:
    """Refuse to resume a checkpoint written (before settings were recorded) by an
    incompatible config."""
    want, have = fingerprint(run, model_cfg), meta.get("fingerprint", {})
    diff = sorted(k for k in want if want[k] != have.get(k))
    if diff:
        raise ConfigError(
            f"trainer.run_dir: the checkpoint {where} belongs to an incompatible run "
            f"(differs in {', '.join(diff)}: {[(k, have.get(k), want[k]) for k in diff]})")
    log.warning("the checkpoint %s was written before settings were recorded: only its "
                "fingerprint (%s) is compared", where, ", ".join(want))


def job_model(run: RunConfig, exchange: Exchange | None = None) -> dict[str, Any]:
    """The model every process of the job loads: ``path``, the configured ``revision`` and,
    for a hub id, the ``commit`` it resolved to (process 0 resolves it, so a branch that
    moves while the hosts download cannot give them different weights)."""
    path, revision = run.model.path, run.model.revision
    if not is_hub_id(path):
        return {"path": path, "revision": revision}

    def resolve() -> str:
        try:
            return hub_commit(path, revision)
        except ModelLoadError as e:
            raise ConfigError(f"model.path: {e}") from None

    commit = resolve() if exchange is None else exchange.from_leader(resolve, "the model's commit")
    return {"path": path, "revision": revision, "commit": commit}


def job_task(task: Mapping[str, Any], exchange: Exchange | None = None) -> Mapping[str, Any]:
    """The task config every process of the job reads: a hub dataset's ``task.revision``
    pinned to the commit process 0 resolves it to (as :func:`job_model` does for weights),
    so a branch that moves while the hosts read cannot give them different rows."""
    if exchange is None or not task.get("dataset"):
        return task
    from rl.tasks.sources import dataset_commit

    commit = exchange.from_leader(
        lambda: dataset_commit(str(task["dataset"]), task.get("revision"), "task.dataset"),
        "the dataset's commit")
    return {**task, "revision": commit}


def _weights(run: RunConfig, mesh: Any, model: Mapping[str, Any],
             shapes_only: bool = False) -> tuple[Any, Any, Any]:
    """(model config, float32 master weights, tokenizer with model.chat_template_kwargs) of
    `model` (:func:`job_model`):
    loaded (sharded over the mesh when there is one), initialised from trainer.init_from
    when set; with `shapes_only` the weights' shapes and shardings, from the files' headers
    (a resume that restores them)."""
    path, revision = model["path"], model.get("commit", model["revision"])
    if shapes_only:
        model_cfg, params, tokenizer = load_shapes(path, jnp.float32, mesh=mesh,
                                                   revision=revision)
        return model_cfg, params, tokenizer.with_template_kwargs(run.model.chat_template_kwargs)
    # float32 master weights and optimizer state whatever model.dtype says: that is the
    # forward/backward dtype (LossConfig.compute_dtype), and bfloat16 weights would round
    # small updates away
    # with a mesh each array goes from the host straight to its shards (no device holds the
    # whole model); trainer.init_from then restores onto those shardings
    model_cfg, params, tokenizer = load_params(path, jnp.float32, seed=run.trainer.seed,
                                               mesh=mesh, revision=revision)
    if run.trainer.init_from:  # on resume too: the KL reference is these weights
        params = init_from_run(run.trainer.init_from, run, params)
    return model_cfg, params, tokenizer.with_template_kwargs(run.model.chat_template_kwargs)


def _checkpoint_holds_everything(run: RunConfig, lc: Any) -> bool:
    """Whether a resume needs only its checkpoint: no KL reference (beta > 0: the base
    weights), no LoRA (the frozen base and its fingerprint), no off-policy sampler copy made
    from the fresh weights."""
    return lc.beta <= 0 and not run.model.lora.enabled and not run.trainer.off_policy_steps


@dataclasses.dataclass(frozen=True)
class Inputs:
    """Everything a run reads besides the model, read and checked before the model loads, so
    a bad file, split, option or mesh stops the start before any expensive work."""

    task: Task
    budget: int
    train_prompts: list[Prompt]
    eval_prompts: tuple[tuple[str, tuple[Prompt, ...]], ...]  # (split, its prompts) each
    judge: Judge | None
    rewarder: Rewarder
    mesh: Mesh | None
    exchange: Exchange | None = None  # in a multi-process job
    rollout_mesh: Mesh | None = None  # mesh.rollout_shape (None: the rollout uses `mesh`)


def join_job(run: RunConfig) -> Exchange | None:
    """``core.cluster.join_cluster`` with the ``mesh`` section's settings (explicit, or the
    cluster JAX finds; its errors as ConfigError: they name the key), each process on the
    devices ``mesh.local_device_ids`` chooses, the job's devices checked
    (``rl.run.config.check_devices``); the job's host exchange when it has several processes
    (``rl.run.multihost``), else None."""
    mesh = run.mesh
    try:
        ids = local_device_ids(mesh.local_device_ids, os.environ)
        join_cluster(mesh.coordinator, mesh.num_processes, mesh.process_id,
                     mesh.connect_timeout_s, mesh.heartbeat_timeout_s, ids)
    except (ValueError, RuntimeError) as e:
        raise ConfigError(str(e)) from None
    check_job_size(run, jax.process_count())
    check_devices(mesh, os.environ, jax.local_device_count(), jax.device_count(),
                  jax.process_count())
    if jax.process_count() == 1:
        return None
    # every process builds its trainers in the same order (rl.smoke builds three): the n-th
    # build's exchange keys are its own, whatever the ones before left in the store
    return Exchange(mesh.wait_timeout_s, prefix=f"{KEY_ROOT}/build{next(_BUILDS)}")


def _job_config(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The resolved config without what differs between the processes of one job."""
    mesh = {k: v for k, v in dict(raw.get("mesh", {})).items() if k != "process_id"}
    return {k: v for k, v in raw.items() if k not in ("mesh", "hydra")} | {"mesh": mesh}


def _split(task: Any, split: str, key: str) -> list[Prompt]:
    try:
        prompts = task.prompts(split)
    except (ValueError, KeyError, OSError) as e:
        raise ConfigError(f"{key}: split {split!r}: {e}") from None
    if not prompts:
        raise ConfigError(f"{key}: split {split!r} has no prompts")
    return prompts


def _mesh(run: RunConfig) -> Any:
    """The training mesh over every device of the job (None on one device). A shape that
    needs another device count (a preset's ``mesh=v5e_16`` on one host) is a ConfigError
    naming the shape and the devices there are, before anything loads."""
    shape = dict(run.mesh.shape or {"data": -1})
    try:
        mesh = make_mesh(shape, dcn_shape=run.mesh.dcn_shape,
                         processes_per_node=processes_per_node(os.environ))
    except ValueError as e:
        if str(e).startswith("mesh.dcn_shape"):
            raise ConfigError(str(e)) from None
        raise ConfigError(f"mesh.shape: {e} ({jax.device_count()} {jax.default_backend()} "
                          f"device(s) in this job; mesh=fsdp or mesh=auto uses them all)"
                          ) from None
    if jax.process_count() > 1:  # every process must lay the devices out alike
        multihost_utils.assert_equal(
            np.asarray([d.id for d in mesh.devices.flat]),
            "mesh: the processes of this job built different device meshes (their nodes' "
            "process counts differ?); set mesh.dcn_shape")
    return None if mesh.size == 1 else mesh


def rollout_mesh(run: RunConfig, mesh: Any) -> Any:
    """``mesh.rollout_shape`` over the training mesh's devices, in their order (None: the
    rollout runs on the training mesh; on one device there is nothing to lay out, but the
    shape is still checked)."""
    if run.mesh.rollout_shape is None:
        return None
    devices = jax.devices() if mesh is None else list(mesh.devices.flat)
    try:
        rollout = make_mesh(dict(run.mesh.rollout_shape), devices=devices,
                            processes_per_node=processes_per_node(os.environ))
    except ValueError as e:
        raise ConfigError(f"mesh.rollout_shape: {e}") from None
    return None if mesh is None else rollout


def read_inputs(run: RunConfig, exchange: Exchange | None = None) -> Inputs:
    """Task, data (training split, and the evaluation split when the run evaluates), judge,
    rewarder (its rubric files) and mesh, each error naming its key. In a multi-process job
    (`exchange`) the judge is called by process 0 only (``rl.run.multihost.shared``)."""
    t = run.trainer
    mesh = _mesh(run)  # first: a shape this job's devices cannot hold needs no data read
    task = make_task(job_task(run.task, exchange))
    budget = response_budget(run, task)
    if run.algo.overlong.enabled:
        overlong_buffer(run, budget)
    judge = shared(make_judge(run.judge), exchange, "judge")
    task = bind_judge(task, judge, run.judge)
    evaluates = t.eval_at_ends or t.eval_every > 0
    eval_prompts = tuple((split, tuple(_split(task, split, "trainer.eval_split")))
                         for split in eval_splits(t)) if evaluates else ()
    rewarder = make_rewarder(run.algo.rewarder, task, run.algo.rewarder_options, judge)
    return Inputs(task=task, budget=budget, train_prompts=_split(task, "train", "task"),
                  eval_prompts=eval_prompts, judge=judge, rewarder=rewarder, mesh=mesh,
                  exchange=exchange, rollout_mesh=rollout_mesh(run, mesh))


def reference_weights(params: Any, dtype: Any, frozen: bool) -> Any:
    """The KL reference's weights: the initial weights in the compute dtype (it only runs
    forward passes). The train step donates the policy's weights, so the reference may not
    share their buffers: a cast makes new ones, a float32 reference is copied. Copying the
    cast as well held two references at once while loading (``rl.plan``'s start-up row).
    `frozen` (LoRA: the base, adapters off, never donated): shared, no copy."""
    ref = in_compute_dtype(params, dtype)
    if frozen:
        return ref
    return jax.tree.map(lambda r, p: jnp.copy(r) if r is p else r, ref, params)


def build_trainer(cfg: Mapping[str, Any] | DictConfig, config_text: str = "") -> Trainer:
    """Parse and check the config, load, restore: everything up to the first step."""
    if isinstance(cfg, DictConfig):
        cfg = resolved_config(cfg)
    run = parse(cfg)
    # before any other JAX call: a multi-host job agrees on its devices first
    exchange = join_job(run)
    if exchange is not None:  # the same program everywhere: the same config (but the rank)
        exchange.agree(json_digest(_job_config(run.raw)), "the run config")
    t = run.trainer
    if exchange is not None:  # one run folder, the same on every host, before anything in it
        check_shared(run_path(t.run_dir), exchange, wait_s=min(30, run.mesh.wait_timeout_s))
    # after join_job (a user's module may call JAX), before any name is looked up
    import_user_modules(cfg.get("imports"))
    model = job_model(run, exchange)  # a hub id found in the cache (or fetched), no weights read
    inp = read_inputs(run, exchange)
    lc, oc = run.loss_config(inp.budget), run.optim_config()
    ckpt, steps = _open_checkpoints(run, exchange)
    # a resume that needs nothing but its checkpoint reads no base weights: shapes only
    from_checkpoint = bool(steps) and _checkpoint_holds_everything(run, lc)
    model_cfg, params, tokenizer = _weights(run, inp.mesh, model, shapes_only=from_checkpoint)
    optimizer = make_optimizer(oc)
    lora, ref_params, step_fn, params = _trained(run, lc, optimizer, model_cfg, params,
                                                 inp.mesh)
    parts = L.Components(
        run=run, model_cfg=model_cfg, tokenizer=tokenizer, task=inp.task,
        env=shared_env(inp.task.make_env(tokenizer, run.sampling()), exchange),
        rewarder=inp.rewarder,
        stream=PromptStream(inp.train_prompts, t.batch_prompts, t.seed),
        train_step=step_fn, ref_params=ref_params, loss_cfg=lc, mesh=inp.mesh,
        rollout_mesh=inp.rollout_mesh,
        judge=inp.judge, response_budget=inp.budget, eval_prompts=inp.eval_prompts, lora=lora,
        exchange=exchange)
    train = (abstract_train_state if from_checkpoint else init_train_state)(
        params, optimizer, inp.mesh)
    loop = L.LoopState(train=train,
                       reward=inp.rewarder.init_state(), data_position=0, step=0,
                       behaviour=snapshot(params, 0) if t.off_policy_steps else None)
    now = settings(run.raw, model_config_hash(model_cfg), inp.train_prompts)
    resumed = _resume(parts, ckpt, loop, now) if steps else None
    if resumed is not None:
        loop = resumed.loop
        log.info("resumed %s at step %d", t.run_dir, loop.step)
    trainer = Trainer(parts=parts, loop=loop, ckpt=ckpt, start_step=loop.step, settings=now,
                      counter_base=resumed.counter_totals if resumed else {},
                      prefetcher=(RolloutPrefetch(lambda state: L.collect(parts, state))
                                  if t.off_policy_steps else None),
                      runlog=_run_log(run, loop.step if resumed else None))
    _record_config(trainer, config_text, resumed, exchange, model)
    if inp.judge is not None:  # which prompt templates produced this run's judgments
        trainer.runlog.write_config(json.dumps(inp.judge.versions(), indent=1),
                                    "judge_versions.json")
    return trainer


def _trained(run: RunConfig, lc: Any, optimizer: Any, model_cfg: Any, params: Any,
             mesh: Any) -> tuple[Any, Any, Any, Any]:
    """(the LoRA side or None, the KL reference's weights or None, the train step, the params
    it trains): all the weights, or a LoRA run's fresh adapters over its frozen base."""
    t, oc = run.trainer, run.optim_config()
    lora = lora_run(run.model.lora, model_cfg, params, {
        "model.path": run.model.path, "trainer.init_from": t.init_from or ""})
    # LoRA's reference is its base as the policy sees it (QLoRA: the quantized one), so the
    # loaded float32 weights are not kept
    ref_params = None if lc.beta <= 0 else reference_weights(
        params if lora is None else lora.base, lc.compute_dtype, lora is not None)
    step_fn = make_train_step(model_cfg, lc, optimizer, lr_schedule(oc),
                              lora=None if lora is None else lora.config)
    if lora is not None:  # train the adapters; the base weights are the step's argument
        step_fn = functools.partial(step_fn, base=lora.base)
        params = fresh_adapters(lora, t.seed, mesh)
    return lora, ref_params, step_fn, params


class Resumed(NamedTuple):
    loop: L.LoopState
    changes: dict[str, tuple[Any, Any]]  # the settings changed with resume_allow_changes
    counter_totals: dict[str, float]  # judge/* and retrieval/* before the resume


def _resume(parts: L.Components, ckpt: Checkpointer, fresh: L.LoopState,
            now: Mapping[str, Any]) -> Resumed:
    """The loop state of the newest valid checkpoint (older ones when newer ones are broken),
    restored onto the structure of `fresh`, once its settings agree with `now`."""
    run = parts.run
    changed: dict[str, Any] = {}

    def check(step: int, meta: Mapping[str, Any]) -> None:
        where = f"at step {step} in {ckpt.dir}"
        if SETTINGS in meta:
            changed.clear()
            changed.update(refuse_changes(meta[SETTINGS], now,
                                          run.trainer.resume_allow_changes, where))
        else:
            _check_fingerprint(run, meta, where, parts.model_cfg)
        _check_behaviour(run, meta, where)
        if parts.lora is not None:
            parts.lora.check_checkpoint(meta, where)

    like = {"state": fresh.train._asdict()}
    if fresh.behaviour is not None:
        like["behaviour"] = fresh.behaviour.params
    try:
        _, restored, meta = ckpt.restore_latest_valid(like, check)
    except CheckpointError as e:
        raise CheckpointError(f"trainer.resume: {e}") from None
    loop = L.LoopState(train=TrainState(**restored["state"]),
                       reward=parts.rewarder.state_from_json(meta.get("reward_state")),
                       data_position=int(meta["data_position"]), step=int(meta["step"]),
                       behaviour=(Behaviour(restored["behaviour"], int(meta["behaviour_version"]))
                                  if fresh.behaviour is not None else None))
    restore = getattr(parts.judge, "restore_sampling_state", None)
    if callable(restore) and meta.get("judge_sampling"):
        restore(meta["judge_sampling"])  # a local judge samples on from where it was
    return Resumed(loop, dict(changed), _counter_totals(meta))


def _check_behaviour(run: RunConfig, meta: Mapping[str, Any], where: str) -> None:
    """A checkpoint holds the off-policy sampler's weights exactly when its run had
    trainer.off_policy_steps=1; resuming it with the other value (an allowed change) cannot
    continue the same trajectory, and is refused."""
    has = "behaviour_version" in meta
    if has != bool(run.trainer.off_policy_steps):
        raise ConfigError(
            f"trainer.off_policy_steps: the checkpoint {where} was written with "
            f"trainer.off_policy_steps={int(has)} (it {'holds' if has else 'holds no'} the "
            f"sampler's weights), this run has {run.trainer.off_policy_steps}; resume with "
            f"{int(has)} or start a new run_dir")


def _judge_sampling(judge: Any) -> dict[str, Any]:
    """The judge's sampling position (a local judge's sampler call count), or {}."""
    state = getattr(judge, "sampling_state", None)
    return dict(state()) if callable(state) else {}


def _counter_totals(meta: Mapping[str, Any]) -> dict[str, float]:
    """The saved service counters; checkpoints of the previous format kept the judge's only,
    without their prefix."""
    if "counter_totals" in meta:
        return dict(meta["counter_totals"])
    return {f"judge/{k}": v for k, v in dict(meta.get("judge_totals", {})).items()}


def _record_config(trainer: Trainer, config_text: str, resumed: Resumed | None,
                   exchange: Exchange | None = None,
                   model: Mapping[str, Any] | None = None) -> None:
    """config.yaml: the config of the run's first steps (written when it starts, kept on
    resume); config_history.jsonl: one record per start or resume, with the changes allowed;
    provenance.jsonl: what made this start (``rl.run.provenance``; every process takes part),
    with the model loaded (:func:`job_model`) and the task's data (``task.data_provenance``)."""
    data = getattr(trainer.parts.task, "data_provenance", None)
    trainer.runlog.append_start({"start_step": trainer.start_step, **provenance(exchange),
                                 "model": dict(model or {}),
                                 "data": data() if callable(data) else None},
                                "provenance.jsonl")
    if config_text and resumed is None:
        trainer.runlog.write_config(config_text)
    trainer.runlog.config_history({
        "start_step": trainer.start_step, "resumed": resumed is not None,
        "allowed_changes": {k: list(v) for k, v in (resumed.changes if resumed else {}).items()},
        "config": dict(trainer.run_cfg.raw)})
