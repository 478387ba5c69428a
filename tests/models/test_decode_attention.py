"""The decode step's cache attention by the Pallas GPU kernel (``models.decode_attention``),
run in Pallas' interpreter on CPU: each row's own slots, against a softmax written here in
numpy, and a rollout through it against the plain forward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import load_params
from models.continuation import Continuation, continue_generation
from models.decode_attention import bounded_attention, kernel_blocks, row_bounds
from models.sampler import SamplingParams, generate
from models.transformer import joined_attention
from tests.models.test_sampler import _logprob_gap


def test_row_bounds_are_each_rows_first_valid_slot_to_the_slot_it_writes():
    valid = np.zeros((4, 10), bool)
    valid[0, 3:7] = True   # a left-padded prompt and 2 tokens: writes slot 7
    valid[1, 0:4] = True   # writes slot 4
    valid[3, 2:9] = True   # writes past the cache: clipped to its 10 slots
    start, end = row_bounds(jnp.asarray(valid), jnp.asarray([7, 4, 5, 12]))
    # row 2 holds nothing: an empty range at the cache's end
    assert start.tolist() == [3, 0, 10, 2] and end.tolist() == [7, 4, 10, 10]
    start, end = row_bounds(jnp.asarray(valid[:2]), jnp.asarray(7))  # one slot for all rows
    assert start.tolist() == [3, 0] and end.tolist() == [7, 7]


@pytest.mark.parametrize("slots, cut", [(256, (16, 16)), (4096, (16, 128)), (48, (3, 16)),
                                        (400, (25, 16)), (384, (12, 32)), (8, None)])
def test_kernel_blocks_cut_the_slots_as_the_kernel_takes_them(slots, cut):
    # parts of 16, 32 or 64 slots or a multiple of 128, the smallest leaving at most 16
    assert kernel_blocks(slots) == cut


def _softmax_parts(q, k, v, start, end):
    """numpy: each row's and query head's softmax over slots [start, end) of its KV head."""
    b, h, hd = q.shape
    kv = k.shape[1]
    out = np.zeros((b, h, hd))
    for r in range(b):
        for i in range(h):
            j = i // (h // kv)
            s = k[r, j, start[r]:end[r]] @ q[r, i] / np.sqrt(hd)
            p = np.exp(s - s.max())
            out[r, i] = p @ v[r, j, start[r]:end[r]] / p.sum()
    return out


@pytest.mark.parametrize("dtype, tol", [(np.float32, 2e-6), (jnp.bfloat16, 1e-2)])
def test_the_kernel_reads_each_rows_slots_as_a_softmax_over_them(dtype, tol):
    rng = np.random.default_rng(0)
    b, kv, g, s, hd = 3, 2, 3, 48, 16
    q = rng.standard_normal((b, kv * g, hd)).astype(np.float32)
    k = rng.standard_normal((b, kv, s, hd)).astype(np.float32)
    v = rng.standard_normal((b, kv, s, hd)).astype(np.float32)
    start, end = np.array([0, 5, 20]), np.array([48, 30, 20])  # the last row: empty
    as_cached = [jnp.asarray(x, dtype) for x in (k, v)]
    top, total, out = jax.jit(bounded_attention)(jnp.asarray(q), *as_cached,
                                                 jnp.asarray(start), jnp.asarray(end))
    assert top.shape == total.shape == (b, kv, g, 1) and out.shape == (b, kv, g, hd)
    got = (np.asarray(out)[:2] / np.asarray(total)[:2]).reshape(2, kv * g, hd)
    k32, v32 = (np.asarray(x.astype(jnp.float32)) for x in as_cached)
    want = _softmax_parts(q[:2], k32[:2], v32[:2], start[:2], end[:2])
    np.testing.assert_allclose(got, want, atol=tol)
    assert np.all(np.asarray(total)[2] == 0) and np.all(np.asarray(out)[2] == 0)
    # its largest score is the rows' largest q.k / sqrt(hd)
    scores = np.einsum("bkgd,bksd->bkgs", q.reshape(b, kv, g, hd), k32)[:, :, :, 5:30]
    np.testing.assert_allclose(np.asarray(top)[1, ..., 0], scores[1].max(-1) / np.sqrt(hd),
                               atol=tol)


def test_a_reduced_part_merges_as_the_slots_it_stands_for():
    """joined_attention with the kernel's reduced cache part and a part of its own slots:
    the softmax over both sets of slots (numpy, joined)."""
    rng = np.random.default_rng(1)
    b, kv, g, s, hd = 2, 2, 2, 32, 16
    q = rng.standard_normal((b, 1, kv * g, hd)).astype(np.float32)
    k = rng.standard_normal((b, kv, s, hd)).astype(np.float32)
    v = rng.standard_normal((b, kv, s, hd)).astype(np.float32)
    own_k = rng.standard_normal((b, kv, hd, 1)).astype(np.float32)  # [B,KV,hd,S] as attended
    own_v = rng.standard_normal((b, kv, 1, hd)).astype(np.float32)
    start, end = np.array([2, 0]), np.array([20, 32])
    cached = bounded_attention(jnp.asarray(q[:, 0]), jnp.asarray(k), jnp.asarray(v),
                               jnp.asarray(start), jnp.asarray(end))
    own = (jnp.asarray(own_k), jnp.asarray(own_v), jnp.ones((b, 1, 1), bool))
    got = np.asarray(joined_attention(jnp.asarray(q), [own], [cached]))[:, 0]
    joined_k = [np.concatenate([k[r, :, start[r]:end[r]], own_k[r].swapaxes(1, 2)], 1)
                for r in range(b)]
    joined_v = [np.concatenate([v[r, :, start[r]:end[r]], own_v[r]], 1) for r in range(b)]
    for r in range(b):
        n = joined_k[r].shape[1]
        want = _softmax_parts(q[r:r + 1, 0], joined_k[r][None], joined_v[r][None], [0], [n])
        np.testing.assert_allclose(got[r], want[0].reshape(-1), atol=2e-6)


def test_a_rollout_through_the_kernel_follows_the_plain_forward(monkeypatch):
    """decode_kernel="pallas_gpu": a generation and its continuation (a read in blocks, then
    decoding again) sample with the log-probs of a plain forward over each whole sequence,
    on a cache kept in the kernel's layout (keys and values [B,KV,S,hd]) that the
    continuation keeps."""
    import models.transformer as transformer

    traced = []
    kernel = transformer.bounded_attention
    monkeypatch.setattr(transformer, "bounded_attention",
                        lambda *a, **k: traced.append(a[1].shape) or kernel(*a, **k))
    cfg, params, tok = load_params("tiny", seed=3)
    prompts = [tok.encode("the cat sat on the mat"), tok.encode("hello")]
    sp = SamplingParams(12, temperature=1.0, ignore_eos=True, read_block=16,
                        decode_kernel="pallas_gpu")
    first = generate(cfg, params, tok, prompts, sp, seed=5)
    k, v = first.state.cache.k[0], first.state.cache.v[0]
    assert k.shape == v.shape == (2, cfg.num_kv_heads, k.shape[2], cfg.head_dim)
    assert first.state.decode_kernel == "pallas_gpu"
    obs = tok.encode(" <information> the tower is old </information>")
    second = continue_generation(cfg, params, tok, first.state, Continuation([0, 1], [obs, []]),
                                 SamplingParams(8, temperature=1.0, ignore_eos=True,
                                                read_block=16), seed=6)
    assert second.state.decode_kernel == "pallas_gpu"
    context = [p + c for p, c in zip(prompts, first.token_lists())]
    gaps = np.concatenate([_logprob_gap(cfg, params, tok, prompts, first),
                           _logprob_gap(cfg, params, tok, [context[0] + obs, context[1]],
                                        second)])
    assert gaps.max() < 2e-5, gaps.max()
    # every layer of both decode loops (each extent's) attended through the kernel
    assert len(traced) >= 2 * cfg.num_layers, traced
