"""Chunked scoring (``Scoring.logits_chunk``) and the activation constraints
(``models.constraints``) under a mesh: same values and gradients, the batch kept split."""

import importlib.util
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import load_params
from models.padding import left_pad
from models.scoring import Scoring, group_logprobs


@pytest.fixture(scope="module")
def tiny():
    return load_params("tiny", seed=3)


def _batch(tok, width=11):
    prefixes = [tok.encode("the shared prompt"), tok.encode("group two")]
    conts = [[tok.encode(" a reply"), tok.encode(" another, longer reply")],
             [tok.encode(" yes"), tok.encode(" no thanks")]]
    pre, pre_mask = left_pad(prefixes, tok.pad_id)
    toks = np.full((2, 2, width), tok.pad_id, np.int32)
    mask = np.zeros_like(toks, bool)
    for i, j in np.ndindex(2, 2):
        n = min(len(conts[i][j]), width)
        toks[i, j, :n], mask[i, j, :n] = conts[i][j][:n], True
    return tuple(jnp.asarray(a) for a in (pre, pre_mask, toks, mask))


@pytest.mark.parametrize("chunk", [1, 3, 4, 11, 64])  # 3 and 4 do not divide 11 positions
def test_chunked_scoring_equals_one_pass_with_gradients(tiny, chunk):
    cfg, params, tok = tiny
    args = _batch(tok)
    whole = Scoring(with_entropy=True, temperature=0.7)
    parts = whole._replace(logits_chunk=chunk)
    lp, ent = group_logprobs(cfg, params, *args, scoring=whole)
    lp_c, ent_c = group_logprobs(cfg, params, *args, scoring=parts)
    np.testing.assert_allclose(lp_c, lp, atol=1e-5)
    np.testing.assert_allclose(ent_c, ent, atol=1e-5)
    w = np.random.default_rng(0).normal(size=args[2].shape).astype(np.float32)

    def loss(p, s):
        logp, h = group_logprobs(cfg, p, *args, scoring=s)
        return jnp.sum(logp * w) + 0.1 * jnp.sum(h * w)

    for a, b in zip(jax.tree.leaves(jax.grad(loss)(params, parts)),
                    jax.tree.leaves(jax.grad(loss)(params, whole))):
        np.testing.assert_allclose(a, b, atol=1e-5 * float(jnp.max(jnp.abs(b))) + 1e-7)


def test_micro_slices_take_every_shards_groups():
    from rl.grpo.train_step import micro_slices

    x = jnp.arange(8)
    # 2 micro-batches of 8 groups: groups 0, 2, 4, 6 and 1, 3, 5, 7 (each from all shards)
    np.testing.assert_array_equal(micro_slices(x, 2), [[0, 2, 4, 6], [1, 3, 5, 7]])


# run in a child process (its own devices): the scoring's abstract arguments over a mesh
_ABSTRACT_SCORING = textwrap.dedent("""
    import jax, jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    from models.scoring import Scoring, group_logprobs
    from models.sharding import make_mesh, param_shardings
    from models.transformer import init_params

    def abstract_scoring(cfg, mesh, n, g, p, r, dtype=None):
        \"\"\"Weights (``dtype``, default their own) and a batch of n groups x g, p prompt
        and r response tokens, sharded as the trainer shards them.\"\"\"
        shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
        w = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, dtype or s.dtype,
                                                            sharding=sh),
                         shapes, param_shardings(shapes, mesh))
        rows = lambda s, d: jax.ShapeDtypeStruct(s, d, sharding=NamedSharding(mesh, P("fsdp")))
        return w, (rows((n, p), jnp.int32), rows((n, p), jnp.bool_),
                   rows((n, g, r), jnp.int32), rows((n, g, r), jnp.bool_))
""")


def test_constraints_keep_the_batch_split_under_a_mesh():
    """On an 8-device FSDP mesh the log-prob pass's logits are split over the batch: its
    temporaries are about the whole batch's logits / 8, not the whole batch's."""
    code = textwrap.dedent("""
        import os
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + " --xla_force_host_platform_device_count=8")
        os.environ["JAX_PLATFORMS"] = "cpu"
    """) + _ABSTRACT_SCORING + textwrap.dedent("""
        from models.presets import tiny_config
        cfg = tiny_config(vocab_size=4096, hidden_size=64, num_heads=4, num_kv_heads=2)
        mesh = make_mesh({"data": 1, "fsdp": -1, "tensor": 1})
        n, g, p, r = 16, 4, 16, 64
        w, args = abstract_scoring(cfg, mesh, n, g, p, r)
        logits = n * g * r * cfg.vocab_size * 4
        def temp(scoring):
            with jax.set_mesh(mesh):
                c = group_logprobs.lower(cfg, w, *args, scoring=scoring).compile()
            return c.memory_analysis().temp_size_in_bytes
        split = temp(Scoring())
        chunked = temp(Scoring(logits_chunk=8))
        print("RATIOS", split / logits, chunked / logits)
        assert split < 0.5 * logits, (split, logits)
        assert chunked < 0.5 * split, (chunked, split)
        print("CONSTRAINTS_OK")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert "CONSTRAINTS_OK" in res.stdout, res.stdout[-2000:] + res.stderr[-3000:]


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason="libtpu is not installed (pip install -e '.[tpu-plan]'): no TPU "
                           "topology to compile for")
def test_the_scoring_on_8_fsdp_tpu_chips_gathers_the_unembedding_and_compiles():
    """On v5p:2x2x2 (8 FSDP chips) GSPMD had computed the tiny model's scoring logits as a
    windowed einsum, a ring of collective-permutes of the unembedding's D slices, and
    libtpu's layout assignment did not finish it in 5 min (Qwen3-14B's reference pass: over
    25 min). Gathered along D, the program compiles in seconds and holds the whole [D,V] on
    each chip: the tiny model's tied embedding, [D,V] = 64 x 49,152 (bfloat16 weights, as the
    reference pass scores)."""
    code = textwrap.dedent("""
        import os
        os.environ["JAX_PLATFORMS"] = "cpu"
        os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    """) + _ABSTRACT_SCORING + textwrap.dedent("""
        import re
        from jax.experimental.topologies import get_topology_desc
        from models.presets import tiny_config
        cfg = tiny_config()
        devices = get_topology_desc(platform="tpu", topology_name="v5p:2x2x2").devices
        mesh = make_mesh({"data": 1, "fsdp": -1, "tensor": 1}, devices=devices)
        # bfloat16 weights, as the reference pass scores (rl.grpo.train_step.in_compute_dtype)
        w, args = abstract_scoring(cfg, mesh, 16, 5, 32, 256, dtype=jnp.bfloat16)
        with jax.set_mesh(mesh):
            hlo = group_logprobs.lower(cfg, w, *args, scoring=Scoring(logits_chunk=64)
                                       ).compile().as_text()
        assert "collective-permute" not in hlo
        whole = rf"= (bf16|f32)\\[{cfg.hidden_size},{cfg.vocab_size}\\]\\S* all-gather\\("
        assert re.search(whole, hlo), [l for l in hlo.splitlines() if "all-gather(" in l]
        print("GATHERED_OK")
    """)
    try:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=180)
    except subprocess.TimeoutExpired:
        pytest.fail("the scoring program for v5p:2x2x2 did not compile within 3 min")
    assert "GATHERED_OK" in res.stdout, res.stdout[-2000:] + res.stderr[-3000:]


def test_reference_pass_in_parts_equals_one_pass(tiny):
    """``batch_logprobs`` in strided parts (as the reference pass runs with micro-batches)
    gives every group its own log-probs back in order."""
    from rl.grpo.train_step import batch_logprobs, micro_joined, micro_slices

    cfg, params, tok = tiny
    pre, pre_mask, toks, mask = _batch(tok)
    four = lambda a: jnp.concatenate([a, a[::-1]], axis=0)  # noqa: E731  4 groups, 2 distinct
    batch = {"prefix": four(pre), "prefix_mask": four(pre_mask), "tokens": four(toks),
             "attn_mask": four(mask)}
    whole = batch_logprobs(cfg, params, batch, Scoring(temperature=0.7), slices=1)
    parts = batch_logprobs(cfg, params, batch, Scoring(temperature=0.7), slices=2)
    np.testing.assert_allclose(parts, whole, atol=1e-5)
    np.testing.assert_allclose(whole[0], whole[3], atol=1e-5)  # group 3 repeats group 0
    x = jnp.arange(12).reshape(6, 2)
    np.testing.assert_array_equal(micro_joined(micro_slices(x, 3)), x)
