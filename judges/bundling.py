"""What a valid bundle answer is, and the deterministic dimension paragraph.

Shared by the LLM judge's bundle parser (its complaints go back to the model in the re-ask), the
rule judge (which writes its descriptions with ``compose_description``) and ``rewards.bundle``
(validation, then repair).  A bundle of a checklist of ``n`` items is valid when

* ``k_min <= K <= min(k_max, n)`` dimensions;
* every item index lies in exactly one dimension, and every dimension has one;
* every description is a paragraph of ``DESCRIPTION_SENTENCES`` = 2..10 sentences
  (``count_sentences``).  The prompt asks for 2-5 sentences (3-8 when ``K = 1``), as the ProRubric
  authors' generator does; the accepted range is wider so that one sentence too many does not
  cost a regeneration, and one sentence (no room for the failure condition) or a runaway text
  does;
* a failure clause, when given, is text.

Names are not checked beyond being filled in (``"dimension j"`` when empty); they may repeat,
as in the authors' data.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from judges.types import Dimension

#: Sentences a dimension description may have (inclusive).
DESCRIPTION_SENTENCES = (2, 10)

# A Latin sentence ends in . ! ? followed by space and a capital letter, quote or bracket (so
# "e.g. the" and "e.g. 400 mg" do not end one); CJK sentences end in a full-width stop.
_LATIN_END = re.compile(r"[.!?]+[\"')\]]*\s+(?=[A-Z\"'(\[])")
_CJK_END = re.compile(r"[。！？]+")


def count_sentences(text: str) -> int:
    """Sentences in ``text``: pieces between sentence ends, empty pieces not counted."""
    pieces = _CJK_END.split(_LATIN_END.sub("\n", text.strip()))
    return sum(1 for chunk in pieces for line in chunk.split("\n") if line.strip(" .!?\t"))


def description_problem(text: object) -> str | None:
    """Why ``text`` is not a valid dimension description, or None."""
    if not isinstance(text, str) or not text.strip():
        return "description is empty"
    lo, hi = DESCRIPTION_SENTENCES
    n = count_sentences(text)
    if not lo <= n <= hi:
        return f"description has {n} sentence{'s' * (n != 1)}, need {lo} to {hi}"
    return None


def _k_problem(k: int, n: int, k_min: int, k_max: int) -> str | None:
    hi = min(k_max, n)
    if n < k_min:
        return f"only {n} item{'s' * (n != 1)}, cannot make {k_min} dimensions"
    if k_min <= k <= hi:
        return None
    want = f"exactly {k_min}" if k_min == hi else f"{k_min} to {hi}"
    return f"need {want} dimensions, got {k}"


def bundle_problems(dims: Sequence[object], n: int, k_min: int, k_max: int, base: int = 0
                    ) -> list[str]:
    """Every reason ``dims`` is not a valid bundle of ``n`` items (empty list: valid).

    Item numbers in the messages are ``index + base`` (``base=1`` for the judge, which numbers
    the checklist from 1; 0 for our own 0-based reports)."""
    out: list[str] = []
    if (why := _k_problem(len(dims), n, k_min, k_max)) is not None:
        out.append(why)
    owner: dict[int, int] = {}
    for j, d in enumerate(dims):
        if not isinstance(d, Dimension):
            out.append(f"dimension {j + base} is not a Dimension")
            continue
        label = f"dimension {d.name!r}"
        if not d.indices:
            out.append(f"{label} has no items")
        for i in d.indices:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
                shown = i + base if isinstance(i, int) and not isinstance(i, bool) else repr(i)
                out.append(f"{label}: item {shown} is out of range {base}..{n - 1 + base}")
            elif i in owner:
                out.append(f"item {i + base} is in more than one dimension")
            else:
                owner[i] = j
        if (why := description_problem(d.description)) is not None:
            out.append(f"{label}: {why}")
        if d.failure_clause is not None and not isinstance(d.failure_clause, str):
            out.append(f"{label}: failure clause is not text: {d.failure_clause!r}")
    missing = [i + base for i in range(n) if i not in owner]
    if missing:
        out.append(f"items {', '.join(map(str, missing))} are in no dimension; "
                   "each must appear once")
    return out


_INNER_LATIN = re.compile(r"[.!?]+\s+(?=[A-Z0-9\"'(\[])")


def _clause(text: str) -> str:
    """An item's text as one clause: whitespace collapsed, inner sentence ends turned into
    semicolons, the final stop dropped (the composed sentence adds its own)."""
    one = _INNER_LATIN.sub("; ", " ".join(str(text).split()))
    return _CJK_END.sub("；", one).rstrip(" .!?;:。！？；")


def compose_description(texts: Sequence[str], weights: Sequence[float],
                        failure: str | None = None) -> str:
    """A deterministic dimension paragraph from its items (2 to 4 sentences)::

        A good response does all of the following: <positive items, "; ">.
        It fails this dimension if it does any of the following: <pitfalls, "; ">.
        It also fails when it <failure clause>.
        Missing any one of these requirements fails the dimension.

    (the sentences whose lists are empty are left out; with no positive item the first sentence
    is "A good response avoids every behaviour listed next.").  Used by the rule judge and by the
    bundler's repair; the items' own wording is kept, so the paragraph is as judgeable as they
    are, not a holistic rewrite."""
    pos = [_clause(t) for t, w in zip(texts, weights) if w >= 0]
    neg = [_clause(t) for t, w in zip(texts, weights) if w < 0]
    parts = [f"A good response does all of the following: {'; '.join(pos)}." if pos
             else "A good response avoids every behaviour listed next."]
    if neg:
        parts.append(f"It fails this dimension if it does any of the following: "
                     f"{'; '.join(neg)}.")
    if failure and failure.strip():
        clause = _clause(failure)
        if clause[:1].isupper() and not clause[1:2].isupper():  # "Delays ..." -> "delays ..."
            clause = clause[0].lower() + clause[1:]
        parts.append(f"It also fails when it {clause}.")
    if pos:
        parts.append("Missing any one of these requirements fails the dimension.")
    return " ".join(parts)
