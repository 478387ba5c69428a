"""Rubric files that are not what they should be are named, before anything runs (#22):
a latin-1 file, an empty file, a rubric listing one criterion twice; and `rewards.bundle`
exits 2 on them (its documented status) instead of a traceback."""

import json

import pytest

from rewards.bundle import main as bundle_main
from rewards.rubric import RubricError
from rewards.rubric_io import load_rubrics


def _row(*criteria):
    return {"prompt_id": "p1", "prompt": "Explain X.",
            "criteria": [{"text": t, "weight": w} for t, w in criteria]}


def test_latin1_file_names_the_file_and_line(tmp_path):
    p = tmp_path / "r.jsonl"
    good = json.dumps(_row(("Mentions A", 1.0)))
    p.write_bytes((good + "\n" + good.replace("Mentions A", "Mentions caf\xe9")).encode("latin-1")
                  .replace(b'"p1"', b'"p2"', 1))
    with pytest.raises(RubricError, match=r"r\.jsonl.*not UTF-8 at byte \d+ \(line 2\)"):
        load_rubrics(p)


def test_empty_file_is_refused(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text("\n  \n")
    with pytest.raises(RubricError, match=r"r\.jsonl.*empty"):
        load_rubrics(p)


def test_duplicate_criterion_is_refused(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text(json.dumps(_row(("Mentions A", 1.0), ("Cites B", 2.0),
                                 ("mentions  a", 1.0))) + "\n")
    with pytest.raises(RubricError, match=r"row 0.*criteria\[2\]\.text.*duplicate of "
                                          r"criteria\[0\]"):
        load_rubrics(p)


def test_distinct_criteria_load(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text(json.dumps(_row(("Mentions A", 1.0), ("Mentions B", 1.0))) + "\n")
    (r,) = load_rubrics(p)
    assert [c.text for c in r.criteria] == ["Mentions A", "Mentions B"]


@pytest.mark.parametrize("content", [b"", b'{"prompt_id": "p1"}\n', b"\xff\xfe{}\n"])
def test_bundle_exits_2_on_a_bad_input_file(tmp_path, capsys, content):
    src = tmp_path / "in.jsonl"
    src.write_bytes(content)
    assert bundle_main([str(src), str(tmp_path / "out.jsonl"), "judge=rule"]) == 2
    assert "in.jsonl" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()


def test_bundle_exits_2_on_a_missing_input_file(tmp_path, capsys):
    assert bundle_main([str(tmp_path / "nope.jsonl"), str(tmp_path / "o.jsonl"),
                        "judge=rule"]) == 2
    assert "nope.jsonl" in capsys.readouterr().err


def test_static_rubric_files_too(tmp_path):
    from memory.static import load_static_rubrics

    p = tmp_path / "s.jsonl"
    p.write_bytes('{"title": "Cites a source", "weight": 1}\n{"title": "Caf\xe9", "weight": 1}\n'
                  .encode("latin-1"))
    with pytest.raises(ValueError, match=r"s\.jsonl: not UTF-8 at byte \d+ \(line 2\)"):
        load_static_rubrics(p)
    p.write_text('{"title": "Cites a source", "weight": 1}\n{"title": "Searches", "weight": 2}\n'
                 '{"title": "cites a  source", "weight": 1}\n')
    with pytest.raises(ValueError, match=r"s\.jsonl: line 3: duplicate of .*line 1"):
        load_static_rubrics(p)
