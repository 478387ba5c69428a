"""A run's group statistics over all its steps, read back from ``metrics.jsonl``: how often a
prompt's group had no outcome signal, how often the rubric term gave it one, how often every
answer was wrong (the ARBOR paper's section on reward sparsity: rubric scoring converts 32-42 %
of the outcome-homogeneous groups, and all-wrong groups drop by 54-61 % against GRPO).

Per step the loop logs fractions of that step's groups (``rl.grpo.group_stats``); every step
holds the same number of groups (``trainer.batch_prompts``), so over a run:

* ``homogeneous`` = mean over steps of ``groups/homogeneous_frac``;
* ``converted`` = sum_t converted_t homogeneous_t / sum_t homogeneous_t: the converted share of
  all the run's outcome-homogeneous groups (0 when there were none);
* ``all_wrong`` = mean over steps of ``groups/all_wrong_frac``;
* between two runs, the relative drop of all-wrong groups ``1 - all_wrong_A / all_wrong_B``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

KEYS = ("groups/homogeneous_frac", "groups/converted_frac", "groups/all_wrong_frac")


@dataclasses.dataclass(frozen=True)
class GroupSummary:
    """A run's group statistics over steps ``first``..``last`` (module docstring)."""

    run: str
    steps: int
    first: int
    last: int
    homogeneous: float
    converted: float
    all_wrong: float


def summarize_groups(run_dir: str | Path, from_step: int = 0) -> GroupSummary:
    """The group statistics of a run folder's training steps from `from_step` on. A folder
    without ``metrics.jsonl``, or without a training step that logged the group fractions,
    is a ``FileNotFoundError`` / ``ValueError`` naming it."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file (not a run folder?)")
    steps = []
    for line in path.read_text().splitlines():
        row = json.loads(line) if line.strip() else {}
        if all(k in row for k in KEYS) and int(row.get("step", 0)) >= from_step:
            steps.append(row)
    if not steps:
        raise ValueError(f"{path}: no training step from step {from_step} on logs "
                         f"{', '.join(KEYS)}")
    hom = [float(r[KEYS[0]]) for r in steps]
    conv = [float(r[KEYS[1]]) for r in steps]
    wrong = [float(r[KEYS[2]]) for r in steps]
    return GroupSummary(str(run_dir), len(steps), int(steps[0].get("step", 0)),
                        int(steps[-1].get("step", 0)), sum(hom) / len(hom),
                        sum(c * h for c, h in zip(conv, hom)) / sum(hom) if sum(hom) else 0.0,
                        sum(wrong) / len(wrong))


def relative_drop(run: GroupSummary, baseline: GroupSummary) -> float | None:
    """``1 - all_wrong(run) / all_wrong(baseline)`` (None when the baseline had none)."""
    return None if baseline.all_wrong == 0 else 1.0 - run.all_wrong / baseline.all_wrong
