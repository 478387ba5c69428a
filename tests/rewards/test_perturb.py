"""Perturbation incentive analysis: the edit operators, and the table's signs for the rule judge."""

import csv
import json

import pytest

from judges.rule import RuleJudge
from rewards.perturb import (
    FILLER_SENTENCES,
    HIGH_RISK_SENTENCES,
    OPERATORS,
    add_unsupported_high_risk,
    delete_key_recommendation,
    delete_sentence_overlapping,
    main,
    name_only,
    padding,
    perturbation_analysis,
)
from rewards.rubric import Criterion, Rubric, load_rubrics
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
    from rewards.rubric import save_rubrics

    plain = [R(r.prompt_id, r.prompt, r.criteria, (), r.reference_answer, r.meta)
             for r in load_rubrics(FIXTURE)[:3]]
    save_rubrics(plain, tmp_path / "plain.jsonl")
    assert main([str(tmp_path / "plain.jsonl"), str(tmp_path / "out")]) == 0
    data = json.loads((tmp_path / "out" / "perturb_table.json").read_text())
    assert data["config"]["n"] == 3 and "prorubric" in data["table"]["padding"]


def test_cli_keeps_bundled_rubrics_and_reports_bundling_failures(tmp_path, capsys):
    from rewards.rubric import Dimension, save_rubrics

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
