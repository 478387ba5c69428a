"""The outcome rewarder. A rewarder turns groups of trajectories into rewards [N, G] and carries
its own immutable host-side state (None for outcome rewards, the rubric memory for ARBOR);
``rl.run.wiring`` names every rewarder."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from core.types import Group, RewardOutput, Task


def outcome_matrix(task: Task, groups: Sequence[Group]) -> np.ndarray:
    return np.asarray([[task.outcome(g.prompt, t) for t in g.trajectories] for g in groups],
                      np.float64)


@dataclasses.dataclass(frozen=True)
class OutcomeRewarder:
    """R_i = the task's verifiable outcome score of trajectory i."""

    task: Task

    def init_state(self) -> None:
        return None

    def __call__(self, groups: Sequence[Group], state: Any, step: int) -> RewardOutput:
        r = outcome_matrix(self.task, groups)
        return RewardOutput(rewards=r, outcome=r, metrics={}, state=state)

    def state_to_json(self, state: Any) -> Any:
        return None

    def state_from_json(self, data: Any) -> Any:
        return None
