"""LoRA (Hu et al., arXiv:2106.09685) on the stacked layer weights, as pure functions.

A targeted weight W [L, D, F] (one of the layer matmuls, ``x @ W``) becomes

    W' = W + (alpha / rank) * A @ B,   A [L, D, rank], B [L, rank, F]

with W frozen and only A and B trained. B starts at zero, so the adapted model starts as the
base model exactly; A starts with qwix's LoRA initialiser (``qwix.LoraRule``'s default
``lora_a_initializer``, He-uniform over D, qwix 0.1.8 ``providers/lora.py``), drawn per layer.

The adapters are a dict ``{target: {"a": A, "b": B}}``. :func:`adapted` gives the model
parameters with each target as a :class:`models.transformer.LowRank` (the update kept
factored, what the training forward runs: x @ W + s (x @ A) @ B); :func:`merged` gives plain
parameters with W' computed (what the sampler and the export use). Both equal up to float
rounding (a test checks it).

Why not qwix's ``LoraProvider`` itself: it intercepts ``dot_general``/``einsum`` inside a
Flax (linen or nnx) module and finds, creates and names the LoRA weights through that module
(``flax_util.get_current_module``, ``find_param``, ``module.scope.param``; module paths match
the rules). Our model is plain functions over a dict run under ``lax.scan``: there is no
current module, and the weights a scanned layer sees are slices, not module attributes. Using
it would mean wrapping our forward in a fake nnx module; instead the same math (qwix's
``_compute_lora_delta``: ``(x @ A) @ B * alpha / rank``) and qwix's initialisers are used here
directly, and a test checks our adapted matmul against qwix's provider on an nnx module.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from models.config import ModelConfig
from models.quant import QUANT_KINDS, Quantized, check_blocks, dequantize, quantize
from models.sharding import host_copy
from models.transformer import LowRank, Params, layer_shapes

# the layer matmuls LoRA may target (models.transformer.LAYER_KEYS without the norms)
LORA_TARGETS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
# the architectures whose layers are those matmuls (every one models.config supports today)
LORA_ARCHS = ("llama", "qwen2", "qwen3")

Adapters = dict[str, dict[str, jax.Array]]


class LoraError(ValueError):
    """A LoRA setting we cannot apply; the message names the key."""


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """``model.lora``: rank 0 = off; alpha the scale numerator (scale = alpha / rank)."""

    rank: int
    alpha: float
    targets: tuple[str, ...]
    quant: str = "none"  # the frozen base's layer matmuls: none | int8 | nf4 (models.quant)

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def lora_problem(lora: LoraConfig) -> tuple[str, str] | None:
    """(key, message) of the first invalid ``model.lora`` value, or None."""
    if lora.rank < 0:
        return "model.lora.rank", f"must be >= 0 (0 = off), got {lora.rank}"
    if not lora.enabled:
        return None
    if not lora.alpha > 0:
        return "model.lora.alpha", f"must be > 0, got {lora.alpha}"
    if not lora.targets:
        return "model.lora.targets", f"name at least one of {', '.join(LORA_TARGETS)}"
    if lora.quant not in QUANT_KINDS:
        return "model.lora.quant", f"{lora.quant!r}: expected one of {', '.join(QUANT_KINDS)}"
    for i, name in enumerate(lora.targets):
        if name not in LORA_TARGETS:
            return (f"model.lora.targets[{i}]", f"{name!r} is not a layer matmul of ours; "
                    f"targets: {', '.join(LORA_TARGETS)}")
        if name in lora.targets[:i]:
            return f"model.lora.targets[{i}]", f"{name!r} is listed twice"
    return None


def check_model(lora: LoraConfig, cfg: ModelConfig) -> None:
    """LoraError naming the key when the model cannot take these adapters."""
    if cfg.arch not in LORA_ARCHS:
        raise LoraError(f"model.lora.rank: LoRA is not supported for architecture "
                        f"{cfg.arch!r} (model.path); supported: {', '.join(LORA_ARCHS)}")
    shapes = layer_shapes(cfg)
    if lora.quant != "none":
        for name in LORA_TARGETS:  # QLoRA stores every layer matmul of the base quantized
            try:
                check_blocks(shapes[name], f"model.lora.quant={lora.quant}: {name}")
            except ValueError as e:
                raise LoraError(str(e)) from None
    for name in lora.targets:
        smallest = min(shapes[name])
        if lora.rank > smallest:
            raise LoraError(f"model.lora.rank: {lora.rank} exceeds {name}'s smaller side "
                            f"({shapes[name]}): a rank-{lora.rank} update is not low-rank")


def adapter_shapes(params: Params, lora: LoraConfig) -> dict[str, dict[str, tuple[int, ...]]]:
    """{target: {"a": (L, D, rank), "b": (L, rank, F)}} for the stacked weights W [L, D, F]
    of `params` (arrays or shape structs)."""
    out: dict[str, dict[str, tuple[int, ...]]] = {}
    for t in lora.targets:
        layers, d, f = (int(n) for n in params["layers"][t].shape)
        out[t] = {"a": (layers, d, lora.rank), "b": (layers, lora.rank, f)}
    return out


def init_adapters(params: Params, lora: LoraConfig, key: jax.Array,
                  dtype: Any = jnp.float32) -> Adapters:
    """Adapters for the base `params`: A from qwix's LoRA A initialiser (He-uniform:
    U(+-sqrt(6 / D)), each layer on its own [D, rank] with its own key), B from its B
    initialiser (zeros)."""
    import qwix  # the initialisers are qwix's LoraRule defaults

    rule = qwix.LoraRule(module_path=".*", rank=lora.rank, alpha=lora.alpha)
    out: Adapters = {}
    for t, k in zip(lora.targets, jax.random.split(key, len(lora.targets))):
        shapes = adapter_shapes(params, lora)[t]
        layers, d, r = shapes["a"]
        per_layer = functools.partial(rule.lora_a_initializer, shape=(d, r), dtype=dtype)
        a = jax.vmap(per_layer)(jax.random.split(k, layers))
        out[t] = {"a": a, "b": rule.lora_b_initializer(k, shapes["b"], dtype)}
    return out


def adapted(params: Params, adapters: Adapters, lora: LoraConfig) -> Params:
    """`params` with each target a LowRank(W, A, B, alpha / rank); W behind stop_gradient, so
    gradients reach only the adapters."""
    layers = dict(params["layers"])
    for t, ab in adapters.items():
        layers[t] = LowRank(jax.lax.stop_gradient(layers[t]), ab["a"], ab["b"], lora.scale)
    return params | {"layers": layers}


def quantized_base(params: Params, lora: LoraConfig) -> Params:
    """`params` with every layer matmul stored in model.lora.quant (QLoRA: the frozen base
    quantized, ``models.quant``); `params` itself when it is ``none``."""
    if lora.quant == "none":
        return params
    layers = dict(params["layers"])
    for name in LORA_TARGETS:
        layers[name] = _quantize(layers[name], lora.quant)
    return params | {"layers": layers}


_quantize = jax.jit(quantize, static_argnames="kind")


def merged(params: Params, adapters: Adapters, lora: LoraConfig) -> Params:
    """`params` with each target replaced by W + (alpha / rank) * A @ B (float32 products),
    and every quantized base weight dequantized (plain arrays, what the sampler and the
    export take)."""
    layers = {k: dequantize(w) if isinstance(w, Quantized) else w
              for k, w in params["layers"].items()}
    for t, ab in adapters.items():
        delta = jnp.einsum("ldr,lrf->ldf", ab["a"], ab["b"], preferred_element_type=jnp.float32)
        layers[t] = (layers[t] + lora.scale * delta).astype(layers[t].dtype)
    return params | {"layers": layers}


merge = jax.jit(merged, static_argnames="lora")


def num_params(adapters: Adapters) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(adapters))


def base_fingerprint(params: Params) -> str:
    """SHA-256 over every base array's path, dtype, shape and bytes: which weights the
    adapters were trained on (a checkpoint of adapters is refused on another base). One array
    at a time on the host; in a multi-process job each is gathered whole
    (``models.sharding.host_copy``), so every process computes the same digest."""
    h = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        a = np.ascontiguousarray(np.asarray(host_copy(leaf)))
        h.update(f"{jax.tree_util.keystr(path)}{a.dtype}{a.shape}".encode())
        h.update(a.reshape(-1).view(np.uint8).tobytes())
    return h.hexdigest()
