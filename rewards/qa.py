"""Outcome rewards for QA search agents: EM / F1 and the ARBOR / Search-R1 outcome rewards
(Search-R1's and ARBOR's outcome rewards; docs/guides/search-agents.md), built on the Search-R1
protocol of ``core.search_r1`` (answer extraction, format validity, answer normalisation).

Every function taking ``response_text`` follows that module's contract: the text is the
RESPONSE part of a trajectory only, never the prompt, so the last ``<answer>`` of the response
is the answer, and text the environment inserted (``<information>`` blocks, the invalid-action
message) is not the policy's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from core.registry import Registry
from core.search_r1 import extract_answer, is_valid_format, normalize_answer

Golds = str | Sequence[str]
Normalizer = Callable[[str], str]


def _as_golds(golds: Golds) -> list[str]:
    if isinstance(golds, str):
        return [golds]
    return [str(g) for g in golds]


def _normalized_golds(golds: Golds, normalize: Normalizer = normalize_answer) -> list[str]:
    """Normalised gold aliases, without those that normalise to nothing ("The", ".") when
    another alias has content: such an alias would match any empty-ish prediction ("?")."""
    forms = [normalize(g) for g in _as_golds(golds)]
    return [f for f in forms if f] or forms


def exact_match(pred: str | None, golds: Golds,
                normalize: Normalizer = normalize_answer) -> float:
    """1.0 if the normalised prediction equals a normalised gold alias, else 0.0."""
    if pred is None:
        return 0.0
    p = normalize(pred)
    return float(any(p == g for g in _normalized_golds(golds, normalize)))


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


def f1_score(pred: str | None, golds: Golds, normalize: Normalizer = normalize_answer) -> float:
    """Token-level F1 after ``normalize_answer``, max over gold aliases. An empty prediction or
    gold scores 0 unless both are empty (then 1; SQuAD v1.1 and HotpotQA give 0, see
    ``rewards.qa_metrics``)."""
    if pred is None:
        return 0.0
    p = normalize(pred).split()
    return max((_f1_single(p, g.split()) for g in _normalized_golds(golds, normalize)),
               default=0.0)


#: ``score(prediction, golds) -> {metric: value}``: how a reward matches an answer. The default
#: is :func:`reward_score`; ``rewards.qa_metrics.METRIC_SETS[name].score`` gives an official
#: script's conventions instead (``task.reward_metrics``).
AnswerScore = Callable[[str | None, Golds], Mapping[str, float]]


def reward_score(pred: str | None, golds: Golds) -> dict[str, float]:
    """This library's EM / F1 / substring EM: the Unicode-aware ``normalize_answer``, F1 1 for
    an empty prediction against an empty gold, gold aliases that normalise to nothing dropped
    when another has content."""
    return {"em": exact_match(pred, golds), "f1": f1_score(pred, golds),
            "subem": substring_exact_match(pred, golds)}


def arbor_base_reward(response_text: str, golds: Golds,
                      score: AnswerScore = reward_score) -> float:
    """ARBOR's outcome reward: answer F1 if the format is valid, else -1."""
    if not is_valid_format(response_text):
        return -1.0
    return score(extract_answer(response_text), golds)["f1"]


def searchr1_em_reward(response_text: str, golds: Golds, format_score: float = 0.0,
                       score: AnswerScore = reward_score) -> float:
    """Search-R1's EM reward (``qa_em.compute_score_em``): 1 if the extracted answer exactly
    matches a gold alias, else ``format_score`` if the format is valid, else 0."""
    if score(extract_answer(response_text), golds)["em"]:
        return 1.0
    return format_score if is_valid_format(response_text) else 0.0


QAReward = Callable[..., float]  # (response_text, golds, *, score=AnswerScore) -> float
QA_REWARDS: Registry[QAReward] = Registry("qa reward")
QA_REWARDS.register("arbor_base", "arbor_f1")(arbor_base_reward)
QA_REWARDS.register("searchr1_em")(searchr1_em_reward)


@QA_REWARDS.register("em")
def answer_em(response_text: str, golds: Golds, score: AnswerScore = reward_score) -> float:
    """EM of the extracted answer, no format gate (an evaluation metric)."""
    return score(extract_answer(response_text), golds)["em"]


@QA_REWARDS.register("subem")
def answer_subem(response_text: str, golds: Golds, score: AnswerScore = reward_score) -> float:
    """Substring EM of the extracted answer, no format gate."""
    return score(extract_answer(response_text), golds)["subem"]


@QA_REWARDS.register("f1")
def answer_f1(response_text: str, golds: Golds, score: AnswerScore = reward_score) -> float:
    """F1 of the extracted answer, no format gate."""
    return score(extract_answer(response_text), golds)["f1"]


#: The metric each reward reads from ``score`` (checked against a metric set up front).
REWARD_METRIC: Mapping[QAReward, str] = {
    arbor_base_reward: "f1", searchr1_em_reward: "em", answer_em: "em",
    answer_subem: "subem", answer_f1: "f1",
}
