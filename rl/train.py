"""Command line: ``python -m rl.train [group=option ...] [key=value ...]`` (hydra).

    python -m rl.train                                   # embedded default, CPU, minutes
    python -m rl.train model=tiny trainer.max_steps=3    # smoke run
    python -m rl.train -m algo.beta=0,0.001 trainer.seed=0,1   # multirun sweep
"""

from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig, OmegaConf

from rl.compile_cache import use_compile_cache

log = logging.getLogger("rl.train")


def run(cfg: DictConfig) -> list[dict]:
    from absl import logging as absl_logging

    from rl.trainer import build_trainer

    absl_logging.set_verbosity(absl_logging.WARNING)  # orbax logs every file it writes

    resolved = OmegaConf.to_container(cfg, resolve=True)
    trainer = build_trainer(resolved, OmegaConf.to_yaml(resolved))
    log.info("run folder: %s", trainer.runlog.dir)
    history = trainer.run_with_eval()
    log.info("done: %d steps, last reward %.3f", len(history),
             history[-1]["reward/mean"] if history else float("nan"))
    return history


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    use_compile_cache(cfg.get("compile_cache"))
    run(cfg)


if __name__ == "__main__":
    main()
