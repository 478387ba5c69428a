"""rl.grpo.reward_stage: overlong shaping, advantages and group statistics as one jitted program,
against hand-computed cases, the eager registered functions applied to the whole batch, and
the NumPy references; it compiles once per shape."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

import rl.grpo.reward_stage as RS
from core.types import Group, Prompt, RewardOutput, Trajectory
from rl.grpo.advantages import ADVANTAGES, gdpo_advantages
from rl.grpo.dapo import overlong_penalty
from rl.grpo.group_stats import all_wrong_frac, converted_frac, homogeneous_frac
from rl.run.config import reward_stage_config
from tests.rl.references import ref_advantages

SQRT3_2 = np.sqrt(3) / 2  # GRPO on [1, 0, 0, 1]: +-0.5 / sqrt(1/3) (sample std)


def _cfg(advantage="grpo", whiten="trajectory", components="sum", weights=(1.0, 1.0),
         overlong=None, std_ddof=1, eps=1e-6):
    return RS.RewardStageConfig(advantage=advantage, eps=eps, std_ddof=std_ddof, whiten=whiten,
                                reward_components=components, component_weights=weights,
                                overlong=overlong)


def _run(cfg, rewards, outcome=None, lengths=None, counts=None, failed=None):
    rewards = np.asarray(rewards, np.float32)
    ones = np.ones(rewards.shape, np.int32)
    return RS.run_reward_stage(cfg, rewards, rewards if outcome is None else outcome,
                               ones if lengths is None else lengths,
                               ones if counts is None else counts,
                               np.zeros(rewards.shape, bool) if failed is None else failed)


def test_grpo_by_hand_with_its_group_stats():
    # group 0: mean .5, sample std sqrt(4 * .25 / 3) = sqrt(1/3): advantages +-.5 / .57735;
    # group 1 homogeneous: exactly 0. Rewards mean 6/8, population std sqrt(.1875).
    out = _run(_cfg(), [[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    np.testing.assert_allclose(out.advantages, [[SQRT3_2, -SQRT3_2, -SQRT3_2, SQRT3_2],
                                                [0.0] * 4], rtol=1e-5)
    assert np.all(out.advantages[1] == 0.0)
    np.testing.assert_array_equal(out.rewards, [[1, 0, 0, 1], [1, 1, 1, 1]])
    assert out.stats == pytest.approx({
        "reward/mean": 0.75, "reward/std": np.sqrt(0.1875), "outcome/mean": 0.75,
        "groups/homogeneous_frac": 0.5, "groups/total_homogeneous_frac": 0.5,
        "groups/all_wrong_frac": 0.0, "groups/converted_frac": 0.0})


def test_overlong_shaping_by_hand_and_a_judge_failed_row_unshaped():
    # L_max 100, B 20, penalty 1: L_exp 80; L=70 -> 0, 90 -> (80-90)/20 = -.5, 100 -> -1,
    # 101 -> -1. Row 1 failed closed: unshaped, so its group keeps zero variance.
    cfg = _cfg(overlong=RS.OverlongShaping(max_len=100, buffer_len=20, penalty=1.0))
    rewards = np.array([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    lengths = np.array([[70, 90, 100, 101], [101, 101, 90, 70]])
    failed = np.array([[False] * 4, [True] * 4])
    out = _run(cfg, rewards, lengths=lengths, failed=failed)
    np.testing.assert_allclose(out.rewards, [[1.0, 0.5, 0.0, 0.0], [0.0] * 4])
    assert np.all(out.advantages[1] == 0.0)
    # GRPO of [1, .5, 0, 0]: mean .375, sample std sqrt((.390625 + .015625 + 2 * .140625) / 3)
    shaped = np.array([1.0, 0.5, 0.0, 0.0])
    std = np.sqrt(((shaped - 0.375) ** 2).sum() / 3)
    np.testing.assert_allclose(out.advantages[0], (shaped - 0.375) / (std + 1e-6), rtol=1e-5)
    # group stats read the rewards before shaping: group 0 outcome- and total-homogeneous
    assert out.stats["groups/total_homogeneous_frac"] == 1.0
    assert out.stats["reward/mean"] == pytest.approx(1.5 / 8)
    assert out.stats["groups/all_wrong_frac"] == 0.5  # group 1: every outcome 0


def test_gdpo_two_components_by_hand():
    # G = 2, sample std of a pair (a, b) is |a - b| / sqrt(2): each non-flat pair z-scores to
    # +-1/sqrt(2). outcome [[1, 0], [1, 1]] -> [[.7071, -.7071], [0, 0]] (group 1 flat);
    # process (rewards - outcome) [[0, .5], [.2, .4]] -> [[-.7071, .7071], [-.7071, .7071]].
    # weights (1, .5): S = [[.35355, -.35355], [-.35355, .35355]], mean 0, sample std over the
    # batch sqrt(4 * .125 / 3) = .40825 -> A = +-.35355 / .40825 = +-sqrt(3)/2.
    outcome = np.array([[1.0, 0.0], [1.0, 1.0]], np.float32)
    rewards = outcome + np.array([[0.0, 0.5], [0.2, 0.4]], np.float32)
    out = _run(_cfg(components="gdpo", weights=(1.0, 0.5)), rewards, outcome=outcome)
    np.testing.assert_allclose(out.advantages, [[SQRT3_2, -SQRT3_2], [-SQRT3_2, SQRT3_2]],
                               rtol=1e-4)


def _random_case(seed=0, n=5, g=4):
    rng = np.random.default_rng(seed)
    outcome = rng.integers(0, 2, size=(n, g)).astype(np.float32)
    outcome[0] = 1.0  # homogeneous outcome ...
    rewards = outcome + rng.normal(scale=0.1, size=(n, g)).astype(np.float32)
    rewards[1] = outcome[1] = 0.0  # ... and a fully homogeneous group
    lengths = rng.integers(1, 40, size=(n, g))
    counts = rng.integers(1, 30, size=(n, g))
    failed = np.zeros((n, g), bool)
    failed[2] = True
    return rewards, outcome, lengths, counts, failed


@pytest.mark.parametrize("advantage,whiten", [
    ("grpo", "trajectory"), ("drgrpo", "trajectory"), ("rloo", "trajectory"),
    ("reinforce_pp", "trajectory"), ("reinforce_pp", "token")])
@pytest.mark.parametrize("std_ddof", [1, 0])
def test_program_equals_the_eager_functions(advantage, whiten, std_ddof):
    rewards, outcome, lengths, counts, failed = _random_case()
    ov = RS.OverlongShaping(max_len=32, buffer_len=8, penalty=0.5)
    out = _run(_cfg(advantage, whiten, overlong=ov, std_ddof=std_ddof), rewards, outcome,
               lengths, counts, failed)
    pen = np.asarray(overlong_penalty(lengths, 32, 8, 0.5))
    shaped = rewards + np.where(failed, 0.0, pen)
    np.testing.assert_allclose(out.rewards, shaped, rtol=1e-6, atol=1e-7)
    tokens = counts if whiten == "token" else None  # the registered rule on the whole batch
    want = np.asarray(ADVANTAGES.get(advantage)(shaped.astype(np.float32), 1e-6, std_ddof,
                                                tokens))
    np.testing.assert_allclose(out.advantages, want, rtol=1e-5, atol=1e-6)
    if advantage in ("grpo", "drgrpo"):
        np.testing.assert_allclose(out.advantages, ref_advantages(shaped, advantage == "grpo",
                                                                  ddof=std_ddof),
                                   rtol=1e-4, atol=1e-5)
    assert out.stats["groups/homogeneous_frac"] == pytest.approx(float(homogeneous_frac(outcome)))
    assert out.stats["groups/total_homogeneous_frac"] == pytest.approx(
        float(homogeneous_frac(rewards)))
    assert out.stats["groups/all_wrong_frac"] == pytest.approx(float(all_wrong_frac(outcome)))
    assert out.stats["groups/converted_frac"] == pytest.approx(
        float(converted_frac(outcome, rewards)))
    assert out.stats["reward/mean"] == pytest.approx(shaped.mean(), rel=1e-5)
    assert out.stats["reward/std"] == pytest.approx(shaped.std(), rel=1e-5)


def test_gdpo_program_equals_the_eager_function():
    rewards, outcome, lengths, counts, failed = _random_case(seed=3)
    out = _run(_cfg(components="gdpo", weights=(2.0, 1.0)), rewards, outcome, lengths, counts,
               failed)
    want = gdpo_advantages(np.stack([outcome, rewards - outcome]), np.array([2.0, 1.0]))
    np.testing.assert_allclose(out.advantages, np.asarray(want), rtol=1e-5, atol=1e-6)


def test_compiles_once_per_shape(monkeypatch):
    traces = []
    stats = RS.stage_stats

    def counting(*args):
        traces.append(1)  # a Python side effect: runs when jax traces, not when it executes
        return stats(*args)

    monkeypatch.setattr(RS, "stage_stats", counting)
    cfg = _cfg(eps=1.234e-6)  # a config no other test uses: a fresh program
    rewards, outcome, lengths, counts, failed = _random_case()
    for seed in range(3):
        _run(cfg, rewards + seed, outcome, lengths, counts, failed)
    assert len(traces) == 1
    program = RS.compiled_reward_stage(cfg)
    assert program is RS.compiled_reward_stage(_cfg(eps=1.234e-6))  # one per config
    if hasattr(program, "_cache_size"):
        assert program._cache_size() == 1
    _run(cfg, rewards[:3], outcome[:3], lengths[:3], counts[:3], failed[:3])
    assert len(traces) == 2  # a new shape compiles again


def test_mismatched_shapes_name_the_input():
    with pytest.raises(ValueError, match="lengths has shape"):
        _run(_cfg(), np.zeros((2, 4)), lengths=np.ones((2, 3), np.int32))


def _traj(n_tokens):
    return Trajectory((1,), (2,) * n_tokens, (1,) * n_tokens, (0.0,) * n_tokens, "", "eos")


def test_loop_feeds_the_stage_host_inputs():
    """rl.run.loop.reward_stage: lengths from the trajectories, judge-failed rows from per_traj,
    the config from the RunConfig (overlong on, L_max = the 16-token budget, B = 4)."""
    from rl.run import loop as L

    ov = SimpleNamespace(enabled=True, max_len=None, buffer_len=4, buffer_frac=0.25,
                         penalty=1.0)
    algo = SimpleNamespace(advantage="drgrpo", std_ddof=1, whiten="trajectory",
                           reward_components="sum", component_weights=[1.0, 1.0], overlong=ov)
    c = SimpleNamespace(run=SimpleNamespace(algo=algo), response_budget=16)
    prompt = Prompt("p", ({"role": "user", "content": "q"},))
    groups = [Group(prompt, (_traj(8), _traj(14))), Group(prompt, (_traj(16), _traj(14)))]
    out = RewardOutput(rewards=np.array([[1.0, 1.0], [0.0, 0.0]]),
                       outcome=np.array([[1.0, 1.0], [0.0, 0.0]]), metrics={}, state=None,
                       per_traj=(({}, {}), ({"judge_failed": 1}, {"judge_failed": 1})))
    col = L.Collected(groups, out, {})
    stage = L.reward_stage(c, col)
    # L_exp 12: 8 -> 0, 14 -> -.5; row 1 failed closed stays [0, 0]
    np.testing.assert_allclose(stage.rewards, [[1.0, 0.5], [0.0, 0.0]])
    np.testing.assert_allclose(stage.advantages, [[0.25, -0.25], [0.0, 0.0]])
    cfg = reward_stage_config(c.run, 16)
    assert cfg.overlong == RS.OverlongShaping(16, 4, 1.0) and cfg.component_weights == (1.0, 1.0)
    off = SimpleNamespace(**{**vars(algo), "overlong": SimpleNamespace(**{**vars(ov),
                                                                           "enabled": False})})
    assert reward_stage_config(SimpleNamespace(algo=off), 16) == dataclasses.replace(
        cfg, overlong=None)
