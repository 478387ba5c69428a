"""Data-parallel rollouts: the sampler under an 8-device CPU mesh against one device.

The mesh runs in a subprocess (XLA's host device count is fixed when JAX starts). Expected
values come from the mesh-less sampler (one device), which the other sampler tests check
against an independent forward pass; the layouts are checked against hand-derived ones.
"""

import importlib.util
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from models.continuation import layout_rows, read_layout, row_buckets
from models.sampler import _sharded_prompts

SCRIPT = textwrap.dedent("""
    import os, re, sys
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8")
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax, numpy as np
    import models.sampler as S
    from core.search_r1 import search_prompt
    from core.types import Prompt
    from models import load_params
    from models.sharding import batch_shards, make_mesh, param_shardings, shard
    from rl.tasks.envs import SamplerPolicy
    from rl.tasks.search.corpus import Doc
    from rl.tasks.search.env import SearchEnv

    assert len(jax.devices()) == 8
    mesh = make_mesh(eval(sys.argv[1]))
    shards = batch_shards(mesh)
    cfg, params, tok = load_params("tiny", seed=3)
    import models.continuation as C
    programs = {}  # the sampler's jitted kernels as last called: to read their HLO

    def spied(program, name):
        def spy(*a, **k):
            programs[name] = (program, a, k)
            return program(*a, **k)
        spy.lower = program.lower
        return spy

    S._generate = spied(S._generate, "_generate")
    C.decode_in_place = spied(C.decode_in_place, "decode_in_place")
    read_program = C.read_program
    C.read_program = lambda mesh: spied(read_program(mesh), "read_in_place")

    def rows_sharded(x, rows):
        # the leading axis cut into `shards` blocks of rows / shards, one per data shard
        assert x.shape[0] == rows, (x.shape, rows)
        assert len(x.sharding.device_set) == 8
        blocks = {(s.index[0].start, s.index[0].stop) for s in x.addressable_shards}
        assert len(blocks) == shards, blocks
        assert {s.data.shape[0] for s in x.addressable_shards} == {rows // shards}

    def same(a, b):
        assert a.token_lists() == b.token_lists() and a.finish == b.finish
        np.testing.assert_array_equal(a.lengths, b.lengths)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)

    def state_sharded(g, rows):
        for x in (g.state.cache.k + g.state.cache.v + (g.state.cache.valid, g.state.logits)):
            rows_sharded(x, rows)

    one = SamplerPolicy(cfg, params, tok)
    many = SamplerPolicy(cfg, shard(params, param_shardings(params, mesh)), tok, mesh=mesh)
    prompts = [tok.encode(t) for t in ["hello", "a much longer prompt with more tokens", "x"]]
    rows = [p for p in prompts for _ in range(3)]           # 9 rows: padded to the shards
    sp = S.SamplingParams(10, temperature=0, stop=("ab",))
    limits = [10, 4, 10, 7, 10, 1, 10, 10, 3]
    g1, gm = one.generate(rows, sp, 0, limits), many.generate(rows, sp, 0, limits)
    same(g1, gm)
    per = -(-9 // shards)
    state_sharded(gm, shards * per)
    if mesh.shape["tensor"] > 1:  # KV heads by the rules too
        assert gm.state.cache.k[0].sharding.spec[1] == "tensor"
    print("GENERATE_OK")

    if mesh.shape["fsdp"] > 1:
        # the next-token logits by vocabulary slices (models.sampler.row_logits): no
        # device gathers the unembedding, D V / (fsdp tensor) values of it per device
        fn, a, k = programs["_generate"]
        gathered = [int(np.prod([int(d) for d in dims.split(",") if d]))
                    for line in fn.lower(*a, **k).compile().as_text().splitlines()
                    if " all-gather(" in line
                    for dims in re.findall(r"[a-z]+\\d*\\[([\\d,]*)\\]",
                                           line.split(" all-gather(")[0].split("= ", 1)[1])]
        share = cfg.hidden_size * cfg.vocab_size // (mesh.shape["fsdp"] * mesh.shape["tensor"])
        assert gathered and max(gathered) < share, (sorted(gathered)[-3:], share)
        print("VOCAB_SLICES_OK")

    if mesh.shape["fsdp"] > 1:
        # a rollout mesh (mesh.rollout_shape {data: 8}) over the same devices: the policy's
        # weights, split for training, are resharded whole onto it; the same samples, and
        # its generation program gathers no weights (only scalar reductions)
        rollout = make_mesh({"data": 8})
        moved = SamplerPolicy(cfg, shard(params, param_shardings(params, mesh)), tok,
                              mesh=rollout)
        assert all(x.sharding.is_fully_replicated for x in jax.tree.leaves(moved.params))
        same(g1, moved.generate(rows, sp, 0, limits))
        fn, a, k = programs["_generate"]
        ops = re.findall(r"= (\\S+) (all-gather|all-to-all|collective-permute|all-reduce|"
                         r"reduce-scatter)\\(", fn.lower(*a, **k).compile().as_text())
        assert all(shape.endswith("[]") and op == "all-reduce" for shape, op in ops), ops
        print("ROLLOUT_MESH_OK")

        # a tensor-parallel rollout mesh ({data: 4, tensor: 2}: the 2 KV heads one a
        # chip): the weights stay split over tensor, the same greedy samples as one device,
        # and the generation program gathers no weight: its all-gathers are the next-token
        # logits' vocabulary slices ([rows, V]), the rest activation all-reduces
        tp = make_mesh({"data": 4, "tensor": 2})
        split = SamplerPolicy(cfg, shard(params, param_shardings(params, mesh)), tok, mesh=tp)
        assert tuple(split.params["layers"][0]["w_up"].sharding.spec) == (None, "tensor")
        same(g1, split.generate(rows, sp, 0, limits))
        fn, a, k = programs["_generate"]
        ops = re.findall(r"= (\\S+) (all-gather|all-to-all|collective-permute|all-reduce|"
                         r"reduce-scatter)\\(", fn.lower(*a, **k).compile().as_text())
        gathers = [shape for shape, op in ops if op != "all-reduce"]
        assert gathers and all(re.match(rf"f32\\[\\d+,{cfg.vocab_size}\\]", x)
                               for x in gathers), ops
        assert any(op == "all-reduce" and re.match(rf"f32\\[\\d+,{cfg.hidden_size}\\]", shape)
                   for shape, op in ops), ops
        print("TENSOR_ROLLOUT_OK")

    # the prefill's activations left to the compiler: the same samples, the same layout
    import dataclasses
    gu = many.generate(rows, dataclasses.replace(sp, prefill_pin_rows=False), 0, limits)
    assert programs["_generate"][2]["settings"].prefill_pin_rows is False
    same(g1, gu)
    state_sharded(gu, shards * per)
    print("UNPINNED_PREFILL_OK")

    # multi-turn: rows continue (some after reading tokens), then again from that state
    cont = C.Continuation([8, 0, 3, 4, 1, 6], [[5, 6, 7], [9] * 20, [], [], [11], []])
    c1, cm = one.continue_from(g1.state, cont, sp, 1), many.continue_from(gm.state, cont, sp, 1)
    same(c1, cm)
    state_sharded(cm, cm.state.cache.k[0].shape[0])
    again = C.Continuation([1, 2, 5], [[3, 4], [], [7] * 3])
    same(one.continue_from(c1.state, again, sp, 2), many.continue_from(cm.state, again, sp, 2))
    print("CONTINUE_OK")

    # a consumed state: the same continuation, the state's cache freed on every device
    gc = many.generate(rows, sp, 0, limits)
    same(many.continue_from(gc.state, dataclasses.replace(cont, consume=True), sp, 1), c1)
    assert all(x.is_deleted() for x in gc.state.cache.k + gc.state.cache.v)
    print("CONSUME_OK")

    # GRPO groups reading one copy of their prompt's cache (SamplingParams.shared_prompts):
    # the samples of one device's own copies; each group's prompt on its rows' shard, and
    # with the weights replicated no collective but scalar reductions; then continued
    grpo = [p for p in prompts + [tok.encode("fourth")] for _ in range(4)]  # 16 rows
    shared = dataclasses.replace(sp, shared_prompts=True)
    gs1, gs = one.generate(grpo, sp, 0), many.generate(grpo, shared, 0)
    same(gs1, gs)
    groups = gs.state.prompt.valid.shape[0]
    assert groups == 16 // min(4, 16 // shards), groups  # a shard's rows, at most a group
    for x in gs.state.prompt.k + (gs.state.prompt.valid,):
        rows_sharded(x, groups)
    if mesh.shape["fsdp"] == mesh.shape["tensor"] == 1:
        fn, a, k = programs["_generate"]
        assert k["settings"].group > 1
        ops = re.findall(r"= (\\S+) (all-gather|all-to-all|collective-permute|all-reduce|"
                         r"reduce-scatter)\\(", fn.lower(*a, **k).compile().as_text())
        assert all(shape.endswith("[]") and op == "all-reduce" for shape, op in ops), ops
    same(one.continue_from(gs1.state, cont, sp, 1), many.continue_from(gs.state, cont, shared, 1))
    print("SHARED_OK")

    if mesh.shape["fsdp"] == mesh.shape["tensor"] == 1:
        # weights replicated: any collective but a scalar reduction would move rows
        assert sorted(programs) == ["_generate", "decode_in_place", "read_in_place"]
        for name, (fn, a, k) in programs.items():
            a = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                            sharding=x.sharding)
                             if isinstance(x, jax.Array) and x.is_deleted() else x,
                             a)  # the donated ones are deleted
            hlo = fn.lower(*a, **k).compile().as_text()
            ops = re.findall(r"= (\\S+) (all-gather|all-to-all|collective-permute|"
                             r"all-reduce|reduce-scatter)\\(", hlo)
            assert all(shape.endswith("[]") and op == "all-reduce"
                       for shape, op in ops), (name, ops)
            # the decode loops reduce their rows' done flags, the read its longest line
            assert ops, name
        print("NO_ROW_MOVES_OK")

    # the Pallas decode kernel (in its interpreter here) over the mesh, on each device's rows
    # and KV heads: the same samples as one device's default attention, then continued
    kern = SamplerPolicy(cfg, shard(params, param_shardings(params, mesh)), tok, mesh=mesh,
                         decode_kernel="pallas_gpu")
    gk = kern.generate(rows, sp, 0, limits)
    same(g1, gk)
    state_sharded(gk, shards * per)
    same(c1, kern.continue_from(gk.state, cont, sp, 1))
    print("KERNEL_OK")

    # a paged KV cache (models.paged_cache): each shard's rows in its own block of pages;
    # the samples of one device's dense cache, continued as it is (reads, sub-batches of
    # table rows), and with the weights replicated no collective but scalar reductions
    paged = SamplerPolicy(cfg, shard(params, param_shardings(params, mesh)), tok, mesh=mesh,
                          decode_kernel="paged_xla")
    gp = paged.generate(rows, sp, 0, limits)
    same(g1, gp)
    pool, table = gp.state.cache.k[0], gp.state.cache.table
    rows_sharded(table, shards * per)
    assert pool.shape[1] == shards * per * table.shape[1]
    assert {s.data.shape[1] for s in pool.addressable_shards} == {pool.shape[1] // shards}
    cp = paged.continue_from(gp.state, cont, sp, 1)
    same(c1, cp)
    same(one.continue_from(c1.state, again, sp, 2), paged.continue_from(cp.state, again, sp, 2))
    # GRPO groups sharing their prompts' full pages (shared_prompts): each shard's groups'
    # pages in its block, fewer pages than copies; the samples of one device's copies
    long = [p * 5 for p in grpo]
    gl1, gl = one.generate(long, sp, 0), paged.generate(long, shared, 0)
    same(gl1, gl)
    pool = gl.state.cache.k[0]
    assert gl.state.row_slots is not None and pool.shape[1] < 16 * gl.state.cache.table.shape[1]
    assert {s.data.shape[1] for s in pool.addressable_shards} == {pool.shape[1] // shards}
    same(one.continue_from(gl1.state, cont, sp, 1), paged.continue_from(gl.state, cont, shared, 1))
    if mesh.shape["fsdp"] == mesh.shape["tensor"] == 1:
        for name, (fn, a, k) in programs.items():
            a = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                            sharding=x.sharding)
                             if isinstance(x, jax.Array) and x.is_deleted() else x, a)
            ops = re.findall(r"= (\\S+) (all-gather|all-to-all|collective-permute|"
                             r"all-reduce|reduce-scatter)\\(",
                             fn.lower(*a, **k).compile().as_text())
            assert all(shape.endswith("[]") and op == "all-reduce"
                       for shape, op in ops), (name, ops)
    print("PAGED_OK")

    class Retriever:
        def retrieve(self, queries, topk=3):
            return [[Doc(id="d", title=q, text="about " + q, score=1.0)] * topk
                    for q in queries]

    questions = [Prompt(id=str(i), messages=({"role": "user", "content": search_prompt(q)},))
                 for i, q in enumerate(["who?", "where is the big old tower of the city?"])]
    env = SearchEnv(tok, S.SamplingParams(12, temperature=0), Retriever(), topk=1,
                    max_turns=2, max_response_tokens=120, chunk_tokens=5)
    r1 = env.rollout(one, questions, group_size=3, seed=3)
    rm = env.rollout(many, questions, group_size=3, seed=3)
    for g_one, g_many in zip(r1, rm):
        for a, b in zip(g_one.trajectories, g_many.trajectories):
            assert a.tokens == b.tokens and a.loss_mask == b.loss_mask and a.info == b.info
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
    assert any(t.info["turns"] > 1 for g in rm for t in g.trajectories)
    print("SEARCH_ENV_OK")

    # a state remembers its mesh: continued over it by any caller
    cont_any = one.continue_from(gm.state, again, sp, 2)
    same(one.continue_from(g1.state, again, sp, 2), cont_any)
    state_sharded(cont_any, cont_any.state.cache.k[0].shape[0])
    print("STATE_MESH_OK")

    try:  # the padding rows of a generation are no rows to continue
        many.continue_from(gm.state, C.Continuation([9], [[]]), sp, 0)
    except ValueError as e:
        assert "9 rows" in str(e), e
        print("PADDING_ROWS_OK")
""")


@pytest.fixture(scope="module", params=['{"data": 8}', '{"data": 2, "fsdp": 2, "tensor": 2}'])
def mesh_run(request):
    res = subprocess.run([sys.executable, "-c", SCRIPT, request.param], capture_output=True,
                         text=True, timeout=900)
    return request.param, res


def _expect(mesh_run, marker):
    shape, res = mesh_run
    assert marker in res.stdout, f"mesh {shape}: {res.stdout[-2000:]}\n{res.stderr[-4000:]}"


def test_a_rollout_mesh_takes_resharded_weights_and_gathers_none(mesh_run):
    if "fsdp" in mesh_run[0]:
        _expect(mesh_run, "ROLLOUT_MESH_OK")


def test_a_tensor_parallel_rollout_mesh_computes_split_weights_in_place(mesh_run):
    if "fsdp" in mesh_run[0]:
        _expect(mesh_run, "TENSOR_ROLLOUT_OK")


def test_the_pallas_decode_kernel_runs_on_each_devices_rows(mesh_run):
    _expect(mesh_run, "KERNEL_OK")


def test_a_paged_cache_sharded_and_equal_to_one_device(mesh_run):
    _expect(mesh_run, "PAGED_OK")


def test_generate_sharded_and_equal_to_one_device(mesh_run):
    _expect(mesh_run, "GENERATE_OK")


def test_the_sampler_gathers_no_unembedding(mesh_run):
    if '"fsdp"' not in mesh_run[0]:
        pytest.skip("weights replicated: no collective at all (test_no_rows_move_...)")
    _expect(mesh_run, "VOCAB_SLICES_OK")


def test_an_unpinned_prefill_gives_the_same_samples_and_layout(mesh_run):
    _expect(mesh_run, "UNPINNED_PREFILL_OK")


def test_shared_prompts_sharded_and_equal_to_one_device(mesh_run):
    _expect(mesh_run, "SHARED_OK")


def test_continuations_sharded_and_equal_to_one_device(mesh_run):
    _expect(mesh_run, "CONTINUE_OK")


def test_a_consumed_state_is_freed_on_every_device(mesh_run):
    _expect(mesh_run, "CONSUME_OK")


def test_no_rows_move_between_devices(mesh_run):
    if "fsdp" in mesh_run[0]:
        pytest.skip("sharded weights are gathered (FSDP); rows checked on the data-only mesh")
    _expect(mesh_run, "NO_ROW_MOVES_OK")


def test_search_env_chunked_multi_turn_equal_to_one_device(mesh_run):
    _expect(mesh_run, "SEARCH_ENV_OK")


def test_a_state_is_continued_over_its_own_mesh(mesh_run):
    _expect(mesh_run, "STATE_MESH_OK")


def test_padding_rows_cannot_be_continued(mesh_run):
    _expect(mesh_run, "PADDING_ROWS_OK")


def test_prompt_layout_per_shard():
    a, b, c = [1], [2, 3], [4, 5, 6]
    batch, limits = _sharded_prompts([a, a, b, b, c], np.asarray([7, 6, 5, 4, 3]), 2, pad_id=0)
    # 5 rows over 2 shards: blocks of 3, [a a b] and [b c pad]; each shard its own prompts
    np.testing.assert_array_equal(batch.rows, [[0, 0, 1], [0, 1, 0]])
    np.testing.assert_array_equal(batch.mask.sum(1), [1, 2, 2, 3])  # a, b | b, c
    np.testing.assert_array_equal(batch.tokens[:, -3:], [[0, 0, 1], [0, 2, 3], [0, 2, 3],
                                                         [4, 5, 6]])
    np.testing.assert_array_equal(limits, [7, 6, 5, 4, 3, 0])  # the padding row: no budget


def test_continue_layout_keeps_rows_on_their_shard():
    # a cache of 2 shards of 16 device rows (buckets 4, 8, 16 per shard); continue device
    # rows 29, 0, 27, 1, 25: 3 on shard 1 and 2 on shard 0, so 4 per shard, each in its block
    assert row_buckets(16) == (4, 8, 16) and row_buckets(5) == (2, 3, 5)
    layout = layout_rows(np.asarray([29, 0, 27, 1, 25]), n_device=32, shards=2)
    assert layout.size == 8
    np.testing.assert_array_equal(layout.index, [[0, 1, 16, 16], [13, 11, 9, 16]])  # 16: pad
    np.testing.assert_array_equal(layout.sub, [4, 0, 5, 1, 6])
    # more than half a shard's rows: the whole cache, row for row (no gather)
    rows = [*range(9), 16]
    whole = layout_rows(np.asarray(rows), n_device=32, shards=2)
    assert whole.index is None and whole.size == 32
    np.testing.assert_array_equal(whole.sub, rows)
    # a read: each shard's 16 rows as 8 groups of 2, its readers first, in order
    read = read_layout(np.asarray([29, 0, 27, 1, 25]), n_device=32, shards=2)
    assert read.size == 32 and read.index.shape == (2, 8, 2)
    np.testing.assert_array_equal(read.index.reshape(2, 16)[:, :4], [[0, 1, 16, 16],
                                                                     [13, 11, 9, 16]])
    assert (read.index.reshape(2, 16)[:, 4:] == 16).all()
    np.testing.assert_array_equal(read.sub, [16, 0, 17, 1, 18])
    assert read_layout(np.asarray([3]), 32, 2, sub_batches=False).index is None


TRAIN_SCRIPT = textwrap.dedent("""
    import os, runpy, sys
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8")
    os.environ["JAX_PLATFORMS"] = "cpu"
    import models.sampler as S
    seen = []  # the data-parallel shards of every rollout's KV cache
    orig = S._result
    def spy(tokenizer, decoded, *a, **k):
        shards = decoded.frontier.cache.k[0].addressable_shards
        seen.append(len({(s.index[0].start, s.index[0].stop) for s in shards}))
        return orig(tokenizer, decoded, *a, **k)
    S._result = spy
    replicated = set()  # whether the rollouts' layer weights were whole on every device
    gen = S._generate
    def spy_generate(cfg, params, *a, **k):
        import jax
        replicated.add(all(x.sharding.is_fully_replicated
                           for x in jax.tree.leaves(params["layers"])))
        return gen(cfg, params, *a, **k)
    S._generate = spy_generate
    sys.argv = ["rl.train"] + sys.argv[1:]
    try:
        runpy.run_module("rl.train", run_name="__main__")
    except SystemExit as e:
        assert not e.code, e.code
    print("ROLLOUT_SHARDS", sorted(set(seen)))
    print("WEIGHTS_REPLICATED", sorted(replicated))
""")


@pytest.mark.parametrize("mesh, replicated", [
    (["mesh=auto"], True), (["mesh=fsdp"], False),
    (["mesh=fsdp", "mesh.rollout_shape={data:-1}"], True)])
def test_rl_train_rolls_out_over_the_mesh(tmp_path, mesh, replicated):
    """rl.train on 8 CPU devices: every rollout's cache is cut in 8. Data-parallel (mesh=auto)
    the sampler's layer weights are whole on every device; trained with FSDP they are split
    (gathered at every decode step), unless mesh.rollout_shape lays the rollout out
    data-parallel: then they are resharded whole once per step."""
    res = subprocess.run(
        [sys.executable, "-c", TRAIN_SCRIPT, "model=tiny", "trainer.max_steps=1",
         "trainer.batch_prompts=4", "algo.group_size=2", "trainer.max_new_tokens=4",
         "trainer.eval_at_ends=false", f"trainer.run_dir={tmp_path / 'run'}",
         "trainer.progress=false", f"hydra.run.dir={tmp_path / 'hydra'}", *mesh],
        capture_output=True, text=True, timeout=900)
    assert "ROLLOUT_SHARDS [8]" in res.stdout, res.stdout[-2000:] + res.stderr[-4000:]
    assert f"WEIGHTS_REPLICATED [{replicated}]" in res.stdout, res.stdout[-2000:]
    assert (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason="libtpu is not installed (pip install -e '.[tpu-plan]'): no TPU "
                           "topology to compile for")
def test_a_multi_turn_read_of_one_row_groups_compiles_for_tpu():
    """libtpu 0.0.42.1 refused the read of Qwen3-4B's shapes (here 2 of its layers) on a v5e
    2x2 slice when each read group is one row (4 rows a chip, bfloat16 weights and cache):
    "INTERNAL: ... Bitcast cannot have different shape sizes", on a reshape inside the
    per-layer ``lax.switch`` over cache extents that the read's layers then held. The read's
    blocks now run one loop per extent (``models.transformer.while_in_extents``) and the
    program compiles."""
    code = textwrap.dedent("""
        import os
        os.environ["JAX_PLATFORMS"] = "cpu"
        os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
        import dataclasses
        import jax
        import numpy as np
        from jax.sharding import Mesh
        from models.config import from_hf_config
        from models.continuation import line_width, read_kernel
        from models.sampler import SamplingParams, decode_params, generation_kernels
        from models.sharding import decode_param_shardings
        from rl.plan import _abstract, abstract_params, topology_devices
        # Qwen3-4B's config.json, 2 layers of its 36
        cfg = from_hf_config({"model_type": "qwen3", "hidden_size": 2560,
                              "intermediate_size": 9728, "num_attention_heads": 32,
                              "num_key_value_heads": 8, "head_dim": 128,
                              "num_hidden_layers": 2, "vocab_size": 151936,
                              "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                              "tie_word_embeddings": True, "max_position_embeddings": 40960})
        mesh = Mesh(np.array(topology_devices("v5e:2x2")).reshape(1, 4, 1),
                    ("data", "fsdp", "tensor"))
        shapes = jax.eval_shape(lambda p: decode_params(p, "bfloat16"),
                                abstract_params(cfg, mesh))
        params = _abstract(shapes, decode_param_shardings(shapes, mesh))
        sampling = SamplingParams(max_new_tokens=512, temperature=0.0,
                                  kv_cache_dtype="bfloat16", capacity=512)
        _, dec = generation_kernels(cfg, params, [[p + 1] * 256 for p in range(16)],
                                    sampling, mesh)
        read = read_kernel(cfg, params, dec.args[1], line_width(500, sampling.read_block),
                           sampling, mesh, abstract=True)
        assert read.args[2].shape == (4, 4, 1), read.args[2].shape  # 4 groups of 1 a chip
        read.lower().compile()
        print("READ_COMPILED")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600)
    assert "READ_COMPILED" in res.stdout, res.stdout[-2000:] + res.stderr[-3000:]
