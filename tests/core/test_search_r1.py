"""The Search-R1 protocol module: the environment, the QA rewards and the rule judge read a
trajectory through one parser, so they agree on its answer, searches and format."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.search_r1 import (
    INVALID_ACTION,
    agent_metrics,
    extract_answer,
    is_valid_format,
    parse_response,
    parse_trajectory,
    search_prompt,
    strip_prompt,
)
from core.types import Trajectory
from judges.search_features import feature_predicate

PIECES = ["<think>", "</think>", "<search>", "</search>", "<answer>", "</answer>",
          "<information>", "</information>", "x", " ", "\n", "<|im_end|>", INVALID_ACTION,
          " ".join(INVALID_ACTION.split())]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=16))
def test_one_reading_of_answer_and_format(pieces):
    text = "".join(pieces)
    parsed = parse_response(text)
    assert parsed.answer == extract_answer(text)
    assert parsed.valid_format == is_valid_format(text)
    assert parse_trajectory(search_prompt("Who?") + text).segments == parsed.segments


def test_invalid_action_message_is_not_the_policys():
    # the message spells out "<search> and </search>" and "<answer> and </answer>"
    text = ("I am not sure" + INVALID_ACTION + "<search> capital of France </search>"
            "<information>Doc 1(Title: Paris) Paris is the capital.</information>"
            "<answer> Paris </answer>")
    parsed = parse_trajectory(text)
    assert parsed.searches == ["capital of France"] and parsed.answer == "Paris"
    assert parsed.valid_format
    assert feature_predicate("max_searches:1")("Where?", text)
    stuck = "no idea" + INVALID_ACTION
    assert parse_trajectory(stuck).answer is None and not parse_trajectory(stuck).valid_format


def test_the_prompt_is_recognised_by_its_own_ending():
    prompt = search_prompt("What is the capital of China?")
    assert prompt.endswith("<answer> Beijing </answer>. Question: What is the capital of China?\n")
    assert strip_prompt(prompt + "<answer> Beijing </answer>") == "<answer> Beijing </answer>"
    assert strip_prompt("<answer> Beijing </answer>") == "<answer> Beijing </answer>"


def test_an_unclosed_answer_does_not_swallow_the_final_one():
    """An answer turn cut off by its token budget, the environment's invalid-action message,
    then the real answer: the answer is "Paris" (EM 1), not the unclosed text glued to it."""
    from core.search_r1 import INVALID_ACTION
    from rewards.qa import exact_match, f1_score

    text = ("<think>x</think><answer>The capital is" + "\n" + INVALID_ACTION + "\n"
            + "<answer>Paris</answer>")
    assert extract_answer(text) == "Paris"
    assert exact_match(extract_answer(text), ["Paris"]) == 1.0
    assert f1_score(extract_answer(text), ["Paris"]) == 1.0
    # without the message in between too (a policy that re-opened the tag itself)
    assert extract_answer("<answer>The capital is <answer> Paris </answer>") == "Paris"


def test_agent_metrics_by_hand():
    """Three trajectories: 3 turns (2 searches, then an answer: 3 valid of 3); 2 turns (one
    invalid action, then an answer: 1 of 2); 1 turn that ran out of budget (0 of 1)."""

    def traj(text, finish, turns, searches):
        return Trajectory((1,), (), (), (), text, finish, {"turns": turns, "searches": searches})

    good = "<search> a </search><information> d </information><answer> x </answer>"
    rows = [traj(good, "answer", 3, 2), traj("<answer> y </answer>", "answer", 2, 0),
            traj("<think> still", "length", 1, 0)]
    m = agent_metrics(rows)
    assert m["agent/turns"] == pytest.approx(6 / 3)
    assert m["agent/searches"] == pytest.approx(2 / 3)
    assert m["agent/valid_action_ratio"] == pytest.approx((3 / 3 + 1 / 2 + 0 / 1) / 3)
    assert m["agent/finish_ratio"] == pytest.approx(2 / 3)
    assert m["agent/format_valid"] == pytest.approx(2 / 3)
    assert agent_metrics([Trajectory((1,), (), (), (), "7", "eos")]) == {}  # not a search task
