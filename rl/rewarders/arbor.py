"""The trainer's seam to ARBOR: rewarder ``"arbor"``, and the conversion of a QA task's groups
into the rubric memory's inputs that the RaR ablation (``rl.rewarders.static_rubrics``) shares.

``rl.run.wiring`` names the factory; ``algo.rewarder=arbor`` then builds one with
``factory(task=task, judge=judge, **algo.rewarder_options)``.

* ``"arbor"`` (``ArborRewarder``): options are ``MemoryConfig`` fields (``delta_v``,
  ``rho_min``, ``k_consol``, ``retire_k``, ``rubric_lambda``, ``use_common_pool``, ...) plus
  ``seed`` (seeds comparison graphs and presentation coins). Its host-side state is the rubric
  memory ``RubricMemory``, threaded through the steps and saved in every checkpoint as
  ``RubricMemory.to_dict()``; its events (admissions, rejections with reason, consolidations,
  merges, activations, retirements) go to the run folder's ``memory_events.jsonl``.
It needs a judge (``judge=rule|local|openai``) and a QA-like task: ``Prompt.answer`` holds the
gold answers, ``Prompt.question`` the question, ``task.outcome`` is ``R_base``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from core.types import Group, RewardOutput, Task
from memory.embed import check_embedder
from memory.lineage import retired_at
from memory.reward import GroupInput, arbor_reward_step, step_counts
from memory.state import MemoryConfig, RubricMemory, check_basis
from rewards.gaming import step_monitors
from rewards.qa import answer_f1

#: Friendly aliases of ``memory.embed.EMBEDDERS`` names accepted in configs.
EMBEDDER_ALIASES = {"hashing": "hash", "minilm-l6": "minilm", "all-minilm-l6-v2": "minilm"}

NO_JUDGE = "algo={algo} needs a judge: judge=rule|local|openai"


def require_judge(judge: Any, algo: str) -> None:
    if judge is None:
        raise ValueError(NO_JUDGE.format(algo=algo))


def _golds(answer: Any) -> tuple[str, ...]:
    """Gold aliases as strings: search tasks give a tuple; a scalar answer is one alias."""
    if answer is None:
        return ()
    if isinstance(answer, str | int | float):
        return (str(answer),)
    return tuple(str(a) for a in answer)


def group_inputs(task: Task, groups: Sequence[Group]) -> list[GroupInput]:
    """One ``GroupInput`` per group: ``R_base = task.outcome`` (F1 if the format is valid else
    -1 for ``task=search_qa``), ``f1`` = the token F1 of each trajectory's extracted answer
    against the golds whatever its format (the task's ``answer_f1`` when it has one, i.e. under
    ``task.reward_metrics``; else ``rewards.qa.answer_f1``: what ARBOR's gates read), lengths in
    generated (action) tokens. Validity is left to its default ``R_base >= 0``,
    which is exact for ARBOR's outcome reward."""
    def gate_f1(p: Any, t: Any) -> float:
        return answer_f1(t.text, _golds(p.answer))

    f1_of = getattr(task, "answer_f1", gate_f1)
    out = []
    for g in groups:
        p = g.prompt
        out.append(GroupInput(
            qid=str(p.id),
            question=p.question,
            golds=_golds(p.answer),
            texts=tuple(t.text for t in g.trajectories),
            r_base=tuple(float(task.outcome(p, t)) for t in g.trajectories),
            f1=tuple(f1_of(p, t) for t in g.trajectories),
            lengths=tuple(t.num_action_tokens for t in g.trajectories),
        ))
    return out


def base_matrix(inputs: Sequence[GroupInput]) -> np.ndarray:
    """[N, G] R_base (NaN padding for ragged groups; the trainer passes equal sizes)."""
    gmax = max((g.size for g in inputs), default=0)
    out = np.full((len(inputs), gmax), np.nan)
    for n, g in enumerate(inputs):
        out[n, :g.size] = g.r_base
    return out


def per_traj_scores(combined: np.ndarray, inputs: Sequence[GroupInput],
                    ids: Sequence[Sequence[str]] = ()
                    ) -> tuple[tuple[Mapping[str, Any], ...], ...]:
    """Per-trajectory rubric details (for sample logs): the centred score s~ and the rubric
    ids that scored the group."""
    out = []
    for n, g in enumerate(inputs):
        used = [slot[n] for slot in ids if slot[n]]
        out.append(tuple({"rubric_score": float(combined[n, i]), "rubric_ids": used}
                         for i in range(g.size)))
    return tuple(out)


def memory_config(options: Mapping[str, Any]) -> MemoryConfig:
    """``MemoryConfig`` from rewarder options (unknown keys are an error, embedder aliases are
    resolved; ``MemoryConfig`` checks names such as ``graph`` and ``tie_break`` against their
    registries), so a typo in ``algo.rewarder_options`` fails at start-up."""
    opts = dict(options)
    if "embedder" in opts:
        name = str(opts["embedder"])
        opts["embedder"] = EMBEDDER_ALIASES.get(name.lower(), name)
    return MemoryConfig.from_mapping(opts)


@dataclasses.dataclass(frozen=True)
class ArborRewarder:
    """``R_total = R_base + lambda * s~`` from the rubric memory; state = ``RubricMemory``.

    Build it with ``arbor_rewarder(task, judge, **options)`` (``arbor`` in ``rl.run.wiring``) or
    directly with a ``MemoryConfig``. The judge is the only effectful collaborator.
    """

    task: Task
    judge: Any
    cfg: MemoryConfig = MemoryConfig()
    seed: int = 0

    def __post_init__(self) -> None:
        require_judge(self.judge, "arbor")
        if self.cfg.use_common_pool:  # consolidation will need it: fail at start-up, not then
            check_embedder(self.cfg.embedder)

    def init_state(self) -> RubricMemory:
        return RubricMemory()

    def __call__(self, groups: Sequence[Group], state: RubricMemory | None,
                 step: int) -> RewardOutput:
        inputs = group_inputs(self.task, groups)
        memory = state if state is not None else RubricMemory()
        out = arbor_reward_step(memory, inputs, self.judge, self.cfg, step=int(step),
                                seed=self.seed)
        sc = out.rubric_scores
        metrics = dict(out.metrics)
        finite = sc.combined[np.isfinite(sc.combined)]
        metrics["memory/rubric_score_abs_mean"] = float(np.abs(finite).mean()) if finite.size \
            else 0.0
        return RewardOutput(
            rewards=np.asarray(out.total_rewards, np.float64),
            outcome=base_matrix(inputs),
            metrics=metrics,
            state=out.memory,
            events=tuple(e.to_dict() for e in out.events),
            per_traj=per_traj_scores(sc.combined, inputs, sc.rubric_ids),
            counts=step_counts(out.metrics),
        )

    def monitors(self, groups: Sequence[Group], out: RewardOutput
                 ) -> tuple[dict[str, float], tuple[dict[str, Any], ...]]:
        """The step's reward-gaming monitors and alerts (``rewards.gaming.step_monitors``)."""
        return step_monitors(groups, out, self.cfg.correct_at)

    def state_to_json(self, state: RubricMemory | None) -> dict[str, Any] | None:
        return None if state is None else state.to_dict()

    def lineage(self, state: RubricMemory | None, step: int) -> list[dict[str, Any]]:
        """The rubrics retired at `step` (``memory.lineage``): ``memory_lineage.jsonl``."""
        return [] if state is None else retired_at(state, step)

    def state_from_json(self, data: Mapping[str, Any] | None) -> RubricMemory:
        """The checkpoint's memory, refused at once (before any step) when its statistics were
        computed on another basis than ``cfg`` (``state.check_basis``); a checkpoint of a run
        without memory starts from an empty one."""
        if not data:
            return RubricMemory()
        return check_basis(RubricMemory.from_dict(dict(data)), self.cfg)


def arbor_rewarder(task: Task, judge: Any, seed: int = 0, **options: Any) -> ArborRewarder:
    """Factory named ``arbor`` in ``rl.run.wiring``: ``options`` are ``MemoryConfig`` fields."""
    require_judge(judge, "arbor")
    return ArborRewarder(task=task, judge=judge, cfg=memory_config(options), seed=int(seed))
