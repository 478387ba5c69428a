"""Attention over parts of the slots, merged by log-sum-exp, against one softmax written here."""

import jax
import numpy as np
import pytest

from models.transformer import joined_attention


def _plain(q, k, v, mask):
    """Grouped-query softmax attention in numpy: q [B,T,H,hd], k [B,KV,hd,S], v [B,KV,S,hd],
    mask [B,T,S]; a row with no slot to attend to averages them all (finite masking)."""
    b, t, h, hd = q.shape
    kv = k.shape[1]
    out = np.zeros((b, t, h, hd))
    for i in range(b):
        for head in range(h):
            g = head // (h // kv)
            s = q[i, :, head] @ k[i, g] / np.sqrt(hd)                       # [T,S]
            s = np.where(mask[i], s, -1e30)
            p = np.exp(s - s.max(-1, keepdims=True))
            out[i, :, head] = (p / p.sum(-1, keepdims=True)) @ v[i, g]
    return out.reshape(b, t, h * hd)


@pytest.mark.parametrize("t", [1, 3])
def test_parts_merged_by_log_sum_exp_equal_one_softmax(t):
    rng = np.random.default_rng(0)
    b, h, kv, hd, widths = 2, 4, 2, 8, (5, 0, 7, 2)
    s = sum(widths)
    q = rng.normal(size=(b, t, h, hd)).astype(np.float32)
    k = rng.normal(size=(b, kv, hd, s)).astype(np.float32) * 3
    v = rng.normal(size=(b, kv, s, hd)).astype(np.float32)
    mask = rng.random((b, t, s)) < 0.6
    mask[0, :, :5] = False  # a whole part masked for row 0
    mask[1, 0, :] = False   # row 1's first token attends to nothing (left padding)
    edges = np.cumsum((0,) + widths)
    parts = [(k[..., a:z], v[:, :, a:z], mask[..., a:z]) for a, z in zip(edges, edges[1:])
             if z > a]
    want = _plain(q, k, v, mask)
    got = np.asarray(jax.jit(joined_attention)(q, parts))
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=1e-5)
    one = np.asarray(joined_attention(q, [(k, v, mask)]))
    np.testing.assert_allclose(one, want, atol=2e-6, rtol=1e-5)
