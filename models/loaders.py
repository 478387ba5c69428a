"""Weights from an HF safetensors folder (single file or sharded) or from a GGUF file.

Both produce our parameter dict (see ``transformer.param_shapes``): matrices stored [in, out]
so the forward pass is ``x @ W``, layer weights stacked on a leading axis.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from models.config import ModelConfig, ModelLoadError, llama3_freq_factors, load_hf_config
from models.transformer import Params, layer_shapes, param_shapes

# our per-layer name -> (HF suffix, transpose?)
HF_LAYER = {
    "attn_norm": ("input_layernorm.weight", False),
    "wq": ("self_attn.q_proj.weight", True),
    "wk": ("self_attn.k_proj.weight", True),
    "wv": ("self_attn.v_proj.weight", True),
    "wo": ("self_attn.o_proj.weight", True),
    "bq": ("self_attn.q_proj.bias", False),
    "bk": ("self_attn.k_proj.bias", False),
    "bv": ("self_attn.v_proj.bias", False),
    "q_norm": ("self_attn.q_norm.weight", False),
    "k_norm": ("self_attn.k_norm.weight", False),
    "mlp_norm": ("post_attention_layernorm.weight", False),
    "w_gate": ("mlp.gate_proj.weight", True),
    "w_up": ("mlp.up_proj.weight", True),
    "w_down": ("mlp.down_proj.weight", True),
}
GGUF_LAYER = {
    "attn_norm": ("attn_norm.weight", False),
    "wq": ("attn_q.weight", True),
    "wk": ("attn_k.weight", True),
    "wv": ("attn_v.weight", True),
    "wo": ("attn_output.weight", True),
    "bq": ("attn_q.bias", False),
    "bk": ("attn_k.bias", False),
    "bv": ("attn_v.bias", False),
    "q_norm": ("attn_q_norm.weight", False),
    "k_norm": ("attn_k_norm.weight", False),
    "mlp_norm": ("ffn_norm.weight", False),
    "w_gate": ("ffn_gate.weight", True),
    "w_up": ("ffn_up.weight", True),
    "w_down": ("ffn_down.weight", True),
}


def _assemble(cfg: ModelConfig, get: Callable[[str], np.ndarray], names: dict[str, str],
              layer_fmt: str, layer_map: dict, source: str, dtype: Any) -> Params:
    """Gather tensors by name, transpose to [in, out], check shapes, stack layers."""
    expected = param_shapes(cfg)

    def fetch(name: str, transpose: bool, shape: tuple[int, ...]) -> np.ndarray:
        arr = get(name)
        arr = arr.T if transpose else arr
        if arr.shape != shape:
            raise ModelLoadError(f"{source}: tensor {name} has shape {arr.shape} "
                                 f"(after transpose), expected {shape}")
        return np.asarray(arr, dtype=dtype)

    params: Params = {
        "embed": fetch(names["embed"], False, expected["embed"]),
        "final_norm": fetch(names["final_norm"], False, expected["final_norm"]),
        "layers": {},
    }
    if not cfg.tie_embeddings:
        params["lm_head"] = fetch(names["lm_head"], True, expected["lm_head"])
    for key, shape in layer_shapes(cfg).items():
        suffix, transpose = layer_map[key]
        params["layers"][key] = np.stack([
            fetch(layer_fmt.format(i=i, name=suffix), transpose, shape)
            for i in range(cfg.num_layers)])
    return params


# ----------------------------------------------------------------------------- HF safetensors


def _safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise ModelLoadError(f"{index}: invalid index ({e})") from None
        files = sorted({folder / f for f in weight_map.values()})
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder}: no *.safetensors weights found")
    for f in files:
        if not f.exists():
            raise ModelLoadError(f"{f}: listed in the index but missing")
    return files


def load_hf_folder(folder: str | Path, dtype: Any = np.float32) -> tuple[ModelConfig, Params]:
    """Config and parameters from an HF folder (config.json + safetensors, sharded or not)."""
    from safetensors import safe_open

    folder = Path(folder)
    cfg = load_hf_config(folder)
    tensors: dict[str, tuple[Path, Any]] = {}
    handles = []
    for f in _safetensors_files(folder):
        try:
            h = safe_open(str(f), framework="flax")
        except Exception as e:
            raise ModelLoadError(f"{f}: cannot read safetensors ({e})") from None
        handles.append(h)
        for name in h.keys():
            tensors[name] = (f, h)

    def get(name: str) -> np.ndarray:
        if name not in tensors:
            raise ModelLoadError(f"{folder}: tensor {name!r} missing from the weights")
        f, h = tensors[name]
        try:
            return np.asarray(h.get_tensor(name), dtype=np.float32)
        except Exception as e:
            raise ModelLoadError(f"{f}: cannot read tensor {name!r} ({e})") from None

    names = {"embed": "model.embed_tokens.weight", "final_norm": "model.norm.weight",
             "lm_head": "lm_head.weight"}
    if not cfg.tie_embeddings and "lm_head.weight" not in tensors:
        # a tied head that an export dropped looks the same as a missing shard: only the
        # config can tell, and it says the head is untied
        raise ModelLoadError(f"{folder}: config.json has tie_word_embeddings=false but the "
                             f"weights hold no lm_head.weight (a missing shard?)")
    params = _assemble(cfg, get, names, "model.layers.{i}.{name}", HF_LAYER, str(folder), dtype)
    return cfg, params


# ----------------------------------------------------------------------------- GGUF


def _unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (interleaved RoPE) to get rotate-half layout."""
    out, inp = w.shape
    return w.reshape(n_head, out // n_head // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def gguf_config(reader: Any, source: str) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch not in ("llama", "qwen2", "qwen3"):
        raise ModelLoadError(f"{source}: unsupported GGUF architecture {arch!r}; "
                             f"supported: llama, qwen2, qwen3")
    names = {t.name for t in reader.tensors}

    def need(key: str) -> Any:
        v = _field(reader, f"{arch}.{key}")
        if v is None:
            raise ModelLoadError(f"{source}: GGUF metadata {arch}.{key} missing")
        return v

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    head_dim = int(_field(reader, f"{arch}.attention.key_length", hidden // heads))
    theta = float(_field(reader, f"{arch}.rope.freq_base", 10000.0))
    factors = None
    if "rope_freqs.weight" in names:  # Llama 3 scaling stored as a tensor of divisors
        t = next(t for t in reader.tensors if t.name == "rope_freqs.weight")
        factors = tuple(float(x) for x in np.asarray(t.data, np.float32).ravel())
    elif _field(reader, f"{arch}.rope.scaling.type") == "llama3":
        factors = llama3_freq_factors(head_dim, theta, {
            "factor": _field(reader, f"{arch}.rope.scaling.factor")})
    tokens = _field(reader, "tokenizer.ggml.tokens")
    vocab = int(_field(reader, f"{arch}.vocab_size", len(tokens) if tokens else 0))
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    return ModelConfig(
        arch=arch, vocab_size=vocab, hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")),
        num_layers=int(need("block_count")), num_heads=heads,
        num_kv_heads=int(_field(reader, f"{arch}.attention.head_count_kv", heads)),
        head_dim=head_dim, rope_theta=theta,
        rms_norm_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        tie_embeddings="output.weight" not in names,
        qkv_bias="blk.0.attn_q.bias" in names, qk_norm="blk.0.attn_q_norm.weight" in names,
        max_position_embeddings=int(_field(reader, f"{arch}.context_length", 2048)),
        rope_freq_factors=factors,
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=() if eos is None else (int(eos),),
        pad_token_id=_field(reader, "tokenizer.ggml.padding_token_id"),
    )


def load_gguf(path: str | Path, dtype: Any = np.float32) -> tuple[ModelConfig, Params]:
    """Config and dequantized parameters from a GGUF file."""
    import gguf

    path = Path(path)
    if not path.exists():
        raise ModelLoadError(f"{path}: GGUF file not found")
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:
        raise ModelLoadError(f"{path}: not a readable GGUF file ({e})") from None
    cfg = gguf_config(reader, str(path))
    tensors = {t.name: t for t in reader.tensors}

    def get(name: str) -> np.ndarray:
        t = tensors.get(name)
        if t is None:
            raise ModelLoadError(f"{path}: tensor {name!r} missing")
        try:
            w = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError:
            raise ModelLoadError(f"{path}: tensor {name!r} uses quantisation "
                                 f"{t.tensor_type.name}, which gguf cannot dequantize") from None
        w = np.asarray(w, np.float32).reshape(tuple(int(x) for x in reversed(t.shape)))
        if cfg.arch == "llama" and name.endswith("attn_q.weight"):
            w = _unpermute_qk(w, cfg.num_heads)
        elif cfg.arch == "llama" and name.endswith("attn_k.weight"):
            w = _unpermute_qk(w, cfg.num_kv_heads)
        return w

    names = {"embed": "token_embd.weight", "final_norm": "output_norm.weight",
             "lm_head": "output.weight"}
    params = _assemble(cfg, get, names, "blk.{i}.{name}", GGUF_LAYER, str(path), dtype)
    return cfg, params
