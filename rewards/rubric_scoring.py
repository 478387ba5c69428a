"""Scoring responses against rubrics: one batched judge call for every criterion, failure
clause and held-out fitness criterion of every response, the verdicts padded into arrays
and aggregated by a jitted aggregator (``rewards.aggregate``), or the judge's holistic
rating (``implicit``), or one dimension-paragraph call per response (the ProRubric
authors' arms, ``rewards.dimension_judging``). The rubric rewarder of the training loop
(``rl.rewarders.rubric``), the rubric chat task's evaluation and the perturbation audit
(``rewards.perturb``) all score through :func:`score_items`.

One step = one batched ``judge.check`` call holding, for every trajectory of every group, the
prompt's training criteria, the failure clauses of its dimensions ("met" = the clause fired) and
its held-out fitness criteria (only measured, never rewarded).  The verdicts are padded into
arrays (criteria to a multiple of ``criteria_bucket``, dimensions to ``MAX_DIMS``, so the jitted
aggregator sees few distinct shapes) and aggregated on device.

Where a prompt's rubric comes from: ``prompt.meta["rubric"]`` (a ``Rubric`` or its ``native``
dict), else ``prompt.answer`` when it is a ``Rubric``.  Held-out fitness criteria: the rubric's
``meta["fitness"]`` (a list of ``{text, weight, title}``; weight < 0 = must be absent).

Verdicts: ``q_i`` is the judge's boolean ``met`` (``use_probs=True``: its probability).  A check
that ended on the judge's defined fallback (the judge could not read its own answer):

* training criteria and failure clauses: *not met*, ``q_i = 0``, in both modes.  A positive
  criterion then earns nothing (under the AND-products it zeroes its dimension); a *pitfall*
  counts as absent, i.e. it is not penalised (additive: ``w_i q_i = 0``; AND-products: its
  factor ``1 - q_i = 1``); a failure clause never fires;
* held-out fitness criteria: the check *fails*, whatever the criterion's sign: ``pass_j = 0``
  (a pitfall the judge could not read is not a pass), with the denominator unchanged, so judge
  failures can never raise the fitness ``c``.

Fallbacks are counted in ``rubric/check_fallbacks`` (all checks),
``rubric/fitness_fallbacks`` (held-out checks) and ``rubric/rating_fallbacks`` (implicit).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from core.types import Prompt
from judges.base import Judge
from judges.types import CheckRequest, CheckResult, RateRequest
from rewards.aggregate import AGGREGATORS, get_aggregator, rating_reward
from rewards.dimension_judging import DIMENSION_ARMS, DimensionItem, judge_groups
from rewards.reweight import REWEIGHTED, reweighted
from rewards.rubric import MAX_DIMS, Criterion, Rubric, RubricError, to_arrays
from rewards.rubric_parsers import finite_number, rubric_from_dict, tag_list

log = logging.getLogger(__name__)

AND_AGGREGATORS = ("prorubric", "raw_and")
#: ``RewardOutput.per_traj`` key: 1 = the row's prompt group failed closed (reward 0 for every
#: member; ``rl.run.loop.shaped_rewards`` leaves such rows unshaped, keeping the group
#: zero-variance)
JUDGE_FAILED = "judge_failed"
JUDGE_RATED = "implicit"  # the reward is the judge's holistic rating, not an aggregate of checks



def reward_names() -> list[str]:
    """Every rubric reward a config may name: the aggregators, ``implicit``, the official
    dimension arms (``rewards.dimension_judging.DIMENSION_ARMS``) and the re-weighted atomic
    arms (``REWEIGHTED``)."""
    return sorted([*AGGREGATORS.names(), JUDGE_RATED, *DIMENSION_ARMS, *REWEIGHTED])


def needs_dimensions(name: str) -> bool:
    """Whether rubric reward `name` reads a rubric's dimensions: the AND-products, the
    dimension-paragraph arms but the single-dimension one, ``grouped_mean``."""
    if name in DIMENSION_ARMS:
        arm = DIMENSION_ARMS[name]
        return arm.text != "atomic" and not arm.single
    return name in AND_AGGREGATORS or name == "grouped_mean"


def check_reward_name(name: str, key: str) -> None:
    """A ``ValueError`` naming config `key` unless `name` is a rubric reward."""
    if name not in reward_names():
        raise ValueError(f"{key}: unknown aggregator {name!r}; known: "
                         f"{', '.join(reward_names())}")


# --------------------------------------------------------------------------------------------
# rubric lookup
# --------------------------------------------------------------------------------------------


def prompt_rubric(prompt: Prompt) -> Rubric:
    """The rubric of a prompt: ``meta["rubric"]`` (``Rubric`` or native dict) or ``answer``."""
    r = (prompt.meta or {}).get("rubric")
    if r is None and isinstance(prompt.answer, Rubric):
        r = prompt.answer
    if isinstance(r, Mapping):
        r = rubric_from_dict(r)
    if not isinstance(r, Rubric):
        raise TypeError(f"prompt {prompt.id!r} carries no rubric: the rubric rewarder needs "
                        f"prompt.meta['rubric'] (a Rubric) or a Rubric as prompt.answer")
    return r


def fitness_criteria(rubric: Rubric) -> tuple[Criterion, ...]:
    """Held-out criteria of a rubric: ``meta["fitness"]`` as ``Criterion``s (empty if none).

    ``meta["fitness"]`` is a list of ``Criterion``s or ``{text, weight=1, tags=[], title=""}``
    objects; ``text`` must be non-empty text and ``weight`` a finite number.  Anything else is a
    ``RubricError`` naming the prompt id and the field (e.g. ``meta.fitness[2].text``).
    """
    pid = rubric.prompt_id
    raw = (rubric.meta or {}).get("fitness")
    if raw is None:
        return ()
    if not isinstance(raw, list | tuple):
        raise RubricError(pid, "meta.fitness",
                          f"expected a list of criteria, got {type(raw).__name__}")
    out = []
    for j, c in enumerate(raw):
        fld = f"meta.fitness[{j}]"
        if isinstance(c, Criterion):
            out.append(c)
            continue
        if not isinstance(c, Mapping):
            raise RubricError(pid, fld, f"expected an object, got {type(c).__name__}")
        text = c.get("text")
        if not isinstance(text, str) or not text.strip():
            raise RubricError(pid, f"{fld}.text", "missing, empty or not a string")
        weight = finite_number(c.get("weight", 1.0), pid, f"{fld}.weight")
        out.append(Criterion(text=text, weight=weight,
                             tags=tag_list(c.get("tags"), pid, f"{fld}.tags"),
                             title=str(c.get("title") or "")))
    return tuple(out)


# --------------------------------------------------------------------------------------------
# checks: one batched judge call
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Checks:
    """The verdicts for one response under one rubric.

    ``q`` [C]: per training criterion, 1 = met (for a pitfall: the behaviour is present);
    ``fail`` [K]: per dimension, 1 = its failure clause fired (0 where it has none);
    ``fitness`` [F]: per held-out criterion, 1 = *passes* (sign applied: met for ``w >= 0``,
    absent for ``w < 0``; 0 when the check fell back, whatever the sign); ``fallbacks``: checks
    that ended on the judge's fallback (all kinds), ``fitness_fallbacks``: those among the
    held-out checks.
    """

    q: tuple[float, ...]
    fail: tuple[float, ...]
    fitness: tuple[float, ...]
    fallbacks: int = 0
    fitness_fallbacks: int = 0


@dataclasses.dataclass(frozen=True)
class ScoreItem:
    """One response to judge: its context (the prompt text), rubric and held-out criteria."""

    context: str
    response: str
    rubric: Rubric
    fitness: tuple[Criterion, ...] = ()


def _value(res: CheckResult, use_probs: bool) -> float:
    if res.fallback:
        return 0.0
    if use_probs:
        p = float(res.prob)
        return min(max(p, 0.0), 1.0) if math.isfinite(p) else float(res.met)
    return 1.0 if res.met else 0.0


def _passes(c: Criterion, res: CheckResult, use_probs: bool) -> float:
    """Held-out pass value: ``v`` for ``w >= 0``, ``1 - v`` for ``w < 0`` (``v = _value``), and
    0 for a check that fell back (a pitfall the judge could not read is not a pass)."""
    if res.fallback:
        return 0.0
    v = _value(res, use_probs)
    return v if c.weight >= 0 else 1.0 - v


def judge_checks(judge: Judge, items: Sequence[ScoreItem], use_probs: bool = False
                 ) -> list[Checks]:
    """Check every criterion, failure clause and fitness criterion of every item with ONE
    batched ``judge.check`` call; returns one ``Checks`` per item, same order."""
    reqs: list[CheckRequest] = []
    layout: list[tuple[int, int, int, tuple[int, ...]]] = []
    for it in items:
        start = len(reqs)
        reqs += [CheckRequest(it.context, it.response, c.text) for c in it.rubric.criteria]
        clause_dims = tuple(k for k, d in enumerate(it.rubric.dimensions) if d.failure)
        reqs += [CheckRequest(it.context, it.response, str(it.rubric.dimensions[k].failure))
                 for k in clause_dims]
        reqs += [CheckRequest(it.context, it.response, c.text) for c in it.fitness]
        layout.append((start, it.rubric.num_criteria, len(clause_dims), clause_dims))
    results = judge.check(reqs) if reqs else []
    if len(results) != len(reqs):
        raise RuntimeError(f"judge.check returned {len(results)} results for {len(reqs)} requests")
    out = []
    for it, (start, n_c, n_f, clause_dims) in zip(items, layout):
        res = results[start:start + n_c + n_f + len(it.fitness)]
        q = tuple(_value(r, use_probs) for r in res[:n_c])
        fail = [0.0] * it.rubric.num_dims
        for k, r in zip(clause_dims, res[n_c:n_c + n_f]):
            fail[k] = _value(r, use_probs)
        fit_res = res[n_c + n_f:]
        fit = tuple(_passes(c, r, use_probs) for c, r in zip(it.fitness, fit_res))
        out.append(Checks(q=q, fail=tuple(fail), fitness=fit,
                          fallbacks=sum(bool(r.fallback) for r in res),
                          fitness_fallbacks=sum(bool(r.fallback) for r in fit_res)))
    return out


# --------------------------------------------------------------------------------------------
# aggregation on padded arrays
# --------------------------------------------------------------------------------------------


@functools.cache
def jitted_aggregator(name: str, num_dims: int) -> Any:
    """``jit((q, weights, dim_index, fail, mask) -> rewards [B])`` for a named aggregator."""
    agg = get_aggregator(name)
    if name == "prorubric":
        fn = lambda q, w, d, f, m: agg(q, w, d, f, mask=m)  # noqa: E731
    else:  # fail is not an input of the others; num_dims fixes K for the AND-products
        fn = lambda q, w, d, f, m: agg(q, w, d, None, mask=m, num_dims=num_dims)  # noqa: E731
    return jax.jit(fn)


def _bucket(n: int, size: int) -> int:
    size = max(int(size), 1)
    return max(size, -(-n // size) * size)


def padded_batch(rubrics: Sequence[Rubric], checks: Sequence[Checks], criteria_bucket: int = 8
                 ) -> tuple[np.ndarray, Any, np.ndarray]:
    """(q [B, C], ``RubricArrays``, fail [B, K]) with ``C`` a multiple of ``criteria_bucket`` and
    ``K = MAX_DIMS``; row ``b`` is ``checks[b]`` under ``rubrics[b]``."""
    c = _bucket(max((r.num_criteria for r in rubrics), default=1), criteria_bucket)
    arrays = to_arrays(rubrics, max_criteria=c, max_dims=MAX_DIMS)
    q = np.zeros((len(rubrics), c), np.float32)
    fail = np.zeros((len(rubrics), MAX_DIMS), np.float32)
    for b, (r, ch) in enumerate(zip(rubrics, checks)):
        q[b, :r.num_criteria] = ch.q
        fail[b, :r.num_dims] = ch.fail
    return q, arrays, fail


def aggregate_checks(name: str, rubrics: Sequence[Rubric], checks: Sequence[Checks],
                     criteria_bucket: int = 8, clip: bool = False) -> np.ndarray:
    """Rewards [B] of ``checks[b]`` under ``rubrics[b]`` with aggregator ``name`` (jitted);
    ``clip``: each reward clipped to [0, 1] (the official Rubric-RL arm). ``REWEIGHTED`` arms:
    the additive sum over their item weights, always clipped.

    The AND-product aggregators need bundled rubrics (``ValueError`` naming the first prompt
    without dimensions: bundle it with ``python -m rewards.bundle``)."""
    if not rubrics:
        return np.zeros((0,), np.float64)
    if name in REWEIGHTED:
        return _reweighted_rewards(name, rubrics, checks, criteria_bucket)
    if name in AND_AGGREGATORS:
        for rubric in rubrics:
            if not rubric.dimensions:
                raise ValueError(f"aggregator {name!r} needs bundled rubrics but prompt "
                                 f"{rubric.prompt_id!r} has no dimensions; bundle the rubric file "
                                 f"first: python -m rewards.bundle IN OUT judge=...")
    q, a, fail = padded_batch(rubrics, checks, criteria_bucket)
    fn = jitted_aggregator(name, MAX_DIMS)
    r = fn(jnp.asarray(q), jnp.asarray(a.weights), jnp.asarray(a.dim_index), jnp.asarray(fail),
           jnp.asarray(a.mask))
    r = np.asarray(r, np.float64)
    return np.clip(r, 0.0, 1.0) if clip else r


def _reweighted_rewards(name: str, rubrics: Sequence[Rubric], checks: Sequence[Checks],
                        criteria_bucket: int) -> np.ndarray:
    q, a, fail = padded_batch(rubrics, checks, criteria_bucket)
    weights = np.zeros_like(a.weights)
    for b, r in enumerate(rubrics):
        weights[b, :r.num_criteria] = reweighted(name, r)
    fn = jitted_aggregator("additive", MAX_DIMS)
    r = fn(jnp.asarray(q), jnp.asarray(weights), jnp.asarray(a.dim_index), jnp.asarray(fail),
           jnp.asarray(a.mask))
    return np.clip(np.asarray(r, np.float64), 0.0, 1.0)


def fitness_rate(checks: Sequence[Checks]) -> np.ndarray:
    """Held-out pass rate ``c_b = (1/F_b) sum_j pass_bj`` [B] over all ``F_b`` held-out
    criteria (a check that fell back has ``pass = 0``; NaN where a rubric has none)."""
    return np.asarray([float(np.mean(ch.fitness)) if ch.fitness else math.nan for ch in checks])


def word_count(text: str) -> int:
    return len(text.split())


@dataclasses.dataclass(frozen=True)
class Scores:
    """Per-response scores: the aggregator's ``reward``, coverage ``g``, fitness ``c`` (NaN
    without held-out criteria), ``length`` in words, the raw ``checks``, the ratings that
    ended on the judge's fallback (``implicit`` only); for the dimension arms ``judge_failed``
    per response and the tallies of ``dimension_rewards``."""

    reward: np.ndarray
    coverage: np.ndarray
    fitness: np.ndarray
    length: np.ndarray
    checks: tuple[Checks, ...]
    rating_fallbacks: int = 0
    judge_failed: np.ndarray | None = None  # dimension arms: 1 where the group failed closed
    dimension_counts: Mapping[str, float] = dataclasses.field(default_factory=dict)


def rated_rewards(judge: Judge, items: Sequence[ScoreItem]) -> tuple[np.ndarray, np.ndarray]:
    """RaR implicit rewards ``(rating - 1) / 9`` from ONE batched ``judge.rate`` call (one
    rating per item, the whole training checklist shown), and [B] bool: which ratings fell
    back (the judge gave no usable rating)."""
    reqs = [RateRequest(it.context, it.response, tuple(c.text for c in it.rubric.criteria),
                        tuple(float(c.weight) for c in it.rubric.criteria)) for it in items]
    results = judge.rate(reqs) if reqs else []
    if len(results) != len(reqs):
        raise RuntimeError(f"judge.rate returned {len(results)} results for {len(reqs)} requests")
    ratings = np.asarray([r.rating for r in results], np.float64)
    return (np.asarray(rating_reward(jnp.asarray(ratings)), np.float64),
            np.asarray([bool(r.fallback) for r in results], bool))


def dimension_rewards(judge: Judge, items: Sequence[ScoreItem], aggregator: str,
                      group_sizes: Sequence[int] | None = None, group_retries: int = 1
                      ) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """(rewards [B], judge_failed [B], tallies) of an official dimension arm
    (``rewards.dimension_judging.judge_groups``; ``group_sizes`` None: each item its own
    group)."""
    sizes = [1] * len(items) if group_sizes is None else list(group_sizes)
    g = judge_groups(judge, [DimensionItem(it.context, it.response, it.rubric) for it in items],
                     sizes, DIMENSION_ARMS[aggregator], group_retries)
    counts = {"rubric/judge_failed": float(g.judge_failed.sum()),
              "rubric/judge_failed_groups": float(g.failed_groups),
              "rubric/group_retries": float(g.group_retries),
              "rubric/failed_dimension_calls": float(g.failed_calls)}
    return g.reward, g.judge_failed, counts


def item_rewards(judge: Judge, items: Sequence[ScoreItem], checks: Sequence[Checks],
                 aggregator: str, criteria_bucket: int = 8, clip: bool = False,
                 group_sizes: Sequence[int] | None = None, group_retries: int = 1
                 ) -> tuple[np.ndarray, int, np.ndarray | None, dict[str, float]]:
    """(rewards [B], rating fallbacks, judge_failed [B] or None, tallies) of ``items`` under
    ``aggregator``: a check aggregator reads the judge's ``checks`` (:func:`aggregate_checks`),
    ``implicit`` and the dimension arms make their own batched call (:func:`rated_rewards`,
    :func:`dimension_rewards`)."""
    if aggregator == JUDGE_RATED:
        reward, fell_back = rated_rewards(judge, items)
        return reward, int(fell_back.sum()), None, {}
    if aggregator in DIMENSION_ARMS:
        reward, failed, counts = dimension_rewards(judge, items, aggregator, group_sizes,
                                                   group_retries)
        return reward, 0, failed, counts
    rubrics = [it.rubric for it in items]
    return aggregate_checks(aggregator, rubrics, checks, criteria_bucket, clip), 0, None, {}


def judged_rewards(judge: Judge, items: Sequence[ScoreItem], checks: Sequence[Checks],
                   aggregator: str) -> tuple[np.ndarray, np.ndarray]:
    """(rewards [B], failed [B] bool) of ``items`` under ``aggregator``: ``failed`` marks a
    reward that rests on a failed judge call, not on a judgment: a check aggregator's item
    with a training check or failure clause on the judge's fallback, an ``implicit`` rating
    that fell back, a dimension arm's group that failed closed. What an audit leaves out."""
    if aggregator == JUDGE_RATED:
        return rated_rewards(judge, items)
    reward, _, failed, _ = item_rewards(judge, items, checks, aggregator)
    if failed is None:
        failed = np.asarray([ch.fallbacks > ch.fitness_fallbacks for ch in checks], bool)
    return reward, np.asarray(failed, bool)


def score_items(judge: Judge, items: Sequence[ScoreItem], aggregator: str = "prorubric",
                use_probs: bool = False, criteria_bucket: int = 8, clip: bool = False,
                group_sizes: Sequence[int] | None = None, group_retries: int = 1) -> Scores:
    """Judge (one batched check call) and aggregate: reward, coverage g, fitness c, length.
    ``implicit``: the reward is the judge's rating (one more batched call, ``rated_rewards``);
    a dimension arm: one more batched ``check_dimensions`` call (``dimension_rewards``);
    ``clip``: rewards of the check aggregators clipped to [0, 1]."""
    checks = judge_checks(judge, items, use_probs)
    rubrics = [it.rubric for it in items]
    reward, fallbacks, failed, counts = item_rewards(
        judge, items, checks, aggregator, criteria_bucket, clip, group_sizes, group_retries)
    coverage = aggregate_checks("additive", rubrics, checks, criteria_bucket)
    return Scores(reward=reward, coverage=coverage, fitness=fitness_rate(checks),
                  length=np.asarray([word_count(it.response) for it in items], np.float64),
                  checks=tuple(checks), rating_fallbacks=fallbacks, judge_failed=failed,
                  dimension_counts=counts)


@dataclasses.dataclass(frozen=True)
class RubricReport:
    """A rubric task's evaluation of answers: per answer ``reward``, ``coverage`` (g),
    ``fitness`` (c) and ``length`` (words); the split's means and HealthBench's scores in
    ``summary``; and per answer the values HealthBench's scores average
    (``rewards.healthbench.healthbench_values``, NaN where undefined), for their intervals."""

    reward: np.ndarray
    coverage: np.ndarray
    fitness: np.ndarray
    length: np.ndarray
    summary: dict[str, float]
    healthbench: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)


def rubric_report(s: Scores, rubrics: Sequence[Rubric],
                  example_tags: Sequence[Sequence[str] | None]) -> RubricReport:
    """The report of scored answers ``s`` to prompts with ``rubrics``; ``example_tags[b]``:
    the HealthBench example tags of answer b's prompt (its themes), None where the prompt is
    not scored the HealthBench way (no scores of its own in ``healthbench``)."""
    from rewards.healthbench import clipped_means, healthbench_values

    summary = {"reward": nanmean(s.reward), "coverage": nanmean(s.coverage),
               "fitness": nanmean(s.fitness), "length": nanmean(s.length)}
    rows = [b for b, tags in enumerate(example_tags) if tags is not None]
    per_answer: dict[str, np.ndarray] = {}
    if rows:
        values = healthbench_values(
            [[c.weight for c in rubrics[b].criteria] for b in rows],
            [s.checks[b].q[:rubrics[b].num_criteria] for b in rows],
            [[c.tags for c in rubrics[b].criteria] for b in rows],
            [tuple(example_tags[b] or ()) for b in rows])
        summary |= clipped_means(values)
        for key, v in values.items():
            per_answer[key] = np.full(len(example_tags), np.nan)
            per_answer[key][rows] = v
    return RubricReport(s.reward, s.coverage, s.fitness, s.length, summary, per_answer)


def nanmean(x: np.ndarray) -> float:
    """The mean of the finite entries of ``x`` (NaN when there are none)."""
    x = np.asarray(x, np.float64)
    return float(np.mean(x[np.isfinite(x)])) if np.isfinite(x).any() else math.nan
