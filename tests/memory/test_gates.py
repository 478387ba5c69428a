"""The rubric memory's gates by hand: triplet, admission, cumulative correlation, retirement,
selection."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from judges import (
    Draft,
)
from memory import (
    Candidate,
    CommonRubric,
    CorrStats,
    GroupScores,
    MemoryConfig,
    Rejected,
    Retired,
    RubricMemory,
    admit,
    apply_activation,
    choose,
    judge_admission,
    pearson,
    select_active,
    select_triplet,
    update_stats,
)
from tests.memory.helpers import (
    D,
    _common,
)

# --- triplet ------------------------------------------------------------------------------------


def test_triplet_argmax_argmin_hard():
    # F1 = [.5, 1, 0, 1, -1]: best is a tie between 1 and 3 (F1 1), both valid -> shorter (3,
    # length 20 < 30). Worst: 4 (F1 -1). Hard: argmax over F1 != 1 -> 0 (F1 .5).
    t = select_triplet([0.5, 1.0, 0.0, 1.0, -1.0], [True, True, True, True, False],
                       [10, 30, 10, 20, 5])
    assert (t.best, t.hard, t.worst, t.tied) == (3, 0, 4, False)


def test_triplet_homogeneous_group_is_broken_by_format_then_length_and_flagged():
    # All F1 = 0. Key (invalid?, length, index), smaller = better:
    # 0: (F, 50, 0), 1: (T, 10, 1), 2: (F, 20, 2), 3: (F, 20, 3) -> order 2, 3, 0, 1.
    t = select_triplet([0.0] * 4, [True, False, True, True], [50, 10, 20, 20])
    assert (t.best, t.hard, t.worst, t.tied) == (2, None, 1, True)
    # "length" ignores the format: (10, 1) < (20, 2) < (20, 3) < (50, 0).
    t = select_triplet([0.0] * 4, [True, False, True, True], [50, 10, 20, 20], "length")
    assert (t.best, t.worst) == (1, 0)
    t = select_triplet([0.0] * 4, None, None, "index")
    assert (t.best, t.worst, t.tied) == (0, 3, True)


def test_triplet_small_groups():
    assert select_triplet([1.0]) is None
    assert select_triplet([]) is None
    t = select_triplet([0.3, 0.3])
    assert t.best != t.worst and t.tied and t.hard is None


@given(st.lists(st.sampled_from([-1.0, 0.0, 0.25, 0.5, 1.0]), min_size=2, max_size=16),
       st.sampled_from(["format_then_length", "length", "format", "index"]))
def test_triplet_properties(y, policy):
    t = select_triplet(y, None, list(range(len(y), 0, -1)), policy)
    assert t.best != t.worst
    assert y[t.best] == max(y) and y[t.worst] == min(y)
    homog = len(set(y)) == 1
    assert t.tied == homog and (t.hard is None) == homog
    if t.hard is not None:
        assert y[t.hard] == max(v for v in y if v != max(y))


# --- admission ----------------------------------------------------------------------------------


def _pearson_by_formula(x, y):
    """rho = sum (x - mx)(y - my) / sqrt(sum (x - mx)^2 sum (y - my)^2), written out."""
    mx, my = sum(x) / len(x), sum(y) / len(y)
    cov = sum((a - mx) * (b - my) for a, b in zip(x, y))
    return cov / math.sqrt(sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y))


def test_issue_example_pearson_against_r_base_and_f1():
    # Issue 18: s = [1, 1, 1, 0] on a group whose last member has an invalid format. F1 of the
    # answers [1, 0, 0, 0]; R_base = F1 if valid else -1 = [1, 0, 0, -1].
    # Against R_base: ms = .75, my = 0; cov = .25*1 + 0 + 0 + (-.75)(-1) = 1;
    #   sum ds^2 = 3 * .0625 + .5625 = .75, sum dy^2 = 2 -> 1 / sqrt(1.5) = .8165.
    # Against F1: my = .25; cov = .25*.75 + 2 * .25*(-.25) + (-.75)(-.25) = .25;
    #   sum dy^2 = .5625 + 3 * .0625 = .75 -> .25 / .75 = .3333.
    s, f1, r_base = [1, 1, 1, 0], [1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, -1.0]
    assert _pearson_by_formula(s, r_base) == pytest.approx(0.8165, abs=1e-4)
    assert _pearson_by_formula(s, f1) == pytest.approx(1 / 3)
    assert pearson(s, r_base) == pytest.approx(_pearson_by_formula(s, r_base))
    assert pearson(s, f1) == pytest.approx(_pearson_by_formula(s, f1))
    # The admission gate at rho_min = .5: passes against R_base, fails against F1.
    cfg = MemoryConfig(delta_v=0.1, rho_min=0.5, embedder="hash")
    assert judge_admission(D, s, r_base, cfg).admitted
    r = judge_admission(D, s, f1, cfg)
    assert (r.reason, r.rho) == ("low_correlation", pytest.approx(1 / 3))
    # The running sums give the same value: n = 4, Sx = 3, Sy = 1, Sxx = 3, Syy = 1, Sxy = 1
    # -> (4*1 - 3*1) / sqrt((4*3 - 9)(4*1 - 1)) = 1/3.
    assert CorrStats().add(s, f1).rho == pytest.approx(1 / 3)


def test_pearson_by_hand_and_undefined_cases():
    # x = [1,0,1,0], y = [1,0,0,-1]: means .5 and 0; cov = (.5*1 + -.5*0 + .5*0 + -.5*-1)/4 = .25
    # var x = .25, var y = (1 + 0 + 0 + 1)/4 = .5 -> rho = .25 / sqrt(.25 * .5) = 1/sqrt(2).
    assert pearson([1, 0, 1, 0], [1, 0, 0, -1]) == pytest.approx(1 / math.sqrt(2))
    assert pearson([0, 1, 0, 1], [1, 0, 0, -1]) == pytest.approx(-1 / math.sqrt(2))
    assert pearson([1, 1, 1, 1], [1, 0, 0, -1]) == 0.0  # zero variance: defined as 0
    assert pearson([1, 0, 1, 0], [0, 0, 0, 0]) == 0.0
    assert pearson([1.0], [2.0]) == 0.0


CFG = MemoryConfig(delta_v=0.1, rho_min=0.5, embedder="hash")


def test_admission_gates_by_hand():
    y = [1.0, 0.0, 0.0, -1.0]
    # var([1,0,1,0]) = .25 >= .1 and rho = .7071 >= .5 -> admitted.
    r = judge_admission(D, [1, 0, 1, 0], y, CFG)
    assert r.admitted and r.reason is None
    assert r.var == pytest.approx(0.25) and r.rho == pytest.approx(0.70710678)
    # [1,1,1,0]: mean .75, var = .75 * .25 = .1875 < .2 -> low_variance (first gate wins).
    r = judge_admission(D, [1, 1, 1, 0], y, dataclasses.replace(CFG, delta_v=0.2))
    assert (r.admitted, r.reason, r.var) == (False, "low_variance", pytest.approx(0.1875))
    # [0,1,0,1]: var .25 passes, rho = -.7071 < .5 -> low_correlation.
    r = judge_admission(D, [0, 1, 0, 1], y, CFG)
    assert (r.admitted, r.reason) == (False, "low_correlation")
    assert r.rho == pytest.approx(-0.70710678)
    # Constant outcome: Pearson undefined -> 0: fails rho_min .5, passes rho_min 0.
    r = judge_admission(D, [1, 0, 1, 0], [0, 0, 0, 0], CFG)
    assert (r.reason, r.rho) == ("low_correlation", 0.0)
    assert judge_admission(D, [1, 0, 1, 0], [0, 0, 0, 0],
                           dataclasses.replace(CFG, rho_min=0.0)).admitted


def test_admission_bad_inputs_have_reasons():
    y = [1.0, 0.0, 0.0, -1.0]
    assert judge_admission(Draft("  ", "\n"), [1, 0, 1, 0], y, CFG).reason == "empty_text"
    assert judge_admission(D, [1.0], [1.0], CFG).reason == "group_too_small"
    assert judge_admission(D, [1, float("nan"), 0, 0], y, CFG).reason == "nan_scores"
    assert judge_admission(D, [1, float("inf"), 0, 0], y, CFG).reason == "nan_scores"
    assert judge_admission(D, None, y, CFG).reason == "nan_scores"
    assert judge_admission(D, [1, 0], y, CFG).reason == "nan_scores"  # wrong length
    # A member whose score is a judge fallback: no evidence, whatever the other scores say.
    assert judge_admission(D, [1, 0, 1, 0], y, CFG, fallback_members=1).reason == "judge_fallback"


def test_admit_appends_to_d_with_ids_and_events():
    y = (1.0, 0.0, 0.0, -1.0)
    cands = [
        Candidate("q", D, (1.0, 0.0, 1.0, 0.0), y),
        Candidate("q", Draft("bad", ""), (0.0, 1.0, 0.0, 1.0), y),
        Candidate("q", Draft("", ""), None, y),
        Candidate("q", Draft("also good", ""), (1.0, 0.0, 0.0, 0.0), y),
    ]
    mem = RubricMemory(next_id=7)
    new, admitted, events = admit(mem, cands, CFG, step=3)
    assert [d.id for d in admitted] == ["d7", "d8"] and new.next_id == 9
    assert new.drafts == admitted and mem == RubricMemory(next_id=7)
    assert [e.kind for e in events] == ["admitted", "rejected", "rejected", "admitted"]
    assert [e.reason for e in events if isinstance(e, Rejected)] == [
        "low_correlation", "empty_text"]
    assert all(e.step == 3 for e in events)
    kept, admitted2, _ = admit(mem, cands, CFG, step=3, keep=False)
    assert kept.drafts == () and admitted2 == admitted


# --- cumulative correlation -----------------------------------------------------------------


@given(st.lists(st.lists(st.tuples(st.floats(-1, 1), st.floats(-1, 1)), min_size=1,
                         max_size=8), min_size=1, max_size=6))
def test_running_sums_give_the_pearson_of_all_pairs(batches):
    c = CorrStats()
    for b in batches:
        c = c.add([x for x, _ in b], [y for _, y in b])
    xs = [x for b in batches for x, _ in b]
    ys = [y for b in batches for _, y in b]
    assert c.n == len(xs)
    assert c.rho == pytest.approx(pearson(xs, ys), abs=1e-6)


# --- retirement ---------------------------------------------------------------------------------

HIGH = GroupScores((1.0, 0.0), (0.0, 0.0))  # Var(s) = .25; constant outcome: no rho pairs
LOW = GroupScores((0.5, 0.5), (0.0, 0.0))  # Var(s) = 0


def _pool(*rubrics: CommonRubric) -> RubricMemory:
    return RubricMemory(commons=tuple(rubrics), next_id=len(rubrics))




def test_retirement_mastered_sequence_by_hand():
    # retire_k = 2. Activations low, low, high, low, low, low -> n_r = 1, 2, 0, 1, 2, 3;
    # retired "mastered" at the sixth, when n_r = 3 > 2 for the first time.
    cfg = MemoryConfig(delta_v=0.01, retire_k=2, embedder="hash")
    mem = _pool(_common(0))
    seq = [LOW, LOW, HIGH, LOW, LOW, LOW]
    expected_n = [1, 2, 0, 1, 2]
    for step, g in enumerate(seq[:-1]):
        mem, ev = apply_activation(mem, "c0", [g], cfg, step)
        assert ev == () and mem.common("c0").n_low_var == expected_n[step]
    mem, ev = apply_activation(mem, "c0", [seq[-1]], cfg, 5)
    assert mem.commons == () and len(mem.retired) == 1
    assert ev == (Retired(step=5, common_id="c0", reason="mastered", n_low_var=3, rho=0.0,
                          uses=0),)
    assert mem.retired[0].retired_reason == "mastered" and mem.retired[0].retired_step == 5
    # Constant outcomes: rho_r is undefined (0 by definition), which is never "drifted" (with
    # min_drift_activations = 1 it would otherwise have been at the first activation). The
    # cumulative rho_r (default) pools their raw pairs all the same: 6 activations x 2 pairs.
    assert mem.retired[0].rho_activations == 6 and mem.retired[0].corr.n == 12
    assert not mem.retired[0].corr.defined
    # rho_r = "centred" skips outcome-homogeneous groups: no pairs at all.
    centred = dataclasses.replace(cfg, rho_r="centred")
    mem = _pool(_common(0))
    for step, g in enumerate(seq):
        mem, ev = apply_activation(mem, "c0", [g], centred, step)
    assert [e.reason for e in ev] == ["mastered"]
    assert mem.retired[0].rho_activations == 0 and mem.retired[0].corr.n == 0


def test_retirement_cumulative_rho_drifts_from_the_first_activation():
    # Default (the paper): rho_r = cumulative Pearson of the raw pairs, judged at once.
    # Scores [1, 0] vs F1 [0, 1]: pairs (1, 0), (0, 1): n = 2, Sx = Sy = 1, Sxx = Syy = 1,
    # Sxy = 0 -> rho = (2*0 - 1*1) / sqrt((2*1 - 1) (2*1 - 1)) = -1 < .2 -> "drifted".
    cfg = MemoryConfig(rho_min=0.2, retire_k=100, embedder="hash")
    assert (cfg.rho_r, cfg.min_drift_activations, cfg.rubric_outcome) == ("cumulative", 1, "f1")
    mem, ev = apply_activation(_pool(_common(0)), "c0", [GroupScores((1.0, 0.0), (0.0, 1.0))],
                               cfg, 0)
    assert [e.reason for e in ev] == ["drifted"] and ev[0].rho == pytest.approx(-1.0)
    assert mem.retired[0].corr == CorrStats(2, 1.0, 1.0, 1.0, 1.0, 0.0)
    # An all-wrong batch (F1 0 everywhere): rho_r undefined -> not drifted, pairs kept. A later
    # activation with contrast defines it: pairs (1,0), (0,0), (1,1), (0,0):
    # n = 4, Sx = 2, Sy = 1, Sxx = 2, Syy = 1, Sxy = 1 -> rho = (4 - 2) / sqrt(4 * 3) = .577.
    mem, ev = apply_activation(_pool(_common(0)), "c0", [GroupScores((1.0, 0.0), (0.0, 0.0))],
                               cfg, 0)
    assert ev == () and not mem.common("c0").corr.defined and mem.common("c0").rho == 0.0
    mem, ev = apply_activation(mem, "c0", [GroupScores((1.0, 0.0), (1.0, 0.0))], cfg, 1)
    assert ev == () and mem.common("c0").rho == pytest.approx(2 / math.sqrt(12))
    assert mem.common("c0").rho_activations == 2


def test_retirement_drifted_after_min_activations():
    # rho_r = "centred" (the variant): scores [1, 0] vs outcome [0, 1]: centred pairs
    # (.5, -.5), (-.5, .5) -> rho = -1 < .2.
    # min_drift_activations = 3: judged only from the third informative activation on.
    cfg = MemoryConfig(rho_min=0.2, min_drift_activations=3, retire_k=100, embedder="hash",
                       rho_r="centred")
    anti = GroupScores((1.0, 0.0), (0.0, 1.0))
    mem = _pool(_common(0))
    for step in range(2):
        mem, ev = apply_activation(mem, "c0", [anti], cfg, step)
        assert ev == () and mem.common("c0").rho == pytest.approx(-1.0)
    mem, ev = apply_activation(mem, "c0", [anti], cfg, 2)
    assert [e.reason for e in ev] == ["drifted"]
    gone = mem.retired[0]
    # 3 activations x 2 pairs: n = 6, Sx = Sy = 0, Sxx = Syy = 6 * .25 = 1.5, Sxy = -1.5.
    assert gone.corr == CorrStats(6, 0.0, 0.0, 1.5, 1.5, -1.5)
    assert gone.rho_activations == 3 and gone.rho_history == (-1.0, -1.0, -1.0)


def test_retirement_keeps_an_aligned_rubric_and_mastered_wins_ties():
    cfg = MemoryConfig(rho_min=0.2, min_drift_activations=1, retire_k=0, embedder="hash")
    aligned = GroupScores((1.0, 0.0), (1.0, 0.0))  # rho = +1, Var = .25: neither rule fires
    mem, ev = apply_activation(_pool(_common(0)), "c0", [aligned], cfg, 0)
    assert ev == () and mem.common("c0").rho == pytest.approx(1.0)
    # Low variance (n_r = 1 > 0) AND anti-correlated... both fire; "mastered" is checked first.
    low_anti = GroupScores((0.5, 0.45), (0.0, 1.0))  # Var = .000625 < .01; rho = -1
    mem, ev = apply_activation(_pool(_common(0)), "c0", [low_anti], cfg, 0)
    assert [e.reason for e in ev] == ["mastered"]


def test_retirement_raw_pairs_by_hand():
    # rho_r = "cumulative" (default, the paper) pools raw pairs of every group:
    # x = [1, 0, .5, .5], y = [1, .5, 0, 1]; mean x = .5, mean y = .625
    # dx = [.5, -.5, 0, 0], dy = [.375, -.125, -.625, .375]
    # cov = (.1875 + .0625) / 4 = .0625; var x = .5 / 4 = .125;
    # var y = (.140625 + .015625 + .390625 + .140625) / 4 = .171875
    # rho = .0625 / sqrt(.125 * .171875) = .42640...
    cfg = MemoryConfig(rho_r="cumulative", embedder="hash")
    acts = [GroupScores((1.0, 0.0), (1.0, 0.5)), GroupScores((0.5, 0.5), (0.0, 1.0))]
    r = update_stats(_common(0), acts, cfg)
    assert r.rho == pytest.approx(0.0625 / math.sqrt(0.125 * 0.171875))
    assert r.rho_activations == 1
    # Mean within-group variance = (.25 + 0) / 2 = .125 >= .01: not low variance.
    assert r.n_low_var == 0


def test_retirement_ignores_unusable_groups():
    cfg = MemoryConfig(embedder="hash")
    c = _common(0, n_low_var=2)
    bad = [GroupScores((1.0,), (1.0,)), GroupScores((float("nan"), 1.0), (0.0, 1.0))]
    assert update_stats(c, bad, cfg) == c
    assert update_stats(c, [], cfg) == c


def test_retirement_long_sequence_matches_a_reference_counter():
    cfg = MemoryConfig(delta_v=0.01, retire_k=4, embedder="hash")
    rng = np.random.default_rng(0)
    mem = _pool(_common(0))
    n_ref = 0
    for step in range(200):
        low = bool(rng.random() < 0.7)
        n_ref = n_ref + 1 if low else 0
        mem, ev = apply_activation(mem, "c0", [LOW if low else HIGH], cfg, step)
        if n_ref > 4:
            assert [e.reason for e in ev] == ["mastered"] and mem.commons == ()
            break
        assert ev == () and mem.common("c0").n_low_var == n_ref
    else:
        pytest.fail("a 70% low-variance stream must be retired within 200 steps")


# --- selection ----------------------------------------------------------------------------------


def _with_rho(k: int, rho_sign: float) -> CommonRubric:
    # Pairs (1, s), (0, 0): rho = +1 for s > 0, -1 for s < 0; a third point dilutes it.
    return _common(k, CorrStats().add([1, 0, 0.5], [rho_sign, 0, 0.1]))


def test_selection_top_rho_then_lru_by_hand():
    commons = (_common(0), _with_rho(1, 1.0), _with_rho(2, -1.0))
    assert commons[1].rho > commons[0].rho > commons[2].rho
    mem = RubricMemory(commons=commons, next_id=3)
    # Step 0: top = c1; LRU among c0, c2 (both never used, clock -1) -> older, c0.
    mem, ids, ev = select_active(mem, 10)
    assert ids == ("c1", "c0") and [e.slot for e in ev] == ["top_rho", "lru"]
    assert mem.clock == 1 and mem.common("c0").last_used_clock == 0
    assert mem.common("c1").uses == 1 and mem.common("c2").uses == 0
    # Step 1: LRU among c0 (clock 0) and c2 (-1) -> c2. Step 2: c0 (0) vs c2 (1) -> c0.
    mem, ids, _ = select_active(mem, 11)
    assert ids == ("c1", "c2")
    mem, ids, _ = select_active(mem, 12)
    assert ids == ("c1", "c0") and mem.common("c0").last_used_step == 12


def test_selection_small_pools_and_determinism():
    mem, ids, ev = select_active(RubricMemory(), 0)
    assert ids == () and ev == () and mem.clock == 1
    mem, ids, _ = select_active(RubricMemory(commons=(_common(0),)), 0)
    assert ids == ("c0",)
    pool = RubricMemory(commons=tuple(_common(k) for k in range(4)))
    assert select_active(pool, 5) == select_active(pool, 5)
    assert choose(pool.commons) == (("c0", "top_rho"), ("c1", "lru"))  # all rho 0: oldest


@pytest.mark.parametrize("size", [2, 3, 7])
def test_selection_lru_visits_every_rubric(size):
    mem = RubricMemory(commons=(_with_rho(0, 1.0),) + tuple(_common(k) for k in range(1, size)))
    lru_visits = {c.id: 0 for c in mem.commons}
    for step in range(100 * (size - 1)):
        mem, ids, _ = select_active(mem, step)
        assert len(ids) == 2 and ids[0] == "c0" and ids[1] != "c0"
        lru_visits[ids[1]] += 1
        if step == size - 2:  # after |P| - 1 batches every rubric has been active
            assert all(c.uses > 0 for c in mem.commons)
    # Strict rotation: every non-top rubric gets exactly the same share.
    assert lru_visits == {"c0": 0, **{f"c{k}": 100 for k in range(1, size)}}


