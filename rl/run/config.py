"""The run configuration as one frozen, typed value, built once at the hydra boundary.

Every default lives in the ``conf/`` YAML; this module holds none. It converts the resolved
hydra mapping into dataclasses (a missing key, an unknown key or a value of the wrong type is a
:class:`ConfigError` naming the key) and checks the values the loop relies on, all before
anything loads. The library's own settings objects (``LossConfig``, ``OptimConfig``,
``SamplingParams``) are derived from it here, so each setting is read in one place.

Sections whose keys belong to a pluggable part are kept as plain mappings and checked by that
part: ``task`` (the task class's fields), ``judge`` (``judges.make_judge``) and the algorithm's
method-specific keys (``algo.method``: e.g. ARBOR's ``rubric_lambda``, which the YAML wires into
``rewarder_options``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal

from judges.cost import prices
from models.decode_attention import DECODE_KERNELS
from models.lora import LoraConfig, lora_problem
from models.sampler import SamplingParams
from rewards.qa_metrics import METRIC_SETS, NORMALIZERS
from rl.grpo.advantages import ADVANTAGE_EPS, ADVANTAGES
from rl.grpo.consistency import CONSISTENCY_FILTERS, CONSISTENCY_REWARDS, PROCESS_SCORED
from rl.grpo.kl import KL_ESTIMATORS
from rl.grpo.losses import LOSS_AGG, POLICY_LOSSES
from rl.grpo.optim import OptimConfig
from rl.grpo.reward_stage import OverlongShaping, RewardStageConfig
from rl.grpo.train_step import LossConfig
from rl.run.loggers import LOGGERS, WandbOptions, wandb_problem


class ConfigError(ValueError):
    """An invalid configuration value; raised before any compute starts."""


FILTER_METRICS = ("reward", "outcome")  # rl.grpo.dapo.dynamic_sample's filter_metric
ROLLOUT_DTYPES = ("float32", "bfloat16")  # the sampler's weights (decode_params)
KV_CACHE_DTYPES = ("float32", "bfloat16")  # the rollout's KV cache (SamplingParams)

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    max_steps: int
    objective: str | None  # the metric rl.train returns to hydra (an optimising sweeper's)
    batch_prompts: int
    ppo_epochs: int
    mini_batches: int
    micro_batches: int
    skip_zero_advantage: bool
    remat: bool
    logits_chunk: int  # score this many response positions at a time (0: all at once)
    max_new_tokens: int
    temperature: float
    top_p: float
    rollout_dtype: str
    kv_cache_dtype: str  # the rollout's KV cache: float32 | bfloat16 (attention in float32)
    eval_dtype: str | None  # evaluation's weights and cache (None: the rollout's)
    prefill_pin_rows: bool  # the rollout prefill's activations pinned to the rows (sampler)
    decode_kernel: str  # the decode step's cache attention (models.decode_attention)
    shared_prompts: bool  # a group's rows share their prompt's cache (models.prompt_sharing)
    rollout_sub_batches: bool  # continuations gather their rows (SamplingParams.sub_batches)
    rollout_chunks: int  # the rollout in this many sampler calls (rl.run.loop.rollout_in_chunks)
    seed: int
    run_dir: str
    resume: Literal[False, True, "auto"]  # auto: resume when a checkpoint exists, else start
    resume_allow_changes: tuple[str, ...]  # settings a resume may change (rl.run.resume)
    init_from: str | None
    save_every: int
    keep_checkpoints: int | Literal["all"]
    sample_every: int
    eval_split: str | tuple[str, ...]  # several: each logged as eval/<split>/*, eval/* averaged
    eval_batch_size: int
    eval_every: int
    eval_at_ends: bool
    progress: bool
    ignore_eos: bool
    off_policy_steps: int  # 0 on-policy; 1: one step stale rollouts (rl.grpo.off_policy)
    loggers: tuple[str, ...]  # rl.run.loggers.LOGGERS names: tensorboard, wandb
    wandb: WandbOptions


@dataclasses.dataclass(frozen=True)
class OverlongConfig:
    enabled: bool
    max_len: int | None  # L_max; null = the response budget
    buffer_len: int | None  # B; null = buffer_frac x L_max
    buffer_frac: float
    penalty: float


@dataclasses.dataclass(frozen=True)
class AlgoConfig:
    name: str
    group_size: int
    advantage: str
    std_ddof: int  # GRPO's group std: 1 = sample std (verl, TRL), 0 = population std
    whiten: str  # REINFORCE++'s batch whitening: trajectory (each once) | token (verl)
    reward_components: str  # sum (advantage of the total) | gdpo (outcome and rest apart)
    component_weights: tuple[float, ...]  # gdpo: weights of (outcome, rest)
    eps_low: float
    eps_high: float
    dual_clip: float | None
    beta: float
    kl_estimator: str
    loss_agg: str
    policy_loss: str
    entropy_coef: float
    dynamic_sampling: bool
    max_gen_batches: int
    filter_metric: str  # what dynamic sampling must see vary in a group: reward | outcome
    consistency_filter: str  # none | prof (rl.grpo.consistency)
    consistency_remove: int  # prof: trajectories removed from each group
    consistency_reward: str  # prof: outcome (R_base alone, as PROF) | total (rubric term kept)
    correct_at: float  # the outcome at or above which an answer is correct (PROF, gate, monitors)
    overlong: OverlongConfig
    rewarder: str
    rewarder_options: Mapping[str, Any]
    method: Mapping[str, Any]  # the algorithm's own keys (interpolated into rewarder_options)


@dataclasses.dataclass(frozen=True)
class ModelSection:
    path: str
    revision: str | None  # a hub id's branch, tag or commit (models.hub)
    chat_template_kwargs: Mapping[str, Any]  # passed to every chat template render
    dtype: str
    lora: LoraConfig  # model.lora.{rank,alpha,targets}; rank 0 = off (models.lora)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    shape: Mapping[str, int]
    coordinator: str | None
    num_processes: int | None
    process_id: int | None
    connect_timeout_s: int
    heartbeat_timeout_s: int
    wait_timeout_s: int
    rollout_shape: Mapping[str, int] | None = None  # the rollout's mesh (None: the training's)
    # each axis's part across nodes or slices (None: data first; models.device_mesh)
    dcn_shape: Mapping[str, int] | None = None
    # the devices each process uses: auto | jax | [ids] (core.local_devices)
    local_device_ids: tuple[int, ...] | Literal["auto", "jax"] = "auto"
    allow_idle_devices: bool = False  # start even when some of a node's GPUs would stay idle
    expect_devices: int | None = None  # the job's device count, checked once it has formed


@dataclasses.dataclass(frozen=True)
class OptimSection:
    lr: float
    weight_decay: float
    grad_clip: float
    warmup_steps: int
    schedule: str
    min_lr_ratio: float


@dataclasses.dataclass(frozen=True)
class EvalSection:
    """``python -m rl.eval``'s ``eval`` section (``conf/eval/default.yaml``)."""

    run: str | None
    step: int | None
    splits: tuple[str, ...]
    max_examples: int | None
    batch_size: int
    max_new_tokens: int | None
    out_dir: str | None
    metrics: str  # a rewards.qa_metrics.METRIC_SETS name, or "auto" (by dataset name)
    metrics_by_split: Mapping[str, str]  # split -> metric set, overriding `metrics`
    normalize: str | None  # a NORMALIZERS name overriding each set's own; null: the set's
    samples: int  # 1: greedy; k > 1: k sampled answers per prompt (mean@k, pass@k)
    temperature: float  # the sampling temperature when samples > 1
    confidence: float  # the bootstrap intervals' level
    bootstrap: int  # the bootstrap's resamples
    dtype: str | None  # weights and KV cache (None: trainer.rollout_dtype, kv_cache_dtype)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """The whole ``rl.train`` configuration (``conf/config.yaml`` and its groups)."""

    model: ModelSection
    algo: AlgoConfig
    task: Mapping[str, Any]
    judge: Mapping[str, Any]
    mesh: MeshConfig
    trainer: TrainerConfig
    optim: OptimSection
    raw: Mapping[str, Any]  # the resolved mapping it was built from (config.yaml, fingerprints)

    @property
    def judge_name(self) -> str:
        return str(self.judge.get("name", "none"))

    @property
    def updates_per_batch(self) -> int:
        return self.trainer.ppo_epochs * self.trainer.mini_batches

    def loss_config(self, response_budget: int) -> LossConfig:
        """The update's loss settings; `response_budget` is Dr.GRPO's constant normaliser."""
        a, t = self.algo, self.trainer
        return LossConfig(
            policy_loss=a.policy_loss, eps_low=a.eps_low, eps_high=a.eps_high,
            dual_clip=a.dual_clip, beta=a.beta,
            kl_estimator=a.kl_estimator, loss_agg=a.loss_agg, max_len_norm=response_budget,
            entropy_coef=a.entropy_coef,
            # off-policy: logp_old is the sampler's (the behaviour policy), never logp itself
            on_policy=self.updates_per_batch == 1 and self.trainer.off_policy_steps == 0,
            micro_batches=t.micro_batches, remat=t.remat, compute_dtype=self.model.dtype,
            temperature=t.temperature, logits_chunk=t.logits_chunk)

    def optim_config(self) -> OptimConfig:
        return optim_config(dataclasses.asdict(self.optim),
                            self.trainer.max_steps * self.updates_per_batch)

    def sampling(self) -> SamplingParams:
        t = self.trainer
        return SamplingParams(max_new_tokens=t.max_new_tokens, temperature=t.temperature,
                              top_p=t.top_p, ignore_eos=t.ignore_eos)


def optim_config(optim: Mapping[str, Any], total_steps: int) -> OptimConfig:
    """The optimizer settings of an ``optim`` config section (``conf/optim``; rl.train, rl.sft
    and run folders read back by rl.eval), over `total_steps` optimizer updates."""
    o = section(OptimSection, optim, "optim")
    try:
        return OptimConfig(lr=o.lr, weight_decay=o.weight_decay, grad_clip=o.grad_clip,
                           warmup_steps=o.warmup_steps, schedule=o.schedule,
                           total_steps=total_steps, min_lr_ratio=o.min_lr_ratio)
    except ValueError as e:  # OptimConfig checks its own values; name them as config errors
        raise ConfigError(str(e)) from None


def eval_config(data: Mapping[str, Any]) -> EvalSection:
    """The checked ``eval`` section of an ``rl.eval`` config."""
    e = section(EvalSection, data, "eval")
    _require(e.batch_size >= 1, "eval.batch_size", f"must be >= 1, got {e.batch_size}")
    _require(len(e.splits) >= 1, "eval.splits", "name at least one split")
    _require(e.metrics == "auto" or e.metrics in METRIC_SETS, "eval.metrics",
             f"must be auto or one of {METRIC_SETS.names()}, got {e.metrics!r}")
    for split, name in e.metrics_by_split.items():
        key = f"eval.metrics_by_split.{split}"
        _require(split in e.splits, key, f"not an evaluated split (eval.splits: {e.splits})")
        _require(name in METRIC_SETS, key, f"must be one of {METRIC_SETS.names()}, got {name!r}")
    _require(e.normalize is None or e.normalize in NORMALIZERS, "eval.normalize",
             f"must be null or one of {NORMALIZERS.names()}, got {e.normalize!r}")
    _require(e.samples >= 1, "eval.samples", f"must be >= 1 (1: greedy), got {e.samples}")
    _require(e.temperature > 0, "eval.temperature", f"must be > 0, got {e.temperature}")
    _require(0 < e.confidence < 1, "eval.confidence", f"must be in (0, 1), got {e.confidence}")
    _require(e.bootstrap >= 1, "eval.bootstrap", f"must be >= 1, got {e.bootstrap}")
    _require(e.dtype is None or e.dtype in ROLLOUT_DTYPES, "eval.dtype",
             f"must be null (the run's rollout dtype) or one of {', '.join(ROLLOUT_DTYPES)}, "
             f"got {e.dtype}")
    return e


# ------------------------------------------------------------------------------ conversion


def _describe(kind: Any) -> str:
    """How an error message names the values of type `kind`."""
    if typing.get_origin(kind) is Literal:
        return " or ".join(_yaml(o) for o in typing.get_args(kind))
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(
        kind, getattr(kind, "__name__", str(kind)))


def _yaml(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _convert_union(value: Any, kind: Any, key: str) -> Any:
    """`value` as the first option of the union `kind` that takes it (None when allowed)."""
    options = [k for k in typing.get_args(kind) if k is not type(None)]
    if value is None and len(options) < len(typing.get_args(kind)):
        return None
    if len(options) == 1:
        return _convert(value, options[0], key)
    for option in options:
        try:
            return _convert(value, option, key)
        except ConfigError:
            pass
    raise ConfigError(f"{key}: expected {' or '.join(map(_describe, options))}, got {value!r}")


def _convert(value: Any, kind: Any, key: str) -> Any:
    """`value` as the annotated type `kind` (int, float, bool, str, Mapping, Literal[...],
    tuple[str, ...], a union of them or X | None, or a section dataclass), or a ConfigError
    naming `key`."""
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        return _convert_union(value, kind, key)
    if origin is Literal:  # exact values: true is not 1
        if not any(value == o and type(value) is type(o) for o in typing.get_args(kind)):
            raise ConfigError(f"{key}: expected {_describe(kind)}, got {value!r}")
        return value
    if origin is tuple:
        if value is None:
            return ()
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return tuple(_convert(v, typing.get_args(kind)[0], f"{key}[{i}]")
                     for i, v in enumerate(value))
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return section(kind, value, key)
    if origin is Mapping or kind is Mapping:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    return _convert_scalar(value, kind, key)


def _convert_scalar(value: Any, kind: Any, key: str) -> Any:
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if kind in (int, float):
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        try:
            number = float(value)
        except ValueError:
            raise ConfigError(f"{key}: expected a number, got {value!r}") from None
        if kind is int and number != int(number):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return int(number) if kind is int else number
    if kind is str:
        if isinstance(value, Mapping | list):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return str(value)
    raise TypeError(f"{key}: no conversion for {kind!r}")


def section(kind: type, data: Any, prefix: str, rest: str | None = None) -> Any:
    """The dataclass `kind` from mapping `data` (keys under `prefix`). Unknown keys are errors,
    unless `rest` names a Mapping field that collects them."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(kind)
    names = [f.name for f in dataclasses.fields(kind) if f.name != rest]
    missing = [n for n in names if n not in data]
    if missing:
        raise ConfigError(f"{prefix}.{missing[0]}: missing (every default lives in conf/)")
    extra = {k: v for k, v in data.items() if k not in names}
    if extra and rest is None:
        raise ConfigError(f"{prefix}.{sorted(extra)[0]}: unknown key (known: "
                          f"{', '.join(names)})")
    values = {n: _convert(data[n], hints[n], f"{prefix}.{n}") for n in names}
    if rest is not None:
        values[rest] = dict(extra)
    return kind(**values)


def parse(cfg: Mapping[str, Any]) -> RunConfig:
    """Convert and check a resolved ``rl.train`` config mapping."""
    known = {f.name for f in dataclasses.fields(RunConfig)} - {"raw"}
    extra = sorted(set(cfg) - known - {"compile_cache", "eval", "hydra", "imports"})
    if extra:
        raise ConfigError(f"{extra[0]}: unknown top-level key")
    for name in ("task", "judge"):
        if not isinstance(cfg.get(name), Mapping) or "name" not in cfg[name]:
            raise ConfigError(f"{name}.name: missing")
    cfg = with_paper_loss_agg(cfg)
    run = RunConfig(
        model=section(ModelSection, cfg.get("model"), "model"),
        algo=section(AlgoConfig, cfg.get("algo"), "algo", rest="method"),
        task=dict(cfg["task"]), judge=dict(cfg["judge"]),
        mesh=section(MeshConfig, cfg.get("mesh"), "mesh"),
        trainer=section(TrainerConfig, cfg.get("trainer"), "trainer"),
        optim=section(OptimSection, cfg.get("optim"), "optim"),
        raw=cfg)
    check(run)
    return run


#: each policy loss's aggregation as its paper defines it: what ``algo.loss_agg=auto`` means
#: (PPO-clip as GRPO uses it: the mean over a sequence's tokens, then over sequences,
#: arXiv:2402.03300; GSPO: sequence-level, arXiv:2507.18071; CISPO: token-mean over the
#: batch, arXiv:2506.13585)
PAPER_LOSS_AGG = {"ppo": "seq-mean-token-mean", "gspo": "seq-mean-token-mean",
                  "gspo_token": "seq-mean-token-mean", "cispo": "token-mean"}


def with_paper_loss_agg(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """`cfg` with ``algo.loss_agg: auto`` replaced by the policy loss's paper aggregation
    (:data:`PAPER_LOSS_AGG`), so the resolved value is what a checkpoint records."""
    algo = cfg.get("algo")
    if not isinstance(algo, Mapping) or algo.get("loss_agg") != "auto":
        return cfg
    loss = algo.get("policy_loss")
    if loss not in PAPER_LOSS_AGG:
        raise ConfigError(f"algo.loss_agg=auto: no paper aggregation known for "
                          f"algo.policy_loss={loss!r}; set algo.loss_agg")
    return {**cfg, "algo": {**algo, "loss_agg": PAPER_LOSS_AGG[loss]}}


# ------------------------------------------------------------------------------ checks


def _require(ok: bool, key: str, msg: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {msg}")


def check_advantage_options(a: AlgoConfig) -> None:
    """algo.whiten, algo.reward_components and its weights (``rl.grpo.advantages``)."""
    _require(a.whiten in ("trajectory", "token"), "algo.whiten",
             f"must be trajectory or token, got {a.whiten!r}")
    _require(a.reward_components in ("sum", "gdpo"), "algo.reward_components",
             f"must be sum or gdpo, got {a.reward_components!r}")
    _require(len(a.component_weights) == 2, "algo.component_weights",
             f"needs two weights (outcome, rest of the reward), got {list(a.component_weights)}")
    if a.reward_components == "gdpo":
        _require(a.advantage == "grpo", "algo.reward_components",
                 f"gdpo normalises each component as GRPO does; algo.advantage={a.advantage} "
                 "would be ignored (set algo.advantage=grpo)")


def check_batch_layout(run: RunConfig) -> None:
    """The rollout batch's trajectories cut into mini-batches x micro-batches."""
    t = run.trainer
    rows = t.batch_prompts * run.algo.group_size
    _require(rows % t.mini_batches == 0, "trainer.mini_batches",
             f"batch of {rows} trajectories does not split into {t.mini_batches} mini-batches")
    per_update = t.mini_batches * t.micro_batches
    _require(rows % per_update == 0, "trainer.micro_batches",
             f"batch of {rows} trajectories does not split into mini_batches x micro_batches "
             f"= {t.mini_batches} x {t.micro_batches}")


def _warn_about_papers_settings(a: AlgoConfig) -> None:
    """Warnings for settings that run, but not as their paper defines them."""
    if a.reward_components == "gdpo" and a.rewarder == "rubric":
        log.warning("algo.reward_components=gdpo with algo.rewarder=rubric: this rewarder's "
                    "outcome is the additive checklist coverage, so GDPO normalises coverage as a "
                    "component of its own beside (reward - coverage), weights "
                    "algo.component_weights=%s: the additive signal a protocol reward replaces "
                    "comes back; algo.reward_components=sum trains the arm as defined",
                    list(a.component_weights))
    paper = PAPER_LOSS_AGG.get(a.policy_loss)
    if a.policy_loss != "ppo" and paper is not None and a.loss_agg != paper:
        log.warning("algo.policy_loss=%s is defined with %s aggregation (its paper); this run "
                    "aggregates with algo.loss_agg=%s (set by the algo config or by you); set "
                    "algo.loss_agg=%s for the paper's", a.policy_loss, paper, a.loss_agg, paper)


def check(run: RunConfig) -> None:
    """Check the values the loop relies on, naming the offending key."""
    a, t = run.algo, run.trainer
    _warn_about_papers_settings(a)
    problem = lora_problem(run.model.lora)
    _require(problem is None, *(problem or ("", "")))
    _require(a.group_size >= 2, "algo.group_size", f"must be >= 2, got {a.group_size}")
    _require(a.std_ddof in (0, 1), "algo.std_ddof", f"must be 0 or 1, got {a.std_ddof}")
    check_advantage_options(a)
    for key in ("eps_low", "eps_high", "beta", "entropy_coef"):
        _require(getattr(a, key) >= 0, f"algo.{key}", f"must be >= 0, got {getattr(a, key)}")
    _require(a.dual_clip is None or a.dual_clip > 1, "algo.dual_clip", "must be > 1 or null")
    check_trainer(t)
    _require(0 < t.top_p <= 1, "trainer.top_p", "must be in (0, 1]")
    _require(t.rollout_dtype in ROLLOUT_DTYPES, "trainer.rollout_dtype",
             f"must be one of {', '.join(ROLLOUT_DTYPES)}, got {t.rollout_dtype}")
    _require(t.kv_cache_dtype in KV_CACHE_DTYPES, "trainer.kv_cache_dtype",
             f"must be one of {', '.join(KV_CACHE_DTYPES)}, got {t.kv_cache_dtype}")
    _require(t.decode_kernel in DECODE_KERNELS, "trainer.decode_kernel",
             f"must be one of {', '.join(DECODE_KERNELS)}, got {t.decode_kernel}")
    _require(t.eval_dtype is None or t.eval_dtype in ROLLOUT_DTYPES, "trainer.eval_dtype",
             f"must be null (the rollout's) or one of {', '.join(ROLLOUT_DTYPES)}, got "
             f"{t.eval_dtype}")
    check_batch_layout(run)
    _require(t.rollout_chunks >= 1 and t.batch_prompts % t.rollout_chunks == 0,
             "trainer.rollout_chunks", f"must be >= 1 and divide trainer.batch_prompts = "
             f"{t.batch_prompts}, got {t.rollout_chunks}")
    check_off_policy(run)
    for key in ("connect_timeout_s", "heartbeat_timeout_s", "wait_timeout_s"):
        _require(getattr(run.mesh, key) >= 1, f"mesh.{key}",
                 f"must be >= 1 second, got {getattr(run.mesh, key)}")
    if a.dynamic_sampling:
        _require(a.max_gen_batches >= 1, "algo.max_gen_batches", "must be >= 1")
    _require(a.filter_metric in FILTER_METRICS, "algo.filter_metric",
             f"must be one of {list(FILTER_METRICS)}, got {a.filter_metric!r}")
    check_consistency_filter(a)
    try:
        prices(run.judge)
    except (TypeError, ValueError) as e:
        raise ConfigError(str(e)) from None
    for key, registry in (("advantage", ADVANTAGES), ("kl_estimator", KL_ESTIMATORS),
                          ("loss_agg", LOSS_AGG), ("policy_loss", POLICY_LOSSES)):
        _require(getattr(a, key) in registry, f"algo.{key}",
                 f"must be one of {registry.names()}, got {getattr(a, key)!r}")
    _require(a.dual_clip is None or a.policy_loss == "ppo", "algo.dual_clip",
             f"is a PPO-clip option; algo.policy_loss={a.policy_loss} has none (set null)")
    if a.overlong.enabled:
        _require(a.overlong.penalty >= 0, "algo.overlong.penalty",
                 f"must be >= 0, got {a.overlong.penalty}")
        _require(0 <= a.overlong.buffer_frac < 1, "algo.overlong.buffer_frac",
                 f"must be in [0, 1), got {a.overlong.buffer_frac}")
        _require(a.overlong.max_len is None or a.overlong.max_len >= 1, "algo.overlong.max_len",
                 f"must be >= 1 or null, got {a.overlong.max_len}")
    run.optim_config()  # the optimizer's own checks


def check_trainer(t: TrainerConfig) -> None:
    """The trainer section's counts, sampling, evaluation splits and loggers."""
    for key in ("max_steps", "batch_prompts", "ppo_epochs", "mini_batches", "micro_batches",
                "max_new_tokens", "eval_batch_size"):
        _require(getattr(t, key) >= 1, f"trainer.{key}", f"must be >= 1, got {getattr(t, key)}")
    _require(t.keep_checkpoints == "all" or t.keep_checkpoints >= 1, "trainer.keep_checkpoints",
             f"must be >= 1, or all to keep every checkpoint, got {t.keep_checkpoints}")
    _require(t.temperature > 0, "trainer.temperature", "must be > 0 for RL sampling")
    splits = eval_splits(t)
    _require(len(splits) >= 1 and len(set(splits)) == len(splits), "trainer.eval_split",
             f"name one split or several distinct ones, got {list(splits)}")
    _require(t.logits_chunk >= 0, "trainer.logits_chunk",
             f"must be >= 0 (0: all positions at once), got {t.logits_chunk}")
    for i, name in enumerate(t.loggers):
        _require(name in LOGGERS, f"trainer.loggers[{i}]",
                 f"must be one of {LOGGERS.names()}, got {name!r}")
    if "wandb" in t.loggers:
        problem = wandb_problem(t.wandb)
        _require(problem is None, "trainer.wandb.mode" if problem and "mode" in problem
                 else "trainer.loggers", str(problem))


def eval_splits(t: TrainerConfig) -> tuple[str, ...]:
    """trainer.eval_split as a tuple: one split, or the several a run evaluates."""
    return (t.eval_split,) if isinstance(t.eval_split, str) else tuple(t.eval_split)


def check_consistency_filter(a: AlgoConfig) -> None:
    """algo.consistency_filter=prof needs a per-trajectory process score (a rubric rewarder)
    and leaves at least 2 trajectories per group to compare."""
    _require(a.consistency_filter in CONSISTENCY_FILTERS, "algo.consistency_filter",
             f"must be one of {list(CONSISTENCY_FILTERS)}, got {a.consistency_filter!r}")
    _require(a.consistency_reward in CONSISTENCY_REWARDS, "algo.consistency_reward",
             f"must be one of {list(CONSISTENCY_REWARDS)}, got {a.consistency_reward!r}")
    _require(math.isfinite(a.correct_at), "algo.correct_at",
             f"must be a finite outcome value, got {a.correct_at}")
    if a.consistency_filter == "none":
        return
    _require(a.rewarder in PROCESS_SCORED, "algo.consistency_filter",
             f"prof ranks trajectories by a process score, which only the rewarders "
             f"{list(PROCESS_SCORED)} report (algo=arbor, algo=rar); algo.rewarder is "
             f"{a.rewarder!r}")
    _require(1 <= a.consistency_remove <= a.group_size - 2, "algo.consistency_remove",
             f"must be in [1, algo.group_size - 2] (= {a.group_size - 2}): prof keeps at least "
             f"2 trajectories per group, got {a.consistency_remove}")


def overlong_max_len(run: RunConfig, budget: int) -> int:
    """DAPO's L_max: algo.overlong.max_len tokens (null: the response budget)."""
    value = run.algo.overlong.max_len
    return budget if value is None else int(value)


def check_off_policy(run: RunConfig) -> None:
    """trainer.off_policy_steps: 0 or 1 (one step of staleness; deeper queues are not built),
    and 1 only in one process: a second host thread dispatching the rollout while the main
    thread dispatches the update would launch a multi-process job's collectives in a different
    order on each process. DAPO's dynamic sampling and ARBOR's memory pipeline as they are:
    every draw of a step samples from the same snapshot and filters on rewards only, and the
    memory the next rollout is scored against is the one this step's rollout left, which the
    update does not touch."""
    t = run.trainer
    _require(t.off_policy_steps in (0, 1), "trainer.off_policy_steps",
             f"must be 0 (on-policy) or 1 (one-step off-policy), got {t.off_policy_steps}")
    check_job_size(run, run.mesh.num_processes or 1, "mesh.num_processes")


def check_devices(mesh: MeshConfig, env: Mapping[str, str], local: int, total: int,
                  processes: int) -> None:
    """The job's devices against what it should have: a node whose GPUs some of its processes
    leave idle (``core.local_devices.idle_gpus``; ``mesh.allow_idle_devices=true`` proceeds)
    and ``mesh.expect_devices``; ConfigError with the numbers."""
    from core.local_devices import idle_gpus

    if not mesh.allow_idle_devices and (why := idle_gpus(env, local)):
        raise ConfigError(f"mesh.allow_idle_devices: {why}")
    if mesh.expect_devices is not None:
        _require(total == mesh.expect_devices, "mesh.expect_devices",
                 f"={mesh.expect_devices}, but the job has {total} devices ({processes} "
                 f"process(es), {local} on this one)")


def check_job_size(run: RunConfig, processes: int, source: str = "jax.process_count()") -> None:
    """The settings that need a single process (trainer.off_policy_steps=1, see
    :func:`check_off_policy`), against the job's process count: the configured one before
    joining, the joined job's after (a cluster JAX found by itself configures none)."""
    if run.trainer.off_policy_steps:
        _require(processes == 1, "trainer.off_policy_steps",
                 f"=1 runs the rollout on a second host thread, which a multi-process job "
                 f"({source}={processes}) cannot order the same way on every process; set "
                 f"trainer.off_policy_steps=0")


def overlong_buffer(run: RunConfig, budget: int) -> int:
    """DAPO's soft-punishment buffer: algo.overlong.buffer_len tokens before L_max
    (``overlong_max_len``; null: algo.overlong.buffer_frac of it, rounded down: DAPO used 4,096
    of 20,480, the ProRubric authors 4,096 of 8,192)."""
    o = run.algo.overlong
    max_len = overlong_max_len(run, budget)
    buffer = int(max_len * o.buffer_frac) if o.buffer_len is None else o.buffer_len
    _require(0 <= buffer < max_len, "algo.overlong.buffer_len",
             f"must be in [0, {max_len}) (L_max: algo.overlong.max_len, null = the response "
             f"budget), got {buffer}")
    return buffer


# ------------------------------------------------------------------------------ rl.plan


@dataclasses.dataclass(frozen=True)
class PlanConfig:
    """``python -m rl.plan``'s own section (``conf/plan.yaml``): what to compile for."""

    topology: str        # a TPU slice (v5e:4x4, ...), GPUs (h100:8: an estimate) or cpu
    model_shapes: str    # a shape preset (models.shapes) or a config.json path / HF folder
    prompt_len: int      # prompt tokens per group (the batch's prefix length)
    response_budget: int  # most tokens a trajectory holds after its prompt
    rollout_fit: bool    # also search the largest rollout batch that fits (more compiles)
    slices: int = 1      # TPU slices of plan.topology, joined over the data-centre network


def parse_plan(cfg: Mapping[str, Any]) -> tuple[RunConfig, PlanConfig]:
    """An ``rl.plan`` config: the ``rl.train`` config (:func:`parse`) and its ``plan``
    section, each key checked."""
    rest = {k: v for k, v in cfg.items() if k != "plan"}
    plan = section(PlanConfig, cfg.get("plan"), "plan")
    for key in ("prompt_len", "response_budget", "slices"):
        _require(getattr(plan, key) >= 1, f"plan.{key}", f"must be >= 1, got "
                 f"{getattr(plan, key)}")
    return parse(rest), plan


def overlong_shaping(run: RunConfig, budget: int) -> OverlongShaping | None:
    """algo.overlong as the stage reads it (L_max: algo.overlong.max_len, null = the response
    `budget`; B: ``overlong_buffer``), or None when it is off."""
    ov = run.algo.overlong
    if not ov.enabled:
        return None
    return OverlongShaping(overlong_max_len(run, budget), overlong_buffer(run, budget),
                           float(ov.penalty))


def reward_stage_config(run: RunConfig, budget: int) -> RewardStageConfig:
    """The stage's settings from the RunConfig and the response budget (tokens after the
    prompt)."""
    a = run.algo
    return RewardStageConfig(advantage=a.advantage, eps=ADVANTAGE_EPS, std_ddof=a.std_ddof,
                             whiten=a.whiten, reward_components=a.reward_components,
                             component_weights=tuple(float(w) for w in a.component_weights),
                             overlong=overlong_shaping(run, budget))
