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
    edit_target,
    rule_edit,
    topic_label,
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


E6_TEXT = (ANSWER + "\n\nKeep the room dark, because light delays sleep. Avoid caffeine after "
           "noon, since it lingers for hours.")  # E6 adds 2 + 47 + 1 + 54 = 104 characters
# E1's sentences, 52 and 57 characters: "A dark room " / "No late caffeine " + the template's
# 40-character "is also an important consideration here."
NAMING = ("A dark room is also an important consideration here. No late caffeine is also an "
          "important consideration here.")
LONG = ("Dim the lights at night. A cool room helps sleep. Keep a steady schedule. Try reading "
        "before bed. Skip coffee after noon. Get light each morning.")  # 145 characters


def test_rule_stand_ins_make_the_edits_worked_out_by_hand():
    c = _case()
    assert rule_edit("E6", c) == E6_TEXT
    # unmet desirable topics, heaviest first, once each ("a dark room" of 0 and 1 once)
    assert rule_edit("E1", c) == ANSWER + "\n\n" + NAMING
    # sized to E6's 104 added characters (a paragraph of 102 after the break): 52 alone is 50
    # off, 52 + 1 + 57 = 110 is 8 off, a third sentence (47) would be 56 off: two sentences
    assert rule_edit("E1", c, E6_TEXT) == ANSWER + "\n\n" + NAMING
    # a budget of 300 names the two topics again in the next phrasings until closest
    big = rule_edit("E1", c, ANSWER + "x" * 302)
    assert big.startswith(ANSWER + "\n\n" + NAMING + " The role of a dark room should be kept")
    assert abs(len(big) - len(ANSWER) - 302) <= 30
    e1b = rule_edit("E1b", c, E6_TEXT)
    named = [t for t in GENERIC_TOPICS if t.lower() in e1b.lower()]
    assert len(named) >= 1 and "dark" not in e1b and e1b.startswith(ANSWER + "\n\n")
    assert abs(len(e1b) - len(E6_TEXT)) <= 30  # naming and substance at about equal size
    assert rule_edit("E1b", c, E6_TEXT) == e1b  # seeded
    assert rule_edit("E3", c).startswith(ANSWER + " ")


def test_e2_half_meets_a_compound_item_and_never_fully_meets_another():
    """Criterion 1 ("Explains why: a dark room") asks for a dark room, then a reason. Its first
    part is criterion 0's whole topic: while 0 is unmet, "Also consider a dark room." would
    fully meet 0, so there is no E2; once 0 is met it half-meets 1 (no reason given)."""
    assert rule_edit("E2", _case()) is None
    met0 = EditCase("q", ANSWER, _rubric(), (True, False, False, True, False))
    assert rule_edit("E2", met0) == ANSWER + "\n\nAlso consider a dark room."


def test_e4_deletes_the_key_sentence_chosen_without_the_rubric():
    """Six sentences of 23-24 characters in 145: each fits the authors' bounds (20 to
    min(600, .2 x 145 = 29) characters); the one sharing a word with the question ("sleep")
    goes, whatever the rubric says. The fixture's two-sentence answer (56 characters) has no
    sentence of at most 11: no E4."""
    long = EditCase("How can I sleep better?", LONG, _rubric(), MET)
    assert rule_edit("E4", long) == LONG.replace("A cool room helps sleep. ", "")
    assert rule_edit("E4", _case()) is None


def test_the_e1b_leak_check_reads_the_checklists_words():
    from rewards.audit_edits import generic_padding_leaks

    c = _case()
    assert not generic_padding_leaks(c, ANSWER + "\n\nTiming is also worth keeping in mind.")
    assert generic_padding_leaks(c, ANSWER + "\n\nCaffeine is also worth keeping in mind.")


def test_rule_stand_ins_return_none_where_the_rubric_cannot_build_the_edit():
    all_met = EditCase("q", ANSWER, _rubric(), (True, True, True, True, False))
    assert rule_edit("E1", all_met) is None and rule_edit("E2", all_met) is None
    no_ref = EditCase("q", ANSWER, Rubric("x", "q", _rubric().criteria), MET)
    assert rule_edit("E6", no_ref) is None
    with pytest.raises(ValueError, match="E7.*needs a writer"):
        rule_edit("E7", _case())


def test_edit_targets_follow_the_authors_sizing_in_characters():
    assert edit_target("E7", "abcd", "abcdefg") == 3  # E6's addition
    assert edit_target("E7", "a" * 100, None) == 18  # 18 % of the answer without an E6
    assert edit_target("E6L", "a" * 10, None) == 5 == edit_target("E7L", "a" * 10, None)
    # E1: a padding the size of E6's, its paragraph break left out
    assert edit_target("E1", "ab", None) is None and edit_target("E1", "ab", "ab\n\nxyz") == 3


def test_the_audit_of_an_untrained_answer_matches_the_hand_computation():
    ops = ("E1", "E2", "E4", "E6", "rescore")
    res = perturbation_analysis([_rubric()], RuleJudge(), ("additive", "prorubric"), ops, 0,
                                AuditOptions(paraphrases=0, n_boot=50,
                                             answers={"sleep": ANSWER}))
    t = res["table"]
    # additive: E1 names dark + caffeine, which the keyword rules take as met (+4 +3); E6
    # meets 0, 1, 2 (+8). ProRubric: E1 completes D2 (+11/16), E6 both dimensions (+1).
    assert t["E1"]["additive"] == pytest.approx(7 / 13)
    assert t["E6"]["additive"] == pytest.approx(8 / 13)
    assert t["E1"]["prorubric"] == pytest.approx(11 / 16)
    assert t["E6"]["prorubric"] == pytest.approx(1.0)
    assert t["rescore"]["additive"] == 0.0
    rows = {(r["operator"], r["column"]): r for r in res["rows"]}
    assert rows[("E1", "additive")]["frac_higher"] == 1.0
    # E2 and E4 cannot be built on this answer (test_e2_..., test_e4_...)
    assert res["no_edit"] == {"E1": 0, "E2": 1, "E4": 1, "E6": 0}
    assert rows[("E2", "additive")]["n"] == 0
    # the unedited answer: additive 5/13, ProRubric 0 (it cannot fall there)
    assert res["originals"]["additive"] == {"mean": pytest.approx(5 / 13), "above_zero": 1.0,
                                            "n": 1}
    assert res["originals"]["prorubric"]["above_zero"] == 0.0
    assert res["added_chars"]["E6"] == 104 and res["added_chars"]["E1"] == 2 + 110


def test_e1b_clean_and_the_medical_subset_and_the_stand_ins_marked_not_comparable(
        tmp_path, capsys):
    """Two answers; E1b's generic labels never name the sleep checklist's words, so E1b_clean
    keeps both. A labels file marks answer "a" medical: the subset rows read it alone. E3's
    stand-in is reported as not comparable."""
    rubrics = tmp_path / "r.jsonl"
    save_rubrics([_rubric("a"), _rubric("b")], rubrics)
    answers = tmp_path / "ans.jsonl"
    answers.write_text("".join(json.dumps({"id": i, "response": ANSWER}) + "\n"
                               for i in ("a", "b")))
    labels = tmp_path / "labels.jsonl"
    labels.write_text('{"id": "a", "medical": true}\n{"id": "b", "medical": false}\n')
    assert main([str(rubrics), str(tmp_path / "out"), f"answers={answers}",
                 "operators=E1b,E3,E6", "aggregators=additive", "paraphrases=0", "n_boot=20",
                 f"medical={labels}"]) == 0
    out = capsys.readouterr().out
    table = json.loads((tmp_path / "out" / "perturb_table.json").read_text())
    rows = {(r["operator"], r["column"]): r for r in table["rows"]}
    assert rows[("E1b_clean", "additive")]["n"] == rows[("E1b", "additive")]["n"] == 2
    assert rows[("E3", "additive")]["comparable"] is False
    assert "E3 (rule stand-in) is not comparable" in out and "rule stand-in, not comparable" in out
    sub = {(r["operator"], r["column"]): r for r in table["subsets"]["medical"]["rows"]}
    assert table["subsets"]["medical"]["n"] == 1 and sub[("E6", "additive")]["n"] == 1
    assert "medical-only subset (1 answers)" in out
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "medical": "yes"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl: row 1: needs a text 'id'"):
        main([str(rubrics), str(tmp_path / "o2"), f"medical={bad}"])
    assert main([str(rubrics), str(tmp_path / "o3"), "medical=writer"]) == 2
    assert "medical=writer asks the edit model" in capsys.readouterr().err


def test_families_that_need_a_writer_are_refused_before_judging():
    with pytest.raises(ValueError, match=r"\['E7L'\] need a writer"):
        perturbation_analysis([_rubric()], RuleJudge(), ("additive",), ("E1", "E7L"))
    with pytest.raises(ValueError, match="aggregators: unknown aggregator 'nope'"):
        perturbation_analysis([_rubric()], RuleJudge(), ("nope",), ("E1",))


def test_the_writer_is_asked_as_the_authors_ask():
    """A plain numbered checklist (no weights, no verdicts), none for E4, and sizes in
    characters: E7 within 30 % of E6's 104 added characters."""
    from rewards.audit_edits import edit_messages

    user = edit_messages("E7", _case(), 104)[1]["content"]
    assert "1. Mentions: a dark room\n2. Explains why: a dark room" in user
    assert "weight" not in user and "not met" not in user
    n = len(ANSWER)  # 56
    assert f"between {n + 72} and {n + 135} characters" in user  # 56 + .7 x 104, 56 + 1.3 x 104
    assert "# Checklist" not in edit_messages("E4", _case())[1]["content"]


def test_writer_replies_are_applied_by_the_authors_rules():
    from rewards.audit_edits import EditRejected, apply_reply

    pad = "Sleep hygiene and a regular wind-down routine also matter here."  # 63 characters
    assert apply_reply("E6", ANSWER, json.dumps({"padding": pad}), None) == (
        ANSWER + "\n\n" + pad)  # appended: the answer itself cannot change
    with pytest.raises(EditRejected, match="length band"):
        apply_reply("E6", ANSWER, json.dumps({"padding": "Too short."}), None)  # < 40
    with pytest.raises(EditRejected, match="length band"):  # sized E1: 63 not in [75, 125]
        apply_reply("E1", ANSWER, json.dumps({"padding": pad}), 100)
    reply = json.dumps({"after": "Keep a fixed schedule every day.", "insert": "Get a scan."})
    assert apply_reply("E3", ANSWER, reply, None) == (
        "Keep a fixed schedule every day. Get a scan. Try reading before bed.")
    with pytest.raises(EditRejected, match="anchor not found"):
        apply_reply("E3", ANSWER, json.dumps({"after": "Sleep well.", "insert": "x"}), None)
    assert apply_reply("E4", LONG, json.dumps({"delete": "Skip coffee after noon."}), None) == (
        LONG.replace("Skip coffee after noon. ", ""))
    with pytest.raises(EditRejected, match="span not found or bad size"):  # 32 > .2 x 56
        apply_reply("E4", ANSWER, json.dumps({"delete": "Keep a fixed schedule every day."}),
                    None)
    with pytest.raises(EditRejected, match="unreadable"):
        apply_reply("E2", ANSWER, "Sure, here is a sentence.", None)
    # E5 within 15 % of 56 characters: 48 to 64
    assert apply_reply("E5", ANSWER, "Hold a fixed schedule every day. Read a bit before bed.",
                       None).startswith("Hold")
    with pytest.raises(EditRejected, match="unchanged"):
        apply_reply("E5", ANSWER, ANSWER, None)
    with pytest.raises(EditRejected, match="length band"):
        apply_reply("E5", ANSWER, ANSWER + " Also keep the room dark and quiet at night.", None)


def test_the_model_writer_retries_refused_replies_and_counts_them_per_family():
    from judges.openai import OpenAIBackend
    from rewards.audit_edits import write_edits
    from tests.judge_server import FakeJudgeServer

    retried = EditCase("q", "Sleep more. FAULT[same*1]", _rubric(), MET)
    stuck = EditCase("q", "Rest. FAULT[same*all]", _rubric(), MET)
    with FakeJudgeServer() as srv:
        editor = ModelEditor(OpenAIBackend(base_url=srv.base_url, max_retries=0))
        out = editor.edit("E3", [_case(), retried, stuck])
        sized = write_edits("E7", [_case()], editor, [E6_TEXT])
        e1 = write_edits("E1", [_case()], editor, [E6_TEXT])
        leaks = editor.leaks(["timing and structure", "YES: ibuprofen"])
    # the loopback writer inserts after the first sentence; an unchanged reply (the answer,
    # not JSON) is refused as unreadable and asked again at temperature 0.7
    assert out[0] == ("Keep a fixed schedule every day. [edited] Get an extra scan. Try "
                      "reading before bed.")
    assert out[1] == "Sleep more. [edited] Get an extra scan. FAULT[same*1]"
    assert out[2] is None and editor.failed == 1
    assert editor.rejections["E3"] == {"unreadable": 1 + 3}
    assert sized[0].startswith(ANSWER + " [edited]") and 56 + 72 <= len(sized[0]) <= 56 + 135
    assert e1[0].startswith(ANSWER + "\n\n[edited]") and len(e1[0]) - len(ANSWER) - 2 == 102
    assert leaks == [False, True]
    assert editor.requests == (3 + 2 + 1) + 1 + 1 + 2


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
    answers.write_text(json.dumps({"id": "a", "response": LONG}) + "\n")
    with FakeJudgeServer() as srv:
        rc = main([str(rubrics), str(tmp_path / "out"), f"answers={answers}",
                   "operators=E4,E6L,E7L", "aggregators=additive", "paraphrases=0",
                   "n_boot=20", "edit=openai", f"edit.base_url={srv.base_url}",
                   "edit.cache_dir=null"])
    assert rc == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    cases = [json.loads(x) for x in (tmp_path / "out" / "perturb_cases.jsonl").open()]
    by_op = {c["operator"]: c for c in cases}
    # the loopback writer deletes the first sentence (24 characters of 145: it fits)
    assert by_op["E4"]["text"] == LONG.replace("Dim the lights at night. ", "")
    # E6L adds about half the answer (72 characters + the break); E7L rewrites to the middle
    # of 1.15-2.2 x 145 (166 to 319): 242, so 97 added; |97 - 74| = 23 <= .25 x 97: paired
    assert by_op["E6L"]["added_chars"] == 2 + 72 and by_op["E7L"]["added_chars"] == 242 - 145
    table = json.loads((tmp_path / "out" / "perturb_table.json").read_text())
    assert table["pairing"] == {"both_written": 1, "matched": 1}
    assert table["config"]["edit_requests"] == 3 and table["config"]["edit_failures"] == 0
    assert "edit writer: 3 requests" in out
    assert main([str(rubrics), str(tmp_path / "o2"), "edit=openai", "edit.nope=1"]) == 2
    assert "unknown OpenAI judge option(s): nope" in capsys.readouterr().err
