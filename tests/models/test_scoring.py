"""Training-time scoring (models.scoring): log-probs and entropies of given tokens, and the
precision of the dots that form them."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import load_params
from models.padding import left_pad
from models.scoring import Scoring, group_logprobs, token_logprobs


@pytest.fixture(scope="module")
def tiny():
    return load_params("tiny", seed=3)


def _prompts(tok):
    texts = ["hello", "a much longer prompt with many more tokens in it than the first",
             "third one, medium length"]
    return [tok.encode(t) for t in texts]


def test_token_logprobs_entropy_shapes(tiny):
    cfg, params, tok = tiny
    toks, mask = left_pad(_prompts(tok), tok.pad_id)
    lp, ent = token_logprobs(cfg, params, jnp.asarray(toks), jnp.asarray(mask), with_entropy=True)
    assert lp.shape == ent.shape == toks.shape
    assert float(jnp.max(ent)) <= np.log(cfg.vocab_size) + 1e-3
    assert jax.numpy.all(lp <= 0)


def _concat_rows(prefixes, conts, pad_id):
    """Right-padded rows prefix + continuation, and where each continuation starts."""
    rows = [list(p) + list(c) for p, group in zip(prefixes, conts) for c in group]
    width = max(map(len, rows))
    toks = np.full((len(rows), width), pad_id, np.int32)
    mask = np.zeros((len(rows), width), bool)
    for i, r in enumerate(rows):
        toks[i, :len(r)], mask[i, :len(r)] = r, True
    starts = [len(p) for p, group in zip(prefixes, conts) for _ in group]
    return jnp.asarray(toks), jnp.asarray(mask), starts


def test_group_logprobs_equal_full_sequences_with_gradients(tiny):
    """The prefix read once per group gives every continuation the log-probs, entropies and
    gradients of running prefix + continuation as one sequence."""
    cfg, params, tok = tiny
    prefixes = [tok.encode("the shared prompt of group one"), tok.encode("group two")]
    conts = [[tok.encode(" a reply"), tok.encode(" another, longer reply here")],
             [tok.encode(" yes"), tok.encode(" no thanks")]]
    width = max(len(c) for g in conts for c in g) + 3  # right padding on every row
    pre, pre_mask = left_pad(prefixes, tok.pad_id)
    toks = np.full((2, 2, width), tok.pad_id, np.int32)
    mask = np.zeros_like(toks, bool)
    for i, j in np.ndindex(2, 2):
        toks[i, j, :len(conts[i][j])] = conts[i][j]
        mask[i, j, :len(conts[i][j])] = True
    args = (jnp.asarray(pre), jnp.asarray(pre_mask), jnp.asarray(toks), jnp.asarray(mask))
    lp, ent = group_logprobs(cfg, params, *args, scoring=Scoring(with_entropy=True))
    assert lp.shape == toks.shape
    flat, flat_mask, starts = _concat_rows(prefixes, conts, tok.pad_id)
    full, ent_full = token_logprobs(cfg, params, flat, flat_mask, with_entropy=True)
    for r, (i, j) in enumerate(np.ndindex(2, 2)):
        n, s = len(conts[i][j]), starts[r]
        np.testing.assert_allclose(lp[i, j, :n], full[r, s:s + n], atol=1e-5)
        np.testing.assert_allclose(ent[i, j, :n], ent_full[r, s:s + n], atol=1e-5)

    weights = np.random.default_rng(0).normal(size=toks.shape).astype(np.float32) * mask
    flat_w = np.zeros(flat.shape, np.float32)  # the same weights on the same tokens
    for r, (i, j) in enumerate(np.ndindex(2, 2)):
        flat_w[r, starts[r]:starts[r] + len(conts[i][j])] = weights[i, j, :len(conts[i][j])]
    g_group = jax.grad(lambda p: jnp.sum(group_logprobs(cfg, p, *args) * weights))(params)
    g_full = jax.grad(lambda p: jnp.sum(token_logprobs(cfg, p, flat, flat_mask) * flat_w))(
        params)
    for a, b in zip(jax.tree.leaves(g_group), jax.tree.leaves(g_full)):
        np.testing.assert_allclose(a, b, atol=1e-5 * float(jnp.max(jnp.abs(b))) + 1e-7)




def _dots(text):
    """(operand dims, result dims, precision) of each dot_general in a StableHLO text."""
    out = []
    for line in text.splitlines():
        if "stablehlo.dot_general" not in line:
            continue
        types = re.findall(r"tensor<([\dx]+?)xf32>", line.split(":")[-1])
        precision = re.search(r"precision = \[(\w+), (\w+)\]", line)
        out.append((types, "batching_dims" in line, precision.group(1) if precision else "DEFAULT"))
    return out


@pytest.mark.parametrize("with_entropy", [False, True])
def test_scoring_dots_that_form_probabilities_are_float32_true(tiny, with_entropy):
    """On float32 weights the logits and both attention dots of every layer ask for HIGHEST:
    at the default, a TPU runs them as one bfloat16 pass and an NVIDIA GPU in TF32, and the
    scored log-probs drift from the ones the sampler drew from (the CPU cannot show the error,
    so the program is read). The weight matmuls (2-D, no batch dimension) keep JAX's default,
    so the model's dtype stays the user's speed choice. The gradient program too (its
    transposed dots)."""
    cfg, params, tok = tiny
    pre, pre_mask = left_pad(_prompts(tok)[:2], tok.pad_id)
    toks, mask = jnp.ones((2, 3, 5), jnp.int32), jnp.ones((2, 3, 5), bool)
    args = (jnp.asarray(pre), jnp.asarray(pre_mask), toks, mask)
    scoring = Scoring(with_entropy=with_entropy)

    def loss(p):
        return jnp.sum(jax.tree.leaves(group_logprobs(cfg, p, *args, scoring=scoring))[0])

    for fn in (lambda p: group_logprobs(cfg, p, *args, scoring=scoring), jax.grad(loss)):
        dots = _dots(jax.jit(fn).lower(params).as_text())
        vocab = str(cfg.vocab_size)  # the logits' dots, forward and backward
        logits = [d for d in dots if any(vocab in t.split("x") for t in d[0])]
        batched = [d for d in dots if d[1]]
        plain = [d for d in dots if not d[1] and d not in logits]
        assert logits and all(d[2] == "HIGHEST" for d in logits), logits
        # attention: scores and weighted values, for the prefix and for the continuations
        assert len(batched) >= 4 and all(d[2] == "HIGHEST" for d in batched), batched
        assert plain and all(d[2] == "DEFAULT" for d in plain)


def test_scoring_on_bfloat16_weights_leaves_precision_to_the_backend(tiny):
    """bfloat16 x bfloat16 products are exact in the float32 accumulator: no HIGHEST asked."""
    cfg, params, tok = tiny
    half = jax.tree.map(lambda a: a.astype(jnp.bfloat16), params)
    toks, mask = left_pad(_prompts(tok), tok.pad_id)
    text = jax.jit(lambda p: token_logprobs(cfg, p, jnp.asarray(toks), jnp.asarray(mask))).lower(
        half).as_text()
    assert "stablehlo.dot_general" in text and "HIGHEST" not in text
