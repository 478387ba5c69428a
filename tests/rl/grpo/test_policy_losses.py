"""GSPO, GSPO-token and CISPO (rl/grpo/losses.py) and the RLOO and REINFORCE++-baseline
advantage estimators (rl/grpo/advantages.py) against their papers' formulas written out here in
NumPy (#20)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl.grpo.advantages import group_advantages
from rl.grpo.losses import POLICY_LOSSES, agg_loss

RNG = np.random.default_rng(0)
B, T = 4, 6
LOGP = -1.0 - RNG.random((B, T))
OLD = LOGP + RNG.normal(0, 0.3, (B, T))
MASK = np.ones((B, T))
MASK[1, 4:] = 0
MASK[3, 2:] = 0
ADV = np.array([1.0, -0.5, 2.0, -1.5])


def _gspo_ref(logp, old, adv, mask, lo, hi):
    """GSPO eq. (5)-(7): s_i = exp(mean over the response of log ratios), clipped per
    sequence; the objective averaged over sequences."""
    losses = []
    for i in range(len(adv)):
        toks = [t for t in range(logp.shape[1]) if mask[i, t]]
        s = math.exp(sum(logp[i, t] - old[i, t] for t in toks) / len(toks))
        losses.append(-min(s * adv[i], min(max(s, 1 - lo), 1 + hi) * adv[i]))
    return sum(losses) / len(losses)


def _loss(name, logp, lo, hi, mode="seq-mean-token-mean"):
    per_token, stats = POLICY_LOSSES.get(name)(logp, jnp.asarray(OLD), jnp.asarray(ADV),
                                               jnp.asarray(MASK), lo, hi)
    return agg_loss(per_token, jnp.asarray(MASK), mode), stats


@pytest.mark.parametrize("lo, hi", [(3e-4, 4e-4), (0.2, 0.2), (10.0, 10.0)])
def test_gspo_value_is_the_papers(lo, hi):
    for name in ("gspo", "gspo_token"):
        value, _ = _loss(name, jnp.asarray(LOGP), lo, hi)
        np.testing.assert_allclose(float(value), _gspo_ref(LOGP, OLD, ADV, MASK, lo, hi),
                                   rtol=1e-5)


def test_gspo_token_gradient_equals_gspo_with_sequence_advantages():
    # the paper's eq. (15)-(16): with A_{i,t} = A_i the two objectives have the same gradient
    grads = [jax.grad(lambda lp, n=n: _loss(n, lp, 0.2, 0.2)[0])(jnp.asarray(LOGP))
             for n in ("gspo", "gspo_token")]
    np.testing.assert_allclose(np.asarray(grads[0]), np.asarray(grads[1]), rtol=1e-5, atol=1e-7)
    # and the unclipped gradient by hand: d/d logp_t of -s_i A_i / B = -s_i A_i / (|y_i| B)
    g = np.asarray(jax.grad(lambda lp: _loss("gspo", lp, 10.0, 10.0)[0])(jnp.asarray(LOGP)))
    for i in range(B):
        n = MASK[i].sum()
        s = math.exp(((LOGP[i] - OLD[i]) * MASK[i]).sum() / n)
        np.testing.assert_allclose(g[i][MASK[i] > 0], -s * ADV[i] / (n * B), rtol=1e-5)
        assert np.all(g[i][MASK[i] == 0] == 0)


def test_gspo_clips_whole_sequences():
    _, stats = _loss("gspo", jnp.asarray(LOGP), 3e-4, 4e-4)
    # every sequence's ratio leaves the tiny range in one direction or the other
    ratios = [math.exp(((LOGP[i] - OLD[i]) * MASK[i]).sum() / MASK[i].sum()) for i in range(B)]
    clipped_tokens = sum(MASK[i].sum() for i in range(B)
                         if -ADV[i] * min(max(ratios[i], 1 - 3e-4), 1 + 4e-4) > -ADV[i] * ratios[i])
    np.testing.assert_allclose(float(stats["clip_frac"]), clipped_tokens / MASK.sum(), rtol=1e-6)


def test_cispo_value_and_gradient_are_minimax_m1s():
    lo, hi = 1.0, 0.28
    value, stats = _loss("cispo", jnp.asarray(LOGP), lo, hi, mode="token-mean")
    ratio = np.exp(LOGP - OLD)
    weight = np.clip(ratio, 1 - lo, 1 + hi)
    tok = MASK > 0
    expected = (-(weight * ADV[:, None] * LOGP))[tok].mean()  # eq. (4), token-mean
    np.testing.assert_allclose(float(value), expected, rtol=1e-5)
    np.testing.assert_allclose(float(stats["clip_frac"]),
                               ((ratio > 1 + hi) | (ratio < 1 - lo))[tok].mean())
    # the weight is stopped: the gradient is -w A / N on every token, clipped or not
    g = np.asarray(jax.grad(lambda lp: _loss("cispo", lp, lo, hi, "token-mean")[0])(
        jnp.asarray(LOGP)))
    np.testing.assert_allclose(g[tok], (-weight * ADV[:, None] / tok.sum())[tok], rtol=1e-5)
    assert np.all(g[tok] != 0)  # unlike PPO-clip, no token loses its gradient


def test_dual_clip_is_refused_outside_ppo():
    for name in ("gspo", "gspo_token", "cispo"):
        with pytest.raises(ValueError, match="dual_clip"):
            POLICY_LOSSES.get(name)(jnp.asarray(LOGP), jnp.asarray(OLD), jnp.asarray(ADV),
                                    jnp.asarray(MASK), 0.2, 0.2, dual_clip=3.0)


def test_rloo_leaves_one_out():
    r = np.array([[1.0, 0.0, 0.0, 1.0], [0.2, 0.5, 0.8, 0.5], [1.0, 1.0, 1.0, 1.0]])
    want = np.array([[r[n, i] - (r[n].sum() - r[n, i]) / 3 for i in range(4)] for n in range(3)])
    np.testing.assert_allclose(np.asarray(group_advantages(jnp.asarray(r), "rloo")), want,
                               atol=1e-6)
    assert want[0, 0] == pytest.approx(2 / 3)  # 1 - (0 + 0 + 1) / 3


def test_reinforce_pp_baseline_whitens_over_the_batch():
    r = np.array([[1.0, 0.0], [0.0, 0.0], [0.9, 0.1, ]])
    centred = r - r.mean(axis=1, keepdims=True)  # [[.5, -.5], [0, 0], [.4, -.4]]
    flat = centred.ravel()
    mean = flat.mean()
    std = math.sqrt(sum((x - mean) ** 2 for x in flat) / (len(flat) - 1))
    want = (centred - mean) / (std + 1e-6)
    got = np.asarray(group_advantages(jnp.asarray(r), "reinforce_plus_plus_baseline"))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert np.all(got[1] == 0)  # the homogeneous group keeps no signal
    np.testing.assert_allclose(np.asarray(group_advantages(jnp.asarray(r), "reinforce_pp")), got)


@pytest.fixture
def _char(char_model, monkeypatch):
    monkeypatch.setenv("CHAR_MODEL", str(char_model))


@pytest.mark.parametrize("algo", ["gspo", "cispo"])
def test_losses_train_through_the_trainer(tmp_path, _char, algo):
    from rl.run.trainer import build_trainer
    from tests.rl.run.test_trainer import LEARN, make_cfg

    t = build_trainer(make_cfg(tmp_path / algo, *LEARN, f"algo={algo}", "trainer.max_steps=2",
                               "trainer.batch_prompts=2", "algo.group_size=2",
                               "trainer.max_new_tokens=6", "trainer.ppo_epochs=2",
                               "optim.lr=1e-2", "trainer.eval_at_ends=false"))
    assert t.loss_cfg.policy_loss == algo
    recs = t.run()
    t.close()
    assert all(math.isfinite(r["loss"]) for r in recs if "loss" in r)
    if algo == "gspo":  # the second epoch leaves GSPO's 3e-4 / 4e-4 range
        assert max(r["clip_frac"] for r in recs) > 0


def test_dual_clip_with_gspo_names_the_key(tmp_path, _char):
    from rl.run.trainer import ConfigError, build_trainer
    from tests.rl.run.test_trainer import make_cfg

    with pytest.raises(ConfigError, match=r"algo\.dual_clip.*gspo"):
        build_trainer(make_cfg(tmp_path / "x", "algo=gspo", "algo.dual_clip=3.0"))
