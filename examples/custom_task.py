"""A task of your own: name the capital of a country, from a small built-in list.

Shows the ``core.types.Task`` protocol (prompts per split, an environment to roll them out, an
outcome score per trajectory) and how to plug a task in without editing the library: register
its factory under a name in ``rl.run.wiring.TASKS`` and select it with ``~task +task.name=<name>``
(``~task`` drops the default task's keys; the other ``task.*`` keys are the factory's keyword
arguments). Trains 2 GRPO steps of the tiny random model (CPU, under a minute; the random
model knows no capital, so its outcome is 0):

    python examples/custom_task.py
    python examples/custom_task.py model=smollm2_135m trainer.max_steps=20  # any override
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from core.types import Prompt, Trajectory
from models.sampler import SamplingParams
from models.tokenizer import Tokenizer
from rl.run.compile_cache import use_compile_cache
from rl.run.wiring import TASKS
from rl.tasks.envs import SingleTurnEnv
from rl.train import run

CONF = Path(__file__).resolve().parents[1] / "conf"
CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Italy": "Rome", "Egypt": "Cairo",
            "Canada": "Ottawa", "Kenya": "Nairobi", "Peru": "Lima", "Spain": "Madrid",
            "Norway": "Oslo", "Chile": "Santiago", "Greece": "Athens", "Cuba": "Havana"}
SYSTEM = {"role": "system", "content": "Answer with the city inside <answer> and </answer>."}
ANSWER_RE = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class CapitalsTask:
    """The last `n_dev` countries are held out: the dev and test splits."""

    n_dev: int = 4
    name: str = "capitals"

    def prompts(self, split: str) -> list[Prompt]:
        if split not in ("train", "dev", "test"):
            raise ValueError(f"unknown split {split!r}; splits: train, dev, test")
        items = list(CAPITALS.items())
        items = items[:-self.n_dev] if split == "train" else items[-self.n_dev:]
        prompts = []
        for country, city in items:
            question = f"What is the capital of {country}?"
            prompts.append(Prompt(id=f"{split}-{country}", answer=city,
                                  messages=(SYSTEM, {"role": "user", "content": question})))
        return prompts

    def make_env(self, tokenizer: Tokenizer, sampling: SamplingParams) -> SingleTurnEnv:
        # one sampled reply per trajectory, stopped after the closing tag
        stop = (*sampling.stop, "</answer>")
        return SingleTurnEnv(tokenizer, dataclasses.replace(sampling, stop=stop))

    def outcome(self, prompt: Prompt, traj: Trajectory) -> float:
        found = ANSWER_RE.findall(traj.text)
        return float(bool(found) and found[-1].lower() == prompt.answer.lower())


TASKS.register("capitals")(CapitalsTask)  # importing this module registers the task


def main(overrides: list[str]) -> None:
    run_dir = f"runs/{time.strftime('%Y-%m-%d_%H-%M-%S')}_custom_task"
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[
            "model=tiny", "~task", "+task.name=capitals", "+task.n_dev=4",  # not arith's keys
            "trainer.max_steps=2", "trainer.batch_prompts=2", "algo.group_size=4",
            "trainer.max_new_tokens=16", "trainer.eval_at_ends=false", "trainer.progress=false",
            "trainer.loggers=[]", f"trainer.run_dir={run_dir}", *overrides])
    use_compile_cache(cfg.get("compile_cache"))
    history, _ = run(cfg)
    for rec in history:
        print(f"step {rec['step']}: outcome {rec['outcome/mean']:.3f}, reward "
              f"{rec['reward/mean']:.3f}, mean length {rec['response/length_mean']:.1f} tokens")
    folder = Path(cfg.trainer.run_dir)
    sample = json.loads((folder / "samples.jsonl").read_text().splitlines()[0])
    print(f"a sample: {sample['question']} -> {sample['response']!r} "
          f"(gold {sample['answer']}, outcome {sample['outcome']})")
    print(f"run folder: {folder}")


if __name__ == "__main__":
    main(sys.argv[1:])
