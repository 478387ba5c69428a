"""The ProRubric authors' reward (rewards.dimension_judging and the rubric rewarder's official
arms) on hand-computed cases: the clipped weighted mean over dimension verdicts, a negative-weight
dimension, a clipped additive case, a prompt group that fails closed, the graded arm's draws,
the arms' texts, the re-weighted atomic arms and overlong shaping of training rows."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from core.types import Group, Prompt, Trajectory
from judges.rule import RuleJudge
from judges.types import DimensionResult
from rewards.aggregate import clipped_weighted_mean
from rewards.dimension_judging import (
    DIMENSION_ARMS,
    DimensionItem,
    dimension_criteria,
    fallback_paragraph,
    judge_groups,
    strip_failure_clauses,
    verbatim_conjunction,
)
from rewards.reweight import reweighted
from rewards.rubric import Criterion, Dimension, Rubric
from rewards.rubric_scoring import (
    Checks,
    ScoreItem,
    aggregate_checks,
    score_items,
)
from rl.rewarders.rubric import RubricRewarder
from rl.run.config import OverlongConfig, overlong_buffer, overlong_max_len
from rl.run.loop import shaped_rewards

CONF = str(Path(__file__).resolve().parents[2] / "conf")
OFFICIAL = DIMENSION_ARMS["prorubric_official"]


def _rubric(dim_weights=(None, None, None), pid="p"):
    """Six items: 0-1 -> dim A, 2-3 -> dim B, 4 (pitfall, -2) and 5 -> dim C."""
    crits = (Criterion("contains:alpha", 3.0), Criterion("contains:beta", 1.0),
             Criterion("contains:gamma", 2.0), Criterion("contains:delta", 2.0),
             Criterion("contains:bad", -2.0), Criterion("contains:omega", 1.0))
    dims = (Dimension("A", (0, 1), None, "Covers alpha and beta. It fails if it says nope.",
                      dim_weights[0]),
            Dimension("B", (2, 3), "contains:nope", "", dim_weights[1]),
            Dimension("C", (4, 5), None, "Names omega without bad advice.", dim_weights[2]))
    return Rubric(pid, "the question", crits, dims)


class FixedJudge:
    """check_dimensions answers from a script: per call, a verdict tuple or "fail"; records
    how many requests each batch held."""

    def __init__(self, script):
        self.script = list(script)
        self.batches: list[int] = []

    def check_dimensions(self, reqs):
        self.batches.append(len(reqs))
        out = []
        for _ in reqs:
            v = self.script.pop(0)
            out.append(DimensionResult((), failed=True, error="x") if v == "fail" else
                       DimensionResult(tuple(float(x) for x in v)))
        return out


def test_official_formula_hand_computed():
    # W = (4, 4, 3) = sums of |w| of each dimension; v = (1, 0, 1): (4 + 3) / 11
    r = _rubric()
    assert r.dimension_weights() == (4.0, 4.0, 3.0)
    g = judge_groups(FixedJudge([(1, 0, 1)]), [DimensionItem("q", "x", r)], [1], OFFICIAL)
    assert g.reward[0] == pytest.approx(7 / 11)
    assert g.verdicts == ((1.0, 0.0, 1.0),) and g.judge_failed[0] == 0


def test_negative_weight_dimension_subtracts_and_the_reward_is_clipped():
    # W = (4, 2, -3); Z = sum max(0, W) = 6.  v = (1, 1, 1): (4 + 2 - 3) / 6 = 0.5
    r = _rubric(dim_weights=(None, 2.0, -3.0))
    items = [DimensionItem("q", "x", r)] * 3
    g = judge_groups(FixedJudge([(1, 1, 1), (0, 0, 1), (1, 1, 0)]), items, [3], OFFICIAL)
    # (0, 0, 1): -3 / 6 -> clipped to 0; (1, 1, 0): 6 / 6 = 1
    np.testing.assert_allclose(g.reward, [0.5, 0.0, 1.0])
    assert float(clipped_weighted_mean(np.array([0.0, 0.0, 1.0]),
                                       np.array([4.0, 2.0, -3.0]))) == 0.0
    crit = dimension_criteria(r, OFFICIAL)
    assert [c.weight for c in crit] == [4.0, 2.0, -3.0]
    # the negative dimension describes the bad behaviour: its rules are its items as they are
    assert crit[2].rules == ("contains:bad", "contains:omega")


def test_clipped_additive_case():
    # items w = (3, 1, 2, 2, -2, 1), only the pitfall present: R = -2 / 9 unclipped, 0 clipped
    r = _rubric()
    ch = [Checks(q=(0, 0, 0, 0, 1, 0), fail=(0, 0, 0), fitness=())]
    assert aggregate_checks("additive", [r], ch)[0] == pytest.approx(-2 / 9)
    assert aggregate_checks("additive", [r], ch, clip=True)[0] == 0.0
    s = score_items(RuleJudge(), [ScoreItem("q", "bad", r)], "additive", clip=True)
    assert s.reward[0] == 0.0


def test_a_failed_group_is_retried_once_then_fails_closed():
    r = _rubric()
    items = [DimensionItem("q", f"x{k}", r) for k in range(4)]
    # group 0: both calls fine; group 1: second call fails in both rounds
    judge = FixedJudge([(1, 1, 1), (1, 0, 0), (1, 1, 1), "fail", (1, 1, 1), "fail"])
    g = judge_groups(judge, items, [2, 2], OFFICIAL, group_retries=1)
    np.testing.assert_allclose(g.reward, [1.0, 4 / 11, 0.0, 0.0])
    np.testing.assert_array_equal(g.judge_failed, [0, 0, 1, 1])
    assert judge.batches == [4, 2]  # the whole failed group judged again, once
    assert (g.failed_groups, g.group_retries, g.failed_calls) == (1, 1, 2)


def test_a_group_that_recovers_on_its_retry_is_scored():
    r = _rubric()
    items = [DimensionItem("q", "a", r), DimensionItem("q", "b", r)]
    judge = FixedJudge(["fail", (1, 1, 1), (0, 1, 0), (1, 1, 1)])
    g = judge_groups(judge, items, [2], OFFICIAL)
    np.testing.assert_allclose(g.reward, [4 / 11, 1.0])  # the retry's verdicts, both members
    assert g.failed_groups == 0 and g.group_retries == 1
    g0 = judge_groups(FixedJudge(["fail", (1, 1, 1)]), items, [2], OFFICIAL, group_retries=0)
    np.testing.assert_array_equal(g0.reward, [0.0, 0.0])


def test_graded_arm_mean_of_two_draws_of_thirds():
    arm = DIMENSION_ARMS["prorubric_graded"]
    assert (arm.draws, arm.temperature, arm.verdict) == (2, 0.7, "graded")
    r = _rubric()
    # draw 1: (1, 2/3, 0) -> (4 + 8/3) / 11; draw 2: (1/3, 1, 1) -> (4/3 + 4 + 3) / 11
    judge = FixedJudge([(1, 2 / 3, 0), (1 / 3, 1, 1)])
    g = judge_groups(judge, [DimensionItem("q", "x", r)], [1], arm)
    want = ((4 + 8 / 3) / 11 + (4 / 3 + 7) / 11) / 2
    assert g.reward[0] == pytest.approx(want)
    assert judge.batches == [2]


def test_rule_judge_runs_the_official_arm_as_a_conjunction():
    r = _rubric()
    # A holds (alpha, beta); B fails (delta missing); C holds (omega, no bad): (4 + 3) / 11
    s = score_items(RuleJudge(), [ScoreItem("q", "alpha beta gamma omega", r)],
                    "prorubric_official")
    assert s.reward[0] == pytest.approx(7 / 11) and s.judge_failed[0] == 0
    # B's failure clause fires: B fails even with gamma and delta; without failure clauses
    # (the arm that drops them) it holds
    t = "alpha beta gamma delta nope omega"
    assert score_items(RuleJudge(), [ScoreItem("q", t, r)], "prorubric_official").reward[0] \
        == pytest.approx(7 / 11)
    assert score_items(RuleJudge(), [ScoreItem("q", t, r)],
                       "prorubric_no_failure").reward[0] == pytest.approx(1.0)


def test_arm_texts():
    r = _rubric()
    a, b, c = r.dimensions
    assert dimension_criteria(r, OFFICIAL)[0].text == a.description
    para = fallback_paragraph(r, b)  # B has no description: composed, failure clause included
    assert "contains:gamma" in para and "fails this dimension if" in para
    assert dimension_criteria(r, OFFICIAL)[1].text == para
    stripped = [x.text for x in dimension_criteria(r, DIMENSION_ARMS["prorubric_no_failure"])]
    assert stripped[0] == a.description  # remainder < 40 characters: kept whole
    assert "fails" not in stripped[1] and "contains:gamma" in stripped[1]
    # raw-AND as the authors build it: every item verbatim, the pitfall too, as a part that
    # must hold (so the rule judge requires its rule); ours marks the pitfall must-not-hold
    raw = verbatim_conjunction(r, c)
    assert "(1) contains:bad" in raw and "must NOT" not in raw and "(2) contains:omega" in raw
    theirs = dimension_criteria(r, DIMENSION_ARMS["raw_and_verbatim"])
    assert theirs[2].text == raw and theirs[2].rules == ("contains:bad", "contains:omega")
    assert theirs[1].rules == ("contains:gamma", "contains:delta")  # no failure clause
    marked = dimension_criteria(r, DIMENSION_ARMS["raw_and_marked"])
    assert "(1) must NOT hold: contains:bad" in marked[2].text
    assert marked[2].rules == ("not:contains:bad", "contains:omega")


def test_strip_failure_clauses_as_the_authors_build_does():
    text = ("The answer names the dose and the timing clearly. It fails if it recommends "
            "doubling the dose. It must also say when to call a doctor.")
    # removed in place: the spaces on both sides stay
    assert strip_failure_clauses(text) == ("The answer names the dose and the timing clearly.  "
                                           "It must also say when to call a doctor.")
    assert strip_failure_clauses("Short. Fails if wrong.") == "Short. Fails if wrong."
    assert strip_failure_clauses("No clause here at all.") == "No clause here at all."
    body = "The answer explains each step of the procedure in plain words."
    assert strip_failure_clauses(f"{body} It fails this dimension if it skips one.") == body
    assert strip_failure_clauses(f"It fails the criterion if it skips one. {body}") == body
    # what their pattern leaves: other verbs and tenses, words between "fails" and "if", and
    # a last sentence without an end mark
    for kept in ("It fails when it skips one.", "It failed if it skipped one.",
                 "It fails the answer if it skips one.", "It fails if it skips one"):
        assert strip_failure_clauses(f"{body} {kept}") == f"{body} {kept}"


def test_k1_merges_dimensions_and_runs_unbundled_rubrics():
    r = _rubric()
    (one,) = dimension_criteria(r, DIMENSION_ARMS["prorubric_k1"])
    assert one.weight == 11.0 and one.text.startswith(r.dimensions[0].description)
    assert "not:contains:nope" in one.rules and "not:contains:bad" in one.rules
    (whole,) = dimension_criteria(r.with_dimensions(()), DIMENSION_ARMS["prorubric_k1"])
    assert whole.weight == 11.0  # sum of |w| of every item
    with pytest.raises(ValueError, match="needs bundled rubrics"):
        dimension_criteria(r.with_dimensions(()), OFFICIAL)


def test_the_appropriateness_arms_add_one_criterion_weighted_as_the_authors_do():
    from rewards.dimension_judging import APPROPRIATENESS

    r = dataclasses.replace(_rubric(), meta={"fitness": [{"text": "max_words:3"}]})
    dims = dimension_criteria(r, DIMENSION_ARMS["prorubric_appr"])
    official = dimension_criteria(r, OFFICIAL)
    assert dims[:-1] == official and dims[-1].text == APPROPRIATENESS
    # the mean of the dimension weights; checked by the rubric's fitness rules
    assert dims[-1].weight == pytest.approx(sum(c.weight for c in official) / 3)
    assert dims[-1].rules == ("max_words:3",)
    items = dimension_criteria(r, DIMENSION_ARMS["rubric_rl_appr"])
    assert len(items) == r.num_criteria + 1
    # sum |w_i| / K: the pitfall counts by its magnitude; K = 3 dimensions
    assert items[-1].weight == pytest.approx(sum(abs(c.weight) for c in r.criteria) / 3)
    # a long answer that meets alpha only, under the single call: 3 / (9 + appr)
    long = "alpha " + "x " * 5
    s = score_items(RuleJudge(), [ScoreItem("q", long, r)], "rubric_rl_appr")
    assert s.reward[0] == pytest.approx(3 / (9 + items[-1].weight))


def test_rubric_rl_official_is_the_clipped_formula_over_items():
    r = _rubric()
    # alpha (3) and bad (-2) present: (3 - 2) / 9
    s = score_items(RuleJudge(), [ScoreItem("q", "alpha bad", r)], "rubric_rl_official")
    assert s.reward[0] == pytest.approx(1 / 9)


def test_weighted_atomic_and_grouped_mean():
    r = _rubric()
    tagged = dataclasses.replace(r, criteria=(
        dataclasses.replace(r.criteria[0], tags=("critical",)),
        dataclasses.replace(r.criteria[1], tags=("weight:format",)), *r.criteria[2:]))
    assert reweighted("weighted_atomic", tagged) == (9.0, 0.0, 2.0, 2.0, -2.0, 1.0)
    ch = [Checks(q=(1, 1, 0, 0, 0, 0), fail=(0, 0, 0), fitness=())]
    assert aggregate_checks("weighted_atomic", [tagged], ch)[0] == pytest.approx(9 / 14)
    # grouped mean: dim B weighted 8 instead of 4 -> items 2, 3 get 4 each
    rw = _rubric(dim_weights=(None, 8.0, None))
    assert reweighted("grouped_mean", rw) == (3.0, 1.0, 4.0, 4.0, -2.0, 1.0)
    ch = [Checks(q=(0, 0, 1, 0, 0, 0), fail=(0, 0, 0), fitness=())]
    assert aggregate_checks("grouped_mean", [rw], ch)[0] == pytest.approx(4 / 13)

    # judged as the authors judge them: the atomic items in one call, the re-derived weights
    weighted = dimension_criteria(tagged, DIMENSION_ARMS["weighted_atomic_official"])
    assert [c.weight for c in weighted] == [9.0, 0.0, 2.0, 2.0, -2.0, 1.0]
    assert [c.rules for c in weighted] == [(c.text,) for c in tagged.criteria]
    grouped = dimension_criteria(rw, DIMENSION_ARMS["grouped_mean_official"])
    assert [c.weight for c in grouped] == [3.0, 1.0, 4.0, 4.0, -2.0, 1.0]
    # alpha (weight 9) met, the rest not: 9 / (9 + 2 + 2 + 1) under the single call too
    s = score_items(RuleJudge(), [ScoreItem("q", "alpha", tagged)], "weighted_atomic_official")
    assert s.reward[0] == pytest.approx(9 / 14)


def _traj(text, n_tokens=3):
    return Trajectory(prompt_tokens=(1,), tokens=(0,) * n_tokens, loss_mask=(1,) * n_tokens,
                      logprobs=(0.0,) * n_tokens, text=text, finish="stop")


def test_rewarder_marks_failed_rows_and_counts():
    r = _rubric()
    task = SimpleNamespace(name="t", rule_checkable=True)
    groups = [Group(Prompt(f"p{g}", ({"role": "user", "content": "q"},), meta={"rubric": r}),
                    (_traj("alpha beta"), _traj("omega"))) for g in range(2)]
    judge = RuleJudge()
    judge.check_dimensions = FixedJudge([(1, 1, 1), (0, 0, 1), "fail", (1, 1, 1), "fail",
                                         (1, 1, 1)]).check_dimensions
    out = RubricRewarder(task=task, judge=judge, aggregator="prorubric_official")(groups, None, 0)
    np.testing.assert_allclose(out.rewards, [[1.0, 3 / 11], [0.0, 0.0]])
    assert [t["judge_failed"] for row in out.per_traj for t in row] == [0, 0, 1, 1]
    assert out.metrics["rubric/judge_failed_groups"] == 1.0
    assert out.counts["rubric/judge_failed"] == 2.0 and out.counts["rubric/group_retries"] == 1


def _overlong_components(buffer_frac=0.5, penalty=0.5, budget=100, max_len=None):
    ov = OverlongConfig(enabled=True, max_len=max_len, buffer_len=None, buffer_frac=buffer_frac,
                        penalty=penalty)
    return SimpleNamespace(run=SimpleNamespace(algo=SimpleNamespace(overlong=ov)),
                           response_budget=budget)


def test_overlong_shaping_official_formula_and_failed_groups_untouched():
    c = _overlong_components()  # L_max = 100, B = 50, factor 0.5
    assert (overlong_max_len(c.run, 100), overlong_buffer(c.run, 100)) == (100, 50)
    groups = [SimpleNamespace(trajectories=[SimpleNamespace(tokens=(0,) * n) for n in ns])
              for ns in ((40, 50, 75, 100), (90, 90, 90, 90))]
    rewards = np.array([[1.0, 1.0, 1.0, 0.5], [0.0, 0.0, 0.0, 0.0]])
    per_traj = ((({},) * 4), tuple({"judge_failed": 1} for _ in range(4)))
    got = shaped_rewards(c, groups, rewards, per_traj)

    def official(length, lmax=100, b=50):  # min(0, -(L - (Lmax - B)) / B * 0.5)
        return min(0.0, -(length - (lmax - b)) / b * 0.5)

    want_row0 = [1.0 + official(n) for n in (40, 50, 75)] + [0.5 + official(100)]
    np.testing.assert_allclose(got[0], want_row0)
    np.testing.assert_allclose(got[0], [1.0, 1.0, 0.75, 0.0])
    np.testing.assert_array_equal(got[1], [0.0] * 4)  # the failed group stays zero-variance
    c2 = _overlong_components(max_len=80, budget=100)  # L_max below the budget: B = 40
    assert overlong_buffer(c2.run, 100) == 40
    np.testing.assert_allclose(shaped_rewards(c2, groups[:1], rewards[:1]),
                               [[1.0, 0.875, 0.5625, 0.0]])


def test_official_arms_compose_one_algo_away():
    # the Weighted and Grouped-mean controls run on the single-call atomic arms
    algos = {**{arm: arm for arm in DIMENSION_ARMS}, "rubric_rl": "additive",
             "weighted_atomic": "weighted_atomic_official",
             "grouped_mean": "grouped_mean_official"}
    algos.pop("weighted_atomic_official"), algos.pop("grouped_mean_official")
    for algo, want in algos.items():
        with initialize_config_dir(config_dir=CONF, version_base="1.3"):
            cfg = compose("config", overrides=["task=rubric_chat", f"algo={algo}", "judge=rule",
                                               "trainer.run_dir=unused"])
        cfg = OmegaConf.to_container(cfg, resolve=True)
        opts = cfg["algo"]["rewarder_options"]
        assert opts["aggregator"] == want and cfg["task"]["aggregator"] == want
        if want in DIMENSION_ARMS:
            ov = cfg["algo"]["overlong"]
            assert (ov["enabled"], ov["buffer_frac"], ov["penalty"], ov["max_len"]) == (
                True, 0.5, 0.5, None)
            assert opts["group_retries"] == 1
        else:
            assert opts["clip"] is True and cfg["task"]["clip"] is True


def test_under_the_rule_judge_the_official_arm_equals_the_digest_product_on_rubric_chat():
    # the rule judge's dimension verdict is the AND of the items, pitfalls and failure clause:
    # prod_i q'_i (1 - fail_d); with W_d = sum |w_i| >= 0 the clip is idle, so the two agree
    from rl.tasks.rubric_chat import RubricChatTask

    prompts = RubricChatTask(size=6, eval_size=2).prompts("train")
    items = []
    for p in prompts:
        r = p.meta["rubric"]
        for text in (r.reference_answer, r.reference_answer.split(". ")[0], "as an AI I cannot"):
            items.append(ScoreItem(r.prompt_text(), text, r))
    official = score_items(RuleJudge(), items, "prorubric_official").reward
    digest = score_items(RuleJudge(), items, "prorubric").reward
    np.testing.assert_allclose(official, digest, atol=1e-6)
    assert official.max() == 1.0 and 0 < np.count_nonzero(official) < len(items)
