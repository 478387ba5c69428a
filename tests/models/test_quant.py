"""QLoRA's quantized base weights (``models.quant``): the formats by hand, the matmul on them,
and LoRA trained over them against LoRA over the float32 base."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from models.lora import LoraConfig, quantized_base
from models.presets import tiny_config
from models.quant import BLOCK, NF4_LEVELS, Quantized, dequantize, quantize
from models.transformer import dense, init_params


def test_int8_by_hand():
    """One block of 64 values along D per column: m = max |w|, code = round(127 w / m)."""
    w = np.zeros((BLOCK, 2), np.float32)
    w[:4, 0] = [0.5, -1.0, 0.25, 0.3]  # m = 1: codes 64 (63.5 rounds to even), -127, 32, 38
    w[:2, 1] = [2.0, -0.02]            # m = 2: codes 127, -1 (-1.27)
    q = quantize(jnp.asarray(w), "int8")
    assert q.codes.dtype == jnp.int8 and q.scales.shape == (1, 2)
    np.testing.assert_array_equal(np.asarray(q.codes)[:4, 0], [64, -127, 32, 38])
    np.testing.assert_array_equal(np.asarray(q.codes)[:2, 1], [127, -1])
    np.testing.assert_allclose(np.asarray(dequantize(q))[:4, 0],
                               np.asarray([64, -127, 32, 38]) / 127, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(dequantize(q))[:2, 1], [2.0, -2 / 127], rtol=1e-6)


def test_nf4_by_hand():
    """Values at the NF4 levels times the block's maximum come back exactly; a value between
    two levels takes the nearer; two codes share a byte, the even row's in the low nibble."""
    m = 0.5
    w = np.zeros((BLOCK, 1), np.float32)
    w[:16, 0] = NF4_LEVELS * m               # codes 0..15
    w[16, 0] = 0.3 * m                       # between .246 (10) and .338 (11): .338 nearer
    q = quantize(jnp.asarray(w), "nf4")
    assert q.codes.dtype == jnp.uint8 and q.codes.shape == (BLOCK // 2, 1)
    assert q.shape == (BLOCK, 1)
    assert int(q.codes[0, 0]) == 0 | (1 << 4) and int(q.codes[7, 0]) == 14 | (15 << 4)
    assert int(q.codes[8, 0]) & 0xF == 11
    back = np.asarray(dequantize(q))[:, 0]
    np.testing.assert_allclose(back[:16], NF4_LEVELS * m, rtol=1e-6)
    assert back[16] == pytest.approx(NF4_LEVELS[11] * m)
    assert np.all(back[17:] == 0)            # 0 is a level: zeros stay exact


def test_a_quantized_matmul_is_the_matmul_of_its_dequantized_weight():
    w = jax.random.normal(jax.random.key(1), (128, 8)) * 0.02
    x = jax.random.normal(jax.random.key(2), (3, 128))
    for kind in ("int8", "nf4"):
        q = quantize(w, kind)
        np.testing.assert_allclose(dense(x, q), dense(x, dequantize(q)), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="unknown kind 'fp8'"):
        quantize(w, "fp8")


def test_lora_over_a_quantized_base_follows_lora_over_float32():
    """8 Adam steps of LoRA (rank 4, 4 targets) on one fixed GRPO batch, the tiny model's base
    in float32, int8 and nf4: the loss curves agree within 0.005 (the curve falls by about
    0.12; the measured gaps are in docs/guides/lora.md)."""
    from rl.grpo.train_step import LossConfig, init_train_state, make_train_step
    from rl.run.lora import LoraRun, fresh_adapters

    cfg = tiny_config(vocab_size=256)
    base = init_params(cfg, jax.random.key(0))
    rng = np.random.default_rng(0)
    n, g, p, r = 8, 4, 6, 12
    batch = {"prefix": rng.integers(0, 256, (n, p)).astype(np.int32),
             "prefix_mask": np.ones((n, p), bool),
             "tokens": rng.integers(0, 256, (n, g, r)).astype(np.int32),
             "attn_mask": np.ones((n, g, r), bool),
             "loss_mask": (rng.random((n, g, r)) < 0.8).astype(np.float32),
             "advantages": rng.normal(size=(n, g)).astype(np.float32),
             "logp_old": -5.5 + 0.1 * rng.normal(size=(n, g, r)).astype(np.float32),
             "logp_ref": -5.5 + 0.1 * rng.normal(size=(n, g, r)).astype(np.float32)}
    curves = {}
    for quant in ("none", "int8", "nf4"):
        lora = LoraConfig(4, 8.0, ("wq", "wv", "w_up", "w_down"), quant)
        qbase = quantized_base(base, lora)
        if quant != "none":  # every layer matmul stored quantized, targets or not
            assert all(isinstance(qbase["layers"][k], Quantized) for k in ("wq", "wk", "wo"))
        opt = optax.adam(1e-2)
        step = make_train_step(cfg, LossConfig(beta=0.0, on_policy=False), opt, donate=False,
                               lora=lora)
        state = init_train_state(fresh_adapters(LoraRun(lora, qbase, "", {}), 0), opt)
        losses = []
        for _ in range(8):
            state, metrics = step(state, batch, qbase)
            losses.append(float(metrics["loss"]))
        curves[quant] = np.asarray(losses)
    assert curves["none"][0] - curves["none"][-1] > 0.1
    for quant in ("int8", "nf4"):
        assert np.max(np.abs(curves[quant] - curves["none"])) < 0.005, curves
