"""Blind both-orders pairwise comparison: win rate and position bias on scripted judges whose
verdicts are written here, CIs against a numpy reference, the CLI and its input errors."""

import json

import numpy as np
import pytest

import rewards.bundle
from judges.base import order_coin
from judges.types import TIE, PairResult
from rewards.compare import (
    AnswerPair,
    CompareInputError,
    compare_runs,
    load_answers,
    main,
    pair_answers,
)


class ScriptedJudge:
    """Shows the pair in the order of the real judges' coin; ``script(first, second)`` says
    which shown position wins: "first", "second" or "tie"."""

    def __init__(self, script, seed=0, sort_order=False):
        self.script, self.seed, self.sort_order = script, seed, sort_order
        self.shown = []

    def compare(self, reqs):
        out = []
        for r in reqs:
            # sort_order: a judge that orders by content (smaller text first), not by the coin
            a_first = r.a <= r.b if self.sort_order else order_coin(self.seed, r)
            first, second = (r.a, r.b) if a_first else (r.b, r.a)
            self.shown.append((first, second))
            w = self.script(first, second)
            if w == "tie":
                out.append(PairResult(TIE, 0.5, a_first, tie_break=0))
            else:
                winner = 0 if (w == "first") == a_first else 1
                out.append(PairResult(winner, 1.0 - winner, a_first))
        return out


def always_first(first, second):
    return "first"


def by_quality(first, second):
    """"good" beats an answer without it; equal quality ties."""
    qf, qs = "good" in first, "good" in second
    return "tie" if qf == qs else ("first" if qf else "second")


def quality_then_first(first, second):
    """Quality decides; between equals, the first shown wins (bias only on ties)."""
    w = by_quality(first, second)
    return "first" if w == "tie" else w


def pairs(*ab):
    return [AnswerPair("test", str(i), f"q{i}", a, b) for i, (a, b) in enumerate(ab)]


def test_every_pair_is_shown_once_each_way():
    judge = ScriptedJudge(always_first)
    ps = pairs(("a0", "b0"), ("a1", "b1"), ("a2", "b2"))
    compare_runs(ps, judge, "c")
    for i in range(3):
        assert {judge.shown[2 * i], judge.shown[2 * i + 1]} == {(f"a{i}", f"b{i}"),
                                                                  (f"b{i}", f"a{i}")}


def test_a_judge_that_always_picks_the_first_answer():
    # each pair: A wins when shown first, B when shown first -> v = 1, 0, s = 1/2, a tie
    s, rows = compare_runs(pairs(("x", "y"), ("u", "v")), ScriptedJudge(always_first), "c")
    assert s["win_rate"] == 0.5 and s["outcomes"]["tie"]["rate"] == 1.0
    assert s["position"]["first_shown_rate"] == 1.0 and s["position"]["first_shown_wins"] == 1.0
    assert s["position"]["flip_rate"] == 1.0 and s["position"]["strict_flip_rate"] == 1.0
    assert s["verdicts"] == {"a": 2, "b": 2, "tie": 0}
    assert all(r["both_orders"] for r in rows) and s["position"]["pairs_one_order"] == 0


def test_an_order_blind_judge_has_no_position_bias():
    ps = pairs(("good", "bad"), ("bad", "good"), ("good", "good too"), ("bad", "worse"))
    s, rows = compare_runs(ps, ScriptedJudge(by_quality), "c")
    assert [r["outcome"] for r in rows] == ["win", "loss", "tie", "tie"]
    assert s["win_rate"] == pytest.approx((1 + 0 + 0.5 + 0.5) / 4)
    assert s["outcomes"]["win"]["rate"] == 0.25 and s["outcomes"]["loss"]["rate"] == 0.25
    assert s["position"]["first_shown_rate"] == 0.5  # quality cancels over the two orders
    assert s["position"]["flip_rate"] == 0.0 and s["position"]["ties"] == 0.5


def test_bias_on_ties_only():
    ps = pairs(("good", "bad"), ("good", "good"), ("bad", "bad"))
    s, rows = compare_runs(ps, ScriptedJudge(quality_then_first), "c")
    # pair 0: A both times (s 1, first-shown 1 then 0); pairs 1, 2: first wins (s 1/2, fs 1)
    assert s["win_rate"] == pytest.approx(2 / 3)
    assert s["outcomes"]["win"]["rate"] == pytest.approx(1 / 3)
    assert s["outcomes"]["tie"]["rate"] == pytest.approx(2 / 3)
    assert s["position"]["first_shown_rate"] == pytest.approx((0.5 + 1 + 1) / 3)
    assert s["position"]["flip_rate"] == pytest.approx(2 / 3)


def test_a_win_in_one_order_and_a_tie_in_the_other_is_a_win_and_a_soft_flip():
    def first_good_wins(first, second):
        return "first" if "good" in first and "good" not in second else "tie"

    s, [r] = compare_runs(pairs(("good", "bad")), ScriptedJudge(first_good_wins), "c")
    assert r["score_a"] == 0.75 and r["outcome"] == "win"
    assert r["flip"] and not r["strict_flip"]
    assert s["position"]["first_shown_rate"] == 0.75  # verdicts: first won (1), tie (1/2)


def test_intervals_are_the_bootstrap_over_pairs_with_the_seed():
    ps = pairs(("good", "bad"), ("bad", "good"), ("good", "x good"), ("good", "bad"),
               ("bad", "bad"), ("good", "bad"))
    s, rows = compare_runs(ps, ScriptedJudge(quality_then_first), "c", seed=5, n_boot=300,
                           level=0.8)
    score = np.array([1, 0, 0.5, 1, 0.5, 1])  # by hand from quality_then_first
    assert [r["score_a"] for r in rows] == list(score)
    rng = np.random.default_rng(5)
    idx = rng.integers(0, 6, (300, 6))
    ref = np.quantile(score[idx].mean(axis=1), [0.1, 0.9])
    assert s["win_rate_ci"] == pytest.approx(tuple(ref))
    win = (score > 0.5).astype(float)
    assert s["outcomes"]["win"]["ci"] == pytest.approx(
        tuple(np.quantile(win[idx].mean(axis=1), [0.1, 0.9])))


def test_a_judge_that_ignores_the_seed_is_reported():
    # "x" shown first in both requests: one order only
    s, rows = compare_runs(pairs(("x", "y")), ScriptedJudge(always_first, sort_order=True), "c")
    assert s["position"]["pairs_one_order"] == 1 and not rows[0]["both_orders"]


# --- input ----------------------------------------------------------------------------------


def _run(tmp_path, name, rows):
    d = tmp_path / name
    d.mkdir()
    (d / "eval_samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def _rows(responses, split="test"):
    return [{"split": split, "id": f"p{i}", "question": f"q{i}?", "response": t}
            for i, t in enumerate(responses)]


def test_answers_pair_by_split_and_id(tmp_path):
    a = _run(tmp_path, "a", _rows(["x", "y", "z"]))
    b = _run(tmp_path, "b", _rows(["u", "v"]) + _rows(["w"], split="dev"))
    ps = pair_answers(load_answers(a), load_answers(b))
    assert [(p.id, p.a, p.b) for p in ps] == [("p0", "x", "u"), ("p1", "y", "v")]
    assert load_answers(b, split="dev").keys() == {("dev", "p0")}


@pytest.mark.parametrize("rows_b, message", [
    (_rows(["u"], split="dev"), "no common prompts"),
    ([{"split": "test", "id": "p0", "question": "q0?"}], "row 1: field 'response' missing"),
    (_rows(["u"]) + _rows(["u"]), "row 2: (split 'test', id 'p0') repeated"),
    ([{"split": "test", "id": "p0", "question": "other?", "response": "u"}],
     "different questions"),
])
def test_bad_input_is_named(tmp_path, rows_b, message):
    a = _run(tmp_path, "a", _rows(["x"]))
    b = _run(tmp_path, "b", rows_b)
    with pytest.raises(CompareInputError) as e:
        pair_answers(load_answers(a), load_answers(b))
    assert message in str(e.value)


def test_a_folder_without_answers_is_named(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CompareInputError, match="empty: run folder without eval_samples.jsonl"):
        load_answers(tmp_path / "empty")


# --- command line ---------------------------------------------------------------------------


def test_cli_with_the_rule_judge(tmp_path, capsys):
    a = _run(tmp_path, "a", _rows(["Sleep early because it helps.", "Drink water.",
                                  "Rest, because it heals."]))
    b = _run(tmp_path, "b", _rows(["Sleep early.", "Drink water, because it helps.",
                                  "Rest because it heals."]))
    out = tmp_path / "out"
    assert main([str(a), str(b), str(out), "judge=rule", r"criterion=iregex:\bbecause\b"]) == 0
    # rule "because": p0 A has it, B not -> win; p1 the reverse -> loss; p2 both -> tie
    summary = json.loads((out / "compare_summary.json").read_text())
    assert summary["n_pairs"] == 3 and summary["win_rate"] == pytest.approx(0.5)
    assert [summary["outcomes"][o]["rate"] for o in ("win", "tie", "loss")] == \
        pytest.approx([1 / 3, 1 / 3, 1 / 3])
    assert summary["position"]["first_shown_rate"] == 0.5  # the rule judge is order-blind
    assert summary["judge_stats"]["requests_compare"] == 6
    pairs_out = [json.loads(x) for x in (out / "compare_pairs.jsonl").read_text().splitlines()]
    assert [p["outcome"] for p in pairs_out] == ["win", "loss", "tie"]
    printed = capsys.readouterr().out
    assert "win rate (ties 1/2)" in printed and "first-shown wins" in printed


def test_cli_names_bad_input_before_building_a_judge(tmp_path, capsys, monkeypatch):
    built = []
    monkeypatch.setattr(rewards.bundle, "judge_from_args", lambda *a: built.append(a))
    a = _run(tmp_path, "a", _rows(["x"]))
    b = _run(tmp_path, "b", _rows(["y"], split="dev"))
    assert main([str(a), str(b), str(tmp_path / "o"), "criterion=iregex:x"]) == 2
    assert "no common prompts" in capsys.readouterr().err
    assert main([str(a), str(tmp_path / "missing"), str(tmp_path / "o"),
                 "criterion=iregex:x"]) == 2
    assert "missing: no such run folder" in capsys.readouterr().err
    assert main([str(a), str(a), str(tmp_path / "o"), "judge=rule"]) == 2
    assert "not a rule it can read" in capsys.readouterr().err
    assert main([str(a), str(a), str(tmp_path / "o"), "colour=red"]) == 2
    assert built == []
