"""``task=prompts``: a prompt dataset scored by an outcome reward: verl's parquet schema, or any
file or Hugging Face dataset with named columns.

Rows come from ``task.path`` or ``task.dataset`` as for ``task=rubric_data``
(``rl.tasks.sources``: folders, filters with ``task.where``, held-out or own dev and test
splits). In verl's schema (the defaults) a row is::

    {"data_source": "openai/gsm8k",
     "prompt": [{"role": "user", "content": "..."}],
     "reward_model": {"style": "rule", "ground_truth": "72"},
     "extra_info": {"split": "train", "index": 7}}

Other columns are named: ``task.prompt_field`` (a chat list or a string, a dotted path),
``task.answer_field``, ``task.options_field`` (multiple-choice options appended to the
question as ``A. ...`` lines, ``rewards.choice.render_options``) and ``task.source_field``.

The reward (``task.reward``) is a name in ``rewards.outcomes.OUTCOME_REWARDS`` (``qa_em``,
``qa_subem``, ``qa_f1``, ``choice``, ``math`` or your own), or ``auto``: each row's by its
``data_source`` (``rewards.outcomes.DATA_SOURCE_REWARDS``). A row without its prompt or
answer, or whose data source names no reward, stops the run before any model loads, naming
the file, the row and the field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from core.types import Prompt, Trajectory
from models.sampler import SamplingParams
from rewards.choice import render_options
from rewards.outcomes import OUTCOME_REWARDS, final_answer, reward_for
from rl.tasks.envs import SingleTurnEnv
from rl.tasks.sources import (
    MISSING,
    SPLITS,
    Row,
    SourceError,
    field_value,
    read_splits,
)

AUTO = "auto"


@dataclasses.dataclass(frozen=True)
class PromptReport:
    """Per-answer ``reward``, and the split's mean per reward in ``summary``
    (``reward/<name>``: e.g. the math rows' and the QA rows' accuracies apart)."""

    reward: np.ndarray
    summary: dict[str, float]


def _messages(value: Any, where: str, field: str) -> tuple[dict[str, str], ...]:
    if isinstance(value, str):
        return ({"role": "user", "content": value},)
    if isinstance(value, Sequence) and value and all(
            isinstance(m, Mapping) and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str) for m in value):
        return tuple({"role": m["role"], "content": m["content"]} for m in value)
    raise SourceError(f"{where}: {field}: expected a string or a list of "
                      f"{{role, content}} messages, got {value!r:.120}")


@dataclasses.dataclass(frozen=True)
class PromptsTask:
    """Prompts scored by an outcome reward (module docstring)."""

    path: str | None = None
    dataset: str | None = None
    subset: str | None = None
    split: str = "train"
    dev_split: str | None = None
    test_split: str | None = None
    revision: str | None = None
    dev_path: str | None = None
    test_path: str | None = None
    where: Mapping[str, Any] | None = None
    eval_fraction: float = 0.05
    size: int | None = None
    eval_size: int | None = None
    seed: int = 0
    prompt_field: str = "prompt"
    answer_field: str = "reward_model.ground_truth"
    options_field: str | None = None
    source_field: str = "data_source"
    reward: str = AUTO
    name: str = "prompts"

    def __post_init__(self) -> None:
        if self.reward != AUTO and self.reward not in OUTCOME_REWARDS:
            raise SourceError(f"task.reward: unknown reward {self.reward!r}; known: auto, "
                              f"{', '.join(OUTCOME_REWARDS.names())}")
        source, splits = read_splits(self, lambda rows: [self._prompt(r) for r in rows])
        if any(p.meta["reward"] == "math" for ps in splits.values() for p in ps):
            try:
                import math_verify  # noqa: F401
            except ImportError:
                raise SourceError("task.reward: rows scored by math need math-verify: pip "
                                  "install -e '.[math]'") from None
        object.__setattr__(self, "_source", source)
        object.__setattr__(self, "_splits", splits)

    def _field(self, row: Row, field: str, key: str) -> Any:
        value = field_value(row.data, field)
        if value is MISSING or value is None:
            raise SourceError(f"{row.where}: {field}: missing (the field {key} names)")
        return value

    def _prompt(self, row: Row) -> Prompt:
        """A row as the policy's prompt, its answer and the reward that scores it."""
        messages = _messages(self._field(row, self.prompt_field, "task.prompt_field"),
                             row.where, self.prompt_field)
        if self.options_field:
            options = self._field(row, self.options_field, "task.options_field")
            try:
                text = render_options(messages[-1]["content"], options)
            except ValueError as e:
                raise SourceError(f"{row.where}: {self.options_field}: {e}") from None
            messages = (*messages[:-1], {**messages[-1], "content": text})
        answer = self._field(row, self.answer_field, "task.answer_field")
        source = field_value(row.data, self.source_field)
        source = None if source is MISSING else source
        reward: str | None = self.reward
        if reward == AUTO:
            reward = reward_for(str(source)) if source is not None else None
            if reward is None:
                raise SourceError(f"{row.where}: {self.source_field}: data source {source!r} "
                                  f"names no reward; set task.reward= (one of "
                                  f"{', '.join(OUTCOME_REWARDS.names())})")
        index = field_value(row.data, "extra_info.index")
        pid = f"{Path(row.source).name}:{row.index if index is MISSING else index}"
        return Prompt(id=pid, messages=messages, answer=answer,
                      meta={"question": messages[-1]["content"], "reward": reward,
                            "data_source": source})

    def data_provenance(self) -> dict[str, Any]:
        """The data this task trains and evaluates on, for ``provenance.jsonl``."""
        return {"task": self.name, **self._source.provenance(),  # type: ignore[attr-defined]
                "where": dict(self.where or {}), "reward": self.reward,
                "eval_fraction": self.eval_fraction, "seed": self.seed,
                "prompts": {s: len(p) for s, p in
                            self._splits.items()}}  # type: ignore[attr-defined]

    def prompts(self, split: str) -> list[Prompt]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; splits: {', '.join(SPLITS)}")
        return list(self._splits[split])  # type: ignore[attr-defined]

    def make_env(self, tokenizer: Any, sampling: SamplingParams) -> SingleTurnEnv:
        return SingleTurnEnv(tokenizer, sampling)

    def outcome(self, prompt: Prompt, traj: Trajectory) -> float:
        """The row's reward (``prompt.meta["reward"]``) of the trajectory's text."""
        return float(OUTCOME_REWARDS.get(prompt.meta["reward"])(traj.text, prompt.answer))

    def answer(self, prompt: Prompt, traj: Trajectory) -> str | None:
        """The trajectory's final answer as its reward reads it, for majority voting
        (``rewards.outcomes.final_answer``; None: none, or a reward that reads no answer)."""
        return final_answer(prompt.meta["reward"], traj.text)

    def evaluate(self, prompts: Sequence[Prompt], responses: Sequence[str]) -> PromptReport:
        """Each answer's reward, and the mean per reward name (``reward/<name>``)."""
        names = [p.meta["reward"] for p in prompts]
        reward = np.asarray([OUTCOME_REWARDS.get(n)(text, p.answer)
                             for n, p, text in zip(names, prompts, responses, strict=True)],
                            np.float64)
        summary = {f"reward/{n}": float(reward[[m == n for m in names]].mean())
                   for n in sorted(set(names))}
        return PromptReport(reward, summary)
