"""Rubric data model and padding (rewards/rubric.py), row parsers (rewards/rubric_parsers.py)
and loaders (rewards/rubric_io.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rewards.rubric import (
    RAR_WEIGHT_LABELS,
    Criterion,
    Dimension,
    Message,
    Rubric,
    RubricError,
    to_arrays,
)
from rewards.rubric_io import RUBRIC_FORMATS, detect_format, load_rubrics, parse_rows, save_rubrics
from rewards.rubric_parsers import rar_weight, rubric_to_dict
from tests.paths import FIXTURES

FIX = FIXTURES / "rubrics"


def _rubric(weights=(2.0, 1.0, -1.0), dims=(), pid="p0") -> Rubric:
    crits = tuple(Criterion(f"criterion {i}", w) for i, w in enumerate(weights))
    return Rubric(prompt_id=pid, prompt="question?", criteria=crits, dimensions=dims)


def _write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# --------------------------------------------------------------------------------------------
# loaders on the fixtures
# --------------------------------------------------------------------------------------------


def test_healthbench_fixture():
    rs = load_rubrics(FIX / "healthbench.jsonl", fmt="healthbench")
    assert [r.prompt_id for r in rs] == ["hb-0001", "hb-0002"]
    r = rs[0]
    assert r.prompt == (Message("user", r.prompt_text()),)
    assert r.weights == (10.0, 5.0, -8.0, 2.0)
    assert r.criteria[2].is_pitfall and not r.criteria[0].is_pitfall
    assert r.criteria[0].tags == ("level:example", "axis:completeness")
    assert r.meta["example_tags"][0] == "theme:emergency_referrals"
    assert r.dimensions == () and r.dim_index() == (-1, -1, -1, -1)
    assert rs[1].prompt_text() == "I am 70." and len(rs[1].prompt) == 4


def test_rar_fixture_string_and_numeric_weights():
    rs = load_rubrics(FIX / "rar.jsonl", fmt="rar")
    # Essential 5, Important 3, Optional 1, Pitfall -2
    assert rs[0].weights == (5.0, 3.0, 1.0, -2.0)
    assert rs[0].prompt_id.startswith("rar-") and len(rs[0].prompt_id) == 4 + 16
    assert rs[0].reference_answer.startswith("(B) Type 2 diabetes")
    assert rs[0].criteria[0].title == "Correct answer"
    assert rs[0].criteria[0].text.startswith("Essential Criteria: Identifies (B)")
    # explicit id, numeric string, "important criteria" label, empty description -> title
    assert rs[1].prompt_id == "rar-custom-id"
    assert rs[1].weights == (5.0, 3.0, -2.0)
    assert rs[1].criteria[1].text == "States a 5-day nitrofurantoin course"
    (num,) = load_rubrics(FIX / "rar_numeric.json")  # JSON list file, detected format
    assert num.weights == (5.0, 3.0, 1.0, -1.0)
    # content ids are stable
    assert load_rubrics(FIX / "rar.jsonl")[0].prompt_id == rs[0].prompt_id


def test_rar_weight_mapping():
    assert dict(RAR_WEIGHT_LABELS) == {
        "essential": 5.0,
        "important": 3.0,
        "optional": 1.0,
        "pitfall": -2.0,
    }
    assert rar_weight("Essential") == 5.0
    assert rar_weight(" Pitfall Criteria ") == -2.0
    assert rar_weight("-1") == -1.0
    assert rar_weight(4) == 4.0
    with pytest.raises(RubricError, match="Critical"):
        rar_weight("Critical", "pid", "rubric[0].weight")
    with pytest.raises(RubricError):
        rar_weight(True)


def test_rubrichub_fixture():
    rs = load_rubrics(FIX / "rubrichub.jsonl", fmt="rubrichub")
    assert rs[0].prompt_id == "rubrichub-17"
    assert rs[0].meta == {"data_source": "rubrichub_writing", "ability": "writing"}
    assert rs[0].weights == (3.0, 5.0, -3.0)
    assert isinstance(rs[0].prompt, tuple)
    assert rs[1].prompt == "Compute the derivative of x^3 sin(x)."
    assert rs[1].prompt_id.startswith("rubrichub-") and rs[1].weights == (4.0, 6.0)


def test_rubrichub_rubrics_as_json_string(tmp_path):
    row = {
        "prompt": "q",
        "data_source": "x",
        "ability": "y",
        "reward_model": {"rubrics": json.dumps([{"criterion": "c", "points": 2}])},
    }
    (r,) = load_rubrics(_write_jsonl(tmp_path / "h.jsonl", [row]))
    assert r.weights == (2.0,)


def test_native_fixture_and_round_trip(tmp_path):
    (r,) = load_rubrics(FIX / "native_bundled.jsonl")
    assert [d.name for d in r.dimensions] == ["triage", "first_aid", "communication"]
    assert r.dimensions[0].failure == "Delays emergency referral."
    assert r.dimensions[1].failure is None
    assert r.dim_index() == (0, 1, 0, 2)
    assert r.meta == {"bundler": "fixture"}
    # the same criteria as the HealthBench row: texts are never rewritten by bundling
    hb = load_rubrics(FIX / "healthbench.jsonl")[0]
    assert [c.text for c in r.criteria] == [c.text for c in hb.criteria]
    hb2 = load_rubrics(FIX / "healthbench.jsonl")[1]
    out = tmp_path / "out.jsonl"
    save_rubrics([r, hb2], out)
    back = load_rubrics(out, fmt="native")
    assert back[0] == r and back[1] == hb2
    assert rubric_to_dict(back[0]) == rubric_to_dict(r)


def test_detect_format_and_unknown_format(tmp_path):
    assert detect_format({"prompt": [], "rubrics": []}) == "healthbench"
    assert detect_format({"question": "", "rubric": []}) == "rar"
    assert detect_format({"prompt": "", "reward_model": {}}) == "rubrichub"
    assert detect_format({"prompt_id": "", "criteria": []}) == "native"
    assert detect_format({"prompt": [], "Rubrics": []}) == "rubrichub"
    assert detect_format({"prompt": [], "extra_info": {"rubric": []}}) == "prorubric_train"
    assert detect_format({"prompt": [], "extra_info": {"rubric": []},
                          "reward_model": {"style": "rule"}}) == "prorubric_train"
    assert detect_format({"id": "", "atomic_rubric": []}) == "prorubric_public"
    assert set(RUBRIC_FORMATS.names()) == {"healthbench", "native", "rar", "rubrichub",
                                           "prorubric_train", "prorubric_public"}
    with pytest.raises(ValueError, match="unknown rubric format 'gsm8k'.*healthbench"):
        load_rubrics(FIX / "healthbench.jsonl", fmt="gsm8k")
    path = _write_jsonl(tmp_path / "odd.jsonl", [{"text": "x"}])
    with pytest.raises(RubricError, match="cannot detect") as e:
        load_rubrics(path)
    assert "odd.jsonl: row 0" in str(e.value)


# --------------------------------------------------------------------------------------------
# bad rows
# --------------------------------------------------------------------------------------------

GOOD_HB = {
    "prompt": [{"role": "user", "content": "hi"}],
    "rubrics": [{"criterion": "greets back", "points": 3, "tags": []}],
    "example_tags": [],
    "prompt_id": "ok",
}


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"rubrics": [{"criterion": "greets", "tags": []}]}, "rubrics[0].points"),
        ({"rubrics": [{"criterion": "greets", "points": "3"}]}, "rubrics[0].points"),
        ({"rubrics": [{"points": 3}]}, "rubrics[0].criterion"),
        ({"rubrics": [{"criterion": "  ", "points": 3}]}, "criteria[0].text"),
        ({"rubrics": [{"criterion": "a", "points": 0}, {"criterion": "b", "points": -2}]}, None),
        ({"prompt": [{"role": "user"}]}, "prompt[0]"),
        ({"prompt": "not a list"}, "prompt"),
        ({"rubrics": "none"}, "rubrics"),
        ({"rubrics": [{"criterion": "a", "points": 1, "tags": [1]}]}, "rubrics[0].tags"),
        ({"ideal_completions_data": {"ideal_completion": {"text": "x"}}},
         "ideal_completions_data.ideal_completion"),
        ({"ideal_completions_data": "call 911"}, "ideal_completions_data"),
        ({"ideal_completion": ["call 911"]}, "ideal_completion"),
    ],
)
def test_bad_healthbench_rows_name_file_row_prompt_and_field(tmp_path, bad, field):
    row = {**GOOD_HB, "prompt_id": "bad-one", **bad}
    path = _write_jsonl(tmp_path / "hb.jsonl", [GOOD_HB, row])
    with pytest.raises(RubricError) as e:
        load_rubrics(path, fmt="healthbench")
    err = e.value
    assert err.prompt_id == "bad-one"
    assert "hb.jsonl: row 1" in str(err) and "bad-one" in str(err)
    if field is None:  # no positive weight
        assert err.field == "criteria.weight" and "positive" in str(err)
    else:
        assert err.field == field and field in str(err)


def test_healthbench_reference_answer_from_ideal_completions_data(tmp_path):
    ideal = {"ideal_completion": "Call emergency services now.",
             "ideal_completions_group": "Group 1", "ideal_completions_ref_completions": []}
    rows = [
        {**GOOD_HB, "prompt_id": "nested", "ideal_completions_data": ideal},  # official layout
        {**GOOD_HB, "prompt_id": "none", "ideal_completions_data": None},
        {**GOOD_HB, "prompt_id": "top", "ideal_completion": "Rest."},  # top-level fallback
        {**GOOD_HB, "prompt_id": "both", "ideal_completions_data": ideal,
         "ideal_completion": "Rest."},
    ]
    rs = load_rubrics(_write_jsonl(tmp_path / "hb.jsonl", rows))
    assert [r.reference_answer for r in rs] == [
        "Call emergency services now.", None, "Rest.", "Call emergency services now."]


def test_reference_answer_must_be_text(tmp_path):
    with pytest.raises(RubricError, match="reference_answer") as e:
        Rubric("p", "q", (Criterion("c", 1.0),), reference_answer={"text": "x"})  # type: ignore
    assert e.value.field == "reference_answer"
    row = {**rubric_to_dict(_rubric(pid="n1")), "reference_answer": {"text": "x"}}
    with pytest.raises(RubricError, match=r"n\.jsonl: row 0.*'n1'.*'reference_answer'"):
        load_rubrics(_write_jsonl(tmp_path / "n.jsonl", [row]), fmt="native")


def test_bad_rar_and_rubrichub_rows(tmp_path):
    rar = {"question": "q?", "rubric": [{"title": "t", "description": "d", "weight": "Critical"}]}
    with pytest.raises(RubricError, match=r"row 0.*rubric\[0\]\.weight"):
        load_rubrics(_write_jsonl(tmp_path / "r.jsonl", [rar]), fmt="rar")
    rar = {"question": "q?", "rubric": [{"title": "", "description": "", "weight": 5}]}
    with pytest.raises(RubricError, match=r"rubric\[0\]\.description"):
        load_rubrics(_write_jsonl(tmp_path / "r.jsonl", [rar]), fmt="rar")
    rar = {"question": 3, "rubric": []}
    with pytest.raises(RubricError, match="'question'"):
        load_rubrics(_write_jsonl(tmp_path / "r.jsonl", [rar]), fmt="rar")
    hub = {"prompt": "q", "prompt_id": "h1", "reward_model": {"rubrics": [{"criterion": "c"}]}}
    with pytest.raises(RubricError, match=r"'h1'.*reward_model\.rubrics\[0\]\.points"):
        load_rubrics(_write_jsonl(tmp_path / "h.jsonl", [hub]), fmt="rubrichub")
    hub = {"prompt": "q", "reward_model": {}}
    with pytest.raises(RubricError, match=r"reward_model\.rubrics"):
        load_rubrics(_write_jsonl(tmp_path / "h.jsonl", [hub]), fmt="rubrichub")


def test_invalid_json_and_duplicate_ids(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(GOOD_HB) + "\n\n{not json\n")
    with pytest.raises(RubricError, match=r"broken\.jsonl: row 1 \(line 3\)"):
        load_rubrics(path)
    path = _write_jsonl(tmp_path / "dup.jsonl", [GOOD_HB, GOOD_HB])
    with pytest.raises(RubricError, match="duplicate of row 0") as e:
        load_rubrics(path)
    assert e.value.field == "prompt_id" and "row 1" in e.value.where
    path = tmp_path / "notlist.json"
    path.write_text("[1, 2")
    with pytest.raises(RubricError, match="invalid JSON list"):
        load_rubrics(path)
    with pytest.raises(RubricError, match=r"row 0.*not an object"):
        parse_rows([[1, 2]], fmt="healthbench", source="mem")


# --------------------------------------------------------------------------------------------
# the data model's invariants
# --------------------------------------------------------------------------------------------


def test_rubric_validation():
    with pytest.raises(RubricError, match="no criterion has a positive weight") as e:
        _rubric(weights=(0.0, 0.0))
    assert e.value.prompt_id == "p0" and e.value.field == "criteria.weight"
    with pytest.raises(RubricError, match="no criterion has a positive weight"):
        _rubric(weights=(-1.0, 0.0))
    with pytest.raises(RubricError, match=r"criteria\[1\]\.weight"):
        _rubric(weights=(1.0, float("nan")))
    with pytest.raises(RubricError, match="criteria") as e:
        Rubric("p1", "q", ())
    assert e.value.prompt_id == "p1"
    with pytest.raises(RubricError, match="prompt_id"):
        Rubric("", "q", (Criterion("x", 1.0),))
    with pytest.raises(RubricError, match=r"criteria\[0\]\.text"):
        Rubric("p2", "q", (Criterion("", 1.0),))
    r = _rubric()
    with pytest.raises(AttributeError):
        r.prompt_id = "other"  # frozen


@pytest.mark.parametrize("k", [6])
def test_number_of_dimensions_out_of_range(k):
    n = 6
    dims = tuple(Dimension(f"d{i}", (i,)) for i in range(n))
    with pytest.raises(RubricError, match=f"K={k} dimensions") as e:
        _rubric(weights=(1.0,) * n, dims=dims, pid="kk")
    assert e.value.prompt_id == "kk" and e.value.field == "dimensions"


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])  # K = 1 is the ProRubric authors' ablation
def test_number_of_dimensions_in_range(k):
    dims = tuple(Dimension(f"d{i}", (i,)) for i in range(k))
    r = _rubric(weights=(1.0,) * k, dims=dims)
    assert r.num_dims == k and r.dim_index() == tuple(range(k))


@pytest.mark.parametrize(
    "dims, match",
    [
        ((Dimension("a", (0,)), Dimension("b", (1,))), r"criteria \[2\] are in no dimension"),
        ((Dimension("a", (0, 1)), Dimension("b", (1, 2))), "already in dimension 0"),
        ((Dimension("a", (0, 1, 2)), Dimension("b", (3,))), r"index 3 not in \[0, 3\)"),
        ((Dimension("a", (0, 1, 2)), Dimension("b", ())), "has no criteria"),
        ((Dimension("a", (0, 1)), Dimension("b", (2,), weight=float("nan"))), "weight"),
        ((Dimension("a", (0, 1)), Dimension("", (2,))), "name is empty"),
        ((Dimension("a", (0, 1)), Dimension("b", (2,), failure="  ")), "failure clause"),
        ((Dimension("a", (0, 1)), Dimension("b", (-1, 2))), "index -1"),
    ],
)
def test_bad_dimension_partitions(dims, match):
    with pytest.raises(RubricError, match=match) as e:
        _rubric(dims=dims, pid="part")
    assert e.value.prompt_id == "part" and e.value.field.startswith("dimensions")


def test_bad_dimensions_in_a_native_row_name_the_row(tmp_path):
    (r,) = load_rubrics(FIX / "native_bundled.jsonl")
    row = rubric_to_dict(r)
    row["dimensions"][2]["criteria"] = []  # criterion 3 in no dimension, empty dimension
    with pytest.raises(RubricError, match=r"n\.jsonl: row 0.*'hb-0001'.*dimensions\[2\]"):
        load_rubrics(_write_jsonl(tmp_path / "n.jsonl", [row]))
    row["dimensions"] = row["dimensions"][:1] * 6
    with pytest.raises(RubricError, match="K=6"):
        load_rubrics(_write_jsonl(tmp_path / "n.jsonl", [row]))


def test_dimension_text_weight_and_repeated_names_round_trip(tmp_path):
    """The authors' dimensions carry a paragraph and a weight; names may repeat; K = 1 is valid."""
    r = _rubric(weights=(2.0, -1.0, 3.0), dims=(
        Dimension("Safety", (0, 1), None, "Says X and never Y; fails if it claims Z.", None),
        Dimension("Safety", (2,), "claims Z", "", 7.5)))
    assert r.dimension_weights() == (3.0, 7.5)  # |2| + |-1|, then the given weight
    (back,) = load_rubrics(_write_jsonl(tmp_path / "d.jsonl", [rubric_to_dict(r)]))
    assert back.dimensions == r.dimensions
    one = _rubric(weights=(1.0, 1.0, 1.0), dims=(Dimension("all", (0, 1, 2)),))
    assert one.num_dims == 1 and one.dimension_weights() == (3.0,)


def test_with_dimensions_keeps_criteria():
    r = _rubric()
    b = r.with_dimensions([Dimension("x", (0, 2), "fails"), Dimension("y", (1,))])
    assert b.criteria is r.criteria and b.dim_index() == (0, 1, 0) and r.dimensions == ()


# --------------------------------------------------------------------------------------------
# to_arrays
# --------------------------------------------------------------------------------------------


def test_to_arrays_pads():
    a = _rubric(weights=(2.0, 1.0, -1.0), dims=(Dimension("x", (0, 2)), Dimension("y", (1,))))
    b = _rubric(weights=(4.0, -3.0), pid="p1")
    arr = to_arrays([a, b])
    assert arr.weights.shape == (2, 3) and arr.dim_mask.shape == (2, 2)
    np.testing.assert_array_equal(arr.weights, [[2, 1, -1], [4, -3, 0]])
    np.testing.assert_array_equal(arr.mask, [[1, 1, 1], [1, 1, 0]])
    np.testing.assert_array_equal(arr.dim_index, [[0, 1, 0], [-1, -1, -1]])
    np.testing.assert_array_equal(arr.dim_mask, [[1, 1], [0, 0]])
    assert arr.weights.dtype == np.float32 and arr.dim_index.dtype == np.int32
    big = to_arrays([a, b], max_criteria=8, max_dims=5)
    assert big.weights.shape == (2, 8) and big.dim_mask.shape == (2, 5)
    np.testing.assert_array_equal(big.dim_index[0], [0, 1, 0, -1, -1, -1, -1, -1])
    with pytest.raises(RubricError, match="max_criteria=2") as e:
        to_arrays([a, b], max_criteria=2)
    assert e.value.prompt_id == "p0"
    with pytest.raises(RubricError, match="max_dims=1"):
        to_arrays([a], max_dims=1)
    with pytest.raises(RubricError, match="not bundled") as e:
        to_arrays([a, b], require_dims=True)
    assert e.value.prompt_id == "p1"
    empty = to_arrays([])
    assert empty.weights.shape == (0, 1)
