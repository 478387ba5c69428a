"""The scripts in ``examples/`` run as a newcomer runs them (``python examples/<name>.py``,
from the repository root) and do what they say: a registered rewarder and task train 2 steps
on the tiny model with the rewards they define, and a run folder's curves are plotted."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import ROOT

EXAMPLES = ROOT / "examples"
TRAIN_STEPS = 2


def run_script(*args: str | Path) -> str:
    """Run from the repository root; its stdout (the test fails with stderr's tail)."""
    res = subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def steps(run_dir: Path) -> list[dict]:
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if "reward/mean" in r]


@pytest.fixture(scope="module")
def reward_run(tmp_path_factory) -> tuple[Path, str]:
    run_dir = tmp_path_factory.mktemp("custom_reward") / "run"
    out = run_script(EXAMPLES / "custom_reward.py", f"trainer.run_dir={run_dir}",
                     "trainer.sample_every=1")
    return run_dir, out


def test_custom_reward_pays_outcome_plus_length_bonus(reward_run):
    run_dir, out = reward_run
    records = steps(run_dir)
    assert [r["step"] for r in records] == list(range(TRAIN_STEPS))
    for r in records:  # the step's reward is the outcome plus the rewarder's own metric
        assert r["reward/mean"] == pytest.approx(
            r["outcome/mean"] + r["reward/length_bonus_mean"], abs=1e-6)
        assert f"step {r['step']}: reward {r['reward/mean']:.4f}" in out
    # each trajectory's reward, by hand: outcome + 0.1 * max(0, 1 - characters / 200)
    samples = read_jsonl(run_dir / "samples.jsonl")
    assert {s["step"] for s in samples} == set(range(TRAIN_STEPS))
    for s in samples:
        bonus = 0.1 * max(0.0, 1.0 - len(s["response"]) / 200)
        assert s["reward"] == pytest.approx(s["outcome"] + bonus, abs=1e-6), s
    assert any(s["reward"] > s["outcome"] for s in samples)  # the bonus is paid
    assert f"run folder: {run_dir}" in out


def test_custom_task_trains_on_its_own_prompts(tmp_path):
    run_dir = tmp_path / "run"
    out = run_script(EXAMPLES / "custom_task.py", f"trainer.run_dir={run_dir}",
                     "trainer.sample_every=1")
    records = steps(run_dir)
    assert [r["step"] for r in records] == list(range(TRAIN_STEPS))
    assert all(0.0 <= r["outcome/mean"] <= 1.0 for r in records)
    samples = read_jsonl(run_dir / "samples.jsonl")
    assert {s["step"] for s in samples} == set(range(TRAIN_STEPS))
    train = {"France": "Paris", "Japan": "Tokyo", "Italy": "Rome", "Egypt": "Cairo",
             "Canada": "Ottawa", "Kenya": "Nairobi", "Peru": "Lima", "Spain": "Madrid"}
    for s in samples:  # the task's training split, scored by its own rule
        country = re.fullmatch(r"What is the capital of (\w+)\?", s["question"]).group(1)
        assert s["answer"] == train[country]
        answers = re.findall(r"<answer>\s*(.*?)\s*</answer>", s["response"], re.DOTALL)
        right = bool(answers) and answers[-1].lower() == s["answer"].lower()
        assert s["outcome"] == float(right), s
    assert "a sample: What is the capital of " in out


def test_plot_run_on_an_arbor_run(tmp_path):
    run_dir = tmp_path / "arbor"
    run_script("-m", "rl.train", "model=tiny", "task=search_qa", "judge=rule", "algo=arbor",
               "algo.embedder=hashing", "task.n_entities=200", "task.n_train=40",
               "task.n_dev=4", "task.n_test=4", f"task.cache_dir={tmp_path / 'index'}",
               "task.max_turns=1", "task.max_response_tokens=64", "task.max_obs_tokens=40",
               "trainer.batch_prompts=2", "algo.group_size=4", "trainer.max_new_tokens=16",
               f"trainer.max_steps={TRAIN_STEPS}", "trainer.eval_at_ends=false",
               "trainer.progress=false", "trainer.loggers=[]", f"trainer.run_dir={run_dir}",
               f"hydra.run.dir={run_dir}")
    png = tmp_path / "curves.png"
    out = run_script(EXAMPLES / "plot_run.py", run_dir, "--out", png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for key in ("reward/mean", "groups/homogeneous_frac", "memory/drafts", "memory/commons"):
        assert f"{key}: {TRAIN_STEPS} points" in out, out
    assert f"wrote {png}" in out


def test_plot_run_without_memory_defaults_into_the_run_folder(reward_run):
    run_dir, _ = reward_run
    out = run_script(EXAMPLES / "plot_run.py", run_dir)
    assert (run_dir / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert f"reward/mean: {TRAIN_STEPS} points" in out and "memory/" not in out


def test_the_command_line_imports_a_users_rewarder(tmp_path):
    """``imports=[custom_reward]``: rl.train imports the module (found on PYTHONPATH), whose
    import registers ``short_answers``; each sample's reward is its outcome plus the bonus,
    by hand."""
    run_dir = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(EXAMPLES), str(ROOT)]))
    res = subprocess.run(
        [sys.executable, "-m", "rl.train", "imports=[custom_reward]",
         "algo.rewarder=short_answers", "+algo.rewarder_options.bonus=0.5", "model=tiny",
         "trainer.max_steps=1", "trainer.batch_prompts=2", "algo.group_size=4",
         "trainer.max_new_tokens=8", "trainer.eval_at_ends=false", "trainer.progress=false",
         "trainer.loggers=[]", "trainer.sample_every=1", f"trainer.run_dir={run_dir}",
         f"hydra.run.dir={tmp_path / 'hydra'}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    samples = read_jsonl(run_dir / "samples.jsonl")
    assert samples
    for s in samples:
        bonus = 0.5 * max(0.0, 1.0 - len(s["response"]) / 200)
        assert s["reward"] == pytest.approx(s["outcome"] + bonus, abs=1e-6), s


def test_a_module_that_cannot_be_imported_is_named():
    from rl.run.config import ConfigError
    from rl.run.wiring import import_user_modules

    with pytest.raises(ConfigError, match=r"^imports\[1\]: cannot import 'no_such_module_x': "
                                          r"ModuleNotFoundError"):
        import_user_modules(["json", "no_such_module_x"])
    with pytest.raises(ConfigError, match=r"^imports: expected a list of module names"):
        import_user_modules("json")
    with pytest.raises(ConfigError, match=r"^imports\[0\]: expected a module name, got 3"):
        import_user_modules([3])
