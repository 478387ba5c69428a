"""Batched KV-cache sampler: greedy consistency, stop strings, logprobs, seeding."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import load_params
from models.continuation import (
    Continuation,
    continue_generation,
    layout_rows,
    line_width,
    read_layout,
    row_buckets,
)
from models.padding import left_pad
from models.sampler import (
    PromptBatch,
    SamplingParams,
    decode_params,
    first_argmax,
    generate,
    prefill,
    sample_categorical,
)
from models.scoring import token_logprobs
from models.stops import _automaton, stop_tables


@pytest.fixture(scope="module")
def tiny():
    return load_params("tiny", seed=3)


@pytest.fixture(scope="module")
def shipped():
    return load_params("smollm2_135m")


@pytest.fixture(scope="module")
def shipped_head(shipped):
    """The shipped model's first two layers and its tokenizer: real multi-byte tokens and
    varied greedy text, its programs compiled in a fifteenth of the whole model's time."""
    cfg, params, tok = shipped
    head = {**params, "layers": jax.tree.map(lambda x: x[:2], params["layers"])}
    return dataclasses.replace(cfg, num_layers=2), head, tok


def _prompts(tok):
    texts = ["hello", "a much longer prompt with many more tokens in it than the first",
             "third one, medium length"]
    return [tok.encode(t) for t in texts]


def test_batched_greedy_equals_one_by_one(tiny):
    cfg, params, tok = tiny
    prompts = _prompts(tok)
    sp = SamplingParams(max_new_tokens=20, temperature=0)
    batched = generate(cfg, params, tok, prompts, sp).token_lists()
    single = [generate(cfg, params, tok, [p], sp).token_lists()[0] for p in prompts]
    assert batched == single


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_separate_forward(tiny, temperature):
    """The sampler's log-probs are those of the distribution it sampled from (logits / T)."""
    cfg, params, tok = tiny
    prompts = _prompts(tok)
    g = generate(cfg, params, tok, prompts, SamplingParams(16, temperature=temperature), seed=7)
    full = [p + c for p, c in zip(prompts, g.token_lists())]
    toks, mask = left_pad(full, tok.pad_id)
    lp = np.asarray(token_logprobs(cfg, params, jnp.asarray(toks), jnp.asarray(mask),
                                   temperature=temperature))
    for i, c in enumerate(g.token_lists()):
        np.testing.assert_allclose(g.logprobs[i, :len(c)], lp[i, toks.shape[1] - len(c):],
                                   atol=2e-5)


def test_a_rollout_across_cache_extents_follows_the_plain_forward(tiny):
    """A generation and its continuation whose cache spans several extents (slots 128, 256,
    ...: each loop of ``while_in_extents`` attends over its prefix only) sample with the
    log-probs of a plain forward over each whole sequence, from the first extent's steps to
    the last's, a read's blocks crossing an extent included."""
    cfg, params, tok = tiny
    prompts = [(tok.encode("the cat sat on the mat and looked at the door ") * 9)[:110],
               tok.encode("hello")]
    sp = SamplingParams(60, temperature=1.0, ignore_eos=True, read_block=32, capacity=400)
    # 112 + 400 slots: the decode's extents 128, 256 (on CPU none past half), 512
    first = generate(cfg, params, tok, prompts, sp, seed=5)
    context = [p + c for p, c in zip(prompts, first.token_lists())]
    obs = tok.encode(" <information> " + "the tower is old and tall " * 15 + "</information>")
    assert len(obs) > 90  # blocks of 32 from slot 172 cross the read's extent 256
    second = continue_generation(cfg, params, tok, first.state,
                                 Continuation([0, 1], [obs, []]), sp, seed=6)
    assert second.state.cache.valid.shape[1] == 512  # its decode in the last extent
    gaps = np.concatenate([_logprob_gap(cfg, params, tok, prompts, first),
                           _logprob_gap(cfg, params, tok, [context[0] + obs, context[1]],
                                        second)])
    assert gaps.max() < 2e-5, gaps.max()


def test_the_decode_and_read_programs_choose_no_branch_per_layer(tiny):
    """No conditional in a decode step's layers (on a GPU each would be a copy to the host
    and a wait, per layer and token): the fresh decode, a continuation's decode (in place and
    on a sub-batch) and its read run one loop per cache extent instead, with no case op."""
    from models.continuation import bucket_kernel, read_kernel
    from models.sampler import generation_kernels

    cfg, params, tok = tiny
    # 1,024 slots and more: extents 128, 256, ... (on CPU none past half the cache)
    sp = SamplingParams(1000, temperature=1.0)
    _, dec = generation_kernels(cfg, params, [[1] * 8] * 4, sp)
    front = dec.args[1]
    programs = [dec, bucket_kernel(cfg, params, front, 4, sp, None, abstract=True),
                bucket_kernel(cfg, params, front, 1, sp, None, abstract=True),
                read_kernel(cfg, params, front, 64, sp, None, abstract=True)]
    assert [k.name for k in programs] == ["decode", "continue", "part", "read"]
    for kernel in programs:
        text = kernel.lower().as_text()
        assert "stablehlo.case" not in text and "stablehlo.if" not in text, kernel.name
        assert text.count("stablehlo.while") >= 4, kernel.name  # a loop per extent


def test_same_seed_same_samples_and_seed_matters(tiny):
    cfg, params, tok = tiny
    prompts = _prompts(tok)
    sp = SamplingParams(24, temperature=1.0, top_p=0.95)
    a = generate(cfg, params, tok, prompts, sp, seed=11)
    b = generate(cfg, params, tok, prompts, sp, seed=11)
    c = generate(cfg, params, tok, prompts, sp, seed=12)
    assert a.token_lists() == b.token_lists()
    assert a.token_lists() != c.token_lists()


def test_a_repeated_prompt_compiles_no_new_rollout_program(tiny):
    # a GRPO batch of 16 prompts x 2 where two prompts coincide has 15 distinct prompts: the
    # prefill holds 16 either way (one filler row), so one program serves both steps
    from models.padding import prompt_count_bucket
    from models.sampler import _generate

    cfg, params, tok = tiny
    texts = [f"question {i} asks" for i in range(16)]
    distinct = [tok.encode(t) for t in texts for _ in range(2)]
    repeated = [tok.encode(t) for t in texts[:15] + texts[:1] for _ in range(2)]
    sp = SamplingParams(max_new_tokens=4, temperature=0)
    before = _generate._cache_size()
    out_distinct = generate(cfg, params, tok, distinct, sp).token_lists()
    out_repeated = generate(cfg, params, tok, repeated, sp).token_lists()
    assert _generate._cache_size() - before <= 1
    # the filler row changes no row's output: each equals the same prompt's row alone
    assert out_repeated[:30] == out_distinct[:30]
    assert out_repeated[30:] == out_distinct[:2]
    assert [prompt_count_bucket(n) for n in (1, 3, 8, 9, 15, 16, 17, 33)] == [
        1, 4, 8, 10, 16, 16, 20, 40]


def test_per_row_limits_and_lengths(tiny):
    cfg, params, tok = tiny
    prompts = _prompts(tok)
    g = generate(cfg, params, tok, prompts, SamplingParams(12, temperature=0),
                 max_new_per_row=[3, 12, 7])
    assert g.lengths.tolist() == [3, 12, 7]
    assert g.finish == ("length",) * 3
    assert (g.tokens[0, 3:] == tok.pad_id).all() and (g.logprobs[0, 3:] == 0).all()


def test_top_p_restricts_to_nucleus(tiny):
    cfg, params, tok = tiny
    prompt = [tok.encode("the")]
    # with a tiny nucleus only the argmax token can be drawn: equals greedy
    greedy = generate(cfg, params, tok, prompt, SamplingParams(8, temperature=0))
    nucleus = generate(cfg, params, tok, prompt, SamplingParams(8, temperature=1.0,
                                                                top_p=1e-6), seed=5)
    assert nucleus.token_lists() == greedy.token_lists()


def test_sample_categorical_matches_softmax_frequencies():
    # 300 tokens = two full blocks of 128 and a padded one; some tokens impossible (-inf)
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 1.5, 300)
    logits[[0, 5, 128, 299]] = -np.inf
    logits[[7, 200]] += 4.0  # a few likely tokens in different blocks
    probs = np.exp(logits - logits[np.isfinite(logits)].max())
    probs /= probs.sum()
    n = 40_000
    keys = jax.random.split(jax.random.key(1), n)
    draws = jax.jit(jax.vmap(lambda k: sample_categorical(k, jnp.asarray(logits[None],
                                                                          jnp.float32))[0]))(keys)
    freq = np.bincount(np.asarray(draws), minlength=300) / n
    assert freq[[0, 5, 128, 299]].sum() == 0
    # binomial standard error <= sqrt(0.25 / n) = 0.0025; allow 5 sigma everywhere
    assert np.max(np.abs(freq - probs)) < 0.0125
    # and the mass of the likely tokens, each compared with its own standard error
    for t in (7, 200):
        assert abs(freq[t] - probs[t]) < 5 * np.sqrt(probs[t] * (1 - probs[t]) / n)


def test_the_sampler_asks_for_float32_true_prefix_sums():
    # at a backend's default precision a TPU multiplies float32 in one bfloat16 pass and an
    # NVIDIA GPU in TF32: the program itself must ask for HIGHEST on every dot
    text = jax.jit(sample_categorical).lower(jax.random.key(0), jnp.zeros((2, 300))).as_text()
    dots = [line for line in text.splitlines() if "stablehlo.dot" in line]
    assert len(dots) == 2  # the block sums and the sums inside the chosen block
    assert all("precision = [HIGHEST, HIGHEST]" in line for line in dots)


def test_the_drawn_distribution_on_a_grid_of_uniforms_is_the_softmax():
    from bench.sampling_check import compare, grid_counts, test_logits

    bits, logits = 16, test_logits(1000, seed=3)
    counts = np.asarray(grid_counts(jnp.asarray(logits), bits, 4096, "HIGHEST"))
    assert counts.sum() == 1 << bits
    figures = compare(counts, logits, bits)
    # each token's share of 2^16 stratified uniforms is its float64 softmax probability to
    # within one grid step (float32 rounding adds far less than a step here)
    assert figures["max_error_steps"] < 1.5
    assert figures["impossible_drawn"] == 0


def test_first_argmax_equals_numpy_argmax_with_ties():
    x = np.asarray([[1.0, 3.0, 3.0, -2.0], [-np.inf, -1.0, -1.0, -1.0], [0.0, 0.0, 0.0, 5.0]],
                   np.float32)
    np.testing.assert_array_equal(np.asarray(first_argmax(jnp.asarray(x))), np.argmax(x, -1))


def _run_dfa(tables, ids):
    nxt, hit = tables
    state = 0
    for i, t in enumerate(ids):
        if hit[state, t]:
            return i
        state = nxt[state, t]
    return None


def test_stop_tables_catch_any_tokenization(shipped):
    _, _, tok = shipped
    tables = stop_tables(tok.token_bytes, ("</search>", "</answer>"))
    text = "I think <search> capital of France </search> more"
    natural = tok.encode(text)
    # the same text spelled one character per token
    by_char = [tok.backend.token_to_id(tok.backend.encode(ch).tokens[0]) for ch in text]
    for ids in (natural, by_char):
        stop_at = _run_dfa(tables, ids)
        assert stop_at is not None
        assert tok.decode(ids[: stop_at + 1]).endswith("</search>")
        assert "</search>" not in tok.decode(ids[:stop_at])
    assert _run_dfa(tables, tok.encode("no stop string </searc h> here")) is None


def test_automaton_overlapping_patterns():
    delta, accept = _automaton((b"abab", b"bc"))
    state, ends = 0, []
    for i, ch in enumerate(b"xababcabab"):
        state = delta[state, ch]
        if accept[state]:
            ends.append(i)
    assert ends == [4, 5, 9]


def test_generation_stops_right_after_stop_string(shipped):
    cfg, params, tok = shipped
    msg = ("Write the word search inside search tags like <search> query </search>.")
    prompt = tok.encode_chat([{"role": "user", "content": msg}])
    free = generate(cfg, params, tok, [prompt], SamplingParams(40, temperature=0))
    assert "</search>" in free.texts[0] and not free.texts[0].endswith("</search>")
    g = generate(cfg, params, tok, [prompt],
                 SamplingParams(40, temperature=0, stop=("</search>", "</answer>")))
    assert g.finish == ("stop",)
    assert g.texts[0].endswith("</search>")
    assert free.texts[0].startswith(g.texts[0])


def test_eos_ends_generation(shipped):
    cfg, params, tok = shipped
    prompt = tok.encode_chat([{"role": "user", "content": "Say hi."}])
    g = generate(cfg, params, tok, [prompt], SamplingParams(64, temperature=0))
    assert g.finish == ("eos",)
    assert g.tokens[0, g.lengths[0] - 1] in tok.eos_ids


def test_sampling_params_validation():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=0)
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        SamplingParams(kv_cache_dtype="float16")


def test_repeated_prompts_share_one_prefill(tiny):
    cfg, params, tok = tiny
    a, b = _prompts(tok)[:2]
    sp = SamplingParams(max_new_tokens=10, temperature=0)
    got = generate(cfg, params, tok, [a, b, a, a], sp).token_lists()
    assert got == [generate(cfg, params, tok, [p], sp).token_lists()[0] for p in (a, b, a, a)]
    sampled = generate(cfg, params, tok, [a, a, a, a], SamplingParams(10, temperature=1.0),
                       seed=1).token_lists()
    assert len({tuple(x) for x in sampled}) > 1  # the copies still sample independently


def test_the_prefill_holds_no_full_length_cache_of_the_distinct_prompts(tiny):
    """2 distinct prompts of 32 tokens, 8 rows (groups of 4), 4,096 cache slots, float32: the
    rows' cache (its output) is 8 x L x 2 x KV x hd x 4,096 x 4 bytes. The distinct prompts'
    cache at 4,096 slots would be a quarter of it; at their 32 slots, 1/128 of a quarter.
    The compiled prefill's temporaries stay under an eighth of the output."""
    cfg, params, _ = tiny
    prompts = PromptBatch(jnp.ones((2, 32), jnp.int32), jnp.ones((2, 32), bool),
                          jnp.asarray([0, 0, 0, 0, 1, 1, 1, 1]))
    front = jax.jit(prefill, static_argnames=("cfg", "cache_len")).lower(
        cfg, params, prompts, cache_len=4096).compile().memory_analysis()
    rows_cache = 8 * cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * 4096 * 4
    assert front.output_size_in_bytes >= rows_cache
    assert front.temp_size_in_bytes < rows_cache / 8, (front.temp_size_in_bytes, rows_cache)
    out = prefill(cfg, params, prompts, cache_len=4096)
    assert out.cache.k[0].shape[-1] == 4096 and out.cache.v[0].shape[2] == 4096
    assert out.cache.valid[:, :32].all() and not out.cache.valid[:, 32:].any()
    assert not jnp.any(out.cache.k[0][..., 32:]) and jnp.any(out.cache.k[0][..., :32])


def test_ignore_eos_generates_exact_lengths(shipped):
    cfg, params, tok = shipped
    prompt = tok.encode_chat([{"role": "user", "content": "Say hi."}])
    g = generate(cfg, params, tok, [prompt], SamplingParams(40, temperature=0, ignore_eos=True))
    assert g.lengths.tolist() == [40] and g.finish == ("length",)


def _assert_same_generation(got, ref):
    assert got.token_lists() == ref.token_lists()
    assert got.finish == ref.finish
    for i, c in enumerate(ref.token_lists()):
        np.testing.assert_allclose(got.logprobs[i, :len(c)], ref.logprobs[i, :len(c)],
                                   atol=1e-4)


def test_continuation_equals_generating_from_the_whole_context(tiny):
    # turn 1 with early stops (holes in the cache), then two continuations of a reordered
    # subset with observations of different lengths (one empty), against plain generate on
    # the concatenated token lists
    cfg, params, tok = tiny
    prompts = _prompts(tok)
    sp = SamplingParams(max_new_tokens=7, temperature=0, ignore_eos=True)
    first = generate(cfg, params, tok, prompts, sp, max_new_per_row=[7, 2, 5])
    context = [p + c for p, c in zip(prompts, first.token_lists())]
    obs = {0: tok.encode(" <information> doc one </information>"), 2: []}
    rows = [2, 0]
    second = continue_generation(cfg, params, tok, first.state,
                                 Continuation(rows, [obs[r] for r in rows]),
                                 SamplingParams(6, temperature=0, ignore_eos=True))
    context2 = [context[r] + obs[r] for r in rows]
    _assert_same_generation(second, generate(cfg, params, tok, context2,
                                             SamplingParams(6, temperature=0, ignore_eos=True)))
    context2 = [c + g for c, g in zip(context2, second.token_lists())]
    more = [tok.encode(" and again"), tok.encode(" x")]
    third = continue_generation(cfg, params, tok, second.state, Continuation([0, 1], more),
                                SamplingParams(5, temperature=1.0, ignore_eos=True), seed=4)
    ref = generate(cfg, params, tok, [c + m for c, m in zip(context2, more)],
                   SamplingParams(5, temperature=1.0, ignore_eos=True), seed=4)
    _assert_same_generation(third, ref)
    n_tokens = third.state.n_tokens[third.state.device_rows([0, 1])]
    assert list(n_tokens) == [len(c) + len(m) + 5 for c, m in zip(context2, more)]


def test_continuation_reading_in_blocks_and_consuming_its_state(tiny):
    # observations longer than read_block are read in blocks (a scan over the cache): the
    # result still equals plain generate on the concatenated token lists, for a subset of
    # readers (gather and scatter) and for every row reading; a consumed state gives the
    # same result and its cache is freed
    cfg, params, tok = tiny
    prompts = _prompts(tok) + [tok.encode("fourth")]
    sp = SamplingParams(max_new_tokens=5, temperature=0, ignore_eos=True, read_block=16)
    long_doc = tok.encode(" <information> " + "the tower is old and tall " * 6 + "</information>")
    assert len(long_doc) > 32  # three blocks of 16 at least
    first = generate(cfg, params, tok, prompts, sp, max_new_per_row=[5, 2, 4, 5])
    context = [p + c for p, c in zip(prompts, first.token_lists())]
    for rows, obs in (([1, 3], [long_doc, []]),
                      ([0, 1, 2, 3], [long_doc, tok.encode(" b"), long_doc[:20], long_doc])):
        ref = generate(cfg, params, tok, [context[r] + o for r, o in zip(rows, obs)],
                       dataclasses.replace(sp, read_block=128))
        got = continue_generation(cfg, params, tok, first.state, Continuation(rows, obs), sp)
        _assert_same_generation(got, ref)
    again = generate(cfg, params, tok, prompts, sp, max_new_per_row=[5, 2, 4, 5])
    got = continue_generation(cfg, params, tok, again.state,
                              Continuation(rows, obs, consume=True), sp)
    _assert_same_generation(got, ref)
    assert all(x.is_deleted() for x in again.state.cache.k + again.state.cache.v)
    with pytest.raises(RuntimeError, match="deleted"):
        continue_generation(cfg, params, tok, again.state, Continuation(rows, obs), sp)


def test_continuation_without_sub_batches_runs_every_row_in_place(tiny):
    # sub_batches=False: one row bucket, every row of the cache, no gather (index None); a
    # subset of rows reading and not still equals plain generate on the concatenated lists
    assert row_buckets(8) == (2, 4, 8) and row_buckets(8, sub_batches=False) == (8,)
    assert layout_rows(np.asarray([1, 5]), 8, 1).size == 2
    whole = layout_rows(np.asarray([1, 5]), 8, 1, sub_batches=False)
    assert whole.index is None and list(whole.sub) == [1, 5] and whole.size == 8
    cfg, params, tok = tiny
    prompts = _prompts(tok) + [tok.encode("fourth")]
    sp = SamplingParams(max_new_tokens=5, temperature=0, ignore_eos=True, sub_batches=False)
    first = generate(cfg, params, tok, prompts, sp, max_new_per_row=[5, 2, 4, 5])
    context = [p + c for p, c in zip(prompts, first.token_lists())]
    rows, obs = [3, 1], [tok.encode(" some tokens read"), []]
    got = continue_generation(cfg, params, tok, first.state, Continuation(rows, obs), sp)
    ref = generate(cfg, params, tok, [context[r] + o for r, o in zip(rows, obs)], sp)
    _assert_same_generation(got, ref)


def test_line_width_rounds_to_16_then_to_the_read_block():
    assert [line_width(n, 128) for n in (0, 1, 16, 17, 128, 129, 300)] == \
        [0, 16, 16, 32, 128, 256, 384]
    with pytest.raises(ValueError, match="read_block"):
        SamplingParams(read_block=24)


def test_continuation_where_nearly_every_row_reads(tiny):
    # 3 of 4 rows read (padded, that is a read line per row: the path without gather and
    # scatter), one row continues without reading and must keep its own next-token logits;
    # then all 4 read
    cfg, params, tok = tiny
    prompts = _prompts(tok) + [tok.encode("fourth")]
    sp = SamplingParams(max_new_tokens=4, temperature=0, ignore_eos=True)
    first = generate(cfg, params, tok, prompts, sp, max_new_per_row=[4, 1, 3, 4])
    context = [p + c for p, c in zip(prompts, first.token_lists())]
    for obs in ([tok.encode(" doc one"), [], tok.encode(" a longer second document"),
                 tok.encode(" x")],
                [tok.encode(" a"), tok.encode(" b c"), tok.encode(" d e f"), tok.encode(" g")]):
        rows = [3, 1, 0, 2]
        got = continue_generation(cfg, params, tok, first.state, Continuation(rows, obs), sp)
        ref = generate(cfg, params, tok, [context[r] + o for r, o in zip(rows, obs)], sp)
        _assert_same_generation(got, ref)


def test_a_read_in_groups_that_pad_the_rows(tiny):
    # 9 rows read in groups of ceil(9/8) = 2, the 9 padded to 10: 5 readers of different
    # lengths in 3 groups read one after the other (the last with a padding slot), a row
    # continued without reading beside them; equal to plain generate on the concatenations
    cfg, params, tok = tiny
    prompts = [tok.encode(f"prompt number {i}" + " x" * i) for i in range(9)]
    sp = SamplingParams(max_new_tokens=3, temperature=0, ignore_eos=True)
    first = generate(cfg, params, tok, prompts, sp)
    rows = [8, 0, 4, 6, 2, 5]
    assert read_layout(np.asarray(rows[:5]), 9, 1).index.tolist() == [[[8, 0], [4, 6],
                                                                       [2, 9], [9, 9],
                                                                       [9, 9]]]
    context = [p + c for p, c in zip(prompts, first.token_lists())]
    obs = [tok.encode(" doc" * (1 + r)) for r in rows[:5]] + [[]]
    got = continue_generation(cfg, params, tok, first.state, Continuation(rows, obs), sp)
    ref = generate(cfg, params, tok, [context[r] + o for r, o in zip(rows, obs)], sp)
    _assert_same_generation(got, ref)


def test_stop_string_straddling_two_continued_calls_is_caught(shipped_head):
    # a stop string made of the last byte of token k-1 and the first byte of token k: cut the
    # generation between them, continue with nothing appended, and it must still stop at k
    cfg, params, tok = shipped_head
    prompt = tok.encode_chat([{"role": "user", "content": "Name three rivers in Europe."}])
    greedy = SamplingParams(16, temperature=0, ignore_eos=True)
    ids = generate(cfg, params, tok, [prompt], greedy).token_lists()[0]
    tb = [tok.token_bytes[i] for i in ids]
    for k in range(2, len(ids)):
        stop = tb[k - 1][-1:] + tb[k][:1]
        if len(stop) == 2 and stop.isascii() and stop.decode().isprintable() \
                and stop not in b"".join(tb[:k]):
            break
    else:
        raise AssertionError(f"no two-byte stop string to test in {tb}")
    sp = dataclasses.replace(greedy, stop=(stop.decode(),))
    whole = generate(cfg, params, tok, [prompt], sp)
    assert whole.lengths[0] == k + 1 and whole.finish[0] == "stop"
    head = generate(cfg, params, tok, [prompt], dataclasses.replace(sp, max_new_tokens=k))
    assert head.lengths[0] == k and head.finish[0] == "length"
    tail = continue_generation(cfg, params, tok, head.state, Continuation([0], [[]]), sp)
    assert tail.token_lists()[0] == ids[k:k + 1] and tail.finish[0] == "stop"
    # a row that reads new tokens starts matching afresh
    fresh = continue_generation(cfg, params, tok, head.state, Continuation([0], [[ids[k]]]),
                                dataclasses.replace(sp, max_new_tokens=1))
    assert fresh.finish[0] != "stop" or stop in b"".join(tok.token_bytes[i] for i in
                                                           fresh.token_lists()[0])


def test_continuation_rejects_bad_rows(tiny):
    cfg, params, tok = tiny
    g = generate(cfg, params, tok, _prompts(tok)[:2], SamplingParams(2, temperature=0))
    with pytest.raises(ValueError, match="index the 2 rows"):
        continue_generation(cfg, params, tok, g.state, Continuation([2], [[1]]))
    with pytest.raises(ValueError, match="differ in length"):
        continue_generation(cfg, params, tok, g.state, Continuation([0, 1], [[1]]))
    with pytest.raises(ValueError, match="once per call"):  # one cache row, one continuation
        Continuation([1, 1], [[1], [2]])


def _logprob_gap(cfg, params, tok, contexts, gen):
    """|sampler log-prob - float32 forward log-prob| over every generated token."""
    full = [c + g for c, g in zip(contexts, gen.token_lists())]
    toks, mask = left_pad(full, tok.pad_id)
    lp = np.asarray(token_logprobs(cfg, params, jnp.asarray(toks), jnp.asarray(mask)))
    return np.concatenate([np.abs(gen.logprobs[i, :len(g)] - lp[i, toks.shape[1] - len(g):])
                           for i, g in enumerate(gen.token_lists())])


def test_bfloat16_decoding_follows_the_float32_model(shipped):
    cfg, params, tok = shipped
    dp = decode_params(params, jnp.bfloat16)
    layer = dp["layers"][0]
    assert layer["wq"].dtype == jnp.bfloat16 and layer["w_down"].dtype == jnp.bfloat16
    assert layer["attn_norm"].dtype == jnp.float32 and dp["embed"].dtype == jnp.float32
    assert dp["unembed"].shape == (cfg.hidden_size, cfg.vocab_size)
    prompts = _prompts(tok)
    sp = SamplingParams(16, temperature=1.0, ignore_eos=True)
    first = generate(cfg, dp, tok, prompts, sp, seed=7)
    assert first.state.cache.k[0].dtype == jnp.float32  # see decode_params
    obs = tok.encode(" <information> Paris is the capital of France. </information>")
    second = continue_generation(cfg, dp, tok, first.state, Continuation([0, 2], [obs, []]), sp,
                                 seed=8)
    context = [p + g for p, g in zip(prompts, first.token_lists())]
    # the sampled tokens' log-probabilities against the float32 model, turn 1 and the
    # continuation (measured: mean ~0.013, max ~0.05 nats; a broken cache is off by nats)
    gaps = np.concatenate([_logprob_gap(cfg, params, tok, prompts, first),
                           _logprob_gap(cfg, params, tok, [context[0] + obs, context[2]],
                                        second)])
    assert gaps.mean() < 0.03 and gaps.max() < 0.25, (gaps.mean(), gaps.max())
    chat = tok.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    answer = generate(cfg, dp, tok, [chat], SamplingParams(24, temperature=0))
    assert "Paris" in answer.texts[0]


def test_bfloat16_kv_cache_prefill_and_decode(tiny):
    # a user-built bfloat16 cache: a several-token forward and a decode step both run (on CPU
    # the cache is read in float32 for the first) and give the float32 cache's logits up to
    # bfloat16 rounding of the cached keys and values
    from models.transformer import KVCache, forward_with_cache, unembed

    cfg, params, tok = tiny
    tokens = jnp.asarray([tok.encode("the cat sat on the mat")[:6]] * 2, jnp.int32)

    @jax.jit
    def step(params, tokens, cache, cache_index):
        hidden, cache = forward_with_cache(cfg, params, tokens, cache=cache,
                                           cache_index=cache_index)
        return unembed(cfg, params, hidden), cache
    logits = {}
    for dt in (jnp.float32, jnp.bfloat16):
        cache = KVCache.zeros(cfg, 2, 8, dt)
        first, cache = step(params, tokens[:, :5], cache, 0)
        last, cache = step(params, tokens[:, 5:], cache, 5)
        assert cache.k[0].dtype == dt
        logits[dt] = np.concatenate([np.asarray(first), np.asarray(last)], axis=1)
    ref, got = logits[jnp.float32], logits[jnp.bfloat16]
    np.testing.assert_allclose(got, ref, atol=0.05 * np.abs(ref).max())
    assert (got[:, -1].argmax(-1) == ref[:, -1].argmax(-1)).all()


# greedy tokens and first log-probs of _prompts(tiny) x 12 new tokens, recorded with the sampler
# before SamplingParams.kv_cache_dtype existed (float32 cache, the only one then)
BEFORE_TOKENS = [[28120] * 12, [808] * 12, [3519] * 12]
BEFORE_LOGPROBS = [[-10.079510688781738, -10.079510688781738, -10.079510688781738],
                   [-9.867411613464355, -9.880497932434082, -9.901326179504395],
                   [-9.578025817871094, -9.607853889465332, -9.649518966674805]]


def test_float32_kv_cache_default_is_the_sampler_before(tiny):
    cfg, params, tok = tiny
    default = generate(cfg, params, tok, _prompts(tok), SamplingParams(12, temperature=0))
    named = generate(cfg, params, tok, _prompts(tok),
                     SamplingParams(12, temperature=0, kv_cache_dtype="float32"))
    assert default.state.cache.k[0].dtype == jnp.float32
    assert default.token_lists() == BEFORE_TOKENS
    np.testing.assert_allclose(default.logprobs[:, :3], BEFORE_LOGPROBS, rtol=1e-6)
    np.testing.assert_array_equal(default.logprobs, named.logprobs)
    assert default.token_lists() == named.token_lists()


def _cache_dtypes(state) -> set:
    return {a.dtype for a in (*state.cache.k, *state.cache.v)}


@pytest.mark.parametrize("model", ["tiny", "shipped"])
def test_bfloat16_kv_cache_follows_the_float32_cache(model, request):
    """SamplingParams.kv_cache_dtype=bfloat16 stores every layer's keys and values in
    bfloat16, in the prefill, the decode loop and a continuation (which keeps its state's
    dtype); attention reads them in float32. Greedy tokens equal the float32 cache's, and the
    sampled tokens' log-probabilities agree: on the tiny random model (attention scores
    near 0) within bfloat16's resolution, each cached value being rounded by at most 2^-9 of
    itself (8 significand bits), bounded by one bfloat16 step, 2^-8, of the largest |log p|;
    on the shipped model a score q.k moves by up to 2^-9 |q| |k| / sqrt(hd), large for its
    large-norm keys, so there the bound is the bfloat16-weights test's (measured: mean
    0.008, max 0.067 nats; a broken cache is off by nats)."""
    cfg, params, tok = request.getfixturevalue(model)
    prompts = _prompts(tok)
    obs = [tok.encode(" and then the answer is"), [], tok.encode(" ok")]
    runs = {}
    for dt in ("float32", "bfloat16"):
        sp = SamplingParams(12, temperature=0, kv_cache_dtype=dt)
        first = generate(cfg, params, tok, prompts, sp)
        # a continuation's own sampling says float32: the state's cache dtype is kept
        second = continue_generation(cfg, params, tok, first.state,
                                     Continuation([0, 1, 2], obs), SamplingParams(8, temperature=0))
        assert _cache_dtypes(first.state) == _cache_dtypes(second.state) == {jnp.dtype(dt)}
        runs[dt] = (first, second)
    for ref, got in zip(runs["float32"], runs["bfloat16"]):
        assert got.token_lists() == ref.token_lists()
        gaps = np.concatenate([np.abs(g - r)[:n] for g, r, n in
                               zip(got.logprobs, ref.logprobs, ref.lengths)])
        if model == "tiny":
            assert gaps.max() <= 2.0**-8 * np.abs(ref.logprobs).max(), gaps.max()
        else:
            assert gaps.mean() < 0.03 and gaps.max() < 0.25, (gaps.mean(), gaps.max())
    assert not np.array_equal(runs["float32"][0].logprobs, runs["bfloat16"][0].logprobs)
