"""Models named by Hugging Face hub id (``Qwen/Qwen3-4B``), found through ``huggingface_hub``'s
cache as every peer finds them (``core.hub``: ``HF_HOME``, ``HF_HUB_CACHE``,
``HF_HUB_OFFLINE``). Only what loading reads is fetched: the config, the safetensors weights
and their index, the tokenizer files. ``/models/Qwen3-4B`` and ``./Qwen3-4B`` stay paths.
"""

from __future__ import annotations

from pathlib import Path

from core.hub import HubError, is_hub_id, snapshot
from models.config import ModelLoadError

__all__ = ["MODEL_FILES", "hub_commit", "hub_snapshot", "is_hub_id", "local_model"]

#: the files loading reads from a model repository (``models.loaders.hf_weights`` and the
#: tokenizer)
MODEL_FILES = ("config.json", "generation_config.json", "*.safetensors",
               "*.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "chat_template.jinja")


def hub_snapshot(repo_id: str, revision: str | None = None) -> Path:
    """The local folder of model `repo_id` at `revision` (None: the default branch), from
    the cache or downloaded into it; its name is the commit it holds."""
    try:
        return snapshot(repo_id, revision, patterns=MODEL_FILES)
    except HubError as e:
        raise ModelLoadError(str(e)) from None


def hub_commit(repo_id: str, revision: str | None = None) -> str:
    """The commit `revision` of `repo_id` resolves to (the snapshot folder's name)."""
    return hub_snapshot(repo_id, revision).name


def local_model(path_or_preset: str, revision: str | None = None) -> str:
    """What the loaders read for `path_or_preset`: a hub id's snapshot folder at `revision`;
    a preset name or a path as it is (a revision for them is an error)."""
    if is_hub_id(path_or_preset):
        return str(hub_snapshot(path_or_preset, revision))
    if revision:
        raise ModelLoadError(f"model.revision={revision}: {path_or_preset} is not a hub id "
                             f"(org/name), so it has no revisions")
    return path_or_preset
