"""A LoRA run (``model.lora.rank > 0``): frozen base weights, trained adapters.

The train state's params are the adapters (``models.lora``), so the optimizer state and the
checkpoints hold adapters only; the base weights (the loaded model, or ``trainer.init_from``'s
weights) stay fixed in :class:`LoraRun` and are passed to the jitted update as an argument.

    rollouts and evaluation    merged(base, adapters): W + alpha/rank A @ B, plain weights
    update, old-policy pass    adapted(base, adapters): the factored LowRank forward
    KL reference               base itself (adapters off): no copy of the weights

A checkpoint records the base's fingerprint (SHA-256 of its arrays, ``lora_base`` in the
metadata); a resume or an export against other base weights is refused naming
``model.path`` (and ``trainer.init_from`` when set). ``python -m rl.export`` and ``rl.eval``
restore a LoRA run's checkpoint merged (:func:`restore_merged`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax

from models.config import ModelConfig
from models.lora import (
    LoraConfig,
    LoraError,
    adapted,
    base_fingerprint,
    check_model,
    init_adapters,
    merge,
    quantized_base,
)
from models.transformer import Params
from rl.grpo.optim import make_optimizer
from rl.grpo.train_step import init_train_state
from rl.run.checkpoint import Checkpointer
from rl.run.config import ConfigError, optim_config, section
from rl.run.folder import run_path

BASE_META = "lora_base"  # the checkpoint metadata entry naming the base weights
ADAPTER_SEED_SALT = 0x10A  # the adapters' init key: fold_in(key(trainer.seed), this)


@dataclasses.dataclass(frozen=True)
class LoraRun:
    config: LoraConfig
    base: Params  # float32 master weights, frozen
    fingerprint: str  # base_fingerprint(base)
    source: Mapping[str, str]  # {"model.path": ..., "trainer.init_from": ...}: where base is from

    def scoring(self, adapters: Params) -> Params:
        """The model parameters of the update's forward (the LoRA update kept factored)."""
        return adapted(self.base, adapters, self.config)

    def sampling(self, adapters: Params) -> Params:
        """Plain parameters with the adapters merged in (the sampler's)."""
        return merge(self.base, adapters, lora=self.config)

    def meta(self) -> dict[str, Any]:
        return {"sha256": self.fingerprint, **self.source}

    def check_checkpoint(self, meta: Mapping[str, Any], where: str) -> None:
        """ConfigError naming the key when the checkpoint's adapters were trained on another
        base."""
        check_base(meta.get(BASE_META), self.fingerprint, self.source, where)


def check_base(saved: Mapping[str, Any] | None, fingerprint: str,
               source: Mapping[str, str], where: str) -> None:
    """Refuse adapters whose base weights (`saved`, a checkpoint's ``lora_base``) are not
    these (`fingerprint` of the weights loaded from `source`)."""
    if saved is None:
        raise ConfigError(f"model.lora.rank: the checkpoint {where} holds no LoRA base "
                          f"fingerprint: it is not a LoRA run's")
    if saved.get("sha256") != fingerprint:
        keys = " / ".join(k for k in source if source[k]) or "model.path"
        raise ConfigError(
            f"{keys}: the checkpoint {where} holds LoRA adapters trained on other base "
            f"weights (base sha256 {str(saved.get('sha256'))[:16]}... from "
            f"{dict((k, v) for k, v in saved.items() if k != 'sha256')}; these weights "
            f"{fingerprint[:16]}... from {dict(source)}); adapters apply only to the base "
            f"they were trained on")


def lora_run(lora: LoraConfig, model_cfg: ModelConfig, base: Params,
             source: Mapping[str, str]) -> LoraRun | None:
    """The LoRA side of a run (None when model.lora.rank = 0); ConfigError naming the key
    when this model cannot take the adapters, before any compute."""
    if not lora.enabled:
        return None
    try:
        check_model(lora, model_cfg)
    except LoraError as e:
        raise ConfigError(str(e)) from None
    base = quantized_base(base, lora)
    return LoraRun(lora, base, base_fingerprint(base), dict(source))


def fresh_adapters(lr: LoraRun, seed: int, mesh: Any = None) -> Params:
    """The adapters a run starts from (B = 0: the base model's outputs exactly), replicated
    over the mesh when there is one (they are small)."""
    key = jax.random.fold_in(jax.random.key(seed), ADAPTER_SEED_SALT)
    adapters = init_adapters(lr.base, lr.config, key)
    if mesh is not None:
        from jax.sharding import NamedSharding, PartitionSpec

        adapters = jax.device_put(adapters, NamedSharding(mesh, PartitionSpec()))
    return adapters


def run_lora_config(run_cfg: Mapping[str, Any]) -> LoraConfig | None:
    """A run folder's model.lora (None: off, or a run from before LoRA existed)."""
    raw = dict(run_cfg.get("model") or {}).get("lora")
    if not raw:
        return None
    lora = section(LoraConfig, raw, "model.lora")
    return lora if lora.enabled else None


def restore_merged(run_dir: str | Path, run_cfg: Mapping[str, Any], base: Params,
                   lora: LoraConfig, step: int | None) -> tuple[Params, int]:
    """(merged params, step) of a LoRA run's checkpoint; `base` is the weights the run
    trained on (its model.path weights, with its trainer.init_from applied by the caller,
    ``rl.run.evaluation.restore_run_params``). The checkpoint's base fingerprint must match:
    ConfigError naming the key otherwise."""
    trainer = dict(run_cfg.get("trainer") or {})
    source = {"model.path": str(run_cfg["model"]["path"]),
              "trainer.init_from": str(trainer.get("init_from") or "")}
    base = quantized_base(base, lora)
    lr = LoraRun(lora, base, base_fingerprint(base), source)
    like = init_train_state(fresh_adapters(lr, 0),
                            make_optimizer(optim_config(run_cfg["optim"], 1)))
    ckpt = Checkpointer(run_path(str(run_dir)) / "checkpoints")
    step = ckpt.latest_step() if step is None else step
    if step is None:
        raise FileNotFoundError(f"{run_dir}/checkpoints: no checkpoint to load")
    restored, meta = ckpt.restore_verified(step, {"state": like._asdict()})
    ckpt.close()
    lr.check_checkpoint(meta, f"at step {step} in {run_dir}")
    return jax.device_get(lr.sampling(restored["state"]["params"])), step
