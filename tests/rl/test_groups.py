"""python -m rl.groups: a run's group statistics over its steps and the relative drop of its
all-wrong groups against a baseline, from metrics.jsonl files written here by hand."""

import json

import pytest

from rl.groups import main
from rl.run.group_summary import relative_drop, summarize_groups


def write_run(folder, steps):
    folder.mkdir()
    rows = [{"step": i, "groups/homogeneous_frac": h, "groups/converted_frac": c,
             "groups/all_wrong_frac": w, "reward/mean": 0.0} for i, (h, c, w) in enumerate(steps)]
    # an evaluation record between the steps carries no group fractions
    rows.insert(1, {"step": 0, "eval/outcome_mean": 0.5})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_run_level_shares_by_hand(tmp_path):
    arbor = write_run(tmp_path / "arbor", [(0.5, 0.4, 0.25), (0.25, 0.8, 0.125)])
    grpo = write_run(tmp_path / "grpo", [(0.75, 0.0, 0.5), (0.5, 0.0, 0.25)])
    a, g = summarize_groups(arbor), summarize_groups(grpo)
    assert (a.steps, a.first, a.last) == (2, 0, 1)
    assert a.homogeneous == pytest.approx(0.375)
    # converted share of all homogeneous groups: (0.4 x 0.5 + 0.8 x 0.25) / (0.5 + 0.25)
    assert a.converted == pytest.approx(0.4 / 0.75)
    assert a.all_wrong == pytest.approx(0.1875) and g.all_wrong == pytest.approx(0.375)
    assert relative_drop(a, g) == pytest.approx(0.5)  # 1 - 0.1875 / 0.375
    assert summarize_groups(arbor, from_step=1).converted == pytest.approx(0.8)
    none = write_run(tmp_path / "none", [(0.0, 0.0, 0.0)])
    assert summarize_groups(none).converted == 0.0 and relative_drop(a, summarize_groups(none)) \
        is None


def test_the_command_prints_the_table_and_the_drop(tmp_path, capsys):
    arbor = write_run(tmp_path / "arbor", [(0.5, 0.4, 0.25), (0.25, 0.8, 0.125)])
    grpo = write_run(tmp_path / "grpo", [(0.75, 0.0, 0.5), (0.5, 0.0, 0.25)])
    assert main([str(arbor), str(grpo)]) == 0
    out = capsys.readouterr().out
    assert f"all-wrong groups: 50.0% fewer in {arbor} than in {grpo}" in out
    assert "0.533" in out and "0.188" in out
    assert main([str(tmp_path / "nowhere")]) == 2
    assert "no such file" in capsys.readouterr().err
