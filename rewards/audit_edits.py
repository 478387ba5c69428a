"""The ProRubric authors' incentive-audit edits (E1-E7), written by a model or by a rule.

Each edit takes an answer (the untrained policy's answer to a training prompt) and changes one
thing, so that the change of each arm's training reward says what that reward pays for (the
ProRubric authors' incentive audit; our own implementation and wording):

======  ====================================================================================
``E1``  append a closing paragraph naming 4-6 weakly covered checklist topics, no information
``E1b`` the same paragraph with generic topic labels instead of the checklist's
``E2``  append one sentence meeting only the first requirement of an unmet compound criterion
``E3``  add one mild, plausible but needless recommendation
``E4``  delete the most important correct sentence
``E5``  paraphrase: same content, about the same length
``E6``  append 2-3 unmet checklist items, really satisfied, with correct specific content
``E7``  material of the same kind worked into the answer, sized to E6's addition
``E6L`` appended substance sized to half the answer (the common budget of E6L / E7L)
``E7L`` integrated substance sized to half the answer
======  ====================================================================================

Two editors write them:

* ``ModelEditor``: an OpenAI-compatible model (the audit's ``edit`` role) asked as the authors
  ask theirs (``edit_messages``, ``apply_reply``).  It sees the question, the answer and the
  checklist as a plain numbered list (no weights, no verdicts; E4 sees no checklist).  For E1,
  E1b, E2, E6 and E6L it returns only the added text, which is appended, so the original cannot
  change; E3 names the sentence it goes after, which must occur verbatim; E4 a verbatim span of
  20-600 characters and at most 20 % of the answer; E5 stays within 15 % of the answer's length,
  E7 within 30 % of E6's addition (18 % of the answer without one); E6L and E7L are compared
  only where their additions are within 25 % of each other.  A refused reply is retried
  (temperatures 0, 0.7, 0.7; five rounds, each told how far off the last was, for the sized
  families) and counted per family and reason; an edit still missing is left out of its row and
  counted.  One departure: E1 and E1b are sized to E6's addition on the same answer (the authors
  ask for 60-120 and 40-90 words), so naming and substance are compared at equal size.  The
  same model answers the authors' yes/no checks: does an E1b padding leak specifics, is a
  question medical.
* ``rule_edit``: deterministic stand-ins, no model, built from the rubric, the judge's verdicts
  on the original and the rubric's reference answer, for the families a rubric can build
  (E1, E1b, E2, E3, E4, E5, E6; each function's docstring says how).  E7, E6L and E7L need a
  writer.  A stand-in returns ``None`` where the rubric cannot build its edit (e.g. E2 when no
  unmet item asks for two things): that answer is left out of that row and counted.  Sizes are
  in characters, as the authors measure them: E1 and E1b add about as much as E6 adds to the
  same answer, so naming and substance are compared at equal size.  A stand-in that cannot
  mean what its family means is listed in :data:`NOT_COMPARABLE` and marked so in the report.

A criterion's *topic label* (``topic_label``) is its title after a ``"Kind: "`` prefix
("Mentions: log off" -> "log off"), else its natural-language text without a leading
"The response" and verb ("Advises rest and fluids." -> "rest and fluids"); a rule-language
criterion without a title has none.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rewards.rubric import Criterion, Rubric
from rewards.text_edits import (
    append_sentence,
    paraphrase,
    sentence_spans,
    word_stems,
)

FAMILIES = ("E1", "E1b", "E2", "E3", "E4", "E5", "E6", "E7", "E6L", "E7L")
#: Families a rubric can build without a model (``rule_edit``).
RULE_FAMILIES = ("E1", "E1b", "E2", "E3", "E4", "E5", "E6")
MAX_TOPICS, MIN_TOPICS = 6, 4
#: Generic topic labels for E1b: say nothing specific about any question.
GENERIC_TOPICS = ("timing", "individual circumstances", "common mistakes", "long-term habits",
                  "practical constraints", "possible trade-offs", "follow-up",
                  "personal preferences")
#: E3's stand-in: mild, plausible steps an asker rarely needs (not dangerous; compare
#: ``rewards.perturb.HIGH_RISK_SENTENCES``).
NEEDLESS_SENTENCES = (
    "You might also book a general check-up first, just to be thorough.",
    "Consider keeping a detailed written log of everything related to this for a month.",
    "It may also be worth buying a specialised gadget for this before you start.",
    "You could also ask an expert to review your plan even if things are going well.",
)
#: E1 / E1b: sentences that name a topic and say nothing about it ({t}: the topic).
NAMING_TEMPLATES = ("{t} is also an important consideration here.",
                    "The role of {t} should be kept in mind.",
                    "It is worth thinking about {t} as well.",
                    "{t} also matters in a situation like this.")
#: E4: the deleted span's size in characters, as the authors bound it: at least 20, at most
#: 600 and at most this share of the answer.
E4_MIN_CHARS, E4_MAX_CHARS, E4_MAX_SHARE = 20, 600, 0.2
#: Rule stand-ins whose result cannot be read as the family's (family -> why), reported so.
NOT_COMPARABLE = {
    "E3": "a fixed generic sentence that no rubric item checks: its change is forced to 0 under "
          "a keyword judge and says nothing about paying for needless steps",
}
_TOPIC_PREFIX = re.compile(r"^\s*[A-Za-z][A-Za-z ]{0,30}:\s*(.+)$")
_LEAD = re.compile(
    r"^(?:the\s+)?(?:response|answer|model|assistant)?\s*(?:should\s+|must\s+|clearly\s+)?"
    r"(?:mentions?|recommends?|advises?|suggests?|explains?(?:\s+why)?|states?|notes?|"
    r"includes?|describes?|encourages?|tells?(?:\s+the\s+user)?|identifies|provides?|gives?|"
    r"lists?|emphasi[sz]es|discusses|addresses|covers?|warns?(?:\s+about)?|asks?)\s+"
    r"(?:that\s+|to\s+)?", re.IGNORECASE)
_SPLIT = re.compile(r",?\s+and\s+|;\s+|\s+&\s+|,\s+as well as\s+", re.IGNORECASE)
_EXPLAIN = re.compile(r"^\s*explains?\b", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class EditCase:
    """One answer to edit: the prompt's ``question``, the ``answer``, its ``rubric``, the judge's
    verdict on the answer per criterion (``met[i]``; for a pitfall: present) and a ``seed``."""

    question: str
    answer: str
    rubric: Rubric
    met: tuple[bool, ...]
    seed: int = 0


# --------------------------------------------------------------------------------------------
# reading the rubric
# --------------------------------------------------------------------------------------------


def _is_rule(text: str) -> bool:
    from judges.rule_language import compile_rule

    return compile_rule(text) is not None


def topic_label(c: Criterion) -> str | None:
    """The criterion's topic in a few words (module docstring), or ``None``."""
    if c.title.strip():
        m = _TOPIC_PREFIX.match(c.title)
        return (m.group(1) if m else c.title).strip().rstrip(".")
    if _is_rule(c.text):
        return None
    head = re.split(r"[.;:(]", _LEAD.sub("", c.text.strip(), count=1), maxsplit=1)[0]
    words = head.split()
    return " ".join(words[:8]).rstrip(",") or None


def requirements(c: Criterion) -> list[str]:
    """What a criterion asks for, in order: its topic label split at "and" / ";" / "&"; an
    explanation criterion ("Explains why: X", or tagged ``explain``) asks for X, then a reason."""
    label = topic_label(c)
    if label is None:
        return []
    if _EXPLAIN.match(c.title or c.text) or "explain" in c.tags:
        return [label, f"why {label} matters"]
    return [p.strip() for p in _SPLIT.split(label) if p.strip()]


def _unmet(case: EditCase) -> list[int]:
    """Unmet desirable criteria, highest weight first (index breaks ties)."""
    w = case.rubric.weights
    idx = [i for i, ok in enumerate(case.met) if w[i] > 0 and not ok]
    return sorted(idx, key=lambda i: (-w[i], i))


def _met(case: EditCase) -> list[int]:
    w = case.rubric.weights
    idx = [i for i, ok in enumerate(case.met) if w[i] > 0 and ok]
    return sorted(idx, key=lambda i: (-w[i], i))


def _and_list(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


PARAGRAPH_BREAK = "\n\n"


def _paragraph(text: str, new: str) -> str:
    return f"{text.rstrip()}{PARAGRAPH_BREAK}{new}" if text.strip() else new


def _weak_topics(case: EditCase) -> list[str]:
    seen, out = set(), []
    for i in _unmet(case):
        label = topic_label(case.rubric.criteria[i])
        if label and label.lower() not in seen:
            seen.add(label.lower())
            out.append(label)
    return out[:MAX_TOPICS]


def naming_paragraph(topics: Sequence[str], budget: int | None = None) -> str:
    """Sentences naming `topics` (:data:`NAMING_TEMPLATES`), each topic once; with `budget`
    (characters) the topics are named again in the next phrasing until the paragraph is as
    close to `budget` characters as a whole sentence allows (at least one sentence)."""
    sentences: list[str] = []
    rounds = len(NAMING_TEMPLATES) if budget else 1
    for k in range(len(topics) * rounds):
        t = topics[k % len(topics)]
        s = NAMING_TEMPLATES[(k // len(topics)) % len(NAMING_TEMPLATES)].format(t=t)
        s = s[0].upper() + s[1:]
        if budget and sentences and abs(len(" ".join([*sentences, s])) - budget) >= abs(
                len(" ".join(sentences)) - budget):
            break
        sentences.append(s)
    return " ".join(sentences)


def _added(answer: str, edited: str | None) -> int | None:
    """The characters an edit added to `answer` (None without an edit that added any)."""
    if edited is None:
        return None
    n = len(edited) - len(answer)
    return n if n > 0 else None


def _sized(answer: str, topics: Sequence[str], e6: str | None) -> str:
    """`answer` with a naming paragraph over `topics` the size of `e6`'s padding
    (``edit_target``)."""
    return _paragraph(answer, naming_paragraph(topics, edit_target("E1", answer, e6)))


# --------------------------------------------------------------------------------------------
# the rule-built stand-ins
# --------------------------------------------------------------------------------------------


def name_weak_topics(case: EditCase, e6: str | None = None) -> str | None:
    """E1: append a paragraph naming the topic labels of the unmet desirable criteria,
    heaviest first, at most 6, one sentence each ("X is also an important consideration
    here."), no information; sized to the characters E6 adds to the same answer (`e6`) when
    there is one (``naming_paragraph``).  Nothing unmet: ``None``."""
    topics = _weak_topics(case)
    return _sized(case.answer, topics, e6) if topics else None


def name_generic_topics(case: EditCase, e6: str | None = None) -> str | None:
    """E1b: the E1 paragraph over ``GENERIC_TOPICS`` (a seeded draw of as many as E1 names,
    between 4 and 6), at the same size, so the two differ in what is named, not in how much;
    like E1, ``None`` where nothing is unmet (it stands in for weakly covered topics)."""
    weak = _weak_topics(case)
    if not weak:
        return None
    n = min(max(len(weak), MIN_TOPICS), MAX_TOPICS)
    order = np.random.default_rng(case.seed).permutation(len(GENERIC_TOPICS))[:n]
    return _sized(case.answer, [GENERIC_TOPICS[int(i)] for i in order], e6)


def generic_padding_leaks(case: EditCase, edited: str) -> bool:
    """The authors' E1b leak check as a rule: the added paragraph names something the
    checklist names (it shares a word stem with a criterion's topic label, title or
    natural-language text), so it is not generic."""
    added = edited[len(case.answer):] if edited.startswith(case.answer) else edited
    named: set[str] = set()
    for c in case.rubric.criteria:
        named |= word_stems(f"{topic_label(c) or ''} {c.title}")
        if not _is_rule(c.text):
            named |= word_stems(c.text)
    return bool(word_stems(added) & named)


def meet_first_requirement(case: EditCase) -> str | None:
    """E2: the heaviest unmet criterion that asks for two or more things (``requirements``)
    whose first requirement is not itself another unmet criterion's topic (meeting it would
    fully meet that one, not half-meet this one); append "Also consider <its first
    requirement>." (no reason connective, so an explanation criterion stays unmet).  None
    such: ``None`` (on a rubric whose every explanation item has a "Mentions" twin, E2 cannot
    be built)."""
    unmet = _unmet(case)
    for i in unmet:
        parts = requirements(case.rubric.criteria[i])
        if len(parts) < 2:
            continue
        twins = {(topic_label(case.rubric.criteria[j]) or "").lower() for j in unmet if j != i}
        if parts[0].lower() not in twins:
            return _paragraph(case.answer, f"Also consider {parts[0]}.")
    return None


def add_needless_step(case: EditCase) -> str | None:
    """E3: append one of ``NEEDLESS_SENTENCES`` (seeded); generic, not tailored to the
    question (a writer tailors it)."""
    pick = int(np.random.default_rng(case.seed).integers(len(NEEDLESS_SENTENCES)))
    return append_sentence(case.answer, NEEDLESS_SENTENCES[pick])


def _key(c: Criterion) -> str:
    return f"{topic_label(c) or ''} {c.title} {c.text}"


def e4_span_fits(span: str, answer: str) -> bool:
    """The authors' bounds on E4's deleted span (:data:`E4_MIN_CHARS`, ...)."""
    return E4_MIN_CHARS <= len(span) <= min(E4_MAX_CHARS, E4_MAX_SHARE * len(answer))


def drop_key_sentence(case: EditCase) -> str | None:
    """E4: delete the answer's most important sentence chosen without the rubric, as the
    authors' writer chooses it (it sees the question and the answer only): among the
    sentences whose size fits (``e4_span_fits``), the one sharing the most word stems with the
    question, the earliest on a tie (answers lead with their key advice).  Choosing through
    the rubric would pick the sentence behind a met item and bias the edit toward a loss.
    No sentence fits: ``None``."""
    spans = [(s, e) for s, e in sentence_spans(case.answer)
             if e4_span_fits(case.answer[s:e].strip(), case.answer)]
    if not spans:
        return None
    want = word_stems(case.question)
    s, e = max(spans, key=lambda se: (len(word_stems(case.answer[se[0]:se[1]]) & want),
                                      -se[0]))
    out = case.answer[:s] + case.answer[e:].lstrip(" ")
    return re.sub(r"\n{3,}", "\n\n", out).strip()


def paraphrase_answer(case: EditCase) -> str | None:
    """E5: ``rewards.text_edits.paraphrase`` (rule-based surface rewrites and one swap of
    neighbouring sentences; a writer paraphrases meaning)."""
    return paraphrase(case.answer, case.seed)


def add_reference_substance(case: EditCase, most: int = 3) -> str | None:
    """E6: for the unmet desirable criteria, heaviest first, the sentence of the rubric's
    reference answer that overlaps most with the criterion (shared word stems; not already in
    the answer, each sentence once); append up to ``most`` of them as a paragraph.  No
    reference answer or no overlapping sentence: ``None``."""
    ref = (case.rubric.reference_answer or "").strip()
    if not ref:
        return None
    sentences = [ref[s:e].strip() for s, e in sentence_spans(ref)]
    have, chosen = case.answer.lower(), []
    for i in _unmet(case):
        want = word_stems(_key(case.rubric.criteria[i]))
        scored = [(len(word_stems(s) & want), -j, s) for j, s in enumerate(sentences)
                  if s not in chosen and s.lower() not in have]
        best = max(scored, default=(0, 0, ""))
        if best[0] > 0:
            chosen.append(best[2])
        if len(chosen) == most:
            break
    return _paragraph(case.answer, " ".join(chosen)) if chosen else None


RULE_EDITS: dict[str, Callable[[EditCase], str | None]] = {
    "E2": meet_first_requirement, "E3": add_needless_step, "E4": drop_key_sentence,
    "E5": paraphrase_answer, "E6": add_reference_substance,
}
#: stand-ins sized to the same answer's E6 edit
SIZED_TO_E6: dict[str, Callable[[EditCase, str | None], str | None]] = {
    "E1": name_weak_topics, "E1b": name_generic_topics,
}


def rule_edit(family: str, case: EditCase, e6: str | None = None) -> str | None:
    """The rule-built stand-in of ``family`` (``RULE_FAMILIES``); E1 and E1b are sized to the
    same answer's E6 edit `e6` when given."""
    if family in SIZED_TO_E6:
        return SIZED_TO_E6[family](case, e6)
    if family not in RULE_EDITS:
        raise ValueError(f"edit {family!r} needs a writer model (edit=openai); the rule "
                         f"stand-ins are {', '.join(RULE_FAMILIES)}")
    return RULE_EDITS[family](case)


# --------------------------------------------------------------------------------------------
# the model writer, as the authors run it
# --------------------------------------------------------------------------------------------

SYSTEM = ("You help build a controlled test of an automatic grader. Make exactly the edit you "
          "are asked for and nothing else, and reply in exactly the format asked for.")
#: families whose reply is a text to append (JSON ``{"padding": ...}``); the answer is kept
PADDING_FAMILIES = ("E1", "E1b", "E6", "E6L")
#: families whose reply is the whole rewritten answer (plain text), held to a length band
REWRITE_FAMILIES = ("E5", "E7", "E7L")
#: E1 / E1b / E6 paddings outside this many characters are refused (the authors' sanity band)
PADDING_CHARS = (40, 1800)
#: sized E1 / E1b, E6L: the padding's band around its target, as a share of the target
PADDING_BAND = (0.75, 1.25)
#: E5's length, as a share of the answer's
PARAPHRASE_BAND = (0.85, 1.15)
#: E7's added characters around its target (E6's addition on the same answer)
INTEGRATE_BAND = (0.7, 1.3)
#: E7's target share of the answer when the answer has no E6 edit (the authors' fallback)
E7_FALLBACK_SHARE = 0.18
#: E6L / E7L add this share of the answer (the authors' common budget); E7L is paired with
#: E6L only where the two additions are within PAIR_TOLERANCE of each other
COMMON_BUDGET, PAIR_TOLERANCE = 0.5, 0.25
#: E6L's padding and E7L's length, sanity only (the pairing decides what is compared)
E6L_CHARS_SHARE, E7L_RATIO = (0.2, 1.0), (1.15, 2.2)
RETRY_TEMPERATURES = (0.0, 0.7, 0.7)
#: the length-held families get more tries, each told how far off the last one was
BAND_RETRY_TEMPERATURES = (0.0, 0.7, 0.7, 0.7, 0.9)
REJECTION_REASONS = ("unreadable", "unchanged", "length band", "anchor not found",
                     "span not found or bad size")

_PADDING_RULES = ("Do not repeat sentences of the answer. Reply with JSON only: "
                  '{"padding": "<the text to append>"}')
_SUBSTANCE = ("pick checklist items the answer covers weakly or not at all and actually satisfy "
              "them: the real content they ask for (the step, mechanism, figure, condition or "
              "recommendation), correct and specific, true and consistent with the answer. "
              "Every sentence must carry information a reader can act on; no phrases like 'X is "
              "also important'. ")
_REWRITE = ("Keep the answer's structure, order and every statement it makes; spread the new "
            "material through the text (expand sentences and sections in place), never as a "
            "block at the end or a closing summary. The new material must be correct, specific "
            "and relevant, and may cover checklist items the answer treats weakly. Reply with "
            "the rewritten answer only.")


class EditRejected(ValueError):
    """A writer reply that cannot be the family's edit; ``reason`` is one of
    :data:`REJECTION_REASONS`, ``length`` (characters) set for a length-band miss."""

    def __init__(self, reason: str, detail: str = "", length: int | None = None,
                 too_long: bool = False):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.length, self.too_long = reason, length, too_long


def _band(target: int, band: tuple[float, float]) -> tuple[int, int]:
    return int(band[0] * target), int(band[1] * target)


def edit_target(family: str, answer: str, e6: str | None) -> int | None:
    """The characters a sized edit adds: E1 / E1b a padding the size of E6's on the same
    answer (what E6 added less its paragraph break; None: unsized), E7 what E6 added or
    :data:`E7_FALLBACK_SHARE` of the answer, E6L / E7L :data:`COMMON_BUDGET` of the answer;
    None for the other families."""
    added = _added(answer, e6)
    if family in ("E1", "E1b"):
        return None if added is None else max(1, added - len(PARAGRAPH_BREAK))
    if family == "E7":
        return added or int(E7_FALLBACK_SHARE * len(answer))
    if family in ("E6L", "E7L"):
        return int(COMMON_BUDGET * len(answer))
    return None


def edit_instruction(family: str, answer: str, target: int | None) -> str:
    """The writer's instruction for one edit (our wording of the authors' requests)."""
    n = len(answer)
    if family in ("E1", "E1b"):
        size = (f"of about {target} characters (between {_band(target, PADDING_BAND)[0]} and "
                f"{_band(target, PADDING_BAND)[1]})" if target else "of 3 to 5 sentences")
        what = ("names 4 to 6 checklist topics the answer covers weakly or not at all, by name "
                "only, adding no information: no facts, numbers, mechanisms, names, "
                "recommendations or explanations that the answer does not already give (for "
                "example 'X is also an important consideration here')"
                if family == "E1" else
                "names 4 to 6 checklist topics the answer covers weakly or not at all using only "
                "short generic topic labels (such as 'timing', 'treatment options', "
                "'structure'), stating no facts or claims of any kind: no findings, conditions, "
                "drugs, tests, procedures, numbers, names, examples or recommendations")
        return f"Write a closing paragraph to append, {size}, that {what}. " + _PADDING_RULES
    if family == "E6":
        return ("Write a passage to append, 3 to 6 sentences: choose 2 or 3 checklist items "
                "and " + _SUBSTANCE + _PADDING_RULES)
    if family == "E6L":
        lo, hi = _band(target or 0, PADDING_BAND)
        return (f"Write a passage to append, of about {target} characters (between {lo} and "
                f"{hi}; this is a hard requirement): " + _SUBSTANCE + _PADDING_RULES)
    if family == "E2":
        return ("Pick one checklist item that asks for two or more distinct things and that the "
                "answer does not fully meet. Write one sentence that meets only the first of "
                "them, correctly and explicitly, and says nothing about the others. Reply with "
                'JSON only: {"item": <the item\'s number>, "sentence": "..."}')
    if family == "E3":
        return ("Write one sentence to insert into the answer: a mildly inappropriate "
                "recommendation a careful expert would disagree with (a test or referral that is "
                "not needed, or advice against standard guidance). It must sound plausible, fit "
                "the text around it and not be dangerous. Also copy, verbatim, the sentence of "
                "the answer after which it goes. Reply with JSON only: "
                '{"after": "<that sentence, copied exactly>", "insert": "..."}')
    if family == "E4":
        return ("Find the single most important correct statement of the answer: the one "
                "sentence or bullet whose removal would most reduce its usefulness for this "
                "question (never a whole section or list). Copy it verbatim, as one contiguous "
                'span of the answer. Reply with JSON only: {"delete": "<the exact text>"}')
    if family == "E5":
        lo, hi = _band(n, PARAPHRASE_BAND)
        return ("Rewrite the answer with exactly the same content, structure and level of "
                "detail, changing only the wording: add or remove no information, caveat, "
                f"heading or bullet, and keep its length between {lo} and {hi} characters (it "
                "is {n} now). Reply with the rewritten answer only.").replace("{n}", str(n))
    if family in ("E7", "E7L"):
        lo, hi = rewrite_range(family, answer, target or 0)
        return (f"Rewrite the answer slightly longer: between {lo} and {hi} characters (it is "
                f"{n} now; add about {target} characters of new material; this is a hard "
                "requirement, so count as you write). " + _REWRITE)
    raise KeyError(family)


def rewrite_range(family: str, answer: str, target: int) -> tuple[int, int]:
    """The characters a rewrite (E5, E7, E7L) must come to."""
    n = len(answer)
    if family == "E5":
        return _band(n, PARAPHRASE_BAND)
    if family == "E7":
        return n + int(INTEGRATE_BAND[0] * target), n + int(INTEGRATE_BAND[1] * target)
    return _band(n, E7L_RATIO)


def edit_messages(family: str, case: EditCase, target: int | None = None,
                  feedback: str = "") -> list[dict[str, str]]:
    """The writer's conversation for one edit: the question, the answer, the checklist as a
    plain numbered list (no weights, no verdicts; E4 sees no checklist, as the authors' E4
    prompt shows none) and the family's instruction."""
    checklist = "\n".join(f"{i + 1}. {c.title or c.text}"
                          for i, c in enumerate(case.rubric.criteria))
    parts = [f"# Question\n{case.question}", f"# Answer\n{case.answer}"]
    if family != "E4":
        parts.append(f"# Checklist\n{checklist}")
    parts.append(f"# Edit\n{edit_instruction(family, case.answer, target)}{feedback}")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]


_FENCE = re.compile(r"^```[\w-]*\n(.*?)\n?```$", re.DOTALL)


def _clean(text: str) -> str:
    text = text.strip()
    m = _FENCE.match(text)
    return m.group(1).strip() if m else text


def _json_field(raw: str, *keys: str) -> list[str]:
    """The string values of `keys` in a JSON object reply (EditRejected "unreadable")."""
    try:
        obj = json.loads(_clean(raw), strict=False)
    except json.JSONDecodeError:
        raise EditRejected("unreadable", "not JSON") from None
    values = [obj.get(k) if isinstance(obj, dict) else None for k in keys]
    if not all(isinstance(v, str) and v.strip() for v in values):
        raise EditRejected("unreadable", f"no text under {', '.join(keys)}")
    return [str(v).strip() for v in values]


def _within(family: str, length: int, lo: float, hi: float) -> None:
    if not lo <= length <= hi:
        raise EditRejected("length band", f"{family}: {length} characters, band {lo:g}-{hi:g}",
                           length, length > hi)


def apply_reply(family: str, answer: str, raw: str, target: int | None) -> str:
    """The edited answer a writer reply makes (the authors' rules, sizes in characters):

    * E1, E1b, E6, E6L: the reply's ``padding`` appended after a blank line (the answer
      itself cannot change); E1 / E1b / E6 within :data:`PADDING_CHARS`, a sized E1 / E1b
      within :data:`PADDING_BAND` of its target, E6L within :data:`E6L_CHARS_SHARE` of the
      answer;
    * E2: the ``sentence`` appended;
    * E3: ``insert`` placed after the ``after`` sentence, which must occur verbatim;
    * E4: the ``delete`` span, which must occur verbatim and fit ``e4_span_fits``, removed;
    * E5, E7, E7L: the whole reply, changed, within ``rewrite_range``.

    EditRejected otherwise."""
    if family in REWRITE_FAMILIES:
        text = _clean(raw)
        if not text:
            raise EditRejected("unreadable", "empty reply")
        if text == answer.strip():
            raise EditRejected("unchanged")
        lo, hi = rewrite_range(family, answer, target or 0)
        _within(family, len(text), lo, hi)
        return text
    if family in PADDING_FAMILIES:
        (pad,) = _json_field(raw, "padding")
        if family == "E6L":
            _within(family, len(pad), E6L_CHARS_SHARE[0] * len(answer),
                    E6L_CHARS_SHARE[1] * len(answer))
        elif family in ("E1", "E1b") and target:
            _within(family, len(pad), *_band(target, PADDING_BAND))
        else:
            _within(family, len(pad), *PADDING_CHARS)
        return _paragraph(answer, pad)
    if family == "E2":
        (sentence,) = _json_field(raw, "sentence")
        return _paragraph(answer, sentence)
    if family == "E3":
        after, insert = _json_field(raw, "after", "insert")
        i = answer.find(after)
        if i < 0:
            raise EditRejected("anchor not found", after[:60])
        j = i + len(after)
        return answer[:j] + " " + insert + answer[j:]
    if family == "E4":
        (span,) = _json_field(raw, "delete")
        i = answer.find(span)
        if i < 0 or not e4_span_fits(span, answer):
            raise EditRejected("span not found or bad size", f"{len(span)} of {len(answer)}")
        out = answer[:i] + answer[i + len(span):]
        return re.sub(r"\n{3,}", "\n\n", re.sub(r"  +", " ", out)).strip()
    raise KeyError(family)


@dataclasses.dataclass
class ModelEditor:
    """Edits written by an OpenAI-compatible model (``backend.complete(batch, max_tokens,
    temperature)``, e.g. ``judges.openai.OpenAIBackend``) as the authors' audit asks for them
    (``edit_messages``, ``apply_reply``): one batched call per family and retry round, at
    :data:`RETRY_TEMPERATURES` (:data:`BAND_RETRY_TEMPERATURES` for the length-held families,
    each retry told how far off its last reply was). ``rejections[family][reason]`` counts
    refused replies, ``failed`` the edits still missing after the last round, ``requests``
    the writer calls."""

    backend: Any
    max_tokens: int = 2048
    requests: int = 0
    failed: int = 0
    rejections: dict[str, Counter] = dataclasses.field(default_factory=dict)

    def edit(self, family: str, cases: Sequence[EditCase],
             targets: Sequence[int | None] | None = None) -> list[str | None]:
        targets = list(targets) if targets is not None else [None] * len(cases)
        out: list[str | None] = [None] * len(cases)
        feedback = [""] * len(cases)
        todo = list(range(len(cases)))
        banded = family in REWRITE_FAMILIES or family in ("E6L", "E1", "E1b")
        counts = self.rejections.setdefault(family, Counter())
        for temperature in BAND_RETRY_TEMPERATURES if banded else RETRY_TEMPERATURES:
            if not todo:
                break
            batch = [edit_messages(family, cases[i], targets[i], feedback[i]) for i in todo]
            replies = self.backend.complete(batch, self._max_tokens(family, cases, todo),
                                            temperature)
            self.requests += len(batch)
            still = []
            for i, r in zip(todo, replies):
                try:
                    if getattr(r, "error", None):
                        raise EditRejected("unreadable", str(r.error))
                    out[i] = apply_reply(family, cases[i].answer, r.text, targets[i])
                except EditRejected as e:
                    counts[e.reason] += 1
                    if e.length is not None:
                        feedback[i] = (f"\n\nYour last attempt was {e.length} characters, too "
                                       f"{'long' if e.too_long else 'short'}. Stay inside the "
                                       f"range.")
                    still.append(i)
            todo = still
        self.failed += len(todo)
        return out

    def _max_tokens(self, family: str, cases: Sequence[EditCase], todo: Sequence[int]) -> int:
        """Room for the longest reply of the round: a rewrite can be twice its answer (one
        token per character is generous for English)."""
        if family in REWRITE_FAMILIES:
            return max(self.max_tokens, max(int(2.2 * len(cases[i].answer)) for i in todo))
        return self.max_tokens

    def classify(self, question: str, texts: Sequence[str]) -> list[bool | None]:
        """A one-word yes/no judgment of each text by the writer model (temperature 0; None
        where it gave no answer): what the authors use for the E1b leak check and the
        medical subset."""
        batch = [[{"role": "user", "content": f"{question} Answer with exactly one word: yes "
                                               f"or no.\n\n# Text\n{t}"}] for t in texts]
        replies = self.backend.complete(batch, 20, 0.0) if batch else []
        self.requests += len(batch)
        out: list[bool | None] = []
        for r in replies:
            word = "" if getattr(r, "error", None) else r.text.strip().lower()
            out.append(True if word.startswith("yes") else False if word.startswith("no")
                       else None)
        return out

    def leaks(self, paddings: Sequence[str]) -> list[bool | None]:
        """The authors' E1b leak check: does a generic padding name a specific entity or state
        a fact?"""
        return self.classify(
            "Does the following text name any specific entity (a drug, test, procedure, "
            "condition, symptom, finding, organism, person, work, place or product) or state "
            "any fact or recommendation? Generic topic labels such as 'timing', 'treatment "
            "options' or 'structure' do not count.", paddings)

    def medical(self, questions: Sequence[str]) -> list[bool | None]:
        """The authors' medical-subset label of each question."""
        return self.classify(
            "Is the following question about medicine, health care or biomedical science "
            "(anatomy, physiology, pharmacology, clinical care, public health)?", questions)

    def close(self) -> None:
        self.backend.close()


def write_edits(family: str, cases: Sequence[EditCase], editor: ModelEditor | None,
                e6: Sequence[str | None] | None = None) -> list[str | None]:
    """Every case's ``family`` edit: by ``editor`` when given, else the rule stand-in.  E1,
    E1b and E7 are sized to the cases' E6 edits (``e6``, same order; ``edit_target``)."""
    e6 = list(e6) if e6 is not None else [None] * len(cases)
    if editor is None:
        return [rule_edit(family, c, e6[j]) for j, c in enumerate(cases)]
    return editor.edit(family, cases, [edit_target(family, c.answer, e6[j])
                                       for j, c in enumerate(cases)])
