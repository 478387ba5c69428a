"""bench.gaming_demo's summary, from a run folder written by hand: the quarters, the alerts, and
the held-out copying counted on the answers."""

import json

import pytest

from bench.arbor_experiment import Budget
from bench.gaming_demo import ARMS, BAIT, run_stats, train_command


def test_run_stats_reads_quarters_alerts_and_heldout_copying(tmp_path):
    steps = [{"step": i, "reward/mean": 0.0, "outcome/mean": o, "gaming/copied_titles": c,
              **({"gaming/copy_corr": k} if k is not None else {})}
             for i, (o, c, k) in enumerate([(-1.0, 0.0, None), (0.0, 1.0, 0.5),
                                            (0.5, 2.0, 0.7), (0.25, 3.0, None)])]
    (tmp_path / "metrics.jsonl").write_text("".join(
        json.dumps(r) + "\n" for r in [{"step": 0, "eval/outcome_mean": 0.1}, *steps]))
    (tmp_path / "alerts.jsonl").write_text('{"metric": "gaming/copy_corr"}\n' * 2)
    (tmp_path / "eval.json").write_text(json.dumps({"results": {"average": {"f1": 0.25}}}))
    info = "<information>Doc 1(Title: Louvre) a. Doc 2(Title: Mona Lisa) b.</information>"
    answers = [f"{info}<think>Louvre</think><answer>Mona Lisa</answer>",  # 2 copied
               f"{info}<answer>Paris</answer>"]                             # 0 copied
    (tmp_path / "eval_samples.jsonl").write_text("".join(
        json.dumps({"response": a}) + "\n" for a in answers))
    got = run_stats(tmp_path)
    assert got["steps"] == 4  # the evaluation record is not a training step
    assert (got["copied_first"], got["copied_last"]) == (0.0, 3.0)  # a quarter of 4 steps: 1
    assert (got["outcome_first"], got["outcome_last"]) == (-1.0, 0.25)
    assert got["copy_corr"] == pytest.approx(0.6) and got["alerts"] == 2.0
    assert got["heldout_f1"] == 0.25 and got["heldout_copied"] == 1.0


def test_the_arms_differ_only_in_the_gate(tmp_path):
    cmds = {arm: train_command(arm, 0, tmp_path / arm, Budget(), [], None) for arm in ARMS}
    assert f"algo.rubrics_path={BAIT}" in cmds["additive"]
    differ = set(cmds["additive"]) ^ set(cmds["positive_only"])
    assert {c for c in differ if str(tmp_path) not in c} == {
        "algo.rubric_gate=none", "algo.rubric_gate=positive_only", "algo.correct_at=1.0"}


def test_scripted_trajectories_and_the_listing_premium_by_hand():
    from bench.gaming_demo import listing_premium, scripted_text
    from core.search_r1 import cited_titles, copied_titles, extract_answer, is_valid_format

    listing = scripted_text("Paris", "q1", right=True, listing=True)
    plain = scripted_text("Paris", "q1", right=False, listing=False)
    assert is_valid_format(listing) and is_valid_format(plain)
    assert (cited_titles(listing), copied_titles(listing)) == (2, 2)
    assert (cited_titles(plain), copied_titles(plain)) == (0, 0)
    assert extract_answer(listing) == "Paris" and extract_answer(plain) == "zzyzx"
    samples = [{"response": listing, "outcome": 1.0, "reward": 1.5},
               {"response": plain, "outcome": 1.0, "reward": 1.0},
               {"response": listing, "outcome": 0.0, "reward": 0.25},
               {"response": plain, "outcome": 0.0, "reward": 0.0},
               {"response": plain, "outcome": 0.0, "reward": -0.5}]
    assert listing_premium(samples) == {"premium_wrong": 0.25 - (-0.25), "premium_right": 0.5}
