"""One prompt per group (``models.prompt_sharing``): which rows share, the group's attention
over its prompt merged with the rows' own slots against one softmax written here, the
prompts kept and joined by hand, and a GRPO-shaped rollout sampling what the rows' own
copies sample, on every cache layout and decode kernel."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import models.continuation as continuation
import models.sampler as sampler
import models.transformer as transformer
from models import load_params
from models.continuation import Continuation, continue_generation
from models.prompt_sharing import grouped_prompts, prompt_group, rows_cache
from models.sampler import SamplingParams, generate
from models.transformer import (
    DEFAULT_LAYOUT,
    TPU_LAYOUT,
    KVCache,
    Placement,
    forward_with_cache,
    joined_attention,
    shared_prefix_part,
)


@pytest.mark.parametrize("rows, group", [
    ([0, 0, 1, 1], 2), ([0, 0, 0, 0], 4), ([0, 0, 0, 1], 1), ([0, 1, 2], 1),
    ([0, 0, 1, 1, 2, 2], 2), ([0, 0, 0, 1, 1, 1], 3), ([1, 1, 0, 0], 1),
    ([[0, 0, 1, 1], [0, 0, 1, 1]], 2), ([[0, 0, 1, 1], [0, 0, 0, 0]], 1),
    ([[0, 0], [0, 0]], 2)])
def test_the_group_is_the_most_consecutive_rows_reading_one_prompt(rows, group):
    assert prompt_group(np.asarray(rows)) == group


def _plain(q, k, v, mask):
    """Grouped-query softmax attention of one token in numpy: q [B,H,hd], k [B,KV,hd,S],
    v [B,KV,S,hd], mask [B,S]."""
    b, h, hd = q.shape
    kv = k.shape[1]
    out = np.zeros((b, h, hd))
    for i in range(b):
        for head in range(h):
            g = head // (h // kv)
            s = np.where(mask[i], q[i, head] @ k[i, g] / np.sqrt(hd), -np.inf)
            p = np.exp(s - s.max())
            out[i, head] = (p / p.sum()) @ v[i, g]
    return out.reshape(b, h * hd)


def test_a_shared_prefix_merged_with_the_rows_own_slots_is_one_softmax():
    rng = np.random.default_rng(0)
    n, group, h, kv, hd, width, own = 2, 3, 6, 2, 8, 5, 4
    b = n * group
    q = rng.normal(size=(b, 1, h, hd)).astype(np.float32)
    pk = rng.normal(size=(n, kv, hd, width)).astype(np.float32) * 3
    pv = rng.normal(size=(n, kv, width, hd)).astype(np.float32)
    valid = np.ones((n, width), bool)
    valid[1, :2] = False  # prompt 1 left padded
    k = rng.normal(size=(b, kv, hd, own)).astype(np.float32)
    v = rng.normal(size=(b, kv, own, hd)).astype(np.float32)
    mask = rng.random((b, own)) < 0.7
    # each row's prompt copied in front of its own slots, by hand
    joined_k = np.concatenate([np.repeat(pk, group, 0), k], axis=3)
    joined_v = np.concatenate([np.repeat(pv, group, 0), v], axis=2)
    joined_mask = np.concatenate([np.repeat(valid, group, 0), mask], axis=1)
    want = _plain(q[:, 0], joined_k, joined_v, joined_mask)
    part = jax.jit(shared_prefix_part)(q, pk, pv, valid)
    assert [x.shape for x in part] == [(b, kv, h // kv, 1)] * 2 + [(b, kv, h // kv, hd)]
    got = joined_attention(q, [(k, v, mask[:, None, :])], [part])
    np.testing.assert_allclose(np.asarray(got)[:, 0], want, atol=2e-6, rtol=1e-5)


def test_the_kept_prompts_are_each_groups_and_rows_join_their_own():
    def cache(rows, slots, start):  # keys [R,1,1,S], values [R,1,S,1]: slot values by hand
        x = start + jnp.arange(rows * slots, dtype=jnp.float32).reshape(rows, 1, 1, slots)
        return KVCache((x,), (x.swapaxes(2, 3),), jnp.ones((rows, slots), bool))

    prompts = cache(4, 2, 0)  # 4 prompts (one a filler), slots [0,1], [2,3], [4,5], [6,7]
    kept = grouped_prompts(prompts, jnp.asarray([0, 0, 1, 1, 2, 2]), 2)
    np.testing.assert_array_equal(kept.k[0][:, 0, 0], [[0, 1], [2, 3], [4, 5]])
    # two shards of 2 prompts each, each shard's 2 rows one group: its first prompt
    kept = grouped_prompts(prompts, jnp.asarray([[0, 0], [0, 0]]), 2)
    np.testing.assert_array_equal(kept.k[0][:, 0, 0], [[0, 1], [4, 5]])
    own = cache(4, 1, 100)  # rows' own slots: 100, 101, 102, 103
    joined = rows_cache(kept, own, DEFAULT_LAYOUT)
    np.testing.assert_array_equal(joined.k[0][:, 0, 0],
                                  [[0, 1, 100], [0, 1, 101], [4, 5, 102], [4, 5, 103]])
    np.testing.assert_array_equal(joined.v[0][:, 0, :, 0], joined.k[0][:, 0, 0])
    assert joined.valid.shape == (4, 3)


def test_a_shared_prompt_is_read_by_one_token_steps_only():
    cfg, params, _ = load_params("tiny", seed=3)
    cache = KVCache.zeros(cfg, 2, 4)
    with pytest.raises(ValueError, match="one-token steps only"):
        forward_with_cache(cfg, params, jnp.zeros((2, 2), jnp.int32), cache=cache,
                           cache_index=0, placement=Placement(prompt=KVCache.zeros(cfg, 1, 4)))


@pytest.fixture(scope="module")
def tiny():
    return load_params("tiny", seed=3)


def _rollout(tiny, shared, decode_kernel="xla"):
    """Greedy GRPO-shaped rows (3 prompts x 2, budgets differ), then a continuation that
    reads an observation for some rows, then every row again."""
    cfg, params, tok = tiny
    prompts = [tok.encode(t) for t in ("hello", "a much longer prompt than the first one",
                                       "third")]
    rows = [p for p in prompts for _ in range(2)]
    sp = SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True, read_block=16,
                        decode_kernel=decode_kernel, shared_prompts=shared)
    first = generate(cfg, params, tok, rows, sp, max_new_per_row=[6, 3, 6, 6, 2, 6])
    doc = tok.encode(" <information> the tower is old and tall </information>")
    second = continue_generation(cfg, params, tok, first.state,
                                 Continuation([1, 4], [doc, []]), sp)
    again = continue_generation(cfg, params, tok, first.state,  # the state is still there
                                Continuation(list(range(6)), [[]] * 6), sp)
    return first, second, again


@pytest.fixture(scope="module")
def copies(tiny):
    return _rollout(tiny, shared=False)


def _same(got, want):
    for g, w in zip(got, want, strict=True):
        assert g.token_lists() == w.token_lists() and g.finish == w.finish
        np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-5)


def test_shared_prompts_sample_what_each_rows_copy_samples(tiny, copies):
    got = _rollout(tiny, shared=True)
    assert got[0].state.prompt is not None and got[0].state.prompt.valid.shape[0] == 3
    assert got[0].state.cache.valid.shape[0] == 6  # the rows' own cache
    assert got[0].state.capacity == copies[0].state.capacity
    np.testing.assert_array_equal(got[0].state.next_slot, copies[0].state.next_slot)
    _same(got, copies)


def test_shared_prompts_on_the_tpu_layout(tiny, copies, monkeypatch):
    for module in (transformer, sampler, continuation):
        monkeypatch.setattr(module, "kv_layout", lambda mesh=None, decode_kernel="xla": TPU_LAYOUT)
    jax.clear_caches()
    try:
        _same(_rollout(tiny, shared=True), copies)
    finally:
        jax.clear_caches()


def test_shared_prompts_with_the_pallas_decode_kernel(tiny, copies):
    _same(_rollout(tiny, shared=True, decode_kernel="pallas_gpu"), copies)
