"""The whole update loss, PPO-clip + beta * KL - entropy_coef * H, composed in the jitted
`policy_loss` against an independent reference (#18 item 8): log-probs and entropies from a
plain full-sequence forward computed in NumPy at the sampling temperature, then the NumPy
references of PPO-clip, the KL estimator and each aggregation mode of tests/rl/references.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.presets import tiny_config
from models.transformer import forward, init_params
from rl.grpo.train_step import LossConfig, policy_loss
from tests.rl.references import AGG_MODES, ref_agg, ref_kl, ref_ppo

N, G, P, R, V = 3, 2, 5, 7, 64
TEMPERATURE = 0.7


@pytest.fixture(scope="module")
def setup():
    cfg = tiny_config(vocab_size=V)
    params = init_params(cfg, jax.random.key(1))
    rng = np.random.default_rng(0)
    loss_mask = np.zeros((N, G, R), np.float32)
    for i in range(N):
        for j in range(G):
            loss_mask[i, j, : rng.integers(2, R + 1)] = 1  # ragged responses
    loss_mask[2, 1] = 0  # a trajectory without loss tokens (skipped by the seq modes)
    batch = {"prefix": rng.integers(1, V, (N, P)).astype(np.int32),
             "prefix_mask": np.ones((N, P), bool),
             "tokens": rng.integers(1, V, (N, G, R)).astype(np.int32),
             "attn_mask": np.ones((N, G, R), bool), "loss_mask": loss_mask,
             "advantages": np.array([[1.0, -1.0], [0.5, -2.0], [-0.3, 0.0]], np.float32)}
    logp, entropy = _reference_logprobs(cfg, params, batch)
    # old and reference policies away from the current one: ratios far enough from 1 that
    # the clip (and the dual clip) act on some tokens
    batch["logp_old"] = (logp + rng.normal(0, 0.4, logp.shape)).astype(np.float32)
    batch["logp_ref"] = (logp + rng.normal(0, 0.3, logp.shape)).astype(np.float32)
    return cfg, params, batch, logp, entropy


def _reference_logprobs(cfg, params, batch):
    """Per-token log-prob of each response token and the entropy of its predictive
    distribution, from logits / T of the whole sequence prefix + response, in float64."""
    logp = np.zeros((N, G, R))
    ent = np.zeros((N, G, R))
    for i in range(N):
        for j in range(G):
            seq = np.concatenate([batch["prefix"][i], batch["tokens"][i, j]])[None]
            logits = np.asarray(forward(cfg, params, jnp.asarray(seq)), np.float64)[0]
            z = logits[P - 1: P - 1 + R] / TEMPERATURE  # position t predicts token t + 1
            z = z - z.max(-1, keepdims=True)
            logprobs = z - np.log(np.exp(z).sum(-1, keepdims=True))
            logp[i, j] = logprobs[np.arange(R), batch["tokens"][i, j]]
            ent[i, j] = -(np.exp(logprobs) * logprobs).sum(-1)
    return logp, ent


@pytest.mark.parametrize("mode", AGG_MODES)
def test_composed_loss_matches_the_reference(setup, mode):
    cfg, params, batch, logp, entropy = setup
    beta, ent_coef, eps_low, eps_high, dual = 0.05, 0.01, 0.2, 0.28, 1.5
    lc = LossConfig(eps_low=eps_low, eps_high=eps_high, dual_clip=dual, beta=beta,
                    kl_estimator="k3", loss_agg=mode, entropy_coef=ent_coef, on_policy=False,
                    temperature=TEMPERATURE)
    loss, metrics = jax.jit(lambda p, b: policy_loss(cfg, lc, p, b))(
        params, jax.tree.map(jnp.asarray, batch))

    rows = lambda a: np.asarray(a, np.float64).reshape(N * G, -1)  # noqa: E731
    mask = rows(batch["loss_mask"])
    pg, stats = ref_ppo(rows(logp), rows(batch["logp_old"]), rows(batch["advantages"])[:, 0],
                        mask, eps_low, eps_high, dual)
    kl = ref_kl(rows(logp), rows(batch["logp_ref"]), "k3")
    expected = (ref_agg(pg, mask, mode) + beta * ref_agg(kl, mask, mode)
                - ent_coef * ref_agg(rows(entropy), mask, mode))
    assert stats["clip_frac"] > 0 and stats["dual_clip_frac"] > 0  # the clips act here
    np.testing.assert_allclose(float(loss), expected, rtol=2e-4, atol=1e-6)
    np.testing.assert_allclose(float(metrics["pg_loss"]), ref_agg(pg, mask, mode), rtol=2e-4,
                               atol=1e-6)
    np.testing.assert_allclose(float(metrics["clip_frac"]), stats["clip_frac"], atol=1e-6)
    tok = mask.astype(bool)
    np.testing.assert_allclose(float(metrics["kl"]), kl[tok].mean(), rtol=2e-4)
    np.testing.assert_allclose(float(metrics["entropy"]), rows(entropy)[tok].mean(), rtol=2e-4)
