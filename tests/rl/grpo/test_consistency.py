"""PROF consistency filtering (rl.grpo.consistency, algo.consistency_filter=prof): the selection
by hand, against the authors' rule restated here, its configuration checks, and a training
step that updates on the kept trajectories only."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rl.grpo.consistency import prof_keep, prof_metrics
from rl.run.config import ConfigError
from tests.rl.rewarders.test_arbor_e2e import compose_cfg, tiny_overrides, world_dir  # noqa: F401


def test_prof_removes_weak_correct_and_strong_wrong_to_balance_by_hand():
    # 6 correct, 2 wrong, remove 4: delta 4, round((4 + 4) / 2) = 4 correct go, the 4 with the
    # lowest process scores (0.1, 0.2, 0.3, 0.5); 2 correct (0.9, 0.8) and 2 wrong stay
    process = np.array([[0.9, 0.1, 0.5, 0.3, 0.8, 0.2, 0.7, 0.0]])
    correct = np.array([[1, 1, 1, 1, 1, 1, 0, 0]], bool)
    assert prof_keep(process, correct, 4).tolist() == [[1, 0, 0, 0, 1, 0, 1, 1]]
    # 1 correct, 7 wrong: round((-6 + 4) / 2) = -1 <= 0, so 4 wrong go, the highest scored
    process = np.array([[0.0, 0.9, 0.1, 0.8, 0.2, 0.7, 0.3, 0.6]])
    correct = np.array([[1, 0, 0, 0, 0, 0, 0, 0]], bool)
    assert prof_keep(process, correct, 4).tolist() == [[1, 0, 1, 0, 1, 0, 1, 0]]
    # half to even: 4 correct, 2 wrong, remove 3: round(2.5) = 2 correct (lowest), 1 wrong
    process = np.array([[0.4, 0.3, 0.2, 0.1, 0.5, 0.6]])
    correct = np.array([[1, 1, 1, 1, 0, 0]], bool)
    assert prof_keep(process, correct, 3).tolist() == [[1, 1, 0, 0, 1, 0]]
    # 3 and 3, remove 3: round(1.5) = 2 correct, 1 wrong; ties go in group order; a missing
    # score (NaN) is the least consistent on either side
    process = np.array([[0.5, 0.5, 0.5, 0.2, np.nan, 0.2]])
    correct = np.array([[1, 1, 1, 0, 0, 0]], bool)
    assert prof_keep(process, correct, 3).tolist() == [[0, 0, 1, 1, 0, 1]]
    process = np.array([[np.nan, 0.9, 0.9, 0.2, 0.1, 0.2]])
    assert prof_keep(process, correct, 3).tolist() == [[0, 0, 1, 0, 1, 1]]
    # every group loses exactly `remove`; the metrics count by hand
    keep = prof_keep(np.array([[0.9, 0.1, 0.5, 0.3]]), np.array([[1, 1, 0, 0]], bool), 2)
    assert keep.tolist() == [[1, 0, 0, 1]]  # delta 0: round(1) = 1 correct, 1 wrong
    assert prof_metrics(keep, np.array([[1, 1, 0, 0]], bool)) == {
        "prof/removed_correct": 1.0, "prof/removed_wrong": 1.0,
        "prof/correct_frac_before": 0.5, "prof/correct_frac_after": 0.5}


def authors_rule(scores: list[float], correct: list[bool], n_remove: int) -> list[bool]:
    """The selection of the PROF authors' training code restated: each side ranked by the
    outcome-signed process score, ascending, Python's stable sort; returns the kept mask."""
    pos = [(i, s) for i, s in enumerate(scores) if correct[i]]
    neg = [(i, -s) for i, s in enumerate(scores) if not correct[i]]
    n_remove = min(n_remove, len(scores))
    n_pos = min(n_remove, round((len(pos) - len(neg) + n_remove) / 2))
    removed: set[int] = set()
    if n_pos > 0:
        k = min(n_pos, len(pos))
        removed |= {i for i, _ in sorted(pos, key=lambda x: x[1])[:k]}
        if n_remove - k > 0 and neg:
            removed |= {i for i, _ in sorted(neg, key=lambda x: x[1])[:min(n_remove - k,
                                                                           len(neg))]}
    elif neg:
        removed |= {i for i, _ in sorted(neg, key=lambda x: x[1])[:min(n_remove, len(neg))]}
    return [i not in removed for i in range(len(scores))]


@pytest.mark.parametrize("group_size", [4, 5, 8, 12])
def test_prof_equals_the_authors_rule_on_random_groups(group_size):
    rng = np.random.default_rng(group_size)
    for _ in range(200):
        process = rng.choice([-0.5, 0.0, 0.25, 0.5], size=(1, group_size))  # ties on purpose
        correct = rng.random((1, group_size)) < rng.random()
        remove = int(rng.integers(1, group_size - 1))
        got = prof_keep(process, correct, remove)[0].tolist()
        assert got == authors_rule(process[0].tolist(), correct[0].tolist(), remove)
        assert sum(got) == group_size - remove  # exactly `remove` go from every group


@pytest.mark.parametrize("overrides, message", [
    (["algo=grpo", "algo.consistency_filter=prof"], "algo.consistency_filter: prof ranks"),
    (["algo=arbor", "judge=rule", "algo.consistency_filter=prof", "algo.consistency_remove=3"],
     "algo.consistency_remove: must be in [1, algo.group_size - 2]"),
    (["algo=arbor", "judge=rule", "algo.consistency_filter=prf"],
     "algo.consistency_filter: must be one of"),
])
def test_prof_settings_are_checked_by_name(overrides, message):
    from rl.run.config import check, parse

    cfg = compose_cfg(*overrides, "trainer.run_dir=x")
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        check(parse(cfg))


def test_prof_step_updates_on_the_kept_trajectories(tmp_path, world_dir):  # noqa: F811
    """One RaR step on the scripted search task (hand-written trajectories: a mixed group of a
    good searcher, a lazy guesser, a question copier and a broken format): the update's batch
    holds G - r trajectories per group, the kept ones are the authors' choice from the step's
    own rubric scores, and the records say what was removed."""
    from rl.run import loop as L
    from rl.run.trainer import build_trainer

    over = [o.replace("algo=arbor", "algo=rar") for o in tiny_overrides(
        tmp_path / "run", world_dir, "task.name=search_qa_scripted",
        "algo.consistency_filter=prof", "algo.consistency_remove=2", "trainer.max_steps=1",
        "trainer.save_every=0") if o != "algo.embedder=hashing"]
    trainer = build_trainer(compose_cfg(*over))
    seen = {}
    layout = L.batch_layout

    def spy(c, groups, advantages):
        seen["groups"], seen["advantages"] = groups, np.asarray(advantages)
        return layout(c, groups, advantages)

    collect = L.collect

    def spy_collect(c, loop):
        loop, col = collect(c, loop)
        seen["col"] = col
        return loop, col

    L.batch_layout, L.collect = spy, spy_collect
    try:
        trainer.run()
    finally:
        L.batch_layout, L.collect = layout, collect
        trainer.close()
    col = seen["col"]
    process = np.array([[r["rubric_score"] for r in g] for g in col.out.per_traj])
    correct = np.asarray(col.out.outcome) >= 1.0
    # the mixed group gives the rule something to choose: a right answer, process scores apart
    assert correct[0].any() and np.ptp(process[0]) > 0
    expected = [authors_rule(p.tolist(), c.tolist(), 2) for p, c in zip(process, correct)]
    for g, kept, mask in zip(seen["groups"], col.groups, expected):
        assert g.trajectories == tuple(t for t, k in zip(kept.trajectories, mask) if k)
    assert seen["advantages"].shape == (2, 2)
    # PROF pays the kept trajectories their outcome alone (algo.consistency_reward=outcome):
    # GRPO's advantage of the kept outcomes, (o - mean) / (sample std + eps), written here
    for adv, mask, out in zip(seen["advantages"], expected, col.out.outcome):
        o = np.asarray(out)[np.asarray(mask)]
        want = np.zeros(2) if o[0] == o[1] else (o - o.mean()) / (np.std(o, ddof=1) + 1e-6)
        np.testing.assert_allclose(adv, want, rtol=1e-5, atol=1e-6)
    rec = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    removed = ~np.array(expected)
    assert rec[-1]["prof/removed_correct"] == (removed & correct).sum()
    assert rec[-1]["prof/removed_wrong"] == (removed & ~correct).sum() == 4 - rec[-1][
        "prof/removed_correct"]
    assert rec[-1]["prof/reward_mean_before"] == pytest.approx(np.mean(col.out.rewards))
