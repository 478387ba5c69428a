"""Torch-free tokenizer with chat templates, from an HF folder or from GGUF metadata.

We hold a fast ``tokenizers.Tokenizer`` and render chat templates with jinja2 ourselves, so the
library needs neither torch nor a particular transformers tokenizer class.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
import jinja2.sandbox
import tokenizers

from models.config import ModelLoadError

log = logging.getLogger(__name__)

Message = Mapping[str, str]


def _raise(msg: str) -> None:
    raise jinja2.TemplateError(msg)


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: the printable char standing for each byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class Tokenizer:
    """Text <-> token ids, special tokens and chat template."""

    def __init__(self, backend: tokenizers.Tokenizer, *, chat_template: str | None,
                 bos_token: str | None, eos_token: str | None, pad_token: str | None = None,
                 add_bos: bool = False, extra_eos: tuple[str, ...] = (), source: str = "?"):
        self.backend = backend
        self.chat_template = chat_template
        self.template_kwargs: dict[str, Any] = {}  # passed to every render (with_template_kwargs)
        self.bos_token, self.eos_token = bos_token, eos_token
        self.add_bos = add_bos
        self.source = source
        self.bos_id = self._id(bos_token)
        eos = [self._id(t) for t in (eos_token, *extra_eos)]
        self.eos_ids = tuple(dict.fromkeys(i for i in eos if i is not None))
        pad_id = self._id(pad_token) if pad_token else None
        if pad_token and pad_id is None:
            log.warning("%s: pad token %r is not in the vocabulary; padding with the EOS "
                        "token instead", source, pad_token)
        # padding is always masked out, so any in-vocabulary id serves
        self.pad_id = pad_id if pad_id is not None else (self.eos_ids or (0,))[0]

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self.backend.token_to_id(token)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos and self.bos_id is not None:
            ids = [self.bos_id, *ids]
        return ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(map(int, ids)), skip_special_tokens=skip_special_tokens)

    def decode_batch(self, batch: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        return self.backend.decode_batch([list(map(int, x)) for x in batch],
                                         skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: Sequence[Message], add_generation_prompt: bool = True,
                            **kw: Any) -> str:
        """Render messages with the model's chat template (a plain fallback if it has none)."""
        if not self.chat_template:
            text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
            return text + ("assistant: " if add_generation_prompt else "")
        return _compile(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "", eos_token=self.eos_token or "",
            **{**self.template_kwargs, **kw})

    def with_chat_template(self, template: str) -> Tokenizer:
        """The same tokenizer rendering chats with ``template`` (a jinja chat template)."""
        out = copy.copy(self)
        out.chat_template = template
        return out

    def with_template_kwargs(self, kwargs: Mapping[str, Any]) -> Tokenizer:
        """The same tokenizer passing ``kwargs`` to every chat template render (Qwen3's
        ``enable_thinking=False``: its non-thinking mode, an empty think block opened and
        closed before the answer)."""
        out = copy.copy(self)
        out.template_kwargs = {**self.template_kwargs, **dict(kwargs)}
        return out

    def encode_chat(self, messages: Sequence[Message],
                    add_generation_prompt: bool = True) -> list[int]:
        return self.encode(self.apply_chat_template(messages, add_generation_prompt))

    @functools.cached_property
    def token_bytes(self) -> list[bytes]:
        """The exact bytes each token id stands for (used to match stop strings inside jit)."""
        vocab = self.backend.get_vocab(with_added_tokens=True)
        out = [b""] * max(self.vocab_size, max(vocab.values()) + 1)
        special = {t.content for t in self.backend.get_added_tokens_decoder().values()}
        decoder = _byte_decoder()
        byte_level = "ByteLevel" in type(self.backend.decoder).__name__ or "ByteLevel" in str(
            self.backend.decoder)
        for piece, idx in vocab.items():
            if piece in special:
                out[idx] = piece.encode()
            elif byte_level:
                out[idx] = bytes(decoder.get(c, 0) for c in piece) if all(
                    c in decoder for c in piece) else piece.encode()
            elif piece.startswith("<0x") and piece.endswith(">") and len(piece) == 6:
                out[idx] = bytes([int(piece[3:5], 16)])
            else:  # sentencepiece: "▁" is a space
                out[idx] = piece.replace("\u2581", " ").encode()
        return out


@functools.lru_cache(maxsize=8)
def _compile(template: str) -> jinja2.Template:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = _raise
    env.filters["tojson"] = _tojson
    return env.from_string(template)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """``tojson`` as transformers' chat-template renderer defines it (non-ASCII kept as is), so
    a template renders tool schemas here byte for byte as ``apply_chat_template`` does."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _token_content(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value


def load_hf_tokenizer(folder: str | Path) -> Tokenizer:
    folder = Path(folder)
    path = folder / "tokenizer.json"
    if not path.exists():
        raise ModelLoadError(f"{path}: not found (the HF folder needs a fast tokenizer.json)")
    try:
        backend = tokenizers.Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception on bad files
        raise ModelLoadError(f"{path}: cannot read tokenizer ({e})") from None
    cfg: dict[str, Any] = {}
    if (folder / "tokenizer_config.json").exists():
        cfg = _read_json(folder / "tokenizer_config.json")
    template = cfg.get("chat_template")
    if (folder / "chat_template.jinja").exists():
        template = (folder / "chat_template.jinja").read_text()
    extra_eos: tuple[str, ...] = ()
    gen_cfg = folder / "generation_config.json"
    if gen_cfg.exists():
        eos = _read_json(gen_cfg).get("eos_token_id")
        ids = [eos] if isinstance(eos, int) else (eos or [])
        extra_eos = tuple(t for i in ids if (t := backend.id_to_token(i)))
    return Tokenizer(backend, chat_template=template,
                     bos_token=_token_content(cfg.get("bos_token")),
                     eos_token=_token_content(cfg.get("eos_token")),
                     pad_token=_token_content(cfg.get("pad_token")),
                     add_bos=bool(cfg.get("add_bos_token", False)), extra_eos=extra_eos,
                     source=str(folder))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


# tokenizer_config's special tokens and the GGUF metadata key of each one's id
_GGUF_SPECIAL_TOKENS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id",
                        "unk_token": "unknown_token_id", "pad_token": "padding_token_id"}


def gguf_tokenizer_fields(path: str | Path) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """``(architecture, tokenizer_dict, tokenizer_config)`` of a GGUF file, as transformers'
    ``get_gguf_tokenizer`` builds them, read with the ``gguf`` package: transformers' own GGUF
    reader imports PyTorch, which a run does not install."""
    import gguf
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING

    fields = gguf.GGUFReader(str(path)).fields
    metadata = {key: field.contents() for key, field in fields.items()
                if key.startswith("tokenizer.") or key == "general.architecture"}
    grouped = {group: {name: metadata[f"tokenizer.{key}"] for key, name in renames.items()
                       if f"tokenizer.{key}" in metadata}
               for group, renames in GGUF_TOKENIZER_MAPPING.items()}
    tokenizer, config = grouped["tokenizer"], grouped["tokenizer_config"]
    if tokenizer.get("tokenizer_type") == "llama":  # llama.cpp adds BOS to a sentencepiece
        config.setdefault("add_bos_token", True)  # vocabulary that does not say otherwise
    for name, key in _GGUF_SPECIAL_TOKENS.items():
        token_id = metadata.get(f"tokenizer.ggml.{key}")
        config[name] = tokenizer["tokens"][token_id] if token_id is not None else None
    return metadata["general.architecture"], tokenizer, config


def load_gguf_tokenizer(path: str | Path) -> Tokenizer:
    """Build the fast tokenizer from GGUF metadata (transformers' ``convert_gguf_tokenizer``)."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    try:
        arch, tok_dict, tok_cfg = gguf_tokenizer_fields(path)
        backend, _ = convert_gguf_tokenizer(arch, tok_dict)
    except Exception as e:
        raise ModelLoadError(f"{path}: cannot build a tokenizer from GGUF metadata ({e})") from None
    add_bos = str(tok_cfg.get("add_bos_token", "False")).lower() == "true"
    return Tokenizer(backend, chat_template=tok_cfg.get("chat_template"),
                     bos_token=tok_cfg.get("bos_token"), eos_token=tok_cfg.get("eos_token"),
                     pad_token=tok_cfg.get("pad_token"), add_bos=add_bos, source=str(path))
