"""Optimizer from config: AdamW with global-norm clipping and a warm-up + constant/cosine
learning-rate schedule."""

from __future__ import annotations

import dataclasses

import optax


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    grad_clip: float = 1.0
    warmup_steps: int = 0
    schedule: str = "constant"  # constant | cosine
    total_steps: int = 1000
    min_lr_ratio: float = 0.1

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"optim.lr must be > 0, got {self.lr}")
        if self.schedule not in ("constant", "cosine"):
            raise ValueError(f"optim.schedule must be constant or cosine, got {self.schedule!r}")
        if self.warmup_steps < 0 or self.grad_clip < 0:
            raise ValueError("optim.warmup_steps and optim.grad_clip must be >= 0")


def lr_schedule(cfg: OptimConfig) -> optax.Schedule:
    """Linear warm-up from 0 to lr over warmup_steps, then constant or cosine to min_lr_ratio*lr."""
    if cfg.schedule == "cosine":
        decay = max(1, cfg.total_steps - cfg.warmup_steps)
        main = optax.cosine_decay_schedule(cfg.lr, decay, alpha=cfg.min_lr_ratio)
    else:
        main = optax.constant_schedule(cfg.lr)
    if cfg.warmup_steps == 0:
        return main
    warm = optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps)
    return optax.join_schedules([warm, main], [cfg.warmup_steps])


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
    parts = []
    if cfg.grad_clip > 0:
        parts.append(optax.clip_by_global_norm(cfg.grad_clip))
    parts.append(optax.adamw(lr_schedule(cfg), b1=cfg.betas[0], b2=cfg.betas[1], eps=cfg.eps,
                             weight_decay=cfg.weight_decay))
    return optax.chain(*parts)
