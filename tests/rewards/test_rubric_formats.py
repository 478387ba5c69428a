"""The ProRubric authors' two row formats and RubricHub's top-level ``Rubrics`` (#19 item 3).

The fixtures (`tests/fixtures/rubrics/prorubric_*.jsonl`, values of our own) are written in the
shapes of the authors' training rows and public export; the expected ``Rubric`` values below are
written by hand, with the 1-based ``atomic_indices`` of the rows turned into 0-based
``Dimension.criteria`` by hand.  Parquet copies are made with pyarrow directly, not with the
code under test.
"""

import copy
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rewards.rubric import Criterion, Dimension, Message, Rubric, RubricError
from rewards.rubric_formats import render_checklist
from rewards.rubric_io import load_rubrics, save_rubrics
from tests.paths import FIXTURES

TRAIN = FIXTURES / "rubrics" / "prorubric_train.jsonl"
PUBLIC = FIXTURES / "rubrics" / "prorubric_public.jsonl"
HUB_TOP = FIXTURES / "rubrics" / "rubrichub_toplevel.jsonl"

FEVER = "My son has a 39.5 C fever and a stiff neck. What should I do?"
URGENT = ("The answer treats fever with a stiff neck as a possible emergency and sends the child "
          "to emergency care now. It fails if it suggests waiting at home or relying on fever "
          "medicine.")
SIGNS = ("The answer says in plain words which signs are worrying and why they matter. It fails "
         "if the urgency is lost in general fever advice.")
LATTICE = ("The answer explains that freezing arranges water molecules into an open "
           "hydrogen-bonded lattice, so ice is less dense and floats. It fails if the lattice or "
           "the density difference is missing.")
AIR = ("The answer avoids the misconception that trapped air makes ice float. It fails if it "
       "gives air bubbles as the reason.")

EXPECTED_TRAIN = [
    Rubric(
        prompt_id="medical:train:7",
        prompt=(Message("system", "You answer health questions for parents."),
                Message("user", FEVER)),
        criteria=(
            Criterion("Advises going to an emergency department right away.", 5.0),
            Criterion("Names meningitis as a possible cause.", 3.0),
            Criterion("Recommends only fever medicine and rest at home.", -3.0),
            Criterion("Uses plain, non-technical language.", 2.0),
        ),
        # atomic_indices [[1, 3], [2, 4]] (1-based) -> (0, 2), (1, 3)
        dimensions=(
            Dimension("Urgent referral", (0, 2), None, URGENT, 8.0),
            Dimension("Warning signs explained", (1, 3), None, SIGNS, 5.0),
        ),
        reference_answer="Take him to the emergency department now: fever with a stiff neck "
                         "can mean meningitis.",
    ),
    Rubric(
        prompt_id="science:train:3",
        prompt=(Message("user", "What is 6 times 7?"),),
        criteria=(Criterion("States that the product is 42.", 1.0),
                  Criterion("Shows the multiplication.", 0.3)),
        reference_answer="6 x 7 = 42.",  # self_golden is "", extra_info.reference_answer is not
    ),
]

EXPECTED_PUBLIC = [
    Rubric(
        prompt_id="science:12",
        prompt="Why does ice float on water?",
        criteria=(
            Criterion("Says ice is less dense than liquid water.", 1.0),
            Criterion("Claims ice is lighter because it contains air.", -0.9),
            Criterion("Mentions hydrogen bonds forming an open lattice.", 0.7),
        ),
        # [3, 1] and [2] (1-based, unsorted, the name repeated) -> (2, 0) and (1,)
        dimensions=(
            Dimension("Density explanation", (2, 0), None, LATTICE, 1.7),
            Dimension("Density explanation", (1,), None, AIR, 0.9),
        ),
    ),
    Rubric(
        prompt_id="science:13",
        prompt="Name the closest star to Earth.",
        criteria=(Criterion("Answers the Sun.", 1.0),
                  Criterion("Mentions Proxima Centauri as the closest star beyond the Sun.", 0.3)),
    ),
]


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write(rows, path):
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _read_back(path):
    return pq.read_table(path).to_pylist() if path.suffix == ".parquet" else _rows(path)


def _parsed_generation(rows):
    """Rows with ``extra_info.rir_generation`` parsed (it is a JSON string in both)."""
    out = copy.deepcopy(rows)
    for r in out:
        gen = r["extra_info"].get("rir_generation")
        if gen is not None:
            r["extra_info"]["rir_generation"] = json.loads(gen)
    return out


# --- reading ------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_training_rows_read_into_the_hand_written_rubrics(tmp_path, suffix):
    path = _write(_rows(TRAIN), tmp_path / f"train{suffix}")
    for fmt in (None, "prorubric_train"):
        got = load_rubrics(path, fmt)
        assert got == EXPECTED_TRAIN
        assert [d.description for d in got[0].dimensions] == [URGENT, SIGNS]
        assert got[0].dimension_weights() == (8.0, 5.0)
    meta = got[0].meta
    assert meta["data_source"] == "rubrichub_medical"
    assert meta["repaired"] is False
    assert meta["generator"] == "dimension-writer-test"
    assert meta["rir_generation"] == {"model_weights": [2.0, 5.0], "valid": True,
                                      "model": "dimension-writer-test", "mode": "protocol"}
    assert meta["extra_info"]["problem"] == FEVER
    assert meta["extra_info"]["opsd_context_kind"] == "fixture_ctx"
    assert got[1].meta["data_source"] == "rar_science"


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_public_rows_read_into_the_hand_written_rubrics(tmp_path, suffix):
    path = _write(_rows(PUBLIC), tmp_path / f"public{suffix}")
    for fmt in (None, "prorubric_public"):
        got = load_rubrics(path, fmt)
        assert got == EXPECTED_PUBLIC
    assert [d.description for d in got[0].dimensions] == [LATTICE, AIR]
    assert [d.weight for d in got[0].dimensions] == [1.7, 0.9]
    assert got[0].meta == {"domain": "science", "generator": "dimension-writer-test",
                           "repaired": True}
    assert got[1].meta["domain"] == "science"


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_rubrichub_top_level_rubrics(tmp_path, suffix):
    path = _write(_rows(HUB_TOP), tmp_path / f"hub{suffix}")
    (r,) = load_rubrics(path)
    assert r.prompt_id == "rubrichub-901"
    assert r.criteria == (Criterion("Suggests keeping the stems in a glass of water.", 4.0),
                          Criterion("Recommends storing it in the fridge.", -2.0))
    assert r.meta == {"data_source": "rubrichub_chat", "ability": "chat"}


def test_rubrichub_top_level_rubrics_as_a_json_string_and_bad_items(tmp_path):
    row = _rows(HUB_TOP)[0]
    row["Rubrics"] = json.dumps(row["Rubrics"])
    (r,) = load_rubrics(_write([row], tmp_path / "hub.jsonl"), "rubrichub")
    assert r.weights == (4.0, -2.0)
    bad = _rows(HUB_TOP)[0]
    del bad["Rubrics"][1]["points"]
    with pytest.raises(RubricError, match=r"hub2\.jsonl: row 0.*'Rubrics\[1\]\.points'.*missing"):
        load_rubrics(_write([bad], tmp_path / "hub2.jsonl"))


# --- writing back -------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_training_rows_written_back_field_for_field(tmp_path, suffix):
    src = _write(_rows(TRAIN), tmp_path / f"in{suffix}")
    out = tmp_path / f"out{suffix}"
    save_rubrics(load_rubrics(src), out, fmt="prorubric_train")
    assert _parsed_generation(_read_back(out)) == _parsed_generation(_read_back(src))


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_public_rows_written_back_field_for_field(tmp_path, suffix):
    src = _write(_rows(PUBLIC), tmp_path / f"in{suffix}")
    out = tmp_path / f"out{suffix}"
    save_rubrics(load_rubrics(src), out, fmt="prorubric_public")
    assert _read_back(out) == _read_back(src)
    if suffix == ".parquet":  # the export's column types
        schema = pq.read_schema(out)
        assert schema.field("dimensions").type.value_type.field("atomic_indices").type == \
            pa.list_(pa.int32())
        assert schema.field("repaired").type == pa.bool_()


def test_training_row_to_public_row():
    """A training row exported as the authors' export does: prompt = extra_info.problem."""
    (r, _) = load_rubrics(TRAIN)
    from rewards.rubric_formats import prorubric_public_row

    assert prorubric_public_row(r) == {
        "id": "medical:train:7",
        "domain": "rubrichub_medical",
        "prompt": FEVER,
        "atomic_rubric": [
            {"criterion": "Advises going to an emergency department right away.", "weight": 5.0},
            {"criterion": "Names meningitis as a possible cause.", "weight": 3.0},
            {"criterion": "Recommends only fever medicine and rest at home.", "weight": -3.0},
            {"criterion": "Uses plain, non-technical language.", "weight": 2.0},
        ],
        "dimensions": [
            {"name": "Urgent referral", "criterion": URGENT, "weight": 8.0,
             "atomic_indices": [1, 3]},
            {"name": "Warning signs explained", "criterion": SIGNS, "weight": 5.0,
             "atomic_indices": [2, 4]},
        ],
        "repaired": False,
        "generator": "dimension-writer-test",
    }


def _own_rubric(prompt):
    return Rubric(
        prompt_id="own-1",
        prompt=prompt,
        criteria=(Criterion("Gives the boiling point of water at sea level.", 2.0),
                  Criterion("States it in both Celsius and Fahrenheit.", 1.0),
                  Criterion("Claims water boils at 90 C at sea level.", -4.0)),
        dimensions=(Dimension("Correct value", (2, 0), "states a wrong temperature",
                              "Gives 100 C (212 F) at sea level. Fails if the value is wrong.",
                              6.0),
                    Dimension("Units", (1,), None, "Gives both unit systems.", 1.0)),
        reference_answer="100 C, which is 212 F.",
    )


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_rubric_to_training_row_and_back_is_the_identity(tmp_path, suffix):
    r = _own_rubric((Message("system", "Be brief."), Message("user", "When does water boil?")))
    out = tmp_path / f"own{suffix}"
    save_rubrics([r], out, fmt="prorubric_train")
    (back,) = load_rubrics(out)
    assert back == r
    assert back.dimensions[0].failure == "states a wrong temperature"
    (row,) = _read_back(out)
    gen = json.loads(row["extra_info"]["rir_generation"])
    assert gen["atomic_indices"] == [[3, 1], [2]]  # 0-based (2, 0), (1,) -> 1-based
    assert gen["names"] == ["Correct value", "Units"]
    assert gen["repaired"] is False and gen["valid"] is True
    assert row["extra_info"]["rubric"] == [
        {"criterion": "Gives 100 C (212 F) at sea level. Fails if the value is wrong.",
         "weight": 6.0},
        {"criterion": "Gives both unit systems.", "weight": 1.0}]
    assert row["extra_info"]["self_golden"] == "100 C, which is 212 F."
    assert row["extra_info"]["rubric_correct"] == (
        "1. [weight=2] Gives the boiling point of water at sea level.\n"
        "2. [weight=1] States it in both Celsius and Fahrenheit.\n"
        "3. [weight=-4] Claims water boils at 90 C at sea level.")


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_rubric_to_public_row_and_back_is_the_identity(tmp_path, suffix):
    r = _own_rubric("When does water boil?")
    r = Rubric(r.prompt_id, r.prompt, r.criteria,
               tuple(Dimension(d.name, d.criteria, None, d.description, d.weight)
                     for d in r.dimensions))  # the public schema has no failure / reference
    out = tmp_path / f"own{suffix}"
    save_rubrics([r], out, fmt="prorubric_public")
    (back,) = load_rubrics(out)
    assert back == r
    assert _read_back(out)[0]["dimensions"][0]["atomic_indices"] == [3, 1]


def test_default_dimension_weight_is_written_as_sum_of_abs_weights(tmp_path):
    r = _own_rubric("When does water boil?")
    r = r.with_dimensions([Dimension(d.name, d.criteria, None, d.description, None)
                           for d in r.dimensions])
    out = tmp_path / "w.jsonl"
    save_rubrics([r], out, fmt="prorubric_public")
    assert [d["weight"] for d in _rows(out)[0]["dimensions"]] == [4.0 + 2.0, 1.0]


def test_a_dimension_without_a_paragraph_is_not_written(tmp_path):
    r = _own_rubric("When does water boil?")
    r = r.with_dimensions([Dimension("Correct value", (0, 2)), Dimension("Units", (1,))])
    for fmt in ("prorubric_train", "prorubric_public"):
        out = tmp_path / f"{fmt}.parquet"
        with pytest.raises(RubricError, match=rf"{fmt}\.parquet: rubric 0.*'dimensions\[0\]"
                                              r"\.description'"):
            save_rubrics([r], out, fmt=fmt)
        assert not out.exists()


def test_render_checklist_is_the_rubric_correct_layout():
    (r, _) = load_rubrics(TRAIN)
    assert render_checklist(r.criteria) == _rows(TRAIN)[0]["extra_info"]["rubric_correct"]


def test_native_is_not_written_as_parquet(tmp_path):
    with pytest.raises(ValueError, match="JSON Lines only"):
        save_rubrics(EXPECTED_PUBLIC, tmp_path / "n.parquet")


# --- bad rows -----------------------------------------------------------------------------------


def _gen(**change):
    gen = json.loads(_rows(TRAIN)[0]["extra_info"]["rir_generation"])
    gen.update(change)
    return json.dumps(gen)


GEN = "extra_info.rir_generation"
BAD_TRAIN = [
    ({"rir_generation": "{names: ["}, rf"'{GEN}'.*not valid JSON"),
    ({"rir_generation": "[1, 2]"}, rf"'{GEN}'.*expected a JSON object"),
    ({"rir_generation": _gen(atomic_indices=[[1, 5], [2, 4]])},
     rf"'{GEN}\.atomic_indices\[0\]'.*1-based index 5 not in \[1, 4\]"),
    ({"rir_generation": _gen(atomic_indices=[[0, 3], [1, 2, 4]])},
     rf"'{GEN}\.atomic_indices\[0\]'.*1-based index 0 not in \[1, 4\]"),
    ({"rir_generation": _gen(atomic_indices=[[1, 3], [2, 3, 4]])},
     rf"'{GEN}\.atomic_indices\[1\]'.*index 3 used twice \(already in dimension 0\)"),
    ({"rir_generation": _gen(atomic_indices=[[1, 3, 1], [2, 4]])},
     rf"'{GEN}\.atomic_indices\[0\]'.*index 1 used twice \(twice in this group\)"),
    ({"rir_generation": _gen(atomic_indices=[[1, 3], [2]])},
     rf"'{GEN}\.atomic_indices'.*atomic items \[4\] \(1-based\) are in no dimension"),
    ({"rir_generation": _gen(atomic_indices=[[1, 2, 3, 4]])},
     rf"'{GEN}\.atomic_indices'.*one index group per dimension \(2\), got 1"),
    ({"rir_generation": _gen(atomic_indices=[["1", 3], [2, 4]])},
     rf"'{GEN}\.atomic_indices\[0\]'.*not an integer"),
    ({"rir_generation": _gen(names=["Only one"])}, rf"'{GEN}\.names'.*expected 2 names"),
    ({"rir_generation": _gen(names=["Urgent referral", ""])}, rf"'{GEN}\.names\[1\]'"),
    ({"rir_generation": _gen(repaired="perhaps")}, rf"'{GEN}\.repaired'"),
    ({"rir_generation": None}, r"'extra_info\.rir_generation'.*missing"),
    ({"rubric_atomic": None}, r"'extra_info\.rubric_atomic'.*missing"),
    ({"id": ""}, r"'extra_info\.id'"),
    ({"self_golden": 3}, r"'extra_info\.self_golden'.*expected a string"),
]


def _bad_rubric_atomic_weight(extra):
    extra["rubric_atomic"][1]["weight"] = "heavy"


def _empty_paragraph(extra):
    extra["rubric"][0]["criterion"] = "  "


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
@pytest.mark.parametrize("change,field", BAD_TRAIN + [
    (_bad_rubric_atomic_weight, r"'extra_info\.rubric_atomic\[1\]\.weight'"),
    (_empty_paragraph, r"'extra_info\.rubric\[0\]\.criterion'"),
])
def test_bad_training_rows_are_named(tmp_path, suffix, change, field):
    good, _ = _rows(TRAIN)
    bad = copy.deepcopy(good)
    bad["extra_info"]["id"] = "medical:train:8"
    if callable(change):
        change(bad["extra_info"])
    else:
        bad["extra_info"].update(change)
    path = _write_or_skip([good, bad], tmp_path / f"bad{suffix}")
    with pytest.raises(RubricError, match=rf"bad{suffix}: row 1: .*field {field}"):
        load_rubrics(path)


def _write_or_skip(rows, path):
    """``_write``; a value of another type than its column's cannot be written as Parquet."""
    try:
        return _write(rows, path)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        pytest.skip("a Parquet column holds one type")


BAD_PUBLIC = [
    (lambda r: r["dimensions"][0].update(atomic_indices=[4, 1]),
     r"'dimensions\[0\]\.atomic_indices'.*1-based index 4 not in \[1, 3\]"),
    (lambda r: r["dimensions"][1].update(atomic_indices=[2, 3]),
     r"'dimensions\[1\]\.atomic_indices'.*index 3 used twice \(already in dimension 0\)"),
    (lambda r: r["dimensions"][1].update(atomic_indices=[]),
     r"'dimensions\[1\]\.atomic_indices'.*non-empty list"),
    (lambda r: r["dimensions"][0].update(atomic_indices=[3]),
     r"'dimensions'.*atomic items \[1\] \(1-based\) are in no dimension"),
    (lambda r: r["dimensions"][1].update(name=""), r"'dimensions\[1\]\.name'"),
    (lambda r: r["dimensions"][0].update(weight=None), r"'dimensions\[0\]\.weight'"),
    (lambda r: r["atomic_rubric"][2].update(criterion=""), r"'atomic_rubric\[2\]\.criterion'"),
    (lambda r: r.update(repaired="maybe"), r"'repaired'.*true or false"),
    (lambda r: r.update(id=""), r"'id'"),
]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
@pytest.mark.parametrize("change,field", BAD_PUBLIC)
def test_bad_public_rows_are_named(tmp_path, suffix, change, field):
    good = _rows(PUBLIC)[0]
    bad = copy.deepcopy(good)
    bad["id"] = "science:99"
    change(bad)
    path = _write_or_skip([good, bad], tmp_path / f"bad{suffix}")
    with pytest.raises(RubricError, match=rf"bad{suffix}: row 1: .*field {field}"):
        load_rubrics(path)


def test_a_file_that_is_not_parquet_is_named(tmp_path):
    path = tmp_path / "rows.parquet"
    path.write_text('{"id": "x"}\n')
    with pytest.raises(RubricError, match=r"rows\.parquet: .*'<parquet>'.*not a readable"):
        load_rubrics(path)


def test_an_empty_parquet_file_is_named(tmp_path):
    path = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"id": pa.array([], pa.string())}), path)
    with pytest.raises(RubricError, match=r"empty\.parquet.*empty"):
        load_rubrics(path)
