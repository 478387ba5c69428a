"""Process features of Search-R1 search trajectories: a library of deterministic predicates
``(question, trajectory, parameter) -> bool`` (entity-targeted search, bridging follow-up
search, evidence-grounded answer, search economy, ...), each a ``Feature`` family whose title and
description are the rubric text induction drafts. The criterion language
(``judges.rule_language``) reads ``feature:ID``, a bare feature id, or the exact ``Draft.text()``
of a library feature as the feature's predicate; ``judges.rule.RuleJudge`` induces and
consolidates rubrics from this library.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from core.search_r1 import ParsedTrajectory, normalize_answer, parse_trajectory
from judges.types import Draft

# v2: trajectories parsed by core.search_r1 (the invalid-action message is environment text,
# not searches or an answer of the policy; text after the final </answer> is invalid)
FEATURE_LIBRARY_VERSION = "features-v2"

# A predicate of the criterion language (judges.rule_language); a feature's is one too.
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


LIBRARY_TEXTS = _library_texts()
