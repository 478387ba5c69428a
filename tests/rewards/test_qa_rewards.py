"""QA outcome rewards: normalisation, EM / F1, answer extraction, format validity."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.search_r1 import INVALID_ACTION
from rewards.qa import (
    QA_REWARDS,
    arbor_base_reward,
    exact_match,
    extract_answer,
    f1_score,
    is_valid_format,
    normalize_answer,
    searchr1_em_reward,
    substring_exact_match,
)

# ---------------------------------------------------------------- normalize_answer


@pytest.mark.parametrize(
    "raw, norm",
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("  a   Tale of  TWO cities. ", "tale of two cities"),
        ("An apple, the pear & a plum", "apple pear plum"),
        ("“Quoted” — dash…", "quoted dash"),  # Unicode quotes, em dash, ellipsis
        ("¿Qué? ¡Sí!", "qué sí"),  # Spanish inverted marks are Unicode punctuation
        ("Zürich", "zürich"),  # letters with diacritics are kept
        ("Zu\u0308rich", "zürich"),  # decomposed form == composed form (NFC)
        ("日本「東京」。", "日本東京"),  # CJK brackets / full stop
        ("theatre anthem", "theatre anthem"),  # articles only as whole words
        ("$1,000", "1000"),
        ("", ""),
        ("the a an", ""),
    ],
)
def test_normalize_answer(raw, norm):
    assert normalize_answer(raw) == norm


# ---------------------------------------------------------------- EM / subEM / F1


def test_exact_match_aliases_and_types():
    assert exact_match("the Beatles", ["Beatles", "Fab Four"]) == 1.0
    assert exact_match("Fab four!", ["Beatles", "Fab Four"]) == 1.0
    assert exact_match("Rolling Stones", ["Beatles", "Fab Four"]) == 0.0
    assert exact_match("Paris", "paris") == 1.0  # a single gold string
    assert exact_match(None, "paris") == 0.0
    assert exact_match("paris", []) == 0.0  # no gold: nothing to match


def test_substring_exact_match():
    assert substring_exact_match("It is in Paris, France", ["paris"]) == 1.0
    assert substring_exact_match("Parisian", ["paris"]) == 1.0  # character substring, as Search-R1
    assert substring_exact_match("Lyon", ["paris", "lyon"]) == 1.0
    assert substring_exact_match("Lyon", ["paris"]) == 0.0
    assert substring_exact_match("anything", [""]) == 0.0  # empty gold is not a wildcard
    assert substring_exact_match("", [""]) == 1.0


def test_f1_score_values():
    assert f1_score("Barack Obama", ["Barack Obama"]) == 1.0
    # pred {barack, hussein, obama} vs gold {barack, obama}: P = 2/3, R = 1 -> 0.8
    assert f1_score("Barack Hussein Obama", "Barack Obama") == pytest.approx(0.8)
    assert f1_score("Obama", ["Barack Obama", "Obama"]) == 1.0  # max over aliases
    assert f1_score("the cat", "a dog") == 0.0
    # duplicate tokens are counted with multiplicity
    assert f1_score("new new york", "new york") == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))


def test_f1_empty_cases():
    assert f1_score("", ["Paris"]) == 0.0
    assert f1_score("Paris", [""]) == 0.0
    assert f1_score("", [""]) == 1.0
    assert f1_score("the", ["a"]) == 1.0  # both normalise to empty
    assert f1_score(None, ["Paris"]) == 0.0
    assert f1_score("Paris", []) == 0.0
    # an alias that normalises to nothing does not match empty-ish answers when another
    # alias has content
    assert f1_score("?", ["The", "Paris"]) == 0.0
    assert exact_match("the", [".", "Paris"]) == 0.0
    assert arbor_base_reward("<answer> ? </answer>", ["", "Paris"]) == 0.0


# ---------------------------------------------------------------- extraction


def test_extract_answer_last_of_several():
    text = "<answer> first </answer> oops <answer>second</answer>"
    assert extract_answer(text) == "second"


def test_extract_answer_none_and_unclosed():
    assert extract_answer("<think>no answer</think>") is None
    assert extract_answer("<answer> never closed") is None
    assert extract_answer("<answer></answer>") == ""


def test_extract_answer_multiline_and_ignores_information():
    text = (
        "<search>q</search>\n\n<information>Doc 1(Title: X) <answer>planted</answer>"
        "</information>\n\n<answer>\n Real\n Answer \n</answer>"
    )
    assert extract_answer(text) == "Real\n Answer"
    only_info = "<information><answer>planted</answer></information>"
    assert extract_answer(only_info) is None


def test_extract_answer_does_not_need_the_prompt():
    # The prompt's example "<answer> Beijing </answer>" is never passed in; a response whose
    # only answer is real must be extracted (Search-R1's full-sequence heuristic would drop it).
    assert extract_answer("<think>easy</think><answer>Paris</answer>") == "Paris"


def test_the_invalid_action_message_is_not_the_policys():
    """The environment's message spells out <search>/<answer> tags: a trajectory that recovers
    after it keeps a valid format, and its tags are never taken for an answer."""
    recovered = "I guess Paris" + INVALID_ACTION + "<answer> Paris </answer>"
    assert is_valid_format(recovered)
    assert extract_answer(recovered) == "Paris"
    assert arbor_base_reward(recovered, ["Paris"]) == 1.0
    cut_off = "no idea" + INVALID_ACTION  # out of budget right after the message
    assert extract_answer(cut_off) is None and not is_valid_format(cut_off)
    # a tokenizer round trip may change the whitespace around the words
    assert extract_answer(" ".join(INVALID_ACTION.split()) + "<answer>x</answer>") == "x"


# ---------------------------------------------------------------- format validity

VALID = [
    "<think>x</think><answer>Paris</answer>",
    "<answer>Paris</answer>",
    "<think>a</think>\n<search>capital of france</search>\n\n<information>Doc 1(Title: Paris) "
    "Paris is the capital.\n</information>\n\n<think>b</think>\n<answer> Paris </answer>",
    "<think>x</think><answer>Paris</answer>  \n",
    "<think>x</think><answer>Paris</answer><|im_end|>",
    "<think>x</think><answer>Paris</answer>\n<|endoftext|></s>",
    # tags inside retrieved text are not the policy's
    "<search>q</search><information>a <search> b <answer>c</answer></information>"
    "<answer>Paris</answer>",
    "free text outside tags <answer>Paris</answer>",
]

INVALID = [
    "",  # no answer
    "<think>no answer</think>",
    "<answer>a</answer><answer>b</answer>",  # two answers
    "<answer>Paris</answer> and then more text",  # text after </answer>
    "<answer>Paris</answer><think>late</think>",  # a tag after </answer>
    "<think><search>nested</search></think><answer>x</answer>",  # nesting
    "<think>unclosed <answer>x</answer>",
    "<search>unclosed query <answer>x</answer>",
    "<search>q</search> <answer>x",  # unclosed answer
    "</think><answer>x</answer>",  # close without open
    "<think>a</search><answer>x</answer>",  # mismatched close
    "<answer>x</answer></answer>",
    "<answer><answer>x</answer></answer>",
    "<information>never closed <answer>x</answer>",
]


@pytest.mark.parametrize("text", VALID)
def test_valid_format(text):
    assert is_valid_format(text), text


@pytest.mark.parametrize("text", INVALID)
def test_invalid_format(text):
    assert not is_valid_format(text), text


def test_custom_eos_texts():
    text = "<answer>x</answer>[END]"
    assert not is_valid_format(text)
    assert is_valid_format(text, eos_texts=("[END]",))


# ---------------------------------------------------------------- rewards


def test_arbor_base_reward():
    good = "<think>t</think><answer>Barack Hussein Obama</answer>"
    assert arbor_base_reward(good, ["Barack Obama"]) == pytest.approx(0.8)
    assert arbor_base_reward("<answer>x</answer> trailing", ["x"]) == -1.0
    assert arbor_base_reward("<think>t</think>", ["x"]) == -1.0
    assert arbor_base_reward("<answer>wrong</answer>", ["x"]) == 0.0


def test_searchr1_em_reward():
    assert searchr1_em_reward("<answer>The Paris</answer>", ["paris"]) == 1.0
    assert searchr1_em_reward("<answer>Lyon</answer>", ["paris"]) == 0.0
    assert searchr1_em_reward("<answer>Lyon</answer>", ["paris"], format_score=0.2) == 0.2
    # invalid format and wrong answer: 0 even with a format score
    assert searchr1_em_reward("<answer>Lyon</answer> more", ["paris"], format_score=0.2) == 0.0
    # a correct answer scores 1 even when the format is not (Search-R1's EM reward)
    assert searchr1_em_reward("<answer>Paris</answer> more", ["paris"], format_score=0.2) == 1.0


def test_registry():
    assert {"arbor_base", "searchr1_em", "em", "f1", "subem"} <= set(QA_REWARDS.names())
    text = "<answer>Obama</answer>"
    assert QA_REWARDS.get("arbor_base")(text, ["Barack Obama"]) == pytest.approx(2 / 3)
    assert QA_REWARDS.get("em")(text, ["obama"]) == 1.0
    assert QA_REWARDS.get("f1")("no answer", ["obama"]) == 0.0
    with pytest.raises(KeyError, match="unknown qa reward"):
        QA_REWARDS.get("nope")


# ---------------------------------------------------------------- properties


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40), st.text(max_size=40))
def test_metric_properties(a, b):
    assert normalize_answer(normalize_answer(a)) == normalize_answer(a)  # idempotent
    f = f1_score(a, b)
    assert 0.0 <= f <= 1.0
    assert f == pytest.approx(f1_score(b, a))  # symmetric for a single gold
    if exact_match(a, b):
        assert f == 1.0 and substring_exact_match(a, b) == 1.0
    if normalize_answer(a) or not normalize_answer(b):
        assert exact_match(a, [b, a]) == 1.0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["<think>", "</think>", "<search>", "</search>", "<answer>",
                                  "</answer>", "<information>", "</information>", "x", " "]),
                max_size=30))
def test_reward_ranges_on_random_tag_soup(pieces):
    text = "".join(pieces)
    r = arbor_base_reward(text, ["x"])
    assert r == -1.0 or 0.0 <= r <= 1.0
    assert (r == -1.0) == (not is_valid_format(text))
    if is_valid_format(text):
        assert extract_answer(text) is not None
    assert searchr1_em_reward(text, ["x"], format_score=0.1) in (0.0, 0.1, 1.0)


# --- task.reward_metrics: the training rewards under an official script's conventions ------

def _response(answer: str) -> str:
    return f"<think>done</think>\n<answer>{answer}</answer>"


def _outcome(task, answer: str, golds) -> float:
    from types import SimpleNamespace

    prompt = SimpleNamespace(answer=tuple(golds))
    return task.outcome(prompt, SimpleNamespace(text=_response(answer)))


def test_reward_metrics_default_is_ours_and_official_sets_follow_their_scripts():
    from rl.tasks.search.task import SearchQATask

    ours = SearchQATask()
    hotpot = SearchQATask(reward_metrics="hotpotqa")
    squad = SearchQATask(reward_metrics="squad")
    # "yes sir" vs "yes": token F1 2PR/(P+R) with P=1/2, R=1 -> 2/3; HotpotQA's script: 0.
    assert _outcome(ours, "yes sir", ["yes"]) == pytest.approx(2 / 3)
    assert _outcome(hotpot, "yes sir", ["yes"]) == 0.0
    # both sides normalise to nothing ("The" and "a" are articles): ours 1, SQuAD v1.1 0
    assert _outcome(ours, "The", ["a"]) == 1.0
    assert _outcome(squad, "The", ["a"]) == 0.0
    # the right single quote is Unicode punctuation: ours strips it, the scripts keep it
    assert _outcome(ours, "Obama\u2019s", ["Obamas"]) == 1.0
    assert _outcome(squad, "Obama\u2019s", ["Obamas"]) == 0.0


def test_searchr1_em_under_search_r1_metrics_is_em_check():
    from rl.tasks.search.task import SearchQATask

    task = SearchQATask(reward="searchr1_em", reward_metrics="search_r1")
    assert _outcome(task, "the Eiffel Tower!", ["Eiffel tower"]) == 1.0
    assert _outcome(task, "Obama\u2019s", ["Obamas"]) == 0.0  # ASCII punctuation only
    assert _outcome(SearchQATask(reward="searchr1_em"), "Obama\u2019s", ["Obamas"]) == 1.0


def test_reward_metrics_bad_values_name_the_key():
    from rl.tasks.search.task import SearchQATask

    with pytest.raises(ValueError, match="task.reward_metrics: unknown 'sqad'"):
        SearchQATask(reward_metrics="sqad")
    with pytest.raises(ValueError, match="task.reward_metrics=squad has no 'subem'"):
        SearchQATask(reward="subem", reward_metrics="squad")


def test_arbor_gate_f1_follows_reward_metrics():
    from types import SimpleNamespace

    from rl.rewarders.arbor import group_inputs
    from rl.tasks.search.task import SearchQATask

    prompt = SimpleNamespace(id="q", question="?", answer=("yes",))
    traj = SimpleNamespace(text="no tags: yes sir", num_action_tokens=3)
    # no <answer> tag: the extracted answer is None, F1 0 under both conventions
    tagged = SimpleNamespace(text=_response("yes sir"), num_action_tokens=3)
    group = SimpleNamespace(prompt=prompt, trajectories=(traj, tagged))
    (ours,) = group_inputs(SearchQATask(), [group])
    (hotpot,) = group_inputs(SearchQATask(reward_metrics="hotpotqa"), [group])
    assert ours.f1 == pytest.approx((0.0, 2 / 3)) and hotpot.f1 == (0.0, 0.0)
