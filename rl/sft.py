"""Supervised warm-up on task demonstrations: ``python -m rl.sft [key=value ...]`` (hydra).

A policy too small to follow a task's protocol (SmolLM2-135M never writes a well-formed
Search-R1 trajectory) gives GRPO only all-wrong groups, with zero advantages. A short SFT on
demonstrations (``task.demonstrations``: for ``search_qa``, oracle trajectories through the
real environment, rl/tasks/search/demos.py) teaches the format; RL then starts from it with
``trainer.init_from=<this run folder>``.

Loss over action tokens only (observations are context, not targets):
    L = -sum_{b,t} m_bt log p_theta(y_bt | y_<bt) / sum_{b,t} m_bt

The run folder holds the resolved config, ``metrics.jsonl`` (``sft/loss`` per step,
``sft/dev_loss`` before and after on held-out demonstrations), TensorBoard events, a few
demonstrations in ``samples.jsonl`` and the final checkpoint (the same format as ``rl.train``,
so ``rl.eval eval.run=<folder>`` and ``trainer.init_from=<folder>`` read it).

    python -m rl.sft task=search_qa sft.examples=128 optim.lr=1e-4
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import hydra
import jax
import jax.numpy as jnp
import numpy as np
import optax
from omegaconf import DictConfig, OmegaConf

from core.types import Group, Trajectory
from models.config import ModelConfig
from models.scoring import Scoring, group_logprobs
from models.transformer import Params
from rl.grpo.batch import trajectory_arrays
from rl.grpo.optim import lr_schedule, make_optimizer
from rl.grpo.train_step import Batch, TrainState, in_compute_dtype, init_train_state
from rl.run.compile_cache import use_compile_cache
from rl.run.quiet import quiet_library_logs
from rl.run.resolve import resolved_config

log = logging.getLogger("rl.sft")


def sft_loss(cfg: ModelConfig, params: Params, batch: Batch, remat: bool = False,
             compute_dtype: str = "float32") -> tuple[jax.Array, jax.Array]:
    """(mean NLL over masked response tokens, number of those tokens).

    batch: prefix, prefix_mask [N,P]; tokens, attn_mask, loss_mask [N,G,R] (``rl.grpo.batch``).
    """
    mask = batch["loss_mask"].astype(jnp.float32)
    params = in_compute_dtype(params, compute_dtype)  # float32 masters (see rl.grpo.train_step)
    logp = group_logprobs(cfg, params, batch["prefix"], batch["prefix_mask"], batch["tokens"],
                          batch["attn_mask"], scoring=Scoring(remat=remat))
    n = jnp.sum(mask)
    return -jnp.sum(logp * mask) / jnp.maximum(n, 1.0), n


def make_sft_step(cfg: ModelConfig, optimizer: optax.GradientTransformation,
                  lr_fn: Callable[[Any], Any] | None = None, remat: bool = False,
                  compute_dtype: str = "float32"
                  ) -> Callable[[TrainState, Batch], tuple[TrainState, dict]]:
    """The jitted ``sft_step(state, batch) -> (state, metrics)``: one optimizer update."""
    grad_fn = jax.value_and_grad(lambda p, b: sft_loss(cfg, p, b, remat, compute_dtype),
                                 has_aux=True)

    def sft_step(state: TrainState, batch: Batch) -> tuple[TrainState, dict]:
        (loss, n), grads = grad_fn(state.params, batch)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        metrics = {"sft/loss": loss, "sft/tokens": n, "grad_norm": optax.tree.norm(grads)}
        if lr_fn is not None:
            metrics["lr"] = jnp.asarray(lr_fn(state.step), jnp.float32)
        return TrainState(state.step + 1, optax.apply_updates(state.params, updates),
                          opt_state), metrics

    return jax.jit(sft_step, donate_argnums=(0,))


def demo_batch(trajs: Sequence[Trajectory], pad_id: int, resp_len: int) -> dict[str, Any]:
    """The training arrays of ``rl.grpo.batch``, one demonstration per group."""
    return trajectory_arrays([[t] for t in trajs], pad_id, resp_len)


def mean_loss(cfg: ModelConfig, params: Params, trajs: Sequence[Trajectory], pad_id: int,
              resp_len: int, batch_size: int) -> float:
    """Token-weighted NLL of ``trajs`` under ``params`` (held-out loss)."""
    loss_fn = jax.jit(lambda p, b: sft_loss(cfg, p, b))
    total = count = 0.0
    for i in range(0, len(trajs), batch_size):
        batch = demo_batch(trajs[i:i + batch_size], pad_id, resp_len)
        loss, n = loss_fn(params, {k: jnp.asarray(v) for k, v in batch.items()})
        total, count = total + float(loss) * float(n), count + float(n)
    return total / max(count, 1.0)


@dataclasses.dataclass(frozen=True)
class SftConfig:
    """The ``sft`` section of ``conf/sft.yaml`` (defaults live there)."""

    split: str
    examples: int
    epochs: int
    batch_size: int
    eval_split: str
    eval_examples: int


@dataclasses.dataclass(frozen=True)
class Demonstrations:
    """The task's demonstrations for a warm-up: training and held-out trajectories."""

    groups: list[Group]
    train: list[Trajectory]
    dev: list[Trajectory]
    outcome: float  # the demonstrations' mean task outcome
    resp_len: int  # the padded response length of every batch


def demonstrations(task: Any, tok: Any, s: SftConfig, max_new_tokens: int) -> Demonstrations:
    """``sft.examples`` training and ``sft.eval_examples`` held-out demonstrations."""
    groups = task.demonstrations(s.split, tok, n=s.examples, max_new_tokens=max_new_tokens)
    train = [g.trajectories[0] for g in groups]
    dev_groups = task.demonstrations(s.eval_split, tok, n=s.eval_examples,
                                     max_new_tokens=max_new_tokens) if s.eval_examples else []
    dev = [g.trajectories[0] for g in dev_groups]
    outcome = float(np.mean([task.outcome(g.prompt, g.trajectories[0]) for g in groups]))
    return Demonstrations(groups, train, dev, outcome, max(len(x.tokens) for x in train + dev))


def _checked(cfg: Mapping[str, Any]) -> tuple[Any, SftConfig, Any]:
    """(trainer section, sft section, model section) of an ``rl.sft`` config, checked."""
    from rl.run.config import ConfigError, ModelSection, TrainerConfig, section

    t = section(TrainerConfig, cfg["trainer"], "trainer")
    s = section(SftConfig, cfg["sft"], "sft")
    for key in ("examples", "epochs", "batch_size"):
        if getattr(s, key) < 1:
            raise ConfigError(f"sft.{key} must be >= 1, got {getattr(s, key)}")
    model = section(ModelSection, cfg["model"], "model")
    if model.lora.enabled:
        raise ConfigError(f"model.lora.rank: rl.sft trains all weights; LoRA is an rl.train "
                          f"option (set model.lora.rank=0 here), got {model.lora.rank}")
    return t, s, model


def _train(step_fn: Any, state: Any, demos: Demonstrations, s: SftConfig, pad_id: int,
           runlog: Any, progress: bool, seed: int) -> tuple[Any, int, dict[str, Any]]:
    """``sft.epochs`` shuffled passes over the demonstrations: (state, steps, last record)."""
    from tqdm import tqdm

    rng = np.random.default_rng(seed)
    record: dict[str, Any] = {}
    steps = s.epochs * -(-len(demos.train) // s.batch_size)
    bar = tqdm(total=steps, desc="sft", disable=not progress)
    step = 0
    for _ in range(s.epochs):
        order = rng.permutation(len(demos.train))
        for i in range(0, len(order), s.batch_size):
            t0 = time.perf_counter()
            batch = demo_batch([demos.train[j] for j in order[i:i + s.batch_size]], pad_id,
                               demos.resp_len)
            state, metrics = step_fn(state, {k: jnp.asarray(v) for k, v in batch.items()})
            metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
            record = runlog.metrics(step, {**metrics, "time/step_s": time.perf_counter() - t0})
            step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{metrics['sft/loss']:.3f}")
    bar.close()
    return state, step, record


def run(cfg: Mapping[str, Any], config_text: str = "") -> dict[str, Any]:
    """Train on demonstrations; returns the last metrics record."""
    from models import load_params
    from rl.run.checkpoint import Checkpointer
    from rl.run.config import ConfigError, optim_config
    from rl.run.runlog import RunLog
    from rl.run.wiring import make_task

    t, s, model = _checked(cfg)
    run_dir = Path(t.run_dir)
    ckpt = Checkpointer(run_dir / "checkpoints", keep=1)
    if ckpt.latest_step() is not None:
        raise ConfigError(f"trainer.run_dir: {run_dir} already holds checkpoints; choose "
                          f"another run_dir")
    task = make_task(cfg["task"])
    if not hasattr(task, "demonstrations"):
        raise ConfigError(f"task.name: task {cfg['task']['name']!r} has no demonstrations "
                          f"for SFT")
    # float32 master weights; model.dtype is the compute dtype
    model_cfg, params, tok = load_params(model.path, jnp.float32, seed=t.seed,
                                         revision=model.revision)
    tok = tok.with_template_kwargs(model.chat_template_kwargs)
    demos = demonstrations(task, tok, s, t.max_new_tokens)
    oc = optim_config(cfg["optim"], s.epochs * -(-len(demos.train) // s.batch_size))
    optimizer = make_optimizer(oc)
    step_fn = make_sft_step(model_cfg, optimizer, lr_schedule(oc), t.remat, model.dtype)
    state = init_train_state(params, optimizer)

    runlog = RunLog(run_dir, loggers=t.loggers, wandb=t.wandb, config=cfg)
    if config_text:
        runlog.write_config(config_text)
    runlog.samples(0, [{"prompt_id": g.prompt.id, "response": g.trajectories[0].text,
                        "outcome": task.outcome(g.prompt, g.trajectories[0])}
                       for g in demos.groups[:8]])
    log.info("%d demonstrations (mean outcome %.3f), %d held out, %d steps", len(demos.train),
             demos.outcome, len(demos.dev), oc.total_steps)
    held_out = functools.partial(mean_loss, model_cfg, trajs=demos.dev, pad_id=tok.pad_id,
                                 resp_len=demos.resp_len, batch_size=s.batch_size)
    if demos.dev:
        before = held_out(params=state.params)
        runlog.metrics(0, {"sft/dev_loss": before, "sft/demo_outcome": demos.outcome})
    state, step, record = _train(step_fn, state, demos, s, tok.pad_id, runlog, t.progress,
                                 t.seed)
    if demos.dev:
        record = runlog.metrics(step, {"sft/dev_loss": held_out(params=state.params)})
        log.info("held-out demonstration loss %.3f -> %.3f", before, record["sft/dev_loss"])
    ckpt.save(step, {"state": state._asdict()},
              {"step": step, "kind": "sft", "seed": t.seed, "data_position": 0})
    ckpt.close()
    runlog.close()
    return record


@hydra.main(config_path="../conf", config_name="sft", version_base="1.3")
def main(cfg: DictConfig) -> None:
    quiet_library_logs()
    use_compile_cache(cfg.get("compile_cache"))
    resolved = resolved_config(cfg)
    run(resolved, OmegaConf.to_yaml(resolved))
    log.info("run folder: %s", cfg.trainer.run_dir)


if __name__ == "__main__":
    from rl.run.resolve import print_help_first

    print_help_first(__doc__)
    main()
