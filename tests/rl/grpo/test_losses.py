"""Advantages, KL estimators, PPO-clip and loss aggregation (rl/) against the NumPy references."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl.grpo.advantages import ADVANTAGES, drgrpo_advantages, group_advantages, grpo_advantages
from rl.grpo.kl import KL_ESTIMATORS, kl_penalty
from rl.grpo.losses import (
    LOSS_AGG,
    agg_loss,
    masked_mean,
    masked_sum,
    ppo_clip_loss,
)
from tests.rl.references import (
    AGG_MODES,
    central_fd,
    ragged_mask,
    ref_advantages,
    ref_agg,
    ref_kl,
    ref_ppo,
    ref_std,
)

# ----------------------------------------------------------------------------------------------
# advantages


def test_advantage_registry_names():
    assert set(ADVANTAGES.names()) >= {"grpo", "drgrpo", "none"}
    assert ADVANTAGES.get("none") is drgrpo_advantages
    with pytest.raises(KeyError, match="grpo"):
        ADVANTAGES.get("nope")


@pytest.mark.parametrize("ddof", [1, 0])
@pytest.mark.parametrize("estimator,scale", [("grpo", True), ("drgrpo", False), ("none", False)])
def test_advantages_match_reference(estimator, scale, ddof):
    rng = np.random.default_rng(0)
    r = rng.normal(size=(6, 8)).astype(np.float32)
    r[2] = 0.7  # homogeneous
    r[4] = rng.integers(0, 2, size=8)  # binary outcome
    got = np.asarray(group_advantages(jnp.asarray(r), estimator, eps=1e-6, std_ddof=ddof))
    np.testing.assert_allclose(got, ref_advantages(r, scale, ddof=ddof), rtol=1e-5, atol=1e-5)
    assert got.shape == r.shape


def test_grpo_std_ddof_by_hand():
    # rewards [1, 0]: mean .5, deviations +-.5; sample std (ddof=1, torch.std as verl and TRL)
    # sqrt((.25 + .25) / 1) = .7071 -> +-.5/.7071 = +-0.7071; population std (ddof=0)
    # sqrt(.5 / 2) = .5 -> +-1.0
    r = jnp.array([[1.0, 0.0]])
    half = 1 / np.sqrt(2)
    np.testing.assert_allclose(grpo_advantages(r, eps=0.0), [[half, -half]], rtol=1e-6)
    np.testing.assert_allclose(grpo_advantages(r, eps=0.0, std_ddof=1), [[half, -half]],
                               rtol=1e-6)
    np.testing.assert_allclose(grpo_advantages(r, eps=0.0, std_ddof=0), [[1.0, -1.0]],
                               rtol=1e-6)
    np.testing.assert_allclose(group_advantages(r, "grpo", eps=0.0, std_ddof=0), [[1.0, -1.0]],
                               rtol=1e-6)


@pytest.mark.parametrize("fn", [grpo_advantages, drgrpo_advantages])
@pytest.mark.parametrize("value", [0.0, 0.1, -1.0, 0.3333333, 1e6])
def test_homogeneous_group_gives_exact_zero(fn, value):
    r = jnp.full((3, 8), value, dtype=jnp.float32).at[1].set(jnp.arange(8.0))
    adv = np.asarray(fn(r, 1e-6))
    assert np.all(adv[0] == 0.0) and np.all(adv[2] == 0.0)
    assert np.any(adv[1] != 0.0)


def test_advantages_jit_equals_eager():
    r = jnp.asarray(np.random.default_rng(1).normal(size=(4, 5)), dtype=jnp.float32)
    for name in ADVANTAGES.names():
        fn = ADVANTAGES.get(name)
        np.testing.assert_allclose(jax.jit(fn)(r, 1e-6), fn(r, 1e-6), rtol=1e-6, atol=1e-7)


def test_advantages_vmap_over_groups():
    r = jnp.asarray(np.random.default_rng(2).normal(size=(4, 5)), dtype=jnp.float32)
    per_group = jax.vmap(lambda g: grpo_advantages(g[None], 1e-6)[0])(r)
    np.testing.assert_allclose(per_group, grpo_advantages(r, 1e-6), rtol=1e-6, atol=1e-7)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.lists(st.floats(-10, 10, allow_nan=False, width=32), min_size=4, max_size=4),
        min_size=1,
        max_size=3,
    )
)
def test_property_advantages_zero_group_mean(groups):
    r = np.asarray(groups, dtype=np.float64)
    with jax.enable_x64(True):
        for name in ("grpo", "drgrpo"):
            adv = np.asarray(group_advantages(jnp.asarray(r), name, eps=1e-6))
            np.testing.assert_allclose(adv.mean(axis=-1), 0.0, atol=1e-9)
        adv = np.asarray(group_advantages(jnp.asarray(r), "grpo", eps=1e-6))
        for n, group in enumerate(r):
            s = ref_std(list(group), ddof=1)
            if s > 1e-3:  # away from eps, grpo advantages have unit sample std (ddof = 1)
                assert abs(ref_std(list(adv[n]), ddof=1) - s / (s + 1e-6)) < 1e-9


# ----------------------------------------------------------------------------------------------
# KL


def test_kl_registry_names():
    assert set(KL_ESTIMATORS.names()) >= {"k1", "k2", "k3", "low_var_kl"}
    assert KL_ESTIMATORS.get("low_var_kl") is KL_ESTIMATORS.get("k3")
    # verl's names (core_algos.kl_penalty): kl = k1, mse = k2, abs = |logp - logp_ref|
    assert KL_ESTIMATORS.get("kl") is KL_ESTIMATORS.get("k1")
    assert KL_ESTIMATORS.get("mse") is KL_ESTIMATORS.get("k2")
    with pytest.raises(KeyError, match="k3"):
        kl_penalty(jnp.zeros(2), jnp.zeros(2), "k4")


@pytest.mark.parametrize("kind", ["k1", "k2", "k3", "low_var_kl", "kl", "mse", "abs"])
def test_kl_matches_reference(kind):
    rng = np.random.default_rng(3)
    logp = rng.normal(-2, 1.5, size=(3, 4, 5)).astype(np.float32)
    logp_ref = rng.normal(-2, 1.5, size=(3, 4, 5)).astype(np.float32)
    logp_ref[0, 0, 0] = logp[0, 0, 0] + 30.0  # far outside the k3 clamp
    ref_kind = "k3" if kind == "low_var_kl" else kind
    got = np.asarray(kl_penalty(jnp.asarray(logp), jnp.asarray(logp_ref), kind))
    np.testing.assert_allclose(got, ref_kl(logp, logp_ref, ref_kind), rtol=1e-5, atol=1e-5)
    jitted = jax.jit(kl_penalty, static_argnums=2)(jnp.asarray(logp), jnp.asarray(logp_ref), kind)
    np.testing.assert_allclose(jitted, got, rtol=1e-6)


def test_k3_clamped_nonnegative_and_finite_grad():
    logp = jnp.array([0.0, 0.0, 0.0, -1.0])
    logp_ref = jnp.array([0.0, 50.0, -50.0, -1.3])
    k3 = kl_penalty(logp, logp_ref, "k3")
    assert float(k3[0]) == 0.0 and float(k3[1]) == 10.0
    assert np.all(np.asarray(k3) >= 0.0) and np.all(np.asarray(k3) <= 10.0)
    g = jax.grad(lambda lp: kl_penalty(lp, logp_ref, "k3").sum())(logp)
    assert np.all(np.isfinite(np.asarray(g)))


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_gradient_matches_finite_differences(kind, x64):
    rng = np.random.default_rng(4)
    logp = rng.normal(-1.0, 0.5, size=(2, 3))
    logp_ref = jnp.asarray(rng.normal(-1.0, 0.5, size=(2, 3)))
    f = lambda lp: jnp.sum(jnp.cos(jnp.arange(6.0)).reshape(2, 3) * kl_penalty(lp, logp_ref, kind))
    grad = np.asarray(jax.grad(f)(jnp.asarray(logp)))
    assert grad.dtype == np.float64
    np.testing.assert_allclose(grad, central_fd(f, logp), rtol=1e-6, atol=1e-8)


# ----------------------------------------------------------------------------------------------
# masked reductions, PPO-clip loss, aggregation


def test_masked_sum_and_mean():
    x = jnp.array([[1.0, 2.0, jnp.nan], [4.0, jnp.inf, 6.0]])
    m = jnp.array([[1, 1, 0], [0, 0, 0]])
    assert float(masked_sum(x, m)) == 3.0
    assert float(masked_mean(x, m)) == 1.5
    np.testing.assert_array_equal(masked_sum(x, m, axis=-1), [3.0, 0.0])
    np.testing.assert_array_equal(masked_mean(x, m, axis=-1), [1.5, 0.0])
    assert float(masked_mean(x, jnp.zeros_like(m))) == 0.0


def random_ppo_inputs(seed, b=4, t=6, token_adv=False):
    rng = np.random.default_rng(seed)
    logp_old = rng.normal(-1.5, 0.5, size=(b, t))
    logp = logp_old + rng.normal(0, 0.4, size=(b, t))  # ratios both inside and outside clip
    adv = rng.normal(size=(b, t) if token_adv else (b,))
    mask = (rng.random((b, t)) < 0.7).astype(np.float64)
    mask[0, :] = 1
    return logp, logp_old, adv, mask


@pytest.mark.parametrize("token_adv", [False, True])
@pytest.mark.parametrize("dual_clip", [None, 3.0, 1.5])
@pytest.mark.parametrize("eps_high", [0.2, 0.28])
def test_ppo_clip_loss_matches_reference(token_adv, dual_clip, eps_high):
    logp, logp_old, adv, mask = random_ppo_inputs(5, token_adv=token_adv)
    args = [jnp.asarray(a, dtype=jnp.float32) for a in (logp, logp_old, adv, mask)]
    loss, stats = ppo_clip_loss(*args, eps_low=0.2, eps_high=eps_high, dual_clip=dual_clip)
    ref_loss, ref_stats = ref_ppo(logp, logp_old, adv, mask, 0.2, eps_high, dual_clip)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-6)
    for k in ("clip_frac", "dual_clip_frac", "approx_kl"):
        np.testing.assert_allclose(float(stats[k]), ref_stats[k], rtol=1e-5, atol=1e-6)
        assert jnp.shape(stats[k]) == ()
    if dual_clip is None:
        assert float(stats["dual_clip_frac"]) == 0.0


def test_clip_fraction_hand_case():
    # ratio = exp(logp - logp_old); eps = 0.2
    ratios = np.array([[1.5, 1.5, 0.5, 0.5, 1.1, 1.5]])
    adv = np.array([[1.0, -1.0, 1.0, -1.0, 1.0, 1.0]])
    mask = np.array([[1, 1, 1, 1, 1, 0]])
    # token 0: A>0, r>1+eps -> clipped; token 1: A<0, r>1 -> unclipped branch (bigger loss);
    # token 2: A>0, r<1-eps -> unclipped; token 3: A<0, r<1-eps -> clipped; token 4: inside;
    # token 5: clipped but masked out.
    loss, stats = ppo_clip_loss(
        jnp.log(jnp.asarray(ratios)), jnp.zeros((1, 6)), jnp.asarray(adv), jnp.asarray(mask)
    )
    np.testing.assert_allclose(float(stats["clip_frac"]), 2 / 5, rtol=1e-6)
    np.testing.assert_allclose(loss, [[-1.2, 1.5, -0.5, 0.8, -1.1, 0.0]], rtol=1e-6)


def test_dual_clip_caps_loss():
    ratios = jnp.array([[10.0, 2.0, 10.0, 10.0]])
    adv = jnp.array([[-1.0, -1.0, 1.0, -2.0]])
    mask = jnp.ones((1, 4))
    plain, _ = ppo_clip_loss(jnp.log(ratios), jnp.zeros((1, 4)), adv, mask)
    capped, stats = ppo_clip_loss(jnp.log(ratios), jnp.zeros((1, 4)), adv, mask, dual_clip=3.0)
    np.testing.assert_allclose(plain, [[10.0, 2.0, -1.2, 20.0]], rtol=1e-5)
    # loss for A<0 is capped at c*|A|; A>0 untouched
    np.testing.assert_allclose(capped, [[3.0, 2.0, -1.2, 6.0]], rtol=1e-5)
    np.testing.assert_allclose(float(stats["dual_clip_frac"]), 2 / 4)
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_clip_loss(jnp.log(ratios), jnp.zeros((1, 4)), adv, mask, dual_clip=1.0)


def test_loss_agg_registry():
    assert set(LOSS_AGG.names()) == set(AGG_MODES)
    with pytest.raises(KeyError, match="token-mean"):
        agg_loss(jnp.zeros((1, 1)), jnp.ones((1, 1)), "seq-sum")


def test_agg_modes_on_ragged_mask_by_hand():
    loss = jnp.asarray(np.arange(20, dtype=np.float32).reshape(4, 5))
    mask = jnp.asarray(ragged_mask())
    # row sums: 0+1+2 = 3 (3 tok), 5 (1 tok), empty, 15+..+19 = 85 (5 tok)
    expect = {
        "token-mean": (3 + 5 + 85) / 9,
        "seq-mean-token-mean": (1.0 + 5.0 + 17.0) / 3,
        "seq-mean-token-sum": (3 + 5 + 85) / 3,
        "seq-mean-token-sum-norm": (3 + 5 + 85) / 10 / 3,
    }
    for mode, value in expect.items():
        got = float(agg_loss(loss, mask, mode, max_len=10))
        assert got == pytest.approx(value, rel=1e-6), mode
        assert got == pytest.approx(ref_agg(np.asarray(loss), ragged_mask(), mode, 10), rel=1e-6)
    # max_len defaults to T
    got = float(agg_loss(loss, mask, "seq-mean-token-sum-norm"))
    assert got == pytest.approx((3 + 5 + 85) / 5 / 3, rel=1e-6)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_agg_matches_reference_random(mode):
    rng = np.random.default_rng(6)
    loss = rng.normal(size=(5, 7))
    mask = (rng.random((5, 7)) < 0.5).astype(np.float64)
    mask[1] = 0
    got = float(agg_loss(jnp.asarray(loss, jnp.float32), jnp.asarray(mask), mode, max_len=12))
    assert got == pytest.approx(ref_agg(loss, mask, mode, 12), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_empty_mask_gives_zero_not_nan(mode):
    logp = jnp.full((2, 3), -1.0)
    mask = jnp.zeros((2, 3))

    def total(lp):
        per_tok, _ = ppo_clip_loss(lp, logp - 0.1, jnp.array([1.0, -1.0]), mask)
        return agg_loss(per_tok, mask, mode)

    assert float(total(logp)) == 0.0
    grad = np.asarray(jax.grad(total)(logp))
    assert np.all(grad == 0.0)
    _, stats = ppo_clip_loss(logp, logp - 0.1, jnp.array([1.0, -1.0]), mask)
    assert all(float(v) == 0.0 for v in stats.values())


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_policy_loss_gradient_matches_finite_differences(mode, dual_clip, x64):
    logp, logp_old, adv, mask = random_ppo_inputs(7, token_adv=False)
    logp_old, adv, mask = jnp.asarray(logp_old), jnp.asarray(adv), jnp.asarray(mask)
    if dual_clip is not None:
        # push a negative-advantage sequence to large ratios so the cap is active somewhere
        neg = int(np.argmin(np.asarray(adv)))
        logp = logp.copy()
        logp[neg, :3] = np.asarray(logp_old)[neg, :3] + np.array([1.5, 1.2, 0.05])

    def total(lp):
        per_tok, _ = ppo_clip_loss(lp, logp_old, adv, mask, 0.2, 0.28, dual_clip)
        return agg_loss(per_tok, mask, mode, max_len=8)

    grad = np.asarray(jax.grad(total)(jnp.asarray(logp)))
    assert grad.dtype == np.float64
    np.testing.assert_allclose(grad, central_fd(total, logp), rtol=1e-6, atol=1e-9)
    assert np.all(grad[np.asarray(mask) == 0] == 0.0)


def test_policy_loss_jit_equals_eager():
    logp, logp_old, adv, mask = (
        jnp.asarray(a, jnp.float32) for a in random_ppo_inputs(8, token_adv=True)
    )

    def step(lp, lo, a, m):
        per_tok, stats = ppo_clip_loss(lp, lo, a, m, 0.2, 0.28, 3.0)
        return {mode: agg_loss(per_tok, m, mode, 16) for mode in AGG_MODES}, stats

    eager = step(logp, logp_old, adv, mask)
    jitted = jax.jit(step)(logp, logp_old, adv, mask)
    for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


