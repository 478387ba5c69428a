"""The criterion language: deterministic criteria compiled into executable predicates
``(context, response) -> bool`` (``compile_rule``), and the deterministic bundling of a
checklist into dimensions by rule family (``rule_bundle``).

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

A criterion the language cannot read compiles to ``None``: it is not guessed at
(``judges.rule.RuleJudge`` gives it the defined fallback). The process features behind
``feature:ID`` are ``judges.search_features``.
"""

from __future__ import annotations

import json
import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence

from core.search_r1 import cited_titles, copied_titles
from judges.bundling import compose_description
from judges.search_features import LIBRARY_TEXTS, Predicate, feature_predicate, parse_feature_id
from judges.types import Dimension

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
    if text in LIBRARY_TEXTS:
        return feature_predicate(LIBRARY_TEXTS[text])
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


def _rule_family(criterion: str) -> str:
    """Bundling family of a criterion: process / content / form / general."""
    op = criterion.strip().partition(":")[0].strip().lower()
    if op == "not":
        return _rule_family(criterion.strip().partition(":")[2])
    if op == "feature" or criterion.strip() in LIBRARY_TEXTS or parse_feature_id(criterion):
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
