"""Built-in verifiable task: short arithmetic with exact answers, generated from a seed.

"What is 23 + 7? ..." -> reward 1 when the text inside the last <answer>...</answer> is the
exact integer, else 0 (optionally `format_reward` for a well-formed but wrong answer).
Useful before the search task exists, and a fast sanity check for the whole loop.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import numpy as np

from core.types import Prompt, Trajectory
from models.sampler import SamplingParams
from models.tokenizer import Tokenizer
from rl.tasks.envs import SingleTurnEnv

INSTRUCTION = "Answer with the number inside <answer> and </answer>."
# A short system turn (instead of the template's default) and one worked exchange in front of
# the question: small models copy the format from it, and the prompt stays short to train on.
DEMO = ({"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": f"{INSTRUCTION}\nWhat is 2 + 3?"},
        {"role": "assistant", "content": "<answer>5</answer>"})
ANSWER_RE = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL)
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
SPLIT_SEEDS = {"train": 0, "dev": 1, "test": 2}


def make_problems(n: int, seed: int, max_operand: int, ops: Sequence[str]) -> list[Prompt]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        op = str(rng.choice(list(ops)))
        a, b = (int(x) for x in rng.integers(0, max_operand + 1, size=2))
        question = f"What is {a} {op} {b}?"
        ask = {"role": "user", "content": question}
        out.append(Prompt(id=f"arith-{seed}-{i}", messages=(*DEMO, ask),
                          answer=OPS[op](a, b), meta={"question": question}))
    return out


def extract_int(text: str) -> int | None:
    found = ANSWER_RE.findall(text)
    if not found:
        return None
    try:
        return int(found[-1].strip().rstrip("."))
    except ValueError:
        return None


@dataclasses.dataclass(frozen=True)
class ArithTask:
    """`size` train problems; dev/test drawn from other seeds. Operands in [0, max_operand]."""

    size: int = 2000
    eval_size: int = 64
    max_operand: int = 10
    ops: tuple[str, ...] = ("+", "-")
    seed: int = 0
    format_reward: float = 0.0
    name: str = "arith"

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", tuple(self.ops))
        bad = [o for o in self.ops if o not in OPS]
        if bad:
            raise ValueError(f"task.ops: unknown operators {bad}; known: {sorted(OPS)}")

    def prompts(self, split: str) -> list[Prompt]:
        if split not in SPLIT_SEEDS:
            raise ValueError(f"unknown split {split!r}; splits: {sorted(SPLIT_SEEDS)}")
        n = self.size if split == "train" else self.eval_size
        return make_problems(n, 1000 * self.seed + SPLIT_SEEDS[split], self.max_operand,
                             self.ops)

    def make_env(self, tokenizer: Tokenizer, sampling: SamplingParams) -> SingleTurnEnv:
        return SingleTurnEnv(tokenizer, dataclasses.replace(
            sampling, stop=tuple(dict.fromkeys((*sampling.stop, "</answer>")))))

    def outcome(self, prompt: Prompt, traj: Trajectory) -> float:
        value = extract_int(traj.text)
        if value is None:
            return 0.0
        return 1.0 if value == prompt.answer else self.format_reward
