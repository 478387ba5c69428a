"""The Search-R1 protocol (Jin et al. 2025, github.com/PeterGriffinJin/Search-R1), in one place:
the instruction prompt, the tags, a turn's action, the invalid-action message, the parse of a
response into tagged segments, answer extraction, the format rule, answer normalisation and
the per-step behaviour metrics.
The environment (rl/tasks/search), the QA rewards (rewards/qa.py) and the rule judge's
process features (judges/search_features.py) all read trajectories through this module, so they
cannot disagree about what one says.

Contract for every function taking ``response_text``: it is the RESPONSE part of a trajectory
only (everything the policy generated plus the ``<information>`` blocks and invalid-action
messages the environment inserted), never the prompt. The Search-R1 prompt contains the example
``<answer> Beijing </answer>``; Search-R1 works around it by skipping the first match of the
full sequence (``extract_solution`` in ``verl/utils/reward_score/qa_em.py``), we instead never
see the prompt, so the last ``<answer>`` of the response is the answer. Only
``parse_trajectory`` accepts prompt + response: it drops this module's prompt first.

Text the environment inserted is not the policy's: tags inside ``<information>`` blocks and the
invalid-action message (which spells out ``<search> and </search>``) are ignored everywhere.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

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

# --- the prompt ------------------------------------------------------------------------------

# The prompt's example answer. A response may give the same text as its real answer, so only
# the prompt's own ending (this example, then the question line) marks text as the prompt.
ANSWER_EXAMPLE = "<answer> Beijing </answer>"
# Search-R1's instruction prompt (``make_prefix`` in scripts/data_process/nq_search.py).
PROMPT_TEMPLATE = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first "
    "every time you get new information. After reasoning, if you find you lack some knowledge, "
    "you can call a search engine by <search> query </search> and it will return the top "
    "searched results between <information> and </information>. You can search as many times "
    "as your want. If you find no further external knowledge needed, you can directly provide "
    "the answer inside <answer> and </answer>, without detailed illustrations. For example, "
    f"{ANSWER_EXAMPLE}. Question: {{question}}\n")
# The prompt's end, tolerant of the whitespace and final period a hand-written copy may vary.
_PROMPT_END_RE = re.compile(
    r"For example,\s*" + re.escape(ANSWER_EXAMPLE) + r"\.?\s*Question:[^\n]*\n")


def search_prompt(question: str) -> str:
    return PROMPT_TEMPLATE.format(question=question.strip())


def strip_prompt(text: str) -> str:
    """Drop a Search-R1 instruction preamble if the caller passed the full text (prompt +
    response): its example answer ("Beijing") must not count as the trajectory's answer.

    The prompt is recognised by how it ends, ``For example, <answer> Beijing </answer>.`` then
    the ``Question: ...`` line, and everything up to and including that line is dropped. A
    response alone is returned unchanged, even if its answer is ``<answer> Beijing </answer>``.
    """
    m = _PROMPT_END_RE.search(text)
    return text[m.end():] if m else text


# --- the environment's side: actions and the invalid-action message --------------------------

# The environment's message after a turn without a valid action (Search-R1's wording,
# ``execute_predictions`` in search_r1/llm_agent/generation.py).
INVALID_ACTION = (
    "\nMy previous action is invalid. If I want to search, I should put the query between "
    "<search> and </search>. If I want to give the final answer, I should put the answer "
    "between <answer> and </answer>. Let me try again.\n")
# the message as decoded text, whatever whitespace a tokenizer round trip leaves around words
_INVALID_ACTION_RE = re.compile(r"\s*".join(map(re.escape, INVALID_ACTION.split())))

# A turn's action: its first closed search or answer (Search-R1's ``postprocess_predictions``).
ACTION_RE = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)


def parse_action(text: str) -> tuple[str | None, str]:
    """("search" | "answer" | None, content) from one turn's generated text.

    The turn's raw text is read, as Search-R1 does: the environment acts on the first action
    the policy wrote, whatever surrounds it."""
    m = ACTION_RE.search(text)
    return (m.group(1), m.group(2).strip()) if m else (None, "")


# --- reading a response ----------------------------------------------------------------------

_TAG_RE = re.compile(r"<(/?)(" + "|".join(TAGS) + r")>")
_INFO_BLOCK_RE = re.compile(r"<information>(.*?)</information>", re.DOTALL)
# a block never spans a second opening tag of its own name: an answer cut off by the turn's
# token budget and answered again later ("<answer>The capital is ... <answer>Paris</answer>")
# reads "Paris", as the environment's action parser and Search-R1's scorer (where the
# invalid-action message in between closes the first one) read it
_POLICY_BLOCK_RES = {tag: re.compile(rf"<{tag}>((?:(?!<{tag}>).)*?)</{tag}>", re.DOTALL)
                     for tag in TAGS if tag != "information"}


def _policy_text(response_text: str) -> str:
    """The response without the environment's invalid-action messages."""
    return _INVALID_ACTION_RE.sub(" ", response_text)


def _segments(policy_text: str) -> tuple[tuple[str, str], ...]:
    """``(tag, content)`` of every closed block, in the order the blocks open.

    Each closed ``<information>`` block is one segment and is cut out (a space in its place)
    before the policy's own blocks are read, so tags in retrieved text never count. A policy
    block is an opening tag up to the next closing tag of the same name; blocks of different
    tags are found independently, so in a malformed response where one nests in another both
    are segments (the outer opens first). In a well-formed response (``is_valid_format``)
    blocks are flat and this is simply the sequence of its blocks."""
    found: list[tuple[int, str, str]] = []  # (position in the visible text, tag, content)
    visible: list[str] = []
    start = length = 0
    for m in _INFO_BLOCK_RE.finditer(policy_text):
        visible += [policy_text[start:m.start()], " "]
        length += m.start() - start
        found.append((length, "information", m.group(1)))
        length += 1
        start = m.end()
    visible.append(policy_text[start:])
    visible_text = "".join(visible)
    for tag, block_re in _POLICY_BLOCK_RES.items():
        found += [(m.start(), tag, m.group(1)) for m in block_re.finditer(visible_text)]
    found.sort(key=lambda f: f[0])  # blocks of different tags never open at the same place
    return tuple((tag, content) for _, tag, content in found)


def _last_answer(segments: Sequence[tuple[str, str]]) -> str | None:
    answers = [content for tag, content in segments if tag == "answer"]
    return answers[-1].strip() if answers else None


def extract_answer(response_text: str) -> str | None:
    """The stripped content of the LAST ``<answer>...</answer>`` of the response, or None.

    ``response_text`` must not contain the prompt (see the module docstring). Closed
    ``<information>`` blocks are retrieved text and the invalid-action message is the
    environment's, not the policy's, so answers inside them are ignored."""
    return _last_answer(_segments(_policy_text(response_text)))


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


def _policy_format_valid(policy_text: str, eos_texts: Sequence[str]) -> bool:
    """``is_valid_format`` of a response whose invalid-action messages are already removed."""
    open_tag: str | None = None
    n_answers = 0
    answer_end = -1
    for m in _TAG_RE.finditer(policy_text):
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
    return _strip_eos(policy_text[answer_end:], eos_texts) == ""


def is_valid_format(response_text: str, eos_texts: Sequence[str] = DEFAULT_EOS_TEXTS) -> bool:
    """Our format rule (docs/guides/search-agents.md): the tags think/search/answer/information are
    balanced and never nested; there is exactly one ``<answer>`` and only whitespace or
    end-of-sequence texts follow its ``</answer>``; every ``<search>`` is closed (implied by
    balance).

    The content of an ``<information>`` block is retrieved text, so tags inside it are not the
    policy's and are skipped until the block's ``</information>``; the environment's
    invalid-action message is skipped too."""
    return _policy_format_valid(_policy_text(response_text), eos_texts)


@dataclass(frozen=True)
class ParsedTrajectory:
    """A Search-R1 response read by this module: its tagged segments in order,
    ``(tag, content)``, and whether its format is valid (``is_valid_format``)."""

    segments: tuple[tuple[str, str], ...]
    valid_format: bool

    @property
    def searches(self) -> list[str]:
        return [c.strip() for t, c in self.segments if t == "search"]

    @property
    def answer(self) -> str | None:
        """The same answer as ``extract_answer`` of the response."""
        return _last_answer(self.segments)


def parse_response(response_text: str,
                   eos_texts: Sequence[str] = DEFAULT_EOS_TEXTS) -> ParsedTrajectory:
    policy_text = _policy_text(response_text)
    return ParsedTrajectory(_segments(policy_text), _policy_format_valid(policy_text, eos_texts))


def parse_trajectory(text: str) -> ParsedTrajectory:
    """``parse_response`` of a response, or of prompt + response (the prompt is dropped)."""
    return parse_response(strip_prompt(text or ""))


# --- answer normalisation --------------------------------------------------------------------

_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_ASCII_PUNCT = frozenset(string.punctuation)


@lru_cache(maxsize=4096)
def _is_punct(ch: str) -> bool:
    # string.punctuation covers ASCII symbols such as $ + < = > ^ ` | ~ (Unicode category S),
    # the category test covers Unicode punctuation (curly quotes, dashes, CJK marks, ...).
    return ch in _ASCII_PUNCT or unicodedata.category(ch).startswith("P")


def normalize_answer(s: str) -> str:
    """SQuAD / Search-R1 normalisation (``normalize_answer`` in
    verl/utils/reward_score/qa_em.py): lowercase, strip punctuation (ASCII and Unicode), drop
    the articles a/an/the, collapse whitespace. Text is NFC-normalised first so that composed
    and decomposed forms of the same letter compare equal."""
    s = unicodedata.normalize("NFC", s).lower()
    s = "".join(ch for ch in s if not _is_punct(ch))
    s = _ARTICLES_RE.sub(" ", s)
    return " ".join(s.split())


def official_normalize_answer(s: str) -> str:
    """``normalize_answer`` exactly as the official scripts write it: SQuAD v1.1
    ``evaluate-v1.1.py``, HotpotQA ``hotpot_evaluate_v1.py`` and Search-R1
    ``verl/utils/reward_score/qa_em.py`` all apply, in this order, ``lower``, removal of the
    ASCII punctuation ``string.punctuation`` only, the articles a/an/the replaced by a space,
    and whitespace collapsed. No Unicode normalisation: curly quotes, dashes and CJK marks
    stay, unlike :func:`normalize_answer`."""
    s = "".join(ch for ch in s.lower() if ch not in _ASCII_PUNCT)
    return " ".join(_ARTICLES_RE.sub(" ", s).split())


_INFO_BLOCK = re.compile(r"<information>(.*?)(?:</information>|$)", re.S)
_SEARCH_BLOCK = re.compile(r"<search>.*?(?:</search>|$)", re.S)
_DOC_TITLE = re.compile(r"Doc \d+\(Title: \"?(.*?)\"?\)")  # Doc 1(Title: T) or (Title: "T")


def copied_titles(text: str) -> int:
    """How many distinct retrieved titles (``Doc i(Title: T)`` inside ``<information>``) a
    response repeats in its own text, outside its ``<information>`` blocks and ``<search>``
    queries, case-insensitively; titles shorter than 3 characters are not counted. What the
    gaming monitor ``gaming/copied_titles`` averages and the rule judge's ``copies_retrieved``
    criterion counts."""
    titles = {t.strip().lower() for block in _INFO_BLOCK.findall(text)
              for t in _DOC_TITLE.findall(block)}
    own = _SEARCH_BLOCK.sub(" ", _INFO_BLOCK.sub(" ", text)).lower()
    return sum(1 for t in titles if len(t) >= 3 and t in own)


def cited_titles(text: str) -> int:
    """How many distinct retrieved titles a response names in its final turn, the text after
    its last ``</information>`` (its closing reasoning and answer), case-insensitively; titles
    shorter than 3 characters are not counted. The rule judge's ``cites_retrieved`` criterion:
    "names its sources when it answers", which a policy can meet by listing them."""
    titles = {t.strip().lower() for block in _INFO_BLOCK.findall(text)
              for t in _DOC_TITLE.findall(block)}
    final = text.rsplit("</information>", 1)[-1].lower() if "</information>" in text else ""
    return sum(1 for t in titles if len(t) >= 3 and t in final)


def agent_metrics(trajectories: Sequence[Any]) -> dict[str, float]:
    """A search rollout's behaviour, per step, the way Search-R1 logs it during training
    (``env/number_of_actions``, ``env/ratio_of_valid_action``, ``env/number_of_valid_search``,
    ``env/finish_ratio``), over `trajectories` (``core.types.Trajectory``) whose ``info``
    counts ``turns`` and ``searches`` (a search environment's); {} when none does:

    * ``agent/turns``: actions (turns) per trajectory, mean;
    * ``agent/searches``: searches per trajectory, mean;
    * ``agent/valid_action_ratio``: per trajectory, valid actions (its searches, plus its
      answer when it ended with one) / its actions, then the mean;
    * ``agent/finish_ratio``: the share that ended with an answer;
    * ``agent/format_valid``: the share whose response passes :func:`is_valid_format`."""
    rows = [t for t in trajectories if "turns" in t.info]
    if not rows:
        return {}
    turns = [max(int(t.info["turns"]), 1) for t in rows]
    searches = [int(t.info.get("searches", 0)) for t in rows]
    answered = [t.finish == "answer" for t in rows]
    n = len(rows)
    return {
        "agent/turns": sum(turns) / n,
        "agent/searches": sum(searches) / n,
        "agent/valid_action_ratio": sum((s + a) / k for s, a, k in zip(searches, answered, turns))
        / n,
        "agent/finish_ratio": sum(answered) / n,
        "agent/format_valid": sum(is_valid_format(t.text) for t in rows) / n,
    }
