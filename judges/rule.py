"""``RuleJudge``: deterministic criteria as executable predicates, and a library of process
features of search trajectories, so the rubric memory runs end to end without an LLM.

Criterion language (``RuleJudge.check`` criteria, rubric titles/descriptions, bundle criteria):

=====================  ==========================================================
``regex:PAT``          ``re.search`` (DOTALL); ``iregex:PAT`` ignores case
``contains:T``         case-insensitive substring; ``contains_all:a|b``, ``contains_any:a|b``
``starts_with:T``      (stripped, case-insensitive); ``ends_with:T``
``min_chars:N``        also ``max_chars``, ``min_words``, ``max_words``, ``min_lines``,
                       ``max_lines``
``count:PAT:OP N``     number of regex matches compared, e.g. ``count:<search>:<=3``
``bullets:OP N``       number of bullet / numbered lines, e.g. ``bullets:>=2``
``copies_retrieved:OP N``  retrieved titles the response repeats in its own text
                       (``core.search_r1.copied_titles``), e.g. ``copies_retrieved:>=2``
``cites_retrieved:OP N``   retrieved titles named in its final turn, after the last
                       ``</information>`` (``core.search_r1.cited_titles``)
``tag:NAME``           a closed ``<NAME>...</NAME>`` block exists
``json``               the response (fences stripped) is valid JSON
``feature:ID``         a process feature of a search trajectory (the context is the question),
                       e.g. ``feature:max_searches:2``; a bare feature id works too, and so does
                       the exact ``Draft.text()`` of a library feature
``fn:NAME``            a Python predicate passed to ``RuleJudge(predicates=...)``
``not:RULE``           negation; ``RULE && RULE`` conjunction
=====================  ==========================================================

A criterion the language cannot read is not guessed at: it gets the defined fallback (not met,
prob 0.5, ``fallback=True``) and is counted.
"""

from __future__ import annotations

import json
import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from core.search_r1 import (
    ParsedTrajectory,
    cited_titles,
    copied_titles,
    normalize_answer,
    parse_trajectory,
)
from judges.base import JUDGE_STAT_KEYS, Counters, order_coin, tie_coin
from judges.bundling import compose_description
from judges.types import (
    GRADE_MAX,
    RATING_MIN,
    TIE,
    Bundle,
    BundleRequest,
    CheckRequest,
    CheckResult,
    ConsolidateRequest,
    Dimension,
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

# v2: trajectories parsed by core.search_r1 (the invalid-action message is environment text,
# not searches or an answer of the policy; text after the final </answer> is invalid)
FEATURE_LIBRARY_VERSION = "features-v2"

Predicate = Callable[[str, str], bool]  # (context / question, response / trajectory) -> bool

# Answer normalisation and the reading of a trajectory (segments, answer, format validity) are
# the Search-R1 protocol's (core.search_r1), shared with the QA rewards; the features and the
# equivalence fallback use them.


def _contains_phrase(haystack: str, needle: str) -> bool:
    """Whole-word phrase containment of normalised texts."""
    return bool(needle) and f" {needle} " in f" {haystack} "


def cover_match(prediction: str, golds: Sequence[str]) -> bool:
    """Normalised exact match, or a gold appearing as a whole phrase inside the prediction."""
    pred = normalize_answer(prediction)
    if not pred:
        return False
    return any(
        pred == (g := normalize_answer(gold)) or _contains_phrase(pred, g) for gold in golds
    )


_STOP = frozenset(
    "a an the of in on at to for by with from and or is are was were be been who what which "
    "when where why how whose whom did does do that this these those as it its his her their "
    "than then into about after before during same also both".split()
)
_QWORDS = frozenset(
    "what who which when where why how whose whom is are was were did does do in on the a an "
    "name according".split()
)


def _tokens(text: str) -> list[str]:
    return normalize_answer(text).split()


def question_entities(question: str) -> list[list[str]]:
    """Entities named in a question: quoted spans, runs of Capitalised words, numbers.

    Heuristic by design (no NER model): a sentence-initial question word is not an entity, and
    lower-case connectors ("of", "the") may sit inside a capitalised run ("Bank of America").
    """
    ents: list[list[str]] = []
    for m in re.finditer(r"[\"“']([^\"”']{2,})[\"”']", question):
        ents.append(_tokens(m.group(1)))
    words = re.findall(r"[\w'’-]+", question)
    run: list[str] = []
    for i, w in enumerate(words + [""]):
        cap = bool(w) and (w[0].isupper() or w[0].isdigit()) and not (
            i == 0 and w.lower() in _QWORDS
        )
        if cap:
            run.append(w)
        elif run and w.lower() in ("of", "the", "de", "and") and i + 1 < len(words) and (
            words[i + 1][:1].isupper()
        ):
            run.append(w)
        else:
            if run:
                ents.append(_tokens(" ".join(run)))
            run = []
    return [e for e in ents if e and not all(t in _STOP for t in e)]


def _info_before(traj: ParsedTrajectory, upto: int) -> str:
    """Normalised text of every <information> block before segment ``upto``."""
    return " ".join(normalize_answer(c) for t, c in traj.segments[:upto] if t == "information")


# Each feature predicate gets (question, trajectory, parameter).
def _f_entity_search(q: str, t: ParsedTrajectory, _: int | None) -> bool:
    ents = question_entities(q)
    queries = [set(_tokens(s)) for s in t.searches]
    return any(all(tok in qs for tok in e) for e in ents for qs in queries)


def _f_max_searches(q: str, t: ParsedTrajectory, n: int | None) -> bool:
    return t.answer is not None and len(t.searches) <= (n or 0)


def _f_min_searches(q: str, t: ParsedTrajectory, n: int | None) -> bool:
    return t.answer is not None and len(t.searches) >= (n or 1)


def _f_answer_grounded(q: str, t: ParsedTrajectory, _: int | None) -> bool:
    if t.answer is None:
        return False
    ans = normalize_answer(t.answer)
    last = max(i for i, (tag, _c) in enumerate(t.segments) if tag == "answer")
    return _contains_phrase(_info_before(t, last), ans)


def _f_distinct_queries(q: str, t: ParsedTrajectory, _: int | None) -> bool:
    norm = [normalize_answer(s) for s in t.searches]
    return bool(norm) and len(set(norm)) == len(norm)


def _f_think_before_action(q: str, t: ParsedTrajectory, _: int | None) -> bool:
    thought, acted = False, False
    for tag, _c in t.segments:
        if tag == "think":
            thought = True
        elif tag in ("search", "answer"):
            if not thought:
                return False
            acted, thought = True, False
        elif tag == "information":
            thought = False  # new information needs new reasoning
    return acted


_DOC_BOILERPLATE = frozenset({"doc", "title"})


def _info_names(text: str) -> set[str]:
    """Lower-cased Capitalised words of retrieved text (entity-like; "Doc"/"Title" excluded)."""
    words = {w.lower() for w in re.findall(r"\b[A-Z][\w'-]*", text)}
    return {normalize_answer(w) for w in words} - _DOC_BOILERPLATE - {""}


def _f_bridge_search(q: str, t: ParsedTrajectory, _: int | None) -> bool:
    """A later query uses a name first seen in retrieved information (multi-hop bridging).

    Only Capitalised (entity-like) words count: a generic word such as "film" that happens to
    occur in a retrieved document is not a bridge.
    """
    qtok = set(_tokens(q))
    seen_info: set[str] = set()
    n_search = 0
    for tag, c in t.segments:
        if tag == "information":
            seen_info.update(_info_names(c))
        elif tag == "search":
            n_search += 1
            if n_search > 1 and any(
                w in seen_info and w not in qtok and w not in _STOP and len(w) > 2
                for w in _tokens(c)
            ):
                return True
    return False


def _f_valid_format(q: str, t: ParsedTrajectory, _: int | None) -> bool:
    return t.valid_format


def _f_concise_answer(q: str, t: ParsedTrajectory, n: int | None) -> bool:
    return t.answer is not None and 0 < len(t.answer.split()) <= (n or 5)


def _f_query_not_copy(q: str, t: ParsedTrajectory, _: int | None) -> bool:
    qset = set(_tokens(q))
    if not t.searches or not qset:
        return False
    for s in t.searches:
        sset = set(_tokens(s))
        if sset and len(sset & qset) / len(sset | qset) >= 0.8:
            return False
    return True


def _f_stops_after_evidence(q: str, t: ParsedTrajectory, _: int | None) -> bool:
    """No search is issued after information that already mentions the final answer."""
    if t.answer is None or not t.searches:
        return False
    ans = normalize_answer(t.answer)
    found = False
    for tag, c in t.segments:
        if tag == "information" and _contains_phrase(normalize_answer(c), ans):
            found = True
        elif tag == "search" and found:
            return False
    return found


@dataclass(frozen=True)
class Feature:
    """A process feature family. ``params`` lists the parameter values induction may pick, in
    preference order; ``merge`` picks the most lenient parameter when consolidating."""

    name: str
    title: str
    description: str  # may contain {n}
    predicate: Callable[[str, ParsedTrajectory, int | None], bool]
    params: tuple[int, ...] = ()
    merge: Callable[[Sequence[int]], int] = max

    def fid(self, param: int | None) -> str:
        return self.name if param is None else f"{self.name}:{param}"

    def draft(self, param: int | None) -> Draft:
        n = param if param is not None else 0
        return Draft(
            title=self.title.format(n=n, s="" if n == 1 else "es"),
            description=self.description.format(n=n, s="" if n == 1 else "es"),
            feature=self.fid(param),
        )


FEATURES: dict[str, Feature] = {
    f.name: f
    for f in (
        Feature(
            "entity_search",
            "Entity-targeted search",
            "Searches for an entity that is named in the question, so retrieval targets the "
            "question's key subject.",
            _f_entity_search,
        ),
        Feature(
            "bridge_search",
            "Bridging follow-up search",
            "Issues a follow-up search that uses a term first found in retrieved information, "
            "chaining evidence across hops.",
            _f_bridge_search,
        ),
        Feature(
            "answer_grounded",
            "Evidence-grounded answer",
            "Answers only after some retrieved information mentions the answer it gives.",
            _f_answer_grounded,
        ),
        Feature(
            "stops_after_evidence",
            "Evidence-sufficiency termination",
            "Stops searching once retrieved information already mentions its final answer.",
            _f_stops_after_evidence,
        ),
        Feature(
            "distinct_queries",
            "Non-repeating queries",
            "Each search query is distinct; it never repeats a search it has already issued.",
            _f_distinct_queries,
        ),
        Feature(
            "query_not_copy",
            "Focused query formulation",
            "Reformulates the question into focused queries instead of pasting the question.",
            _f_query_not_copy,
        ),
        Feature(
            "think_before_action",
            "Reasoning before every action",
            "Reasons in <think> before every search and before answering.",
            _f_think_before_action,
        ),
        Feature(
            "min_searches",
            "Searches before answering",
            "Issues at least {n} search{s} before answering instead of answering from memory.",
            _f_min_searches,
            params=(1, 2, 3),
            merge=min,
        ),
        Feature(
            "max_searches",
            "Search economy",
            "Issues at most {n} search{s} before answering.",
            _f_max_searches,
            params=(1, 2, 3, 4),
            merge=max,
        ),
        Feature(
            "concise_answer",
            "Concise final answer",
            "Gives a final answer of at most {n} words, without explanations in the answer.",
            _f_concise_answer,
            params=(5,),
            merge=max,
        ),
        Feature(
            "valid_format",
            "Well-formed protocol",
            "Uses balanced tags and ends with exactly one <answer>.",
            _f_valid_format,
        ),
    )
}


def parse_feature_id(fid: str) -> tuple[Feature, int | None] | None:
    """``"max_searches:2"`` -> (feature, 2); ``None`` when not a library feature id."""
    name, _, param = fid.strip().partition(":")
    feat = FEATURES.get(name.strip())
    if feat is None:
        return None
    if not param:
        return (feat, None) if not feat.params else (feat, feat.params[0])
    try:
        return feat, int(param)
    except ValueError:
        return None


def feature_predicate(fid: str) -> Predicate | None:
    """(question, trajectory text) -> satisfied, for a feature id; ``None`` if unknown."""
    parsed = parse_feature_id(fid)
    if parsed is None:
        return None
    feat, param = parsed
    return lambda q, text: feat.predicate(q, parse_trajectory(text), param)


def _library_texts() -> dict[str, str]:
    """Exact ``Draft.text()`` of every library feature instance -> feature id."""
    out: dict[str, str] = {}
    for f in FEATURES.values():
        for p in f.params or (None,):
            d = f.draft(p)
            out[d.text()] = f.fid(p)
        if not f.params:  # a parametrised family's title does not say which parameter
            out[f.draft(None).title] = f.name
    return out


_LIBRARY_TEXTS = _library_texts()


# --- the criterion language -------------------------------------------------------------------

_OPS: dict[str, Callable[[int, int], bool]] = {
    "<=": operator.le, ">=": operator.ge, "==": operator.eq, "!=": operator.ne,
    "<": operator.lt, ">": operator.gt, "=": operator.eq,
}
_CMP = re.compile(r"^\s*(<=|>=|==|!=|<|>|=)\s*(\d+)\s*$")
_BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+", re.MULTILINE)
_FENCED = re.compile(r"^\s*```[a-zA-Z]*\s*\n?(.*?)```\s*$", re.DOTALL)


def _cmp(spec: str) -> Callable[[int], bool]:
    m = _CMP.match(spec)
    if not m:
        raise ValueError(f"bad comparison {spec!r}")
    op, n = _OPS[m.group(1)], int(m.group(2))
    return lambda x: op(x, n)


def _is_json(text: str) -> bool:
    m = _FENCED.match(text)
    try:
        json.loads(m.group(1) if m else text)
    except ValueError:
        return False
    return True


def _lengths(arg: str, measure: Callable[[str], int], at_least: bool) -> Predicate:
    n = int(arg)
    return (lambda c, r: measure(r) >= n) if at_least else (lambda c, r: measure(r) <= n)


def _words(r: str) -> int:
    return len(r.split())


def _lines(r: str) -> int:
    return len([x for x in r.splitlines() if x.strip()])


def _split_alts(arg: str) -> list[str]:
    return [a.strip().lower() for a in arg.split("|") if a.strip()]


def compile_rule(
    text: str, predicates: Mapping[str, Predicate] | None = None
) -> Predicate | None:
    """Compile a criterion of the rule language into a predicate; ``None`` if unreadable."""
    text = (text or "").strip()
    if not text:
        return None
    if " && " in text:
        parts = [compile_rule(p, predicates) for p in text.split(" && ")]
        if any(p is None for p in parts):
            return None
        return lambda c, r: all(p(c, r) for p in parts)  # type: ignore[misc]
    if text in _LIBRARY_TEXTS:
        return feature_predicate(_LIBRARY_TEXTS[text])
    op, sep, arg = text.partition(":")
    op = op.strip().lower()
    if not sep and op != "json":
        return feature_predicate(text)
    try:
        return _compile_op(op, arg, predicates or {}) or feature_predicate(text)
    except (ValueError, re.error):
        return None


def _compile_op(op: str, arg: str, predicates: Mapping[str, Predicate]) -> Predicate | None:
    if op == "not":
        inner = compile_rule(arg, predicates)
        return None if inner is None else (lambda c, r: not inner(c, r))
    if op in ("regex", "iregex"):
        pat = re.compile(arg, re.DOTALL | (re.IGNORECASE if op == "iregex" else 0))
        return lambda c, r: pat.search(r) is not None
    if op == "contains":
        needle = arg.strip().lower()
        return lambda c, r: needle in r.lower()
    if op == "contains_all":
        alts = _split_alts(arg)
        return lambda c, r: all(a in r.lower() for a in alts)
    if op == "contains_any":
        alts = _split_alts(arg)
        return lambda c, r: any(a in r.lower() for a in alts)
    if op == "starts_with":
        s = arg.strip().lower()
        return lambda c, r: r.strip().lower().startswith(s)
    if op == "ends_with":
        s = arg.strip().lower()
        return lambda c, r: r.strip().lower().endswith(s)
    lengths = {"chars": len, "words": _words, "lines": _lines}
    for unit, measure in lengths.items():
        if op in (f"min_{unit}", f"max_{unit}"):
            return _lengths(arg, measure, op.startswith("min"))
    if op == "count":
        pat_s, _, cmp_s = arg.rpartition(":")
        pat, cmp = re.compile(pat_s, re.DOTALL), _cmp(cmp_s)
        return lambda c, r: cmp(len(pat.findall(r)))
    if op == "bullets":
        cmp = _cmp(arg)
        return lambda c, r: cmp(len(_BULLET.findall(r)))
    if op == "copies_retrieved":  # retrieved titles repeated in the policy's own text
        cmp = _cmp(arg)
        return lambda c, r: cmp(copied_titles(r))
    if op == "cites_retrieved":  # retrieved titles named in the final turn
        cmp = _cmp(arg)
        return lambda c, r: cmp(cited_titles(r))
    if op == "tag":
        name = re.escape(arg.strip())
        pat = re.compile(rf"<{name}>.*?</{name}>", re.DOTALL)
        return lambda c, r: pat.search(r) is not None
    if op == "json":
        return lambda c, r: _is_json(r)
    if op == "feature":
        return feature_predicate(arg)
    if op == "fn":
        return predicates.get(arg.strip())
    return None


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


def _rule_family(criterion: str) -> str:
    """Bundling family of a criterion: process / content / form / general."""
    op = criterion.strip().partition(":")[0].strip().lower()
    if op == "not":
        return _rule_family(criterion.strip().partition(":")[2])
    if op == "feature" or criterion.strip() in _LIBRARY_TEXTS or parse_feature_id(criterion):
        return "process"
    if op in ("regex", "iregex", "contains", "contains_all", "contains_any", "starts_with",
              "ends_with", "fn"):
        return "content"
    if op in ("min_chars", "max_chars", "min_words", "max_words", "min_lines", "max_lines",
              "count", "bullets", "tag", "json"):
        return "form"
    return "general"


def rule_bundle(criteria: Sequence[str], weights: Sequence[float], k_min: int, k_max: int
                ) -> tuple[Dimension, ...]:
    """Deterministic bundling: pitfalls (w < 0) together, positives grouped by rule family,
    then the number of groups forced into [k_min, min(k_max, n)] by halving the largest group
    or merging the two smallest. No failure clauses (the rule judge does not invent text);
    each description is ``compose_description`` of the dimension's items (their texts kept)."""
    n = len(criteria)
    groups: dict[str, list[int]] = {}
    for i, (c, w) in enumerate(zip(criteria, weights)):
        groups.setdefault("pitfalls" if w < 0 else _rule_family(c), []).append(i)
    items = list(groups.items())
    hi = min(k_max, n)
    while len(items) < min(k_min, n):
        j = max(range(len(items)), key=lambda k: len(items[k][1]))
        name, idx = items[j]
        half = math.ceil(len(idx) / 2)
        items[j : j + 1] = [(f"{name} 1", idx[:half]), (f"{name} 2", idx[half:])]
    while len(items) > hi:
        order = sorted(range(len(items)), key=lambda k: (len(items[k][1]), k))
        a, b = sorted(order[:2])
        merged = (f"{items[a][0]} + {items[b][0]}", sorted(items[a][1] + items[b][1]))
        items[a] = merged
        del items[b]
    return tuple(
        Dimension(name, tuple(idx), None,
                  compose_description([criteria[i] for i in idx], [weights[i] for i in idx]))
        for name, idx in items
    )


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
        max_drafts: features per induction; max_common: rubrics per consolidation.
        min_support: drafts a feature family needs to become a common rubric.
        k_min, k_max: allowed number of bundle dimensions.
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
        total = sum(abs(float(w)) for w in r.weights)
        if len(preds) != len(r.weights) or any(p is None for p in preds) or total <= 0:
            self._fallback("rate")
            return RateResult(RATING_MIN, fallback=True)
        passed = sum(abs(float(w)) for p, w in zip(preds, r.weights)
                     if bool(p(r.context, r.response)) == (w >= 0))
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
