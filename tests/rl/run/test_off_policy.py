"""One-step off-policy rollouts (#20 item 4, ``trainer.off_policy_steps=1``): the rollout of
step t+1 is sampled from the weights before step t's update and its sampler log-probs are the
update's old log-probs; the pipelined schedule (next rollout on a background thread) gives
the same run as the sequential one and as itself; resume is exact; settings that cannot be
pipelined are refused by key."""

import json

import jax
import numpy as np
import pytest

from core.types import Group, Prompt, Trajectory
from rl.grpo.batch import build_batch
from rl.grpo.off_policy import mismatch_stats
from rl.run import loop as L
from rl.run.config import ConfigError, parse
from rl.run.evaluation import restore_run_params
from rl.run.resume import changes
from rl.run.trainer import build_trainer
from tests.rl.rewarders.test_arbor_e2e import (
    compose_cfg,
    tiny_overrides,
    world_dir,  # noqa: F401  (a fixture)
)
from tests.rl.run.test_resume_matrix import GRPO, _assert_identical, _straight_and_resumed
from tests.rl.run.test_trainer import LEARN, make_cfg

OFF = "trainer.off_policy_steps=1"
TIMINGS = ("time/", "tokens_per_s", "rollout/tokens_per_s")
# 2 prompts x 4, 8 new tokens, a large step: the weights move visibly in one update
RUN = [*LEARN, "trainer.batch_prompts=2", "algo.group_size=4", "trainer.max_new_tokens=8",
       "optim.lr=5e-2", "trainer.eval_at_ends=false", "trainer.save_every=0"]


@pytest.fixture(autouse=True)
def _char_model(char_model, monkeypatch):
    monkeypatch.setenv("CHAR_MODEL", str(char_model))


def _records(run_dir, name="metrics.jsonl"):
    return [json.loads(x) for x in (run_dir / name).read_text().splitlines()]


def _untimed(recs):
    return [{k: v for k, v in r.items() if not k.startswith(TIMINGS)} for r in recs]


# ------------------------------------------------------------------------------ units


def test_mismatch_stats_over_the_loss_tokens_by_hand():
    sampler = np.array([[-1.0, -2.0, -0.5, 0.0]])
    trainer = np.array([[-1.5, -1.0, -0.5, -9.0]])
    mask = np.array([[1, 1, 1, 0]])  # the last token is not trained on: its gap is ignored
    got = mismatch_stats(sampler, trainer, mask)
    d = np.array([-0.5, 1.0, 0.0])  # trainer - sampler on the three loss tokens
    assert got["offpolicy/logp_abs_diff_mean"] == pytest.approx(0.5)
    assert got["offpolicy/logp_abs_diff_max"] == pytest.approx(1.0)
    assert got["offpolicy/ratio_mean"] == pytest.approx(np.exp(d).mean())
    assert got["offpolicy/ratio_min"] == pytest.approx(np.exp(-0.5))
    assert got["offpolicy/ratio_max"] == pytest.approx(np.e)
    assert mismatch_stats(sampler, trainer, np.zeros_like(mask)) == {}


def test_the_batch_carries_the_sampler_log_probs_where_the_loss_applies():
    prompt = Prompt("p", ({"role": "user", "content": "q"},))
    # a multi-turn trajectory: tokens 7, 8 are an observation (loss 0); its logprob slots 0
    a = Trajectory((1, 2, 3), (5, 6, 7, 8, 9), (1, 1, 0, 0, 1), (-0.1, -0.2, 0.0, 0.0, -0.3),
                   "", "stop")
    b = Trajectory((1, 2, 3), (4,), (1,), (-0.7,), "", "stop")
    batch = build_batch([Group(prompt, (a, b))], np.zeros((1, 2)), pad_id=0, resp_len=16,
                        with_logprobs=True)
    want = np.zeros((1, 2, 16), np.float32)
    want[0, 0, :5] = [-0.1, -0.2, 0.0, 0.0, -0.3]
    want[0, 1, 0] = -0.7
    np.testing.assert_array_equal(batch["logp_sampler"], want)
    assert "logp_sampler" not in build_batch([Group(prompt, (a, b))], np.zeros((1, 2)), 0)


@pytest.mark.parametrize("override,says", [
    ("trainer.off_policy_steps=2", "must be 0 (on-policy) or 1 (one-step off-policy), got 2"),
    ("mesh.num_processes=2", "multi-process job (mesh.num_processes=2)"),
])
def test_settings_that_cannot_be_pipelined_are_refused_by_key(tmp_path, override, says):
    with pytest.raises(ConfigError) as e:
        parse(make_cfg(tmp_path / "r", *RUN, OFF, override))
    assert str(e.value).startswith("trainer.off_policy_steps: ") and says in str(e.value)


def test_dapo_and_several_updates_per_batch_pipeline(tmp_path):
    """Dynamic sampling draws every batch of a step from the same snapshot and filters on
    rewards only; several updates per batch keep the sampler's log-probs as logp_old."""
    run = parse(make_cfg(tmp_path / "r", *RUN, OFF, "algo=dapo", "trainer.ppo_epochs=2"))
    assert run.trainer.off_policy_steps == 1 and not run.loss_config(8).on_policy
    assert not parse(make_cfg(tmp_path / "r", *RUN, OFF)).loss_config(8).on_policy
    assert parse(make_cfg(tmp_path / "r", *RUN)).loss_config(8).on_policy


def test_a_checkpoint_from_before_the_key_compares_as_on_policy():
    old = {"optim.lr": 0.1}  # written before trainer.off_policy_steps existed
    assert changes(old, {"optim.lr": 0.1, "trainer.off_policy_steps": 0}) == {}
    assert changes(old, {"optim.lr": 0.1, "trainer.off_policy_steps": 1}) == {
        "trainer.off_policy_steps": (0, 1)}
    assert changes(old, {"optim.lr": 0.1}) == {}  # a config without the key (rl.sft)


# ------------------------------------------------------------------------------ the loop


def _step_by_step(cfg):
    """(trainer, [params before step 0, after step 0, after step 1]) stepping sequentially."""
    t = build_trainer(cfg)
    params = [jax.device_get(t.state.params)]
    for _ in range(2):
        t.step()
        params.append(jax.device_get(t.state.params))
    return t, params


@pytest.mark.parametrize("off", [0, 1])
def test_step_1_rollout_is_sampled_from_the_weights_it_should_be(tmp_path, off):
    """Step 1's trajectories equal a rollout of step 1's prompts with step 1's seed from the
    weights before step 0's update (off-policy) or after it (on-policy), and not from the
    other ones; off-policy the update's old log-probs are that sampler's."""
    run_dir = tmp_path / "r"
    t, params = _step_by_step(make_cfg(run_dir, *RUN, "trainer.sample_every=1",
                                       f"trainer.off_policy_steps={off}", "trainer.max_steps=2"))
    c = t.parts
    seed = L.step_seed(c.run.trainer.seed, 1)

    def texts(p):
        groups = c.env.rollout(c.policy(p), c.stream.batch(1), c.run.algo.group_size, seed)
        return [tr.text for g in groups for tr in g.trajectories], groups

    trained = [s["response"] for s in _records(run_dir, "samples.jsonl")][8:]
    (before, groups), (after, _) = texts(params[0]), texts(params[1])
    assert before != after  # the update moved the weights enough to tell them apart
    assert trained == (before if off else after)
    recs = _records(run_dir)
    if not off:
        assert not any(k.startswith("offpolicy/") for r in recs for k in r)
        assert t.loop.behaviour is None
        t.close()
        return
    assert [r["offpolicy/staleness"] for r in recs] == [0, 1]
    # step 0 samples and trains the same weights: the sampler's log-probs are the trainer's
    assert recs[0]["offpolicy/logp_abs_diff_max"] < 1e-4
    assert recs[0]["offpolicy/ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    # step 1: the trainer's weights (after step 0) against the sampler's (before it)
    batch = L.training_batch(c, groups, np.zeros((len(groups), c.run.algo.group_size)))
    current = L.logprobs_with(c, params[1], batch)
    sampled = np.concatenate([np.asarray(tr.logprobs) for g in groups for tr in g.trajectories])
    rows = current.reshape(-1, current.shape[-1])
    trainer = np.concatenate([rows[i, :len(tr.tokens)] for i, tr in
                              enumerate(tr for g in groups for tr in g.trajectories)])
    gap = np.abs(trainer - sampled)
    assert recs[1]["offpolicy/logp_abs_diff_mean"] == pytest.approx(gap.mean(), rel=1e-4)
    assert recs[1]["offpolicy/logp_abs_diff_max"] == pytest.approx(gap.max(), rel=1e-4)
    assert gap.max() > 1e-2  # one step of staleness is visible
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(t.loop.behaviour.params),
                 params[1])  # the next rollout's weights: before step 1's update
    t.close()


def _final(trainer):
    out = jax.device_get(trainer.state), jax.device_get(trainer.loop.behaviour.params)
    trainer.close()
    return out


def test_the_pipelined_run_equals_the_sequential_run_and_itself(tmp_path):
    cfg = lambda d: make_cfg(d, *RUN, OFF, "trainer.max_steps=4")  # noqa: E731
    started = []
    runs = []
    for name in ("pipelined", "again"):
        t = build_trainer(cfg(tmp_path / name))
        start = t.prefetcher.start
        t.prefetcher.start = lambda state, s=start: (started.append(state.step), s(state))
        t.run()
        runs.append((_final(t), _untimed(_records(tmp_path / name))))
    assert started == [1, 2, 3, 1, 2, 3]  # the rollouts of steps 1-3 ran during an update
    t = build_trainer(cfg(tmp_path / "sequential"))
    for _ in range(4):
        t.step()  # no prefetch: each rollout collected in its own step
    runs.append((_final(t), _untimed(_records(tmp_path / "sequential"))))
    (ref, ref_recs), *others = runs
    assert [r["offpolicy/staleness"] for r in ref_recs] == [0, 1, 1, 1]
    assert sum(r["update/skipped"] for r in ref_recs) < 4
    for state, recs in others:
        jax.tree.map(np.testing.assert_array_equal, state, ref)
        assert recs == ref_recs
    # rl.eval, rl.export and trainer.init_from read the parameters of an off-policy checkpoint
    params, step = restore_run_params(tmp_path / "pipelined", ref[0].params)
    assert step == 4
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(params), ref[0].params)


def test_off_policy_resume_equals_uninterrupted(tmp_path):
    straight, resumed = _straight_and_resumed(
        tmp_path, lambda d, *more: make_cfg(d, *GRPO, OFF, *more))
    _assert_identical(straight, resumed)
    assert [r["offpolicy/staleness"] for r in straight[2]] == [0, 1, 1, 1]


def test_arbor_off_policy_resume_equals_uninterrupted(tmp_path, world_dir):  # noqa: F811
    """The rubric memory and the rule judge on the rollout thread: the memory each rollout is
    scored against is the one the previous rollout left, resumed exactly."""
    def cfg(d, *more):
        return compose_cfg(*tiny_overrides(d, world_dir, "task.name=search_qa_scripted",
                                           "algo.k_consol=4", "trainer.max_steps=4",
                                           "trainer.save_every=2", OFF, *more))

    straight, resumed = _straight_and_resumed(tmp_path, cfg)
    _assert_identical(straight, resumed)
    assert straight[1]["commons"]  # the memory did evolve
    assert [r["offpolicy/staleness"] for r in straight[2]] == [0, 1, 1, 1]


def test_resuming_with_the_other_off_policy_setting_is_refused(tmp_path):
    run_dir = tmp_path / "r"
    t = build_trainer(make_cfg(run_dir, *RUN, "trainer.max_steps=2", "trainer.save_every=1"))
    t.run(until=1)
    t.close()
    with pytest.raises(ConfigError, match=r"trainer.off_policy_steps: the checkpoint at step 1 "
                                          r".* written with trainer.off_policy_steps=0"):
        build_trainer(make_cfg(run_dir, *RUN, "trainer.max_steps=2", "trainer.resume=true", OFF,
                               "trainer.resume_allow_changes=[trainer.off_policy_steps]"))
    with pytest.raises(ConfigError, match=r"trainer.off_policy_steps: 0 \(checkpoint\) -> 1"):
        build_trainer(make_cfg(run_dir, *RUN, "trainer.max_steps=2", "trainer.resume=true", OFF))
