"""Outcome rewards of a prompt dataset: ``reward(response_text, ground_truth) -> float``, by
name (``OUTCOME_REWARDS``) or chosen by a row's ``data_source`` as verl's
``default_compute_score`` chooses (``DATA_SOURCE_REWARDS``).

* ``qa_em``: Search-R1's exact match of the last ``<answer>...</answer>`` against the gold
  aliases (``rewards.qa``; ``ground_truth`` a string, a list, or ``{"target": [...]}`` as
  Search-R1's parquet stores it); ``qa_subem`` and ``qa_f1`` the substring match and the F1;
* ``choice``: the option letter the response chose is the gold letter (``rewards.choice``);
* ``math``: the final answer equals the gold one (``rewards.math_answers``, math-verify).

Your own: ``OUTCOME_REWARDS.register("mine")(fn)`` in a module the config's ``imports`` names,
then ``task.reward=mine``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from core.registry import Registry
from core.search_r1 import extract_answer, normalize_answer
from rewards.choice import choice_accuracy, extract_choice
from rewards.math_answers import math_answer, math_equivalent
from rewards.qa import answer_f1, answer_subem, searchr1_em_reward

OutcomeReward = Callable[[str, Any], float]
OUTCOME_REWARDS: Registry[OutcomeReward] = Registry("outcome reward")


def qa_golds(ground_truth: Any) -> list[str]:
    """Gold answer aliases of a QA row: ``{"target": [...]}``, a list, or one string."""
    if isinstance(ground_truth, Mapping):
        ground_truth = ground_truth.get("target", ground_truth.get("answer"))
    if isinstance(ground_truth, str):
        return [ground_truth]
    if isinstance(ground_truth, Sequence):
        return [str(g) for g in ground_truth]
    raise ValueError(f"not a QA ground truth (a string, a list or {{'target': [...]}}): "
                     f"{ground_truth!r}")


@OUTCOME_REWARDS.register("qa_em")
def qa_em(response_text: str, ground_truth: Any) -> float:
    """Search-R1's EM reward: 1 when the last answer matches a gold alias, else 0."""
    return searchr1_em_reward(response_text, qa_golds(ground_truth))


@OUTCOME_REWARDS.register("qa_subem")
def qa_subem(response_text: str, ground_truth: Any) -> float:
    """1 when a gold alias occurs in the last answer (normalised), else 0."""
    return answer_subem(response_text, qa_golds(ground_truth))


@OUTCOME_REWARDS.register("qa_f1")
def qa_f1(response_text: str, ground_truth: Any) -> float:
    """The best token F1 of the last answer against the gold aliases."""
    return answer_f1(response_text, qa_golds(ground_truth))


OUTCOME_REWARDS.register("choice")(choice_accuracy)
OUTCOME_REWARDS.register("math")(math_equivalent)

#: ``data_source`` -> reward name: verl's and Search-R1's data sources, and the
#: multiple-choice benchmarks the ProRubric paper evaluates on.
DATA_SOURCE_REWARDS: Mapping[str, str] = {
    **dict.fromkeys(("openai/gsm8k", "lighteval/math", "digitallearninggmbh/math-lighteval",
                     "huggingfaceh4/math-500", "math_dapo", "math", "gsm8k"), "math"),
    **dict.fromkeys(("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique",
                     "bamboogle"), "qa_em"),
    **dict.fromkeys(("medqa", "gpqa", "gpqa_diamond", "mmlu", "mmlu_pro", "medmcqa"),
                    "choice"),
}


def reward_for(data_source: str) -> str | None:
    """The reward name of a ``data_source`` (case-insensitive), or None."""
    return DATA_SOURCE_REWARDS.get(str(data_source).strip().lower())


def final_answer(reward: str, response_text: str) -> str | None:
    """The final answer of a response as reward `reward` reads it, in a form two equal
    answers share (for majority voting): the option letter (``choice``), the math answer's
    canonical expression (``math``: the first parse of math-verify), the normalised last
    ``<answer>`` (``qa_*``); None where there is none or the reward reads no answer."""
    if reward == "choice":
        return extract_choice(response_text)
    if reward == "math":
        return math_answer(response_text)
    if reward.startswith("qa_"):
        found = extract_answer(response_text)
        return None if found is None else normalize_answer(found)
    return None
