"""Command line: ``python -m rl.train [group=option ...] [key=value ...]`` (hydra).

    python -m rl.train                                   # embedded default, CPU, minutes
    python -m rl.train model=tiny trainer.max_steps=3    # smoke run
    python -m rl.train -m algo.beta=0,0.001 trainer.seed=0,1   # multirun sweep
    python -m rl.train -m hydra/sweeper=optuna ...       # an optimising sweep (trainer.objective)

A start that fails (a bad key, file, split or option) exits with its message and leaves no
files behind: what this process created in the run folder and hydra's output folder is
removed; nothing that was there before is touched.
"""

from __future__ import annotations

import logging
import re
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from rl.run.compile_cache import use_compile_cache
from rl.run.folder import is_url
from rl.run.quiet import quiet_library_logs
from rl.run.resolve import resolved_config

log = logging.getLogger("rl.train")

# override keys that look like credentials: hydra would write them into .hydra/ before any
# code of ours runs, so they are refused from the command line itself
_SECRET_KEY = re.compile(r"(^|[._])(api_?key|secret|password|passwd|token|auth)$", re.I)


def secret_overrides(argv: Sequence[str]) -> list[str]:
    """The keys of `key=value` overrides in `argv` that name a credential."""
    keys = (a.split("=", 1)[0].lstrip("+~") for a in argv if "=" in a and not a.startswith("-"))
    return [k for k in keys if _SECRET_KEY.search(k)]


def _created_here(folder: Path, before: set[str], hydra_files: set[str]) -> list[Path]:
    """Entries of `folder` this start made: those new since `before`, and hydra's own files
    when the folder held nothing else (hydra made it for this run; in a folder with earlier
    content, such as a run being resumed, hydra's appended log is kept)."""
    if not folder.is_dir():
        return []
    fresh = not (before - hydra_files)
    return [p for p in folder.iterdir() if p.name not in before or fresh]


def _names(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()} if folder.is_dir() else set()


def _remove_created(folders: Sequence[Path], before: dict[Path, set[str]]) -> None:
    """Remove what this start made in `folders` (:func:`_created_here`)."""
    hydra_files = _hydra_files()
    _remove([p for f in folders for p in _created_here(f, before[f], hydra_files)], folders)


def _remove(paths: list[Path], folders: Sequence[Path]) -> None:
    for p in paths:
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
    for folder in folders:  # a folder this start created and left empty goes too
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def run(cfg: DictConfig) -> tuple[list[dict], dict[str, float]]:
    """Build and run the trainer: the step records, and the last logged value of every
    metric (evaluations included)."""
    from rl.run.trainer import build_trainer

    quiet_library_logs()

    hydra_dir = [d for d in (_hydra_output_dir(),) if d is not None]
    try:
        resolved = resolved_config(cfg)  # a preset's ${needs:KEY} left unset fails here
    except BaseException:
        _remove_created(hydra_dir, {d: _names(d) for d in hydra_dir})
        raise
    folders = _start_folders(resolved)
    before = {f: _names(f) for f in folders}
    try:
        trainer = build_trainer(resolved, OmegaConf.to_yaml(resolved))
    except BaseException:
        _remove_created(folders, before)
        raise
    for line in start_lines(trainer):
        log.info("%s", line)
    history = trainer.run_with_eval()
    for line in end_lines(trainer, history):
        log.info("%s", line)
    return history, dict(trainer.runlog.latest)


def start_lines(trainer: Any) -> list[str]:
    """What a run says first: where it writes, what it trains, on what, and how to watch it."""
    import jax

    run, folder = trainer.run_cfg, trainer.runlog.dir
    t, a, m = run.trainer, run.algo, run.model
    lora = f", LoRA rank {m.lora.rank}" if m.lora.rank else ""
    device = jax.devices()[0]
    mesh = trainer.parts.mesh
    mesh = f"mesh {dict(mesh.shape)}" if mesh is not None else "no mesh (one device)"
    watch = f"tail -f {folder}/metrics.jsonl"
    if "tensorboard" in t.loggers:
        watch += f"  |  tensorboard --logdir {folder}/tb"
    return [f"run folder: {folder}",
            f"model {m.path} ({m.dtype}{lora}), task {run.task.get('name')}, algo {a.name} "
            f"(rewarder {a.rewarder}, judge {run.judge_name}): steps {trainer.start_step}.."
            f"{t.max_steps}, {t.batch_prompts} prompts x {a.group_size} trajectories per step",
            f"devices: {jax.device_count()} x {device.device_kind} ({device.platform}), "
            f"{jax.process_count()} process(es), {mesh}",
            f"watch: {watch}"]


def end_lines(trainer: Any, history: list[dict]) -> list[str]:
    """What a run says last: how it ended, its evaluations, and where its results are."""
    from rl.run.config import eval_splits

    folder = trainer.runlog.dir
    lines = [f"done: {len(history)} steps, last reward "
             f"{history[-1]['reward/mean'] if history else float('nan'):.3f}"]
    if trainer.evaluations:
        splits = eval_splits(trainer.run_cfg.trainer)
        where = splits[0] if len(splits) == 1 else f"{', '.join(splits)} (their average)"
        lines.append(f"eval/outcome_mean on {where}: " + " -> ".join(
            f"{v:.3f} (step {s})" for s, v in sorted(trainer.evaluations.items())))
    if history and (line := judge_summary(history[-1])):
        lines.append(line)
    lines += [f"metrics: {folder}/metrics.jsonl", f"checkpoints: {trainer.ckpt.dir}"]
    return lines


def objective(key: str | None, latest: dict[str, float],
              evaluates: bool = True) -> float | None:
    """What ``rl.train`` returns to hydra (``trainer.objective``): the last logged value of
    that metric, e.g. ``eval/outcome_mean``, the final evaluation, so an optimising sweeper
    (Optuna, Nevergrad, Ax) has something to optimise. None when unset; None with a warning
    when the run never logged it, unless it is an evaluation metric of a run that never
    evaluates (`evaluates` false: nothing went wrong, there is nothing to return)."""
    if not key:
        return None
    if key not in latest:
        if evaluates or not key.startswith("eval/"):
            log.warning("trainer.objective: %s was never logged (e.g. eval/* with "
                        "trainer.eval_at_ends=false); returning nothing", key)
        return None
    return float(latest[key])


def judge_summary(last: dict) -> str:
    """The run's judging in one line, from its last record's cumulative ``judge/*`` counters
    (empty without a judge)."""
    if not any(k.startswith("judge/requests_") for k in last):
        return ""
    requests = sum(v for k, v in last.items() if k.startswith("judge/requests_"))
    line = (f"judge: {requests:.0f} requests, {last.get('judge/cache_hits', 0):.0f} cache hits, "
            f"{last.get('judge/prompt_tokens', 0):.0f} prompt + "
            f"{last.get('judge/completion_tokens', 0):.0f} completion tokens")
    if "judge/cost" in last:
        line += f", estimated cost {last['judge/cost']:.4f} (judge.price_per_mtok_in/out)"
    return line


def _start_folders(resolved: dict) -> list[Path]:
    """The run folder and hydra's output folder (the same folder by default); a run folder on
    object storage is not one of them (a failed start writes nothing there but checkpoints,
    which it does not reach)."""
    run_dir = str(resolved.get("trainer", {}).get("run_dir", ""))
    folders = [] if is_url(run_dir) else [Path(run_dir).absolute()]
    hydra_dir = _hydra_output_dir()
    if hydra_dir is not None and hydra_dir not in folders:
        folders.append(hydra_dir)
    return [f for f in folders if str(f) not in ("", "/")]


def _hydra_output_dir() -> Path | None:
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir).absolute() if HydraConfig.initialized() \
        else None


def _hydra_files() -> set[str]:
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return set()
    hc = HydraConfig.get()
    return {str(hc.output_subdir or ".hydra"), f"{hc.job.name}.log"}


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    quiet_library_logs()
    use_compile_cache(cfg.get("compile_cache"))
    _, latest = run(cfg)
    t = cfg.trainer
    return objective(t.get("objective"), latest,
                     evaluates=bool(t.get("eval_at_ends") or t.get("eval_every")))


if __name__ == "__main__":
    from rl.run.resolve import print_help_first

    print_help_first(__doc__)
    if secrets := secret_overrides(sys.argv[1:]):
        sys.exit(f"rl.train: {', '.join(secrets)}: credentials are not accepted on the command "
                 "line (hydra writes overrides into .hydra/); put the key in the environment "
                 "variable named by judge.api_key_env")
    main()
