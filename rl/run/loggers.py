"""Where a run's scalars go besides metrics.jsonl: TensorBoard and Weights & Biases, by name
(``trainer.loggers``). metrics.jsonl is the record of truth; these are views of it.

    tensorboard  run_dir/tb/ (tensorboardX); a resume purges the steps it trains again
    wandb        a W&B run (``trainer.wandb``): ``offline`` keeps it in run_dir/wandb/
                 (``wandb sync run_dir/wandb/offline-run-*`` uploads it later), ``online``
                 streams it and needs credentials (WANDB_API_KEY or ~/.netrc)

The W&B run id is kept in run_dir/wandb_id, so every resume of a run folder continues the
same W&B run. W&B keeps the first value logged for a step: the steps a resume trains again
keep their earlier (identical, when the resume is exact) values there.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from core.files import write_atomic
from core.registry import Registry

WANDB_MODES = ("offline", "online")


@dataclasses.dataclass(frozen=True)
class WandbOptions:
    project: str
    entity: str | None
    name: str | None  # null: the run folder's name
    group: str | None
    tags: tuple[str, ...]
    mode: str


class ScalarLogger(Protocol):
    def scalars(self, step: int, values: Mapping[str, float]) -> None: ...
    def close(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class LoggerContext:
    run_dir: Path
    resume_step: int | None  # the step a resumed run continues from (None: a fresh run)
    wandb: WandbOptions | None
    config: Mapping[str, Any]  # the resolved config, for loggers that record it


LOGGERS: Registry[Callable[[LoggerContext], ScalarLogger]] = Registry("logger")


class TensorBoardLogger:
    def __init__(self, ctx: LoggerContext):
        from tensorboardX import SummaryWriter

        self._writer = SummaryWriter(str(ctx.run_dir / "tb"), purge_step=ctx.resume_step)

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        for k, v in values.items():
            self._writer.add_scalar(k, v, step)

    def close(self) -> None:
        self._writer.close()


def wandb_credentials() -> bool:
    """Whether an online W&B run could authenticate (the key in the environment or netrc)."""
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    return bool(os.environ.get("WANDB_API_KEY")) or (
        netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="replace"))


def wandb_problem(options: WandbOptions) -> str | None:
    """Why these options cannot start a W&B run here (None: they can); checked before any
    compute by rl.run.config."""
    if options.mode not in WANDB_MODES:
        return f"mode must be one of {', '.join(WANDB_MODES)}, got {options.mode!r}"
    if options.mode == "online" and not wandb_credentials():
        return ("mode=online needs W&B credentials (WANDB_API_KEY or ~/.netrc) and the "
                "network; use mode=offline to keep the run in the run folder and `wandb sync` "
                "it later")
    try:
        import wandb  # noqa: F401
    except ImportError:
        return "the wandb package is not installed (pip install wandb)"
    return None


def _wandb_id(run_dir: Path) -> str:
    path = run_dir / "wandb_id"
    if path.exists():
        return path.read_text().strip()
    run_id = uuid.uuid4().hex[:12]
    write_atomic(path, run_id + "\n")
    return run_id


class WandbLogger:
    def __init__(self, ctx: LoggerContext):
        import wandb

        o = ctx.wandb
        if o is None:
            raise ValueError("trainer.loggers has wandb but trainer.wandb is not set")
        self._run = wandb.init(
            project=o.project, entity=o.entity, name=o.name or ctx.run_dir.name, group=o.group,
            tags=list(o.tags), mode=o.mode,  # type: ignore[arg-type]  # checked by the config
            dir=str(ctx.run_dir), id=_wandb_id(ctx.run_dir),
            resume="allow", config=dict(ctx.config),
            settings=wandb.Settings(silent=True, x_disable_stats=True))

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        self._run.log(dict(values), step=step)

    def close(self) -> None:
        """Finish the run with its transaction log on disk. `finish()` alone returns before
        W&B's service has flushed the run's .wandb file (it closes it asynchronously; under
        load a reader right after saw only its header), so the service is torn down too,
        unless another run of this process still uses it."""
        import wandb

        self._run.finish()
        if wandb.run is None:
            wandb.teardown()


LOGGERS.register("tensorboard")(TensorBoardLogger)
LOGGERS.register("wandb")(WandbLogger)


def open_loggers(names: Sequence[str], ctx: LoggerContext) -> list[ScalarLogger]:
    return [LOGGERS.get(n)(ctx) for n in names]
