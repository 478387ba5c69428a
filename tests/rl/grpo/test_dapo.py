"""DAPO (dynamic sampling, overlong shaping), the homogeneous-group predicate and the group
statistics against hand-computed values and the NumPy references."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core.groups import homogeneous
from core.types import RewardOutput
from rl.grpo.dapo import dynamic_sample, overlong_penalty
from rl.grpo.group_stats import (
    all_wrong_frac,
    converted_frac,
    homogeneous_frac,
)
from tests.rl.references import (
    ref_overlong,
    ref_std,
)


def test_homogeneous_groups_have_no_signal():
    r = jnp.array([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.1, 0.1, 0.1], [-1.0, -1.0, 0.0]])
    np.testing.assert_array_equal(~homogeneous(np.asarray(r)), [False, True, False, True])
    jitted = jax.jit(lambda x: ~homogeneous(x, xp=jnp))(r)
    np.testing.assert_array_equal(jitted, [False, True, False, True])
    # the documented tolerance: differences of float rounding alone are no signal
    assert homogeneous(np.array([[0.5, 0.5 + 1e-7]]))[0]
    assert not homogeneous(np.array([[0.5, 0.5 + 1e-4]]))[0]


def test_overlong_penalty_boundaries():
    max_len, buf, pen = 100, 20, 1.0
    lengths = np.array([0, 79, 80, 81, 90, 99, 100, 101, 500])
    got = np.asarray(overlong_penalty(jnp.asarray(lengths), max_len, buf, pen))
    expect = [ref_overlong(int(n), max_len, buf, pen) for n in lengths]
    np.testing.assert_allclose(got, expect, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got, [0, 0, 0, -0.05, -0.5, -0.95, -1.0, -1.0, -1.0], atol=1e-7)
    got = overlong_penalty(jnp.asarray(lengths), max_len, buf, 0.5)
    np.testing.assert_allclose(got[4], -0.25)
    jitted = jax.jit(overlong_penalty, static_argnums=(1, 2, 3))(jnp.asarray(lengths), 100, 20, 1.0)
    np.testing.assert_allclose(jitted, expect, rtol=1e-6, atol=1e-7)
    # buffer 0: hard cut at max_len, no NaN
    got = np.asarray(overlong_penalty(jnp.array([99, 100, 101]), 100, 0, 1.0))
    np.testing.assert_array_equal(got, [0.0, 0.0, -1.0])


def make_draw(batches):
    """A scripted draw for rl.grpo.dapo.dynamic_sample: batch i's groups are named "b{i}g{j}" and
    the rewarder state counts the draws."""
    calls = []

    def draw(i, state):
        calls.append(i)
        rewards = np.asarray(batches[i], dtype=np.float64)
        out = RewardOutput(rewards=rewards, outcome=rewards, metrics={"m": float(i)},
                           state=state + 1, events=({"draw": i},), counts={"calls": 1.0})
        return [f"b{i}g{j}" for j in range(len(rewards))], out

    return draw, calls


HOM, INF = [1.0, 1.0, 1.0], [0.0, 1.0, 0.5]
INFO = ("gen_batches", "dropped_groups", "filled")


def test_dynamic_sampling_fills_and_truncates():
    batches = [[HOM, INF, HOM], [INF, INF, HOM, INF], [INF]]
    draw, calls = make_draw(batches)
    got = dynamic_sample(draw, 0, target_groups=3, max_gen_batches=5)
    assert calls == [0, 1]
    assert got.groups == ["b0g1", "b1g0", "b1g1"]
    assert got.out.rewards.shape == (3, 3)
    np.testing.assert_array_equal(got.out.rewards, [INF, INF, INF])
    assert {k: got.info[k] for k in INFO} == {"gen_batches": 2, "dropped_groups": 3,
                                               "filled": True}
    # the state threads through both draws; events and counts add up, metrics are the last
    assert got.draws == 2 and got.out.state == 2
    assert got.out.events == ({"draw": 0}, {"draw": 1})
    assert got.out.metrics == {"m": 1.0, "calls": 2.0}


@pytest.mark.parametrize("metric, kept", [("reward", ["g0", "g1"]), ("outcome", ["g1"])])
def test_dynamic_sampling_filters_on_the_chosen_metric(metric, kept):
    """Group 0: every answer right (outcome 1, 1, 1) but the reward varies (a rubric term or
    overlong shaping); group 1: the outcome varies; group 2: neither. Filtering on the reward
    keeps 0 and 1, on the outcome (verl's acc) only 1."""
    rewards = np.array([[1.1, 0.9, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    outcome = np.array([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])

    def draw(i, state):
        return ["g0", "g1", "g2"], RewardOutput(rewards=rewards, outcome=outcome, metrics={},
                                                state=state)

    got = dynamic_sample(draw, 0, target_groups=3, max_gen_batches=1, filter_metric=metric)
    assert got.groups == kept
    assert got.info["dropped_groups"] == 3 - len(kept)  # homogeneous in the filtered metric


def test_dynamic_sampling_bounded_ends_short():
    batches = [[HOM, INF], [HOM, HOM], [INF, HOM], [INF, INF]]
    draw, calls = make_draw(batches)
    got = dynamic_sample(draw, 0, target_groups=4, max_gen_batches=3)
    assert calls == [0, 1, 2]
    assert got.groups == ["b0g1", "b2g0"]
    assert got.out.rewards.shape == (2, 3)
    assert {k: got.info[k] for k in INFO} == {"gen_batches": 3, "dropped_groups": 4,
                                               "filled": False}
    # 4 of the 6 drawn groups were homogeneous (outcome = rewards here)
    assert got.info["drawn_homogeneous_frac"] == pytest.approx(4 / 6)


def test_dynamic_sampling_all_homogeneous_trains_on_the_last_draw():
    draw, _ = make_draw([[HOM, HOM]])
    got = dynamic_sample(draw, 0, target_groups=1, max_gen_batches=1)
    assert got.groups == ["b0g0", "b0g1"] and got.out.rewards.shape == (2, 3)
    assert {k: got.info[k] for k in INFO} == {"gen_batches": 1, "dropped_groups": 2,
                                               "filled": False}
    with pytest.raises(ValueError, match="max_gen_batches"):
        dynamic_sample(draw, 0, target_groups=1, max_gen_batches=0)


def test_without_filtering_one_draw_is_kept_whole():
    draw, calls = make_draw([[HOM, INF]])
    got = dynamic_sample(draw, 0, target_groups=2, max_gen_batches=3, filter_groups=False)
    assert calls == [0] and got.groups == ["b0g0", "b0g1"] and got.draws == 1
    assert dict(got.info) == {"gen_batches": 1, "dropped_groups": 0}


def test_dynamic_sampling_rejects_mismatched_groups():
    def draw(i, state):
        return ["a"], RewardOutput(rewards=np.array([INF, INF]), outcome=np.zeros((2, 3)),
                                   metrics={})

    with pytest.raises(ValueError, match="groups"):
        dynamic_sample(draw, None, 1, 1)


# ----------------------------------------------------------------------------------------------
# group stats


def group_stats_inputs():
    outcome = np.array(
        [
            [0.0, 0.0, 0.0, 0.0],  # all wrong, homogeneous
            [-1.0, 0.0, -1.0, 0.0],  # all wrong (invalid or F1=0), not homogeneous
            [1.0, 1.0, 1.0, 1.0],  # homogeneous, all right
            [0.5, 0.0, 1.0, 0.2],
            [-1.0, -1.0, -1.0, -1.0],  # all invalid, homogeneous
        ]
    )
    total = outcome.copy()
    total[0] += [0.1, -0.1, 0.0, 0.0]  # rubric term converted this homogeneous group
    total[2] += [0.05, 0.0, 0.0, 0.0]  # and this one
    return outcome, total


def test_group_stats_match_reference():
    outcome, total = group_stats_inputs()
    hom = [ref_std(list(g)) <= 1e-6 for g in outcome]
    wrong = [all(x <= 0.0 for x in g) for g in outcome]
    conv = [h and ref_std(list(t)) > 1e-6 for h, t in zip(hom, total)]
    o, t = jnp.asarray(outcome, jnp.float32), jnp.asarray(total, jnp.float32)
    assert float(homogeneous_frac(o)) == pytest.approx(sum(hom) / 5) == pytest.approx(3 / 5)
    assert float(all_wrong_frac(o)) == pytest.approx(sum(wrong) / 5) == pytest.approx(3 / 5)
    assert float(all_wrong_frac(o, wrong_threshold=-1.0)) == pytest.approx(1 / 5)
    assert float(converted_frac(o, t)) == pytest.approx(sum(conv) / sum(hom))
    assert float(converted_frac(o, t)) == pytest.approx(2 / 3)
    assert float(converted_frac(o, o)) == 0.0


def test_converted_frac_no_homogeneous_groups_is_zero():
    o = jnp.array([[0.0, 1.0], [0.2, 0.3]])
    assert float(converted_frac(o, o + 1.0)) == 0.0


def test_group_stats_jit_equals_eager():
    outcome, total = (jnp.asarray(a, jnp.float32) for a in group_stats_inputs())

    def metrics(o, t):
        return {
            "hom": homogeneous_frac(o),
            "wrong": all_wrong_frac(o),
            "conv": converted_frac(o, t),
        }

    eager, jitted = metrics(outcome, total), jax.jit(metrics)(outcome, total)
    for k in eager:
        np.testing.assert_allclose(jitted[k], eager[k], rtol=1e-6)
