"""Honest resume (issue 22) on `model=tiny`: changed settings refused by name unless allowed,
a config history instead of an overwritten config.yaml, resume=true without a checkpoint
refused (resume=auto starts afresh), a corrupt latest checkpoint replaced by the previous one
with the run still ending bit-identical, judge counters continuing across resume."""

import dataclasses
import json
import logging

import jax
import numpy as np
import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import rl.run.trainer
from rl.run.resume import changes, settings
from rl.run.trainer import CheckpointError, ConfigError, build_trainer
from tests.paths import CONF

TINY = ["model=tiny", "task=arith", "task.size=16", "task.eval_size=4", "trainer.batch_prompts=2",
        "algo.group_size=2", "trainer.max_new_tokens=4", "trainer.eval_at_ends=false",
        "trainer.progress=false", "trainer.loggers=[]", "optim.lr=1e-3"]


def make_cfg(run_dir, *overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[*TINY, f"trainer.run_dir={run_dir}", *overrides])
    return OmegaConf.to_container(cfg, resolve=True)


def train(run_dir, *overrides, until=None):
    """Build (with config.yaml text, as rl.train does), run, close; returns the trainer."""
    cfg = make_cfg(run_dir, *overrides)
    t = build_trainer(cfg, OmegaConf.to_yaml(cfg))
    t.run(until=until)
    t.close()
    return t


def records(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_resume_refuses_changed_settings_naming_each_key_with_both_values(tmp_path):
    run = tmp_path / "r"
    train(run, "trainer.max_steps=2", "trainer.save_every=1", until=1)
    with pytest.raises(ConfigError) as e:
        build_trainer(make_cfg(run, "trainer.max_steps=2", "trainer.resume=true",
                               "optim.lr=2e-3", "algo.beta=0.05", "algo.entropy_coef=0.01",
                               "trainer.max_new_tokens=5"))
    msg = str(e.value)
    for part in ("optim.lr: 0.001 (checkpoint) -> 0.002 (now)",
                 "algo.beta: 0.0 (checkpoint) -> 0.05 (now)",
                 "algo.entropy_coef: 0.0 (checkpoint) -> 0.01 (now)",
                 "trainer.max_new_tokens: 4 (checkpoint) -> 5 (now)",
                 "at step 1 in " + str(run / "checkpoints"), "trainer.resume_allow_changes=["):
        assert part in msg, msg
    assert "trainer.resume:" in msg and "trainer.run_dir" not in msg.split("(now)")[0]
    with pytest.raises(ConfigError, match="resume_allow_changes: 'optim.lrr' is not a config"):
        build_trainer(make_cfg(run, "trainer.max_steps=2", "trainer.resume=true",
                               "optim.lr=2e-3", "trainer.resume_allow_changes=[optim.lrr]"))


def test_allowed_changes_resume_and_are_recorded_in_the_config_history(tmp_path):
    run = tmp_path / "r"
    train(run, "trainer.max_steps=2", "trainer.save_every=1", until=1)
    first_config = (run / "config.yaml").read_text()
    # more steps, evaluation and checkpoint cadence are free; lr is allowed explicitly
    cfg = make_cfg(run, "trainer.max_steps=3", "trainer.save_every=2", "trainer.resume=true",
                   "optim.lr=2e-3", "trainer.resume_allow_changes=[optim.lr]")
    t = build_trainer(cfg, OmegaConf.to_yaml(cfg))
    assert t.start_step == 1
    t.run()
    t.close()
    assert (run / "config.yaml").read_text() == first_config  # what the first step used
    assert yaml.safe_load(first_config)["optim"]["lr"] == 1e-3
    history = records(run / "config_history.jsonl")
    assert [(h["start_step"], h["resumed"]) for h in history] == [(0, False), (1, True)]
    assert history[1]["allowed_changes"] == {"optim.lr": [0.001, 0.002]}
    assert history[1]["config"]["optim"]["lr"] == 2e-3
    assert history[1]["config"]["trainer"]["max_steps"] == 3
    # provenance: one record per start, appended, the earlier one kept
    starts = records(run / "provenance.jsonl")
    assert [p["start_step"] for p in starts] == [0, 1]
    assert starts[1]["packages"]["jax"] == jax.__version__
    assert starts[1]["devices"]["processes"] == 1 and starts[1]["hosts"][0]["process"] == 0
    # the step-3 checkpoint records lr 2e-3: resuming it again needs no allowance
    t = build_trainer(make_cfg(run, "trainer.max_steps=4", "trainer.resume=true",
                               "optim.lr=2e-3"))
    assert t.start_step == 3
    t.close()


def test_max_steps_is_a_computation_setting_under_a_cosine_schedule(tmp_path):
    run = tmp_path / "r"
    train(run, "trainer.max_steps=2", "trainer.save_every=1", "optim.schedule=cosine", until=1)
    with pytest.raises(ConfigError, match=r"trainer.max_steps: 2 \(checkpoint\) -> 3 \(now\) "
                                          r"\(the cosine learning-rate schedule"):
        build_trainer(make_cfg(run, "trainer.max_steps=3", "optim.schedule=cosine",
                               "trainer.resume=true"))


def test_settings_compare_the_contents_of_the_files_they_name(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "a", "answer": "b"}\n')
    raw = {"task": {"name": "qa", "train_path": str(data), "eval_paths": {"x": str(data)}}}
    before = settings(raw, "m1", train_prompts=[{"id": "p0"}])
    data.write_text('{"question": "a", "answer": "c"}\n')  # same path, other contents
    after = settings(raw, "m1", train_prompts=[{"id": "p1"}])
    diff = changes(before, after)
    assert set(diff) == {"task.train_path#sha256", "task#train_prompts_sha256"}
    assert "task.eval_paths.x#sha256" not in after  # evaluation data is free to change


def test_resume_true_without_a_checkpoint_is_an_error_and_deletes_nothing(tmp_path):
    run = tmp_path / "typo"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0, "loss": 1.0}\n')
    with pytest.raises(ConfigError, match=f"trainer.resume=true: {run} holds no checkpoint"):
        build_trainer(make_cfg(run, "trainer.resume=true"))
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl"]
    assert (run / "metrics.jsonl").read_text() == '{"step": 0, "loss": 1.0}\n'


def test_resume_auto_starts_afresh_without_a_checkpoint_and_resumes_with_one(tmp_path):
    run = tmp_path / "r"
    t = build_trainer(make_cfg(run, "trainer.max_steps=2", "trainer.save_every=1",
                               "trainer.resume=auto"))
    assert t.start_step == 0
    t.run(until=1)
    t.close()
    t = build_trainer(make_cfg(run, "trainer.max_steps=4", "trainer.save_every=1",
                               "trainer.resume=auto", "trainer.keep_checkpoints=all"))
    assert t.start_step == 1
    t.run()
    t.close()
    # keep_checkpoints=all: every save stays (the default, 2, would leave 3 and 4)
    assert sorted(int(p.name) for p in (run / "checkpoints").iterdir()) == [1, 2, 3, 4]


def _flip_8_bytes_in_the_params(step_dir):
    files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and "d" in p.parts]
    big = max(files, key=lambda p: p.stat().st_size)
    data = bytearray(big.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 8] = bytes(b ^ 0xFF for b in data[mid:mid + 8])
    big.write_bytes(bytes(data))


def test_a_corrupt_latest_checkpoint_falls_back_and_the_run_ends_bit_identical(
        tmp_path, caplog):
    common = ["trainer.max_steps=3", "trainer.save_every=1", "trainer.keep_checkpoints=2"]
    ref = jax.device_get(train(tmp_path / "straight", *common).state.params)
    run = tmp_path / "r"
    train(run, *common, until=2)
    _flip_8_bytes_in_the_params(run / "checkpoints" / "2")
    with caplog.at_level(logging.WARNING, "rl.run.checkpoint"):
        t = build_trainer(make_cfg(run, *common, "trainer.resume=true"))
    assert t.start_step == 1
    assert f"step 2 ({run / 'checkpoints' / '2'})" in caplog.text
    assert "Resuming from step 1 instead: steps 1-1 (1) are trained again" in caplog.text
    t.run()
    t.close()
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(t.state.params), ref)
    assert [r["step"] for r in records(run / "metrics.jsonl")] == [0, 1, 2]
    assert (run / "checkpoints_corrupt" / "2").is_dir()


def test_no_valid_checkpoint_is_an_error_naming_the_folder(tmp_path):
    run = tmp_path / "r"
    train(run, "trainer.max_steps=1", "trainer.save_every=1")
    _flip_8_bytes_in_the_params(run / "checkpoints" / "1")
    with pytest.raises(CheckpointError, match=f"trainer.resume: {run / 'checkpoints'}: no "
                                              f"valid checkpoint.*step 1"):
        build_trainer(make_cfg(run, "trainer.max_steps=2", "trainer.resume=true"))


class CountingJudge:
    """A judge whose counters grow by one request per reward call (the outcome rewarder never
    calls a judge, so the loop's stats() call stands in for one)."""

    def __init__(self):
        self.n = 0

    def stats(self):
        self.n += 1
        return {"requests": self.n, "timeouts": 0}


def _with_judge(trainer):
    trainer.parts = dataclasses.replace(trainer.parts, judge=CountingJudge())
    return trainer


def test_judge_counters_are_cumulative_across_resume(tmp_path):
    run = tmp_path / "r"
    first = _with_judge(build_trainer(make_cfg(run, "trainer.max_steps=4",
                                               "trainer.save_every=2")))
    # each step reads the counter before and after its rollout (judges.cost): the records
    # read requests 2, 4; the checkpoint at step 2 reads 5
    first.run(until=2)
    first.close()
    resumed = _with_judge(build_trainer(make_cfg(run, "trainer.max_steps=4",
                                                 "trainer.resume=true")))
    resumed.run()  # a fresh judge: 2, 4 in this process, on top of the 5 before
    resumed.close()
    got = [r["judge/requests"] for r in records(run / "metrics.jsonl")]
    assert got == [2, 4, 5 + 2, 5 + 4]


class CountingRetrievalEnv:
    """The task's environment plus retrieval counters that grow by one search per call."""

    def __init__(self, env):
        self.env, self.n = env, 0

    def rollout(self, *args, **kwargs):
        return self.env.rollout(*args, **kwargs)

    def retrieval_stats(self):
        self.n += 1
        return {"searches": self.n}


def test_retrieval_counters_are_cumulative_across_resume(tmp_path):
    def with_env(trainer):
        trainer.parts = dataclasses.replace(trainer.parts,
                                            env=CountingRetrievalEnv(trainer.parts.env))
        return trainer

    run = tmp_path / "r"
    first = with_env(build_trainer(make_cfg(run, "trainer.max_steps=4", "trainer.save_every=2")))
    first.run(until=2)  # records 1, 2; the checkpoint at step 2 reads 3
    first.close()
    resumed = with_env(build_trainer(make_cfg(run, "trainer.max_steps=4",
                                              "trainer.resume=true")))
    resumed.run()
    resumed.close()
    got = [r["retrieval/searches"] for r in records(run / "metrics.jsonl")]
    assert got == [1, 2, 3 + 1, 3 + 2]


class SamplingJudge(CountingJudge):
    """A judge with a sampling position, like the local judge's sampler call count."""

    def __init__(self):
        super().__init__()
        self.position, self.restored = 0, None

    def sampling_state(self):
        self.position += 1
        return {"n_generate": self.position}

    def restore_sampling_state(self, state):
        self.restored = dict(state)

    def versions(self):
        return {}


def test_the_judges_sampling_position_is_saved_and_restored(tmp_path, monkeypatch):
    run = tmp_path / "r"
    first = build_trainer(make_cfg(run, "trainer.max_steps=2", "trainer.save_every=1"))
    first.parts = dataclasses.replace(first.parts, judge=SamplingJudge())
    first.run(until=2)  # checkpoints at steps 1 and 2 read positions 1 and 2
    first.close()
    judge = SamplingJudge()
    monkeypatch.setattr(rl.run.trainer, "make_judge", lambda cfg: judge)
    resumed = build_trainer(make_cfg(run, "trainer.max_steps=2", "trainer.resume=true"))
    resumed.close()
    assert judge.restored == {"n_generate": 2}


def test_a_failure_while_rewriting_the_logs_on_resume_leaves_them_whole(tmp_path, monkeypatch):
    """Resume rewrites metrics.jsonl without the steps it redoes; a kill in the middle of the
    rewrite (here: the rename failing) leaves the old file as it was, not empty."""
    import core.files
    from rl.run.runlog import RunLog

    lines = "".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(5))
    (tmp_path / "metrics.jsonl").write_text(lines)

    def killed(*args):
        raise KeyboardInterrupt("killed during the rewrite")

    monkeypatch.setattr(core.files.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        RunLog(tmp_path, resume_step=2, loggers=())
    assert (tmp_path / "metrics.jsonl").read_text() == lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]  # no temp file left
    monkeypatch.undo()
    RunLog(tmp_path, resume_step=2, loggers=()).close()
    assert [r["step"] for r in records(tmp_path / "metrics.jsonl")] == [0, 1]


def test_a_checkpoint_from_before_the_kv_cache_dtype_key_resumes_as_float32():
    before = {"trainer.rollout_dtype": "float32"}  # written before trainer.kv_cache_dtype
    assert changes(before, {**before, "trainer.kv_cache_dtype": "float32"}) == {}
    assert changes(before, {**before, "trainer.kv_cache_dtype": "bfloat16"}) == {
        "trainer.kv_cache_dtype": ("float32", "bfloat16")}
    # and before trainer.decode_kernel: those runs decoded by XLA's attention
    assert changes(before, {**before, "trainer.decode_kernel": "xla"}) == {}
    assert changes(before, {**before, "trainer.decode_kernel": "pallas_gpu"}) == {
        "trainer.decode_kernel": ("xla", "pallas_gpu")}
    # trainer.rollout_sub_batches (2026-12-05): runs before it gathered their rows
    assert changes(before, {**before, "trainer.rollout_sub_batches": True}) == {}
    assert changes(before, {**before, "trainer.rollout_sub_batches": False}) == {
        "trainer.rollout_sub_batches": (True, False)}


def test_a_resume_takes_its_weights_from_the_checkpoint_alone(tmp_path, char_model,
                                                            monkeypatch):
    """No KL reference and no LoRA: a resume reads the model's config and tokenizer but not
    one byte of its weights (the checkpoint holds them), and ends as an uninterrupted run."""
    from models import loaders

    hf = ["model=hf", f"model.path={char_model}", "trainer.max_steps=2", "trainer.save_every=1"]

    def run_of(run_dir, *overrides, until=None):
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose("config", overrides=[*(o for o in TINY if o != "model=tiny"), *hf,
                                               f"trainer.run_dir={run_dir}", *overrides])
        t = build_trainer(OmegaConf.to_container(cfg, resolve=True))
        t.run(until=until)
        t.close()
        return t

    ref = jax.device_get(run_of(tmp_path / "straight").state.params)
    run_of(tmp_path / "r", until=1)

    def refuse(self, name, index):
        raise AssertionError(f"the resume read {name} from {self.source}")

    monkeypatch.setattr(loaders.SafetensorsFiles, "read", refuse)
    t = run_of(tmp_path / "r", "trainer.resume=true")
    assert t.start_step == 1
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(t.state.params), ref)


def test_a_resumed_run_reuses_the_rollout_program_of_the_run_before(tmp_path):
    """A fresh run's train state is committed to its device, as a restored one is: the
    programs of both are the same, so a resume finds them compiled (committed and uncommitted
    arguments compile apart; on an H200 a resumed Qwen3-0.6B run compiled for 20 s again)."""
    from models.sampler import _generate

    common = ["trainer.max_steps=2", "trainer.save_every=1", "trainer.skip_zero_advantage=false"]
    run = tmp_path / "r"
    train(run, *common, until=1)
    compiled = _generate._cache_size()
    train(run, *common, "trainer.resume=true")
    assert _generate._cache_size() == compiled


def test_a_checkpoint_with_the_old_correctness_keys_resumes_under_algo_correct_at():
    """The positive-only gate's F1 threshold and PROF's correctness threshold became the one
    algo.correct_at; a PROF run from before the key paid the rewarder's total."""
    old = {"algo.rubric_gate_f1": 1.0, "algo.consistency_correct": 1.0,
           "algo.rewarder_options.rubric_gate_f1": 1.0, "algo.consistency_filter": "none"}
    new = {"algo.correct_at": 1.0, "algo.rewarder_options.correct_at": 1.0,
           "algo.consistency_filter": "none", "algo.consistency_reward": "outcome"}
    assert changes(old, new) == {}
    assert changes(old, {**new, "algo.correct_at": 0.5}) == {"algo.correct_at": (1.0, 0.5)}
    # two old thresholds that disagree stay under their names: both show as removed
    split = changes({**old, "algo.rubric_gate_f1": 0.5}, new)
    assert set(split) == {"algo.rubric_gate_f1", "algo.consistency_correct"}
    prof = {**old, "algo.consistency_filter": "prof"}
    assert changes(prof, {**new, "algo.consistency_filter": "prof"}) == {
        "algo.consistency_reward": ("total", "outcome")}
