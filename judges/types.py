"""Request and result values of the judge protocol.

Every judge operation is batched: a list of requests in, a list of results out, in the same
order. Requests and results are frozen dataclasses (hashable, safe to keep in the host-side
immutable rubric memory and to log).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True)
class Draft:
    """A rubric: a title and a description of a *process* criterion (not a fact).

    ``feature`` is the identity of a rule-judge process feature (e.g. ``"max_searches:2"``)
    when the rubric was induced by the rule judge; ``None`` for free-text (LLM) rubrics.
    Consolidation merges rule drafts by this identity.
    """

    title: str
    description: str
    feature: str | None = None

    def text(self) -> str:
        """The rubric as one line, as shown to a judge."""
        return f"{self.title}: {self.description}" if self.description else self.title


def as_draft(rubric: Draft | str) -> Draft:
    """Accept a plain string wherever a rubric is expected (title only)."""
    return rubric if isinstance(rubric, Draft) else Draft(title=str(rubric), description="")


# --- criterion check ------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckRequest:
    """Does ``response`` (to ``context``) meet ``criterion``?

    For a pitfall criterion (negative weight), "met" means the undesirable behaviour is present;
    the sign is applied by the aggregator, not by the judge.
    """

    context: str
    response: str
    criterion: str


@dataclass(frozen=True)
class CheckResult:
    """``prob`` is P(met): a logprob-derived probability where the backend has one, else 1.0 or
    0.0. ``fallback`` marks a defined fallback (not met, prob 0.5) after unparseable output."""

    met: bool
    prob: float
    fallback: bool = False


# --- holistic rating (RaR implicit) ---------------------------------------------------------

RATING_MIN, RATING_MAX = 1, 10


@dataclass(frozen=True)
class RateRequest:
    """Rate ``response`` (to ``context``) against the whole checklist at once, on
    ``RATING_MIN..RATING_MAX`` (RaR's implicit aggregation: one judgment per response).
    ``weights[i]`` belongs to ``criteria[i]``; a negative weight marks a pitfall (behaviour
    that should be absent)."""

    context: str
    response: str
    criteria: tuple[str, ...]
    weights: tuple[float, ...]


@dataclass(frozen=True)
class RateResult:
    """An integer rating in 1..10. ``fallback`` marks the defined fallback (rating 1, the
    lowest: no credit, as a check that fell back is "not met") after unreadable output."""

    rating: int
    fallback: bool = False


# --- pairwise comparison --------------------------------------------------------------------


@dataclass(frozen=True)
class PairRequest:
    """Which of two trajectories ``a``/``b`` (answers to ``context``) better satisfies ``rubric``?

    ``seed`` fixes the presentation-order coin for this pair; when ``None`` the coin is derived
    from the judge's seed and the request's content (so a repeat is a cache hit).
    """

    context: str
    a: str
    b: str
    rubric: Draft | str
    seed: int | None = None


TIE = -1


@dataclass(frozen=True)
class PairResult:
    """``winner``: 0 = a, 1 = b, -1 (``TIE``) = tie. ``prob_a`` = P(a better), 0.5 on a tie.

    ``a_shown_first`` reports the randomised presentation order (position-bias bookkeeping).
    ``tie_break`` is a seeded coin (0 or 1) set on ties only, for consumers that need a strict
    preference (e.g. Bradley-Terry); win-rate consumers should count the tie as 0.5.
    """

    winner: int
    prob_a: float
    a_shown_first: bool
    fallback: bool = False
    tie_break: int | None = None


# --- rubric induction and consolidation -----------------------------------------------------


@dataclass(frozen=True)
class InduceRequest:
    """Contrastive triplet of one query group: best, hard negative (may be ``None`` when the group
    has none distinct from the best) and worst trajectory, plus the gold answers."""

    question: str
    best: str
    hard_negative: str | None
    worst: str
    golds: tuple[str, ...] = ()
    # rubrics the policy has recently mastered (algo.lineage_in_induction): shown to an LLM
    # judge so it writes past them; the rule judge ignores them
    mastered: tuple[Draft, ...] = ()


class FallbackDrafts(tuple):
    """The defined fallback of ``induce`` / ``consolidate``: no drafts because the judge failed
    (backend gave up, or output still unparseable after re-asks), not an answer that nothing is
    worth a rubric. It is an empty tuple (``FallbackDrafts() == ()``), so a consumer that only
    reads drafts needs no change; the rubric memory uses ``isinstance`` to keep the drafts it
    sent for a later attempt instead of consuming them."""

    __slots__ = ()

    def __new__(cls) -> FallbackDrafts:
        return super().__new__(cls, ())

    def __getnewargs__(self) -> tuple[()]:  # pickling: rebuilt by ``FallbackDrafts()``
        return ()

    def __repr__(self) -> str:
        return "FallbackDrafts()"


@dataclass(frozen=True)
class ConsolidateRequest:
    """K query-local drafts to abstract into cross-query common rubric(s)."""

    drafts: tuple[Draft, ...]


# --- ProRubric bundling ---------------------------------------------------------------------


@dataclass(frozen=True)
class BundleRequest:
    """A checklist (criterion texts with weights; negative weight = pitfall) of one prompt.

    ``reference`` is the prompt's reference answer, shown to the judge as an anchor (to settle
    items that conflict or are wrong) when the rubric has one.  ``previous_error`` is set on a
    regeneration: why the judge's earlier answer for this checklist could not be used (it also
    makes the regeneration a fresh request, not a cache hit)."""

    prompt: str
    criteria: tuple[str, ...]
    weights: tuple[float, ...]
    reference: str | None = None
    previous_error: str | None = None


class Dimension(NamedTuple):
    """A protocol dimension: 0-based criterion indices into the checklist, an optional failure
    clause ("delays emergency referral"), the ``description`` paragraph (the dimension written
    as one criterion: what a good answer achieves and what makes it fail) and the ``weight`` the
    judge proposed (kept for the record only; the bundler computes ``W_d = sum |w_i|``)."""

    name: str
    indices: tuple[int, ...]
    failure_clause: str | None
    description: str = ""
    weight: float | None = None


@dataclass(frozen=True)
class Bundle:
    """A partition of a checklist into dimensions; every index in exactly one dimension.

    On failure (unparseable or invalid after re-asks) ``dimensions`` is empty and ``error`` says
    why; ``draft`` then holds the judge's last readable but invalid proposal (indices possibly
    out of range, repeated or missing; descriptions possibly empty), empty when nothing was
    readable.  The caller decides what to do (``rewards.bundle`` regenerates, then repairs the
    draft deterministically).
    """

    dimensions: tuple[Dimension, ...]
    error: str | None = None
    draft: tuple[Dimension, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None


# --- dimension judging (ProRubric authors' mechanism) ----------------------------------------

#: Verdict modes of ``check_dimensions``: one boolean per criterion, or a 0..3 grade per criterion.
DIMENSION_VERDICTS = ("binary", "graded")
GRADE_MAX = 3


@dataclass(frozen=True)
class DimensionCriterion:
    """One criterion of a ``check_dimensions`` call: a dimension written as one paragraph.

    ``text`` is what an LLM judge reads; ``weight < 0`` marks a criterion that describes
    undesirable behaviour (its verdict is "the behaviour is present").  ``rules`` are the
    executable sub-rules the rule judge evaluates instead of reading ``text`` (rule language of
    ``judges.rule_language``; its verdict is their conjunction).  Empty ``rules``: the rule judge
    compiles ``text`` itself.
    """

    text: str
    weight: float
    rules: tuple[str, ...] = ()


@dataclass(frozen=True)
class DimensionRequest:
    """Judge every criterion of one response in ONE call.

    ``verdict``: ``"binary"`` (a criterion is satisfied only when the response meets every
    requirement in it) or ``"graded"`` (0..3 per criterion).  ``temperature``: None = the
    judge's retry schedule (first attempt greedy, later attempts at its retry temperature); a
    number = every attempt at that temperature (the graded arm's sampled draws).
    """

    context: str
    response: str
    criteria: tuple[DimensionCriterion, ...]
    verdict: str = "binary"
    temperature: float | None = None


@dataclass(frozen=True)
class DimensionResult:
    """One score per criterion, same order: 1.0 / 0.0 (binary) or grade / 3 (graded).

    ``failed``: no usable verdict after every attempt (``scores`` is empty and ``error`` says
    why); the caller decides (the official rewarder retries the prompt group, then gives every
    member 0).  ``attempts``: calls spent on this request.
    """

    scores: tuple[float, ...]
    failed: bool = False
    error: str | None = None
    attempts: int = 1


# --- answer equivalence ---------------------------------------------------------------------


@dataclass(frozen=True)
class EquivRequest:
    """Does ``prediction`` mean one of the ``golds`` (LLM-judge accuracy)?"""

    question: str
    prediction: str
    golds: tuple[str, ...]


@dataclass(frozen=True)
class EquivResult:
    """``fallback`` marks the defined fallback: normalised cover-exact-match, not a judgment."""

    equivalent: bool
    prob: float
    fallback: bool = False


# --- backend seam ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Completion:
    """One chat completion from a backend.

    ``error`` is set (and ``text`` empty) when the backend gave up on this request (retries
    exhausted); the judge then goes straight to its fallback. ``cached`` marks a cache hit.
    """

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None
    cached: bool = False


Message = dict[str, str]
Messages = list[Message]

