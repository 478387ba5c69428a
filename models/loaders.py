"""Weights from an HF safetensors folder (single file or sharded) or from a GGUF file.

Both produce our parameter dict (see ``transformer.param_shapes``): matrices stored [in, out]
so the forward pass is ``x @ W``, layer weights stacked on a leading axis.

    cfg, params = load_hf_folder(folder)       # every parameter, whole, on the host
    weights = hf_weights(folder)               # nothing read yet: config and sources
    weights.read(weights.leaves["layers"]["wq"], (slice(None), slice(0, 512)))  # one slice

Reading by slices is what lets each process of a multi-host job read only the shards its
devices hold (``models.sharded_load``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Protocol

import jax
import ml_dtypes
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


@dataclasses.dataclass(frozen=True)
class LeafSource:
    """Where one of our parameters comes from: a stored tensor, or one per layer stacked on a
    leading axis (`stacked`), each stored [out, in] when `transpose`; `shape` is ours."""

    tensors: tuple[str, ...]
    transpose: bool
    stacked: bool
    shape: tuple[int, ...]


class TensorFiles(Protocol):
    """Stored tensors read slice by slice: a slice costs its own bytes (``bytes_read``)."""

    source: str
    bytes_read: int

    def shape(self, name: str) -> tuple[int, ...]:
        """The tensor's shape as stored; ModelLoadError naming it when it is missing."""

    def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        """``tensor[index]`` as float32 (index in the stored orientation)."""


@dataclasses.dataclass
class Weights:
    """A model before its weights are read: config, each parameter's source (a tree shaped
    like the parameters, of :class:`LeafSource`), and the files. :meth:`read` reads one
    parameter, or the slice of it a device holds, in our layout and `dtype`."""

    cfg: ModelConfig
    leaves: Params
    files: TensorFiles

    def read(self, leaf: LeafSource, index: tuple[slice, ...] | None = None,
             dtype: Any = np.float32) -> np.ndarray:
        index = tuple(index) if index is not None else ()
        index += (slice(None),) * (len(leaf.shape) - len(index))
        if not leaf.stacked:
            return self._tensor(leaf, leaf.tensors[0], index, dtype)
        layers = range(len(leaf.tensors))[index[0]]
        return np.stack([self._tensor(leaf, leaf.tensors[i], index[1:], dtype) for i in layers])

    def read_all(self, dtype: Any = np.float32) -> Params:
        """Every parameter, whole (in the tree's order: embedding, norm, head, layers)."""
        return jax.tree.map(lambda leaf: self.read(leaf, None, dtype), self.leaves,
                            is_leaf=lambda x: isinstance(x, LeafSource))

    def check(self) -> None:
        """ModelLoadError naming the first missing or misshapen tensor, before any read."""
        for leaf in jax.tree.leaves(self.leaves, is_leaf=lambda x: isinstance(x, LeafSource)):
            for name in leaf.tensors:
                self._check_shape(leaf, name)

    def _check_shape(self, leaf: LeafSource, name: str) -> None:
        stored = self.files.shape(name)
        ours = tuple(reversed(stored)) if leaf.transpose else tuple(stored)
        want = leaf.shape[1:] if leaf.stacked else leaf.shape
        if ours != want:
            raise ModelLoadError(f"{self.files.source}: tensor {name} has shape {ours} "
                                 f"(after transpose), expected {want}")

    def _tensor(self, leaf: LeafSource, name: str, index: tuple[slice, ...],
                dtype: Any) -> np.ndarray:
        part = self.files.read(name, index[::-1] if leaf.transpose else index)
        self._check_shape(leaf, name)  # after the read: a GGUF's quantisation error first
        return np.asarray(part.T if leaf.transpose else part, dtype=dtype)


def leaf_sources(cfg: ModelConfig, names: dict[str, str], layer_fmt: str,
                 layer_map: dict) -> Params:
    """Each parameter's :class:`LeafSource` (names: the embedding, final norm and head's
    stored names; layer_fmt/layer_map: a layer tensor's)."""
    expected = param_shapes(cfg)
    leaves: Params = {
        "embed": LeafSource((names["embed"],), False, False, expected["embed"]),
        "final_norm": LeafSource((names["final_norm"],), False, False, expected["final_norm"]),
        "layers": {},
    }
    if not cfg.tie_embeddings:
        leaves["lm_head"] = LeafSource((names["lm_head"],), True, False, expected["lm_head"])
    for key, shape in layer_shapes(cfg).items():
        suffix, transpose = layer_map[key]
        leaves["layers"][key] = LeafSource(
            tuple(layer_fmt.format(i=i, name=suffix) for i in range(cfg.num_layers)),
            transpose, True, (cfg.num_layers, *shape))
    return leaves


# ----------------------------------------------------------------------------- HF safetensors

# safetensors dtype names -> numpy (ml_dtypes for bfloat16 and float8)
SAFETENSORS_DTYPES: dict[str, Any] = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_,
}
MAX_HEADER_BYTES = 100 * 1024**2  # the safetensors format's own bound


def _size(path: Any) -> int:
    """A file's size in bytes: a local ``Path`` or an ``etils.epath`` object."""
    return path.stat().st_size if isinstance(path, Path) else int(path.stat().length)


def _safetensors_files(folder: Any) -> list[Any]:
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


def _safetensors_header(path: Any) -> tuple[dict[str, Any], int]:
    """(the JSON header, where the data starts) of a safetensors file: 8 bytes little-endian
    header length N, N bytes of JSON, then the tensors' bytes (offsets from there)."""
    size = _size(path)
    with path.open("rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if size < 8 or not 2 <= n <= min(size - 8, MAX_HEADER_BYTES):
            raise ModelLoadError(f"{path}: cannot read safetensors (header length {n} for a "
                                 f"file of {size} bytes)")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ModelLoadError(f"{path}: cannot read safetensors (header: {e})") from None
    if not isinstance(header, dict):
        raise ModelLoadError(f"{path}: cannot read safetensors (header is not an object)")
    return header, 8 + n


class SafetensorsFiles:
    """The tensors of an HF folder's safetensors files, each read through a read-only memory
    map of its file: a slice reads its own bytes. Our own reader of the format (header, then
    raw little-endian data), so any dtype ml_dtypes knows reads without a framework. A folder
    on object storage (an ``etils.epath`` path: ``models.remote``) is read by byte ranges:
    a slice reads the rows of its first axis that it spans (all of a tensor's bytes where it
    is split along another axis only)."""

    def __init__(self, folder: Any) -> None:
        self.source, self.bytes_read = str(folder), 0
        self._where: dict[str, tuple[Any, Any, tuple[int, ...], int]] = {}
        for path in _safetensors_files(folder):
            header, start = _safetensors_header(path)
            size = _size(path)
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                try:
                    dtype = SAFETENSORS_DTYPES[info["dtype"]]
                    shape = tuple(int(x) for x in info["shape"])
                    begin, end = (int(x) for x in info["data_offsets"])
                except (KeyError, TypeError, ValueError) as e:
                    raise ModelLoadError(f"{path}: cannot read tensor {name!r} "
                                         f"(header entry {info!r}: {e})") from None
                if end - begin != math.prod(shape) * np.dtype(dtype).itemsize or (
                        start + end > size):
                    raise ModelLoadError(f"{path}: cannot read tensor {name!r}: bytes "
                                         f"[{begin}, {end}) do not hold {shape} {info['dtype']}"
                                         f" in a file of {size} bytes (truncated?)")
                self._where[name] = (path, dtype, shape, start + begin)

    def names(self) -> set[str]:
        return set(self._where)

    def shape(self, name: str) -> tuple[int, ...]:
        if name not in self._where:
            raise ModelLoadError(f"{self.source}: tensor {name!r} missing from the weights")
        return self._where[name][2]

    def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        path, dtype, shape, offset = self._where[name]
        if not isinstance(path, Path):
            return self._read_range(path, dtype, shape, offset, index)
        stored = np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)
        part = stored[index]
        self.bytes_read += part.nbytes
        return np.asarray(part, dtype=np.float32)

    def _read_range(self, path: Any, dtype: Any, shape: tuple[int, ...], offset: int,
                    index: tuple[slice, ...]) -> np.ndarray:
        """The slice `index` of a remote tensor: one ranged read of the rows its first axis
        spans (a stepped or empty first slice: every row), the rest cut in memory."""
        rows = range(*(index[0] if index else slice(None)).indices(shape[0]))
        contiguous = rows.step == 1 and len(rows) > 0
        lo, hi = (rows.start, rows.stop) if contiguous else (0, shape[0])
        row_bytes = math.prod(shape[1:]) * np.dtype(dtype).itemsize
        with path.open("rb") as f:
            f.seek(offset + lo * row_bytes)
            raw = f.read((hi - lo) * row_bytes)
        self.bytes_read += len(raw)
        block = np.frombuffer(raw, dtype=dtype).reshape((hi - lo, *shape[1:]))
        part = block[(slice(None), *index[1:])] if contiguous else block[index]
        return np.asarray(part, dtype=np.float32)


def hf_weights(folder: str | Path, tensors: Any = None) -> Weights:
    """An HF folder's config and weight sources (config.json + safetensors, sharded or not);
    nothing is read yet. `tensors`: where the safetensors are, when not in `folder` (a
    folder on object storage, ``models.remote``)."""
    folder = Path(folder)
    cfg = load_hf_config(folder)
    files = SafetensorsFiles(folder if tensors is None else tensors)
    names = {"embed": "model.embed_tokens.weight", "final_norm": "model.norm.weight",
             "lm_head": "lm_head.weight"}
    if not cfg.tie_embeddings and "lm_head.weight" not in files.names():
        # a tied head that an export dropped looks the same as a missing shard: only the
        # config can tell, and it says the head is untied
        raise ModelLoadError(f"{folder}: config.json has tie_word_embeddings=false but the "
                             f"weights hold no lm_head.weight (a missing shard?)")
    return Weights(cfg, leaf_sources(cfg, names, "model.layers.{i}.{name}", HF_LAYER), files)


def load_hf_folder(folder: str | Path, dtype: Any = np.float32) -> tuple[ModelConfig, Params]:
    """Config and parameters from an HF folder (config.json + safetensors, sharded or not)."""
    weights = hf_weights(folder)
    return weights.cfg, weights.read_all(dtype)


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


class GGUFFiles:
    """The tensors of a GGUF file, dequantized to float32 a whole tensor at a time (quantized
    blocks cannot be cut by row and column); one parameter's tensors (every layer's) are kept
    while its shards are read, so each local device's slice reuses them instead of
    dequantizing the layers again; llama's Q/K rows are put back into rotate-half order
    (``_unpermute_qk``)."""

    def __init__(self, path: Path, reader: Any, cfg: ModelConfig) -> None:
        self.source, self.bytes_read = str(path), 0
        self._tensors = {t.name: t for t in reader.tensors}
        self._cfg = cfg
        self._recent: dict[str, np.ndarray] = {}

    def shape(self, name: str) -> tuple[int, ...]:
        t = self._tensors.get(name)
        if t is None:
            raise ModelLoadError(f"{self.source}: tensor {name!r} missing")
        return tuple(int(x) for x in reversed(t.shape))

    def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        if name not in self._recent:
            if len(self._recent) > self._cfg.num_layers:
                self._recent.pop(next(iter(self._recent)))
            self._recent[name] = self._dequantized(name)
        return self._recent[name][index]

    def _dequantized(self, name: str) -> np.ndarray:
        import gguf

        t = self._tensors[name]
        try:
            w = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError:
            raise ModelLoadError(f"{self.source}: tensor {name!r} uses quantisation "
                                 f"{t.tensor_type.name}, which gguf cannot dequantize") from None
        self.bytes_read += int(t.data.nbytes)
        w = np.asarray(w, np.float32).reshape(self.shape(name))
        if self._cfg.arch == "llama" and name.endswith("attn_q.weight"):
            w = _unpermute_qk(w, self._cfg.num_heads)
        elif self._cfg.arch == "llama" and name.endswith("attn_k.weight"):
            w = _unpermute_qk(w, self._cfg.num_kv_heads)
        return w


def gguf_weights(path: str | Path) -> Weights:
    """A GGUF file's config and weight sources; nothing is dequantized yet."""
    import gguf

    path = Path(path)
    if not path.exists():
        raise ModelLoadError(f"{path}: GGUF file not found")
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:
        raise ModelLoadError(f"{path}: not a readable GGUF file ({e})") from None
    cfg = gguf_config(reader, str(path))
    names = {"embed": "token_embd.weight", "final_norm": "output_norm.weight",
             "lm_head": "output.weight"}
    return Weights(cfg, leaf_sources(cfg, names, "blk.{i}.{name}", GGUF_LAYER),
                   GGUFFiles(path, reader, cfg))


def load_gguf(path: str | Path, dtype: Any = np.float32) -> tuple[ModelConfig, Params]:
    """Config and dequantized parameters from a GGUF file."""
    weights = gguf_weights(path)
    return weights.cfg, weights.read_all(dtype)
