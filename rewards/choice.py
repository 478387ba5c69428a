"""Multiple-choice answers (MedQA, GPQA, MMLU style: a question, lettered options, a gold
letter): the letter a response chose, read from the usual ways a model writes it.

In order, the first that finds a letter decides (the last occurrence within it):

1. ``\\boxed{C}`` (also ``\\boxed{\\text{C}}`` and ``\\boxed{(C)}``);
2. an answer phrase: ``answer is C``, ``Answer: (C)``, ``**Answer:** C``,
   ``final answer: C.``;
3. an option phrase: ``the correct option is C``, ``choice: B``;
4. a response, or its last line, that is only a letter: ``C``, ``(C)``, ``C.``, ``C)``;
5. a response that starts with the letter and a mark: ``C. Because ...``, ``(C) ...``.

A letter must stand alone (``A`` in ``ACE inhibitors`` is not an answer) and be one of the
options (``letters``, default A to J). Nothing found: None, which scores 0.
"""

from __future__ import annotations

import re
import string

LETTERS = string.ascii_uppercase[:10]


def _patterns(letters: str) -> list[re.Pattern[str]]:
    x = f"[{re.escape(letters)}]"
    return [
        re.compile(rf"\\boxed\{{\s*(?:\\text\{{\s*)?\(?({x})\)?\s*\}}?\s*\}}"),
        re.compile(rf"(?i:answer)\**\s*(?i:is|:|=)?\s*\**\s*(?i:option\s+)?"
                   rf"\(?({x})\)?(?![\w'])"),
        re.compile(rf"(?i:option|choice)\**\s*(?i:is|:|=)?\s*\**\s*\(?({x})\)?(?![\w'])"),
        re.compile(rf"^\s*\**\(?({x})\)?[.):]?\**\s*$", re.MULTILINE),
        re.compile(rf"\A\s*\**\(?({x})(?:\)|\.|:)(?:\s|$)"),
    ]


def extract_choice(text: str, letters: str = LETTERS) -> str | None:
    """The option letter `text` chose (module docstring), or None."""
    if not text:
        return None
    for i, pattern in enumerate(_patterns(letters)):
        if i == 3:  # a lone letter: the whole response, else its last non-empty line
            lines = [ln for ln in text.strip().splitlines() if ln.strip()]
            found = pattern.findall(lines[-1]) if lines else []
        else:
            found = pattern.findall(text)
        if found:
            return found[-1]
    return None


def gold_letter(gold: object) -> str:
    """The gold option as a letter: ``"C"``, ``"(C)"``, ``"c"``, or a 0-based index (2)."""
    if isinstance(gold, int) and not isinstance(gold, bool):
        return LETTERS[gold]
    text = str(gold).strip().strip("()").strip().upper()
    if len(text) != 1 or text not in LETTERS:
        raise ValueError(f"not an option letter: {gold!r}")
    return text


def choice_accuracy(response_text: str, gold: object, letters: str = LETTERS) -> float:
    """1.0 when the letter `response_text` chose is the gold one, else 0.0."""
    return float(extract_choice(response_text, letters) == gold_letter(gold))


def render_options(question: str, options: object) -> str:
    """A question followed by its options, one per line as ``A. text``: `options` a mapping
    of letter to text (MedQA) or a list (GPQA-style rows, lettered in order)."""
    if isinstance(options, dict):
        pairs = [(str(k).strip(), str(v)) for k, v in options.items()]
    elif isinstance(options, list | tuple):
        pairs = [(LETTERS[i], str(v)) for i, v in enumerate(options)]
    else:
        raise ValueError(f"options must be a mapping of letter to text or a list, got "
                         f"{type(options).__name__}")
    return question.rstrip() + "\n\n" + "\n".join(f"{k}. {v}" for k, v in pairs)
