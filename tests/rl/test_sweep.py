"""An optimising sweep: rl.train returns trainer.objective to hydra, and the Optuna sweeper
(hydra-optuna-sweeper, the dev extra) picks the best of 2 trials on the tiny model."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from rl.train import objective
from tests.paths import ROOT


def test_the_objective_is_the_metrics_last_value():
    assert objective("eval/outcome_mean", {"eval/outcome_mean": 0.25, "loss": 1.0}) == 0.25
    assert objective(None, {"loss": 1.0}) is None
    assert objective("eval/outcome_mean", {"loss": 1.0}) is None  # never logged: a warning


def test_no_objective_warning_for_a_run_that_never_evaluates(caplog):
    with caplog.at_level("WARNING", logger="rl.train"):
        assert objective("eval/outcome_mean", {"loss": 1.0}, evaluates=False) is None
    assert caplog.text == ""
    with caplog.at_level("WARNING", logger="rl.train"):
        assert objective("eval/outcome_mean", {"loss": 1.0}, evaluates=True) is None
        assert objective("reward/mean", {"loss": 1.0}, evaluates=False) is None
    assert caplog.text.count("was never logged") == 2


def test_a_two_trial_optuna_sweep_maximises_the_objective(tmp_path):
    """Objective tokens_per_s (it differs between trials): the sweep's best value is the
    largest of the trials' last logged values, read back from their metrics.jsonl."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    sweep = tmp_path / "sweep"
    res = subprocess.run(
        [sys.executable, "-m", "rl.train", "-m", "hydra/sweeper=optuna",
         "hydra.sweeper.n_trials=2", "hydra.sweeper.direction=maximize",
         "hydra.sweeper.sampler.seed=0", "optim.lr=interval(0.0001,0.01)", "model=tiny",
         "trainer.max_steps=1", "trainer.batch_prompts=2", "algo.group_size=2",
         "trainer.max_new_tokens=4", "trainer.eval_at_ends=false", "trainer.progress=false",
         "trainer.loggers=[]", "trainer.objective=tokens_per_s", f"hydra.sweep.dir={sweep}"],
        cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True,
        timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    trials = [d for d in sweep.iterdir() if d.is_dir()]
    assert len(trials) == 2
    last = [json.loads((d / "metrics.jsonl").read_text().splitlines()[-1])["tokens_per_s"]
            for d in trials]
    result = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert result["best_value"] == pytest.approx(max(last))
    assert 1e-4 <= result["best_params"]["optim.lr"] <= 1e-2
