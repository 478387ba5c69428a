"""Per-dataset QA metrics against the official scripts, written out here as independent
references (SQuAD v1.1 evaluate-v1.1.py, HotpotQA hotpot_evaluate_v1.py, Search-R1
verl/utils/reward_score/qa_em.py), and against cases worked by hand."""

import re
import string
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.search_r1 import official_normalize_answer
from rewards.qa_metrics import METRIC_SETS, NORMALIZERS, auto_metric_set, metric_set_for

# ------------------------------------------------- the official scripts, as they are written


def ref_normalize(s):
    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    return white_space_fix(remove_articles(remove_punc(s.lower())))


def ref_squad_f1(prediction, ground_truth):
    prediction_tokens = ref_normalize(prediction).split()
    ground_truth_tokens = ref_normalize(ground_truth).split()
    common = Counter(prediction_tokens) & Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(ground_truth_tokens)
    return (2 * precision * recall) / (precision + recall)


def ref_hotpot_f1(prediction, ground_truth):
    normalized_prediction = ref_normalize(prediction)
    normalized_ground_truth = ref_normalize(ground_truth)
    if normalized_prediction in ["yes", "no", "noanswer"] and \
            normalized_prediction != normalized_ground_truth:
        return 0
    if normalized_ground_truth in ["yes", "no", "noanswer"] and \
            normalized_prediction != normalized_ground_truth:
        return 0
    return ref_squad_f1(prediction, ground_truth)


def ref_exact_match(prediction, ground_truth):
    return ref_normalize(prediction) == ref_normalize(ground_truth)


def ref_max_over_ground_truths(metric_fn, prediction, ground_truths):
    return max(metric_fn(prediction, gt) for gt in ground_truths)


def ref_em_check(prediction, golden_answers):  # Search-R1
    normalized_prediction = ref_normalize(prediction)
    score = 0
    for golden_answer in golden_answers:
        if ref_normalize(golden_answer) == normalized_prediction:
            score = 1
            break
    return score


def ref_subem_check(prediction, golden_answers):  # Search-R1
    normalized_prediction = ref_normalize(prediction)
    score = 0
    for golden_answer in golden_answers:
        if ref_normalize(golden_answer) in normalized_prediction:
            score = 1
            break
    return score


def score(name, pred, golds, normalize=None):
    return METRIC_SETS.get(name).score(pred, golds, normalize)


# ------------------------------------------------------------------ cases worked by hand


def test_hotpotqa_yes_no_rule():
    # token F1 of "yes sir" vs "yes": P = 1/2, R = 1 -> 2/3; the official script gives 0
    assert score("reward", "yes sir", ["yes"])["f1"] == pytest.approx(2 / 3)
    assert score("squad", "yes sir", ["yes"])["f1"] == pytest.approx(2 / 3)
    assert score("hotpotqa", "yes sir", ["yes"]) == {"em": 0.0, "f1": 0.0}
    assert score("hotpotqa", "Yes.", ["yes"]) == {"em": 1.0, "f1": 1.0}
    assert score("hotpotqa", "no", ["Paris, no doubt"])["f1"] == 0.0  # prediction side
    assert score("hotpotqa", "no answer", ["noanswer"])["f1"] == 0.0  # "no answer" != "noanswer"
    # not yes/no: plain token F1, max over golds: "city of lyon" vs "lyon city" = 2*(2/3)/(5/3)
    assert score("hotpotqa", "the city of Lyon", ["Lyon", "Lyon city"])["f1"] == \
        pytest.approx(0.8)


def test_squad_empty_strings():
    # evaluate-v1.1.py: no common token -> F1 0, even for empty vs empty; EM compares "" == ""
    assert score("squad", "", [""]) == {"em": 1.0, "f1": 0.0}
    assert score("squad", "The.", ["a"]) == {"em": 1.0, "f1": 0.0}
    assert score("hotpotqa", "", [""]) == {"em": 1.0, "f1": 0.0}
    assert score("reward", "", [""]) == {"em": 1.0, "f1": 1.0}  # ours: both empty is a match
    assert score("squad", "Paris", []) == {"em": 0.0, "f1": 0.0}  # no gold: nothing to match
    for name in METRIC_SETS:  # no answer extracted: 0 everywhere
        assert set(score(name, None, ["Paris"]).values()) == {0.0}


def test_search_r1_em_and_subem_over_golds():
    assert score("search_r1", "Fab four!", ["Beatles", "Fab Four"])["em"] == 1.0
    assert score("search_r1", "It is Paris, France", ["paris"]) == \
        {"em": 0.0, "subem": 1.0, "f1": pytest.approx(2 * (1 / 4) / (5 / 4))}  # P 1/4, R 1
    # an alias that normalises to "" equals an empty prediction and is a substring of any:
    # the scripts count both; the reward set drops such an alias when another has content
    assert score("search_r1", "?", ["The", "Paris"])["em"] == 1.0
    assert score("search_r1", "Lyon", ["The", "Paris"])["subem"] == 1.0
    assert score("reward", "?", ["The", "Paris"])["em"] == 0.0


def test_ascii_normalisation_as_the_official_scripts():
    assert official_normalize_answer("“Quoted” — dash…") == "“quoted” — dash…"
    assert official_normalize_answer("The Eiffel Tower!") == "eiffel tower"
    assert official_normalize_answer("$1,000") == "1000"
    assert official_normalize_answer("Zu\u0308rich") != official_normalize_answer("Zürich")
    # curly quotes stay with the official normaliser: EM 0 there, 1 with ours
    assert score("squad", "“Paris”", ["Paris"])["em"] == 0.0
    assert score("squad", "“Paris”", ["Paris"], normalize="unicode")["em"] == 1.0
    assert score("reward", "“Paris”", ["Paris"])["em"] == 1.0
    assert score("reward", "“Paris”", ["Paris"], normalize="official")["em"] == 0.0
    assert NORMALIZERS.names() == ["official", "unicode"]


# --------------------------------------------------------- agreement with the references

_words = st.sampled_from(["yes", "no", "noanswer", "the", "a", "an", "Paris", "paris,", "of",
                          "city", "“x”", "—", "", "!", "Zürich", "an-apple", "theatre"])
_answer = st.lists(_words, max_size=5).map(" ".join)


@settings(max_examples=300, deadline=None)
@given(_answer, st.lists(_answer, min_size=1, max_size=3))
def test_official_sets_equal_the_scripts(pred, golds):
    assert official_normalize_answer(pred) == ref_normalize(pred)
    squad, hotpot, sr1 = (score(n, pred, golds) for n in ("squad", "hotpotqa", "search_r1"))
    assert squad["em"] == ref_max_over_ground_truths(ref_exact_match, pred, golds)
    assert squad["f1"] == pytest.approx(ref_max_over_ground_truths(ref_squad_f1, pred, golds))
    assert hotpot["em"] == squad["em"]
    assert hotpot["f1"] == pytest.approx(ref_max_over_ground_truths(ref_hotpot_f1, pred, golds))
    assert sr1["em"] == ref_em_check(pred, golds) == squad["em"]
    assert sr1["subem"] == ref_subem_check(pred, golds)
    assert sr1["f1"] == squad["f1"]


# ----------------------------------------------------------------- choosing a set by name


@pytest.mark.parametrize("split, expected", [
    ("hotpotqa", "hotpotqa"), ("HotpotQA-dev", "hotpotqa"), ("hotpot_qa", "hotpotqa"),
    ("squad", "squad"), ("squad_v1.1", "squad"), ("nq", "search_r1"), ("triviaqa", "search_r1"),
    ("popqa", "search_r1"), ("2wikimultihopqa", "search_r1"), ("musique_ans", "search_r1"),
    ("bamboogle", "search_r1"), ("test", "reward"), ("dev", "reward"), ("nqx", "reward"),
])
def test_auto_metric_set_by_dataset_name(split, expected):
    assert auto_metric_set(split) == expected


def test_metric_set_for_overrides():
    assert metric_set_for("hotpotqa", "auto", {}).name == "hotpotqa"
    assert metric_set_for("hotpotqa", "reward", {}).name == "reward"  # present behaviour
    assert metric_set_for("hotpotqa", "auto", {"hotpotqa": "search_r1"}).name == "search_r1"
    with pytest.raises(KeyError, match="unknown eval metric set 'hotpot'"):
        metric_set_for("x", "hotpot", {})
