"""Rubric rewarders for the GRPO loop: judge every criterion, aggregate with a jitted aggregator
(or, for ``implicit``, have the judge rate the whole checklist).

``algo.rewarder=rubric`` with ``algo.rewarder_options.aggregator`` a name in
``rewards.aggregate.AGGREGATORS`` or ``implicit``:

* ``additive`` (Rubric-RL, HealthBench): ``R = sum_i w_i q_i / sum_{w_i>0} w_i``;
* ``additive_abs`` (RaR): ``R = sum_i w_i q_i / sum_i |w_i|``;
* ``prorubric``: ``R~ = sum_k w~_k s~_k / sum_k w~_k``, ``s~_k = prod_{i in I_k} q'_i (1 -
  fail_k)``, ``q'_i = 1 - q_i`` for pitfalls, ``fail_k`` = the dimension's failure clause fired;
* ``raw_and``: the same bundling without failure clauses;
* ``pass_rate``: ``R = mean_i q'_i``, the unweighted fraction of criteria satisfied (pitfalls
  counted as satisfied when absent);
* the ProRubric authors' arms (``rewards.dimension_judging.DIMENSION_ARMS``:
  ``prorubric_official``, ``rubric_rl_official``, ``raw_and_verbatim``, ``prorubric_no_failure``,
  ``prorubric_k1``, ``prorubric_graded``): ONE ``judge.check_dimensions`` call per response
  (per draw) with every dimension paragraph, ``R = clip01(sum_d W_d v_d / sum_d max(0, W_d))``;
  a prompt group with a failed call is judged again ``group_retries`` times, then fails closed
  (every member 0, ``per_traj`` ``judge_failed = 1``);
* ``weighted_atomic`` / ``grouped_mean``: the clipped additive sum over re-derived item weights
  (``reweighted``); ``clip`` (option) clips any check aggregator's reward to [0, 1];
* ``implicit`` (RaR's implicit aggregation, Gunjal et al. 2025): ONE ``judge.rate`` call per
  response, in which the judge sees the whole weighted checklist and the response and gives an
  integer rating 1..10; ``R = (rating - 1) / 9`` (``rewards.aggregate.rating_reward``).  The
  LLM judges ask with prompt ``rate``; the rule judge computes ``1 + round(9 f)`` from its
  rules, ``f`` the ``|w|``-weighted pass fraction (``judges.rule.RuleJudge.rate``).  A rating
  that ended on the judge's fallback is 1 (reward 0, no credit, as a check that fell back is
  "not met"), counted in ``rubric/rating_fallbacks``.  The criteria are still checked one by
  one, for the coverage / fitness metrics (the same measurement for every arm), not for the
  reward.

Metrics (per step): ``rubric/reward`` (the aggregator's mean), ``rubric/coverage`` (``g``: the
training rubric's additive score, positive normalisation, whatever the training aggregator),
``rubric/fitness`` (``c``: mean pass rate of the held-out criteria), ``rubric/length_words``,
``rubric/fail_rate`` (fired clauses / clauses checked), ``rubric/pitfall_rate`` (pitfalls present /
pitfalls checked), ``rubric/check_fallbacks``, ``rubric/fitness_fallbacks``,
``rubric/rating_fallbacks`` and cumulative
``judge/*`` counters.
``RewardOutput.outcome`` is the coverage ``g``.

Judge: the rewarder needs one.  When the trainer passes ``None`` (``judge=none``) and the task
declares ``rule_checkable = True`` (its criteria are rule-language predicates, e.g.
``task=rubric_chat``), a default ``RuleJudge()`` is used and a warning logged; otherwise a
``ValueError`` says to pass ``judge=...``.  The rubric state is ``None`` (stateless).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from core.types import Group, RewardOutput, Task
from judges.base import Judge
from rewards.rubric import Rubric
from rewards.rubric_scoring import (
    JUDGE_FAILED,
    Checks,
    ScoreItem,
    check_reward_name,
    fitness_criteria,
    nanmean,
    prompt_rubric,
    score_items,
)

log = logging.getLogger(__name__)

#: Judge counters copied into the step metrics as ``judge/<key>`` (cumulative).
JUDGE_METRIC_KEYS = ("requests_check", "fallbacks_check", "requests_rate", "fallbacks_rate",
                     "parse_errors", "reasks", "backend_errors", "cache_hits", "prompt_tokens",
                     "completion_tokens", "requests_dimensions", "retries_dimensions",
                     "failures_dimensions")


def _rates(rubrics: Sequence[Rubric], checks: Sequence[Checks]) -> tuple[float, float]:
    fired = clauses = present = pitfalls = 0.0
    for r, ch in zip(rubrics, checks):
        for k, d in enumerate(r.dimensions):
            if d.failure:
                clauses += 1
                fired += ch.fail[k]
        for c, v in zip(r.criteria, ch.q):
            if c.weight < 0:
                pitfalls += 1
                present += v
    return (fired / clauses if clauses else 0.0), (present / pitfalls if pitfalls else 0.0)


def resolve_judge(judge: Judge | None, task: Any, who: str = "rubric rewarder") -> Judge:
    """``judge``, or a default ``RuleJudge`` for tasks whose criteria are rule predicates."""
    if judge is not None:
        return judge
    if getattr(task, "rule_checkable", False):
        from judges.rule import RuleJudge

        log.warning("%s: no judge configured (judge=none); task %r has rule-language criteria, "
                    "using the rule judge (pass judge=rule to silence this)", who,
                    getattr(task, "name", task))
        return RuleJudge()
    raise ValueError(f"{who} needs a judge to check rubric criteria, got judge=none: add "
                     f"judge=rule (rule-language criteria, e.g. task=rubric_chat) or "
                     f"judge=openai (free-text criteria)")


@dataclasses.dataclass(frozen=True)
class RubricRewarder:
    """Rewards = a rubric aggregator over judge checks (module docstring).

    Options (``algo.rewarder_options``): ``aggregator`` (a name in ``reward_names()``:
    ``AGGREGATORS``, ``implicit``: the judge's holistic rating, an official dimension arm, a
    re-weighted atomic arm), ``use_probs`` (aggregate the judge's probabilities instead of
    booleans), ``fitness`` (also check the held-out criteria for the ``rubric/fitness``
    metric), ``criteria_bucket`` (padding multiple), ``clip`` (each reward of a check
    aggregator clipped to [0, 1]: the official Rubric-RL arm), ``group_retries`` (dimension
    arms: whole-group re-judgings of a group with a failed call before it fails closed).
    """

    task: Task
    judge: Judge | None = None
    aggregator: str = "prorubric"
    use_probs: bool = False
    fitness: bool = True
    criteria_bucket: int = 8
    clip: bool = False
    group_retries: int = 1

    def __post_init__(self) -> None:
        check_reward_name(self.aggregator, "algo.rewarder_options.aggregator")
        if not isinstance(self.clip, bool):
            raise ValueError(f"algo.rewarder_options.clip: expected true or false, got "
                             f"{self.clip!r}")
        if isinstance(self.group_retries, bool) or int(self.group_retries) < 0:
            raise ValueError(f"algo.rewarder_options.group_retries: must be an integer >= 0, "
                             f"got {self.group_retries!r}")
        object.__setattr__(self, "judge", resolve_judge(self.judge, self.task))

    def init_state(self) -> None:
        return None

    def items(self, groups: Sequence[Group]) -> list[ScoreItem]:
        out = []
        for g in groups:
            rubric = prompt_rubric(g.prompt)
            fit = fitness_criteria(rubric) if self.fitness else ()
            ctx = rubric.context_text() or g.prompt.question
            out += [ScoreItem(ctx, t.text, rubric, fit) for t in g.trajectories]
        return out

    def __call__(self, groups: Sequence[Group], state: Any, step: int) -> RewardOutput:
        items = self.items(groups)
        assert self.judge is not None
        s = score_items(self.judge, items, self.aggregator, self.use_probs, self.criteria_bucket,
                        self.clip, [len(g.trajectories) for g in groups], self.group_retries)
        shape = (len(groups), len(groups[0].trajectories) if groups else 0)
        rubrics = [it.rubric for it in items]
        fail_rate, pitfall_rate = _rates(rubrics, s.checks)
        stats = self.judge.stats()
        metrics = {
            "rubric/reward": float(np.mean(s.reward)) if len(s.reward) else 0.0,
            "rubric/coverage": float(np.mean(s.coverage)) if len(s.coverage) else 0.0,
            "rubric/fitness": nanmean(s.fitness),
            "rubric/length_words": float(np.mean(s.length)) if len(s.length) else 0.0,
            "rubric/fail_rate": fail_rate,
            "rubric/pitfall_rate": pitfall_rate,
            "rubric/check_fallbacks": float(sum(ch.fallbacks for ch in s.checks)),
            "rubric/fitness_fallbacks": float(sum(ch.fitness_fallbacks for ch in s.checks)),
            "rubric/rating_fallbacks": float(s.rating_fallbacks),
            **s.dimension_counts,
            **{f"judge/{k}": float(stats[k]) for k in JUDGE_METRIC_KEYS if k in stats},
        }
        per_traj = []
        j = 0
        for g in groups:
            row = []
            for _ in g.trajectories:
                rec = {"reward": float(s.reward[j]), "coverage": float(s.coverage[j]),
                       "fitness": float(s.fitness[j]), "words": int(s.length[j])}
                if s.judge_failed is not None:
                    rec[JUDGE_FAILED] = int(s.judge_failed[j])
                row.append(rec)
                j += 1
            per_traj.append(tuple(row))
        return RewardOutput(rewards=s.reward.reshape(shape), outcome=s.coverage.reshape(shape),
                            metrics=metrics, state=None, per_traj=tuple(per_traj),
                            counts=dict(s.dimension_counts))

    def state_to_json(self, state: Any) -> Any:
        return None

    def state_from_json(self, data: Any) -> Any:
        return None
