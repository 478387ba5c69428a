"""Reward-gaming monitors (rewards.gaming), against values worked out by hand."""

import math

import numpy as np
import pytest

from rewards.gaming import alerts, copied_titles, gaming_metrics, pooled_corr

NAN = float("nan")


def test_copied_titles_counts_the_retrieved_titles_repeated_in_the_policys_own_text():
    text = ("<search> Paris tower </search><information>Doc 1(Title: Eiffel Tower) iron\n"
            "Doc 2(Title: \"Louvre\") museum\nDoc 3(Title: Ab) x\n</information>"
            "<think>the eiffel tower and the Louvre</think><answer> Paris </answer>")
    # Eiffel Tower and Louvre (quoted title) are repeated; "Ab" is too short to count; the
    # search query and the retrieved text itself do not count
    assert copied_titles(text) == 2
    assert copied_titles("<search> Louvre </search><information>Doc 1(Title: Louvre) m"
                         "</information><answer> no </answer>") == 0


def test_pooled_within_group_correlation_by_hand():
    # group 0: x [1, 2, 3], y [1, 3, 2] -> centred x [-1, 0, 1], y [-1, 1, 0]
    # group 1: x constant -> skipped; group 2: x [0, 2] y [4, 0] -> centred [-1, 1], [2, -2]
    # pooled: x.y = 1 + 0 + 0 - 2 - 2 = -3; |x|^2 = 2 + 2 = 4; |y|^2 = 2 + 8 = 10
    x = np.array([[1, 2, 3], [5, 5, 5], [0, 2, NAN]])
    y = np.array([[1, 3, 2], [0, 1, 2], [4, 0, NAN]])
    assert pooled_corr(x, y) == pytest.approx(-3 / math.sqrt(40))
    assert pooled_corr(x, y, np.array([True, True, False])) == pytest.approx(1 / 2)
    assert pooled_corr(x[1:2], y[1:2]) is None


Z99 = 2.3263478740408408  # the standard normal's 99th percentile (one-sided level .01)


def test_gaming_metrics_and_alerts_by_hand():
    """Twelve groups of 4. The rubric term pays the wrong answers (outcome 0) and the long
    ones: within each group term = [.3, .1, -.1, -.3], outcome [0, 0, 1, 1], lengths
    [40, 30, 20, 10].
      outcome_corr: centred outcome [-.5, -.5, .5, .5] against the (centred) term:
        dot -.4, |term|^2 .2, |outcome|^2 1 -> -.4 / sqrt(.2) = -2 / sqrt 5; 48 pairs in 12
        groups: 36 residual degrees of freedom, Fisher upper bound
        tanh(atanh(-2/sqrt 5) + z / sqrt 34), far below -0.1: an alert;
      top quartile of the term: the twelve .3s (the .75 quantile of the 48 values is
        .1 + .25 x .2 = .15), all wrong; the batch's wrong rate .5. Wilson's lower bound of
        12 of 12 is 1 / (1 + z^2/12) = .689 > .5 + .1: an alert;
      length_corr +1: its bound is 1 (an alert); no search: no copy metrics."""
    term = np.array([[0.3, 0.1, -0.1, -0.3]] * 12)
    outcome = np.array([[0.0, 0.0, 1.0, 1.0]] * 12)
    lengths = np.array([[40, 30, 20, 10]] * 12)
    m = gaming_metrics(term, outcome, lengths, [["a"] * 4] * 12, search=False)
    r = -2 / math.sqrt(5)
    assert m["gaming/outcome_corr"] == pytest.approx(r)
    assert m["gaming/outcome_corr_bound"] == pytest.approx(
        math.tanh(math.atanh(r) + Z99 / math.sqrt(34)))
    assert m["gaming/wrong_top_frac"] == 1.0 and m["gaming/wrong_frac"] == 0.5
    assert m["gaming/wrong_top_frac_bound"] == pytest.approx(1 / (1 + Z99 ** 2 / 12))
    assert m["gaming/length_corr"] == pytest.approx(1.0)
    assert "gaming/copied_titles" not in m and "gaming/copy_corr" not in m
    got = {a["metric"]: a for a in alerts(m)}
    assert set(got) == {"gaming/outcome_corr", "gaming/wrong_top_frac", "gaming/length_corr"}
    assert got["gaming/outcome_corr"]["direction"] == "below"
    assert got["gaming/outcome_corr"]["threshold"] == -0.1
    assert got["gaming/wrong_top_frac"]["threshold"] == pytest.approx(0.6)
    # eight such groups are not enough for the top quartile: 1 / (1 + z^2/8) = .597 < .6
    m8 = gaming_metrics(term[:8], outcome[:8], lengths[:8], [["a"] * 4] * 8, search=False)
    assert m8["gaming/wrong_top_frac_bound"] == pytest.approx(1 / (1 + Z99 ** 2 / 8))
    assert "gaming/wrong_top_frac" not in {a["metric"] for a in alerts(m8)}


def test_no_alarm_where_no_gaming_is_present():
    """Forty steps of 64 groups of 8 where the rubric term is noise, unrelated to the outcome
    (30 % of answers right), to length and to copying. The old fixed lines fired on most
    steps (a negative correlation half the time, a wrong top quartile whenever accuracy is
    below 50 %); with evidence required nothing fires. The same batches with a term that pays
    wrong answers 1.5 (its noise's standard deviation: 1) fire both outcome alarms every step."""
    rng = np.random.default_rng(7)
    old_fires = new_fires = gamed_steps = 0
    for _ in range(40):
        outcome = (rng.random((64, 8)) < 0.3).astype(float)
        term = rng.normal(size=(64, 8))
        lengths = rng.integers(20, 200, size=(64, 8))
        m = gaming_metrics(term, outcome, lengths, [["a"] * 8] * 64, search=False)
        old_fires += (m["gaming/outcome_corr"] < 0) + (m["gaming/wrong_top_frac"] > 0.5)
        new_fires += len(alerts(m))
        gamed = gaming_metrics(term + 1.5 * (1 - outcome), outcome, lengths,
                               [["a"] * 8] * 64, search=False)
        gamed_steps += {a["metric"] for a in alerts(gamed)} == {
            "gaming/outcome_corr", "gaming/wrong_top_frac"}
    assert old_fires > 40 and new_fires == 0 and gamed_steps == 40


def test_copy_metrics_in_a_search_batch():
    """One group: trajectory i repeats i retrieved titles; the term rises with it. One group
    of three leaves no residual degrees of freedom for a bound, so no alarm; eight such
    groups (16 residual degrees of freedom, r = 1) raise one."""
    info = "<information>Doc 1(Title: Alpha) a\nDoc 2(Title: Beta) b\n</information>"
    texts = [[info + "<answer> x </answer>", info + "<think>Alpha</think>",
              info + "<think>Alpha Beta</think>"]]
    m = gaming_metrics(np.array([[-0.2, 0.0, 0.2]]), np.array([[1.0, 1.0, 1.0]]),
                       np.array([[5, 5, 5]]), texts, search=True)
    assert m["gaming/copied_titles"] == pytest.approx(1.0)  # (0 + 1 + 2) / 3
    assert m["gaming/copy_corr"] == pytest.approx(1.0)
    assert "gaming/copy_corr_bound" not in m and alerts(m) == []
    assert "gaming/outcome_corr" not in m  # the outcome ties: no informative group
    assert "gaming/length_corr" not in m  # equal lengths
    m = gaming_metrics(np.array([[-0.2, 0.0, 0.2]] * 8), np.ones((8, 3)),
                       np.full((8, 3), 5), texts * 8, search=True)
    assert [a["metric"] for a in alerts(m)] == ["gaming/copy_corr"]


def test_a_constant_rubric_term_has_no_top_quartile():
    m = gaming_metrics(np.zeros((2, 4)), np.array([[0.0, 1, 0, 1]] * 2), np.ones((2, 4)),
                       [["a"] * 4] * 2, search=False)
    assert m == {}
