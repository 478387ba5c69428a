"""Decoder-only transformer (Llama / Qwen2 / Qwen3) as pure functions over a dict of arrays.

Layer weights are stacked on a leading ``layers`` axis and the stack is run with
``jax.lax.scan``: one layer is traced and compiled once, whatever the depth, and per-layer
rematerialisation is a single ``jax.checkpoint`` around the scanned body.

Parameters are a plain dict of arrays (:func:`init_params`, or the loaders); the compute is
:func:`forward`, which is what the sampler, the train step and the sharding code use.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.layout import Layout, with_layout_constraint
from jax.sharding import PartitionSpec

from models.config import ModelConfig
from models.constraints import row_axes, shard_rows, shard_tree_rows
from models.decode_attention import bounded_attention, row_bounds
from models.quant import Quantized, dequantize

Params = dict[str, Any]
NEG_INF = -1e30  # finite, so a fully masked row (left padding) gives a uniform softmax, not NaN

LAYER_KEYS = ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up", "w_down")


def layer_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Per-layer parameter shapes (without the leading layers axis). Matmuls are x @ W."""
    d, f, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    shapes = {
        "attn_norm": (d,),
        "wq": (d, cfg.num_heads * hd),
        "wk": (d, cfg.num_kv_heads * hd),
        "wv": (d, cfg.num_kv_heads * hd),
        "wo": (cfg.num_heads * hd, d),
        "mlp_norm": (d,),
        "w_gate": (d, f),
        "w_up": (d, f),
        "w_down": (f, d),
    }
    if cfg.qkv_bias:
        shapes |= {"bq": (cfg.num_heads * hd,), "bk": (cfg.num_kv_heads * hd,),
                   "bv": (cfg.num_kv_heads * hd,)}
    if cfg.qk_norm:
        shapes |= {"q_norm": (hd,), "k_norm": (hd,)}
    return shapes


def param_shapes(cfg: ModelConfig) -> Params:
    shapes: Params = {
        "embed": (cfg.vocab_size, cfg.hidden_size),
        "layers": {k: (cfg.num_layers, *s) for k, s in layer_shapes(cfg).items()},
        "final_norm": (cfg.hidden_size,),
    }
    if not cfg.tie_embeddings:
        shapes["lm_head"] = (cfg.hidden_size, cfg.vocab_size)
    return shapes


def init_params(cfg: ModelConfig, key: jax.Array, dtype: Any = jnp.float32,
                std: float = 0.02) -> Params:
    """Random parameters (normal(0, std) matrices, unit norms, zero biases)."""
    shapes = param_shapes(cfg)
    leaves, treedef = jax.tree.flatten(shapes, is_leaf=lambda x: isinstance(x, tuple))
    paths = [jax.tree_util.keystr(p) for p, _ in
             jax.tree.flatten_with_path(shapes, is_leaf=lambda x: isinstance(x, tuple))[0]]
    keys = jax.random.split(key, len(leaves))
    out = []
    for path, shape, k in zip(paths, leaves, keys):
        if "norm" in path:
            out.append(jnp.ones(shape, dtype))
        elif path.endswith("['bq']") or path.endswith("['bk']") or path.endswith("['bv']"):
            out.append(jnp.zeros(shape, dtype))
        else:
            out.append((std * jax.random.normal(k, shape)).astype(dtype))
    return jax.tree.unflatten(treedef, out)


# ----------------------------------------------------------------------------- building blocks


def rms_norm(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    """y = x / sqrt(mean(x^2) + eps) * w, computed in float32."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * w.astype(jnp.float32)).astype(x.dtype)


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
    inv = 1.0 / cfg.rope_theta ** (np.arange(0, cfg.head_dim, 2, dtype=np.float64) / cfg.head_dim)
    if cfg.rope_freq_factors is not None:
        inv = inv / np.asarray(cfg.rope_freq_factors, dtype=np.float64)
    return inv.astype(np.float32)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: jax.Array) -> jax.Array:
    """Rotary embedding in the rotate-half convention (HF): x [B,T,H,hd], positions [B,T]."""
    ang = positions[..., None].astype(jnp.float32) * inv_freq  # [B,T,hd/2]
    cos = jnp.concatenate([jnp.cos(ang)] * 2, -1)[:, :, None, :]
    sin = jnp.concatenate([jnp.sin(ang)] * 2, -1)[:, :, None, :]
    x32 = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], -1)
    return (x32 * cos + rotated * sin).astype(x.dtype)


def probability_precision(dtype: Any) -> jax.lax.Precision | None:
    """The precision of a dot whose result forms probabilities (attention scores and weights,
    the logits): HIGHEST on float32 operands, so a TPU (one bfloat16 pass by default) or a
    recent NVIDIA GPU (TF32) computes it as a float32 CPU does; None, the backend's default,
    on narrower operands, whose products are exact in the float32 accumulator anyway. The
    weight matmuls (:func:`dense`) keep JAX's default, ``jax_default_matmul_precision``: the
    model's dtype is the user's choice of speed there, and that flag makes them float32-true
    too."""
    return jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else None


def attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Grouped-query attention. q [B,T,H,hd]; k [B,KV,hd,S], v [B,KV,S,hd] (the cache's layout,
    see :func:`cached_keys`); mask [B,T,S] (True = attend). Scores and outputs accumulate in
    float32 whatever the cache's dtype, float32-true on a float32 cache
    (:func:`probability_precision`).

    One new token (T = 1, a decode step) takes a multiply-and-reduce over the cache instead of
    the two dots: XLA:CPU runs a batched dot as one small matmul per (row, KV head), 96 per
    layer at batch 32, and their count, not the bytes read, set the cost. The reductions run
    over the cache's non-minor axis (hd for keys, slots for values), vectorised along its
    minor axis, nearly twice as fast on CPU (benchmarks, "Design measurements")."""
    return joined_attention(q, ((k, v, mask),))


def joined_attention(q: jax.Array, parts: Sequence[tuple[jax.Array, jax.Array, jax.Array]],
                     reduced: Sequence[tuple[jax.Array, jax.Array, jax.Array]] = ()
                     ) -> jax.Array:
    """:func:`attention` over the slots of several parts taken together, each part
    (k [B,KV,hd,S_i], v [B,KV,S_i,hd], mask [B,T,S_i]) read where it is. One part is
    :func:`attention`'s softmax; several are merged by their log-sum-exps (Hydragen,
    Juravsky et al. 2024, eq. 2; flash-decoding's reduction): with part i's largest score
    m_i, its sum of exponentials l_i = sum exp(s - m_i) and its unnormalised output
    o_i = sum exp(s - m_i) v, the attention is sum_i e^(m_i - m) o_i / sum_i e^(m_i - m) l_i,
    m = max_i m_i: the softmax over all the slots, without joining the keys and values
    (a copy of the cache). A forward over a cache attends over the cache as it was and over
    the tokens' own keys and values (:func:`forward_with_cache`), so the cache is read
    before the step writes into it, in place.

    ``reduced``: parts another computation has already reduced to (m_i, l_i, o_i) (for one
    token: [B,KV,G,1], [B,KV,G,1], [B,KV,G,hd], float32, scores scaled by 1/sqrt(hd)), as
    the Pallas decode kernel returns them (``models.decode_attention``); there may be no
    ``parts`` then."""
    b, t, h, hd = q.shape
    kv = (parts[0][0] if parts else reduced[0][2]).shape[1]
    qg = q.reshape(b, t, kv, h // kv, hd)
    scored = [(_scores(qg, k, t), mask[:, None, None, 0, :] if t == 1 else
               mask[:, None, None, :, :], v) for k, v, mask in parts]
    if len(parts) == 1 and not reduced:
        (scores, mask, v), = scored
        out = _weighed(_masked_softmax(scores, mask, hd), v, t)
        return out.reshape(b, t, h * hd).astype(q.dtype)
    merged = list(reduced)
    for scores, mask, v in scored:
        scores = jnp.where(mask, scores * (1.0 / np.sqrt(hd)), NEG_INF)
        top = jnp.max(scores, axis=-1, keepdims=True)
        weights = jnp.exp(scores - top)
        merged.append((top, jnp.sum(weights, axis=-1, keepdims=True),
                       _weighed(weights, v, t)))
    top = functools.reduce(jnp.maximum, [m for m, _, _ in merged])
    # the parts' maxima and sums laid out as their outputs: [B,KV,G,1], or [B,T,KV,G,1]
    lay = (lambda x: x) if t == 1 else (lambda x: x.transpose(0, 3, 1, 2, 4))  # noqa: E731
    scale = [lay(jnp.exp(m - top)) for m, _, _ in merged]
    out = sum(c * o for c, (_, _, o) in zip(scale, merged, strict=True))
    total = sum(c * lay(s) for c, (_, s, _) in zip(scale, merged, strict=True))
    return (out / total).reshape(b, t, h * hd).astype(q.dtype)


def shared_prefix_part(q: jax.Array, keys: jax.Array, values: jax.Array, valid: jax.Array,
                       upcast: bool = False) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One token's attention over a prefix that each group of G consecutive rows shares (a
    GRPO group's prompt), reduced to (m, l, o) for :func:`joined_attention`'s merge: q
    [B,1,H,hd]; keys [N,KV,hd,W], values [N,KV,W,hd] (as attended), valid [N,W]: prefix n
    is rows [nG, (n+1)G)'s, G = B / N. Returns [B,KV,H/KV,1] maxima, sums of exponentials
    and [B,KV,H/KV,hd] unnormalised outputs, float32 (scores scaled by 1/sqrt(hd)).

    Hydragen (Juravsky et al. 2024, sec. 3): the G rows' queries against their one prefix are
    one matrix-matrix product per group and KV head (M = G H/KV queries), reading the prefix
    once for the group instead of once per row; the rows' own slots are another part, merged
    by log-sum-exp. The dots run in the prefix's dtype with float32 accumulation
    (float32-true on a float32 cache, :func:`probability_precision`), in float32 with
    ``upcast`` (a bfloat16 cache on CPU: :func:`_no_bf16_dot_on_buffers`)."""
    b, _, h, hd = q.shape
    n, kv = keys.shape[:2]
    g, per = b // n, h // kv
    if upcast:
        keys, values = keys.astype(jnp.float32), values.astype(jnp.float32)
    precision = probability_precision(keys.dtype)
    grouped = q[:, 0].reshape(n, g, kv, per, hd).transpose(0, 2, 1, 3, 4)
    grouped = grouped.reshape(n, kv, g * per, hd).astype(keys.dtype)
    scores = jnp.einsum("nkmd,nkds->nkms", grouped, keys, preferred_element_type=jnp.float32,
                        precision=precision)
    scores = jnp.where(valid[:, None, None, :], scores * (1.0 / np.sqrt(hd)), NEG_INF)
    top = jnp.max(scores, axis=-1, keepdims=True)
    weights = jnp.exp(scores - top)
    out = jnp.einsum("nkms,nksd->nkmd", weights.astype(values.dtype), values,
                     preferred_element_type=jnp.float32, precision=precision)

    def by_row(x: jax.Array) -> jax.Array:  # [N,KV,G*per,X] -> [B,KV,per,X]
        x = x.reshape(n, kv, g, per, x.shape[-1]).transpose(0, 2, 1, 3, 4)
        return x.reshape(b, kv, per, x.shape[-1])

    return by_row(top), by_row(jnp.sum(weights, axis=-1, keepdims=True)), by_row(out)


def _scores(qg: jax.Array, k: jax.Array, t: int) -> jax.Array:
    """q.k for grouped queries qg [B,T,KV,G,hd] and keys k [B,KV,hd,S], in float32:
    [B,KV,G,S] for one token (a multiply-and-reduce, see :func:`attention`), else
    [B,KV,G,T,S] (a dot in the keys' dtype, float32 accumulation)."""
    f32 = jnp.float32
    if t == 1:
        return jnp.sum(qg[:, 0, ..., None].astype(f32) * k[:, :, None].astype(f32), axis=3)
    # several tokens (prefill, training): two dots, each contracting its operands' minor
    # axes, in the cache's dtype with float32 accumulation
    return jnp.einsum("btkgd,bksd->bkgts", qg.astype(k.dtype), k.swapaxes(2, 3),
                      preferred_element_type=f32, precision=probability_precision(k.dtype))


def _weighed(probs: jax.Array, v: jax.Array, t: int) -> jax.Array:
    """The values v [B,KV,S,hd] weighed by probs ([B,KV,G,S], or [B,KV,G,T,S] for T > 1),
    summed over the slots: [B,KV,G,hd], or [B,T,KV,G,hd]."""
    if t == 1:
        return jnp.sum(probs[..., None] * v[:, :, None].astype(jnp.float32), axis=3)
    return jnp.einsum("bkgts,bkds->btkgd", probs.astype(v.dtype), v.swapaxes(2, 3),
                      preferred_element_type=jnp.float32,
                      precision=probability_precision(v.dtype))


def decode_extents(slots: int, first: int = 0, platform: str = "",
                   most: int = 8) -> tuple[int, ...]:
    """The cache prefixes a forward over a cache may attend over (``Placement.extent`` of
    :func:`forward_with_cache`): multiples of a block of at least 128 slots, at most ``most``
    of them, the last the whole cache; those past slot ``first`` (a loop's first write).

    On CPU (``platform="cpu"``) only prefixes of at most half the cache: XLA:CPU copies a
    prefix before it reads it (:func:`_once_computed`), which costs more than reading the
    whole cache once the prefix is past about 60 % of it (``bench.cache_prefix``, the decode's
    attention at the shipped model's shapes, batch 32, 416 slots: a step over a 256-slot prefix
    52 ms, over 128 slots 33, over the whole cache 52; the benchmarks page)."""
    block = 128 * max(1, -(-slots // (most * 128)))
    largest = slots // 2 if platform == "cpu" else slots
    return tuple(e for e in range(block, slots, block) if first < e <= largest) + (slots,)


def cache_slots_read(prompt: int, width: int, new: int, capacity: int,
                     decode_kernel: str = "xla", platform: str = "") -> tuple[float, float]:
    """(slots a row holds, slots the sampler reads), each averaged over the decode steps
    that follow the first token: step t of ``new`` (t >= 1) attends over the ``prompt + t``
    tokens of its row, written from slot ``width - prompt`` on (prompts left padded to
    ``width``), and the sampler reads the first of :func:`decode_extents`
    that holds slot ``width + t - 1`` (its decode runs one loop per extent; ``platform``: the
    one it runs on); the Pallas decode kernel (``decode_kernel="pallas_gpu"``) reads the
    row's own slots."""
    steps = np.arange(1, max(new, 2))
    held = float(np.mean(prompt + steps))
    if decode_kernel in ("pallas_gpu", "paged_tpu", "paged_gpu"):  # each row's own slots
        return held, held
    extents = decode_extents(capacity, platform=platform)
    read = [next(e for e in extents if e > width + t - 1) for t in steps]
    return held, float(np.mean(read))


def while_in_extents(extents: Sequence[int], last_slot: Any, running: Any, step: Any,
                     state: Any) -> Any:
    """``while running(state): state = step(state, extent)``, run as one ``while_loop`` per
    extent of ``extents`` (increasing), each for as long as the slot the next step writes,
    ``last_slot(state)``, lies below its extent; the last takes the rest. ``step`` passes
    ``extent`` on to :func:`forward_with_cache`, so each loop's body attends over its static
    prefix of the cache: a loop whose writes only move forward (a decode, a read's blocks)
    reads the cache's used part, not its capacity, with no conditional inside the layers.

    Why not choose the extent inside the step: a ``lax.switch`` in each layer (as here
    before) is, on a GPU, a copy of its index to the host and a wait, per layer and token
    (XLA runs a conditional's branch choice on the host); and a switch over the whole step
    compiles as many copies of it as these loops do, plus the choice. The loops' copies of
    the step are the compile's cost: at most 8 (:func:`decode_extents`), one for a cache of
    up to 128 slots."""
    def inside(extent: int) -> Any:
        return lambda s: running(s) & (last_slot(s) < extent)

    for extent in extents[:-1]:
        state = jax.lax.while_loop(inside(extent), functools.partial(step, extent=extent), state)
    return jax.lax.while_loop(running, functools.partial(step, extent=extents[-1]), state)


def _masked_softmax(scores: jax.Array, mask: jax.Array, hd: int) -> jax.Array:
    """softmax(scores / sqrt(hd)) over the last axis, masked slots set to NEG_INF first."""
    return jax.nn.softmax(jnp.where(mask, scores * (1.0 / np.sqrt(hd)), NEG_INF), axis=-1)


#: KV cache layouts (:func:`kv_layout`).
DEFAULT_LAYOUT, TPU_LAYOUT, SLOT_ROWS_LAYOUT = "default", "tpu", "slot_rows"


class KVCache(NamedTuple):
    """Keys and values, one buffer per layer (a tuple of L arrays each: keys [B,KV,hd,S],
    values [B,KV,S,hd], or another layout: see :func:`kv_layout`), and which slots
    hold real tokens, [B,S]. Per-layer buffers, like the per-layer weights of
    :func:`unstack_layers`, keep a decode loop from slicing (copying) stacked arrays at every
    step."""

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    valid: jax.Array

    @property
    def slots(self) -> int:
        """Slots a row holds."""
        return int(self.valid.shape[1])

    @staticmethod
    def zeros(cfg: ModelConfig, batch: int, length: int, dtype: Any = jnp.float32,
              layout: str = DEFAULT_LAYOUT) -> KVCache:
        """An empty cache of `length` slots in ``layout`` (:func:`kv_layout`). On an
        accelerator bfloat16 halves the cache; on CPU float32 is faster (a decode step reads a
        float32 cache faster than it converts a bfloat16 one, and a several-token forward
        reads a bfloat16 cache in float32)."""
        kv, hd = cfg.num_kv_heads, cfg.head_dim
        slots_minor, slot_rows = (batch, kv, hd, length), (batch, kv, length, hd)
        k_shape, v_shape = {DEFAULT_LAYOUT: (slots_minor, slot_rows),
                            TPU_LAYOUT: (slot_rows, slots_minor),
                            SLOT_ROWS_LAYOUT: (slot_rows, slot_rows)}[layout]
        n = cfg.num_layers
        return KVCache(tuple(jnp.zeros(k_shape, dtype) for _ in range(n)),
                       tuple(jnp.zeros(v_shape, dtype) for _ in range(n)),
                       jnp.zeros((batch, length), bool))


def kv_layout(mesh: Any = None, decode_kernel: str = "xla") -> str:
    """How a KV cache stores each layer on the platform a program runs on (the mesh's
    devices', else JAX's default backend: ``rl.plan`` compiles for TPU on a CPU host), for
    the decode step's attention kernel (``models.decode_attention``).

    ``"default"`` (CPU, GPU): keys [B,KV,hd,S] (slot-minor), values [B,KV,S,hd] (see
    :func:`cached_keys`); rows write at their own slots by a scatter.
    ``"tpu"``: the transposes, keys [B,KV,S,hd] and values [B,KV,hd,S], kept in their default
    layout inside a program, rows writing by one ``dynamic_update_slice`` each
    (:func:`_write_each_row`). The TPU compiler gives a scatter's operand, and a dot's, a
    layout of its own choosing; a program that carries the cache through a loop of them (a
    decode chunk, the multi-turn read) then copied every layer of the cache into that layout
    (the temporaries this saves are on the benchmarks page, "Design measurements").
    ``"slot_rows"`` (``decode_kernel="pallas_gpu"``, any platform): keys and values both
    [B,KV,S,hd], as the Pallas GPU decode kernel reads them; rows write by a scatter. The
    paged kernels' prefill too (``models.paged_cache.prompt_pages`` moves it into pages)."""
    if decode_kernel != "xla":
        return SLOT_ROWS_LAYOUT
    return TPU_LAYOUT if platform_of(mesh) == "tpu" else DEFAULT_LAYOUT


def platform_of(mesh: Any = None) -> str:
    """The platform of ``mesh``'s devices, else JAX's default backend."""
    return (next(iter(mesh.devices.flat)).platform if mesh is not None
            else jax.default_backend())


def slot_axes(layout: str = DEFAULT_LAYOUT) -> tuple[int, int]:
    """(the keys' slot axis, the values' slot axis) of a cache layer in ``layout``."""
    return {DEFAULT_LAYOUT: (3, 2), TPU_LAYOUT: (2, 3), SLOT_ROWS_LAYOUT: (2, 2)}[layout]


def cached_keys(k: jax.Array, layout: str = DEFAULT_LAYOUT) -> jax.Array:
    """Keys [B,T,KV,hd] as projected -> as cached: [B,KV,hd,T] (``"default"``, as attended
    over) or [B,KV,T,hd] (``"tpu"``, ``"slot_rows"``: :func:`kv_layout`).

    Keys slot-minor and values [B,KV,S,hd] (see :func:`cached_values`) put the axis that a
    decode step's multiply-and-reduce sums over (hd for q.k, slots for p.v) outside the one
    it vectorises along (see :func:`attention`)."""
    return k.transpose(0, 2, 3, 1) if layout == DEFAULT_LAYOUT else k.transpose(0, 2, 1, 3)


def cached_values(v: jax.Array, layout: str = DEFAULT_LAYOUT) -> jax.Array:
    """Values [B,T,KV,hd] as projected -> as cached: [B,KV,T,hd] (``"default"``,
    ``"slot_rows"``) or [B,KV,hd,T] (``"tpu"``; see :func:`cached_keys`)."""
    return v.transpose(0, 2, 3, 1) if layout == TPU_LAYOUT else v.transpose(0, 2, 1, 3)


def attended(k: jax.Array, v: jax.Array, layout: str) -> tuple[jax.Array, jax.Array]:
    """A cache layer's keys and values in ``layout`` as :func:`attention` reads them (the
    ``"default"`` layout; for the others, transposed views the compiler lays out for free)."""
    keys = k if layout == DEFAULT_LAYOUT else k.swapaxes(2, 3)
    return keys, v.swapaxes(2, 3) if layout == TPU_LAYOUT else v


def unstack_layers(params: Params) -> Params:
    """``params`` with "layers" as a tuple of per-layer dicts (what :func:`forward` with a
    cache runs on). In a decode loop this matters: scanning the stacked arrays slices (copies)
    every layer's weights at every step, ~25 % of a batch-8 decode step on CPU."""
    if isinstance(params["layers"], (tuple, list)):
        return params
    n = jax.tree.leaves(params["layers"])[0].shape[0]
    return params | {"layers": tuple(jax.tree.map(lambda a, i=i: a[i], params["layers"])
                                     for i in range(n))}


@functools.partial(jax.tree_util.register_dataclass, data_fields=("w", "a", "b"),
                   meta_fields=("scale",))
@dataclasses.dataclass(frozen=True)
class LowRank:
    """A weight with a low-rank update (LoRA, arXiv:2106.09685): W + scale * A @ B, kept
    factored. w [..., D, F], a [..., D, r], b [..., r, F] (a leading layers axis when stacked:
    ``lax.scan`` and :func:`unstack_layers` slice all three). :func:`dense` computes
    x @ W + scale * (x @ A) @ B, so the backward pass forms no [D, F] weight gradient for the
    update. Built by ``models.lora.adapted``."""

    w: jax.Array
    a: jax.Array
    b: jax.Array
    scale: float


def dense(x: jax.Array, w: jax.Array | LowRank | Quantized) -> jax.Array:
    """x [..., D] @ w [D, F] as one 2-D matmul over the flattened leading axes (XLA:CPU runs
    the weight gradient of a 3-D x, which contracts two axes, ~1.5x slower). x is cast to w's
    dtype and the product accumulated in float32, returned in x's dtype: bfloat16 decode
    weights (see models.sampler.decode_params) keep a float32 residual stream. A
    :class:`LowRank` weight adds its update factored: x @ W + scale * (x @ A) @ B."""
    if isinstance(w, LowRank):
        return dense(x, w.w) + w.scale * dense(dense(x, w.a), w.b)
    if isinstance(w, Quantized):  # a frozen QLoRA base weight: dequantized for this matmul
        w = dequantize(w, x.dtype)
    y = jnp.dot(x.reshape(-1, x.shape[-1]).astype(w.dtype), w,
                preferred_element_type=jnp.float32)
    return y.astype(x.dtype).reshape(*x.shape[:-1], w.shape[-1])


def _qkv(cfg: ModelConfig, p: Params, h: jax.Array, positions: jax.Array, inv_freq: jax.Array):
    b, t, _ = h.shape
    q, k, v = dense(h, p["wq"]), dense(h, p["wk"]), dense(h, p["wv"])
    if cfg.qkv_bias:
        q, k, v = q + p["bq"], k + p["bk"], v + p["bv"]
    q = q.reshape(b, t, cfg.num_heads, cfg.head_dim)
    k = k.reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
    v = v.reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
    if cfg.qk_norm:
        q = rms_norm(q, p["q_norm"], cfg.rms_norm_eps)
        k = rms_norm(k, p["k_norm"], cfg.rms_norm_eps)
    return apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq), v


def _mlp(p: Params, h: jax.Array) -> jax.Array:
    return dense(jax.nn.silu(dense(h, p["w_gate"])) * dense(h, p["w_up"]), p["w_down"])


def forward(cfg: ModelConfig, params: Params, tokens: jax.Array,
            attn_mask: jax.Array | None = None, positions: jax.Array | None = None,
            remat: bool = False, return_hidden: bool = False) -> jax.Array:
    """Logits [B,T,V] for tokens [B,T], or with ``return_hidden`` the final (normed) hidden
    states [B,T,D] that :func:`unembed` turns into logits.

    attn_mask [B,T]: 1 for real tokens, 0 for padding (left padding is what the sampler uses).
    positions default to the running count of real tokens, so RoPE starts at 0 for every row.
    The stacked layers run under ``lax.scan`` (see :func:`_scan_layers` for ``remat``); a
    forward that reads and extends a KV cache is :func:`forward_with_cache`.
    """
    attn_mask, positions = _mask_and_positions(tokens, attn_mask, positions)
    inv_freq = jnp.asarray(rope_inv_freq(cfg))
    mask = _causal(tokens.shape[1])[None] & attn_mask[:, None, :]

    def body(x: jax.Array, p: Params) -> tuple[jax.Array, None]:
        return _layer(cfg, p, x, positions, inv_freq, mask,
                      lambda k, v: (cached_keys(k), cached_values(v), None))

    x, _ = _scan_layers(body, params["embed"][tokens], params["layers"], remat)
    x = rms_norm(x, params["final_norm"], cfg.rms_norm_eps)
    return x if return_hidden else unembed(cfg, params, x)


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a cached forward pass runs. ``mesh``: the mesh of its program, whose devices'
    platform sets the cache's layout (:func:`kv_layout`) and whether a bfloat16 cache is read
    in float32 (:func:`_no_bf16_dot_on_buffers`). ``pin_rows``: pin the activations' rows to
    the context mesh's batch axes after the embedding and every layer
    (``models.constraints.shard_rows``, as ``forward`` does in training); otherwise they are
    left to GSPMD. The prefill pins as its config says (``models.sampler.prefill``: which is
    smaller depends on the model, prompts and shards); the continuation's read pins
    (``models.continuation.read_in_place``). ``extent``: how much of the cache the tokens
    attend over (see :func:`forward_with_cache`). ``decode_kernel``: what computes a
    one-token step's attention over the cache (``models.decode_attention``: "xla", or
    "pallas_gpu" on a cache in its layout, :func:`kv_layout`). ``prompt``: what each group of
    G consecutive rows shares before its cache, N = B / G prompts' keys and values (a
    :class:`KVCache` of N rows, each read once for its group: :func:`shared_prefix_part`;
    ``models.prompt_sharing``), for one-token steps: a decode whose rows' cache holds what
    they generated after their group's prompt."""

    mesh: Any = None
    pin_rows: bool = False
    extent: int | None = None
    decode_kernel: str = "xla"
    prompt: KVCache | None = None


def forward_with_cache(cfg: ModelConfig, params: Params, tokens: jax.Array,
                       attn_mask: jax.Array | None = None, positions: jax.Array | None = None,
                       *, cache: KVCache, cache_index: jax.Array | int,
                       placement: Placement = Placement()) -> tuple[jax.Array, KVCache]:
    """(final hidden states [B,T,D], updated cache) for tokens [B,T] that follow the cache's
    contents: the T new tokens' keys and values are written at slots
    [cache_index, cache_index + T) and each token attends to the cache's valid slots before
    it. :func:`unembed` turns the hidden states into logits. attn_mask and positions as in
    :func:`forward`. Layers run one by one on per-layer weights (see :func:`unstack_layers`).

    ``cache_index`` is one slot for every row (a dense ``dynamic_update_slice``) or one per
    row, [B] (each row writes at its own position, a scatter; slots past the cache's end are
    dropped, not clamped onto the row's last ones): a multi-turn rollout's rows, each at its
    own length, write in place in one cache (``models.continuation``).

    ``placement``: the program's mesh and whether the rows are pinned (:class:`Placement`);
    the cache is in the layout of its mesh's platform (:func:`kv_layout`).

    ``placement.extent``: the tokens attend over the cache's first ``extent`` slots only (a
    static prefix; None, the whole cache; 0, none: an empty cache) and over their own keys
    and values, written after the cache is read (in place: :func:`joined_attention`). Every
    valid slot before a token must lie below it; the result is the same for less reading.
    Loops choose it by :func:`while_in_extents` (a multi-turn rollout reserves room for
    every turn up front; on the 2-core CPU a 48-token decode at batch 16 cost 12 % more per
    256 empty slots when every step read the whole cache).

    ``placement.prompt``: a prompt shared by each group of rows, attended over before the
    cache (:class:`Placement`).
    """
    t, mesh, prompt = tokens.shape[1], placement.mesh, placement.prompt
    if prompt is not None and t != 1:
        raise ValueError(f"a shared prompt is read by one-token steps only, got {t} tokens")
    attn_mask, positions = _mask_and_positions(tokens, attn_mask, positions)
    inv_freq = jnp.asarray(rope_inv_freq(cfg))
    at = jnp.asarray(cache_index, jnp.int32)
    written = (at[:, None] if at.ndim else at[None, None]) + jnp.arange(t)  # [B|1,T] slots
    layout = kv_layout(mesh, placement.decode_kernel)
    # the slots valid once the tokens are written
    valid = _write_at(cache.valid, attn_mask, at, axis=1, by_row=layout == TPU_LAYOUT)
    attend = _cache_attention(cache, valid, written, attn_mask, placement, layout, at)

    pin = shard_rows if placement.pin_rows else (lambda a: a)
    x, ks, vs = pin(params["embed"][tokens]), [], []
    prompt_parts = _prompt_parts(prompt, len(cache.k), layout, mesh)
    for p, ck, cv, prompt_part in zip(unstack_layers(params)["layers"], cache.k, cache.v,
                                      prompt_parts, strict=True):
        q, k, v = _qkv(cfg, p, rms_norm(x, p["attn_norm"], cfg.rms_norm_eps), positions,
                       inv_freq)
        k, v = cached_keys(k, layout).astype(ck.dtype), cached_values(v, layout).astype(cv.dtype)
        attended_out, ck, cv = attend(q, k, v, ck, cv, prompt_part(q))
        x = x + dense(attended_out, p["wo"])
        x = pin(x + _mlp(p, rms_norm(x, p["mlp_norm"], cfg.rms_norm_eps)))
        ks.append(ck)
        vs.append(cv)
    x = rms_norm(x, params["final_norm"], cfg.rms_norm_eps)
    return x, KVCache(tuple(ks), tuple(vs), valid)


def _prompt_parts(prompt: KVCache | None, layers: int, layout: str, mesh: Any) -> list[Any]:
    """For each of the ``layers``, ``part(q)``: the attention of the layer's one-token
    queries q over the ``prompt`` its rows' groups share (``Placement.prompt``), reduced for
    :func:`joined_attention` (:func:`shared_prefix_part`); without a prompt, no part."""
    if prompt is None:
        return [lambda q: ()] * layers
    upcast = _no_bf16_dot_on_buffers(prompt.k[0].dtype, mesh)

    def part(k: jax.Array, v: jax.Array) -> Any:
        keys, values = attended(k, v, layout)
        return lambda q: (shared_prefix_part(q, keys, values, prompt.valid, upcast),)

    return [part(k, v) for k, v in zip(prompt.k, prompt.v, strict=True)]


def _cache_attention(cache: KVCache, valid: jax.Array, written: jax.Array,
                     attn_mask: jax.Array, placement: Placement, layout: str,
                     at: jax.Array) -> Any:
    """``attend(q, k, v, ck, cv, reduced) -> (output, ck, cv)`` for the layers of
    :func:`forward_with_cache`: the tokens' attention over one layer's cache (ck, cv) up to
    ``placement.extent``, over their own keys and values (k, v, as cached: causal, their
    real tokens) and over parts already ``reduced`` (a shared prompt's, see
    :func:`joined_attention`), and the cache with k, v written from slot ``at`` (``valid``:
    the slots valid once they are).

    The cache is read as it was, then written, the write waiting for the output
    (:func:`_cache_writer`; written first, XLA:CPU copied every layer's cache at each step).
    On a TPU (the ``"tpu"`` layout) the opposite: a forward over a prefix of the cache writes
    first and attends over the written prefix, one part; reading first, the TPU compiler kept
    copies of the cache through the decode loop (about twice the cache in temporaries: the
    benchmarks page, the QLoRA plan on a v5e slice of 8 chips). A one-token step by the
    decode kernel (``placement.decode_kernel``, ``models.decode_attention``) reads each row's
    own slots, whatever the extent."""
    t, mesh = written.shape[1], placement.mesh
    write = _cache_writer(layout, at)
    extent = cache.valid.shape[1] if placement.extent is None else placement.extent
    own = jnp.broadcast_to(_causal(t)[None] & attn_mask[:, None, :],
                           (cache.valid.shape[0], t, t))
    if t == 1 and extent and placement.decode_kernel == "pallas_gpu":
        bounds = row_bounds(cache.valid, written[:, 0])
        interpret = platform_of(mesh) != "gpu"

        def by_kernel(q: jax.Array, k: jax.Array, v: jax.Array, ck: jax.Array,
                      cv: jax.Array, reduced: tuple) -> tuple[jax.Array, jax.Array, jax.Array]:
            cached = bounded_attention(q[:, 0], ck, cv, *bounds, interpret=interpret)
            out = joined_attention(q, [(*attended(k, v, layout), own)], [cached, *reduced])
            return out, *write(ck, cv, k, v, after=out)

        return by_kernel
    if extent and layout == TPU_LAYOUT:  # up to each token's own slot, once written
        upto = (jnp.arange(extent) <= written[:, :, None]) & valid[:, None, :extent]

        def written_first(q: jax.Array, k: jax.Array, v: jax.Array, ck: jax.Array,
                          cv: jax.Array, reduced: tuple) -> tuple[jax.Array, jax.Array, jax.Array]:
            ck, cv = write(ck, cv, k, v, after=None)
            keys, values = attended(ck, cv, layout)
            out = joined_attention(q, [(keys[..., :extent], values[:, :, :extent], upto)],
                                   reduced)
            return out, ck, cv

        return written_first
    # the cache as it was, up to `extent` (every slot valid there before the tokens); a
    # several-token forward reads a bfloat16 cache in float32 on CPU
    before = (jnp.arange(extent) <= written[:, :, None]) & cache.valid[:, None, :extent]
    upcast = t > 1 and _no_bf16_dot_on_buffers(cache.k[0].dtype, mesh)

    def by_parts(q: jax.Array, k: jax.Array, v: jax.Array, ck: jax.Array,
                 cv: jax.Array, reduced: tuple) -> tuple[jax.Array, jax.Array, jax.Array]:
        out = joined_attention(q, _attended_parts((ck, cv, before), (k, v, own), layout,
                                                  extent, upcast, q), reduced)
        return out, *write(ck, cv, k, v, after=out)

    return by_parts


def _attended_parts(cache: tuple, tokens: tuple, layout: str, extent: int,
                    upcast: bool, q: jax.Array) -> tuple:
    """((keys, values, mask) of the cache's first ``extent`` slots, then of the tokens
    themselves), from (keys, values, mask) of each, as :func:`joined_attention` reads them
    (float32 with ``upcast``); without the cache for ``extent`` 0. A prefix shorter than the
    cache is copied once the layer's queries ``q`` are computed (:func:`_once_computed`)."""
    both = [(*attended(k, v, layout), mask) for k, v, mask in (cache, tokens)]
    if upcast:
        both = [(k.astype(jnp.float32), v.astype(jnp.float32), m) for k, v, m in both]
    k, v, mask = both[0]
    if 0 < extent < k.shape[-1]:
        both[0] = (*_once_computed((k[..., :extent], v[:, :, :extent]), q), mask)
    return tuple(both if extent else both[1:])


def _once_computed(prefixes: tuple[jax.Array, ...], q: jax.Array) -> tuple[jax.Array, ...]:
    """``prefixes`` (slices of a layer's cache, [B,KV,...]) as computed only once the layer's
    queries q [B,T,H,hd] are: each row and KV head selects its slice where its first query
    element equals itself (always, but for NaN, so XLA cannot fold it).

    Why: a slice of the cache is a copy on XLA:CPU, and a decode loop's slices depend only on
    the loop's carry, so XLA scheduled every layer's copy at the top of the loop body: all
    layers' prefixes held at once and read back from memory, not cache (a batch-32 decode step
    of the shipped model reading 384 of 416 slots took 178 ms, against 136 reading all 416;
    the benchmarks page, "Design measurements"). Each row and head waits for its own queries:
    no communication under any sharding of rows or heads."""
    b, kv = prefixes[0].shape[:2]
    first = q.reshape(b, q.shape[1], kv, -1)[:, 0, :, :1]  # [B,KV,1]
    computed = (first == first)[..., None]  # [B,KV,1,1]
    return tuple(jnp.where(computed, a, jnp.zeros((), a.dtype)) for a in prefixes)


def _cache_writer(layout: str, at: jax.Array) -> Any:
    """``write(ck, cv, k, v, after)`` for :func:`forward_with_cache`: the new keys and values
    (as cached: in ``layout``, the cache's dtype) written into one layer's cache from slot
    ``at`` (one, or one per row), once ``after`` (the layer's attention output, which read
    the cache; None: at once) is computed.

    Why the wait: the write updates the cache in place only if XLA orders it after every read
    of the old cache, and XLA orders by data, not by program order (an optimization barrier
    is gone before it decides). Without the dependence it copied every layer's cache at each
    decode step (on CPU a third of a batch-32 step). The dependence is ``0 * x`` on an
    element of ``after`` of each row and KV head (where the row and the head are, under any
    sharding): an exact zero for finite attention outputs, which XLA does not fold away (it
    would not be one for NaN)."""
    key_axis, value_axis = slot_axes(layout)
    by_row = layout == TPU_LAYOUT  # see _write_at

    def write(ck: jax.Array, cv: jax.Array, k: jax.Array, v: jax.Array,
              after: jax.Array | None) -> tuple[jax.Array, jax.Array]:
        b, kv = ck.shape[:2]  # each row and KV head waits for its own: no communication
        zero: Any = 0  # nothing to wait for
        if after is not None:
            zero = (0 * after.reshape(b, after.shape[1], kv, -1)[:, 0, :, :1]).astype(ck.dtype)
            zero = zero[..., None]  # [B,KV,1,1]
        ck = _write_at(ck, k + zero, at, axis=key_axis, by_row=by_row)
        cv = _write_at(cv, v + zero, at, axis=value_axis, by_row=by_row)
        if by_row:
            ck, cv = _as_stored(ck), _as_stored(cv)
        return ck, cv

    return write


def _write_at(buffer: jax.Array, new: jax.Array, at: jax.Array, axis: int,
              by_row: bool = False) -> jax.Array:
    """``buffer`` with ``new`` written along `axis` from slot ``at``: one slot for every row
    (a dense ``dynamic_update_slice``) or one per row, [B]: a scatter (:func:`_write_rows`),
    or with ``by_row`` one ``dynamic_update_slice`` per row (:func:`_write_each_row`)."""
    if at.ndim:
        if by_row:
            return _write_each_row(buffer, new, at, axis)
        return _write_rows(buffer, new, at[:, None] + jnp.arange(new.shape[axis]), axis)
    return jax.lax.dynamic_update_slice_in_dim(buffer, new, at, axis=axis)


def _as_stored(buffer: jax.Array) -> jax.Array:
    """``buffer`` kept in its arrays' default (row-major) layout inside a program."""
    return with_layout_constraint(buffer, Layout(tuple(range(buffer.ndim))))


def _write_rows(buffer: jax.Array, new: jax.Array, slots: jax.Array, axis: int) -> jax.Array:
    """``buffer`` [B,...,S,...] with row b's ``new`` values written at its slots ``slots[b]``
    [T] along `axis` (``new`` has T there); slots out of range are dropped."""
    def one(row: jax.Array, values: jax.Array, at: jax.Array) -> jax.Array:
        index = (slice(None),) * (axis - 1) + (at,)
        return row.at[index].set(values, mode="drop")

    return jax.vmap(one)(buffer, new, slots)


def _write_each_row(buffer: jax.Array, new: jax.Array, at: jax.Array, axis: int) -> jax.Array:
    """:func:`_write_rows` for the slots ``at[b] + [0, T)`` as one in-place
    ``dynamic_update_slice`` per row, in a loop over each device's own rows (under the
    context mesh, manual over its batch axes only).

    Why not the scatter: the TPU compiler lays a scatter's operand out with its slots next to
    its rows, unlike the cache's own layout, so a loop carrying the cache through one (a
    decode chunk) copied every layer of it (benchmarks, "Design measurements"). A window
    that overhangs
    the buffer's end keeps the slots it would clamp onto (slots past the end are dropped, as
    the scatter drops them)."""
    s, t = buffer.shape[axis], new.shape[axis]
    if t > s:  # a window wider than the buffer: its values past slot s never land
        new, t = jax.lax.slice_in_dim(new, 0, s, axis=axis), s

    def local(buffer: jax.Array, new: jax.Array, at: jax.Array) -> jax.Array:
        def one(b: jax.Array, buf: jax.Array) -> jax.Array:
            start = jnp.clip(at[b], 0, max(s - t, 0))
            corner = [b] + [jnp.zeros((), jnp.int32)] * (buf.ndim - 1)
            corner[axis] = start
            sizes = [1, *buf.shape[1:]]
            sizes[axis] = t
            old = jax.lax.dynamic_slice(buf, corner, sizes)  # the row's window only
            src = jnp.arange(t) + start - at[b]  # the new token each window slot takes
            shape = [1] * buf.ndim
            shape[axis] = t
            keep = ((src < 0) | (src >= t)).reshape(shape)
            values = jnp.take(jax.lax.dynamic_slice_in_dim(new, b, 1, 0),
                              jnp.clip(src, 0, t - 1), axis=axis)
            return jax.lax.dynamic_update_slice(buf, jnp.where(keep, old, values), corner)

        return jax.lax.fori_loop(0, buffer.shape[0], one, buffer)

    mesh = jax.sharding.get_abstract_mesh()
    axes = () if mesh.empty else row_axes(dict(mesh.shape), buffer.shape[0])
    if not axes:
        return local(buffer, new, at)
    rows = PartitionSpec(axes[0] if len(axes) == 1 else axes)
    return jax.shard_map(local, mesh=mesh, in_specs=(rows, rows, rows), out_specs=rows,
                         axis_names=set(axes))(buffer, new, at)


def _mask_and_positions(tokens: jax.Array, attn_mask: jax.Array | None,
                        positions: jax.Array | None) -> tuple[jax.Array, jax.Array]:
    """attn_mask as booleans (all True when None) and the RoPE positions (the running count of
    real tokens when None)."""
    if attn_mask is None:
        attn_mask = jnp.ones(tokens.shape, bool)
    attn_mask = attn_mask.astype(bool)
    if positions is None:
        positions = jnp.maximum(jnp.cumsum(attn_mask, axis=1) - 1, 0)
    return attn_mask, positions


def _layer(cfg: ModelConfig, p: Params, x: jax.Array, positions: jax.Array,
           inv_freq: jax.Array, mask: jax.Array, attend: Any,
           attend_over: Any = attention) -> tuple[jax.Array, Any]:
    """One decoder layer; attend(k, v) -> (keys, values to attend over, anything to return);
    attend_over(q, keys, values, mask): :func:`attention` or a variant of it."""
    h = rms_norm(x, p["attn_norm"], cfg.rms_norm_eps)
    q, k, v = _qkv(cfg, p, h, positions, inv_freq)
    keys, values, out = attend(k, v)
    x = x + dense(attend_over(q, keys, values, mask), p["wo"])
    return x + _mlp(p, rms_norm(x, p["mlp_norm"], cfg.rms_norm_eps)), out


def _no_bf16_dot_on_buffers(dtype: Any, mesh: Any = None) -> bool:
    """XLA:CPU cannot run a bfloat16 x bfloat16 -> float32 dot ("DotThunk") whose key operand
    is a buffer built apart from the queries (a KV cache, keys joined from two passes): such
    keys and values are attended over in float32 there. The platform is the mesh's devices'
    when there is one (``rl.plan`` compiles for TPU devices on a CPU host), else JAX's
    default backend."""
    return dtype == jnp.bfloat16 and platform_of(mesh) == "cpu"


def _causal(t: int) -> jax.Array:
    return jnp.tril(jnp.ones((t, t), bool))


def _scan_layers(body: Any, carry: Any, layers: Params, remat: bool) -> tuple[Any, Any]:
    """Run ``body(carry, layer_params)`` over the stacked layers, rematerialised per layer.

    Backward keeps only each layer's weight-matmul outputs and recomputes the rest (attention
    scores and probabilities, norms, activations): storing [L,B,H,T,T] probabilities costs
    more than recomputing them, here ~10 % of a training step. remat=True recomputes the
    whole layer (least memory)."""
    policy = None if remat else jax.checkpoint_policies.dots_with_no_batch_dims_saveable

    def rows_kept(c: Any, p: Params) -> tuple[Any, Any]:  # the batch stays split (constraints)
        c, out = body(c, p)
        return shard_tree_rows(c), out

    carry = shard_tree_rows(carry)
    return jax.lax.scan(jax.checkpoint(rows_kept, prevent_cse=False, policy=policy), carry,
                        layers)


def forward_with_prefix(cfg: ModelConfig, params: Params, prefix: jax.Array,
                        prefix_mask: jax.Array, tokens: jax.Array, attn_mask: jax.Array,
                        remat: bool = False) -> tuple[jax.Array, jax.Array]:
    """Final hidden states of G continuations of each of N shared prefixes, the prefix run once.

    prefix [N,P] and prefix_mask (any padding); tokens [N,G,T] continue prefix n, right padded
    (attn_mask [N,G,T]). Returns (prefix hidden [N,P,D], continuation hidden [N,G,T,D]), equal
    to :func:`forward` on each concatenation prefix[n] + tokens[n,g] up to float rounding.
    Every layer runs prefix n once and attends its G continuations to its keys and values:
    a GRPO group reads its prompt once instead of G times (training scores all G).
    """
    n, g, t = tokens.shape
    prefix_mask, attn_mask = prefix_mask.astype(bool), attn_mask.reshape(n * g, t).astype(bool)
    inv_freq = jnp.asarray(rope_inv_freq(cfg))
    prefix_pos = jnp.maximum(jnp.cumsum(prefix_mask, axis=1) - 1, 0)
    seen = jnp.repeat(jnp.sum(prefix_mask, axis=1), g)  # real prefix tokens before each row
    pos = seen[:, None] + jnp.maximum(jnp.cumsum(attn_mask, axis=1) - 1, 0)
    prefix_attn = _causal(prefix.shape[1])[None] & prefix_mask[:, None, :]
    cont_attn = jnp.concatenate(  # [NG,T,P+T]: the whole prefix, then causal over the row
        [jnp.broadcast_to(jnp.repeat(prefix_mask, g, axis=0)[:, None], (n * g, t,
                                                                         prefix.shape[1])),
         _causal(t)[None] & attn_mask[:, None, :]], axis=2)

    # the continuations attend over joined keys, like a cache buffer: float32 there on CPU
    upcast = _no_bf16_dot_on_buffers(params["embed"].dtype)

    def body(carry, p):
        xp, x = carry

        def own(k, v):
            k, v = cached_keys(k), cached_values(v)
            return k, v, (k, v)

        def joined(k, v):
            keys = jnp.concatenate([jnp.repeat(kp, g, axis=0), cached_keys(k)], axis=3)
            values = jnp.concatenate([jnp.repeat(vp, g, axis=0), cached_values(v)], axis=2)
            if upcast:
                keys, values = keys.astype(jnp.float32), values.astype(jnp.float32)
            return keys, values, None

        xp, (kp, vp) = _layer(cfg, p, xp, prefix_pos, inv_freq, prefix_attn, own)
        x, _ = _layer(cfg, p, x, pos, inv_freq, cont_attn, joined)
        return (xp, x), None

    xs = (params["embed"][prefix], params["embed"][tokens.reshape(n * g, t)])
    (xp, x), _ = _scan_layers(body, xs, params["layers"], remat)
    norm = lambda a: rms_norm(a, params["final_norm"], cfg.rms_norm_eps)  # noqa: E731
    return norm(xp), norm(x).reshape(n, g, t, -1)


def unembedding(cfg: ModelConfig, params: Params) -> jax.Array:
    """The [D,V] output matrix: lm_head, embed^T for tied embeddings, or the "unembed" matrix
    that decode_params makes for a narrower decode dtype."""
    if "unembed" in params:
        return params["unembed"]
    return params["embed"].T if cfg.tie_embeddings else params["lm_head"]


def unembed(cfg: ModelConfig, params: Params, x: jax.Array) -> jax.Array:
    """Logits (float32) from final hidden states: x @ :func:`unembedding`, float32-true on
    float32 weights (:func:`probability_precision`)."""
    w = unembedding(cfg, params)
    return jnp.einsum("...d,dv->...v", x.astype(w.dtype), w, preferred_element_type=jnp.float32,
                      precision=probability_precision(w.dtype))
