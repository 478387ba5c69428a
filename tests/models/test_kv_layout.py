"""The KV cache's TPU layout (keys [B,KV,S,hd], values [B,KV,hd,S]) and its per-row writes
give what the default layout and its scatter give. Only a TPU picks that layout
(``models.transformer.kv_layout``), so these tests force it on the CPU."""

import dataclasses
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import models.continuation as continuation
import models.sampler as sampler
import models.transformer as transformer
from models import load_params
from models.continuation import Continuation, continue_generation
from models.sampler import SamplingParams, generate
from models.transformer import TPU_LAYOUT, _write_each_row, _write_rows


def _expected(buffer, new, at, axis):
    """Row b's window written at slots at[b]..at[b]+T-1 along `axis`, slots past the end
    dropped, by plain numpy indexing."""
    out = np.array(buffer)
    for b in range(out.shape[0]):
        for j in range(new.shape[axis]):
            slot = at[b] + j
            if slot < out.shape[axis]:
                index = [b] + [slice(None)] * (out.ndim - 1)
                index[axis] = slot
                src = [b] + [slice(None)] * (out.ndim - 1)
                src[axis] = j
                out[tuple(index)] = np.asarray(new)[tuple(src)]
    return out


@pytest.mark.parametrize("axis, t", [(1, 3), (2, 3), (3, 3), (1, 11), (3, 11)])
def test_each_row_write_matches_the_scatter_and_drops_what_overhangs(axis, t):
    # t = 11 > 8 slots: a read block wider than the whole cache (a tiny model's plan)
    shape = {1: [3, 8], 2: [3, 2, 8, 4], 3: [3, 2, 4, 8]}[axis]
    buffer = jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape)
    new_shape = list(shape)
    new_shape[axis] = t
    new = -1.0 - jnp.arange(np.prod(new_shape), dtype=jnp.float32).reshape(new_shape)
    at = jnp.asarray([0, 1, shape[axis] - 1], jnp.int32)  # the last row overhangs by 2
    want = _expected(buffer, new, np.asarray(at), axis)
    got = jax.jit(_write_each_row, static_argnums=3)(buffer, new, at, axis)
    np.testing.assert_array_equal(got, want)
    slots = at[:, None] + jnp.arange(t)
    np.testing.assert_array_equal(_write_rows(buffer, new, slots, axis), want)


@pytest.fixture
def tpu_layout(monkeypatch):
    """Every module that builds or writes a cache picks the TPU layout; jit caches
    cleared so no program traced for the CPU layout is reused."""
    for module in (transformer, sampler, continuation):
        monkeypatch.setattr(module, "kv_layout", lambda mesh=None, decode_kernel="xla": TPU_LAYOUT)
    jax.clear_caches()
    yield
    jax.clear_caches()


def _rollout(tiny, decode_kernel="xla"):
    """A generation, then continuations reading observations in 16-token blocks (a subset of
    rows, gathered and scattered back, then every row), sampled at temperature 1; the
    generation's decode kernel (``SamplingParams.decode_kernel``) kept by its continuations."""
    cfg, params, tok = tiny
    prompts = [tok.encode(t) for t in ("hello", "a much longer prompt than the first one",
                                       "third", "fourth one")]
    sp = SamplingParams(max_new_tokens=5, temperature=1.0, ignore_eos=True, read_block=16)
    kernel = dataclasses.replace(sp, decode_kernel=decode_kernel)
    first = generate(cfg, params, tok, prompts, kernel, seed=1, max_new_per_row=[5, 2, 4, 5])
    doc = tok.encode(" <information> " + "the tower is old and tall " * 6 + "</information>")
    second = continue_generation(cfg, params, tok, first.state,
                                 Continuation([1, 3], [doc, []]), sp, seed=2)
    third = continue_generation(cfg, params, tok, second.state,
                                Continuation([0, 1], [doc[:20], tok.encode(" b")]), sp, seed=3)
    return first, second, third


@pytest.fixture(scope="module")
def tiny():
    return load_params("tiny", seed=3)


@pytest.fixture(scope="module")
def cpu_rollout(tiny):
    jax.clear_caches()
    return _rollout(tiny)


def test_the_tpu_layout_generates_what_the_cpu_layout_does(tiny, cpu_rollout,
                                                                    tpu_layout):
    got = _rollout(tiny)
    for g, ref in zip(got, cpu_rollout):
        assert g.token_lists() == ref.token_lists() and g.finish == ref.finish
        np.testing.assert_allclose(g.logprobs, ref.logprobs, atol=1e-5)
    cfg = tiny[0]
    k, v = got[2].state.cache.k[0], got[2].state.cache.v[0]
    ref_k = cpu_rollout[2].state.cache.k[0]
    assert k.shape == (ref_k.shape[0], cfg.num_kv_heads, ref_k.shape[3], cfg.head_dim)
    assert v.shape == (ref_k.shape[0], cfg.num_kv_heads, cfg.head_dim, ref_k.shape[3])
    np.testing.assert_allclose(k, np.swapaxes(ref_k, 2, 3), atol=1e-5)


def test_the_pallas_kernels_rows_generate_what_the_default_does(tiny, cpu_rollout):
    """decode_kernel="pallas_gpu" (its interpreter on CPU): each row attends over its own
    slots only, in the kernel's layout (keys and values [B,KV,S,hd]); the same samples, in a
    generation and in continuations over a gathered sub-batch and over every row."""
    got = _rollout(tiny, "pallas_gpu")
    for g, ref in zip(got, cpu_rollout):
        assert g.token_lists() == ref.token_lists() and g.finish == ref.finish
        np.testing.assert_allclose(g.logprobs, ref.logprobs, atol=1e-5)
    k, v = got[2].state.cache.k[0], got[2].state.cache.v[0]
    ref_k, ref_v = cpu_rollout[2].state.cache.k[0], cpu_rollout[2].state.cache.v[0]
    assert k.shape == v.shape == ref_v.shape
    np.testing.assert_allclose(k, np.swapaxes(ref_k, 2, 3), atol=1e-5)
    np.testing.assert_allclose(v, ref_v, atol=1e-5)


SHARDED = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=4")
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from models.sharding import make_mesh
    from models.transformer import _write_each_row, _write_rows
    mesh = make_mesh({"data": 2, "fsdp": 2})
    buffer = jnp.arange(8 * 2 * 6 * 4, dtype=jnp.float32).reshape(8, 2, 6, 4)
    new = -jnp.ones((8, 2, 2, 4))
    at = jnp.asarray([0, 4, 5, 1, 2, 3, 0, 5], jnp.int32)
    want = _write_rows(buffer, new, at[:, None] + jnp.arange(2), 2)
    rows = NamedSharding(mesh, P(("data", "fsdp")))
    with jax.set_mesh(mesh):
        got = jax.jit(_write_each_row, static_argnums=3)(
            jax.device_put(buffer, rows), jax.device_put(new, rows), jax.device_put(at, rows), 2)
    np.testing.assert_array_equal(got, want)
    assert {s.data.shape[0] for s in got.addressable_shards} == {2}
    print("OK")
""")


def test_each_row_write_runs_on_each_devices_own_rows_under_a_mesh():
    out = subprocess.run([sys.executable, "-c", SHARDED], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-3000:]
