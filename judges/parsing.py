"""Robust parsing of judge outputs.

Models wrap JSON in code fences, prepend reasoning (``<think>...</think>``), append chatter,
use Python literals or near-miss keys. Each ``parse_*`` function is pure: it returns a value or
raises ``ParseError`` whose message is short and specific, because it is sent back to the model
in the re-ask turn ("missing key 'criteria_met'", "criterion 3 appears in no dimension").
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from typing import Any

from judges.bundling import bundle_problems
from judges.types import GRADE_MAX, RATING_MAX, RATING_MIN, Dimension, Draft


class ParseError(ValueError):
    """Judge output could not be turned into a result; the message says why."""


_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"```[a-zA-Z0-9_-]*\s*\n?(.*?)```", re.DOTALL)
# Bound the work spent on pathological outputs (a long text full of braces).
_MAX_CANDIDATES = 64


def strip_reasoning(text: str) -> str:
    """Drop ``<think>`` blocks (reasoning models) and an unterminated trailing one."""
    text = _THINK.sub("", text)
    head, sep, _ = text.partition("<think>")
    return head if sep else text


def _balanced_end(text: str, start: int) -> int | None:
    """Index just past the bracket closing the one at ``start`` (string-literal aware)."""
    pairs = {"{": "}", "[": "]"}
    stack: list[str] = []
    quote: str | None = None
    escaped = False
    for i in range(start, len(text)):
        ch = text[i]
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch in pairs:
            stack.append(pairs[ch])
        elif ch in "}]":
            if not stack or stack.pop() != ch:
                return None
            if not stack:
                return i + 1
    return None


def _loads_lenient(blob: str) -> Any:
    """JSON, else a Python literal (single quotes, True/False/None), else ``ParseError``."""
    try:
        # strict=False: small models put raw newlines inside strings; that is still readable.
        return json.loads(blob, strict=False)
    except ValueError:
        pass
    try:
        return ast.literal_eval(blob)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        raise ParseError("not valid JSON") from None


def extract_json(text: str, kinds: tuple[type, ...] = (dict,)) -> Any:
    """The first JSON value of one of ``kinds`` embedded in ``text``.

    Fenced blocks are tried first, then every ``{``/``[`` position in order; trailing text after
    the value is ignored.
    """
    if not isinstance(text, str) or not text.strip():
        raise ParseError("empty reply")
    text = strip_reasoning(text)
    sources = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    openers = ("{" if dict in kinds else "") + ("[" if list in kinds else "")
    tried = 0
    for src in sources:
        for i, ch in enumerate(src):
            if ch not in openers:
                continue
            end = _balanced_end(src, i)
            if end is None:
                continue
            tried += 1
            if tried > _MAX_CANDIDATES:
                raise ParseError("no JSON object found")
            try:
                value = _loads_lenient(src[i:end])
            except ParseError:
                continue
            if isinstance(value, dict) and dict in kinds:
                return value
            # A list only counts as an answer when it is a list of objects: prose such as
            # "[1]" is valid JSON too and must not shadow the answer that follows it.
            if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
                return value
    raise ParseError("no JSON object found")


def _get(obj: dict, keys: Sequence[str]) -> Any:
    """The value of the first of ``keys`` present (case-insensitive), else ``ParseError``."""
    lowered = {str(k).strip().lower(): v for k, v in obj.items()}
    for k in keys:
        if k in lowered:
            return lowered[k]
    raise ParseError(f"missing key {keys[0]!r}")


_TRUE = {"true", "yes", "met", "y", "1", "equivalent", "correct"}
_FALSE = {"false", "no", "not met", "n", "0", "not equivalent", "incorrect"}


def as_bool(value: Any, key: str) -> bool:
    """Strict-ish boolean: JSON booleans, 0/1 and yes/no-like strings; anything else is an error."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        v = value.strip().strip(".").lower()
        if v in _TRUE:
            return True
        if v in _FALSE:
            return False
    raise ParseError(f"{key!r} must be true or false, got {value!r}")


def parse_check(text: str) -> bool:
    """HealthBench-style ``{"explanation", "criteria_met"}`` -> met."""
    obj = extract_json(text)
    return as_bool(_get(obj, ("criteria_met", "criterion_met", "met")), "criteria_met")


_YESNO = re.compile(r"^\W*(yes|no)\b", re.IGNORECASE)


def parse_yesno(text: str) -> bool:
    """A one-word Yes/No answer (leading punctuation/whitespace allowed)."""
    m = _YESNO.match(strip_reasoning(text or ""))
    if not m:
        raise ParseError("answer must start with Yes or No")
    return m.group(1).lower() == "yes"


_WINNER = {
    "1": 1, "response 1": 1, "first": 1, "a": 1,
    "2": 2, "response 2": 2, "second": 2, "b": 2,
    "tie": 0, "0": 0, "equal": 0, "neither": 0, "both": 0, "none": 0, "draw": 0,
}


def parse_compare(text: str) -> int:
    """``{"winner": "1"|"2"|"tie"}`` -> 1 or 2 (position shown) or 0 (tie)."""
    obj = extract_json(text)
    value = _get(obj, ("winner", "better", "preferred", "preference"))
    if isinstance(value, bool) or value is None:
        raise ParseError(f"'winner' must be \"1\", \"2\" or \"tie\", got {value!r}")
    key = str(value).strip().strip(".").lower()
    if isinstance(value, float) and value.is_integer():
        key = str(int(value))
    if key not in _WINNER:
        raise ParseError(f"'winner' must be \"1\", \"2\" or \"tie\", got {value!r}")
    return _WINNER[key]


def _norm_title(title: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", title.lower()).split())


def parse_drafts(text: str, max_n: int) -> tuple[Draft, ...]:
    """``{"rubrics": [{"title", "description"}, ...]}`` (or a bare list) -> drafts.

    Entries without a title are dropped, duplicate titles merged, the list cut to ``max_n``.
    An empty list is a valid answer (nothing worth a rubric); a list whose entries are all
    unusable is an error.
    """
    obj = extract_json(text, kinds=(dict, list))
    items = obj if isinstance(obj, list) else _get(obj, ("rubrics", "drafts", "criteria"))
    if not isinstance(items, list):
        raise ParseError("'rubrics' must be a list")
    out: list[Draft] = []
    seen: set[str] = set()
    for item in items:
        if not isinstance(item, dict):
            continue
        lowered = {str(k).strip().lower(): v for k, v in item.items()}
        title, desc = lowered.get("title", lowered.get("name")), lowered.get("description", "")
        if not isinstance(title, str) or not title.strip() or not isinstance(desc, str):
            continue
        key = _norm_title(title)
        if key in seen:
            continue
        seen.add(key)
        out.append(Draft(title=title.strip(), description=desc.strip()))
    if items and not out:
        raise ParseError('each rubric needs a "title" and a "description" string')
    return tuple(out[: max(0, max_n)])


_ECHO = re.compile(r"^\s*(\d+)[.):]\s*(?:\(weight [^)]*\)\s*)?(.*)$", re.DOTALL)


def _criterion_index(item: Any, criteria: Sequence[str], used: set[int]) -> int:
    """A 0-based index from a 1-based item number (int, numeric string, an echoed listing line
    ``"3. (weight 5) <text>"`` or ``{"index"|"number", "text"}``) or an exact item text.

    Out-of-range numbers are returned as they are (``bundle_problems`` reports them); a reference
    that is not a number or an exact text (a rewritten item) is a ``ParseError``."""
    text = None
    if isinstance(item, dict):
        lowered = {str(k).strip().lower(): v for k, v in item.items()}
        text = lowered.get("text", lowered.get("criterion"))
        item = lowered.get("index", lowered.get("number", text))
    if isinstance(item, bool):
        raise ParseError(f"item reference must be a number, got {item!r}")
    if isinstance(item, float) and item.is_integer():
        item = int(item)
    if isinstance(item, str) and re.fullmatch(r"\s*\d+\s*", item):
        item = int(item)
    elif isinstance(item, str) and (m := _ECHO.match(item)):
        # The model echoed a listing line: keep the number; the text must be the original.
        item, text = int(m.group(1)), m.group(2)
    if isinstance(item, int):
        i = item - 1
        if isinstance(text, str) and 0 <= i < len(criteria) and (
                text.strip() != criteria[i].strip()):
            raise ParseError(f"item {item} text was rewritten; refer to items by number")
        return i
    if isinstance(item, str):
        # Exact text is accepted (models sometimes quote items); anything else is a rewrite.
        matches = [i for i, c in enumerate(criteria) if c.strip() == item.strip()]
        for i in matches:
            if i not in used:
                return i
        if matches:
            return matches[0]
        raise ParseError("an item text was rewritten; refer to items by number only")
    raise ParseError(f"item reference must be a number, got {item!r}")


def _failure_clause(value: Any) -> str | None:
    if value is None or value is False:
        return None
    if not isinstance(value, str):
        raise ParseError(f"'failure_clause' must be a string or null, got {value!r}")
    v = value.strip()
    return None if v.lower() in ("", "null", "none", "n/a") else v


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _read_dimension(j: int, dim: Any, criteria: Sequence[str], used: set[int]
                    ) -> tuple[Dimension, list[str]]:
    """One dimension object of a bundle answer (0-based indices) and its reference problems."""
    if not isinstance(dim, dict):
        raise ParseError("each dimension must be an object")
    lowered = {str(k).strip().lower(): v for k, v in dim.items()}
    name = lowered.get("name", lowered.get("title"))
    name = name.strip() if isinstance(name, str) and name.strip() else f"dimension {j + 1}"
    refs = lowered.get("atomic_indices", lowered.get("indices", lowered.get("criteria")))
    if not isinstance(refs, list):
        raise ParseError(f"dimension {name!r} needs an 'atomic_indices' list of item numbers")
    problems: list[str] = []
    indices: list[int] = []
    for ref in refs:
        try:
            indices.append(_criterion_index(ref, criteria, used | set(indices)))
        except ParseError as e:
            problems.append(f"dimension {name!r}: {e}")
    desc = lowered.get("description", "")
    if not isinstance(desc, str):
        problems.append(f"dimension {name!r}: 'description' must be text")
        desc = ""
    try:
        clause = _failure_clause(lowered.get("failure_clause", lowered.get("failure")))
    except ParseError as e:
        problems.append(f"dimension {name!r}: {e}")
        clause = None
    return Dimension(name=name, indices=tuple(indices), failure_clause=clause,
                     description=desc.strip(), weight=_number(lowered.get("weight"))), problems


def read_bundle(text: str, criteria: Sequence[str], k_min: int = 2, k_max: int = 5
                ) -> tuple[tuple[Dimension, ...], list[str]]:
    """A bundle answer read as far as it goes: (dimensions, problems).

    Shape: ``{"criteria": [{"name", "description", "weight", "atomic_indices": [1-based],
    "failure_clause"}]}`` (``"dimensions"`` for the list and ``"indices"``/``"criteria"`` for the
    numbers are read too).  Indices come back 0-based.  Unusable references (rewritten texts)
    are left out and listed in ``problems`` with every validity problem
    (``judges.bundling.bundle_problems``, item numbers 1-based); an answer that is not such an
    object at all is a ``ParseError``.  The proposal of an invalid answer is what the bundler
    repairs."""
    obj = extract_json(text, kinds=(dict, list))
    dims = obj if isinstance(obj, list) else _get(obj, ("criteria", "dimensions", "bundles",
                                                         "groups"))
    if not isinstance(dims, list):
        raise ParseError("'criteria' must be a list of dimension objects")
    out: list[Dimension] = []
    problems: list[str] = []
    used: set[int] = set()
    for j, dim in enumerate(dims):
        d, probs = _read_dimension(j, dim, criteria, used)
        used |= set(d.indices)
        out.append(d)
        problems += probs
    problems += bundle_problems(out, len(criteria), k_min, k_max, base=1)
    return tuple(out), problems


def parse_bundle(
    text: str, criteria: Sequence[str], k_min: int = 2, k_max: int = 5
) -> tuple[Dimension, ...]:
    """A valid bundle answer -> its dimensions (0-based indices); else ``ParseError`` with the
    first problems of ``read_bundle`` (what the re-ask tells the model to fix)."""
    dims, problems = read_bundle(text, criteria, k_min, k_max)
    if problems:
        raise ParseError("; ".join(problems[:3]))
    return dims


def parse_equiv(text: str) -> bool:
    """``{"explanation", "equivalent"}`` -> equivalent."""
    obj = extract_json(text)
    return as_bool(_get(obj, ("equivalent", "is_equivalent", "correct", "match")), "equivalent")


_BARE_RATING = re.compile(r"^\W*(\d+(?:\.0+)?)\s*(?:/\s*10)?\W*$")


def _rating_value(value: Any) -> int:
    """An integer in RATING_MIN..RATING_MAX from an int, an integral float or a numeric string."""
    if isinstance(value, str) and (m := _BARE_RATING.match(value)):
        value = float(m.group(1))
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not (
            RATING_MIN <= value <= RATING_MAX):
        raise ParseError(f"'rating' must be an integer from {RATING_MIN} to {RATING_MAX}, "
                         f"got {value!r}")
    return value


def parse_rating(text: str) -> int:
    """A holistic rating: ``{"explanation", "rating": 1..10}``, or the bare integer alone
    (``"7"``, ``"7/10"``, reasoning blocks stripped). Anything else, and any number outside
    1..10 or not whole, is a ``ParseError``."""
    bare = _BARE_RATING.match(strip_reasoning(text or "").strip())
    if bare:
        return _rating_value(bare.group(1))
    obj = extract_json(text)
    return _rating_value(_get(obj, ("rating", "score", "grade")))


def _indexed_values(values: Any, n: int, key: str) -> list[Any]:
    """``n`` values from an index-keyed object (``{"1": v, ...}``, 1-based, every index exactly
    once) or a list of length ``n`` (criterion order)."""
    if isinstance(values, dict):
        indexed: dict[int, Any] = {}
        for k, v in values.items():
            s = str(k).strip()
            if not re.fullmatch(r"\d+", s):
                raise ParseError(f"{key!r} keys must be criterion numbers, got {k!r}")
            if int(s) in indexed:
                raise ParseError(f"criterion {int(s)} is judged twice")
            indexed[int(s)] = v
        missing = [i for i in range(1, n + 1) if i not in indexed]
        extra = sorted(set(indexed) - set(range(1, n + 1)))
        if missing or extra:
            raise ParseError(f"{key!r} must cover criteria 1..{n} exactly once (missing "
                             f"{missing or 'none'}, unknown {extra or 'none'})")
        return [indexed[i] for i in range(1, n + 1)]
    if isinstance(values, list):
        if len(values) != n:
            raise ParseError(f"{key!r} must hold {n} verdicts, got {len(values)}")
        return list(values)
    raise ParseError(f"{key!r} must be an object keyed by criterion number")


def parse_dimension_verdicts(text: str, n: int) -> tuple[bool, ...]:
    """``{"satisfied": {"1": true, ...}}`` (also a list in order, or ``criteria_met``) -> one
    boolean per criterion; every criterion 1..n exactly once."""
    obj = extract_json(text)
    values = _indexed_values(_get(obj, ("satisfied", "criteria_met", "verdicts")), n,
                             "satisfied")
    return tuple(as_bool(v, f"satisfied.{i}") for i, v in enumerate(values, start=1))


def _grade(value: Any, key: str) -> int:
    if isinstance(value, str) and re.fullmatch(r"\s*\d+\s*", value):
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= GRADE_MAX:
        raise ParseError(f"{key!r} must be an integer from 0 to {GRADE_MAX}, got {value!r}")
    return value


def parse_dimension_grades(text: str, n: int) -> tuple[int, ...]:
    """``{"grades": {"1": 0..3, ...}}`` (also a list in order) -> one grade per criterion."""
    obj = extract_json(text)
    values = _indexed_values(_get(obj, ("grades", "scores")), n, "grades")
    return tuple(_grade(v, f"grades.{i}") for i, v in enumerate(values, start=1))
