"""``RuleJudge``: the judge protocol (``judges.base``) with deterministic predicates, so the
rubric memory runs end to end without an LLM. Criteria, rubrics and dimension sub-rules are read
by the criterion language (``judges.rule_language``); rubrics are induced and consolidated from
the library of process features of search trajectories (``judges.search_features``).

A criterion the language cannot read is not guessed at: it gets the defined fallback (not met,
prob 0.5, ``fallback=True``) and is counted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from core.search_r1 import parse_trajectory
from judges.base import JUDGE_STAT_KEYS, Counters, order_coin, tie_coin
from judges.rule_language import compile_rule, rule_bundle
from judges.search_features import (
    FEATURE_LIBRARY_VERSION,
    FEATURES,
    Predicate,
    cover_match,
    feature_predicate,
    parse_feature_id,
)
from judges.types import (
    GRADE_MAX,
    RATING_MIN,
    TIE,
    Bundle,
    BundleRequest,
    CheckRequest,
    CheckResult,
    ConsolidateRequest,
    DimensionCriterion,
    DimensionRequest,
    DimensionResult,
    Draft,
    EquivRequest,
    EquivResult,
    InduceRequest,
    PairRequest,
    PairResult,
    RateRequest,
    RateResult,
    as_draft,
)


def _rubric_rule(rubric: Draft, predicates: Mapping[str, Predicate]) -> Predicate | None:
    """A rubric's predicate: its feature, else its text / title / description as a rule."""
    if rubric.feature:
        return feature_predicate(rubric.feature)
    for cand in (rubric.text(), rubric.title, rubric.description):
        pred = compile_rule(cand, predicates)
        if pred is not None:
            return pred
    return None


def _feature_param(d: Draft) -> int | None:
    parsed = parse_feature_id(d.feature) if d.feature else None
    return parsed[1] if parsed else None


def _sub_rule(rule: str, predicates: Mapping[str, Predicate]) -> Predicate | None:
    """A dimension's sub-rule: ``not:R`` is the negation of all of ``R``, else ``compile_rule``."""
    head, sep, rest = rule.strip().partition(":")
    if sep and head.strip().lower() == "not":
        inner = compile_rule(rest, predicates)
        return None if inner is None else (lambda c, r: not inner(c, r))
    return compile_rule(rule, predicates)


class RuleJudge:
    """The judge protocol with deterministic predicates (no model, no I/O).

    Args:
        seed: seeds the presentation-order and tie-break coins of pairwise comparisons.
        predicates: extra named predicates ``(context, response) -> bool`` for ``fn:NAME``.
        max_drafts: features per induction.
        max_common: rubrics per consolidation.
        min_support: drafts a feature family needs to become a common rubric.
        k_min: fewest bundle dimensions allowed.
        k_max: most bundle dimensions allowed.
    """

    def __init__(
        self,
        *,
        seed: int = 0,
        predicates: Mapping[str, Predicate] | None = None,
        max_drafts: int = 3,
        max_common: int = 2,
        min_support: int = 2,
        k_min: int = 2,
        k_max: int = 5,
    ):
        self.seed = int(seed)
        self.predicates = dict(predicates or {})
        self.max_drafts = int(max_drafts)
        self.max_common = int(max_common)
        self.min_support = int(min_support)
        self.k_min, self.k_max = int(k_min), int(k_max)
        self._c = Counters(JUDGE_STAT_KEYS)

    def __repr__(self) -> str:
        return f"RuleJudge(seed={self.seed}, predicates={sorted(self.predicates)})"

    def _fallback(self, op: str) -> None:
        self._c.inc("fallbacks")
        self._c.inc(f"fallbacks_{op}")

    def check(self, reqs: Sequence[CheckRequest]) -> list[CheckResult]:
        self._c.inc("requests_check", len(reqs))
        out = []
        for r in reqs:
            pred = compile_rule(r.criterion, self.predicates)
            if pred is None:
                self._fallback("check")
                out.append(CheckResult(met=False, prob=0.5, fallback=True))
            else:
                met = bool(pred(r.context, r.response))
                out.append(CheckResult(met=met, prob=1.0 if met else 0.0))
        return out

    def rate(self, reqs: Sequence[RateRequest]) -> list[RateResult]:
        """A deterministic holistic rating from the checklist's rules::

            pass_i = met_i (w_i >= 0) or not met_i (w_i < 0, a pitfall)
            f      = sum_i |w_i| pass_i / sum_i |w_i|        (weighted pass fraction)
            rating = 1 + floor(9 f + 1/2)                      (nearest of 1..10, halves up)

        so the implicit reward (rating - 1) / 9 is f rounded to ninths. A checklist with a
        criterion the rule language cannot read, or without weight, is not guessed at: the
        fallback rating 1 with ``fallback=True``, counted."""
        self._c.inc("requests_rate", len(reqs))
        return [self._rate_one(r) for r in reqs]

    def _rate_one(self, r: RateRequest) -> RateResult:
        preds = [compile_rule(c, self.predicates) for c in r.criteria]
        rules = [p for p in preds if p is not None]
        total = sum(abs(float(w)) for w in r.weights)
        if len(rules) != len(preds) or len(rules) != len(r.weights) or total <= 0:
            self._fallback("rate")
            return RateResult(RATING_MIN, fallback=True)
        passed = sum((abs(float(w)) for p, w in zip(rules, r.weights)
                      if bool(p(r.context, r.response)) == (w >= 0)), 0.0)
        return RateResult(RATING_MIN + math.floor(9 * passed / total + 0.5))

    def compare(self, reqs: Sequence[PairRequest]) -> list[PairResult]:
        self._c.inc("requests_compare", len(reqs))
        out = []
        for r in reqs:
            a_first = order_coin(self.seed, r)
            pred = _rubric_rule(as_draft(r.rubric), self.predicates)
            if pred is None:
                self._fallback("compare")
                sa = sb = False
            else:
                sa, sb = bool(pred(r.context, r.a)), bool(pred(r.context, r.b))
            if sa != sb:
                winner = 0 if sa else 1
                out.append(PairResult(winner=winner, prob_a=1.0 - winner, a_shown_first=a_first))
            else:
                out.append(
                    PairResult(
                        winner=TIE,
                        prob_a=0.5,
                        a_shown_first=a_first,
                        fallback=pred is None,
                        tie_break=tie_coin(self.seed, r),
                    )
                )
        return out

    def induce(self, reqs: Sequence[InduceRequest]) -> list[tuple[Draft, ...]]:
        """Features the best trajectory satisfies and the worst does not; those that also
        separate the best from the hard negative come first, then library order."""
        self._c.inc("requests_induce", len(reqs))
        out = []
        for r in reqs:
            best, worst = parse_trajectory(r.best), parse_trajectory(r.worst)
            hard = parse_trajectory(r.hard_negative) if r.hard_negative is not None else None
            ranked: list[tuple[int, int, Draft]] = []
            for rank, feat in enumerate(FEATURES.values()):
                chosen: tuple[bool, int | None] | None = None
                for p in feat.params or (None,):
                    if not feat.predicate(r.question, best, p) or feat.predicate(
                        r.question, worst, p
                    ):
                        continue
                    beats_hard = hard is None or not feat.predicate(r.question, hard, p)
                    if chosen is None or (beats_hard and not chosen[0]):
                        chosen = (beats_hard, p)
                if chosen is not None:
                    ranked.append((0 if chosen[0] else 1, rank, feat.draft(chosen[1])))
            ranked.sort(key=lambda x: (x[0], x[1]))
            out.append(tuple(d for _, _, d in ranked[: self.max_drafts]))
        return out

    def consolidate(self, reqs: Sequence[ConsolidateRequest]) -> list[tuple[Draft, ...]]:
        """Merge drafts by feature family (a parametrised family keeps its most lenient
        parameter); families supported by >= ``min_support`` drafts become common rubrics,
        most supported first. Free-text drafts (no feature) are merged by exact title."""
        self._c.inc("requests_consolidate", len(reqs))
        out = []
        for r in reqs:
            support: dict[str, list[Draft]] = {}
            for d in r.drafts:
                parsed = parse_feature_id(d.feature) if d.feature else None
                key = f"feature:{parsed[0].name}" if parsed else f"title:{d.title.strip()}"
                support.setdefault(key, []).append(d)
            common: list[tuple[int, int, Draft]] = []
            for order, (key, ds) in enumerate(support.items()):
                if len(ds) < self.min_support:
                    continue
                if key.startswith("feature:"):
                    feat = FEATURES[key.split(":", 1)[1]]
                    params = [_feature_param(d) for d in ds]
                    given = [p for p in params if p is not None]
                    merged = feat.draft(feat.merge(given) if given else None)
                else:
                    merged = ds[0]
                common.append((-len(ds), order, merged))
            common.sort(key=lambda x: (x[0], x[1]))
            out.append(tuple(d for _, _, d in common[: self.max_common]))
        return out

    def bundle(self, reqs: Sequence[BundleRequest]) -> list[Bundle]:
        self._c.inc("requests_bundle", len(reqs))
        out = []
        for i, r in enumerate(reqs):
            if len(r.criteria) != len(r.weights):
                raise ValueError(
                    f"bundle request {i}: {len(r.criteria)} criteria but {len(r.weights)} weights"
                )
            if not r.criteria:
                out.append(Bundle(dimensions=(), error="empty checklist"))
                continue
            dims = rule_bundle(r.criteria, r.weights, self.k_min, self.k_max)
            out.append(Bundle(dimensions=dims))
        return out

    def equivalent(self, reqs: Sequence[EquivRequest]) -> list[EquivResult]:
        self._c.inc("requests_equivalent", len(reqs))
        out = []
        for r in reqs:
            eq = cover_match(r.prediction, r.golds)
            out.append(EquivResult(equivalent=eq, prob=float(eq)))
        return out

    def check_dimensions(self, reqs: Sequence[DimensionRequest]) -> list[DimensionResult]:
        """The rule judge's stand-in for a holistic judgment of each dimension paragraph: it
        cannot read the paragraph, so it evaluates the dimension's executable sub-rules
        (``DimensionCriterion.rules``; the criterion text itself when there are none)::

            binary: verdict = AND_j rule_j(response)
            graded: grade   = floor(3 * #{j: rule_j holds} / #rules)   (3 only when all hold),
                    score   = grade / 3

        A criterion with a rule the language cannot read fails the whole call
        (``DimensionResult((), failed=True)``, counted in ``failures_dimensions``), as an LLM
        call with no usable verdict does. Deterministic: the temperature is ignored."""
        self._c.inc("requests_dimensions", len(reqs))
        return [self._dimensions_one(r) for r in reqs]

    def _dimensions_one(self, r: DimensionRequest) -> DimensionResult:
        scores = []
        for k, c in enumerate(r.criteria):
            passed = self._sub_rules(c, r.context, r.response)
            if passed is None:
                self._c.inc("failures_dimensions")
                return DimensionResult((), failed=True,
                                       error=f"criterion {k + 1}: a rule the language cannot read")
            if r.verdict == "graded":
                scores.append(math.floor(GRADE_MAX * sum(passed) / len(passed)) / GRADE_MAX)
            else:
                scores.append(float(all(passed)))
        return DimensionResult(tuple(scores))

    def _sub_rules(self, c: DimensionCriterion, context: str, response: str
                   ) -> list[bool] | None:
        """Each sub-rule's truth on the response; None when one cannot be compiled. A sub-rule
        ``not:R`` negates the whole of ``R`` (also when ``R`` is a ``&&`` conjunction)."""
        preds = [_sub_rule(rule, self.predicates) for rule in (c.rules or (c.text,))]
        if any(p is None for p in preds):
            return None
        return [bool(p(context, response)) for p in preds]  # type: ignore[misc]

    def stats(self) -> dict[str, int]:
        return self._c.snapshot()

    def versions(self) -> dict[str, str]:
        return {"rule_features": FEATURE_LIBRARY_VERSION}

    def close(self) -> None:
        pass

    def __enter__(self) -> RuleJudge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
