"""Deterministic prompt batches: batch p of a run is a pure function of (seed, p), so the data
position (an integer) is all a checkpoint needs to resume the stream exactly."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from core.types import Prompt


@dataclasses.dataclass(frozen=True)
class PromptStream:
    prompts: Sequence[Prompt]
    batch_size: int
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.prompts:
            raise ValueError("the task has no training prompts")
        if self.batch_size < 1:
            raise ValueError(f"trainer.batch_prompts must be >= 1, got {self.batch_size}")

    def _order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.prompts))

    def batch(self, position: int) -> list[Prompt]:
        """The `position`-th batch; epochs are reshuffled, batches may straddle epochs."""
        n = len(self.prompts)
        start = position * self.batch_size
        out = []
        for i in range(start, start + self.batch_size):
            epoch, j = divmod(i, n)
            out.append(self.prompts[int(self._order(epoch)[j])])
        return out
