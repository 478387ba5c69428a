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
  ``weighted_atomic_official`` and ``grouped_mean_official`` the same over the re-derived
  item weights of their Weighted and Grouped-mean controls (``rewards.reweight``);
* ``raw_and_verbatim``: the text is the dimension's items verbatim, joined as one conjunction,
  no failure clause, as ``build_raw_and.py`` builds it: every item, a pitfall too, is a part
  that must hold (the dimension's weight is ``sum |w_i|``, so a pitfall's text reads as a
  requirement); ``raw_and_marked`` (ours): the same with each pitfall a part that must NOT
  hold;
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
from rewards.reweight import reweighted
from rewards.rubric import Dimension, Rubric

TextVariant = Literal["paragraph", "verbatim_and", "verbatim_and_marked", "no_failure_clauses",
                      "atomic"]


@dataclasses.dataclass(frozen=True)
class DimensionArm:
    """How an arm writes and judges the dimensions.

    ``text``: which criterion text the judge reads; ``single``: merge into one dimension
    (K = 1); ``verdict``: ``binary`` or ``graded``; ``draws`` judge calls per response, at
    ``temperature`` (None: the judge's schedule), rewards averaged; ``weights``: an atomic
    arm's item weights, the rubric's own or re-derived (``rewards.reweight``);
    ``appropriateness``: one more criterion, :data:`APPROPRIATENESS` (see
    :func:`with_appropriateness`).
    """

    text: TextVariant
    single: bool = False
    verdict: Literal["binary", "graded"] = "binary"
    draws: int = 1
    temperature: float | None = None
    weights: Literal["item", "weighted_atomic", "grouped_mean"] = "item"  # atomic arms' weights
    appropriateness: bool = False  # one more criterion: the answer fits the question and asker

    @property
    def failure_clauses(self) -> bool:
        return self.text == "paragraph"


#: Aggregator name -> the official arm it runs (``algo.rewarder_options.aggregator``).
DIMENSION_ARMS: dict[str, DimensionArm] = {
    "prorubric_official": DimensionArm("paragraph"),
    "rubric_rl_official": DimensionArm("atomic"),
    "weighted_atomic_official": DimensionArm("atomic", weights="weighted_atomic"),
    "grouped_mean_official": DimensionArm("atomic", weights="grouped_mean"),
    "raw_and_verbatim": DimensionArm("verbatim_and"),
    "raw_and_marked": DimensionArm("verbatim_and_marked"),
    "prorubric_no_failure": DimensionArm("no_failure_clauses"),
    "prorubric_k1": DimensionArm("paragraph", single=True),
    "prorubric_graded": DimensionArm("paragraph", verdict="graded", draws=2, temperature=0.7),
    "prorubric_appr": DimensionArm("paragraph", appropriateness=True),
    "rubric_rl_appr": DimensionArm("atomic", appropriateness=True),
}

#: The appropriateness criterion of the authors' "+ appr. criterion" arms (their
#: build_appr_criterion.py appends one fixed paragraph to every rubric), in our words.
APPROPRIATENESS = (
    "Appropriateness: the answer fits what was asked and who asked it. It answers the user's "
    "actual question directly and early, before any background or caveats; it keeps to the "
    "scope of the question instead of adding material nobody asked for; and its tone and depth "
    "suit the person asking rather than a generic reader. It fails this dimension if the "
    "question is answered late, only indirectly or not at all, if much unrequested content is "
    "added, or if the register does not suit the asker. It is judged on its own: an answer "
    "complete and correct everywhere else can still fail it.")

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


# A failure sentence as the authors' build_no_failure_clauses.py finds one: from the text's
# start or right after a sentence end and one whitespace character, a sentence (no . ! ? inside)
# saying "fail if" / "fails if", optionally "fails this dimension if" / "fails the criterion
# if", ending at its . ! or ?. Removed in place: the whitespace around it stays, so two
# sentences it separated are two spaces apart; a last sentence without an end mark stays.
_FAILURE_SENTENCE = re.compile(
    r"(?:^|(?<=[.!?]\s))[^.!?]*\bfails?(?: this dimension| the criterion)? if\b[^.!?]*[.!?]",
    re.IGNORECASE)


def strip_failure_clauses(text: str) -> str:
    """``text`` without its failure sentences ("... fails if ...", "... fails this dimension
    if ..."), matched and removed as the authors' build does (see ``_FAILURE_SENTENCE``);
    when under ``MIN_STRIPPED_CHARS`` would remain, the text is kept whole (their rule)."""
    stripped = _FAILURE_SENTENCE.sub("", text).strip()
    if stripped == text.strip():
        return text.strip()
    return stripped if len(stripped) >= MIN_STRIPPED_CHARS else text.strip()


def verbatim_conjunction(rubric: Rubric, d: Dimension, mark_pitfalls: bool = False) -> str:
    """The raw-AND text: the dimension's item texts verbatim under one all-of header (ours in
    words), no failure clause; `mark_pitfalls`: each pitfall a part that must NOT hold (the
    authors' build keeps it as it is)."""
    parts = []
    for k, i in enumerate(d.criteria, start=1):
        c = rubric.criteria[i]
        body = c.text.strip()
        marked = mark_pitfalls and c.weight < 0
        parts.append(f"({k}) must NOT hold: {body}" if marked else f"({k}) {body}")
    return ("This criterion is met only if every numbered part below holds; if any single "
            "part does not hold, it is not met: " + " ".join(parts))


def dimension_text(rubric: Rubric, d: Dimension, variant: TextVariant) -> str:
    """The text the judge reads for ``d`` under an arm's text ``variant``."""
    if variant in ("verbatim_and", "verbatim_and_marked"):
        return verbatim_conjunction(rubric, d, mark_pitfalls=variant == "verbatim_and_marked")
    paragraph = d.description.strip() or fallback_paragraph(rubric, d, failure=True)
    return strip_failure_clauses(paragraph) if variant == "no_failure_clauses" else paragraph


def dimension_rules(rubric: Rubric, d: Dimension, weight: float, failure: bool,
                    pitfalls_as_written: bool = False) -> tuple[str, ...]:
    """Executable sub-rules of ``d`` for the rule judge (conjunction).

    ``weight >= 0``: each positive item's rule, ``not:`` each pitfall's, and ``not:`` the failure
    clause (``failure``).  ``weight < 0`` (the dimension describes undesirable behaviour; the
    verdict is "present"), or `pitfalls_as_written` (the authors' raw-AND text, which asks for
    every item as written): its items' rules as they are."""
    if weight < 0 or pitfalls_as_written:
        return tuple(rubric.criteria[i].text for i in d.criteria) + (
            (f"not:{d.failure}",) if failure and d.failure and weight >= 0 else ())
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
    crits = _arm_criteria(rubric, arm)
    return with_appropriateness(rubric, crits, arm.text == "atomic") if arm.appropriateness \
        else crits


def with_appropriateness(rubric: Rubric, crits: tuple[DimensionCriterion, ...], atomic: bool
                         ) -> tuple[DimensionCriterion, ...]:
    """`crits` and the :data:`APPROPRIATENESS` criterion, weighted as the authors weight it:
    beside dimensions the mean of their weights; beside atomic items ``sum |w_i| / K``, K the
    rubric's number of dimensions, so it has the same share 1 / (K + 1) in both arms (a
    rubric without dimensions: K = 1). Scored on its own like any other criterion. The rule
    judge checks it with the rubric's fitness criteria (``meta["fitness"]``; rubric_chat:
    answers first, concise, no filler, no repeated phrase), none of which the other criteria
    reward; without them it has no rule (always met)."""
    if atomic:
        weight = sum(abs(c.weight) for c in rubric.criteria) / max(1, len(rubric.dimensions))
    else:
        weight = sum(c.weight for c in crits) / len(crits)
    rules = tuple(str(f["text"]) for f in rubric.meta.get("fitness", ()))
    return (*crits, DimensionCriterion(APPROPRIATENESS, float(weight), rules))


def _arm_criteria(rubric: Rubric, arm: DimensionArm) -> tuple[DimensionCriterion, ...]:
    if arm.text == "atomic":
        weights = rubric.weights if arm.weights == "item" else reweighted(arm.weights, rubric)
        return tuple(DimensionCriterion(c.text, float(w), (c.text,))
                     for c, w in zip(rubric.criteria, weights))
    if not rubric.dimensions:
        if not arm.single:
            raise ValueError(f"arm needs bundled rubrics but prompt {rubric.prompt_id!r} has no "
                             f"dimensions; bundle the rubric file first (python -m "
                             f"rewards.bundle IN OUT judge=...)")
        whole = Dimension("whole answer", tuple(range(rubric.num_criteria)))
        rubric = rubric.with_dimensions([whole])
    weights = rubric.dimension_weights()
    crits = [DimensionCriterion(dimension_text(rubric, d, arm.text), w,
                                dimension_rules(rubric, d, w, arm.failure_clauses,
                                                arm.text == "verbatim_and"))
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
