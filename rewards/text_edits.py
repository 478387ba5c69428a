"""Rewriting answers sentence by sentence: the text operations the perturbation analysis
(``rewards.perturb``) and the authors' audit edits (``rewards.audit_edits``) are built from.

Sentences are runs ending in ``.``, ``!``, ``?`` or a line end (``sentence_spans``); word stems
are 5-letter prefixes of words of 3+ letters, rule-language and filler words left out
(``word_stems``), so "flowers" meets "flowering". ``paraphrase`` is the meaning-preserving
rewrite of the noise floor: rule-based surface rewrites (``PARAPHRASE_RULES``) and one swap of
neighbouring sentences, both seeded.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

_SENTENCE = re.compile(r"[^\s][^.!?\n]*(?:[.!?]+[\"')\]]*|(?=\n)|$)")
_WORD = re.compile(r"[A-Za-z]{3,}")
_RULE_WORDS = frozenset(
    "iregex regex contains contains_all contains_any starts_with ends_with not count bullets "
    "tag json feature min_words max_words min_chars max_chars min_lines max_lines".split()
)
_STOP = frozenset(
    "the and for with that this from your you are was were have has had not but all any can "
    "will into out about more most mentions explains why response answer recommends".split()
)


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of every sentence (a run ending in . ! ? or a line end)."""
    return [m.span() for m in _SENTENCE.finditer(text) if m.group().strip()]


def pick_index(n: int, seed: int) -> int:
    """A seeded choice among ``n`` candidates."""
    return int(np.random.default_rng(seed).integers(n))


def join_edit(text: str, start: int, end: int, new: str) -> str:
    """Replace ``text[start:end]`` by ``new``; on deletion, swallow the following spaces."""
    if not new:
        while end < len(text) and text[end] in " \t":
            end += 1
    return text[:start] + new + text[end:]


def append_sentence(text: str, sentence: str) -> str:
    """``sentence`` after ``text``: on a new line when the text has lines, else after a
    space."""
    body = text.rstrip()
    sep = "\n" if "\n" in body else " "
    return f"{body}{sep}{sentence}" if body else sentence


def word_stems(text: str) -> set[str]:
    """The 5-letter prefixes of the words of 3+ letters, rule-language and filler words out."""
    words = (w.lower() for w in _WORD.findall(text))
    return {w[:5] for w in words if w not in _RULE_WORDS and w not in _STOP}


def delete_sentence_overlapping(text: str, key: str, seed: int = 0) -> str:
    """Delete the sentence with the largest stem overlap with ``key`` (``seed`` breaks ties).
    No overlap at all: the text is returned unchanged."""
    spans = sentence_spans(text)
    want = word_stems(key)
    scores = [len(word_stems(text[s:e]) & want) for s, e in spans]
    if not scores or max(scores) == 0:
        return text
    best = [i for i, v in enumerate(scores) if v == max(scores)]
    s, e = spans[best[pick_index(len(best), seed)]]
    out = join_edit(text, s, e, "")
    return re.sub(r"\n{3,}", "\n\n", out).strip()


#: Meaning-preserving rewrites (source -> replacement, whole words, case-insensitive): contractions
#: both ways and near-synonymous phrases.  Reason connectives and content words are left alone.
PARAPHRASE_RULES: tuple[tuple[str, str], ...] = (
    ("do not", "don't"), ("don't", "do not"), ("does not", "doesn't"), ("doesn't", "does not"),
    ("is not", "isn't"), ("isn't", "is not"), ("are not", "aren't"), ("aren't", "are not"),
    ("it is", "it's"), ("it's", "it is"), ("you are", "you're"), ("you're", "you are"),
    ("cannot", "can't"), ("can't", "cannot"), ("will not", "won't"), ("won't", "will not"),
    ("that is", "that's"), ("that's", "that is"), ("you will", "you'll"), ("you'll", "you will"),
    ("make sure", "be sure"), ("be sure", "make sure"), ("try to", "aim to"),
    ("for example", "for instance"), ("for instance", "for example"), ("a lot of", "plenty of"),
    ("lots of", "plenty of"), ("every day", "daily"), ("often", "frequently"),
    ("frequently", "often"), ("usually", "typically"), ("typically", "usually"),
    ("large", "big"), ("big", "large"), ("choose", "pick"), ("keep in mind", "remember"),
)
_PARAPHRASE_RE = re.compile(
    r"\b(?:" + "|".join(re.escape(a) for a, _ in
                        sorted(PARAPHRASE_RULES, key=lambda r: -len(r[0]))) + r")(?![\w'])",
    re.IGNORECASE)
_PARAPHRASE_TO = {a: b for a, b in PARAPHRASE_RULES}


def _same_case(src: str, new: str) -> str:
    return new[:1].upper() + new[1:] if src[:1].isupper() else new


def reword(text: str, seed: int = 0) -> str:
    """Apply each rule of ``PARAPHRASE_RULES`` with probability 1/2 (one seeded coin per rule,
    all occurrences alike), in one pass so a rewrite is never rewritten back."""
    rng = np.random.default_rng(seed)
    on = {a for a, _ in PARAPHRASE_RULES if rng.random() < 0.5}

    def sub(m: re.Match) -> str:
        src = m.group()
        key = src.lower()
        return _same_case(src, _PARAPHRASE_TO[key]) if key in on else src

    return _PARAPHRASE_RE.sub(sub, text)


def swap_adjacent_sentences(text: str, seed: int = 0) -> str:
    """Swap two neighbouring sentences after the first (``seed`` picks which), both ending in
    ``.``, ``!`` or ``?``: a list of independent tips says the same in either order, and the
    opening sentence stays where an "answers first" check looks.  Fewer than three such
    sentences: unchanged."""
    spans = [(s, e) for s, e in sentence_spans(text) if text[s:e].rstrip(" \"')]").endswith(
        (".", "!", "?"))]
    cands = list(range(1, len(spans) - 1))
    if not cands:
        return text
    i = cands[pick_index(len(cands), seed)]
    (s1, e1), (s2, e2) = spans[i], spans[i + 1]
    return text[:s1] + text[s2:e2] + text[e1:s2] + text[s1:e1] + text[e2:]


def paraphrase(text: str, seed: int = 0, rubric: Any = None) -> str:
    """A meaning-preserving rewrite (the noise-floor probe, not an edit operator): ``reword``
    then ``swap_adjacent_sentences``, both seeded.  Rule-based, so it only reaches surface form;
    give LLM-written paraphrases with ``paraphrase_file=`` for a judge that reads meaning."""
    del rubric
    seeds = np.random.default_rng([seed, 7]).integers(2**31 - 1, size=2)
    return swap_adjacent_sentences(reword(text, int(seeds[0])), int(seeds[1]))
