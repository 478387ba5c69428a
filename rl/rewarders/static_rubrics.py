"""Rewarder ``"static_rubrics"``: the RaR-style ablation of ARBOR, a fixed rubric list (option
``rubrics_path``, default ``conf/rubrics/rar_search.jsonl``) scored additively by
``memory.static``; no state. It needs a judge (``judge=rule|local|openai``) and a QA-like task,
as ARBOR does."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from core.types import Group, RewardOutput, Task
from memory.gating import check_gate
from memory.static import StaticRubric, load_static_rubrics, static_rubric_step
from rewards.gaming import step_monitors
from rl.rewarders.arbor import base_matrix, group_inputs, per_traj_scores, require_judge

#: The repository root (``conf/`` lives there); relative rubric paths fall back to it so a run
#: started from another working directory still finds the shipped rubric file.
log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_STATIC_RUBRICS = "conf/rubrics/rar_search.jsonl"


def resolve_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as given if it exists, else relative to the repository root."""
    p = Path(path).expanduser()
    if p.exists() or p.is_absolute():
        return p
    alt = REPO_ROOT / p
    return alt if alt.exists() else p


@dataclasses.dataclass(frozen=True)
class StaticRubricRewarder:
    """RaR-style ablation: every group scored by the same fixed rubrics (no memory)."""

    task: Task
    judge: Any
    rubrics: tuple[StaticRubric, ...]
    rubric_lambda: float = 0.1
    rubric_gate: str = "none"  # memory.gating: none | positive_only
    correct_at: float = 1.0

    def __post_init__(self) -> None:
        require_judge(self.judge, "rar")

    def init_state(self) -> None:
        return None

    def __call__(self, groups: Sequence[Group], state: Any, step: int) -> RewardOutput:
        inputs = group_inputs(self.task, groups)
        out = static_rubric_step(inputs, self.rubrics, self.judge, self.rubric_lambda,
                                 self.rubric_gate, self.correct_at)
        return RewardOutput(rewards=np.asarray(out.total_rewards, np.float64),
                            outcome=base_matrix(inputs), metrics=dict(out.metrics),
                            state=None, per_traj=per_traj_scores(out.centred, inputs))

    def monitors(self, groups: Sequence[Group], out: RewardOutput
                 ) -> tuple[dict[str, float], tuple[dict[str, Any], ...]]:
        """The step's reward-gaming monitors and alerts (``rewards.gaming.step_monitors``)."""
        return step_monitors(groups, out, self.correct_at)

    def state_to_json(self, state: Any) -> None:
        return None

    def state_from_json(self, data: Any) -> None:
        return None


def static_rubrics_rewarder(task: Task, judge: Any, rubrics_path: str = DEFAULT_STATIC_RUBRICS,
                            rubric_lambda: float = 0.1, seed: int = 0,
                            rubric_gate: str = "none", correct_at: float = 1.0,
                            aggregator: str = "additive_abs") -> Any:
    """Factory named ``static_rubrics`` in ``rl.run.wiring``. ``seed`` is accepted (and unused:
    static scoring draws nothing) so the RaR config can share the ARBOR configs' keys; any
    other option is an error.

    On a task whose prompts carry their own rubrics (``task.prompt_rubrics``: rubric_data,
    rubric_chat) RaR is what its paper trains: each prompt's own rubric, aggregated
    explicitly (`aggregator`, ``additive_abs``: ``sum_i w_i q_i / sum_i |w_i|``), by the
    rubric rewarder; the static list and its lambda and gate are for QA tasks."""
    require_judge(judge, "rar")
    if getattr(task, "prompt_rubrics", False):
        from rl.rewarders.rubric import RubricRewarder

        log.info("algo rar on task %s: each prompt's own rubric, aggregated by %s (the static "
                 "list %s and rubric_lambda are for QA tasks)", getattr(task, "name", task),
                 aggregator, rubrics_path)
        return RubricRewarder(task=task, judge=judge, aggregator=aggregator)
    check_gate(rubric_gate, float(correct_at))
    rubrics = load_static_rubrics(resolve_path(rubrics_path))
    return StaticRubricRewarder(task=task, judge=judge, rubrics=rubrics,
                                rubric_lambda=float(rubric_lambda), rubric_gate=rubric_gate,
                                correct_at=float(correct_at))
