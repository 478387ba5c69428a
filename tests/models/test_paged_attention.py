"""The paged KV cache's writes and attention (``models.paged_attention``): writes checked slot
by slot, and the reference and both Pallas kernels (interpreted on CPU) against a softmax
written here in numpy over each row's own tokens."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.paged_attention import (
    compute_block,
    empty_pages,
    paged_attention,
    paged_attention_parts,
    row_pages,
    write_tokens,
)


def test_tokens_go_to_their_rows_pages_slot_by_slot():
    k_pages, v_pages = empty_pages(kv_heads=2, pages=5, page_size=4, head_dim=3)
    table = jnp.asarray([[2, 0], [1, 3], [4, 4]], jnp.int32)
    start = jnp.asarray([3, 0, 7], jnp.int32)
    k = jnp.arange(3 * 2 * 2 * 3, dtype=jnp.float32).reshape(3, 2, 2, 3) + 1  # [B,T,KV,hd]
    k_pages, v_pages = write_tokens(k_pages, v_pages, table, start, k, -k)
    expect = np.zeros((2, 5, 4, 3), np.float32)
    # row 0: slot 3 is page 2's last, slot 4 the first of page 0
    expect[:, 2, 3], expect[:, 0, 0] = k[0, 0], k[0, 1]
    # row 1: slots 0 and 1 of page 1
    expect[:, 1, 0], expect[:, 1, 1] = k[1, 0], k[1, 1]
    # row 2: slot 7 is page 4's last (its second page); slot 8 is past its 2 pages: dropped
    expect[:, 4, 3] = k[2, 0]
    np.testing.assert_array_equal(k_pages, expect)
    np.testing.assert_array_equal(v_pages, -expect)


def test_row_pages_give_each_row_its_own_consecutive_pages():
    assert row_pages(2, 3).tolist() == [[0, 1, 2], [3, 4, 5]]
    assert row_pages(2, 2, first=4).tolist() == [[4, 5], [6, 7]]


def _softmax_over_rows(q, k_pages, v_pages, table, lengths):
    """numpy: query t of row b (its token lengths[b] - T + t) over the row's slots up to
    and including its own, the row's pages joined in the table's order."""
    b, t, h, hd = q.shape
    kv = k_pages.shape[0]
    out = np.zeros(q.shape)
    for r in range(b):
        keys = k_pages[:, table[r]].reshape(kv, -1, hd)
        values = v_pages[:, table[r]].reshape(kv, -1, hd)
        for i in range(t):
            upto = lengths[r] - t + i + 1
            for head in range(h):
                j = head // (h // kv)
                s = keys[j, :upto] @ q[r, i, head] / np.sqrt(hd)
                p = np.exp(s - s.max())
                out[r, i, head] = p @ values[j, :upto] / p.sum()
    return out


def _pools(rng, kv=2, pages=9, size=4, hd=8):
    return (rng.standard_normal((kv, pages, size, hd)).astype(np.float32),
            rng.standard_normal((kv, pages, size, hd)).astype(np.float32))


def test_the_reference_is_each_rows_causal_softmax_over_its_own_tokens():
    rng = np.random.default_rng(0)
    k_pages, v_pages = _pools(rng)
    # rows 0 and 1 share their first page (a group's prompt), then each its own; row 2's
    # pages out of order
    table = np.asarray([[0, 1, 2], [0, 3, 4], [8, 5, 6]], np.int32)
    lengths = np.asarray([6, 12, 9], np.int32)
    q = rng.standard_normal((3, 3, 6, 8)).astype(np.float32)  # 3 new tokens, 6 heads, KV 2
    got = jax.jit(paged_attention)(*map(jnp.asarray, (q, k_pages, v_pages, table, lengths)))
    np.testing.assert_allclose(got, _softmax_over_rows(q, k_pages, v_pages, table, lengths),
                               atol=2e-6)


def test_reading_fewer_pages_than_the_table_holds_changes_nothing_for_rows_inside_them():
    rng = np.random.default_rng(1)
    k_pages, v_pages = _pools(rng)
    table = np.asarray([[0, 1, 2], [3, 4, 5]], np.int32)
    lengths = np.asarray([8, 5], np.int32)  # both within their first 2 pages
    q = rng.standard_normal((2, 1, 4, 8)).astype(np.float32)
    args = [jnp.asarray(x) for x in (q, k_pages, v_pages, table, lengths)]
    np.testing.assert_allclose(paged_attention(*args, extent=2), paged_attention(*args),
                               atol=1e-6)


def test_a_decode_step_written_then_read_attends_over_the_row_and_itself():
    # what a sampler does: write the step's key and value at the row's length, then attend
    rng = np.random.default_rng(2)
    k_pages, v_pages = _pools(rng)
    table = row_pages(2, 4)
    lengths = np.asarray([3, 8], np.int32)  # row 1's token opens its third page
    k, v = (rng.standard_normal((2, 1, 2, 8)).astype(np.float32) for _ in range(2))
    q = rng.standard_normal((2, 1, 4, 8)).astype(np.float32)
    kp, vp = write_tokens(*map(jnp.asarray, (k_pages, v_pages, table, lengths, k, v)))
    got = paged_attention(jnp.asarray(q), kp, vp, jnp.asarray(table), jnp.asarray(lengths + 1))
    kp, vp = np.asarray(kp), np.asarray(vp)
    assert np.array_equal(kp[:, 0, 3], k[0, 0]) and np.array_equal(vp[:, 6, 0], v[1, 0])
    np.testing.assert_allclose(got, _softmax_over_rows(q, kp, vp, table, lengths + 1),
                               atol=2e-6)


def _kernel_case(seed, kernel, hd=128):
    """(q [3,1,4,hd], k_pages, v_pages, table) for one decode token of 3 rows: pools of 12
    pages of 8 slots, KV 2, heads of the TPU kernel's 128 lanes (for the TPU kernel of
    bfloat16 values: it rounds keys and values to bfloat16 as it loads them); rows 0 and 1
    share their first 2 pages, row 2's are out of order."""
    rng = np.random.default_rng(seed)
    pools = _pools(rng, kv=2, pages=12, size=8, hd=hd)
    if kernel == "pallas_tpu":
        pools = tuple(np.asarray(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32))
                      for x in pools)
    table = np.asarray([[0, 1, 2, 3], [0, 1, 4, 5], [11, 10, 9, 8]], np.int32)
    return rng.standard_normal((3, 1, 4, hd)).astype(np.float32), *pools, table


@pytest.mark.parametrize("kernel", ["pallas_tpu", "pallas_gpu"])
def test_each_kernel_reads_each_rows_tokens_as_a_softmax_over_them(kernel):
    q, k_pages, v_pages, table = _kernel_case(3, kernel)
    lengths = np.asarray([1, 21, 32], np.int32)  # one token; into a third page; full
    got = paged_attention(*map(jnp.asarray, (q, k_pages, v_pages, table, lengths)),
                          kernel=kernel)
    np.testing.assert_allclose(got, _softmax_over_rows(q, k_pages, v_pages, table, lengths),
                               atol=2e-5)


@pytest.mark.parametrize("kernel", ["xla", "pallas_tpu", "pallas_gpu"])
def test_each_kernels_parts_are_a_softmaxs_log_sum_exp_and_unnormalised_output(kernel):
    q, k_pages, v_pages, table = _kernel_case(4, kernel)
    hd = q.shape[-1]
    lengths = np.asarray([0, 21, 32], np.int32)  # no slots; into a third page; full
    top, total, out = paged_attention_parts(*map(jnp.asarray, (q, k_pages, v_pages, table,
                                                               lengths)), kernel=kernel)
    assert top.shape == total.shape == (3, 2, 2, 1) and out.shape == (3, 2, 2, hd)
    # a row of no slots weighs nothing in a merge
    assert np.all(np.asarray(total[0]) == 0) and np.all(np.asarray(out[0]) == 0)
    for r in (1, 2):
        keys = k_pages[:, table[r]].reshape(2, -1, hd)[:, :lengths[r]]
        values = v_pages[:, table[r]].reshape(2, -1, hd)[:, :lengths[r]]
        for head in range(4):
            j, g = divmod(head, 2)
            s = keys[j] @ q[r, 0, head] / np.sqrt(hd)
            log_sum_exp = s.max() + np.log(np.exp(s - s.max()).sum())
            assert abs(top[r, j, g, 0] + np.log(total[r, j, g, 0]) - log_sum_exp) < 1e-4
            np.testing.assert_allclose(out[r, j, g] / total[r, j, g, 0],
                                       np.exp(s - log_sum_exp) @ values[j], atol=2e-5)


def test_compute_blocks_cut_a_rows_pages_into_whole_blocks():
    assert [compute_block(n) for n in (1, 4, 6, 7, 16, 12)] == [1, 4, 6, 7, 8, 6]


def test_bad_kernels_and_several_tokens_for_a_kernel_are_refused():
    q = jnp.zeros((1, 2, 2, 128))
    k_pages, v_pages = empty_pages(1, 2, 8, 128)
    table, lengths = jnp.asarray([[0, 1]], jnp.int32), jnp.asarray([4], jnp.int32)
    with pytest.raises(ValueError, match="one of"):
        paged_attention(q, k_pages, v_pages, table, lengths, kernel="cuda")
    with pytest.raises(ValueError, match="one new token per row"):
        paged_attention(q, k_pages, v_pages, table, lengths, kernel="pallas_tpu")
    with pytest.raises(ValueError, match="one of"):
        paged_attention_parts(q[:, :1], k_pages, v_pages, table, lengths, kernel="cuda")
    with pytest.raises(ValueError, match="one new token per row"):
        paged_attention_parts(q, k_pages, v_pages, table, lengths)
    # compiled for a TPU (not interpreted) the kernel wants heads of 128 lanes' multiples
    q64, (k64, v64) = jnp.zeros((1, 1, 2, 64)), empty_pages(1, 2, 8, 64)
    with pytest.raises(ValueError, match="multiple of 128"):
        paged_attention(q64, k64, v64, table, lengths, kernel="pallas_tpu", interpret=False)
    with pytest.raises(ValueError, match="multiple of 128"):
        paged_attention_parts(q64, k64, v64, table, lengths, kernel="pallas_tpu",
                              interpret=False)
