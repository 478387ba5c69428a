"""Write our parameters back as a Hugging Face folder that ``transformers`` loads.

    export_hf(cfg, params, tokenizer, source, out_dir)   # source: the HF folder or GGUF file
                                                         # the model was loaded from

The inverse of ``models.loaders``: our matrices are [in, out] with the layers stacked on a
leading axis; HF stores ``model.layers.{i}.<name>`` as [out, in] (``HF_LAYER`` names which ones
are transposed). No RoPE permutation is needed for either source: the GGUF loader already undid
llama.cpp's interleaved Q/K rows (``loaders._unpermute_qk``), so our weights are in HF's
rotate-half layout whatever they came from. A tied head is not written (HF ties it again).

The folder gets config.json (the source's config.json updated, or one built from our
ModelConfig for a GGUF), safetensors (one file, or shards with ``model.safetensors.index.json``
above ``max_shard_bytes``), the tokenizer (an HF source's files copied; for a GGUF the fast
tokenizer we built from its metadata, with a tokenizer_config.json holding the special tokens
and chat template) and the source's generation_config.json. It is written into a temporary
folder beside ``out_dir`` and renamed into place at the end, so a crash leaves nothing half
written; the config written must parse back to the same ModelConfig, checked before writing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from models.config import ModelConfig, ModelLoadError, from_hf_config, llama3_freq_factors
from models.loaders import HF_LAYER
from models.tokenizer import Tokenizer
from models.transformer import Params, layer_shapes

DTYPES: dict[str, Any] = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16,
                          "float16": np.float16}
# tokenizer and generation files copied from an HF source folder when present
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "chat_template.json", "tokenizer.model", "vocab.json",
                   "merges.txt", "added_tokens.json")
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM"}
DEFAULT_SHARD_BYTES = 5 * 1024**3


class ExportError(ValueError):
    """An export we refuse (the message names the folder, file or setting)."""


@dataclasses.dataclass(frozen=True)
class ExportSummary:
    out_dir: Path
    dtype: str
    weight_files: tuple[str, ...]
    tokenizer_files: tuple[str, ...]
    num_params: int


# ----------------------------------------------------------------------------- tensors


def hf_tensors(cfg: ModelConfig, params: Params) -> dict[str, np.ndarray]:
    """Our parameter dict under HF names, [out, in] (views; no dtype conversion yet)."""
    out = {"model.embed_tokens.weight": np.asarray(params["embed"]),
           "model.norm.weight": np.asarray(params["final_norm"])}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = np.asarray(params["lm_head"]).T
    for key in layer_shapes(cfg):
        suffix, transpose = HF_LAYER[key]
        stacked = np.asarray(params["layers"][key])
        for i in range(cfg.num_layers):
            out[f"model.layers.{i}.{suffix}"] = stacked[i].T if transpose else stacked[i]
    return out


def shards(tensors: dict[str, np.ndarray], itemsize: int,
           max_bytes: int) -> list[dict[str, np.ndarray]]:
    """Tensors grouped in order into shards of at most `max_bytes` (a bigger tensor alone)."""
    groups: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, arr in tensors.items():
        n = arr.size * itemsize
        if groups[-1] and size + n > max_bytes:
            groups.append({})
            size = 0
        groups[-1][name] = arr
        size += n
    return groups


def shard_names(n: int) -> list[str]:
    if n == 1:
        return ["model.safetensors"]
    return [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]


# ----------------------------------------------------------------------------- config


def fit_llama3_scaling(cfg: ModelConfig) -> dict[str, Any]:
    """Llama 3 ``rope_scaling`` whose divisors (``llama3_freq_factors``) are cfg's.

    A GGUF stores only the divisors (``rope_freqs.weight``); the factor is the largest divisor,
    and the original context (a power of two) and low/high frequency factors (Llama 3's 1
    and 4 tried first) those that reproduce every divisor."""
    want = np.asarray(cfg.rope_freq_factors)
    for low, high in ((1.0, 4.0), (1.0, 2.0), (2.0, 4.0)):
        for log2 in range(4, 22):
            scaling = {"rope_type": "llama3", "factor": float(want.max()),
                       "low_freq_factor": low, "high_freq_factor": high,
                       "original_max_position_embeddings": 2**log2}
            got = llama3_freq_factors(cfg.head_dim, cfg.rope_theta, scaling)
            if np.allclose(got, want, rtol=1e-5, atol=0):
                return scaling
    raise ExportError("the model's RoPE frequency divisors (rope_freq_factors) match no "
                      "Llama 3 rope_scaling; transformers could not reproduce them")


def built_config(cfg: ModelConfig) -> dict[str, Any]:
    """An HF config.json for cfg (for sources without one, i.e. GGUF)."""
    out: dict[str, Any] = {
        "architectures": [ARCHITECTURES[cfg.arch]], "model_type": cfg.arch,
        "hidden_act": "silu", "attention_bias": cfg.arch == "qwen3" and cfg.qkv_bias,
        "rope_scaling": None if cfg.rope_freq_factors is None else fit_llama3_scaling(cfg),
    }
    if cfg.arch == "llama":
        out["mlp_bias"] = False
    return out


def hf_config(cfg: ModelConfig, dtype: str, source: dict[str, Any] | None) -> dict[str, Any]:
    """config.json: the source's (its other keys kept) or a built one, with cfg's fields."""
    out = dict(source) if source is not None else built_config(cfg)
    eos = list(cfg.eos_token_ids)
    out |= {
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim, "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "max_position_embeddings": cfg.max_position_embeddings,
        "bos_token_id": cfg.bos_token_id, "eos_token_id": eos[0] if len(eos) == 1 else eos or None,
        "pad_token_id": cfg.pad_token_id, "dtype": dtype,
    }
    if "rope_parameters" not in out or "rope_theta" in out:
        out["rope_theta"] = cfg.rope_theta
    if "torch_dtype" in out:
        out["torch_dtype"] = dtype
    if diff := config_differences(from_hf_config(out, "the exported config.json"), cfg):
        raise ExportError(f"the exported config.json would load as a different model "
                          f"(fields {', '.join(diff)} differ)")
    return out


def config_differences(a: ModelConfig, b: ModelConfig) -> list[str]:
    """Fields where a and b differ; RoPE divisors compared to float32 precision (a GGUF
    stores them as float32, config.json's rope_scaling recomputes them in float64)."""
    def same(x: Any, y: Any) -> bool:
        if isinstance(x, tuple) and isinstance(y, tuple) and len(x) == len(y):
            return bool(np.allclose(x, y, rtol=1e-6, atol=0))
        return x == y

    return [f.name for f in dataclasses.fields(a)
            if not same(getattr(a, f.name), getattr(b, f.name))]


# ----------------------------------------------------------------------------- tokenizer


def built_tokenizer_files(tok: Tokenizer) -> dict[str, bytes]:
    """tokenizer.json (our fast tokenizer: for a GGUF the one built from its metadata) and a
    tokenizer_config.json with its special tokens and chat template."""
    meta = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": tok.bos_token,
            "eos_token": tok.eos_token, "pad_token": tok.backend.id_to_token(tok.pad_id),
            "add_bos_token": tok.add_bos, "chat_template": tok.chat_template}
    meta = {k: v for k, v in meta.items() if v is not None}
    return {"tokenizer.json": tok.backend.to_str().encode(),
            "tokenizer_config.json": json.dumps(meta, indent=2).encode()}


# ----------------------------------------------------------------------------- the folder


def check_out_dir(out_dir: str | Path, force: bool) -> Path:
    """The output folder, refused if it is a file or a non-empty folder (unless `force`)."""
    out_dir = Path(out_dir).absolute()
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"{out_dir}: exists and is not a folder")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force:
        raise ExportError(f"{out_dir}: exists and is not empty (pass --force to replace it)")
    return out_dir


def _fsync_write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _write_weights(tmp: Path, tensors: dict[str, np.ndarray], dtype: str,
                   max_shard_bytes: int) -> tuple[str, ...]:
    from safetensors.numpy import save_file

    np_dtype = DTYPES[dtype]
    groups = shards(tensors, np.dtype(np_dtype).itemsize, max_shard_bytes)
    names = shard_names(len(groups))
    weight_map: dict[str, str] = {}
    total = 0
    for name, group in zip(names, groups):
        arrays = {k: np.ascontiguousarray(v, dtype=np_dtype) for k, v in group.items()}
        save_file(arrays, str(tmp / name), metadata={"format": "pt"})
        with open(tmp / name, "rb") as f:
            os.fsync(f.fileno())
        weight_map |= {k: name for k in arrays}
        total += sum(a.nbytes for a in arrays.values())
    if len(names) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        _fsync_write(tmp / "model.safetensors.index.json", json.dumps(index, indent=2).encode())
    return tuple(names)


def _source_files(source: Path | None, tok: Tokenizer | None) -> dict[str, bytes]:
    """Tokenizer (and generation config) files for the folder, by name."""
    if source is not None and source.is_dir():
        names = (*TOKENIZER_FILES, "generation_config.json")
        return {n: (source / n).read_bytes() for n in names if (source / n).is_file()}
    if tok is None:
        raise ExportError(f"{source or 'a preset'}: no tokenizer files to copy and no "
                          f"tokenizer given to write")
    return built_tokenizer_files(tok)


def source_config(source: Path | None) -> dict[str, Any] | None:
    """The source folder's config.json as a dict (None for a GGUF or a preset)."""
    if source is None or not source.is_dir():
        return None
    try:
        return json.loads((source / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{source / 'config.json'}: cannot read ({e})") from None


def source_dtype(source: Path | None) -> str:
    """The dtype the source's config.json names (dtype / torch_dtype), else float32."""
    cfg = source_config(source) or {}
    name = cfg.get("dtype") or cfg.get("torch_dtype")
    return name if name in DTYPES else "float32"


def _usual_modes(folder: Path) -> None:
    """The folder and its files get the modes a plain mkdir/open would give (mkdtemp and
    safetensors make them private)."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for f in folder.iterdir():
        f.chmod(0o666 & ~umask)


def _replace_dir(tmp: Path, out_dir: Path) -> None:
    """Rename `tmp` to `out_dir`; an existing `out_dir` (checked empty or forced) goes."""
    old = None
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
        out_dir.rename(old)
    tmp.rename(out_dir)
    if old is not None:
        shutil.rmtree(old)


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    dtype: str | None = None  # None: the source's (config.json dtype), else float32
    force: bool = False
    max_shard_bytes: int = DEFAULT_SHARD_BYTES


def export_hf(cfg: ModelConfig, params: Params, tok: Tokenizer | None, source: str | Path | None,
              out_dir: str | Path, options: ExportOptions = ExportOptions()) -> ExportSummary:
    """Write the HF folder (see the module docstring); `source` is the HF folder or GGUF file
    the model came from (None for a preset without files: config and tokenizer are built
    from `cfg` and `tok`; `tok` may be None only for an HF folder source)."""
    source = None if source is None else Path(source)
    dtype = options.dtype or source_dtype(source)
    if dtype not in DTYPES:
        raise ExportError(f"dtype {dtype!r} not supported; choose from {', '.join(DTYPES)}")
    out_dir = check_out_dir(out_dir, options.force)
    config = hf_config(cfg, dtype, source_config(source))
    files = _source_files(source, tok)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.tmp-"))
    try:
        weights = _write_weights(tmp, hf_tensors(cfg, params), dtype, options.max_shard_bytes)
        _fsync_write(tmp / "config.json", json.dumps(config, indent=2).encode())
        for name, data in files.items():
            _fsync_write(tmp / name, data)
        _usual_modes(tmp)
        _replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    tok_files = tuple(n for n in files if n != "generation_config.json")
    return ExportSummary(out_dir, dtype, weights, tok_files, cfg.num_params)
