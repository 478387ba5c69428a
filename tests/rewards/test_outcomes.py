"""Outcome rewards of prompt datasets: the option letter a response chose, math answers by
equivalence, QA against Search-R1's ground truth, and the reward a data source names; every
expected value written here by hand."""

import threading

import pytest

from rewards.choice import choice_accuracy, extract_choice, gold_letter, render_options
from rewards.math_answers import math_equivalent
from rewards.outcomes import OUTCOME_REWARDS, qa_golds, reward_for

CHOICES = [
    ("C", "C"), ("(B)", "B"), ("B.", "B"), ("A)", "A"), ("**D**", "D"),
    ("The answer is (D).", "D"), ("Answer: A", "A"), ("**Answer:** C", "C"),
    ("Reasoning first.\n\nFinal answer: D", "D"),
    ("I think the correct option is B because it blocks the channel.", "B"),
    ("Let me think.\nThe final answer is \\boxed{C}", "C"), ("\\boxed{\\text{E}}", "E"),
    ("\\boxed{(A)}", "A"),
    ("The answer is A, not B. Actually the answer is B.", "B"),  # the last answer phrase
    ("The answer is C. Option A is wrong.", "C"),  # an answer phrase before an option one
    ("B. Because the kidney clears it.", "B"),
    ("Thinking...\n(D)", "D"),  # the last line alone
    ("ACE inhibitors cause a dry cough.", None),  # A of a word is no answer
    ("Answer: Aspirin", None), ("I am not sure", None), ("", None),
    ("answer: (c)", None),  # a lowercase letter is no option
]


@pytest.mark.parametrize(("text", "letter"), CHOICES)
def test_the_letter_a_response_chose(text, letter):
    assert extract_choice(text) == letter


def test_choice_accuracy_gold_forms_and_options():
    assert choice_accuracy("The answer is (C).", "C") == 1.0
    assert choice_accuracy("The answer is (C).", "(c)") == 1.0
    assert choice_accuracy("The answer is (C).", 2) == 1.0  # a 0-based index
    assert choice_accuracy("The answer is (C).", "B") == 0.0
    assert choice_accuracy("E", "E", letters="ABCD") == 0.0  # E is no option of four
    with pytest.raises(ValueError, match="not an option letter"):
        gold_letter("Aspirin")
    assert render_options("Which drug?", {"A": "aspirin", "B": "heparin"}) == \
        "Which drug?\n\nA. aspirin\nB. heparin"
    assert render_options("Which drug?", ["aspirin", "heparin"]) == \
        "Which drug?\n\nA. aspirin\nB. heparin"


def test_math_answers_by_equivalence():
    assert math_equivalent("so the answer is \\boxed{0.5}", "\\frac{1}{2}") == 1.0
    assert math_equivalent("Half of it: \\boxed{\\frac{1}{2}}", "0.5") == 1.0
    # a GSM8K gold is read after its ####
    assert math_equivalent("She sold 48 + 24 = \\boxed{72} clips.",
                           "Natalia sold 48/2 = 24 clips in May. #### 72") == 1.0
    assert math_equivalent("The answer is \\boxed{73}", "72") == 0.0
    assert math_equivalent("", "72") == 0.0
    # in a worker thread (no signal alarm there) the check still runs
    out = []
    worker = threading.Thread(target=lambda: out.append(math_equivalent("\\boxed{3}", "3")))
    worker.start()
    worker.join()
    assert out == [1.0]


def test_qa_rewards_read_search_r1_ground_truth():
    assert qa_golds({"target": ["Paris", "paris, france"]}) == ["Paris", "paris, france"]
    assert qa_golds("Paris") == ["Paris"] and qa_golds(["a", "b"]) == ["a", "b"]
    em, f1 = OUTCOME_REWARDS.get("qa_em"), OUTCOME_REWARDS.get("qa_f1")
    assert em("<answer> The Paris </answer>", {"target": ["paris"]}) == 1.0  # normalised
    assert em("Paris", {"target": ["paris"]}) == 0.0  # no <answer>: no answer
    # tokens "paris" "france" against "paris": precision 1/2, recall 1, F1 2/3
    assert f1("<answer>Paris France</answer>", ["Paris"]) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="not a QA ground truth"):
        qa_golds(3)


def test_the_reward_a_data_source_names():
    assert reward_for("openai/gsm8k") == "math" and reward_for("nq") == "qa_em"
    assert reward_for("HotpotQA") == "qa_em" and reward_for("medqa") == "choice"
    assert reward_for("my_private_set") is None
