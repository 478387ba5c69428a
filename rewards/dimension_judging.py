"""The ProRubric authors' reward mechanism and its official arms: dimensions judged as whole
paragraphs, one judge call per response, one verdict per dimension, fail-closed prompt groups.

Source: the authors' released code (GitHub ``Estrellajer/ProRubric``: ``reward/judge_client.py``,
``reward/rubric_judge.py``, ``reward/rubric_judge_repeat.py``, ``data/build_raw_and.py``,
``data/build_no_failure_clauses.py``, ``configs/``); the code and wording here are ours.

Reward of one response (``rewards.aggregate.clipped_weighted_mean``)::

    R = clip01( sum_d W_d v_d / sum_d max(0, W_d) ),   W_d = sum_{i in I_d} |w_i| by default

``v_d`` is the judge's verdict on dimension ``d`` (binary: 1 = every requirement of the
paragraph holds; for ``W_d < 0`` the paragraph describes undesirable behaviour and 1 = present)
or, for the graded arm, grade/3.  The judge sees only the dimension texts, never the items.

Arms (``DIMENSION_ARMS``; each is one ``algo=`` away, ``conf/algo/*.yaml``):

* ``prorubric_official``: the dimension paragraphs (``Dimension.description``);
* ``rubric_rl_official``: the authors' atomic (Rubric-RL) arm: every atomic item its own
  criterion in the same single call, the same clipped formula over ``w_i`` (needs no bundle);
* ``raw_and_verbatim``: the text is the dimension's items verbatim, joined as one conjunction
  (pitfalls as must-not-hold), no failure clause (``build_raw_and.py``);
* ``prorubric_no_failure``: the paragraphs with their failure sentences ("... fails if ...")
  removed (``build_no_failure_clauses.py``: a remainder under 40 characters keeps the text);
* ``prorubric_k1``: one dimension (a ``K = 1`` bundle as it is; a ``K > 1`` bundle merged into
  one criterion whose text is its paragraphs in order and whose weight is ``sum_d W_d``; an
  unbundled rubric as one dimension of all its items);
* ``prorubric_graded``: each dimension graded 0..3, score grade / 3, the mean reward of 2 draws
  at temperature 0.7 (``rubric_judge_repeat.py``).

A dimension without a ``description`` (bundles written before dimensions carried one, and the
shipped ``task=rubric_chat``) is given a paragraph composed from its items and failure clause
(``fallback_paragraph``), so every arm runs on every bundled rubric.

The rule judge cannot read paragraphs: every criterion also carries executable sub-rules
(``dimension_rules``: each positive item, ``not:`` each pitfall and ``not:`` the failure clause
where the arm has one) and the rule judge's verdict is their conjunction (its stand-in for a
holistic judgment; ``judges.rule.RuleJudge.check_dimensions``).

Failures (``judge_groups``): the judge retries each call itself (``LLMJudge``: 3 attempts, the
first greedy, then temperature 0.7); a prompt group with any call still failed is judged again
as a whole ``group_retries`` times (the authors: once); then every member gets reward 0 and
``judge_failed = 1``: a zero-variance group, no fabricated per-row score.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Literal

import jax.numpy as jnp
import numpy as np

from judges.base import Judge
from judges.types import DimensionCriterion, DimensionRequest, DimensionResult
from rewards.aggregate import clipped_weighted_mean
from rewards.rubric import Dimension, Rubric

TextVariant = Literal["paragraph", "verbatim_and", "no_failure_clauses", "atomic"]


@dataclasses.dataclass(frozen=True)
class DimensionArm:
    """How an arm writes and judges the dimensions.

    ``text``: which criterion text the judge reads; ``single``: merge into one dimension
    (K = 1); ``verdict``: ``binary`` or ``graded``; ``draws`` judge calls per response, at
    ``temperature`` (None: the judge's schedule), rewards averaged.
    """

    text: TextVariant
    single: bool = False
    verdict: Literal["binary", "graded"] = "binary"
    draws: int = 1
    temperature: float | None = None

    @property
    def failure_clauses(self) -> bool:
        return self.text == "paragraph"


#: Aggregator name -> the official arm it runs (``algo.rewarder_options.aggregator``).
DIMENSION_ARMS: dict[str, DimensionArm] = {
    "prorubric_official": DimensionArm("paragraph"),
    "rubric_rl_official": DimensionArm("atomic"),
    "raw_and_verbatim": DimensionArm("verbatim_and"),
    "prorubric_no_failure": DimensionArm("no_failure_clauses"),
    "prorubric_k1": DimensionArm("paragraph", single=True),
    "prorubric_graded": DimensionArm("paragraph", verdict="graded", draws=2, temperature=0.7),
}

#: The authors' rule for stripping failure sentences: a remainder shorter keeps the text.
MIN_STRIPPED_CHARS = 40


# --------------------------------------------------------------------------------------------
# dimension texts
# --------------------------------------------------------------------------------------------


def _item_text(rubric: Rubric, i: int) -> str:
    c = rubric.criteria[i]
    return (c.title or c.text).strip().rstrip(".")


def fallback_paragraph(rubric: Rubric, d: Dimension, failure: bool = True) -> str:
    """A dimension paragraph composed from its items (titles, else texts) when the bundle wrote
    none: what a good answer does, what it must avoid, and (``failure``) when it fails."""
    pos = [_item_text(rubric, i) for i in d.criteria if rubric.criteria[i].weight >= 0]
    neg = [_item_text(rubric, i) for i in d.criteria if rubric.criteria[i].weight < 0]
    parts = []
    if pos:
        parts.append(f"{d.name}: a good answer does all of the following: {'; '.join(pos)}.")
    else:
        parts.append(f"{d.name}.")
    if neg:
        parts.append(f"It must avoid all of the following: {'; '.join(neg)}.")
    if failure and d.failure:
        parts.append(f"The answer fails this dimension if it does this: "
                     f"{d.failure.strip().rstrip('.')}.")
    return " ".join(parts)


_SENTENCE = re.compile(r"[^.!?]*(?:[.!?]+|$)")
_FAILS_IF = re.compile(r"\bfail(?:s|ed)?\b(?:\s+[\w-]+){0,3}?\s+(?:if|when|whenever)\b",
                       re.IGNORECASE)


def strip_failure_clauses(text: str) -> str:
    """``text`` without its sentences that say when the criterion fails ("... fails if ...",
    "... fails this dimension when ..."); when under ``MIN_STRIPPED_CHARS`` would remain, the
    text is kept whole (the authors' rule)."""
    sentences = [s for s in _SENTENCE.findall(text) if s.strip()]
    kept = " ".join(s.strip() for s in sentences if not _FAILS_IF.search(s))
    if kept == " ".join(s.strip() for s in sentences):
        return text.strip()
    return kept if len(kept) >= MIN_STRIPPED_CHARS else text.strip()


def verbatim_conjunction(rubric: Rubric, d: Dimension) -> str:
    """The raw-AND text: the dimension's item texts verbatim under one all-of header, each
    pitfall as a part that must not hold; no failure clause."""
    parts = []
    for k, i in enumerate(d.criteria, start=1):
        c = rubric.criteria[i]
        body = c.text.strip()
        parts.append(f"({k}) must NOT hold: {body}" if c.weight < 0 else f"({k}) {body}")
    return ("This criterion is met only if every numbered part below holds; if any single "
            "part does not hold, it is not met: " + " ".join(parts))


def dimension_text(rubric: Rubric, d: Dimension, variant: TextVariant) -> str:
    """The text the judge reads for ``d`` under an arm's text ``variant``."""
    if variant == "verbatim_and":
        return verbatim_conjunction(rubric, d)
    paragraph = d.description.strip() or fallback_paragraph(rubric, d, failure=True)
    return strip_failure_clauses(paragraph) if variant == "no_failure_clauses" else paragraph


def dimension_rules(rubric: Rubric, d: Dimension, weight: float, failure: bool
                    ) -> tuple[str, ...]:
    """Executable sub-rules of ``d`` for the rule judge (conjunction).

    ``weight >= 0``: each positive item's rule, ``not:`` each pitfall's, and ``not:`` the failure
    clause (``failure``).  ``weight < 0`` (the dimension describes undesirable behaviour; the
    verdict is "present"): its items' rules as they are."""
    if weight < 0:
        return tuple(rubric.criteria[i].text for i in d.criteria)
    rules = [c.text if c.weight >= 0 else f"not:{c.text}"
             for c in (rubric.criteria[i] for i in d.criteria)]
    if failure and d.failure:
        rules.append(f"not:{d.failure}")
    return tuple(rules)


def _negated(rule: str) -> str:
    head, sep, rest = rule.partition(":")
    return rest if sep and head.strip().lower() == "not" else f"not:{rule}"


def dimension_criteria(rubric: Rubric, arm: DimensionArm) -> tuple[DimensionCriterion, ...]:
    """The criteria one judge call sees for ``rubric`` under ``arm``, with their weights
    ``W_d`` and sub-rules.  A ``ValueError`` names the prompt when an arm that needs a bundle
    meets an unbundled rubric."""
    if arm.text == "atomic":
        return tuple(DimensionCriterion(c.text, float(c.weight), (c.text,))
                     for c in rubric.criteria)
    if not rubric.dimensions:
        if not arm.single:
            raise ValueError(f"arm needs bundled rubrics but prompt {rubric.prompt_id!r} has no "
                             f"dimensions; bundle the rubric file first (python -m "
                             f"rewards.bundle IN OUT judge=...)")
        whole = Dimension("whole answer", tuple(range(rubric.num_criteria)))
        rubric = rubric.with_dimensions([whole])
    weights = rubric.dimension_weights()
    crits = [DimensionCriterion(dimension_text(rubric, d, arm.text), w,
                                dimension_rules(rubric, d, w, arm.failure_clauses))
             for d, w in zip(rubric.dimensions, weights)]
    if not arm.single or len(crits) == 1:
        return tuple(crits)
    rules = tuple(r for c in crits for r in (c.rules if c.weight >= 0 else
                                             tuple(_negated(x) for x in c.rules)))
    text = " ".join(c.text for c in crits)
    return (DimensionCriterion(text, float(sum(weights)), rules),)


# --------------------------------------------------------------------------------------------
# judging and the reward
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DimensionItem:
    """One response to judge: the prompt text, the response and its rubric."""

    context: str
    response: str
    rubric: Rubric


@dataclasses.dataclass(frozen=True)
class GroupScores:
    """Per response: ``reward`` [B], ``judge_failed`` [B] (1 where its group failed closed),
    ``verdicts`` (the mean score per dimension over draws; () where failed); and the tallies
    ``failed_groups``, ``group_retries``, ``failed_calls`` (calls still failed after the
    judge's own attempts, over every round)."""

    reward: np.ndarray
    judge_failed: np.ndarray
    verdicts: tuple[tuple[float, ...], ...]
    failed_groups: int
    group_retries: int
    failed_calls: int


def _requests(items: Sequence[DimensionItem], arm: DimensionArm) -> list[DimensionRequest]:
    out = []
    for it in items:
        crits = dimension_criteria(it.rubric, arm)
        out += [DimensionRequest(it.context, it.response, crits, arm.verdict, arm.temperature)
                for _ in range(arm.draws)]
    return out


def _judge(judge: Judge, reqs: Sequence[DimensionRequest]) -> list[DimensionResult]:
    res = judge.check_dimensions(reqs) if reqs else []
    if len(res) != len(reqs):
        raise RuntimeError(f"judge.check_dimensions returned {len(res)} results for "
                           f"{len(reqs)} requests")
    for r, q in zip(res, reqs):
        if not r.failed and len(r.scores) != len(q.criteria):
            raise RuntimeError(f"judge.check_dimensions gave {len(r.scores)} verdicts for "
                               f"{len(q.criteria)} criteria")
    return res


def judge_groups(judge: Judge, items: Sequence[DimensionItem], group_sizes: Sequence[int],
                 arm: DimensionArm, group_retries: int = 1) -> GroupScores:
    """Judge every response (``arm.draws`` calls each, one batched ``check_dimensions``), judge
    again as a whole each prompt group with a failed call (``group_retries`` rounds), and fail
    the groups still failing closed: reward 0 and ``judge_failed = 1`` for every member."""
    if sum(group_sizes) != len(items):
        raise ValueError(f"group sizes {list(group_sizes)} do not add up to {len(items)} items")
    reqs = _requests(items, arm)
    per_group = [n * arm.draws for n in group_sizes]
    starts = np.concatenate([[0], np.cumsum(per_group)]).astype(int)
    results: list[DimensionResult] = _judge(judge, reqs)
    failed_calls = sum(r.failed for r in results)

    def failing() -> list[int]:
        return [g for g in range(len(group_sizes))
                if any(r.failed for r in results[starts[g]:starts[g + 1]])]

    retries = 0
    for _ in range(max(int(group_retries), 0)):
        groups = failing()
        if not groups:
            break
        retries += len(groups)
        idx = [j for g in groups for j in range(starts[g], starts[g + 1])]
        for j, r in zip(idx, _judge(judge, [reqs[j] for j in idx])):
            results[j] = r
            failed_calls += r.failed
    return _group_scores(items, results, arm, group_sizes, failing(), retries, failed_calls)


def _group_scores(items: Sequence[DimensionItem], results: Sequence[DimensionResult],
                  arm: DimensionArm, group_sizes: Sequence[int], failed: Sequence[int],
                  retries: int, failed_calls: int) -> GroupScores:
    owner = np.repeat(np.arange(len(group_sizes)), group_sizes)
    bad = np.isin(owner, np.asarray(failed, int))
    reward = np.zeros(len(items), np.float64)
    verdicts: list[tuple[float, ...]] = []
    for b, it in enumerate(items):
        draws = results[b * arm.draws:(b + 1) * arm.draws]
        if bad[b]:
            verdicts.append(())
            continue
        w = [c.weight for c in dimension_criteria(it.rubric, arm)]
        v = np.asarray([d.scores for d in draws], np.float64)  # [draws, K]
        reward[b] = float(np.mean(np.asarray(clipped_weighted_mean(jnp.asarray(v),
                                                                   jnp.asarray(w)))))
        verdicts.append(tuple(float(x) for x in v.mean(axis=0)))
    return GroupScores(reward=reward, judge_failed=bad.astype(np.float64),
                       verdicts=tuple(verdicts), failed_groups=len(failed),
                       group_retries=retries, failed_calls=failed_calls)
