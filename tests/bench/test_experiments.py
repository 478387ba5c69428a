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
        homog = 1.0 if i < 2 else (0.5 if i < 6 else 0.0)
        rows.append({"step": i, "reward/mean": i / 10, "groups/total_homogeneous_frac": homog,
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
    assert r["homog"] == (2 * 1.0 + 4 * 0.5) / 8 and r["steps"] == 8
    assert (r["homog_first"], r["homog_last"]) == (1.0, 0.0)


def test_budget_overrides_are_checked():
    with pytest.raises(SystemExit):
        arbor.main(["--dry-run", "--set", "not_a_field=1"])
    assert arbor.main(["--dry-run", "--seeds", "0", "--algos", "grpo", "--set",
                       "batch_prompts=2", "--sft-examples", "8"]) == 0


def test_prorubric_warmup_first_and_every_arm_starts_from_it(tmp_path, capsys):
    """--dry-run: one rl.sft on warmup_steps x warmup_batch reference answers, then each of the
    three official arms with trainer.init_from=<out>/warmup; --warmup-steps 0: none."""
    assert pro.main(["--dry-run", "--out", str(tmp_path), "--warmup-steps", "3"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("$")]
    assert len(lines) == 4 and "rl.sft" in lines[0]
    assert f"sft.examples={3 * pro.Budget.warmup_batch}" in lines[0].split()
    assert f"trainer.run_dir={tmp_path / 'warmup'}" in lines[0].split()
    arms = [next(w for w in x.split() if w.startswith("algo=")) for x in lines[1:]]
    assert arms == ["algo=rubric_rl_official", "algo=prorubric_official",
                    "algo=raw_and_verbatim"]
    assert all(f"trainer.init_from={tmp_path / 'warmup'}" in x.split() for x in lines[1:])
    assert pro.main(["--dry-run", "--out", str(tmp_path), "--warmup-steps", "0"]) == 0
    out = capsys.readouterr().out
    assert "rl.sft" not in out and "init_from" not in out


def test_prorubric_budget_flags_reach_the_warmup_and_every_arm(tmp_path, capsys):
    """--warmup-epochs sets the SFT passes; --max-new-tokens cuts the warm-up references and
    bounds every arm's responses; --group-size reaches every arm."""
    assert pro.main(["--dry-run", "--out", str(tmp_path), "--warmup-steps", "2",
                     "--warmup-epochs", "3", "--group-size", "8",
                     "--max-new-tokens", "160"]) == 0
    lines = [x.split() for x in capsys.readouterr().out.splitlines() if x.strip().startswith("$")]
    assert "sft.epochs=3" in lines[0] and "trainer.max_new_tokens=160" in lines[0]
    assert all("algo.group_size=8" in x and "trainer.max_new_tokens=160" in x
               for x in lines[1:])


def test_prorubric_warmup_stats(tmp_path):
    rows = [{"step": 0, "sft/dev_loss": 3.0, "sft/demo_outcome": 1.0},
            {"step": 0, "sft/loss": 2.5}, {"step": 1, "sft/loss": 1.5},
            {"step": 2, "sft/loss": 1.0}, {"step": 3, "sft/dev_loss": 1.25}]
    _write(tmp_path / "warmup", rows)
    assert pro.warmup_stats(tmp_path / "warmup") == {
        "steps": 3.0, "loss_first": 2.5, "loss_last": 1.0, "dev_loss_before": 3.0,
        "dev_loss_after": 1.25}
    assert pro.warmup_stats(tmp_path / "missing") is None


@pytest.mark.slow
def test_prorubric_smoke_warmup_then_arm(tmp_path):
    """--smoke end to end (tiny model, subprocesses): the rl.sft warm-up writes its checkpoint,
    the arm starts from it (its resolved config says so), the summary carries both."""
    from omegaconf import OmegaConf

    out = tmp_path / "exp"
    assert pro.main(["--smoke", "--out", str(out), "--algos", "rubric_rl_official"]) == 0
    assert (out / "warmup" / "checkpoints" / "1").is_dir()
    cfg = OmegaConf.load(out / "rubric_rl_official_s0" / "config.yaml")
    assert cfg.trainer.init_from == str(out / "warmup")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["warmup"]["steps"] == 1.0
    row = summary["table"]["rubric_rl_official"]
    assert row["steps"] == 1.0 and 0.0 <= row["homog_first"] <= 1.0
