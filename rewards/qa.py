"""Outcome rewards for QA search agents: answer normalisation, EM / F1, answer extraction,
format validity, and the ARBOR / Search-R1 outcome rewards (SPEC section 2).

Contract for every function taking ``response_text``: it is the RESPONSE part of a trajectory
only (everything the policy generated plus the ``<information>`` blocks and invalid-action
messages the environment inserted), never the prompt. The Search-R1 prompt contains the example
``<answer> Beijing </answer>``; Search-R1 works around it by skipping the first match of the
full sequence, we instead never see the prompt, so the last ``<answer>`` of the response is the
answer. Text the environment inserted is not the policy's: tags inside ``<information>`` blocks
and the invalid-action message (which spells out ``<search> and </search>``) are ignored.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Callable, Sequence
from functools import lru_cache

from core.registry import Registry

Golds = str | Sequence[str]

TAGS = ("think", "search", "answer", "information")
# Texts a tokenizer may decode after the final answer (end-of-sequence / end-of-turn markers);
# they do not count as "text after </answer>".
DEFAULT_EOS_TEXTS = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<end_of_turn>",
    "<eos>",
    "</s>",
)

# The environment's message after a turn without a valid action (Search-R1's wording, SPEC 2).
INVALID_ACTION = (
    "\nMy previous action is invalid. If I want to search, I should put the query between "
    "<search> and </search>. If I want to give the final answer, I should put the answer "
    "between <answer> and </answer>. Let me try again.\n")

_TAG_RE = re.compile(r"<(/?)(" + "|".join(TAGS) + r")>")
# the message as decoded text, whatever whitespace a tokenizer round trip leaves around words
_INVALID_ACTION_RE = re.compile(r"\s*".join(map(re.escape, INVALID_ACTION.split())))
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_INFO_BLOCK_RE = re.compile(r"<information>.*?</information>", re.DOTALL)
_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_ASCII_PUNCT = frozenset(string.punctuation)


@lru_cache(maxsize=4096)
def _is_punct(ch: str) -> bool:
    # string.punctuation covers ASCII symbols such as $ + < = > ^ ` | ~ (Unicode category S),
    # the category test covers Unicode punctuation (curly quotes, dashes, CJK marks, ...).
    return ch in _ASCII_PUNCT or unicodedata.category(ch).startswith("P")


def normalize_answer(s: str) -> str:
    """SQuAD / Search-R1 normalisation: lowercase, strip punctuation (ASCII and Unicode), drop
    the articles a/an/the, collapse whitespace. Text is NFC-normalised first so that composed
    and decomposed forms of the same letter compare equal."""
    s = unicodedata.normalize("NFC", s).lower()
    s = "".join(ch for ch in s if not _is_punct(ch))
    s = _ARTICLES_RE.sub(" ", s)
    return " ".join(s.split())


def _as_golds(golds: Golds) -> list[str]:
    if isinstance(golds, str):
        return [golds]
    return [str(g) for g in golds]


def _normalized_golds(golds: Golds) -> list[str]:
    """Normalised gold aliases, without those that normalise to nothing ("The", ".") when
    another alias has content: such an alias would match any empty-ish prediction ("?")."""
    forms = [normalize_answer(g) for g in _as_golds(golds)]
    return [f for f in forms if f] or forms


def exact_match(pred: str | None, golds: Golds) -> float:
    """1.0 if the normalised prediction equals a normalised gold alias, else 0.0."""
    if pred is None:
        return 0.0
    p = normalize_answer(pred)
    return float(any(p == g for g in _normalized_golds(golds)))


def substring_exact_match(pred: str | None, golds: Golds) -> float:
    """1.0 if a normalised gold alias occurs inside the normalised prediction (Search-R1's
    ``subem``). An empty gold only matches an empty prediction, so that "" is not a substring
    match of everything."""
    if pred is None:
        return 0.0
    p = normalize_answer(pred)
    for g in _as_golds(golds):
        n = normalize_answer(g)
        if (n and n in p) or (not n and not p):
            return 1.0
    return 0.0


def _f1_single(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    if not pred_tokens or not gold_tokens:
        return float(not pred_tokens and not gold_tokens)
    common = Counter(pred_tokens) & Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(pred: str | None, golds: Golds) -> float:
    """Token-level F1 after ``normalize_answer``, max over gold aliases. An empty prediction or
    gold scores 0 unless both are empty (then 1)."""
    if pred is None:
        return 0.0
    p = normalize_answer(pred).split()
    return max((_f1_single(p, g.split()) for g in _normalized_golds(golds)), default=0.0)


def extract_answer(response_text: str) -> str | None:
    """The stripped content of the LAST ``<answer>...</answer>`` of the response, or None.

    ``response_text`` must not contain the prompt (see the module docstring). Closed
    ``<information>`` blocks are retrieved text and the invalid-action message is the
    environment's, not the policy's, so answers inside them are ignored."""
    visible = _INFO_BLOCK_RE.sub(" ", _policy_text(response_text))
    matches = _ANSWER_RE.findall(visible)
    return matches[-1].strip() if matches else None


def _policy_text(response_text: str) -> str:
    """The response without the environment's invalid-action messages."""
    return _INVALID_ACTION_RE.sub(" ", response_text)


def _strip_eos(tail: str, eos_texts: Sequence[str]) -> str:
    tail = tail.strip()
    changed = True
    while changed and tail:
        changed = False
        for eos in eos_texts:
            if eos and tail.startswith(eos):
                tail = tail[len(eos) :].lstrip()
                changed = True
    return tail


def is_valid_format(response_text: str, eos_texts: Sequence[str] = DEFAULT_EOS_TEXTS) -> bool:
    """Our format rule (SPEC 2): the tags think/search/answer/information are balanced and never
    nested; there is exactly one ``<answer>`` and only whitespace or end-of-sequence texts
    follow its ``</answer>``; every ``<search>`` is closed (implied by balance).

    The content of an ``<information>`` block is retrieved text, so tags inside it are not the
    policy's and are skipped until the block's ``</information>``; the environment's
    invalid-action message is skipped too."""
    response_text = _policy_text(response_text)
    open_tag: str | None = None
    n_answers = 0
    answer_end = -1
    for m in _TAG_RE.finditer(response_text):
        closing, tag = m.group(1) == "/", m.group(2)
        if open_tag == "information" and not (closing and tag == "information"):
            continue
        if closing:
            if open_tag != tag:
                return False
            open_tag = None
            if tag == "answer":
                answer_end = m.end()
        else:
            if open_tag is not None:
                return False
            open_tag = tag
            if tag == "answer":
                n_answers += 1
                if n_answers > 1:
                    return False
    if open_tag is not None or n_answers != 1:
        return False
    return _strip_eos(response_text[answer_end:], eos_texts) == ""


def arbor_base_reward(response_text: str, golds: Golds) -> float:
    """ARBOR's outcome reward: answer F1 if the format is valid, else -1."""
    if not is_valid_format(response_text):
        return -1.0
    return f1_score(extract_answer(response_text), golds)


def searchr1_em_reward(response_text: str, golds: Golds, format_score: float = 0.0) -> float:
    """Search-R1's EM reward: 1 if the extracted answer exactly matches a gold alias, else
    ``format_score`` if the format is valid, else 0."""
    if exact_match(extract_answer(response_text), golds):
        return 1.0
    return format_score if is_valid_format(response_text) else 0.0


QAReward = Callable[[str, Golds], float]
QA_REWARDS: Registry[QAReward] = Registry("qa reward")
QA_REWARDS.register("arbor_base", "arbor_f1")(arbor_base_reward)
QA_REWARDS.register("searchr1_em")(searchr1_em_reward)


@QA_REWARDS.register("em")
def answer_em(response_text: str, golds: Golds) -> float:
    """EM of the extracted answer, no format gate (an evaluation metric)."""
    return exact_match(extract_answer(response_text), golds)


@QA_REWARDS.register("subem")
def answer_subem(response_text: str, golds: Golds) -> float:
    """Substring EM of the extracted answer, no format gate."""
    return substring_exact_match(extract_answer(response_text), golds)


@QA_REWARDS.register("f1")
def answer_f1(response_text: str, golds: Golds) -> float:
    """F1 of the extracted answer, no format gate."""
    return f1_score(extract_answer(response_text), golds)
