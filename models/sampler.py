"""Jitted batched sampling with a KV cache.

Prompts of different lengths share one batch by left padding: every row then writes its next
token into the same cache slot, so a decode step is one dense ``dynamic_update_slice``. RoPE
positions count real tokens only, so padding never shifts a row's positions.

Returned log-probabilities are those of the distribution the token was sampled from at its
temperature, ``log_softmax(logits / T)`` (greedy decoding, T = 0: of the model's own, T = 1),
without top-p truncation, as verl and TRL compute them; ``models.scoring.group_logprobs`` with
the same ``temperature`` recomputes exactly these for the PPO ratio and the KL.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from models.config import ModelConfig
from models.constraints import dividing_axes
from models.decode_attention import DECODE_KERNELS
from models.padding import left_pad, prompt_count_bucket, right_pad, round_up
from models.paged_cache import (
    PagedCache,
    forward_cached,
    is_paged,
    prompt_pages,
    reads_own_slots,
    shared_prompt_pages,
    shared_row_slots,
)
from models.prompt_sharing import grouped_prompts, prompt_group, rows_cache
from models.sharding import (
    batch_shards,
    constrain_rows,
    host_copy,
    place_replicated,
    place_rows,
    vocab_sharding,
)
from models.stops import stop_tables
from models.tokenizer import Tokenizer
from models.transformer import (
    KVCache,
    Params,
    Placement,
    decode_extents,
    forward_with_cache,
    kv_layout,
    platform_of,
    slot_axes,
    unembed,
    unembedding,
    unstack_layers,
    while_in_extents,
)

FINISH_REASONS = ("length", "eos", "stop")
KV_CACHE_DTYPES = ("float32", "bfloat16")  # what a fresh generation's KV cache stores


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample. temperature 0 means greedy; ignore_eos generates exactly
    max_new_tokens (benchmarks). ``kv_cache_dtype``: what a fresh generation's KV cache
    stores (one of KV_CACHE_DTYPES; a continuation keeps its state's): bfloat16 halves the
    cache, attention still computes in float32 (see models.transformer.attention).
    ``read_block``: a continuation reads its appended tokens (e.g. a search's observation) in
    blocks of at most this many (a multiple of 16), so one block's attention scores, [rows,
    heads, block, slots] float32, are alive at a time instead of the whole observation's.
    ``prefill_pin_rows``: how a sharded prefill lays out the prompts' activations (see
    :func:`prefill`); the samples do not depend on it, only the memory per device does.
    ``capacity`` and ``prompt_bucket``: a fresh generation's KV cache holds its prompts, left
    padded to a multiple of ``prompt_bucket``, and ``capacity`` slots after them (at least
    the new tokens rounded up to 16): a multi-turn rollout reserves room for every turn and
    observation of a row, so that its continuations write in place, in programs of one
    shape (``models.continuation``). ``sub_batches``: a continuation runs its rows gathered
    out of the cache into a sub-batch of one of a few sizes (``models.continuation.
    row_buckets``; a read, groups of ``read_group`` rows), so a chunk costs about what its
    rows cost; False: every row of the cache runs, in place (rows not continued ride along,
    finished), so nothing but the cache is held: the memory of a tight accelerator
    (``rl.plan``'s ``part`` program). ``decode_text``: the result carries the rows' texts
    (False: token ids only, as benchmarks want; no effect on the programs).
    ``decode_kernel``: what computes a decode step's attention over the cache
    (``models.decode_attention``): "xla" (the default), or "pallas_gpu", the Pallas GPU
    decode kernel reading each row's own slots, on a cache in its layout (not yet checked
    on a GPU; interpreted, slowly, elsewhere). A continuation keeps its state's.
    ``shared_prompts``: the rows that continue one prompt (a GRPO group, consecutive rows)
    read one copy of its KV cache, each decode step attending over the group's prompt once
    for the group and over each row's own slots (``models.prompt_sharing``); rows not laid
    out in whole groups per shard keep a copy each. A continuation gives each row its own
    copy first (once). On a paged cache the group's rows share its prompt's full pages
    instead (``models.paged_cache.shared_prompt_pages``), through every turn, a decode step
    reading them once for the group (every paged kernel)."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    kv_cache_dtype: str = "float32"
    read_block: int = 128
    prefill_pin_rows: bool = True
    capacity: int = 0
    prompt_bucket: int = 16
    sub_batches: bool = True
    decode_text: bool = True
    decode_kernel: str = "xla"
    shared_prompts: bool = False

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                             f"got {self.kv_cache_dtype!r}")
        if self.prompt_bucket < 1 or self.capacity < 0:
            raise ValueError(f"prompt_bucket must be >= 1 and capacity >= 0, got "
                             f"{self.prompt_bucket} and {self.capacity}")
        if self.read_block < 16 or self.read_block % 16:
            raise ValueError(f"read_block must be a positive multiple of 16, got "
                             f"{self.read_block}")
        if self.decode_kernel not in DECODE_KERNELS:
            raise ValueError(f"decode_kernel must be one of {', '.join(DECODE_KERNELS)}, "
                             f"got {self.decode_kernel!r}")


@dataclasses.dataclass(frozen=True)
class Generation:
    """Sampled continuations. tokens/logprobs are [B, N], valid up to lengths[b] (inclusive of
    the EOS or stop-completing token); finish is one of FINISH_REASONS per row."""

    tokens: np.ndarray
    logprobs: np.ndarray
    lengths: np.ndarray
    finish: tuple[str, ...]
    texts: tuple[str, ...]
    state: DecodeState | None = None  # set by the jitted sampler: continue_generation's input

    def token_lists(self) -> list[list[int]]:
        return [row[:n].tolist() for row, n in zip(self.tokens, self.lengths)]


def first_argmax(logits: jax.Array) -> jax.Array:
    """argmax over the last axis (first index on ties) as two plain reductions: XLA:CPU runs
    them ~5x faster than the (value, index) reduction of ``jnp.argmax``."""
    top = jnp.max(logits, axis=-1, keepdims=True)
    iota = jnp.arange(logits.shape[-1], dtype=jnp.int32)
    return jnp.min(jnp.where(logits == top, iota, logits.shape[-1]), axis=-1).astype(jnp.int32)


def sample_categorical(key: jax.Array, logits: jax.Array, block: int = 128,
                       precision: jax.lax.Precision = jax.lax.Precision.HIGHEST) -> jax.Array:
    """One draw per row from softmax(logits [B,V]): :func:`inverse_cdf` at u ~ U[0, 1).

    One uniform per row instead of a Gumbel per token (which made ``jax.random.categorical``
    ~25x slower at B=16, V=49k on CPU). Zero-probability tokens (-inf logits, e.g. outside the
    top-p nucleus) are never drawn.
    """
    u = jax.random.uniform(key, (logits.shape[0], 1), logits.dtype)
    return inverse_cdf(logits, u, block, precision)


def inverse_cdf(logits: jax.Array, u: jax.Array, block: int = 128,
                precision: jax.lax.Precision = jax.lax.Precision.HIGHEST) -> jax.Array:
    """The token i of each row with CDF(i-1) <= u Z < CDF(i), p = exp(logits - max), Z = sum p.

    Two levels (blocks of `block` tokens, then tokens inside the chosen block) so the prefix
    sums are small matmuls against triangular ones. Their `precision` is HIGHEST: at a
    backend's default a TPU multiplies in one bfloat16 pass and a recent NVIDIA GPU in TF32,
    rounding each p and block mass to 8 or 11 significant bits, so each block's probability
    is off by up to 2^-8 or 2^-11 of itself, and the gap between a block's rounded and exact
    mass falls on its first or last token. ``bench.sampling_check`` measures the drawn
    distribution (``u`` on a grid) at both precisions.
    """
    b, v = logits.shape
    n_blocks = -(-v // block)
    p = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))
    p = jnp.pad(p, ((0, 0), (0, n_blocks * block - v))).reshape(b, n_blocks, block)
    block_mass = p.sum(-1)                                                  # [B, nb]
    cum_blocks = jnp.matmul(block_mass, jnp.triu(jnp.ones((n_blocks, n_blocks), p.dtype)),
                            precision=precision)
    u = u * cum_blocks[:, -1:]
    chosen = jnp.minimum(jnp.sum(cum_blocks <= u, axis=-1), n_blocks - 1)   # [B]
    before = (jnp.take_along_axis(cum_blocks, chosen[:, None], 1)
              - jnp.take_along_axis(block_mass, chosen[:, None], 1))
    inner = jnp.take_along_axis(p, chosen[:, None, None], 1)[:, 0]          # [B, block]
    cum_inner = jnp.matmul(inner, jnp.triu(jnp.ones((block, block), p.dtype)),
                           precision=precision)
    idx = jnp.sum(cum_inner <= u - before, axis=-1)
    # rounding can push u outside the block's own mass, past its end or before its start:
    # clamp to the block's first and last possible tokens
    possible = jnp.where(inner > 0, jnp.arange(block), -1)
    last = jnp.max(possible, axis=-1)
    first = jnp.min(jnp.where(possible >= 0, possible, block), axis=-1)
    return (chosen * block + jnp.clip(idx, first, last)).astype(jnp.int32)


def _sample(logits: jax.Array, key: jax.Array, temperature: float, top_p: float) -> jax.Array:
    if temperature == 0:
        return first_argmax(logits)
    logits = logits / temperature
    if top_p < 1.0:
        # keep the smallest set of tokens whose probability mass reaches top_p
        probs = jax.nn.softmax(logits, axis=-1)
        sorted_probs = -jnp.sort(-probs, axis=-1)
        keep = (jnp.cumsum(sorted_probs, axis=-1) - sorted_probs) < top_p
        threshold = jnp.min(jnp.where(keep, sorted_probs, 1.0), axis=-1, keepdims=True)
        logits = jnp.where(probs >= threshold, logits, -jnp.inf)
    return sample_categorical(key, logits)


def decode_params(params: Params, dtype: Any = None) -> Params:
    """``params`` in the sampler's form: each layer's weights in their own buffers. Passing
    these to generate / continue_generation saves one copy of all layer weights per call (the
    sampler otherwise makes it itself); multi-turn rollouts make many calls per update.

    ``dtype`` (e.g. ``jnp.bfloat16``) casts the matrices (layer projections and the output
    layer, kept as a [D,V] "unembed") for decoding: matmuls run on ``dtype`` inputs with
    float32 accumulation; embeddings, norms, the residual stream, softmax and logits stay
    float32, and so does the KV cache unless ``SamplingParams.kv_cache_dtype`` says otherwise
    (on CPU a decode step's attention reads a float32 cache faster than it converts a
    bfloat16 one; on a TPU a bfloat16 cache halves the rollout's largest buffer). Half the
    bytes per step for weights, and faster matmuls where the CPU has bfloat16 instructions
    (benchmarks, "Design measurements").
    Samples then come from a slightly different distribution than the float32 policy's (the
    trainer recomputes log-probabilities in float32, so its importance ratios stay exact)."""
    return _decode_params_jit(params, None if dtype is None else jnp.dtype(dtype))


@functools.partial(jax.jit, static_argnames="dtype")
def _decode_params_jit(params: Params, dtype: Any) -> Params:
    params = unstack_layers(params)
    if dtype is None or dtype == params["embed"].dtype:
        return params
    cast = lambda a: a.astype(dtype) if a.ndim == 2 else a  # noqa: E731 (matrices only)
    out = dict(params, layers=tuple(jax.tree.map(cast, p) for p in params["layers"]))
    out["unembed"] = (params["lm_head"] if "lm_head" in params else params["embed"].T
                      ).astype(dtype)
    out.pop("lm_head", None)
    return out


# ----------------------------------------------------------------------------- jitted kernels
#
# A fresh generation (_generate: prefill, then decode) and a continued one
# (models.continuation: read the appended tokens, then decode, in place) share one decode
# loop (decode_loop). What jit specialises on travels as DecodeSettings (static); everything else
# as named pytrees.


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
    """What a sampler kernel is compiled for (a static jit argument: each distinct value
    compiles once): the decode loop's length, the sampling distribution, the mesh whose
    data-parallel axes its rows are sharded over (None: no constraint, one device), the
    dtype a fresh generation's KV cache stores (SamplingParams.kv_cache_dtype), the block
    a continuation reads appended tokens in (SamplingParams.read_block), the prefill's
    activation layout (SamplingParams.prefill_pin_rows), the decode step's attention
    kernel (SamplingParams.decode_kernel) and how many consecutive rows of a fresh
    generation share each prompt's cache (``group``: SamplingParams.shared_prompts, read off
    the prompts by ``models.prompt_sharing.prompt_group``; 1, none)."""

    max_new: int
    temperature: float
    top_p: float
    mesh: Mesh | None = None
    cache_dtype: str = "float32"
    read_block: int = 128
    prefill_pin_rows: bool = True
    decode_kernel: str = "xla"
    group: int = 1

    @staticmethod
    def of(sampling: SamplingParams, mesh: Mesh | None = None) -> DecodeSettings:
        return DecodeSettings(sampling.max_new_tokens, float(sampling.temperature),
                              float(sampling.top_p), mesh, sampling.kv_cache_dtype,
                              sampling.read_block, sampling.prefill_pin_rows,
                              sampling.decode_kernel)

    @staticmethod
    def fresh(sampling: SamplingParams, mesh: Mesh | None, rows: Any) -> DecodeSettings:
        """The settings of a fresh generation whose prompt batch has ``rows`` (host), the
        group read off them where ``sampling`` shares prompts."""
        group = prompt_group(rows) if sampling.shared_prompts else 1
        return dataclasses.replace(DecodeSettings.of(sampling, mesh), group=group)


def host_arrays(*arrays: np.ndarray) -> tuple[jax.Array, ...]:
    """Host arrays for the fields of a value the programs receive as device arrays (typed as
    those: ``place_rows`` puts them on the devices before any program reads them)."""
    return cast(tuple[jax.Array, ...], arrays)


class Stopping(NamedTuple):
    """What ends each row, and what a finished row writes: built on the host
    (:func:`stopping_tables`, :func:`host_arrays`), placed on the devices (``place_rows``)."""

    max_new_per_row: jax.Array  # [B] token budget; 0 (padding rows) is done at once
    eos_ids: jax.Array          # [E] (-1 alone when no token ends a row)
    stop_next: jax.Array        # [S,V] stop-string automaton: next state (models.stops)
    stop_hit: jax.Array         # [S,V] True where the token completes a stop string
    pad_id: jax.Array           # [] the token written after a row has ended


class Frontier(NamedTuple):
    """Where each row's sequence ends, on device: what a decode loop starts from and what it
    leaves for the next one."""

    # per layer (see unstack_layers); a dense cache's valid marks real tokens, a paged
    # cache's rows hold next_slot tokens from slot 0 (models.paged_cache)
    cache: KVCache | PagedCache
    logits: jax.Array       # [B,V] next-token logits after the row's last real token
    n_tokens: jax.Array     # [B] real tokens so far: the next token's RoPE position
    stop_state: jax.Array   # [B] stop-string automaton state (0 = nothing matched yet)
    next_slot: jax.Array    # [B] the cache slot the row's next token goes to
    # the prompts that groups of consecutive rows share before their cache
    # (models.prompt_sharing), [B/G, ...]; None: each row's cache holds its prompt
    prompt: KVCache | None = None


class DecodeLoop(NamedTuple):
    """The decode ``while_loop``'s carry."""

    step: jax.Array         # [] steps taken; step t writes cache slot first_slot + t
    key: jax.Array          # fixed: step t samples with fold_in(key, t)
    tokens: jax.Array       # [B,N] sampled tokens, pad_id once a row has ended
    logprobs: jax.Array     # [B,N] their log-probabilities (0 once ended)
    lengths: jax.Array      # [B] tokens sampled, including the one that ended the row
    finish: jax.Array       # [B] index into FINISH_REASONS
    done: jax.Array         # [B] the row has ended
    cache: KVCache | PagedCache
    logits: jax.Array       # [B,V] next-token logits (an ended row keeps its own)
    stop_state: jax.Array   # [B]


class Decoded(NamedTuple):
    """A decode loop's result: tokens and logprobs [B,N] valid up to lengths [B], finish [B]
    (indices into FINISH_REASONS), and the frontier a continuation starts from."""

    tokens: jax.Array
    logprobs: jax.Array
    lengths: jax.Array
    finish: jax.Array
    frontier: Frontier


class PromptBatch(NamedTuple):
    """The distinct prompts of a generation, left padded, and which one each row samples:
    built on the host (:func:`host_arrays`), placed on the devices (``place_rows``)."""

    tokens: jax.Array  # [P,T]
    mask: jax.Array    # [P,T] real tokens
    rows: jax.Array    # [B] output row b continues distinct prompt rows[b]


def row_logits(cfg: ModelConfig, params: Params, x: jax.Array, mesh: Mesh | None) -> jax.Array:
    """The logits [B,V] (float32) the sampler draws the next tokens from, for the rows'
    last hidden states ``x`` [B,D], rows sharded over the mesh's batch axes.

    Over a mesh whose weights are split (``fsdp``, ``tensor``) each device computes the
    logits of its ``data`` shard's rows for its own slice of the vocabulary
    (``models.sharding.vocab_sharding``: ``x`` gathered within the shard, B D / data values;
    the unembedding split along V, as the sampler's weights keep it), then the logits move to
    their rows (an all-to-all of B V / devices values). Left to GSPMD with FSDP weights, each
    device instead gathered the whole [D,V] unembedding for its own rows, most of a large
    model's prefill temporaries (``rl.plan``; benchmarks, "Design measurements"). Each logit
    is the same full-D contraction either way. A
    vocabulary no weight axis divides keeps that gather."""
    vocab = None if mesh is None else vocab_sharding(mesh, unembedding(cfg, params).shape[1])
    if mesh is None or vocab is None:
        return unembed(cfg, params, x)
    data = dividing_axes(dict(mesh.shape), x.shape[0], ("data",))
    rows = data[0] if data else None
    params = {"unembed": jax.lax.with_sharding_constraint(unembedding(cfg, params), vocab)}
    x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec(rows, None)))
    logits = jax.lax.with_sharding_constraint(
        unembed(cfg, params, x), NamedSharding(mesh, PartitionSpec(rows, vocab.spec[1])))
    return constrain_rows(logits, mesh)


def decode_loop(cfg: ModelConfig, params: Params, start: Frontier, first_slot: int | None,
                key: jax.Array, stopping: Stopping, settings: DecodeSettings) -> Decoded:
    """The decode loop shared by a fresh generation and a continued one.

    params are per layer (see unstack_layers), as is the cache. ``first_slot``: the first
    free cache slot, the same for every row (a fresh generation: all rows write step t's
    token at slot first_slot + t, one dense write); None: each row writes from its own
    ``start.next_slot`` on (a continuation in place, ``models.continuation``). Every sampled
    token is written to the cache while its row is still running, so the returned frontier
    describes each row's whole sequence and can be continued. With ``settings.mesh``, the
    loop's carry stays sharded along its rows (``models.sharding.row_shardings``)."""
    b, n, mesh = start.logits.shape[0], settings.max_new, settings.mesh
    first = start.next_slot if first_slot is None else first_slot
    init = constrain_rows(DecodeLoop(
        step=jnp.zeros((), jnp.int32), key=key,
        tokens=jnp.full((b, n), stopping.pad_id, jnp.int32),
        logprobs=jnp.zeros((b, n), jnp.float32), lengths=jnp.zeros((b,), jnp.int32),
        finish=jnp.zeros((b,), jnp.int32), done=stopping.max_new_per_row <= 0,
        cache=start.cache, logits=start.logits, stop_state=start.stop_state), mesh)

    logp_scale = settings.temperature or 1.0  # the sampled distribution's temperature

    running = lambda s: (s.step < n) & ~jnp.all(s.done)  # noqa: E731
    # the last cache slot the next step writes
    writing_at = lambda s: jnp.max(first + (s.lengths if first_slot is None else s.step))  # noqa: E731

    def step(s: DecodeLoop, extent: int) -> DecodeLoop:
        tok = _sample(s.logits, jax.random.fold_in(s.key, s.step), settings.temperature,
                      settings.top_p)
        logp = jnp.take_along_axis(jax.nn.log_softmax(s.logits / logp_scale, axis=-1),
                                   tok[:, None], axis=-1)[:, 0]
        tok, logp = jnp.where(s.done, stopping.pad_id, tok), jnp.where(s.done, 0.0, logp)
        hit = stopping.stop_hit[s.stop_state, tok]
        is_eos = jnp.any(tok[:, None] == stopping.eos_ids[None, :], axis=-1)
        at_limit = s.step + 1 >= stopping.max_new_per_row
        reason = jnp.where(is_eos, 1, jnp.where(hit, 2, 0))
        newly_done = ~s.done & (is_eos | hit | at_limit)
        # finished rows feed padding that the cache marks invalid (per row: at their next
        # free slot, which stays free), and keep their logits
        hidden, cache = forward_cached(
            cfg, params, tok[:, None], ~s.done[:, None],
            positions=(start.n_tokens + s.step)[:, None], cache=s.cache,
            cache_index=first + (s.lengths if first_slot is None else s.step),
            placement=Placement(mesh, extent=extent, decode_kernel=settings.decode_kernel,
                                prompt=start.prompt))
        return constrain_rows(DecodeLoop(
            step=s.step + 1, key=s.key,
            tokens=s.tokens.at[:, s.step].set(tok), logprobs=s.logprobs.at[:, s.step].set(logp),
            lengths=jnp.where(s.done, s.lengths, s.step + 1),
            finish=jnp.where(newly_done, reason, s.finish), done=s.done | newly_done, cache=cache,
            logits=jnp.where(s.done[:, None], s.logits,
                             row_logits(cfg, params, hidden[:, 0], mesh)),
            stop_state=jnp.where(s.done, s.stop_state,
                                 stopping.stop_next[s.stop_state, tok])), mesh)

    s = while_in_extents(_loop_extents(start.cache.slots, first_slot, settings), writing_at,
                         running, step, init)
    return Decoded(s.tokens, s.logprobs, s.lengths, s.finish,
                   Frontier(s.cache, s.logits, start.n_tokens + s.lengths, s.stop_state,
                            first + s.lengths, start.prompt))


def _loop_extents(slots: int, first_slot: int | None,
                  settings: DecodeSettings) -> tuple[int, ...]:
    """The cache extents a decode loop runs one loop each for (``models.transformer.
    decode_extents``), or the whole cache alone where a kernel reads each row's own slots."""
    if reads_own_slots(settings.decode_kernel):
        return (slots,)
    return decode_extents(slots, first_slot or 0, platform_of(settings.mesh))


_STATIC = ("cfg", "settings")


def _take_rows(x: jax.Array, rows: jax.Array) -> jax.Array:
    """Rows of `x` by index: ``rows`` [B] indexes all of x's rows; ``rows`` [S,B/S] (under a
    mesh: S data-parallel shards) indexes, for shard s, the s-th of S equal blocks of x's
    rows, so that under jit each shard gathers from its own rows only (a batched gather,
    partitioned along S without moving rows between devices)."""
    if rows.ndim == 1:
        return x[rows]
    blocks = x.reshape(rows.shape[0], -1, *x.shape[1:])
    return jax.vmap(lambda block, r: block[r])(blocks, rows).reshape(-1, *x.shape[1:])


@functools.partial(jax.jit, static_argnames=(*_STATIC, "cache_len"))
def _generate(cfg: ModelConfig, params: Params, prompts: PromptBatch, key: jax.Array,
              stopping: Stopping, *, settings: DecodeSettings, cache_len: int) -> Decoded:
    params = unstack_layers(params)  # a no-op for decode_params
    start = prefill(cfg, params, prompts, cache_len, settings)
    return decode_loop(cfg, params, start, first_slot(prompts.tokens.shape[1], settings),
                       key, stopping, settings)


def first_slot(width: int, settings: DecodeSettings) -> int | None:
    """The cache slot a fresh generation's first new token goes to: after its prompts,
    ``width`` slots, or, with a prompt shared by each group of ``settings.group`` > 1 rows,
    the rows' first (their cache holds what they generate); None, each row's own (a paged
    cache: after the row's prompt, ``models.paged_cache``)."""
    if is_paged(settings.decode_kernel):
        return None
    return 0 if settings.group > 1 else width


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One of the sampler's jitted programs with what it is called on:
    ``fn(cfg, *args, **static)``, the arrays ``args`` on the devices or, for a plan, as
    ``jax.ShapeDtypeStruct`` laid out over a mesh. ``rl.plan`` compiles these to read their
    memory on a slice it does not hold; a continuation compiles its own ahead of time."""

    name: str
    fn: Any
    cfg: ModelConfig
    args: tuple[Any, ...]
    static: Mapping[str, Any]

    def lower(self) -> Any:
        """The program lowered for its arguments (``.compile()`` compiles it)."""
        return self.fn.lower(self.cfg, *self.args, **self.static)


@functools.partial(jax.jit, static_argnames=(*_STATIC, "cache_len"))
def _prefill(cfg: ModelConfig, params: Params, prompts: PromptBatch, *, cache_len: int,
             settings: DecodeSettings) -> Frontier:
    """:func:`prefill` as a program of its own, with ``settings``' cache dtype and layout."""
    return prefill(cfg, params, prompts, cache_len, settings)


@functools.partial(jax.jit, static_argnames=("cfg", "first_slot", "settings"),
                   donate_argnames="start")
def _decode(cfg: ModelConfig, params: Params, start: Frontier, key: jax.Array,
            stopping: Stopping, *, first_slot: int | None, settings: DecodeSettings) -> Decoded:
    """The decode loop as a program of its own, the prefilled frontier donated (in
    ``_generate``'s one program the loop takes over the prefilled cache: one copy)."""
    return decode_loop(cfg, params, start, first_slot, key, stopping, settings)


def generation_kernels(cfg: ModelConfig, params: Params, prompts: Sequence[Sequence[int]],
                       sampling: SamplingParams, mesh: Mesh | None = None,
                       tokenizer: Tokenizer | None = None) -> tuple[Kernel, Kernel]:
    """The prefill and the decode loop of :func:`generate` on these `prompts` (which runs the
    two as one program), apart and on abstract arguments: the prompts laid out as
    ``generate`` lays them out (:func:`prompt_batch`), the frontier the prefill leaves on
    the rows' shardings, `params` as given (e.g. abstract sharded weights). Without a
    tokenizer the stopping tables are :func:`stopping_tables`' shapes-only ones."""
    batch, limits = prompt_batch(prompts, sampling, 0 if tokenizer is None
                                 else tokenizer.pad_id, mesh)
    settings = DecodeSettings.fresh(sampling, mesh, batch.rows)
    batch = place_rows(batch, mesh, abstract=True)
    width = batch.tokens.shape[1]
    pre = Kernel("prefill", _prefill, cfg, (params, batch),
                 {"cache_len": cache_length(width, sampling), "settings": settings})
    front = jax.eval_shape(lambda p, b: _prefill(cfg, p, b, **pre.static), params, batch)
    key = place_replicated(jax.eval_shape(lambda: jax.random.key(0)), mesh, abstract=True)
    stopping = placed_stopping(stopping_tables(cfg, tokenizer, sampling, limits), mesh,
                               abstract=True)
    dec = Kernel("decode", _decode, cfg, (params, place_rows(front, mesh, abstract=True), key,
                                          stopping),
                 {"first_slot": first_slot(width, settings), "settings": settings})
    return pre, dec


def prefill(cfg: ModelConfig, params: Params, prompts: PromptBatch, cache_len: int,
            settings: DecodeSettings | None = None) -> Frontier:
    """Prefill each distinct prompt once (GRPO samples a group per prompt) into a cache of
    the prompt's slots stored in ``settings.cache_dtype`` (every write casts to it; by
    default :class:`DecodeSettings`' defaults, one device), then give every row a copy of
    its prompt's cache, padded with empty slots to `cache_len`: the frontier the
    decode loop starts from (the first half of a fresh generation; ``rl.plan`` compiles the
    two halves apart). The distinct prompts' cache holds only their own slots: at
    `cache_len` slots it would be a fifth of the rows' cache again (groups of 5) while both
    are live (for a large model on a pod slice, gigabytes per chip: the benchmarks page).
    With ``prompts.rows`` [S,B/S] (a mesh's S shards, see :func:`_take_rows`) every shard's
    rows copy from the shard's own prompts.

    ``settings.prefill_pin_rows``: the prompts' activations pinned to the mesh's batch axes
    after every layer (each device computes its own prompts, gathering each layer's
    FSDP-sharded weights), or left to GSPMD, which tends to keep the weights sharded and
    replicate the activations. Neither is smaller for every model and slice (the benchmarks
    page), so a config picks it (``trainer.prefill_pin_rows``) and ``rl.plan`` compiles the
    config's choice. ``settings.decode_kernel``: the decode's attention kernel, whose layout
    the cache takes (``models.transformer.kv_layout``).

    ``settings.group`` > 1 (``models.prompt_sharing.prompt_group`` of ``prompts.rows``): each
    group of that many consecutive rows shares its prompt's cache instead (the frontier's
    ``prompt``), and the rows' own cache holds ``cache_len - width`` empty slots, the first
    written next. A paged decode kernel: each row's copy moves into pages
    (``models.paged_cache.prompt_pages``), or, ``settings.group`` > 1, the group's rows
    share their prompt's full pages (``models.paged_cache.shared_prompt_pages``)."""
    s = settings or DecodeSettings(1, 0.0, 1.0)
    mesh, pin_rows, decode_kernel = s.mesh, s.prefill_pin_rows, s.decode_kernel
    params = unstack_layers(params)
    rows, width = prompts.rows, prompts.tokens.shape[1]
    layout = kv_layout(mesh, decode_kernel)
    cache = constrain_rows(KVCache.zeros(cfg, prompts.tokens.shape[0], width,
                                         jnp.dtype(s.cache_dtype), layout), mesh)
    hidden, cache = forward_with_cache(cfg, params, prompts.tokens, prompts.mask, cache=cache,
                                       cache_index=0,  # an empty cache: the prompts only
                                       placement=Placement(mesh, pin_rows, extent=0,
                                                           decode_kernel=decode_kernel))
    lengths = _take_rows(jnp.sum(prompts.mask, axis=1).astype(jnp.int32), rows)
    cache, shared = _rows_cache_of(cfg, cache, rows, cache_len, s)
    # each prompt's last token: the last column, or, right padded (paged), its own
    ends = hidden[:, -1] if not is_paged(decode_kernel) else jnp.take_along_axis(
        hidden, (jnp.sum(prompts.mask, axis=1) - 1)[:, None, None], axis=1)[:, 0]
    last = ends[rows] if rows.ndim == 1 else _take_rows(ends, rows)
    return constrain_rows(Frontier(
        cache, logits=row_logits(cfg, params, last, mesh),
        n_tokens=lengths, stop_state=jnp.zeros((rows.size,), jnp.int32),
        next_slot=jnp.full((rows.size,), first_slot(width, s) or 0, jnp.int32) + (
            lengths if is_paged(decode_kernel) else 0),
        prompt=shared), mesh)


def _rows_cache_of(cfg: ModelConfig, prompts: KVCache, rows: jax.Array, cache_len: int,
                   settings: DecodeSettings) -> tuple[KVCache | PagedCache, KVCache | None]:
    """(the rows' cache of `cache_len` slots, the prompts their groups share or None) from
    the distinct ``prompts``' prefilled cache, as :func:`prefill` lays them out: pages
    holding each row's prompt (a paged kernel), the groups' prompts and the rows' empty
    slots (``settings.group`` > 1), or each row a copy of its prompt's, empty slots after."""
    width, dtype = prompts.slots, prompts.k[0].dtype
    layout = kv_layout(settings.mesh, settings.decode_kernel)
    if is_paged(settings.decode_kernel):
        if settings.group > 1:
            grouped = grouped_prompts(prompts, rows, settings.group)
            return shared_prompt_pages(grouped.k, grouped.v, jnp.sum(grouped.valid, axis=1),
                                       settings.group, cache_len, settings.mesh), None
        taken: KVCache = jax.tree.map(lambda x: _take_rows(x, rows), prompts)
        return prompt_pages(taken.k, taken.v, cache_len, settings.mesh), None
    if settings.group > 1:
        return (KVCache.zeros(cfg, rows.size, cache_len - width, dtype, layout),
                grouped_prompts(prompts, rows, settings.group))

    def grown(x: jax.Array, axis: int) -> jax.Array:  # a row's copy, empty slots after
        pad = [(0, 0)] * x.ndim
        pad[axis] = (0, max(cache_len - width, 0))
        return jnp.pad(_take_rows(x, rows), pad)

    key_axis, value_axis = slot_axes(layout)
    return KVCache(tuple(grown(k, key_axis) for k in prompts.k),
                   tuple(grown(v, value_axis) for v in prompts.v), grown(prompts.valid, 1)), None


@dataclasses.dataclass(frozen=True)
class DecodeState:
    """Where the rows of a generation stopped, kept on device so that
    ``models.continuation.continue_generation`` can extend them in place without re-reading
    their context: the KV cache, per layer (``cache.valid`` marks real tokens), the
    next-token logits after each row's last real token, and, on the host (they size the next
    call), each row's count of real tokens (``n_tokens``: the next RoPE position) and its
    next free cache slot (``next_slot``). ``stop_state`` is each row's stop-string automaton
    state for the strings ``stops``, so a row continued without new tokens still catches a
    stop string that straddles the two calls.

    The arrays hold the sampler's device rows; with a ``mesh`` (the one the generation ran
    on, and its continuations run on) in equal blocks, one per data-parallel shard (which
    holds their cache). ``layout[i]`` is the device row of the generation's output row i
    (None: row i is device row i). ``decode_kernel``: the generation's
    (``SamplingParams.decode_kernel``), which set its cache's layout.

    ``prompt``: the prompts that groups of consecutive rows share
    (``SamplingParams.shared_prompts``), the rows' ``cache`` holding what they generated
    after them; slots (``next_slot``, ``capacity``) count from the prompt's first, as in the
    one cache per row a continuation joins them into (:meth:`frontier`). ``row_slots``: each
    device row's slots where they differ (a paged cache whose groups share their prompts'
    pages, ``models.paged_cache.shared_row_slots``); None, ``capacity`` each."""

    cache: KVCache | PagedCache
    logits: jax.Array
    n_tokens: np.ndarray
    next_slot: np.ndarray
    stop_state: np.ndarray | None = None
    stops: tuple[str, ...] = ()
    layout: np.ndarray | None = None
    mesh: Mesh | None = None
    decode_kernel: str = "xla"
    prompt: KVCache | None = None
    row_slots: np.ndarray | None = None

    @property
    def rows(self) -> int:
        """How many output rows a continuation may index."""
        return len(self.n_tokens) if self.layout is None else len(self.layout)

    @property
    def capacity(self) -> int:
        """Cache slots per row (its prompt's, shared or not, and its own)."""
        shared = 0 if self.prompt is None else self.prompt.valid.shape[1]
        return self.cache.slots + shared

    def capacities(self, device_rows: np.ndarray) -> np.ndarray:
        """Cache slots of each of `device_rows`: :attr:`capacity`, or, where a group's rows
        share their prompt's pages, each row's own (``row_slots``)."""
        if self.row_slots is None:
            return np.full(len(device_rows), self.capacity)
        return np.asarray(self.row_slots)[device_rows]

    def device_rows(self, rows: Sequence[int]) -> np.ndarray:
        """The device rows of output rows `rows`."""
        index = np.asarray(rows, np.int32)
        return index if self.layout is None else np.asarray(self.layout)[index]

    def frontier(self) -> Frontier:
        """This state as the jitted continuation reads it: one cache per row (a shared
        prompt copied into each of its rows' own: ``models.prompt_sharing.rows_cache``)."""
        stop_state = (np.zeros(len(self.n_tokens), np.int32) if self.stop_state is None
                      else self.stop_state)
        host = (np.asarray(self.n_tokens, np.int32), np.asarray(stop_state, np.int32),
                np.asarray(self.next_slot, np.int32))
        n_tokens, stop_state, next_slot = place_rows(host, self.mesh)
        if self.mesh is None and getattr(self.logits, "committed", False):
            # committed to the device like the cache and logits (a program's outputs, when the
            # weights are placed): a decode bucket compiled for this frontier is the one a
            # frontier out of the read or the cache's growth uses (JAX compiles again for an
            # argument committed where it was not)
            n_tokens, stop_state, next_slot = jax.device_put(
                (n_tokens, stop_state, next_slot), self.logits.sharding)
        cache = self.cache
        if self.prompt is not None:
            cache = _rows_cache(self.prompt, cache, kv_layout(self.mesh, self.decode_kernel),
                                self.mesh)
        return Frontier(cache, self.logits, n_tokens, stop_state, next_slot)


@functools.partial(jax.jit, static_argnames=("layout", "mesh"))
def _rows_cache(prompt: KVCache, own: KVCache, layout: str, mesh: Mesh | None) -> KVCache:
    """``models.prompt_sharing.rows_cache``, the result on the rows' shardings."""
    return constrain_rows(rows_cache(prompt, own, layout), mesh)


def stopping_tables(cfg: ModelConfig, tokenizer: Tokenizer | None, sampling: SamplingParams,
                    max_new_per_row: np.ndarray) -> Stopping:
    """What ends each row, as host arrays: the rows' token budgets, the EOS ids and the
    stop-string automaton's tables. Without a tokenizer (a plan, shapes only): no EOS, no
    stop strings, padding id 0."""
    if sampling.stop and tokenizer is not None:
        stop_next, stop_hit = stop_tables(tokenizer.token_bytes, sampling.stop)
    else:
        stop_next = np.zeros((1, cfg.vocab_size), np.int32)
        stop_hit = np.zeros((1, cfg.vocab_size), bool)
    eos_ids = () if sampling.ignore_eos or tokenizer is None else (tokenizer.eos_ids
                                                                  or cfg.eos_token_ids)
    return Stopping(*host_arrays(
        np.asarray(max_new_per_row, np.int32), np.asarray(tuple(eos_ids) or (-1,), np.int32),
        stop_next, stop_hit, np.asarray(0 if tokenizer is None else tokenizer.pad_id, np.int32)))


def placed_stopping(stopping: Stopping, mesh: Mesh | None,
                    abstract: bool = False) -> Stopping:
    """Host stopping tables on the devices (or abstract): the budgets along the rows, the
    tables whole on every device."""
    return Stopping(place_rows(stopping.max_new_per_row, mesh, abstract),
                    *place_replicated(tuple(stopping[1:]), mesh, abstract))


def _canonical(stops: Sequence[str]) -> tuple[str, ...]:
    """The stop set as the automaton sees it (its states are numbered for this set)."""
    return tuple(sorted({s for s in stops if s}))


def _limits(n_rows: int, sampling: SamplingParams,
            max_new_per_row: Sequence[int] | None) -> np.ndarray:
    limits = np.full(n_rows, sampling.max_new_tokens, np.int32)
    if max_new_per_row is not None:
        limits = np.minimum(np.asarray(max_new_per_row, np.int32), sampling.max_new_tokens)
    return limits


def _key(seed: int | jax.Array) -> jax.Array:
    return jax.random.key(seed) if isinstance(seed, int) else seed


def _result(tokenizer: Tokenizer, decoded: Decoded, n_rows: int, sampling: SamplingParams,
            order: np.ndarray | None = None, mesh: Mesh | None = None,
            layout: np.ndarray | None = None, row_slots: np.ndarray | None = None
            ) -> Generation:
    """The host's copy of a decode (output row i is the decode's row ``order[i]``, default
    i) and the state a continuation starts from (left on device; output row i is its device
    row ``layout[i]``, default ``order[i]``; ``row_slots``: its device rows' slots where they
    differ), by ``sampling``'s decode_text, stop strings and decode kernel."""
    front = decoded.frontier
    shared = 0 if front.prompt is None else front.prompt.valid.shape[1]  # slots before
    out, logp, length, finish, n_host, stop_host, slot_host = host_copy(
        (decoded.tokens, decoded.logprobs, decoded.lengths, decoded.finish, front.n_tokens,
         front.stop_state, front.next_slot))
    pick = (lambda a: a[:n_rows]) if order is None else (lambda a: a[order])  # noqa: E731
    out, logp, length, finish = pick(out), pick(logp), pick(length), pick(finish)
    lists = [row[:k].tolist() for row, k in zip(out, length)]
    texts = tuple(tokenizer.decode_batch(lists)) if sampling.decode_text else ()
    return Generation(tokens=np.asarray(out), logprobs=np.asarray(logp),
                      lengths=np.asarray(length),
                      finish=tuple(FINISH_REASONS[int(f)] for f in finish), texts=texts,
                      state=DecodeState(front.cache, front.logits, np.asarray(n_host),
                                        np.asarray(slot_host) + shared, np.asarray(stop_host),
                                        _canonical(sampling.stop),
                                        order if layout is None else layout, mesh,
                                        sampling.decode_kernel, front.prompt, row_slots))


def generate(cfg: ModelConfig, params: Params, tokenizer: Tokenizer,
             prompts: Sequence[Sequence[int]], sampling: SamplingParams = SamplingParams(),
             seed: int | jax.Array = 0, max_new_per_row: Sequence[int] | None = None,
             mesh: Mesh | None = None) -> Generation:
    """Sample continuations of token-id prompts (apply chat templates beforehand).

    Generation of a row ends at an EOS token (the tokenizer's; none with
    ``sampling.ignore_eos``), right after the token that completes a stop string, or after
    `max_new_per_row[b]` (default `sampling.max_new_tokens`) tokens. Same seed and inputs give
    the same samples. The result's ``state`` lets ``models.continuation.continue_generation``
    extend the rows later.

    The KV cache's shape: ``sampling.capacity`` and ``sampling.prompt_bucket``; a group's
    rows share their prompt's with ``sampling.shared_prompts``.

    With a ``mesh`` the rows are data-parallel (:func:`_sharded_prompts`): prompts, KV cache
    and outputs sharded along the rows over the mesh's data axes, the weights as they come
    (``models.sharding.decode_param_shardings``); greedy results equal the mesh-less ones.
    """
    batch, limits = prompt_batch(prompts, sampling, tokenizer.pad_id, mesh, max_new_per_row)
    settings = DecodeSettings.fresh(sampling, mesh, batch.rows)
    cache_len = cache_length(batch.tokens.shape[1], sampling)
    row_slots = _row_slots(batch, settings, cache_len)
    batch = place_rows(batch, mesh)
    stopping = placed_stopping(stopping_tables(cfg, tokenizer, sampling, limits), mesh)
    decoded = _generate(cfg, params, batch, _key(seed), stopping, settings=settings,
                        cache_len=cache_len)
    order = None if mesh is None else np.arange(len(prompts))  # the padding rows: not rows
    return _result(tokenizer, decoded, len(prompts), sampling, order, mesh,
                   row_slots=row_slots)


def _row_slots(batch: PromptBatch, settings: DecodeSettings,
               cache_len: int) -> np.ndarray | None:
    """Each device row's cache slots where they differ (a paged cache whose groups share
    their prompts' pages: ``models.paged_cache.shared_row_slots``), else None; from the
    host's prompt batch (``rows`` [B] or [S, B/S], each shard indexing its own prompts)."""
    if not (is_paged(settings.decode_kernel) and settings.group > 1):
        return None
    rows = np.asarray(batch.rows).reshape(-1, np.shape(batch.rows)[-1])
    lengths = np.asarray(batch.mask).sum(axis=1).reshape(rows.shape[0], -1)
    return shared_row_slots(np.take_along_axis(lengths, rows, axis=1).reshape(-1),
                            batch.tokens.shape[1], cache_len)


def cache_length(width: int, sampling: SamplingParams) -> int:
    """A fresh generation's KV cache slots: its prompts' `width`, then ``sampling.capacity``
    slots, at least the new tokens rounded up to 16."""
    return width + max(round_up(sampling.max_new_tokens, 16), sampling.capacity)


def prompt_batch(prompts: Sequence[Sequence[int]], sampling: SamplingParams, pad_id: int,
                 mesh: Mesh | None = None, max_new_per_row: Sequence[int] | None = None
                 ) -> tuple[PromptBatch, np.ndarray]:
    """The rows' distinct prompts as a prefill takes them (host arrays) and the rows' token
    budgets. Without a mesh each distinct prompt once (``models.padding.
    prompt_count_bucket`` of them: filler rows repeat the first, no row reads them); over a
    mesh each data-parallel shard its own (:func:`_sharded_prompts`). Left padded; right
    padded for a paged cache (its rows start at slot 0: ``models.paged_cache``)."""
    limits = _limits(len(prompts), sampling, max_new_per_row)
    right = is_paged(sampling.decode_kernel)
    if mesh is not None:
        return _sharded_prompts(prompts, limits, batch_shards(mesh), pad_id,
                                sampling.prompt_bucket, right)
    distinct: dict[tuple[int, ...], int] = {}
    rows = np.asarray([distinct.setdefault(tuple(p), len(distinct)) for p in prompts],
                      np.int32)
    firsts = [list(p) for p in distinct]
    firsts += [firsts[0]] * (prompt_count_bucket(len(firsts)) - len(firsts))
    tokens, mask = (right_pad if right else left_pad)(firsts, pad_id, sampling.prompt_bucket)
    return PromptBatch(*host_arrays(tokens, mask, rows)), limits


def _sharded_prompts(prompts: Sequence[Sequence[int]], limits: np.ndarray, shards: int,
                     pad_id: int, bucket: int = 16,
                     right: bool = False) -> tuple[PromptBatch, np.ndarray]:
    """The rows laid out for `shards` data-parallel shards: rows cut in order into shards
    blocks of ceil(B/shards) (padding rows at the end: token budget 0, so done before they
    start, copying their shard's first prompt; they never reach the output). Each shard
    prefills its own distinct prompts (all shards as many,
    ``models.padding.prompt_count_bucket`` of the longest list: a shorter list repeats its
    first), so prompts [shards*P, T] and ``rows`` [shards, B/shards] index within the shard. Returns
    the batch (host arrays) and the padded token budgets."""
    per = -(-len(prompts) // shards)
    rows = np.zeros((shards, per), np.int32)
    lists: list[list[tuple[int, ...]]] = []
    for s in range(shards):
        distinct: dict[tuple[int, ...], int] = {}
        for j, p in enumerate(prompts[s * per:(s + 1) * per]):
            rows[s, j] = distinct.setdefault(tuple(p), len(distinct))
        lists.append(list(distinct) or [tuple(prompts[0])])
    width = prompt_count_bucket(max(len(ps) for ps in lists))
    tokens, mask = (right_pad if right else left_pad)(
        [ps[k] if k < len(ps) else ps[0] for ps in lists for k in range(width)], pad_id, bucket)
    padded = np.zeros(shards * per, np.int32)
    padded[:len(limits)] = limits
    return PromptBatch(*host_arrays(tokens, mask, rows)), padded
