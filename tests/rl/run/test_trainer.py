"""The host loop on the tiny model: learning, exact resume, config errors, sharded step."""

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from core.types import Group, Prompt, Trajectory
from rl.run.config import parse
from rl.run.loop import shaped_rewards
from rl.run.trainer import ConfigError, build_trainer
from rl.run.wiring import TASKS
from tests.paths import CONF

CONF = str(CONF)


@TASKS.register("low_tokens")
@dataclasses.dataclass(frozen=True)
class LowTokensTask:
    """Trivially learnable: reward = fraction of generated tokens that are lower-case letters
    (ids 2..27 of the character model's vocabulary; base rate about 1/3)."""

    size: int = 64
    name: str = "low_tokens"

    def prompts(self, split):
        return [Prompt(id=f"p{i}", messages=({"role": "user", "content": f"say something {i}"},))
                for i in range(self.size)]

    def make_env(self, tokenizer, sampling):
        from rl.tasks.envs import SingleTurnEnv

        return SingleTurnEnv(tokenizer, sampling)

    def outcome(self, prompt, traj: Trajectory) -> float:
        toks = np.asarray(traj.tokens)
        return float(np.mean((toks >= 2) & (toks < 28))) if len(toks) else 0.0


@pytest.fixture(autouse=True)
def _char_model(char_model, monkeypatch):
    monkeypatch.setenv("CHAR_MODEL", str(char_model))


def make_cfg(run_dir, *overrides):
    import os

    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("config", overrides=["model=hf", f"model.path={os.environ['CHAR_MODEL']}",
                                           f"trainer.run_dir={run_dir}",
                                           "trainer.progress=false", "trainer.loggers=[]",
                                           *overrides])
    return OmegaConf.to_container(cfg, resolve=True)


LEARN = ["task=arith", "task.size=64", "task.name=low_tokens", "~task.eval_size",
         "~task.max_operand", "~task.ops", "~task.seed", "~task.format_reward"]


def test_grpo_raises_reward_on_learnable_task(tmp_path):
    cfg = make_cfg(tmp_path / "run", *LEARN, "trainer.max_steps=8", "trainer.batch_prompts=4",
                   "algo.group_size=8", "trainer.max_new_tokens=16", "optim.lr=1e-2",
                   "trainer.save_every=0")
    trainer = build_trainer(cfg)
    history = trainer.run()
    trainer.close()
    first = np.mean([h["reward/mean"] for h in history[:2]])
    last = np.mean([h["reward/mean"] for h in history[-2:]])
    assert last > first + 0.1, [h["reward/mean"] for h in history]
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    rec = json.loads(lines[0])
    for key in ("step", "reward/mean", "reward/std", "groups/homogeneous_frac", "kl", "loss",
                "response/length_mean", "time/rollout_s", "time/train_s", "tokens_per_s"):
        assert key in rec


def _final_params(run_dir):
    from rl.run.checkpoint import Checkpointer

    ck = Checkpointer(Path(run_dir) / "checkpoints")
    step = ck.latest_step()
    meta = ck.read_meta(step)
    ck.close()
    return step, meta


def test_exact_resume(tmp_path):
    common = [*LEARN, "trainer.max_steps=4", "trainer.save_every=2", "trainer.batch_prompts=2",
              "algo.group_size=2", "trainer.max_new_tokens=6", "optim.lr=1e-3",
              "trainer.eval_at_ends=false"]
    straight = build_trainer(make_cfg(tmp_path / "a", *common))
    straight.run(eval_every=2)
    ref = jax.device_get(straight.state.params)
    straight.close()

    first = build_trainer(make_cfg(tmp_path / "b", *common))
    first.run(eval_every=2, until=2)  # "interrupted" after the checkpoint at step 2 ...
    first.close()
    with (tmp_path / "b" / "metrics.jsonl").open("a") as f:
        f.write('{"step": 2, "reward/me')  # ... while writing a line
    with pytest.raises(ConfigError, match="trainer.resume=true"):
        build_trainer(make_cfg(tmp_path / "b", *common))
    resumed = build_trainer(make_cfg(tmp_path / "b", *common, "trainer.resume=true"))
    assert resumed.start_step == 2 and resumed.loop.data_position == 2
    resumed.run(eval_every=2)
    got = jax.device_get(resumed.state.params)
    resumed.close()
    jax.tree.map(np.testing.assert_array_equal, got, ref)
    records = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text()
               .splitlines()]
    assert [r["step"] for r in records if "eval/n" not in r] == [0, 1, 2, 3]
    # the evaluation of the step-2 checkpoint survives the resume; it is not run twice
    assert [r["step"] for r in records if "eval/n" in r] == [2, 4]


def test_resumed_run_keeps_its_init_from_weights_as_kl_reference(tmp_path):
    common = [*LEARN, "trainer.batch_prompts=2", "algo.group_size=2", "trainer.max_new_tokens=4",
              "trainer.eval_at_ends=false", "optim.lr=1e-2"]
    warm_cfg = make_cfg(tmp_path / "warm", *common, "trainer.max_steps=1")
    warm = build_trainer(warm_cfg, OmegaConf.to_yaml(warm_cfg))  # a run folder with its config
    warm.run()
    warmed = jax.device_get(warm.state.params)
    warm.close()
    rl = [*common, "trainer.max_steps=2", "trainer.save_every=1", "algo.beta=0.1",
          f"trainer.init_from={tmp_path / 'warm'}"]
    first = build_trainer(make_cfg(tmp_path / "rl", *rl))
    first.run(until=1)
    first.close()
    resumed = build_trainer(make_cfg(tmp_path / "rl", *rl, "trainer.resume=true"))
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(resumed.parts.ref_params), warmed)
    resumed.close()
    with pytest.raises(ConfigError, match="incompatible.*init_from"):
        build_trainer(make_cfg(tmp_path / "rl", *common, "trainer.max_steps=2",
                               "trainer.save_every=1", "algo.beta=0.1", "trainer.resume=true"))


def test_incompatible_checkpoint_is_refused(tmp_path):
    common = [*LEARN, "trainer.max_steps=1", "trainer.batch_prompts=2", "algo.group_size=2",
              "trainer.max_new_tokens=4", "trainer.eval_at_ends=false"]
    t = build_trainer(make_cfg(tmp_path / "r", *common))
    t.run()
    t.close()
    with pytest.raises(ConfigError, match="incompatible.*group_size"):
        build_trainer(make_cfg(tmp_path / "r", *common, "algo.group_size=3",
                               "trainer.resume=true"))
    with pytest.raises(ConfigError, match="incompatible.*seed"):  # another prompt order
        build_trainer(make_cfg(tmp_path / "r", *common, "trainer.seed=7", "trainer.resume=true"))


def _with_eval_dtype(parts, dtype):
    """The run's components with trainer.eval_dtype set to `dtype`."""
    import dataclasses

    trainer = dataclasses.replace(parts.run.trainer, eval_dtype=dtype)
    return dataclasses.replace(parts, run=dataclasses.replace(parts.run, trainer=trainer))


def test_bfloat16_rollouts_train_and_evaluate_in_bfloat16_unless_eval_dtype_says(tmp_path):
    t = build_trainer(make_cfg(tmp_path / "bf", *LEARN, "trainer.max_steps=1",
                               "trainer.batch_prompts=2", "algo.group_size=2",
                               "trainer.max_new_tokens=4", "trainer.rollout_dtype=bfloat16"))
    sampler = t.parts.policy(t.state.params)
    assert sampler.params["layers"][0]["wq"].dtype == jax.numpy.bfloat16
    # trainer.eval_dtype=null (the default): evaluation samples as the rollouts do
    evaluator = t.parts.policy(t.state.params, evaluation=True)
    assert evaluator.params["layers"][0]["wq"].dtype == jax.numpy.bfloat16
    in_float32 = _with_eval_dtype(t.parts, "float32").policy(t.state.params, evaluation=True)
    assert in_float32.params["layers"][0]["wq"].dtype == jax.numpy.float32
    t.run()
    t.close()
    recs = [json.loads(x) for x in (tmp_path / "bf" / "metrics.jsonl").read_text().splitlines()]
    assert any("reward/mean" in r for r in recs)
    assert all(np.isfinite(r["loss"]) for r in recs if "loss" in r)


def test_kv_cache_dtype_reaches_the_evaluation_unless_eval_dtype_says(tmp_path):
    from models.sampler import SamplingParams

    t = build_trainer(make_cfg(tmp_path / "kv", *LEARN, "trainer.max_steps=1",
                               "trainer.batch_prompts=2", "algo.group_size=2",
                               "trainer.max_new_tokens=4", "trainer.kv_cache_dtype=bfloat16",
                               "trainer.prefill_pin_rows=false",
                               "trainer.rollout_sub_batches=false"))
    sampler = t.parts.policy(t.state.params)
    evaluator = t.parts.policy(t.state.params, evaluation=True)
    # the prefill's layout (memory only) and the continuations' rows are the config's for both
    assert sampler.prefill_pin_rows is False and evaluator.prefill_pin_rows is False
    assert sampler.sub_batches is False and evaluator.sub_batches is False
    # the environments' sampling says float32 (the default); the policy stores its cache
    sp = SamplingParams(4, temperature=0)

    def stored(policy):
        cache = policy.generate([[5, 6, 7]], sp, seed=0).state.cache
        return {np.dtype(a.dtype) for a in (*cache.k, *cache.v)}

    assert stored(sampler) == {np.dtype(jax.numpy.bfloat16)}
    assert stored(evaluator) == {np.dtype(jax.numpy.bfloat16)}  # trainer.eval_dtype=null
    in_float32 = _with_eval_dtype(t.parts, "float32").policy(t.state.params, evaluation=True)
    assert stored(in_float32) == {np.dtype(np.float32)}
    assert sampler.params["layers"][0]["wq"].dtype == jax.numpy.float32  # rollout_dtype apart
    t.close()


def test_dapo_overlong_shaping_ramps_over_the_last_quarter_of_the_budget(tmp_path):
    """algo=dapo with the default buffer (a quarter of a 16-token budget): responses up to 12
    tokens are not punished, then -1/4 per token, -1 at the budget."""
    parts = SimpleNamespace(run=parse(make_cfg(tmp_path / "d", "algo=dapo")),
                            response_budget=16)  # the two fields shaping reads
    trajs = tuple(Trajectory((1,), (2,) * n, (1,) * n, (0.0,) * n, "", "eos")
                  for n in (8, 12, 14, 16))
    groups = [Group(Prompt("p", ({"role": "user", "content": "q"},)), trajs)]
    shaped = shaped_rewards(parts, groups, np.zeros((1, 4)))
    np.testing.assert_allclose(shaped, [[0.0, 0.0, -0.5, -1.0]])


def test_bfloat16_model_trains_float32_master_weights(tmp_path):
    """model.dtype=bfloat16 computes in bfloat16, but an lr of 1e-6 still moves the weights:
    bfloat16 weights would round such updates away."""
    t = build_trainer(make_cfg(tmp_path / "bf", *LEARN, "model.dtype=bfloat16",
                               "optim.lr=1e-6", "optim.warmup_steps=0", "trainer.max_steps=1",
                               "trainer.batch_prompts=2", "algo.group_size=4",
                               "trainer.max_new_tokens=8", "trainer.eval_at_ends=false"))
    assert t.loss_cfg.compute_dtype == "bfloat16"
    before = jax.device_get(t.state.params)
    assert all(a.dtype == np.float32 for a in jax.tree.leaves(before))
    t.run()
    after = jax.device_get(t.state.params)
    t.close()
    moved = [np.max(np.abs(a - b)) for a, b in zip(jax.tree.leaves(after),
                                                    jax.tree.leaves(before))]
    assert all(a.dtype == np.float32 for a in jax.tree.leaves(after))
    assert 0 < max(moved) < 1e-4  # Adam's first step: about lr per weight


@pytest.mark.parametrize("override, key", [
    ("algo.group_size=1", "algo.group_size"),
    ("algo.eps_low=-0.1", "algo.eps_low"),
    ("algo.beta=-1", "algo.beta"),
    ("trainer.mini_batches=3", "trainer.mini_batches"),
    ("algo.dual_clip=0.5", "algo.dual_clip"),
    ("trainer.rollout_dtype=float16", "trainer.rollout_dtype"),
    ("trainer.kv_cache_dtype=float16", "trainer.kv_cache_dtype: must be one of float32, "
     "bfloat16"),
    ("trainer.prefill_pin_rows=maybe", "trainer.prefill_pin_rows: expected true or false"),
    ("trainer.decode_kernel=triton", "trainer.decode_kernel: must be one of xla, pallas_gpu"),
    ("trainer.rollout_sub_batches=2", "trainer.rollout_sub_batches: expected true or false"),
    ("trainer.batch_prompts=4 trainer.rollout_chunks=3", "trainer.rollout_chunks: must be >= 1 "
     "and divide trainer.batch_prompts = 4, got 3"),
    ("algo.loss_agg=token_mean", "algo.loss_agg"),
    ("algo.advantage=dr_grpo", "algo.advantage"),
    ("algo.std_ddof=2", "algo.std_ddof: must be 0 or 1"),
    ("algo.kl_estimator=kl3", "algo.kl_estimator"),
    ("algo.overlong.enabled=true algo.overlong.buffer_len=16", "algo.overlong.buffer_len"),
    ("algo.overlong.enabled=true algo.overlong.penalty=-1", "algo.overlong.penalty"),
    # the typed config: unknown keys are refused, values of the wrong type named
    ("+trainer.foo=1", "trainer.foo: unknown key"),
    ("+x=1", "x: unknown top-level key"),
    ("algo.beta=abc", "algo.beta: expected a number"),
    ("trainer.max_steps=2.5", "trainer.max_steps: expected an integer"),
    ("trainer.resume=maybe", "trainer.resume: expected false or true or auto"),
    ("trainer.keep_checkpoints=0", "trainer.keep_checkpoints: must be >= 1, or all"),
    ("trainer.keep_checkpoints=some", "trainer.keep_checkpoints: expected an integer or all"),
    ("optim.lr=0", "optim.lr"),
    ("~trainer.seed", "trainer.seed: missing"),
    ("algo.filter_metric=acc", "algo.filter_metric: must be one of"),
    ("mesh.rollout_shape={data:3}", "mesh.rollout_shape"),
    ("judge=openai judge.price_per_mtok_in=-1", "judge.price_per_mtok_in must be >= 0"),
])
def test_invalid_config_names_the_key(tmp_path, override, key):
    with pytest.raises(ConfigError, match=key.replace(".", "\\.")):
        build_trainer(make_cfg(tmp_path / "x", *override.split()))
    assert not (tmp_path / "x" / "metrics.jsonl").exists()


def test_unknown_group_options_fail_in_hydra(tmp_path):
    from hydra.errors import MissingConfigException

    for bad in ("algo=nope", "task=nope", "model=nope"):
        with pytest.raises(MissingConfigException, match=bad.split("=")[0]):
            make_cfg(tmp_path, bad)


def test_cli_runs_and_writes_run_folder(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "rl.train", "model=tiny", "algo=dapo", "trainer.max_steps=2",
         "trainer.batch_prompts=2", "algo.group_size=2", "trainer.max_new_tokens=4",
         "task.eval_size=4", f"trainer.run_dir={tmp_path / 'cli'}", "trainer.progress=false",
         f"hydra.run.dir={tmp_path / 'hydra'}"],
        capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    run = tmp_path / "cli"
    assert (run / "config.yaml").exists() and (run / "samples.jsonl").exists()
    assert any((run / "tb").iterdir())
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if "reward/mean" in r] == [0, 1]
    assert "eval/outcome_mean" in recs[0] and "dapo/gen_batches" in recs[1]
    assert 0 <= recs[1]["dapo/drawn_homogeneous_frac"] <= 1  # before dynamic sampling's filter
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["2"]
    # what the terminal shows first and last: where, what, on what, how to watch; the
    # evaluations before and after (the metrics file's own values) and where the results are
    log = res.stdout + res.stderr
    evals = [r["eval/outcome_mean"] for r in recs if "eval/outcome_mean" in r]
    for line in (f"run folder: {run}", "model tiny (float32), task arith, algo dapo (rewarder "
                 "outcome, judge none): steps 0..2, 2 prompts x 2 trajectories per step",
                 "devices: ", f"watch: tail -f {run}/metrics.jsonl  |  tensorboard --logdir "
                 f"{run}/tb", "done: 2 steps",
                 f"eval/outcome_mean on dev: {evals[0]:.3f} (step 0) -> {evals[1]:.3f} (step 2)",
                 f"metrics: {run}/metrics.jsonl", f"checkpoints: {run}/checkpoints"):
        assert line in log, line


def test_sharded_train_step_matches_single_device():
    code = textwrap.dedent("""
        import os
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + " --xla_force_host_platform_device_count=8")
        os.environ["JAX_PLATFORMS"] = "cpu"
        import jax, jax.numpy as jnp, numpy as np
        from models.presets import tiny_config
        from models.transformer import init_params
        from models.sharding import make_mesh, param_shardings, batch_sharding, shard
        import optax
        from rl.grpo.train_step import LossConfig, init_train_state, make_train_step
        cfg = tiny_config(vocab_size=256)
        params = init_params(cfg, jax.random.key(0))
        opt = optax.sgd(1.0)  # update = -grad: compares gradients without Adam's sign flips
        lc = LossConfig(beta=0.01, on_policy=False, micro_batches=2)
        rng = np.random.default_rng(0)
        n, g, p, r = 16, 2, 6, 10  # 16 groups of 2: 2 micro-batches x 8 shards
        batch = {"prefix": rng.integers(0, 256, (n, p)).astype(np.int32),
                 "prefix_mask": np.ones((n, p), bool),
                 "tokens": rng.integers(0, 256, (n, g, r)).astype(np.int32),
                 "attn_mask": np.ones((n, g, r), bool),
                 "loss_mask": (rng.random((n, g, r)) < 0.7).astype(np.float32),
                 "advantages": rng.normal(size=(n, g)).astype(np.float32),
                 "logp_old": -5.5 + 0.1 * rng.normal(size=(n, g, r)).astype(np.float32),
                 "logp_ref": -5.5 + 0.1 * rng.normal(size=(n, g, r)).astype(np.float32)}
        step = make_train_step(cfg, lc, opt, donate=False)
        ref_state, ref_m = step(init_train_state(params, opt), batch)
        mesh = make_mesh({"data": 4, "fsdp": 2, "tensor": 1})
        sp = shard(params, param_shardings(params, mesh))
        sb = jax.device_put(batch, batch_sharding(mesh, 1, None))
        state, m = step(init_train_state(sp, opt), sb)
        assert len(state.params["embed"].sharding.device_set) == 8
        for a, r in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref_state.params)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(r), atol=1e-5, rtol=1e-4)
        np.testing.assert_allclose(float(m["loss"]), float(ref_m["loss"]), rtol=1e-5)
        print("SHARDED_STEP_OK")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600)
    assert "SHARDED_STEP_OK" in res.stdout, res.stderr[-3000:]


def _tb_scalars(tb_dir):
    """(step, tag) of every scalar in the event files, oldest file first, with the purge
    markers a resumed run writes, as ("purge", step)."""
    import struct

    from tensorboardX.proto import event_pb2

    out = []
    for path in sorted(tb_dir.iterdir(), key=lambda p: p.stat().st_mtime_ns):
        data, i = path.read_bytes(), 0
        while i < len(data):
            n = struct.unpack("<Q", data[i:i + 8])[0]
            ev = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
            i += 16 + n
            if ev.HasField("session_log"):
                out.append(("purge", ev.step))
            out += [(ev.step, v.tag) for v in ev.summary.value]
    return out


def test_resumed_run_log_keeps_the_checkpoints_evaluation(tmp_path):
    from rl.run.runlog import RunLog

    log = RunLog(tmp_path)
    for step in range(3):
        log.metrics(step, {"loss": 1.0})
    log.metrics(2, {"eval/n": 4.0})  # the evaluation of the step-2 checkpoint
    log.close()
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "lo')  # killed mid-write
    RunLog(tmp_path, resume_step=2).close()
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], sorted(r)[0]) for r in records] == [(0, "loss"), (1, "loss"),
                                                            (2, "eval/n")]
    # TensorBoard drops everything at or after the purge step; the evaluation is written again
    scalars = _tb_scalars(tmp_path / "tb")
    after = scalars[scalars.index(("purge", 2)) + 1:]
    assert after == [(2, "eval/n")]


def test_update_log_probs_are_the_sampled_policys_at_its_temperature(tmp_path):
    """At trainer.temperature=0.7 the update, old-policy and reference passes score the policy
    that sampled (logits / 0.7, as verl and TRL): their log-probs of the sampled tokens equal
    the sampler's own, and differ from the temperature-1 log-probs."""
    from rl.run import loop as L

    t = build_trainer(make_cfg(tmp_path / "t", *LEARN, "trainer.batch_prompts=2",
                               "algo.group_size=4", "trainer.max_new_tokens=8",
                               "trainer.temperature=0.7", "trainer.eval_at_ends=false"))
    assert t.loss_cfg.temperature == 0.7
    _, col = L.collect(t.parts, t.loop)
    batch = L.training_batch(t.parts, col.groups, col.out.rewards)
    ours = L.logprobs_with(t.parts, t.state.params, batch)
    trajs = [tr for g in col.groups for tr in g.trajectories]
    got = np.concatenate([ours.reshape(-1, ours.shape[-1])[i, :len(tr.tokens)]
                          for i, tr in enumerate(trajs)])
    sampled = np.concatenate([np.asarray(tr.logprobs) for tr in trajs])
    np.testing.assert_allclose(got, sampled, atol=2e-5)
    at_one = L.logprobs_with(dataclasses.replace(t.parts, loss_cfg=dataclasses.replace(
        t.loss_cfg, temperature=1.0)), t.state.params, batch)
    assert not np.allclose(at_one, ours, atol=1e-3)
    t.close()


def test_several_eval_splits_are_logged_each_and_averaged(tmp_path):
    """trainer.eval_split=[dev,test]: each split's metrics under eval/<split>/*, equal to a run
    evaluating that split alone, and eval/* their average (eval/n their total)."""
    common = ("task=arith", "task.eval_size=3", "trainer.max_new_tokens=6",
              "trainer.batch_prompts=2", "algo.group_size=2", "trainer.save_every=0")
    both = build_trainer(make_cfg(tmp_path / "both", *common, "trainer.eval_split=[dev,test]"))
    rec = both.evaluate(0)
    both.close()
    for split in ("dev", "test"):
        alone = build_trainer(make_cfg(tmp_path / split, *common, f"trainer.eval_split={split}"))
        one = alone.evaluate(0)
        alone.close()
        assert "eval/dev/n" not in one  # one split: the keys as before
        for key in ("outcome_mean", "n", "length_mean"):
            assert rec[f"eval/{split}/{key}"] == one[f"eval/{key}"], (split, key)
    for key in ("outcome_mean", "length_mean"):
        assert rec[f"eval/{key}"] == pytest.approx(
            (rec[f"eval/dev/{key}"] + rec[f"eval/test/{key}"]) / 2)
    assert rec["eval/n"] == 6 and both.evaluations[0] == rec["eval/outcome_mean"]
    with pytest.raises(ConfigError, match=r"trainer.eval_split: name one split or several"):
        build_trainer(make_cfg(tmp_path / "dup", *common, "trainer.eval_split=[dev,dev]"))


def test_a_rollout_in_chunks_samples_consecutive_parts_with_their_own_seeds():
    from rl.run.loop import rollout_in_chunks, step_seed

    prompts = [Prompt(id=f"p{i}", messages=()) for i in range(6)]
    calls = []

    def rollout(part, seed):
        calls.append(([p.id for p in part], seed))
        return [Group(p, ()) for p in part]

    groups = rollout_in_chunks(rollout, prompts, 3, lambda k: step_seed(7, 2, 0, k))
    assert [g.prompt.id for g in groups] == [p.id for p in prompts]  # in the batch's order
    assert [ids for ids, _ in calls] == [["p0", "p1"], ["p2", "p3"], ["p4", "p5"]]
    # chunk 0 draws the unchunked rollout's seed; the others their own (numpy's seeding of
    # the entropy [seed, step, draw, chunk])
    seeds = [seed for _, seed in calls]
    assert seeds[0] == step_seed(7, 2, 0) == int(
        np.random.default_rng([7, 2, 0]).integers(0, 2**31 - 1))
    assert seeds[2] == int(np.random.default_rng([7, 2, 0, 2]).integers(0, 2**31 - 1))
    assert len(set(seeds)) == 3
    with pytest.raises(ValueError, match="6 prompts do not split into 4 equal parts"):
        rollout_in_chunks(rollout, prompts, 4, lambda k: k)


def test_a_step_whose_rollout_runs_in_two_chunks_trains_on_the_whole_batch(tmp_path,
                                                                          monkeypatch):
    from rl.tasks.envs import SingleTurnEnv

    calls = []
    real = SingleTurnEnv.rollout

    def counted(self, policy, prompts, group_size, seed):
        calls.append(len(prompts))
        return real(self, policy, prompts, group_size, seed)

    monkeypatch.setattr(SingleTurnEnv, "rollout", counted)
    t = build_trainer(make_cfg(tmp_path / "chunks", *LEARN, "trainer.max_steps=1",
                               "trainer.batch_prompts=4", "algo.group_size=2",
                               "trainer.max_new_tokens=4", "trainer.rollout_chunks=2",
                               "trainer.eval_at_ends=false"))
    history = t.run()
    t.close()
    assert calls == [2, 2]  # two sampler calls of 2 prompts
    # the update saw all 4 groups of 2: 8 trajectories of 1 to 4 new tokens
    assert 8 <= history[0]["rollout/generated_tokens"] <= 32
