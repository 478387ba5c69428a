"""Sparse pairwise judging and consolidation of drafts into the common pool."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from judges import (
    TIE,
    Draft,
    FallbackDrafts,
    PairResult,
    RuleJudge,
)
from memory import (
    GRAPHS,
    ConsolidationFailed,
    MemoryConfig,
    Merged,
    RubricMemory,
    bradley_terry_scores,
    build_pair_requests,
    centre,
    consolidate,
    edge_wins,
    evidence_scores,
    fallback_mask,
    group_scores,
    ring_diameter_graph,
    winrate_scores,
)
from memory.consolidation import merge_or_add
from tests.memory.helpers import (
    HASH,
    D,
    Recorder,
    _common,
    _drafts,
)

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


