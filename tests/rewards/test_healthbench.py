"""HealthBench's clipped aggregate scores (rewards.healthbench), worked out by hand."""

import pytest

from rewards.healthbench import example_score, healthbench_scores

# three examples: criterion points, met values, each criterion's tags, the example's tags
EXAMPLES = ([[5, 3, -4], [2, 2], [4, -8]],
            [[1, 1, 0], [1, 0], [0, 1]],
            [[("axis:accuracy",), ("axis:completeness",), ("axis:accuracy",)],
             [("axis:completeness",), ("axis:completeness", "axis:accuracy")],
             [("axis:accuracy",), ("axis:safety",)]],
            [("theme:hedging",), ("theme:hedging",), ("theme:emergency referrals",)])


def test_example_score_is_points_met_over_positive_points():
    assert example_score([5, 3, -2], [1, 0, 1]) == pytest.approx((5 - 2) / 8)
    assert example_score([5, 3, -2], [0, 0, 1]) == pytest.approx(-2 / 8)  # not clipped here
    assert example_score([-2, -3], [0, 1]) is None  # no positive points: undefined
    assert example_score([4, 2], [0.5, 1.0]) == pytest.approx(4 / 6)  # P(met) weights points


def test_overall_axis_and_theme_scores_by_hand():
    points, met, item_tags, example_tags = EXAMPLES
    got = healthbench_scores(points, met, item_tags, example_tags)
    # examples: 8/8 = 1, 2/4 = 0.5, -8/4 = -2: the mean -1/6 is clipped to 0
    assert got["healthbench"] == 0.0
    # accuracy: ex 1 items 0, 2 -> 5/5 = 1; ex 2 item 1 -> 0/2 = 0; ex 3 item 0 -> 0/4 = 0
    assert got["axis/accuracy"] == pytest.approx(1 / 3)
    # completeness: ex 1 item 1 -> 1; ex 2 both -> 2/4; ex 3 none (undefined, left out)
    assert got["axis/completeness"] == pytest.approx(0.75)
    assert "axis/safety" not in got  # only negative points anywhere: undefined everywhere
    assert got["theme/hedging"] == pytest.approx(0.75)  # (1 + 0.5) / 2
    assert got["theme/emergency_referrals"] == 0.0  # -2 clipped; the name's space as _


def test_rubric_chat_reports_healthbench_scores_of_its_answers():
    from rl.tasks.rubric_chat import RubricChatTask

    task = RubricChatTask()
    prompts = task.prompts("dev")[:4]
    best = task.evaluate(prompts, [p.answer for p in prompts]).summary
    worst = task.evaluate(prompts, ["I am not sure."] * 4).summary
    topics = {f"theme/{p.meta['topic'].replace(' ', '_')}" for p in prompts}
    # the reference answers name and explain every item: every score is 1; an empty answer 0
    for summary, value in ((best, 1.0), (worst, 0.0)):
        assert summary["healthbench"] == value
        assert summary["axis/mention"] == summary["axis/explain"] == value
        assert {k for k in summary if k.startswith("theme/")} == topics
        assert all(summary[t] == value for t in topics)


def test_per_example_values_and_their_intervals_by_hand():
    """The examples of test_overall_axis_and_theme_scores_by_hand, each score's per-example
    values (NaN where undefined), and the interval rl.eval reports for them: resample the
    examples, mean of the defined values, quantiles, ends clipped to [0, 1]."""
    import numpy as np

    from rewards.healthbench import healthbench_values
    from rewards.rubric_scoring import RubricReport
    from rl.run.eval_stats import intervals
    from rl.run.evaluation import clip_healthbench, report_scores

    nan = float("nan")
    points, met, item_tags, example_tags = EXAMPLES
    v = healthbench_values(points, met, item_tags, example_tags)
    np.testing.assert_allclose(v["healthbench"], [1.0, 0.5, -2.0])
    np.testing.assert_allclose(v["axis/accuracy"], [1.0, 0.0, 0.0])
    np.testing.assert_allclose(v["axis/completeness"], [1.0, 0.5, nan])
    np.testing.assert_allclose(v["axis/safety"], [nan, nan, nan])
    np.testing.assert_allclose(v["theme/hedging"], [1.0, 0.5, nan])
    summary = healthbench_scores(points, met, item_tags, example_tags)
    report = RubricReport(np.zeros(3), np.zeros(3), np.zeros(3), np.zeros(3),
                          {"reward": 0.0, **summary}, v)
    scores, split = report_scores(report, [[{"outcome": 0.0}] for _ in range(3)])
    assert split == summary and "axis/safety" not in scores[0][0]  # undefined everywhere
    assert scores[1][0]["axis/completeness"] == 0.5 and np.isnan(scores[2][0]["theme/hedging"])
    values = {k: np.asarray([row[0][k] for row in scores]) for k in scores[0][0]}
    got = clip_healthbench(intervals({"test": values}, n_boot=500, level=0.9))["test"]
    idx = np.random.default_rng(0).integers(0, 3, size=(500, 3))  # rl.eval's resamples, seed 0

    def reference(x):
        means = []
        for row in np.asarray(x)[idx]:
            ok = row[np.isfinite(row)]
            if ok.size:
                means.append(ok.mean())
        return np.clip(np.quantile(means, [0.05, 0.95]), 0.0, 1.0).tolist()

    for key in ("healthbench", "axis/accuracy", "axis/completeness", "theme/hedging"):
        assert got[key] == pytest.approx(reference(v[key])), key
    assert got["healthbench"][0] == 0.0  # the lower end of a mean of 1, .5, -2 clipped
