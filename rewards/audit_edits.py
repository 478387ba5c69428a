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

* ``ModelEditor``: an OpenAI-compatible model (the audit's ``edit`` role) asked with one prompt
  per family (``INSTRUCTIONS``), showing the question, the answer and the checklist with the
  judge's verdicts on the answer.  Temperature 0 first, then 0.7 and 0.9 when a reply is empty,
  failed, or returns the answer unchanged (the authors' retry schedule); an edit still missing
  after that is left out of its row and counted.
* ``rule_edit``: deterministic stand-ins, no model, built from the rubric, the judge's verdicts
  on the original and the rubric's reference answer, for the families a rubric can build
  (E1, E1b, E2, E3, E4, E5, E6; each function's docstring says how).  E7, E6L and E7L need a
  writer.  A stand-in returns ``None`` where the rubric cannot build its edit (e.g. E4 when the
  answer meets no criterion): that answer is left out of that row and counted.

A criterion's *topic label* (``topic_label``) is its title after a ``"Kind: "`` prefix
("Mentions: log off" -> "log off"), else its natural-language text without a leading
"The response" and verb ("Advises rest and fluids." -> "rest and fluids"); a rule-language
criterion without a title has none.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rewards.rubric import Criterion, Rubric
from rewards.text_edits import (
    append_sentence,
    delete_sentence_overlapping,
    paraphrase,
    sentence_spans,
    word_stems,
)

FAMILIES = ("E1", "E1b", "E2", "E3", "E4", "E5", "E6", "E7", "E6L", "E7L")
#: Families a rubric can build without a model (``rule_edit``).
RULE_FAMILIES = ("E1", "E1b", "E2", "E3", "E4", "E5", "E6")
#: E6L / E7L add this share of the original's words (the authors' common budget).
COMMON_BUDGET = 0.5
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


def _paragraph(text: str, new: str) -> str:
    return f"{text.rstrip()}\n\n{new}" if text.strip() else new


def _weak_topics(case: EditCase) -> list[str]:
    seen, out = set(), []
    for i in _unmet(case):
        label = topic_label(case.rubric.criteria[i])
        if label and label.lower() not in seen:
            seen.add(label.lower())
            out.append(label)
    return out[:MAX_TOPICS]


def _naming_paragraph(topics: Sequence[str]) -> str:
    return f"Other points worth keeping in mind: {_and_list(list(topics))}."


# --------------------------------------------------------------------------------------------
# the rule-built stand-ins
# --------------------------------------------------------------------------------------------


def name_weak_topics(case: EditCase) -> str | None:
    """E1: append "Other points worth keeping in mind: a, b, c and d." naming the topic labels
    of the unmet desirable criteria, highest weight first, at most 6 (fewer when fewer are
    unmet).  Nothing unmet: ``None``."""
    topics = _weak_topics(case)
    return _paragraph(case.answer, _naming_paragraph(topics)) if topics else None


def name_generic_topics(case: EditCase) -> str | None:
    """E1b: the E1 paragraph with as many ``GENERIC_TOPICS`` (a seeded draw, between 4 and 6)
    as E1 names, so the two differ in what is named, not in how much."""
    n = min(max(len(_weak_topics(case)), MIN_TOPICS), MAX_TOPICS)
    order = np.random.default_rng(case.seed).permutation(len(GENERIC_TOPICS))[:n]
    return _paragraph(case.answer, _naming_paragraph([GENERIC_TOPICS[int(i)] for i in order]))


def meet_first_requirement(case: EditCase) -> str | None:
    """E2: the heaviest unmet criterion that asks for two or more things (``requirements``);
    append "Also consider <its first requirement>." (no reason connective, so an explanation
    criterion stays unmet).  No compound unmet criterion: ``None``."""
    for i in _unmet(case):
        parts = requirements(case.rubric.criteria[i])
        if len(parts) >= 2:
            return _paragraph(case.answer, f"Also consider {parts[0]}.")
    return None


def add_needless_step(case: EditCase) -> str | None:
    """E3: append one of ``NEEDLESS_SENTENCES`` (seeded); generic, not tailored to the
    question (a writer tailors it)."""
    pick = int(np.random.default_rng(case.seed).integers(len(NEEDLESS_SENTENCES)))
    return append_sentence(case.answer, NEEDLESS_SENTENCES[pick])


def _key(c: Criterion) -> str:
    return f"{topic_label(c) or ''} {c.title} {c.text}"


def drop_key_sentence(case: EditCase) -> str | None:
    """E4: delete the answer's sentence that overlaps most (shared 5-letter word stems) with
    the heaviest criterion the answer meets; the next one when that shares no word with any
    sentence.  Meets nothing, or nothing overlaps: ``None``."""
    for i in _met(case):
        out = delete_sentence_overlapping(case.answer, _key(case.rubric.criteria[i]), case.seed)
        if out != case.answer:
            return out
    return None


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
    "E1": name_weak_topics, "E1b": name_generic_topics, "E2": meet_first_requirement,
    "E3": add_needless_step, "E4": drop_key_sentence, "E5": paraphrase_answer,
    "E6": add_reference_substance,
}


def rule_edit(family: str, case: EditCase) -> str | None:
    """The rule-built stand-in of ``family`` (``RULE_FAMILIES``)."""
    if family not in RULE_EDITS:
        raise ValueError(f"edit {family!r} needs a writer model (edit=openai); the rule "
                         f"stand-ins are {', '.join(RULE_FAMILIES)}")
    return RULE_EDITS[family](case)


# --------------------------------------------------------------------------------------------
# the model writer
# --------------------------------------------------------------------------------------------

SYSTEM = ("You edit answers for a controlled experiment on reward models. Make exactly the "
          "edit you are asked for and nothing else. Reply with the complete edited answer "
          "only: no preface, no notes, no code fences.")
INSTRUCTIONS = {
    "E1": "Append one closing paragraph that names 4 to 6 checklist topics the answer covers "
          "weakly or not at all, as bare names. Add no facts, advice, reasons or details about "
          "them. Leave the rest of the answer as it is.",
    "E1b": "Append one closing paragraph that names 4 to 6 general topic labels (such as "
           "'timing' or 'individual circumstances'), naming nothing specific to this question "
           "or checklist and adding no facts or advice. Leave the rest of the answer as it is.",
    "E2": "Pick one unmet checklist item that asks for two or more things. Append one sentence "
          "that does only the first of them. Leave the rest of the answer as it is.",
    "E3": "Add one mild, plausible recommendation this asker does not need (an unnecessary "
          "test, purchase or step). It must not be dangerous. Leave the rest as it is.",
    "E4": "Delete the single most important correct sentence of the answer. Change nothing "
          "else.",
    "E5": "Paraphrase the answer: the same content and structure, about the same length, "
          "different wording.",
    "E6": "Append 2 or 3 checklist items the answer does not meet yet, satisfying each one "
          "with correct, specific content. Leave the rest of the answer as it is.",
    "E7": "Work new, correct and specific material that meets unmet checklist items into the "
          "answer where it belongs (not as a block at the end), adding about {budget} words.",
    "E6L": "Append new, correct and specific material that meets unmet checklist items as a "
           "block at the end, about {budget} words. Leave the rest of the answer as it is.",
    "E7L": "Work new, correct and specific material that meets unmet checklist items into the "
           "answer where it belongs (not as a block at the end), adding about {budget} words.",
}
RETRY_TEMPERATURES = (0.0, 0.7, 0.9)
_FENCE = re.compile(r"^```[\w-]*\n(.*?)\n?```$", re.DOTALL)


def edit_messages(family: str, case: EditCase, budget: int | None = None
                  ) -> list[dict[str, str]]:
    """The writer's conversation for one edit: the question, the answer, the checklist with
    each criterion's weight and the judge's verdict, and the family's instruction."""
    lines = [f"{i + 1}. [{'met' if ok else 'not met'}] (weight {c.weight:g}) "
             f"{c.title or c.text}"
             for i, (c, ok) in enumerate(zip(case.rubric.criteria, case.met))]
    user = (f"# Question\n{case.question}\n\n# Answer\n{case.answer}\n\n"
            f"# Checklist (weights; met / not met as judged on this answer)\n"
            + "\n".join(lines) + f"\n\n# Edit\n{INSTRUCTIONS[family].format(budget=budget)}")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def _clean(text: str) -> str:
    text = text.strip()
    m = _FENCE.match(text)
    return m.group(1).strip() if m else text


@dataclasses.dataclass
class ModelEditor:
    """Edits written by an OpenAI-compatible model (``backend.complete(batch, max_tokens,
    temperature)``, e.g. ``judges.openai.OpenAIBackend``): one batched call per family and
    retry round; ``failed`` counts edits still missing after ``RETRY_TEMPERATURES``."""

    backend: Any
    max_tokens: int = 2048
    requests: int = 0
    failed: int = 0

    def edit(self, family: str, cases: Sequence[EditCase],
             budgets: Sequence[int | None] | None = None) -> list[str | None]:
        budgets = list(budgets) if budgets is not None else [None] * len(cases)
        out: list[str | None] = [None] * len(cases)
        todo = list(range(len(cases)))
        for temperature in RETRY_TEMPERATURES:
            if not todo:
                break
            batch = [edit_messages(family, cases[i], budgets[i]) for i in todo]
            replies = self.backend.complete(batch, self.max_tokens, temperature)
            self.requests += len(batch)
            still = []
            for i, r in zip(todo, replies):
                text = "" if getattr(r, "error", None) else _clean(r.text)
                if text and text != cases[i].answer.strip():
                    out[i] = text
                else:
                    still.append(i)
            todo = still
        self.failed += len(todo)
        return out

    def close(self) -> None:
        self.backend.close()


def word_budget(family: str, original: str, e6: str | None) -> int | None:
    """Words a sized edit adds: E7 matches E6's addition (``None`` without an E6 that added
    words), E6L / E7L add ``COMMON_BUDGET`` of the original; other families are unsized."""
    if family == "E7":
        added = len(e6.split()) - len(original.split()) if e6 is not None else 0
        return added if added > 0 else None
    if family in ("E6L", "E7L"):
        return max(1, round(COMMON_BUDGET * len(original.split())))
    return None


def write_edits(family: str, cases: Sequence[EditCase], editor: ModelEditor | None,
                e6: Sequence[str | None] | None = None) -> list[str | None]:
    """Every case's ``family`` edit: by ``editor`` when given, else the rule stand-in.  E7 is
    sized to the cases' E6 edits (``e6``, same order); a case whose budget is unknown gets
    ``None``."""
    if editor is None:
        return [rule_edit(family, c) for c in cases]
    budgets = [word_budget(family, c.answer, (e6 or [None] * len(cases))[j])
               for j, c in enumerate(cases)]
    sized = family in ("E7", "E6L", "E7L")
    keep = [j for j, b in enumerate(budgets) if b is not None or not sized]
    texts = editor.edit(family, [cases[j] for j in keep], [budgets[j] for j in keep])
    out: list[str | None] = [None] * len(cases)
    for j, t in zip(keep, texts):
        out[j] = t
    return out
