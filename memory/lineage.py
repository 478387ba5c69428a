"""Rubric lineage: which rubrics the policy has mastered, in what order, and which drifted.

A common rubric leaves the pool ``P`` for one of three reasons (``memory.retirement``): it
stopped separating trajectories and the judge finds most of them meeting it, "mastered" (the
policy now does what it asks); it stopped separating them and most fail it, "abandoned" (the
policy gave up on it, or nobody can meet it); or its correlation with the outcome turned bad,
"drifted". Low variance alone cannot tell the first two apart, so the judge's pass rate at
retirement decides (``CommonRubric.retired_pass_rate``). The memory keeps every retired rubric
with its step and reason (``retired_step`` / ``retired_reason``). The order of mastery, of the
mastered rubrics only, is a curriculum the run discovered. :func:`retired_at` turns one step's
retirements into the records of ``memory_lineage.jsonl``.
"""

from __future__ import annotations

from typing import Any

from judges.types import Draft
from memory.state import RubricMemory


def mastery_order(memory: RubricMemory) -> list[str]:
    """The ids of the mastered rubrics, first mastered first (ties by id)."""
    mastered = [c for c in memory.retired if c.retired_reason == "mastered"]
    return [c.id for c in sorted(mastered, key=lambda c: (c.retired_step, c.id))]


def retired_at(memory: RubricMemory, step: int) -> list[dict[str, Any]]:
    """One record per rubric retired at `step`: id, title, why, when it was created, how
    often it was used, its last ``rho_r``, the judge's pass rate at a low-variance retirement
    (None otherwise or without a verdict), and for a mastered one its rank in the order of
    mastery (1 = the first rubric the policy mastered)."""
    order = {cid: i + 1 for i, cid in enumerate(mastery_order(memory))}
    out = []
    for c in memory.retired:
        if c.retired_step != step:
            continue
        out.append({"common_id": c.id, "title": c.draft.title, "reason": c.retired_reason,
                    "created_step": c.created_step, "uses": c.uses, "rho": c.rho,
                    "pass_rate": c.retired_pass_rate, "mastery_rank": order.get(c.id)})
    return out


def recently_mastered(memory: RubricMemory, k: int) -> tuple[Draft, ...]:
    """The rubrics of the `k` most recently mastered common rubrics, latest first: what
    ``algo.lineage_in_induction`` shows the judge when it induces new drafts."""
    by_id = {c.id: c for c in memory.retired}
    return tuple(by_id[cid].draft for cid in reversed(mastery_order(memory)[-k:])) if k else ()
