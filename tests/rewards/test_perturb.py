"""Perturbation incentive analysis: the edit operators, and the table's signs for the rule judge."""

import csv
import json

import numpy as np
import pytest

from judges.rule import RuleJudge
from judges.types import CheckResult
from rewards.perturb import (
    FILLER_SENTENCES,
    HIGH_RISK_SENTENCES,
    OPERATORS,
    AuditOptions,
    add_unsupported_high_risk,
    delete_key_recommendation,
    exceeds,
    main,
    name_only,
    padding,
    perturbation_analysis,
)
from rewards.rubric import Criterion, Rubric
from rewards.rubric_io import load_rubrics
from rewards.text_edits import delete_sentence_overlapping, reword, swap_adjacent_sentences
from tests.paths import FIXTURES

FIXTURE = FIXTURES / "rubrics" / "perturb_refs.jsonl"
TEXT = ("Keep the bedroom dark, because light keeps you awake. Avoid caffeine after lunch, "
        "which lingers for hours. Exercise daily.")


def test_name_only_cuts_the_explanation():
    outs = {name_only(TEXT, s) for s in range(20)}
    assert outs == {
        "Keep the bedroom dark. Avoid caffeine after lunch, which lingers for hours. "
        "Exercise daily.",
        "Keep the bedroom dark, because light keeps you awake. Avoid caffeine after lunch. "
        "Exercise daily.",
    }
    assert name_only(TEXT, 3) == name_only(TEXT, 3)  # pure: same seed, same text
    assert name_only("Exercise daily. Eat well.", 0) == "Exercise daily. Eat well."


def test_high_risk_and_padding_append():
    out = add_unsupported_high_risk(TEXT, 1)
    assert out.startswith(TEXT) and out[len(TEXT) + 1:] in HIGH_RISK_SENTENCES
    assert {add_unsupported_high_risk(TEXT, s) for s in range(30)} == {
        f"{TEXT} {s}" for s in HIGH_RISK_SENTENCES}
    pad = padding(TEXT, 0)
    tail = pad[len(TEXT) + 1:]
    assert pad.startswith(TEXT) and sum(s in tail for s in FILLER_SENTENCES) == 3
    assert padding(TEXT, 0) == pad and padding(TEXT, 1) != pad
    assert padding("- one\n- two", 0, sentences=1).split("\n")[-1] in FILLER_SENTENCES


def test_delete_key_recommendation():
    r = Rubric("x", "q", (Criterion("iregex:\\b(?:caffeine|coffee)", 5.0, (), "Mentions caffeine"),
                          Criterion("iregex:dark", 3.0)), reference_answer=TEXT)
    assert delete_key_recommendation(TEXT, 0, r) == (
        "Keep the bedroom dark, because light keeps you awake. Exercise daily.")
    assert delete_sentence_overlapping(TEXT, "nothing related") == TEXT
    with pytest.raises(ValueError, match="needs the rubric"):
        delete_key_recommendation(TEXT, 0, None)


@pytest.fixture(scope="module")
def analysis():
    rubrics = load_rubrics(FIXTURE)
    assert len(rubrics) >= 8 and all(r.reference_answer and r.dimensions for r in rubrics)
    return perturbation_analysis(rubrics, RuleJudge(), seed=0)


def test_every_operator_changes_every_reference(analysis):
    assert {c["operator"] for c in analysis["cases"]} == set(OPERATORS)
    assert all(c["changed"] for c in analysis["cases"])
    # the shipped references are perfect under every aggregator and the held-out criteria
    for c in analysis["cases"]:
        assert c["additive_before"] == pytest.approx(1.0)
        assert c["prorubric_before"] == pytest.approx(1.0)
        assert c["fitness_before"] == pytest.approx(1.0)


def test_table_signs_rule_judge(analysis):
    t = analysis["table"]
    assert analysis["columns"] == ["additive", "additive_abs", "prorubric", "raw_and", "fitness",
                                   "words"]
    # padding: invisible to the training rubric under every aggregator, visible to fitness
    assert t["padding"]["additive"] >= 0 and t["padding"]["prorubric"] >= 0
    assert t["padding"]["fitness"] < 0 and t["padding"]["words"] > 0
    # deleting the key recommendation hurts the AND-product at least as much as the sum
    assert t["delete_key_recommendation"]["additive"] < 0
    assert t["delete_key_recommendation"]["prorubric"] <= t["delete_key_recommendation"]["additive"]
    # naming without analysis: a small additive loss, a whole dimension under the AND-product
    assert t["name_only"]["additive"] < 0
    assert t["name_only"]["prorubric"] < 2 * t["name_only"]["additive"]
    # an unsupported high-risk recommendation: a pitfall, which zeroes its dimension
    assert t["add_unsupported_high_risk"]["additive"] < 0
    assert t["add_unsupported_high_risk"]["prorubric"] <= t["add_unsupported_high_risk"]["additive"]
    # no failure clause fires on these edits, so raw-AND equals ProRubric
    for op in OPERATORS:
        assert t[op]["raw_and"] == pytest.approx(t[op]["prorubric"])


def test_cli_writes_table(tmp_path, capsys):
    assert main([str(FIXTURE), str(tmp_path / "out"), "judge=rule", "seed=0",
                 "aggregators=additive,prorubric"]) == 0
    printed = capsys.readouterr().out
    assert "operator" in printed and "padding" in printed and "prorubric" in printed
    data = json.loads((tmp_path / "out" / "perturb_table.json").read_text())
    assert set(data["table"]) == set(OPERATORS)
    assert set(data["table"]["padding"]) == {"additive", "prorubric", "fitness", "words"}
    with (tmp_path / "out" / "perturb_table.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(OPERATORS) * 4 and {r["n"] for r in rows} == {"12"}
    cases = (tmp_path / "out" / "perturb_cases.jsonl").read_text().splitlines()
    assert len(cases) == 12 * len(OPERATORS)
    assert main([str(FIXTURE)]) == 2


def test_cli_bundles_unbundled_rubrics_first(tmp_path, capsys):
    from rewards.rubric import Rubric as R
    from rewards.rubric_io import save_rubrics

    plain = [R(r.prompt_id, r.prompt, r.criteria, (), r.reference_answer, r.meta)
             for r in load_rubrics(FIXTURE)[:3]]
    save_rubrics(plain, tmp_path / "plain.jsonl")
    assert main([str(tmp_path / "plain.jsonl"), str(tmp_path / "out")]) == 0
    data = json.loads((tmp_path / "out" / "perturb_table.json").read_text())
    assert data["config"]["n"] == 3 and "prorubric" in data["table"]["padding"]


def test_cli_keeps_bundled_rubrics_and_reports_bundling_failures(tmp_path, capsys):
    from rewards.rubric import Dimension
    from rewards.rubric_io import save_rubrics

    first, *rest = load_rubrics(FIXTURE)[:3]
    # an already-bundled rubric whose first failure clause fires on every high-risk sentence
    fires = "iregex:double dose|bleach|stop taking|high-dose"
    bundled = first.with_dimensions(
        (Dimension(first.dimensions[0].name, first.dimensions[0].criteria, fires),)
        + first.dimensions[1:])
    plain = [r.with_dimensions(()) for r in rest]
    solo = Rubric("solo", "q", (Criterion("iregex:dark", 1.0),), reference_answer="Keep it dark.")
    save_rubrics([bundled, *plain, solo], tmp_path / "mixed.jsonl")
    assert main([str(tmp_path / "mixed.jsonl"), str(tmp_path / "out"),
                 "operators=add_unsupported_high_risk"]) == 0
    out, err = capsys.readouterr()
    assert "solo" in err and "only 1 criteria" in err
    assert "left out 1 rubric(s) that could not be bundled" in out
    data = json.loads((tmp_path / "out" / "perturb_table.json").read_text())
    assert data["config"]["n"] == 3
    assert [f["prompt_id"] for f in data["config"]["not_bundled"]] == ["solo"]
    cases = {c["prompt_id"]: c for c in map(json.loads, (
        tmp_path / "out" / "perturb_cases.jsonl").read_text().splitlines())}
    assert set(cases) == {first.prompt_id, *(r.prompt_id for r in rest)}
    # the cached failure clause survives: it fires, so ProRubric falls below raw-AND
    kept = cases[first.prompt_id]
    assert kept["prorubric_after"] < kept["raw_and_after"]
    for r in rest:  # bundled by the rule judge here: no failure clauses
        assert cases[r.prompt_id]["prorubric_after"] == pytest.approx(
            cases[r.prompt_id]["raw_and_after"])


# --- the paraphrase-noise floor and the intervals ----------------------------------------------


def test_reword_toggles_contractions_and_phrases_in_one_pass():
    outs = {reword("Do not nap. It's fine to nap every day.", s) for s in range(40)}
    assert outs == {f"{a} nap. {b} fine to nap {c}." for a in ("Do not", "Don't")
                    for b in ("It's", "It is") for c in ("every day", "daily")}
    # one pass: "don't" -> "do not" is never turned back into "don't" (and vice versa)
    assert {reword("don't", s) for s in range(20)} == {"don't", "do not"}
    assert reword("No rule applies here.", 3) == "No rule applies here."


def test_swap_keeps_the_first_sentence_and_every_sentence():
    text = "Keep it dark. Avoid coffee. Exercise. Read a book."
    outs = {swap_adjacent_sentences(text, s) for s in range(30)}
    assert outs == {"Keep it dark. Exercise. Avoid coffee. Read a book.",
                    "Keep it dark. Avoid coffee. Read a book. Exercise."}
    assert swap_adjacent_sentences("One. Two.", 0) == "One. Two."


def test_rule_judge_rewards_do_not_move_under_rule_paraphrases(analysis):
    # rubric_chat's rules read keywords and reason connectives inside a sentence, which the
    # paraphrases leave alone: every aggregator's floor is exactly 0 on the fixture
    floor = analysis["noise_floor"]
    assert all(floor[a]["floor"] == 0.0 for a in ("additive", "prorubric", "raw_and"))
    assert floor["additive"]["draws"] == 12 * 3 and floor["additive"]["n"] == 12
    assert floor["additive"]["frac_changed"] > 0.9  # the texts did change


def _reference_ci(d, n_boot=2000, level=0.95, seed=0):
    idx = np.random.default_rng(seed).integers(0, len(d), (n_boot, len(d)))
    return tuple(np.quantile(np.asarray(d)[idx].mean(axis=1), [(1 - level) / 2,
                                                               (1 + level) / 2]))


def test_each_change_has_the_bootstrap_interval_over_references(analysis):
    for op in OPERATORS:
        cases = [c for c in analysis["cases"] if c["operator"] == op]
        d = [c["prorubric_after"] - c["prorubric_before"] for c in cases]
        assert analysis["ci"][op]["prorubric"] == pytest.approx(list(_reference_ci(d)))
    # with a floor of 0, an effect exceeds it when its interval excludes 0
    assert analysis["exceeds_floor"]["name_only"]["prorubric"] is True
    assert analysis["exceeds_floor"]["padding"]["prorubric"] is False
    assert analysis["exceeds_floor"]["padding"]["fitness"] is True


def _surface_rubric(pid):
    # "do not" is a surface-form rule: a contraction fails it (the scripted noise)
    return Rubric(pid, "q", (Criterion(r"iregex:\bdark\b", 2.0, (), "Mentions dark bedroom"),
                             Criterion(r"iregex:\bdo not\b", 1.0)),
                  reference_answer="Keep it dark. Do not nap.")


def test_noise_floor_and_exceeds_on_given_paraphrases():
    rubrics = [_surface_rubric("r1"), _surface_rubric("r2")]
    given = {"r1": ["Keep it dark. Don't nap.", "Keep it dark. Do not nap."],
             "r2": ["Keep it dark. Don't nap."]}
    res = perturbation_analysis(rubrics, RuleJudge(), ("additive",),
                                ("name_only", "delete_key_recommendation"),
                                audit=AuditOptions(paraphrase_texts=given))
    # additive R = (2 dark + 1 "do not") / 3: original 1, a contraction 2/3
    # r1: |changes| 1/3, 0 -> 1/6; r2: 1/3 -> floor (1/6 + 1/3) / 2 = 1/4, signed -1/4
    f = res["noise_floor"]["additive"]
    assert f["floor"] == pytest.approx(0.25) and f["mean_delta"] == pytest.approx(-0.25)
    assert f["n"] == 2 and f["draws"] == 3
    # deleting "Keep it dark." costs 2/3 in both: interval [-2/3, -2/3] beyond -1/4
    row = {r["operator"]: r for r in res["rows"] if r["column"] == "additive"}
    assert row["delete_key_recommendation"]["mean_delta"] == pytest.approx(-2 / 3)
    assert (row["delete_key_recommendation"]["ci_lo"], row["delete_key_recommendation"]["ci_hi"]
            ) == pytest.approx((-2 / 3, -2 / 3))
    assert row["delete_key_recommendation"]["exceeds_floor"] is True
    # no reason connective: name_only changes nothing, inside the floor
    assert row["name_only"]["mean_delta"] == 0.0 and row["name_only"]["exceeds_floor"] is False
    assert {c["prompt_id"] for c in res["paraphrase_cases"]} == {"r1", "r2"}


def test_exceeds_needs_the_whole_interval_beyond_the_floor():
    assert exceeds(0.3, 0.5, 0.25) and exceeds(-0.5, -0.3, 0.25)
    assert not exceeds(0.2, 0.5, 0.25) and not exceeds(-0.5, 0.5, 0.0)
    assert exceeds(0.1, 0.2, float("nan")) is None


def test_cli_paraphrase_file_and_its_bad_rows(tmp_path, capsys):
    from rewards.rubric_io import save_rubrics

    save_rubrics([_surface_rubric("r1")], tmp_path / "r.jsonl")
    para = tmp_path / "p.jsonl"
    para.write_text(json.dumps({"prompt_id": "r1", "text": "Keep it dark. Don't nap."}) + "\n")
    out = tmp_path / "out"
    assert main([str(tmp_path / "r.jsonl"), str(out), "aggregators=additive",
                 f"paraphrase_file={para}", "n_boot=50"]) == 0
    data = json.loads((out / "perturb_table.json").read_text())
    assert data["noise_floor"]["additive"]["floor"] == pytest.approx(1 / 3)
    assert "paraphrase floor" in capsys.readouterr().out
    assert len((out / "perturb_paraphrases.jsonl").read_text().splitlines()) == 1
    para.write_text(json.dumps({"prompt_id": "r1", "text": "x"}) + "\n"
                    + json.dumps({"prompt_id": "nope", "text": "y"}) + "\n")
    with pytest.raises(ValueError, match=r"p.jsonl: row 2: prompt_id 'nope'"):
        main([str(tmp_path / "r.jsonl"), str(out), f"paraphrase_file={para}"])
    para.write_text(json.dumps({"prompt_id": "r1"}) + "\n")
    with pytest.raises(ValueError, match=r"row 1: field 'text'"):
        main([str(tmp_path / "r.jsonl"), str(out), f"paraphrase_file={para}"])


class _FailsOnOneEdit(RuleJudge):
    """The rule judge, except that every check of one edited answer ends on the judge's
    fallback (not met, P .5), as an LLM judge's unparseable reply does."""

    def check(self, requests):
        out = list(super().check(requests))
        return [CheckResult(False, 0.5, fallback=True) if q.response.startswith("Do not nap. Rest")
                else r for q, r in zip(requests, out)]


def test_a_failed_judge_call_is_left_out_and_counted():
    """Three references; deleting "Keep it dark." costs 2/3 of the additive reward in each. The
    judge fails on r2's edit: scored as a fallback it would read as a loss of 1, not 2/3; it is
    left out of the row (n 2, mean -2/3) and counted."""
    rubrics = [_surface_rubric("r1"), _surface_rubric("r3"),
               Rubric("r2", "q", _surface_rubric("x").criteria,
                      reference_answer="Keep it dark. Do not nap. Rest.")]
    res = perturbation_analysis(rubrics, _FailsOnOneEdit(), ("additive",),
                                ("delete_key_recommendation",))
    row = next(r for r in res["rows"] if r["column"] == "additive")
    assert (row["n"], row["judge_failed"]) == (2, 1)
    assert row["mean_delta"] == pytest.approx(-2 / 3)
    words = next(r for r in res["rows"] if r["column"] == "words")
    assert (words["n"], words["judge_failed"]) == (3, 0)  # no judge behind a word count
    case = next(c for c in res["cases"] if c["prompt_id"] == "r2")
    assert case["additive_judge_failed"] and np.isnan(case["additive_after"])
