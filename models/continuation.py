"""Continuing generations in place: a multi-turn rollout on one KV cache of fixed shape.

A generation's state (``models.sampler.DecodeState``) holds one cache row per device row, at
the capacity its ``generate`` call reserved. A continuation extends chosen rows of it: each
reads its appended tokens (a tool's observation, possibly none) and then samples, both
written at the row's own next free slot (``DecodeState.next_slot``), in place. Nothing is
compacted or re-laid out, so a rollout's programs keep one shape from its first chunk to its
last:

    read    the rows with appended tokens read them (``read_in_place``, compiled by
            ``read_program`` for the platform): in groups of :func:`read_group` rows, as
            many groups as there are readers (a loop with its trip count set at run time),
            each gathered from the cache, its tokens read in blocks of
            ``SamplingParams.read_block`` and the rest in blocks of 32 (as many as the
            group's longest line needs), scattered back
    decode  the continued rows sample (``decode_in_place``): a sub-batch gathered, the
            decode loop, scattered back; for a bucket of every row, the whole cache in place

A decode's sub-batch comes in a few sizes per data-parallel shard (:func:`row_buckets`:
ceil(P/4), ceil(P/2) and P, for P device rows per shard), so a chunk costs about what its
rows cost; a read's groups make it cost about its readers in one program. Each program
donates the cache it updates. The programs of one rollout shape (cache rows and slots, line
width, sampling settings) are therefore at most ``len(row_buckets(P)) + 1``;
``Continuation.compile_buckets`` compiles them all at the first chunk so that no later
chunk, nor a later step with the same shapes, compiles.

A row's real tokens are contiguous from its prompt on; slots past them are empty (invalid).
The attention reads the cache's used prefix only (``models.transformer.while_in_extents``),
so the capacity reserved up front costs memory, not time.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from models.config import ModelConfig
from models.padding import round_up
from models.paged_cache import PagedCache, SharedPrompts, forward_cached, widened
from models.sampler import (
    Decoded,
    DecodeSettings,
    DecodeState,
    Frontier,
    Generation,
    Kernel,
    SamplingParams,
    _canonical,
    _key,
    _limits,
    _result,
    _take_rows,
    decode_loop,
    placed_stopping,
    row_logits,
    stopping_tables,
)
from models.sharding import batch_shards, constrain_rows, place_replicated, place_rows
from models.tokenizer import Tokenizer
from models.transformer import (
    KVCache,
    Params,
    Placement,
    decode_extents,
    kv_layout,
    platform_of,
    slot_axes,
    unstack_layers,
    while_in_extents,
)


@dataclasses.dataclass(frozen=True)
class Continuation:
    """Which rows of an earlier generation to extend, in output order: output row i continues
    row ``rows[i]`` (each row at most once) after reading the tokens ``appended[i]`` (e.g. a
    tool's observation; may be empty), for at most ``max_new_per_row[i]`` new tokens
    (default: the sampling's max_new_tokens).

    ``consume``: the earlier generation's state is not used again; its cache is updated in
    place (donated) instead of copied first. ``read_width``: the width the appended lines are
    padded to (a longer line widens them, see :func:`line_width`); a rollout passes its
    longest possible observation so that every chunk reads through one program.
    ``compile_buckets``: compile the read and every row bucket's decode for this state's
    shapes now (a rollout's first continuation)."""

    rows: Sequence[int]
    appended: Sequence[Sequence[int]]
    max_new_per_row: Sequence[int] | None = None
    consume: bool = False
    read_width: int = 0
    compile_buckets: bool = False

    def __post_init__(self) -> None:
        if len(self.rows) != len(self.appended):
            raise ValueError(f"rows ({len(self.rows)}) and appended ({len(self.appended)}) "
                             "differ in length")
        if len(self.rows) == 0:
            raise ValueError("continue_generation needs at least one row")
        if len(set(self.rows)) != len(self.rows):
            raise ValueError(f"each row may be continued once per call, got {list(self.rows)}")


def line_width(longest: int, read_block: int) -> int:
    """The width of a continuation's appended lines for `longest` appended tokens: rounded up
    to 16, or to a multiple of `read_block` when longer (read in blocks)."""
    return round_up(longest, 16 if longest <= read_block else read_block) if longest else 0


def row_buckets(per_shard: int, sub_batches: bool = True) -> tuple[int, ...]:
    """The sub-batch sizes a decode chunk runs at, per shard of `per_shard` device rows:
    ceil(per_shard / 4), ceil(per_shard / 2) and per_shard, ascending (only `per_shard`
    without ``sub_batches``, see ``SamplingParams.sub_batches``). The largest is every row,
    in place (no gather); the others gather their rows' cache, so a continuation holds at
    most half the cache more than the cache itself. No bucket of three quarters: gathering
    and putting back a row's whole cache costs more than decoding it does (on the 2-core
    CPU a chunk of 12 rows of 16 gathered took as long as all 16 in place), while a decode
    step costs little more for more rows (it reads the weights), and at a quarter or a half
    of the rows the saving pays for the copy."""
    if not sub_batches:
        return (per_shard,)
    return tuple(sorted({-(-per_shard // 4), -(-per_shard // 2), per_shard}))


def row_bucket(n: int, per_shard: int, sub_batches: bool = True) -> int:
    """The smallest sub-batch of :func:`row_buckets` that holds `n` rows of one shard."""
    return next(b for b in row_buckets(per_shard, sub_batches) if b >= n)


def read_group(per_shard: int) -> int:
    """The rows a read takes at a time, per shard of `per_shard` device rows: ceil(P/8). A read
    costs about its rows' tokens (it is compute, like a prefill, at about the same rate for
    any block from 16 to 128 tokens), so its readers are not rounded up
    to a decode bucket: of 16 rows, 2 readers read as 2, not 4, and 10 as 10, not 12; and a
    group's copy of the cache is an eighth of it. The price: every row's read is 8 passes
    over the weights, not 1 (on an accelerator a read of few rows reads the weights for
    little compute)."""
    return -(-per_shard // 8)


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a continuation's rows sit in its sub-batch of ``size`` rows: ``index`` [S, R]
    (a read's [S, K, G], see :func:`read_layout`) the device rows, local to each of the S
    shards' blocks of P rows, that the sub-batch gathers (P, out of range, pads: gathered
    clipped, dropped on the way back), or None when every row runs in place, row for row;
    ``sub[i]`` the sub-batch row of the i-th row laid out."""

    index: np.ndarray | None
    sub: np.ndarray
    size: int


def layout_rows(device_rows: np.ndarray, n_device: int, shards: int,
                sub_batches: bool = True) -> Layout:
    """The sub-batch of :func:`row_bucket` size holding `device_rows` (rows of a cache of
    `n_device` rows in `shards` equal blocks), each in its own shard's block, in order."""
    per = n_device // shards
    size = row_bucket(int(np.bincount(device_rows // per, minlength=shards).max()), per,
                      sub_batches)
    if size == per:
        return Layout(None, device_rows.astype(np.int32), n_device)
    return _gathered(device_rows, n_device, shards, size)


def read_layout(device_rows: np.ndarray, n_device: int, shards: int,
                sub_batches: bool = True) -> Layout:
    """The readers' layout for :func:`read_in_place`: with ``sub_batches`` every shard's
    block of P rows as K = ceil(P/G) groups of G = :func:`read_group` rows, the shard's
    readers first (``index`` [S, K, G]); without, every row in place (``index`` None)."""
    per = n_device // shards
    group = read_group(per)
    if not sub_batches or group == per:
        return Layout(None, device_rows.astype(np.int32), n_device)
    layout = _gathered(device_rows, n_device, shards, round_up(per, group))
    return dataclasses.replace(layout, index=np.asarray(layout.index).reshape(shards, -1, group))


def _gathered(device_rows: np.ndarray, n_device: int, shards: int, size: int) -> Layout:
    """`device_rows` gathered into a sub-batch of `size` rows per shard (:class:`Layout`)."""
    per = n_device // shards
    index = np.full((shards, size), per, np.int32)
    sub = np.zeros(len(device_rows), np.int32)
    filled = np.zeros(shards, np.int32)
    for i, d in enumerate(device_rows):
        s = d // per
        index[s, filled[s]] = d % per
        sub[i] = s * size + filled[s]
        filled[s] += 1
    return Layout(index, sub, shards * size)


# ----------------------------------------------------------------------------- jitted kernels


def _take(tree: Any, index: jax.Array | None) -> Any:
    """The sub-batch of every row array of `tree`: for shard s, rows ``index[s]`` of its own
    block (``models.sampler._take_rows``; out-of-range padding rows clamped). Of a paged
    cache, its table's rows only (:func:`_paged_rows`)."""
    if index is None:
        return tree

    def one(x: Any) -> Any:
        return _paged_rows(x, index) if isinstance(x, PagedCache) else _take_rows(x, index)

    return jax.tree.map(one, tree, is_leaf=lambda x: isinstance(x, PagedCache))


def _paged_rows(cache: PagedCache, index: jax.Array) -> PagedCache:
    """The sub-batch ``index`` (:func:`_take`) of a paged cache: the same pools, its rows'
    page tables; a padding row's pages past its shard's block, so its writes are dropped
    (a copy of a real row's table would write over that row's slots). Its groups' shared
    prompts (:func:`_sub_prompts`) where a shard has more sub-batch rows than prompts (each
    prompt read once costs less than each row reading its own), else none: the rows read
    their prompts through their tables."""
    shards = index.shape[0] if index.ndim == 2 else 1
    per = cache.table.shape[0] // shards
    table = _take_rows(cache.table, index)
    padding = (index >= per).reshape(-1)[:, None]
    prompts = cache.prompts
    if prompts is not None:
        prompts = (_sub_prompts(prompts, index.reshape(shards, -1), per)
                   if index.size > prompts.rows.shape[0] else None)
    return cache._replace(table=jnp.where(padding, cache.k[0].shape[1] // shards, table),
                          prompts=prompts)


def _sub_prompts(prompts: SharedPrompts, index: jax.Array, per: int) -> SharedPrompts:
    """``prompts`` for the sub-batch ``index`` [S, R] (shard s: its rows ``index[s]``, of
    ``per``; padding rows ``per``): each group member's row in the sub-batch, R where it is
    not in it."""
    size = index.shape[1]

    def place(rows: jax.Array) -> jax.Array:  # [per] each row's place in the sub-batch
        return jnp.full(per, size, jnp.int32).at[rows].set(
            jnp.arange(size, dtype=jnp.int32), mode="drop")

    members = prompts.rows.reshape(index.shape[0], -1, prompts.rows.shape[1])
    placed = jax.vmap(lambda rows, m: place(rows)[m])(index, members)
    return prompts._replace(rows=placed.reshape(prompts.rows.shape))


def _put(tree: Any, index: jax.Array | None, sub: Any) -> Any:
    """`tree` with the sub-batch `sub` written back to its rows (:func:`_take`'s inverse;
    out-of-range rows dropped); a paged cache's pools are the sub-batch's, its table and
    shared prompts the whole batch's."""
    if index is None:
        return sub

    def one(x: Any, y: Any) -> Any:
        if isinstance(x, PagedCache):
            return y._replace(table=x.table, prompts=x.prompts)
        blocks = x.reshape(index.shape[0], -1, *x.shape[1:])
        rows = y.reshape(index.shape[0], -1, *y.shape[1:])
        out = jax.vmap(lambda block, at, values: block.at[at].set(values, mode="drop"))(
            blocks, index, rows)
        return out.reshape(x.shape)

    return jax.tree.map(one, tree, sub, is_leaf=lambda x: isinstance(x, PagedCache))


TAIL_BLOCK = 32  # tokens; on the 2-core CPU a 16-token block read at half the speed per token


def read_in_place(cfg: ModelConfig, params: Params, state: Frontier, readers: jax.Array | None,
                  lines: jax.Array, mask: jax.Array, *, settings: DecodeSettings) -> Frontier:
    """``state`` after its rows read their ``lines`` (right padded, ``mask`` the real tokens;
    width W a multiple of 16) at their next free slots. ``readers``: None, every row reads
    its own line in place ([B, W], an empty line reads nothing); or [S, K, G], :func:
    `read_layout`'s index in K groups of G rows per shard (the readers first, the shard's
    row count P padding), lines [S K G, W] in the same order: the groups holding readers
    are read one after the other (a loop with its trip count set at run time), each
    gathered out of the cache (:func:`_take`), read and put back, so a read costs about its
    readers' tokens whatever their number, in one program. Run it as the program
    :func:`read_program` gives for the mesh's platform."""
    params, mesh = unstack_layers(params), settings.mesh
    if readers is None:
        return constrain_rows(_read_rows(cfg, params, constrain_rows(state, mesh), lines,
                                         mask, settings), mesh)
    shards, groups, group = readers.shape
    per = state.n_tokens.shape[0] // shards
    lines = lines.reshape(shards, groups, group, lines.shape[1])
    mask = mask.reshape(lines.shape)
    reading = jnp.max(jnp.sum(readers < per, axis=(1, 2)))  # the most readers of a shard

    def one(g: jax.Array, state: Frontier) -> Frontier:
        index = readers[:, g]
        sub = _read_rows(cfg, params, constrain_rows(_take(state, index), mesh),
                         lines[:, g].reshape(shards * group, -1),
                         mask[:, g].reshape(shards * group, -1), settings)
        return constrain_rows(_put(state, index, constrain_rows(sub, mesh)), mesh)

    return jax.lax.fori_loop(0, (reading + group - 1) // group, one, state)


def _read_rows(cfg: ModelConfig, params: Params, sub: Frontier, lines: jax.Array,
               mask: jax.Array, settings: DecodeSettings) -> Frontier:
    """``sub``'s rows after reading their ``lines`` [R, W] (``mask`` the real tokens): in
    blocks of ``settings.read_block`` tokens (W when shorter), as many whole ones as the
    longest line holds, then its rest in blocks of ``TAIL_BLOCK`` (loops with trip counts
    set at run time). Each reading row's next-token logits become those after its last read
    token."""
    mesh = settings.mesh
    block = min(lines.shape[1], settings.read_block)
    read = jnp.sum(mask, axis=1, dtype=jnp.int32)  # [R]
    # room for the last tail block to overhang the lines (a slice past the end would shift)
    lines = jnp.pad(lines, ((0, 0), (0, TAIL_BLOCK)))
    mask = jnp.pad(mask, ((0, 0), (0, TAIL_BLOCK)))
    longest = jnp.max(read)
    extents = decode_extents(sub.cache.slots, most=READ_EXTENTS)
    furthest = jnp.max(sub.next_slot)  # the rows' furthest first write, once for every block

    def blocks(width: int, start: jax.Array, count: jax.Array, carry: tuple[Any, jax.Array]):
        """Read `count` blocks of `width` tokens from column `start` on, in loops of fixed
        cache extent (``models.transformer.while_in_extents``)."""
        def one(state: tuple[jax.Array, tuple[Any, jax.Array]],
                extent: int) -> tuple[jax.Array, tuple[Any, jax.Array]]:
            j, (cache, last) = state
            first = start + j * width
            tokens = jax.lax.dynamic_slice_in_dim(lines, first, width, axis=1)
            real = jax.lax.dynamic_slice_in_dim(mask, first, width, axis=1)
            positions = sub.n_tokens[:, None] + first + jnp.arange(width)
            # activations pinned to the rows (as the prefill): left to GSPMD, the read's
            # temporaries were larger than a v5e chip's HBM (benchmarks, "Design
            # measurements")
            hidden, cache = forward_cached(cfg, params, tokens, real, positions,
                                               cache=cache, cache_index=sub.next_slot + first,
                                               placement=Placement(
                                                   mesh, pin_rows=True, extent=extent,
                                                   decode_kernel=settings.decode_kernel))
            at = read - 1 - first  # the row's last token, when it is in this block
            here = (at >= 0) & (at < width)
            h = jnp.take_along_axis(hidden, jnp.clip(at, 0, width - 1)[:, None, None], axis=1)
            return j + 1, (cache, jnp.where(here[:, None], h[:, 0], last))

        def writing_to(state: tuple[jax.Array, Any]) -> jax.Array:  # the block's last slot
            return furthest + start + (state[0] + 1) * width - 1

        return while_in_extents(extents, writing_to, lambda state: state[0] < count, one,
                                (jnp.int32(0), carry))[1]

    # whole blocks, then the rest in blocks of TAIL_BLOCK: a short observation costs about
    # its own length, not a block
    tail = block > TAIL_BLOCK
    full = longest // block if tail else (longest + block - 1) // block
    carry = (sub.cache, jnp.zeros((read.shape[0], cfg.hidden_size), jnp.float32))
    carry = blocks(block, jnp.int32(0), full, carry)
    if tail:
        rest = longest - full * block
        carry = blocks(TAIL_BLOCK, full * block, (rest + TAIL_BLOCK - 1) // TAIL_BLOCK, carry)
    cache, last = carry
    logits = jnp.where(read[:, None] > 0, row_logits(cfg, params, last, mesh), sub.logits)
    return Frontier(cache, logits, sub.n_tokens + read, sub.stop_state, sub.next_slot + read)


#: A read's cache extents: each is a copy of the whole forward per block width in the read's
#: program (a decode's, of one step), and the compile time grows with the copies (the models
#: guide has the figures). A block's attention over the whole cache costs a read less than
#: that: a read is compute, and for Qwen3-4B a token's attention over 3,760 slots is a
#: quarter of its other FLOPs.
READ_EXTENTS = 2

# The TPU compiler's latency-hiding scheduler overlaps the read's layers (weight gathers,
# attention scores) into the HBM it takes to be free; it does not know of the train state
# that stays resident through the rollout. Off, for this program only (a read runs once per
# turn; the decode chunks keep it), the read's temporaries fall to a third and the rollout
# fits beside the train state (benchmarks, "Design measurements").
TPU_READ_OPTIONS = {"xla_tpu_enable_latency_hiding_scheduler": False}
_READ_PROGRAMS = {
    platform: jax.jit(read_in_place, static_argnames=("cfg", "settings"),
                      donate_argnames="state", compiler_options=options)
    for platform, options in (("default", None), ("tpu", TPU_READ_OPTIONS))}


def read_program(mesh: Mesh | None) -> Any:
    """:func:`read_in_place` jitted (the state donated) for the platform of `mesh`'s
    devices (JAX's default backend without one), with ``TPU_READ_OPTIONS`` on TPU."""
    return _READ_PROGRAMS["tpu" if platform_of(mesh) == "tpu" else "default"]


@functools.partial(jax.jit, static_argnames=("cfg", "settings"), donate_argnames="state")
def decode_in_place(cfg: ModelConfig, params: Params, state: Frontier, rows: jax.Array | None,
                    resume: jax.Array, key: jax.Array, stopping: Any, *,
                    settings: DecodeSettings) -> Decoded:
    """The decode loop on ``state``'s rows ``rows`` (see :func:`_take`), each writing from
    its own next free slot; ``resume`` [R]: the row keeps its stop-string state (else
    matching starts afresh). The result's frontier is the whole state, updated."""
    params, mesh = unstack_layers(params), settings.mesh
    sub = _take(state, rows)
    sub = constrain_rows(sub._replace(stop_state=jnp.where(resume, sub.stop_state, 0)), mesh)
    decoded = decode_loop(cfg, params, sub, None, key, stopping, settings)
    return decoded._replace(frontier=constrain_rows(_put(state, rows, decoded.frontier), mesh))


@functools.partial(jax.jit, static_argnames=("slots", "layout", "mesh"))
def _grown(state: Frontier, slots: int, layout: str, mesh: Mesh | None = None) -> Frontier:
    """``state`` with its cache (in ``layout``, ``models.transformer.kv_layout``) widened to
    `slots` slots (empty ones after; a paged cache: ``models.paged_cache.widened``)."""
    if isinstance(state.cache, PagedCache):
        return constrain_rows(state._replace(cache=widened(state.cache, slots, mesh)), mesh)

    def pad(x: jax.Array, axis: int) -> jax.Array:
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, slots - x.shape[axis])
        return jnp.pad(x, widths)

    k, v, valid = state.cache
    key_axis, value_axis = slot_axes(layout)
    return state._replace(cache=KVCache(tuple(pad(x, key_axis) for x in k),
                                        tuple(pad(x, value_axis) for x in v), pad(valid, 1)))


# ----------------------------------------------------------------------------- host side


def continue_generation(cfg: ModelConfig, params: Params, tokenizer: Tokenizer,
                        state: DecodeState, continuation: Continuation,
                        sampling: SamplingParams = SamplingParams(),  # noqa: B008 (frozen)
                        seed: int | jax.Array = 0) -> Generation:
    """Extend rows of an earlier generation without re-reading their context.

    Output row i continues row ``continuation.rows[i]`` of the generation that produced
    ``state``: its tokens ``continuation.appended[i]`` are read, then sampling proceeds as in
    ``models.sampler.generate``. The result equals ``generate`` on the concatenated token
    lists (context + generated + appended) up to float rounding, at the cost of the new
    tokens only. A row continued with nothing appended and the same stop strings resumes its
    stop matching where it was (a stop string may straddle the two calls); any other row
    starts matching afresh.

    The rows are continued in place, in the state's cache (see the module docstring); a
    state whose capacity is too small for this call is first widened (a copy, to a multiple
    of 256 slots). A state generated over a mesh is continued over it (``state.mesh``):
    every row stays on the shard that holds its cache and only the sampled tokens come to
    the host. Without ``continuation.consume`` the state's cache is copied first, so the
    state can be continued again; with it, the state's arrays are deleted.
    """
    device_rows = _checked_rows(state, continuation)
    mesh, n_device = state.mesh, len(state.n_tokens)
    sampling = dataclasses.replace(sampling, decode_kernel=state.decode_kernel)  # its cache's
    shards = 1 if mesh is None else batch_shards(mesh)
    limits = _limits(len(device_rows), sampling, continuation.max_new_per_row)
    appended = [list(a) for a in continuation.appended]
    needs = np.asarray([state.next_slot[d] + len(a) + n
                        for d, a, n in zip(device_rows, appended, limits)])
    front, row_slots = _fitted(state, device_rows, needs, continuation.consume)
    settings = DecodeSettings.of(sampling, mesh)
    width = line_width(max(continuation.read_width, *map(len, appended)), sampling.read_block)
    if continuation.compile_buckets:
        compile_buckets(cfg, params, front, width, sampling, mesh, tokenizer)
    readers = np.asarray([i for i, a in enumerate(appended) if a], np.int32)
    if len(readers):
        layout = read_layout(device_rows[readers], n_device, shards, sampling.sub_batches)
        lines, mask = _lines([appended[i] for i in readers], layout, width, tokenizer.pad_id)
        front = read_program(mesh)(cfg, params, front, *place_rows(
            (layout.index, lines, mask), mesh), settings=settings)
    layout = layout_rows(device_rows, n_device, shards, sampling.sub_batches)
    budgets = np.zeros(layout.size, np.int32)
    budgets[layout.sub] = limits
    resume = np.zeros(layout.size, bool)
    if state.stop_state is not None and state.stops == _canonical(sampling.stop):
        resume[layout.sub] = [not a for a in appended]
    index, resume = place_rows((layout.index, resume), mesh)
    stopping = placed_stopping(stopping_tables(cfg, tokenizer, sampling, budgets), mesh)
    decoded = decode_in_place(cfg, params, front, index, resume, _key(seed), stopping,
                              settings=settings)
    if continuation.consume:
        _delete(state)  # donated above; freed here where a backend could not reuse them
    return _result(tokenizer, decoded, len(device_rows), sampling, layout.sub, mesh,
                   layout=device_rows, row_slots=row_slots)


def _fitted(state: DecodeState, device_rows: np.ndarray, needs: np.ndarray,
            consume: bool) -> tuple[Frontier, np.ndarray | None]:
    """(the frontier a continuation runs on, its rows' slots where they differ) when
    `device_rows` need `needs` slots: the state's, widened (a copy, to a multiple of 256
    slots, every row as many) if a row needs more than it holds, else copied unless
    `consume`."""
    front = state.frontier()
    if (needs > state.capacities(device_rows)).any():
        front = _grown(front, round_up(int(needs.max()), 256),
                       kv_layout(state.mesh, state.decode_kernel), state.mesh)
        if consume:
            _delete(state)
        return front, None
    if not consume:
        front = _copied(front, cache=state.prompt is None)
    return front, state.row_slots


def _copied(front: Frontier, cache: bool) -> Frontier:
    """``front`` copied, for programs that update it in place (a state continued without
    ``consume`` stays as it was), its ``cache`` too unless it is a new one already (a shared
    prompt's rows': ``DecodeState.frontier``)."""
    kept = jax.tree.map(jnp.copy, front.cache) if cache else front.cache
    return Frontier(kept, *jax.tree.map(jnp.copy, tuple(front[1:])))


def _checked_rows(state: DecodeState, continuation: Continuation) -> np.ndarray:
    """The device rows of the continuation's rows, after checking they index the state."""
    rows, n = continuation.rows, state.rows
    if min(rows) < 0 or max(rows) >= n:
        raise ValueError(f"rows must index the {n} rows of the state, got {list(rows)}")
    return state.device_rows(rows)


def _delete(state: DecodeState) -> None:
    """Free a consumed state's device arrays (those not already taken over by a program)."""
    for x in jax.tree.leaves((state.cache, state.logits, state.prompt)):
        if not x.is_deleted():
            x.delete()


def _lines(appended: list[list[int]], layout: Layout, width: int,
           pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """The appended tokens as the sub-batch's right-padded lines [size, width] and mask."""
    lines = np.full((layout.size, width), pad_id, np.int32)
    mask = np.zeros((layout.size, width), bool)
    for i, ids in zip(layout.sub, appended):
        lines[i, :len(ids)] = ids
        mask[i, :len(ids)] = True
    return lines, mask


def bucket_kernel(cfg: ModelConfig, params: Params, front: Frontier, size: int,
                  sampling: SamplingParams, mesh: Mesh | None,
                  tokenizer: Tokenizer | None = None, abstract: bool = False) -> Kernel:
    """The decode program of a chunk run by `size` rows of each shard of ``front``'s rows
    (:func:`row_buckets`): "continue" when that is all of them (in place), else "part" (the
    rows gathered out of the cache). ``abstract``: on abstract arguments (``rl.plan``;
    `front` and `params` as given); without a tokenizer the stopping tables are shapes only
    (``models.sampler.stopping_tables``)."""
    shards = 1 if mesh is None else batch_shards(mesh)
    per = front.n_tokens.shape[0] // shards
    index = None if size == per else np.full((shards, size), per, np.int32)
    index, resume = place_rows((index, np.zeros(shards * size, bool)), mesh, abstract)
    stopping = placed_stopping(stopping_tables(cfg, tokenizer, sampling,
                                               np.zeros(shards * size, np.int32)),
                               mesh, abstract)
    key = (place_replicated(jax.eval_shape(lambda: jax.random.key(0)), mesh, True)
           if abstract else _key(0))
    return Kernel("continue" if size == per else "part", decode_in_place, cfg,
                  (params, front, index, resume, key, stopping),
                  {"settings": DecodeSettings.of(sampling, mesh)})


def read_kernel(cfg: ModelConfig, params: Params, front: Frontier, width: int,
                sampling: SamplingParams, mesh: Mesh | None, pad_id: int = 0,
                abstract: bool = False) -> Kernel:
    """The read program of ``front``'s rows for appended lines of `width` tokens, laid out as
    :func:`read_layout` lays out a read (every row's group, whoever reads)."""
    shards = 1 if mesh is None else batch_shards(mesh)
    layout = read_layout(np.zeros(0, np.int32), int(front.n_tokens.shape[0]), shards,
                         sampling.sub_batches)
    lines, mask = _lines([], layout, width, pad_id)
    return Kernel("read", read_program(mesh), cfg,
                  (params, front, *place_rows((layout.index, lines, mask), mesh, abstract)),
                  {"settings": DecodeSettings.of(sampling, mesh)})


def compile_buckets(cfg: ModelConfig, params: Params, front: Frontier, width: int,
                    sampling: SamplingParams, mesh: Mesh | None, tokenizer: Tokenizer) -> None:
    """Compile the read (for lines of `width`) and the decode program of every row bucket
    for ``front``'s shapes (ahead of time: nothing runs; jit keeps the executables).

    The programs are lowered here and compiled concurrently, one thread per host core at
    most: the compiler releases the GIL, and a program's compile uses about one core
    (measured: docs/benchmarks.md, search rollouts)."""
    shards = 1 if mesh is None else batch_shards(mesh)
    per = int(front.n_tokens.shape[0]) // shards
    kernels = [bucket_kernel(cfg, params, front, size, sampling, mesh, tokenizer)
               for size in row_buckets(per, sampling.sub_batches)]
    if width:
        kernels.append(read_kernel(cfg, params, front, width, sampling, mesh,
                                   tokenizer.pad_id))
    lowered = [k.lower() for k in kernels]
    workers = max(1, min(len(lowered), os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda program: program.compile(), lowered))
