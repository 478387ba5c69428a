"""Model configuration for the decoder-only families we support (Llama, Qwen2, Qwen3).

One frozen dataclass covers all three; the differences are flags:
Qwen2 adds a bias to q/k/v, Qwen3 adds RMSNorm on q and k per head, Llama 3 rescales RoPE.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3")


class ModelLoadError(ValueError):
    """A model file or config that we cannot use; the message names the file and the problem."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    max_position_embeddings: int = 2048
    # Per-frequency divisors for RoPE (Llama 3 scaling), len head_dim // 2; None = plain RoPE.
    rope_freq_factors: tuple[float, ...] | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.arch not in SUPPORTED_ARCHS:
            raise ModelLoadError(
                f"unsupported architecture {self.arch!r}; supported: {', '.join(SUPPORTED_ARCHS)}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.rope_freq_factors is not None and len(self.rope_freq_factors) != self.head_dim // 2:
            raise ModelLoadError(
                f"rope_freq_factors has {len(self.rope_freq_factors)} entries, "
                f"expected head_dim/2 = {self.head_dim // 2}"
            )

    def replace(self, **kw: Any) -> ModelConfig:
        return dataclasses.replace(self, **kw)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def num_params(self) -> int:
        d, f, h, kv, hd = (self.hidden_size, self.intermediate_size, self.num_heads,
                           self.num_kv_heads, self.head_dim)
        per_layer = d * hd * (h + 2 * kv) + h * hd * d + 3 * d * f + 2 * d
        if self.qkv_bias:
            per_layer += hd * (h + 2 * kv)
        if self.qk_norm:
            per_layer += 2 * hd
        head = 0 if self.tie_embeddings else d * self.vocab_size
        return self.vocab_size * d + self.num_layers * per_layer + d + head


def llama3_freq_factors(head_dim: int, theta: float, scaling: dict[str, Any]) -> tuple[float, ...]:
    """Llama 3 RoPE scaling as divisors of the base inverse frequencies.

    Long wavelengths (> orig_ctx / low_freq_factor) are divided by `factor`, short ones
    (< orig_ctx / high_freq_factor) kept, and the band between is interpolated smoothly.
    """
    factor = float(scaling["factor"])
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    orig = float(scaling.get("original_max_position_embeddings", 8192))
    low_wavelen, high_wavelen = orig / low, orig / high
    out = []
    for i in range(0, head_dim, 2):
        inv = 1.0 / theta ** (i / head_dim)
        wavelen = 2 * math.pi / inv
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            # new_inv = (1 - smooth) * inv / factor + smooth * inv  =>  divisor = inv / new_inv
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return tuple(out)


def _eos_tuple(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def from_hf_config(cfg: dict[str, Any], source: str = "config.json") -> ModelConfig:
    """Build a ModelConfig from a Hugging Face ``config.json`` dict."""
    model_type = cfg.get("model_type")
    arch = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}.get(
        model_type or ""
    )
    if arch is None:
        raise ModelLoadError(
            f"{source}: unsupported model_type {model_type!r}; "
            f"supported: llama, mistral, qwen2, qwen3"
        )
    try:
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        theta = float(cfg.get("rope_theta", 10000.0))
        scaling = cfg.get("rope_scaling") or (cfg.get("rope_parameters") or {})
        rope_type = scaling.get("rope_type", scaling.get("type", "default")) if scaling else None
        if "rope_theta" not in cfg and scaling and "rope_theta" in scaling:
            theta = float(scaling["rope_theta"])
        factors = None
        if rope_type == "llama3":
            factors = llama3_freq_factors(head_dim, theta, scaling)
        elif rope_type not in (None, "default"):
            raise ModelLoadError(f"{source}: unsupported rope scaling type {rope_type!r}")
        attention_bias = bool(cfg.get("attention_bias", False))
        if arch == "llama" and attention_bias:
            raise ModelLoadError(f"{source}: llama with attention_bias=true is not supported")
        return ModelConfig(
            arch=arch,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            rope_theta=theta,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=arch == "qwen2" or (arch == "qwen3" and attention_bias),
            qk_norm=arch == "qwen3",
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            rope_freq_factors=factors,
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=_eos_tuple(cfg.get("eos_token_id")),
            pad_token_id=cfg.get("pad_token_id"),
        )
    except KeyError as e:
        raise ModelLoadError(f"{source}: missing field {e.args[0]!r}") from None


def load_hf_config(folder: str | Path) -> ModelConfig:
    path = Path(folder) / "config.json"
    if not path.exists():
        raise ModelLoadError(f"{path}: not found (an HF model folder needs config.json)")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{path}: invalid JSON ({e})") from None
    return from_hf_config(data, source=str(path))
