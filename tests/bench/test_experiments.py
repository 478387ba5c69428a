"""The experiment drivers' summaries (bench/arbor_experiment.py, bench/prorubric_experiment.py)
on hand-written run folders: the numbers they report are the means the test computes."""

import json

import pytest

from bench import arbor_experiment as arbor
from bench import prorubric_experiment as pro


def _write(run, rows, eval_json=None):
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if eval_json is not None:
        (run / "eval.json").write_text(json.dumps(eval_json))


def test_arbor_summary_means_and_change_vs_grpo(tmp_path):
    def steps(homog, wrong):
        return [{"step": i, "reward/mean": 0.0, "groups/homogeneous_frac": h,
                 "groups/all_wrong_frac": w, "groups/converted_frac": 0.0}
                for i, (h, w) in enumerate(zip(homog, wrong))]

    _write(tmp_path / "grpo_s0", steps([1.0, 1.0, 0.5, 0.5], [1.0, 0.5, 0.5, 0.0]),
           {"results": {"average": {"em": 0.1, "f1": 0.2, "valid": 0.5}}})
    _write(tmp_path / "arbor_s0", steps([0.5, 0.5, 0.25, 0.25], [0.5, 0.5, 0.0, 0.0]))
    _write(tmp_path / "sft", [{"step": 0, "sft/dev_loss": 1.0}],
           {"results": {"average": {"em": 0.0, "f1": 0.05, "valid": 0.9}}})
    table = arbor.summarize(tmp_path, ["grpo", "arbor"], [0])
    assert table["grpo"]["homog"] == 0.75 and table["grpo"]["all_wrong"] == 0.5
    assert table["grpo"]["homog_last"] == 0.5  # last quarter = the last step of 4
    assert table["arbor"]["homog"] == 0.375
    assert table["arbor"]["homog_vs_grpo_pct"] == pytest.approx(-50.0)
    assert table["arbor"]["all_wrong_vs_grpo_pct"] == pytest.approx(-50.0)
    assert table["grpo"]["heldout_valid"] == 0.5 and table["sft"]["heldout_valid"] == 0.9
    assert table["sft"]["steps"] == 0


def test_prorubric_summary_before_after_and_quarters(tmp_path):
    rows = [{"step": 0, "eval/outcome_mean": 0.1, "eval/coverage": 0.2, "eval/fitness": 0.8,
             "eval/length": 50.0}]
    for i in range(8):
        rows.append({"step": i, "reward/mean": i / 10, "groups/total_homogeneous_frac": 0.5,
                     "rubric/coverage": i / 8, "rubric/fitness": 1 - i / 8,
                     "rubric/length_words": 10.0 * i})
    rows.append({"step": 8, "eval/outcome_mean": 0.3, "eval/coverage": 0.4, "eval/fitness": 0.5,
                 "eval/length": 90.0})
    _write(tmp_path / "rubric_rl_s0", rows)
    table = pro.summarize(tmp_path, ["rubric_rl", "prorubric"], [0])
    assert set(table) == {"rubric_rl"}  # no folder for prorubric: left out, not faked
    r = table["rubric_rl"]
    assert (r["eval_coverage_before"], r["eval_coverage_after"]) == (0.2, 0.4)
    assert (r["eval_length_before"], r["eval_length_after"]) == (50.0, 90.0)
    assert r["train_coverage_first"] == pytest.approx((0 + 1 / 8) / 2)  # first quarter: 2 steps
    assert r["train_length_last"] == pytest.approx((60 + 70) / 2)
    assert r["homog"] == 0.5 and r["steps"] == 8


def test_budget_overrides_are_checked():
    with pytest.raises(SystemExit):
        arbor.main(["--dry-run", "--set", "not_a_field=1"])
    assert arbor.main(["--dry-run", "--seeds", "0", "--algos", "grpo", "--set",
                       "batch_prompts=2", "--sft-examples", "8"]) == 0
