"""A reward of your own: the task's outcome plus a small bonus for short answers.

Shows the ``core.types.Rewarder`` protocol and how to plug a rewarder in without editing the
library: register a factory under a name in ``rl.run.wiring.REWARDERS``, then select it with
``algo.rewarder=<name>`` (its keyword options come from ``algo.rewarder_options``). Trains 2
GRPO steps of the tiny random model on the arithmetic task (CPU, under a minute):

    python examples/custom_reward.py
    python examples/custom_reward.py trainer.max_steps=5 trainer.run_dir=runs/short  # overrides

Importing this module registers the rewarder, so the command line can use it too (``imports``
names the modules to import first; PYTHONPATH says where this one is):

    PYTHONPATH=examples python -m rl.train imports=[custom_reward] algo.rewarder=short_answers \
        +algo.rewarder_options.bonus=0.1 model=tiny trainer.max_steps=2
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from hydra import compose, initialize_config_dir

from core.types import Group, RewardOutput, Task
from rl.rewarders.outcome import outcome_matrix
from rl.run.compile_cache import use_compile_cache
from rl.run.wiring import REWARDERS
from rl.train import run

CONF = Path(__file__).resolve().parents[1] / "conf"


@dataclasses.dataclass(frozen=True)
class ShortAnswerRewarder:
    """R = outcome + bonus * max(0, 1 - characters / max_chars): a correct answer pays 1, and
    every answer earns up to `bonus` more the shorter its text is."""

    task: Task
    bonus: float = 0.1
    max_chars: int = 200

    def init_state(self) -> None:  # no state carried from step to step
        return None

    def __call__(self, groups: Sequence[Group], state: Any, step: int) -> RewardOutput:
        outcome = outcome_matrix(self.task, groups)  # [N prompts, G trajectories]
        chars = np.asarray([[len(t.text) for t in g.trajectories] for g in groups])
        shaped = self.bonus * np.maximum(0.0, 1.0 - chars / self.max_chars)
        return RewardOutput(rewards=outcome + shaped, outcome=outcome, state=state,
                            metrics={"reward/length_bonus_mean": float(shaped.mean())})

    def state_to_json(self, state: Any) -> Any:  # what a checkpoint keeps of the state
        return None

    def state_from_json(self, data: Any) -> Any:
        return None


@REWARDERS.register("short_answers")
def short_answers(task: Task, judge: Any = None, **options: Any) -> ShortAnswerRewarder:
    """The factory ``rl.run.wiring.make_rewarder`` calls: the task, the judge (unused here) and
    ``algo.rewarder_options``."""
    return ShortAnswerRewarder(task, **options)


def main(overrides: list[str]) -> None:
    run_dir = f"runs/{time.strftime('%Y-%m-%d_%H-%M-%S')}_custom_reward"
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[
            "model=tiny", "task=arith", "algo.rewarder=short_answers",
            "+algo.rewarder_options.bonus=0.1", "+algo.rewarder_options.max_chars=200",
            "trainer.max_steps=2", "trainer.batch_prompts=2", "algo.group_size=4",
            "trainer.max_new_tokens=16", "trainer.eval_at_ends=false", "trainer.progress=false",
            "trainer.loggers=[]", f"trainer.run_dir={run_dir}", *overrides])
    use_compile_cache(cfg.get("compile_cache"))
    history, _ = run(cfg)
    for rec in history:
        print(f"step {rec['step']}: reward {rec['reward/mean']:.4f} = outcome "
              f"{rec['outcome/mean']:.4f} + length bonus {rec['reward/length_bonus_mean']:.4f}"
              f"; groups whose rewards differ: {1 - rec['groups/total_homogeneous_frac']:.0%}")
    print(f"run folder: {cfg.trainer.run_dir}")


if __name__ == "__main__":
    main(sys.argv[1:])
