"""The ProRubric authors' incentive-audit edits: the rule stand-ins on a hand-built rubric, the
model writer against a loopback server, and the audit's numbers worked out by hand.

The rubric (rule judge; sum of desirable weights Z = 4 + 1 + 3 + 5 = 13):

    0  Mentions: a dark room          w 4   iregex \\bdark
    1  Explains why: a dark room      w 1   dark ... because (same sentence)
    2  Mentions: no late caffeine     w 3   iregex \\bcaffeine
    3  Mentions: a fixed schedule     w 5   iregex \\bschedule
    4  Pitfall: double dose           w -3

dimensions D1 = {0, 1} (W 5) and D2 = {2, 3, 4} (W 3 + 5 + 3 = 11).  The untrained answer
"Keep a fixed schedule every day. Try reading before bed." meets only criterion 3:
additive 5/13, ProRubric 0 (D2 needs caffeine too).
"""

import json

import pytest

from judges.rule import RuleJudge
from rewards.audit_edits import (
    GENERIC_TOPICS,
    EditCase,
    ModelEditor,
    rule_edit,
    topic_label,
    word_budget,
)
from rewards.perturb import AuditOptions, load_answers, main, perturbation_analysis
from rewards.rubric import Criterion, Dimension, Rubric
from rewards.rubric_io import save_rubrics

ANSWER = "Keep a fixed schedule every day. Try reading before bed."
REFERENCE = ("Keep a fixed schedule, because your body clock adapts. Keep the room dark, "
             "because light delays sleep. Avoid caffeine after noon, since it lingers for "
             "hours.")
MET = (False, False, False, True, False)


def _rubric(pid: str = "sleep") -> Rubric:
    crit = (Criterion(r"iregex:\bdark", 4.0, ("mention",), "Mentions: a dark room"),
            Criterion(r"iregex:\bdark[^.]*\bbecause", 1.0, ("explain",),
                      "Explains why: a dark room"),
            Criterion(r"iregex:\bcaffeine", 3.0, ("mention",), "Mentions: no late caffeine"),
            Criterion(r"iregex:\bschedule", 5.0, ("mention",), "Mentions: a fixed schedule"),
            Criterion(r"iregex:double dose", -3.0, ("pitfall",), "Pitfall: double dose"))
    dims = (Dimension("dark room", (0, 1)), Dimension("routine", (2, 3, 4)))
    return Rubric(pid, "How can I sleep better?", crit, dims, reference_answer=REFERENCE)


def _case(seed: int = 0) -> EditCase:
    return EditCase("How can I sleep better?", ANSWER, _rubric(), MET, seed)


def test_topic_labels_read_titles_and_natural_language_criteria():
    assert topic_label(Criterion("iregex:x", 1.0, (), "Mentions: log off")) == "log off"
    assert topic_label(Criterion("The response advises rest and fluids.", 1.0)) == (
        "rest and fluids")
    assert topic_label(Criterion("Recommends seeing a doctor if the fever lasts; (urgent)",
                                 1.0)) == "seeing a doctor if the fever lasts"
    assert topic_label(Criterion(r"iregex:\bdark", 1.0)) is None  # a bare rule names nothing


def test_rule_stand_ins_make_the_edits_worked_out_by_hand():
    c = _case()
    assert rule_edit("E1", c) == (ANSWER + "\n\nOther points worth keeping in mind: a dark room "
                                  "and no late caffeine.")  # unmet, heaviest first, one per topic
    assert rule_edit("E2", c) == ANSWER + "\n\nAlso consider a dark room."  # 1's first part
    assert rule_edit("E4", c) == "Try reading before bed."  # the sentence meeting criterion 3
    assert rule_edit("E6", c) == (ANSWER + "\n\nKeep the room dark, because light delays sleep. "
                                  "Avoid caffeine after noon, since it lingers for hours.")
    e1b = rule_edit("E1b", c)
    named = [t for t in GENERIC_TOPICS if t in e1b]
    assert len(named) == 4 and "dark" not in e1b and e1b.startswith(ANSWER + "\n\nOther points")
    assert rule_edit("E1b", c) == e1b  # seeded
    assert rule_edit("E3", c).startswith(ANSWER + " ")


def test_rule_stand_ins_return_none_where_the_rubric_cannot_build_the_edit():
    all_met = EditCase("q", ANSWER, _rubric(), (True, True, True, True, False))
    assert rule_edit("E1", all_met) is None and rule_edit("E2", all_met) is None
    nothing_met = EditCase("q", ANSWER, _rubric(), (False,) * 5)
    assert rule_edit("E4", nothing_met) is None
    no_ref = EditCase("q", ANSWER, Rubric("x", "q", _rubric().criteria), MET)
    assert rule_edit("E6", no_ref) is None
    with pytest.raises(ValueError, match="E7.*needs a writer"):
        rule_edit("E7", _case())


def test_word_budgets_follow_the_authors_sizing():
    assert word_budget("E7", "a b c d", "a b c d e f g") == 3  # E6's addition
    assert word_budget("E7", "a b c d", None) is None
    assert word_budget("E6L", "a b c d e f g h i j", None) == 5  # half the answer
    assert word_budget("E1", "a b", None) is None


def test_the_audit_of_an_untrained_answer_matches_the_hand_computation():
    ops = ("E1", "E2", "E4", "E6", "rescore")
    res = perturbation_analysis([_rubric()], RuleJudge(), ("additive", "prorubric"), ops, 0,
                                AuditOptions(paraphrases=0, n_boot=50,
                                             answers={"sleep": ANSWER}))
    t = res["table"]
    # additive: E1 names dark + caffeine (+4 +3), E2 meets 0 only (+4), E4 loses 3 (-5),
    # E6 meets 0, 1, 2 (+8); ProRubric: E1 completes D2 (+11/16), E2 completes nothing,
    # E4 empties D2 (already 0), E6 completes both (+1).
    assert t["E1"]["additive"] == pytest.approx(7 / 13)
    assert t["E2"]["additive"] == pytest.approx(4 / 13)
    assert t["E4"]["additive"] == pytest.approx(-5 / 13)
    assert t["E6"]["additive"] == pytest.approx(8 / 13)
    assert t["E1"]["prorubric"] == pytest.approx(11 / 16)
    assert t["E2"]["prorubric"] == 0.0 and t["E4"]["prorubric"] == 0.0
    assert t["E6"]["prorubric"] == pytest.approx(1.0)
    assert t["rescore"]["additive"] == 0.0
    rows = {(r["operator"], r["column"]): r for r in res["rows"]}
    assert rows[("E1", "additive")]["frac_higher"] == 1.0
    assert rows[("E2", "prorubric")]["unmoved"] == 1
    assert res["no_edit"] == {"E1": 0, "E2": 0, "E4": 0, "E6": 0}


def test_families_that_need_a_writer_are_refused_before_judging():
    with pytest.raises(ValueError, match=r"\['E7L'\] need a writer"):
        perturbation_analysis([_rubric()], RuleJudge(), ("additive",), ("E1", "E7L"))
    with pytest.raises(ValueError, match="aggregators: unknown aggregator 'nope'"):
        perturbation_analysis([_rubric()], RuleJudge(), ("nope",), ("E1",))


def test_the_model_writer_retries_unchanged_replies_and_counts_what_stays_missing():
    from judges.openai import OpenAIBackend
    from rewards.audit_edits import write_edits
    from tests.judge_server import FakeJudgeServer

    retried = EditCase("q", "Sleep more. FAULT[same*1]", _rubric(), MET)
    stuck = EditCase("q", "Rest. FAULT[same*all]", _rubric(), MET)
    with FakeJudgeServer() as srv:
        editor = ModelEditor(OpenAIBackend(base_url=srv.base_url, max_retries=0))
        out = editor.edit("E3", [_case(), retried, stuck])
        sized = write_edits("E7", [_case(), retried], editor, [ANSWER + " one two", None])
    assert out[0] == ANSWER + " [edited] Add"
    assert out[1] == "Sleep more. FAULT[same*1] [edited] Add"  # second try, temperature 0.7
    assert out[2] is None and editor.failed == 1
    assert sized == [ANSWER + " [edited] Work", None]  # no E6 addition: no E7 budget
    assert editor.requests == (3 + 2 + 1) + 1  # E3: rounds of 3, 2, 1; E7: one sized case


def test_the_command_line_audits_an_answers_file(tmp_path, capsys):
    rubrics = tmp_path / "r.jsonl"
    save_rubrics([_rubric("a"), _rubric("b")], rubrics)
    answers = tmp_path / "eval_samples.jsonl"
    answers.write_text("".join(json.dumps(r) + "\n" for r in [
        {"split": "test", "id": "a", "response": ANSWER},
        {"split": "test", "id": "a", "sample": 1, "response": "ignored"},
        {"split": "test", "id": "b", "response": REFERENCE}]))
    assert main([str(rubrics), str(tmp_path / "out"), f"answers={answers}", "operators=authors",
                 "aggregators=additive", "paraphrases=0", "n_boot=20"]) == 0
    out = capsys.readouterr().out
    assert "additive: reward change x 100" in out and "(1 not editable)" in out
    table = json.loads((tmp_path / "out" / "perturb_table.json").read_text())
    # answer a gains 7/13 from E1; b (the reference) meets everything: E1 cannot edit it
    assert table["table"]["E1"]["additive"] == pytest.approx(7 / 13)
    assert table["config"]["no_edit"]["E1"] == 1
    assert main([str(rubrics), str(tmp_path / "o2"), "operators=E7"]) == 2
    assert "need a writer" in capsys.readouterr().err


def test_answers_files_are_checked_row_by_row(tmp_path):
    bad = tmp_path / "ans.jsonl"
    bad.write_text('{"id": "a", "response": "x"}\n{"id": "zz", "response": "y"}\n')
    with pytest.raises(ValueError, match=r"ans.jsonl: row 2: prompt_id 'zz' is not in"):
        load_answers(bad, ["a"])
    bad.write_text('{"id": "a"}\n')
    with pytest.raises(ValueError, match=r"row 1: field 'response' or 'text'"):
        load_answers(bad, ["a"])


def test_the_command_line_has_a_model_write_the_edits(tmp_path, capsys):
    from tests.judge_server import FakeJudgeServer

    rubrics = tmp_path / "r.jsonl"
    save_rubrics([_rubric("a")], rubrics)
    answers = tmp_path / "a.jsonl"
    answers.write_text(json.dumps({"id": "a", "response": ANSWER}) + "\n")
    with FakeJudgeServer() as srv:
        rc = main([str(rubrics), str(tmp_path / "out"), f"answers={answers}",
                   "operators=E4,E7L", "aggregators=additive", "paraphrases=0", "n_boot=20",
                   "edit=openai", f"edit.base_url={srv.base_url}", "edit.cache_dir=null"])
    assert rc == 0, capsys.readouterr().err
    cases = [json.loads(x) for x in (tmp_path / "out" / "perturb_cases.jsonl").open()]
    by_op = {c["operator"]: c["text"] for c in cases}
    # the loopback writer drops E4's first sentence and tags E7L, budget ignored
    assert by_op == {"E4": "Try reading before bed.", "E7L": ANSWER + " [edited] Work"}
    table = json.loads((tmp_path / "out" / "perturb_table.json").read_text())
    assert table["table"]["E4"]["additive"] == pytest.approx(-5 / 13)
    assert table["config"]["edit_requests"] == 2 and table["config"]["edit_failures"] == 0
    assert main([str(rubrics), str(tmp_path / "o2"), "edit=openai", "edit.nope=1"]) == 2
    assert "unknown OpenAI judge option(s): nope" in capsys.readouterr().err
