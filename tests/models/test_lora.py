"""LoRA on the pure-function model: the factored forward, the merge, the init, the gradients,
and the same delta as qwix's own LoraProvider on a Flax nnx module."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import lora as L
from models.config import ModelConfig
from models.transformer import LowRank, dense, forward, init_params

CFG = ModelConfig(arch="qwen3", vocab_size=61, hidden_size=32, intermediate_size=48,
                  num_layers=3, num_heads=4, num_kv_heads=2, head_dim=8, qk_norm=True,
                  qkv_bias=True, tie_embeddings=False)
LORA = L.LoraConfig(rank=4, alpha=8.0, targets=L.LORA_TARGETS)
TOKENS = (jnp.arange(24).reshape(2, 12) * 7) % CFG.vocab_size


def _random_adapters(params, lora, seed=1):
    """Adapters with non-zero B (a trained state), drawn in NumPy."""
    rng = np.random.default_rng(seed)
    return {t: {k: jnp.asarray(0.05 * rng.standard_normal(s), jnp.float32)
                for k, s in shapes.items()}
            for t, shapes in L.adapter_shapes(params, lora).items()}


def _merged_by_hand(params, adapters, alpha, rank):
    """W + alpha / rank * A @ B per layer, in NumPy float64 (LoRA, arXiv:2106.09685 eq. 3)."""
    layers = dict(params["layers"])
    for t, ab in adapters.items():
        w, a, b = (np.asarray(x, np.float64) for x in (layers[t], ab["a"], ab["b"]))
        layers[t] = jnp.asarray(w + alpha / rank * np.einsum("ldr,lrf->ldf", a, b),
                                jnp.float32)
    return params | {"layers": layers}


@pytest.fixture(scope="module")
def base():
    return init_params(CFG, jax.random.key(0))


def test_lora_forward_equals_the_merged_weight_forward(base):
    adapters = _random_adapters(base, LORA)
    factored = forward(CFG, L.adapted(base, adapters, LORA), TOKENS)
    by_hand = forward(CFG, _merged_by_hand(base, adapters, LORA.alpha, LORA.rank), TOKENS)
    ours_merged = forward(CFG, L.merge(base, adapters, lora=LORA), TOKENS)
    np.testing.assert_allclose(factored, by_hand, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(ours_merged, by_hand, atol=2e-5, rtol=1e-5)
    assert float(jnp.abs(factored - forward(CFG, base, TOKENS)).max()) > 1e-3  # it changed


def test_fresh_adapters_leave_the_base_model_unchanged(base):
    """B = 0 at init: the merged weights are the base weights bit for bit, so their forward is
    the base forward exactly. The factored forward adds (x A) B = 0 but is another XLA program
    (its fusions may order the base matmul's float32 sums differently: seen on an AVX-512 CPU,
    6e-8 apart), so it is compared to float32 rounding."""
    adapters = L.init_adapters(base, LORA, jax.random.key(3))
    merged = L.merge(base, adapters, lora=LORA)
    for name, w in base["layers"].items():
        np.testing.assert_array_equal(merged["layers"][name], w, err_msg=name)
    np.testing.assert_array_equal(forward(CFG, merged, TOKENS), forward(CFG, base, TOKENS))
    np.testing.assert_allclose(forward(CFG, L.adapted(base, adapters, LORA), TOKENS),
                               forward(CFG, base, TOKENS), atol=1e-6, rtol=0)


def test_init_is_qwix_he_uniform_per_layer_and_zero_b(base):
    adapters = L.init_adapters(base, LORA, jax.random.key(3))
    for t, ab in adapters.items():
        n, d, f = base["layers"][t].shape
        a = np.asarray(ab["a"])
        assert a.shape == (n, d, 4) and ab["b"].shape == (n, 4, f)
        bound = np.sqrt(6.0 / d)  # He-uniform: U(-sqrt(6 / fan_in), +sqrt(6 / fan_in))
        assert np.abs(a).max() <= bound and np.abs(a).max() > 0.8 * bound
        # variance of U(-c, c) is c^2 / 3 = 2 / fan_in (fan_in = D per layer, not L * D)
        assert abs(a.var() / (2.0 / d) - 1) < 0.25
        assert not np.array_equal(a[0], a[1])  # every layer drawn with its own key
        np.testing.assert_array_equal(ab["b"], 0)


def test_gradients_reach_only_the_adapters_and_match_the_formula():
    """y = x W + s (x A) B with loss sum(y * g): dW = 0 (frozen), dA = s x^T g B^T,
    dB = s (x A)^T g."""
    rng = np.random.default_rng(0)
    x, w, g = (rng.standard_normal(s).astype(np.float32) for s in ((5, 6), (6, 7), (5, 7)))
    a, b = rng.standard_normal((6, 2)).astype(np.float32), rng.standard_normal((2, 7)).astype(
        np.float32)
    s = 1.5

    def loss(w, a, b):
        return jnp.sum(dense(jnp.asarray(x), LowRank(jax.lax.stop_gradient(w), a, b, s)) * g)

    dw, da, db = jax.grad(loss, argnums=(0, 1, 2))(jnp.asarray(w), jnp.asarray(a),
                                                   jnp.asarray(b))
    np.testing.assert_array_equal(dw, 0)
    np.testing.assert_allclose(da, s * x.T @ g @ b.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(db, s * (x @ a).T @ g, rtol=1e-5, atol=1e-5)


def test_model_gradients_only_on_adapters(base):
    adapters = _random_adapters(base, LORA)

    def loss(params, adapters):
        return jnp.mean(forward(CFG, L.adapted(params, adapters, LORA), TOKENS) ** 2)

    g_base, g_ad = jax.grad(loss, argnums=(0, 1))(base, adapters)
    # the targeted weights are frozen (stop_gradient); the update differentiates the adapters
    # alone, so the norms' gradients here never reach an optimizer (tests/rl/run/test_lora.py)
    assert all(float(jnp.abs(g_base["layers"][t]).max()) == 0 for t in LORA.targets)
    assert all(float(jnp.abs(x).max()) > 0 for x in jax.tree.leaves(g_ad))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # qwix 0.1.8 on flax 0.12's nnx
def test_adapted_matmul_equals_qwix_lora_provider_on_an_nnx_module():
    """qwix's LoraProvider intercepts the dot inside a Flax nnx module and adds its own
    adapters; given the same A and B, its output is ours."""
    import qwix
    from flax import nnx

    class Linear(nnx.Module):
        def __init__(self, w):
            self.w = nnx.Param(w)

        def __call__(self, x):
            return jnp.dot(x, self.w[...])

    rng = np.random.default_rng(0)
    w, x = rng.standard_normal((8, 6)).astype(np.float32), rng.standard_normal((3, 8)).astype(
        np.float32)
    model = qwix.apply_lora_to_model(
        Linear(jnp.asarray(w)), qwix.LoraProvider(module_path=".*", rank=2, alpha=3.0),
        jnp.asarray(x), rngs=nnx.Rngs(0))
    assert model.w_lora_a[...].shape == (8, 2) and model.w_lora_b[...].shape == (2, 6)
    a, b = rng.standard_normal((8, 2)).astype(np.float32), rng.standard_normal((2, 6)).astype(
        np.float32)
    model.w_lora_a[...], model.w_lora_b[...] = jnp.asarray(a), jnp.asarray(b)
    ours = dense(jnp.asarray(x), LowRank(jnp.asarray(w), jnp.asarray(a), jnp.asarray(b),
                                         3.0 / 2))
    np.testing.assert_allclose(ours, model(jnp.asarray(x)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("lora", "key"), [
    (L.LoraConfig(4, 8.0, ("wq", "embed")), "model.lora.targets[1]"),
    (L.LoraConfig(4, 8.0, ("q_proj",)), "model.lora.targets[0]"),
    (L.LoraConfig(4, 8.0, ("wq", "wq")), "model.lora.targets[1]"),
    (L.LoraConfig(4, 8.0, ()), "model.lora.targets"),
    (L.LoraConfig(-1, 8.0, ("wq",)), "model.lora.rank"),
    (L.LoraConfig(4, 0.0, ("wq",)), "model.lora.alpha"),
    (L.LoraConfig(4, -2.0, ("wq",)), "model.lora.alpha"),
])
def test_bad_lora_settings_name_the_key(lora, key):
    assert L.lora_problem(lora)[0] == key


def test_rank_zero_is_off_whatever_alpha_says():
    assert L.lora_problem(L.LoraConfig(0, 0.0, ())) is None


def test_unsupported_architecture_and_oversized_rank_are_refused(monkeypatch):
    with pytest.raises(L.LoraError, match="rank: 9 exceeds wk"):
        L.check_model(dataclasses.replace(LORA, rank=9, targets=("wk",)), CFG.replace(
            num_kv_heads=1, head_dim=8))
    monkeypatch.setattr(L, "LORA_ARCHS", ("llama",))
    with pytest.raises(L.LoraError, match="model.lora.rank: LoRA is not supported for "
                                          "architecture 'qwen3'"):
        L.check_model(LORA, CFG)
