"""The sampler on a paged KV cache (``models.paged_cache``): rollouts whose log-probs are a
plain forward's over each whole sequence (with the reference and both Pallas kernels,
interpreted), the dense cache's samples through sub-batches, reads and widening, and the
layout of rows in pages checked by hand; a group's rows sharing their prompt's pages."""

import functools
import importlib.util
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest

from models import load_params
from models.continuation import Continuation, _paged_rows, _put, continue_generation
from models.padding import right_pad
from models.paged_attention import paged_attention_parts
from models.paged_cache import (
    PAGE_SLOTS,
    PagedCache,
    SharedPrompts,
    _grouped_attention,
    prompt_pages,
    shared_prompt_pages,
    shared_row_slots,
)
from models.sampler import SamplingParams, generate, prompt_batch
from tests.models.test_prompt_sharing import _rollout, _same
from tests.models.test_sampler import _logprob_gap


@pytest.fixture(scope="module")
def tiny():
    return load_params("tiny", seed=3)


@pytest.mark.parametrize("kernel, tol", [("paged_xla", 2e-5), ("paged_gpu", 2e-5),
                                         # it rounds keys and values to bfloat16
                                         ("paged_tpu", 2e-3)])
def test_a_paged_rollout_follows_the_plain_forward(tiny, kernel, tol):
    """A generation and its continuation (an observation read in blocks, then decoding) sample
    with the log-probs of a plain forward over each whole sequence."""
    cfg, params, tok = tiny
    prompts = [tok.encode("the cat sat on the mat"), tok.encode("hello")]
    sp = SamplingParams(12, temperature=1.0, ignore_eos=True, read_block=16,
                        decode_kernel=kernel)
    first = generate(cfg, params, tok, prompts, sp, seed=5)
    state = first.state
    assert isinstance(state.cache, PagedCache) and state.decode_kernel == kernel
    # each row's tokens from slot 0: its prompt, then what it generated
    assert state.next_slot.tolist() == [len(p) + 12 for p in prompts]
    obs = tok.encode(" <information> the tower is old and tall, it stands by the wide river "
                     "</information>")
    assert len(obs) > 16  # read in two blocks
    second = continue_generation(cfg, params, tok, state, Continuation([0, 1], [obs, []]),
                                 SamplingParams(8, temperature=1.0, ignore_eos=True,
                                                read_block=16), seed=6)
    assert second.state.decode_kernel == kernel
    context = [p + c for p, c in zip(prompts, first.token_lists())]
    gaps = np.concatenate([_logprob_gap(cfg, params, tok, prompts, first),
                           _logprob_gap(cfg, params, tok, [context[0] + obs, context[1]],
                                        second)])
    assert gaps.max() < tol, gaps.max()


def test_paged_rows_sample_what_the_dense_cache_samples():
    """Greedy GRPO-shaped rows, a continuation of 2 of the 6 rows (a sub-batch, one reading),
    then every row again from the same state: the dense cache's samples and log-probs."""
    tiny = load_params("tiny")
    _same(_rollout(tiny, shared=True, decode_kernel="paged_xla"),
          _rollout(tiny, shared=False))


def test_a_paged_state_widens_when_a_continuation_needs_more_slots(tiny):
    cfg, params, tok = tiny
    prompts = [tok.encode("one two three"), tok.encode("four")]
    short = SamplingParams(4, temperature=0.0, ignore_eos=True)
    paged = SamplingParams(4, temperature=0.0, ignore_eos=True, decode_kernel="paged_xla")
    longer = SamplingParams(40, temperature=0.0, ignore_eos=True)
    want = continue_generation(cfg, params, tok, generate(cfg, params, tok, prompts, short).state,
                               Continuation([1, 0], [[5, 6], []]), longer)
    state = generate(cfg, params, tok, prompts, paged).state
    before = state.capacity
    got = continue_generation(cfg, params, tok, state, Continuation([1, 0], [[5, 6], []]),
                              longer)
    assert got.state.capacity > before and got.state.capacity % PAGE_SLOTS == 0
    assert got.token_lists() == want.token_lists()
    np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)


def test_a_paged_caches_prompts_are_right_padded_and_start_its_rows_pages():
    tokens, mask = right_pad([[5, 6, 7], [8]], pad_id=0, bucket=4)
    assert tokens.tolist() == [[5, 6, 7, 0], [8, 0, 0, 0]]
    assert mask.tolist() == [[True, True, True, False], [True, False, False, False]]
    batch, _ = prompt_batch([[5, 6, 7], [8]], SamplingParams(4, decode_kernel="paged_xla"),
                            pad_id=0)
    assert np.asarray(batch.tokens)[:2, :4].tolist() == [[5, 6, 7, 0], [8, 0, 0, 0]]
    # 2 rows' prompts of 4 slots ([B,KV,W,hd] = [2,1,4,1], slot j holding 10 b + j) into
    # pages of 16 slots, 20 slots a row: 2 pages each, row b's pages 2b and 2b + 1
    keys = jnp.asarray([[[[10 * b + j] for j in range(4)]] for b in range(2)], jnp.float32)
    cache = prompt_pages([keys], [-keys], slots=20)
    assert cache.table.tolist() == [[0, 1], [2, 3]] and cache.slots == 32
    pool = np.asarray(cache.k[0])[0, :, :, 0]  # [pages, slots]
    assert pool[0, :4].tolist() == [0, 1, 2, 3] and pool[2, :4].tolist() == [10, 11, 12, 13]
    assert not pool[0, 4:].any() and not pool[1].any() and not pool[3].any()
    np.testing.assert_array_equal(cache.v[0], -cache.k[0])


def test_a_sub_batch_is_its_rows_tables_and_padding_rows_write_nowhere():
    k = (jnp.zeros((2, 8, PAGE_SLOTS, 4)),)  # 8 pages: 2 shards x 2 rows x 2 pages
    table = jnp.asarray([[0, 1], [2, 3], [0, 1], [2, 3]], jnp.int32)  # local to each shard
    cache = PagedCache(k, k, table)
    # shard 0 takes its row 1 and a padding row (2 = its row count), shard 1 its row 0
    index = jnp.asarray([[1, 2], [0, 2]], jnp.int32)
    sub = _paged_rows(cache, index)
    assert sub.k is cache.k
    # a padding row's pages are past its shard's 4: its writes are dropped
    assert sub.table.tolist() == [[2, 3], [4, 4], [0, 1], [4, 4]]
    # putting the sub-batch back keeps its pools and the whole batch's table
    new = (jnp.ones((2, 8, PAGE_SLOTS, 4)),)
    back = _put(cache, index, sub._replace(k=new, v=new))
    assert back.k is new and back.table is table


def test_a_sub_batch_keeps_its_groups_where_it_has_more_rows_than_prompts():
    """2 shards of 4 rows in groups of 2 (2 prompts a shard): a sub-batch of 3 rows a shard
    places each group member at its sub-batch row (3: not in it); one of 2 rows a shard
    (no more than its prompts) reads them through its table; putting back restores them."""
    k = (jnp.zeros((1, 8, PAGE_SLOTS, 1)),)
    members = jnp.asarray([[0, 1], [2, 3], [0, 1], [2, 3]], jnp.int32)
    prompts = SharedPrompts(jnp.zeros((4, 1), jnp.int32), jnp.full(4, 16, jnp.int32), members)
    cache = PagedCache(k, k, jnp.zeros((8, 2), jnp.int32), prompts)
    # shard 0 takes its rows 1, 2, 3; shard 1 its row 0 and two padding rows (4)
    sub = _paged_rows(cache, jnp.asarray([[1, 2, 3], [0, 4, 4]], jnp.int32))
    assert sub.prompts.rows.tolist() == [[3, 0], [1, 2], [0, 3], [3, 3]]
    assert sub.prompts.table is prompts.table and sub.prompts.slots is prompts.slots
    assert _paged_rows(cache, jnp.asarray([[1, 2], [0, 3]], jnp.int32)).prompts is None
    back = _put(cache, jnp.asarray([[1, 2], [0, 3]], jnp.int32), sub)
    assert back.prompts is prompts


def test_a_groups_rows_share_their_prompts_full_pages():
    """2 prompts of a 40-slot width (40 and 17 tokens) shared by groups of 2 rows, 60 slots
    a row unshared (20 after the width): each prompt's 2 full pages stored once, then each
    row's own 3 pages (ceil(20 / 16) + 1), the first a copy of its prompt's partial page.
    Tables and contents by hand."""
    width, group = 40, 2
    keys = jnp.asarray([[[[100 * q + j] for j in range(width)]] for q in range(2)],
                       jnp.float32)  # [Q,KV,W,hd] = [2,1,40,1], slot j of prompt q: 100 q + j
    cache = shared_prompt_pages([keys], [-keys], jnp.asarray([40, 17]), group, slots=60)
    # pages 0-3: the prompts' full pages (prompt 0: 0, 1; prompt 1: 2, 3); 4-15 the rows' own
    # (row r: 4 + 3 r ...); 16: past the pools
    assert cache.table.tolist() == [[0, 1, 4, 5, 6], [0, 1, 7, 8, 9],
                                    [2, 10, 11, 12, 16], [2, 13, 14, 15, 16]]
    pool = np.asarray(cache.k[0])[0, :, :, 0]  # [pages, slots]
    assert pool.shape == (16, PAGE_SLOTS)
    assert pool[1].tolist() == list(range(16, 32)) and pool[2].tolist() == list(range(100, 116))
    # a row's first own page: its prompt's page L // 16 (prompt 0: slots 32-39, then padding)
    for r in (0, 1):
        assert pool[4 + 3 * r].tolist() == list(range(32, 40)) + [0] * 8
    for r in (2, 3):
        assert pool[4 + 3 * r].tolist() == list(range(116, 132))
    # every row reads its prompt through its table
    for r, (q, n) in enumerate([(0, 40), (0, 40), (1, 17), (1, 17)]):
        slots = pool[np.minimum(cache.table[r], 15)].reshape(-1)
        assert slots[:n].tolist() == [100 * q + j for j in range(n)]
    np.testing.assert_array_equal(cache.v[0], -cache.k[0])
    # what a decode step reads once a group: each prompt's pages and its full pages' slots
    assert cache.prompts.table.tolist() == [[0, 1], [2, 3]]
    assert cache.prompts.slots.tolist() == [32, 16]
    assert cache.prompts.rows.tolist() == [[0, 1], [2, 3]]
    # slots a row holds: its prompt's full pages and its own; >= its prompt + 20
    assert shared_row_slots(np.asarray([40, 40, 17, 17]), width, 60).tolist() == [80, 80, 64, 64]


def _softmax_over_pages(q, k_pages, v_pages, pages, length):
    """numpy: one token's heads q [H,hd] over the first `length` slots of `pages` in order."""
    kv, hd = k_pages.shape[0], k_pages.shape[-1]
    keys = k_pages[:, pages].reshape(kv, -1, hd)[:, :length]
    values = v_pages[:, pages].reshape(kv, -1, hd)[:, :length]
    out = np.zeros(q.shape)
    for head in range(q.shape[0]):
        j = head // (q.shape[0] // kv)
        s = keys[j] @ q[head] / np.sqrt(hd)
        p = np.exp(s - s.max())
        out[head] = p @ values[j] / p.sum()
    return out


@pytest.mark.parametrize("kernel", ["xla", "pallas_tpu", "pallas_gpu"])
def test_a_groups_prompt_is_read_once_from_its_pages_and_merged_with_each_rows_own(kernel):
    """Two groups of 2 rows, pages of 8 slots: prompt 0 shares 2 full pages (16 slots),
    prompt 1 one (its second page unread). The rows' tables point their shared entries at
    a page of noise, so the result shows the prompt read from the group's pages (once for
    the group), merged with each row's own pages: a softmax over both, by hand. A sub-batch
    of rows 3 and 1 (one member of each group) gets the same."""
    rng = np.random.default_rng(5)
    kv, size, hd = 2, 8, 128
    # bfloat16 values: the TPU kernel rounds keys and values to it as it loads them
    k_pages, v_pages = (np.asarray(jnp.asarray(rng.standard_normal((kv, 16, size, hd)),
                                               jnp.bfloat16).astype(jnp.float32))
                        for _ in range(2))
    prompts = SharedPrompts(jnp.asarray([[0, 1], [2, 3]], jnp.int32),
                            jnp.asarray([16, 8], jnp.int32),
                            jnp.asarray([[0, 1], [2, 3]], jnp.int32))
    noise, past = 15, 16  # each row: 2 shared entries, 3 own pages
    table = np.asarray([[noise, noise, 4, 5, 6], [noise, noise, 7, 8, 9],
                        [noise, 10, 11, 12, past], [noise, 13, 14, 15, past]], np.int32)
    lengths = np.asarray([21, 40, 11, 25], np.int32)  # row 1 fills its own pages
    q = rng.standard_normal((4, 1, 4, hd)).astype(np.float32)
    parts = functools.partial(paged_attention_parts, kernel=kernel)
    got = _grouped_attention(jnp.asarray(q), jnp.asarray(k_pages), jnp.asarray(v_pages),
                             jnp.minimum(jnp.asarray(table), 15), jnp.asarray(lengths),
                             prompts, parts, None)
    for r, (prompt, first) in enumerate([([0, 1], 2), ([0, 1], 2), ([2], 1), ([2], 1)]):
        pages = prompt + table[r, first:first + 3].tolist()
        want = _softmax_over_pages(q[r, 0], k_pages, v_pages, pages, lengths[r])
        np.testing.assert_allclose(got[r, 0], want, atol=2e-5)
    # rows 3 and 1: group 0's member 1 is sub-batch row 1, group 1's member 1 row 0; 2: absent
    sub = [3, 1]
    part = _grouped_attention(jnp.asarray(q[sub]), jnp.asarray(k_pages), jnp.asarray(v_pages),
                              jnp.minimum(jnp.asarray(table[sub]), 15),
                              jnp.asarray(lengths[sub]),
                              prompts._replace(rows=jnp.asarray([[2, 1], [2, 0]], jnp.int32)),
                              parts, None)
    np.testing.assert_allclose(part, got[np.asarray(sub)], atol=2e-5)


def _shared_rollout(tiny, kernel, shared):
    """Groups of 3 rows of prompts of 21, 45 and 69 tokens (full pages to share), greedy; a
    continuation that fits every row's slots, one of 5 rows (a sub-batch of more rows than
    prompts: its groups kept), then one that outgrows some rows', which widens the cache."""
    cfg, params, tok = tiny
    prompts = [tok.encode(" ".join(["alpha beta gamma"] * n)) for n in (7, 15, 23)]
    rows = [p for p in prompts for _ in range(3)]
    sp = SamplingParams(6, temperature=0.0, ignore_eos=True, read_block=16,
                        decode_kernel=kernel, shared_prompts=shared)
    first = generate(cfg, params, tok, rows, sp, max_new_per_row=[6, 2, 6] * 3)
    fits = continue_generation(cfg, params, tok, first.state,
                               Continuation(range(9), [[5, 6]] * 9, [4] * 9), sp)
    part = continue_generation(cfg, params, tok, fits.state,
                               Continuation([0, 2, 4, 6, 8], [[9]] * 5, [3] * 5), sp)
    grows = continue_generation(cfg, params, tok, part.state,  # its 5 rows
                                Continuation(range(5), [[7] * 20] * 5, [6] * 5), sp)
    return first, fits, part, grows, [len(p) for p in prompts]


def test_shared_prompt_pages_sample_what_each_rows_copy_samples(tiny):
    got = _shared_rollout(tiny, "paged_xla", shared=True)
    want = _shared_rollout(tiny, "xla", shared=False)
    lengths = got[4]
    assert [n // PAGE_SLOTS for n in lengths] == [1, 2, 4]  # full pages of each prompt
    first, fits, part, grows = got[:4]
    unshared = _shared_rollout(tiny, "paged_xla", shared=False)[0].state
    # 3 groups' pages of the 80-slot width once (5 each), 9 rows x 2 own pages (16 slots
    # after the width), against 9 rows x 6 pages unshared (96 slots)
    assert first.state.cache.k[0].shape[1] == 3 * 5 + 9 * 2
    assert unshared.cache.k[0].shape[1] == 9 * 6
    assert first.state.row_slots.tolist() == [48] * 3 + [64] * 3 + [96] * 3
    assert fits.state.row_slots is first.state.row_slots  # fitted: not widened
    assert part.state.row_slots is first.state.row_slots and part.state.cache.prompts
    assert grows.state.row_slots is None and grows.state.capacity == 256  # widened
    _same(got[:4], want[:4])


def test_shared_prompt_pages_with_a_kernel(tiny):
    """The Pallas GPU kernel (interpreted) reading each group's prompt once, merged with each
    row's own pages (and through the table in a continuation's sub-batches): the log-probs
    of a plain forward over each whole sequence (the generation and its first
    continuation). (Both kernels on shared pages, directly: test_paged_attention; the TPU
    one interpreted takes 30 s here.)"""
    cfg, params, tok = tiny
    first, fits, _, _, _ = _shared_rollout(tiny, "paged_gpu", shared=True)
    prompts = [tok.encode(" ".join(["alpha beta gamma"] * n)) for n in (7, 15, 23)]
    rows = [p for p in prompts for _ in range(3)]
    context = [p + g + [5, 6] for p, g in zip(rows, first.token_lists())]
    gaps = np.concatenate([_logprob_gap(cfg, params, tok, rows, first),
                           _logprob_gap(cfg, params, tok, context, fits)])
    assert gaps.max() < 2e-5, gaps.max()


TRACED = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=2")
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax, jax.numpy as jnp
    from models.decode_attention import bounded_attention
    from models.paged_attention import empty_pages, row_pages
    from models.paged_cache import PagedCache, SharedPrompts, _layer_attention
    from models.sharding import make_mesh
    mesh = make_mesh({"data": 2})
    q, kv = jnp.zeros((2, 1, 4, 128)), jnp.zeros((2, 1, 2, 128))
    pools = empty_pages(2, 8, 16, 128)  # 2 rows of 4 pages, one a device
    table = jnp.asarray([[0, 1, 2, 3]] * 2, jnp.int32)  # each counted in its own block
    # each row its own group, sharing its first page: the GPU kernel's parts
    prompts = SharedPrompts(table[:, :1], jnp.full(2, 16, jnp.int32),
                            jnp.zeros((2, 1), jnp.int32))
    for kernel, shared in (("pallas_tpu", None), ("pallas_gpu", None),
                           ("pallas_gpu", prompts)):
        cache = PagedCache((pools[0],), (pools[1],), table, shared)
        attend = _layer_attention(cache, jnp.zeros(2, jnp.int32), kernel, None, mesh)
        jax.make_jaxpr(lambda *a: attend(*a))(q, kv, kv, *pools)
    k = jnp.zeros((2, 2, 64, 128))
    with jax.set_mesh(mesh):
        jax.make_jaxpr(lambda *a: bounded_attention(*a, interpret=False))(
            q[:, 0], k, k, jnp.zeros(2, jnp.int32), jnp.ones(2, jnp.int32))
    print("TRACED")
""")


def test_the_compiled_kernels_trace_on_each_devices_rows():
    """Each Pallas kernel as its own chip compiles it (not interpreted) traces inside the
    per-shard map over a mesh's rows (a varying-axes check that its output cannot satisfy
    is off); tracing needs no GPU or TPU."""
    res = subprocess.run([sys.executable, "-c", TRACED], capture_output=True, text=True,
                         timeout=300)
    assert "TRACED" in res.stdout, res.stdout[-2000:] + res.stderr[-3000:]


COMPILED_FOR_TPU = textwrap.dedent("""
    import dataclasses
    import os
    import re
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    import jax
    import numpy as np
    from jax.sharding import Mesh
    from models.config import from_hf_config
    from models.continuation import bucket_kernel, read_kernel
    from models.sampler import SamplingParams, decode_params, generation_kernels
    from models.sharding import decode_param_shardings
    from rl.plan import _abstract, abstract_params, topology_devices
    # Qwen3-0.6B's attention (16 heads, 8 KV heads of 128), 2 layers
    cfg = from_hf_config({"model_type": "qwen3", "hidden_size": 1024,
                          "intermediate_size": 3072, "num_attention_heads": 16,
                          "num_key_value_heads": 8, "head_dim": 128,
                          "num_hidden_layers": 2, "vocab_size": 151936,
                          "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                          "tie_word_embeddings": True, "max_position_embeddings": 40960})
    mesh = Mesh(np.array(topology_devices("v5e:2x2")).reshape(4, 1, 1),
                ("data", "fsdp", "tensor"))
    shapes = jax.eval_shape(lambda p: decode_params(p, "bfloat16"), abstract_params(cfg, mesh))
    params = _abstract(shapes, decode_param_shardings(shapes, mesh))
    sampling = SamplingParams(max_new_tokens=256, kv_cache_dtype="bfloat16",
                              decode_kernel="paged_tpu")
    pre, dec = generation_kernels(cfg, params, [[p + 1] * 200 for p in range(16)], sampling,
                                  mesh)
    pre.lower().compile()
    text = dec.lower().compile().as_text()
    assert "tpu_custom_call" in text  # the Mosaic kernel
    # the writes keep the pools in the kernel's layout: no copy of every layer's pools into
    # another at each step (a scatter of [KV, hd] windows took one, the compiler copying back)
    kv, pages = dec.args[1].cache.k[0].shape[:2]
    layouts = set(re.findall(r"bf16\\[%d,%d,16,128\\]\\{([0-9,]+)" % (kv, pages // 4), text))
    assert layouts == {"3,2,1,0"}, layouts
    bucket_kernel(cfg, params, dec.args[1], 1, sampling, mesh, abstract=True).lower().compile()
    read_kernel(cfg, params, dec.args[1], 64, sampling, mesh, abstract=True).lower().compile()
    # 4 groups of 4 rows sharing their prompts' pages: fewer pages, the same single layout
    shared = dataclasses.replace(sampling, shared_prompts=True)
    pre, dec = generation_kernels(cfg, params, [[p + 1] * 200 for p in range(4) for _ in range(4)],
                                  shared, mesh)
    pre.lower().compile()
    text = dec.lower().compile().as_text()
    # a continuation's sub-batch of 2 rows a chip (1 prompt a chip): its group kept
    bucket_kernel(cfg, params, dec.args[1], 2, shared, mesh, abstract=True).lower().compile()
    assert dec.args[1].cache.k[0].shape[1] < pages
    kv, pages = dec.args[1].cache.k[0].shape[:2]
    assert set(re.findall(r"bf16\\[%d,%d,16,128\\]\\{([0-9,]+)" % (kv, pages // 4),
                          text)) == {"3,2,1,0"}
    print("COMPILED")
""")


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason="libtpu is not installed (pip install -e '.[tpu-plan]'): no TPU "
                           "topology to compile for")
def test_a_paged_tpu_rollout_compiles_for_a_tpu_slice():
    """decode_kernel="paged_tpu" on a v5e 2x2 slice (libtpu, ahead of time: nothing runs):
    the prefill, the decode with the Pallas TPU kernel lowered by Mosaic, a continuation's
    decode of a sub-batch and its read all compile, the pools in the kernel's layout only;
    and a generation whose groups share their prompts' pages."""
    res = subprocess.run([sys.executable, "-c", COMPILED_FOR_TPU], capture_output=True,
                         text=True, timeout=600)
    assert "COMPILED" in res.stdout, res.stdout[-2000:] + res.stderr[-3000:]
