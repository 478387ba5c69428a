"""Model shapes without weights: ``config.json`` presets for planning (``rl.plan``).

Each ``<name>.json`` here holds the architecture fields of a public Hugging Face
``config.json`` (the same field names, read by :func:`models.config.from_hf_config`), copied
from the model repositories' ``config.json`` files:

    qwen3_0_6b, qwen3_1_7b, qwen3_4b, qwen3_8b, qwen3_14b   huggingface.co/Qwen/Qwen3-<size>
    llama3_1_8b                                             huggingface.co/meta-llama/Llama-3.1-8B
    smollm2_135m (the shipped model)      huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct

A plan needs the shapes only: a preset downloads nothing, and a hub id (``Qwen/Qwen3-32B``)
fetches its ``config.json`` alone, through the Hugging Face cache (``core.hub``). ``tiny`` is
the random test model of :func:`models.presets.tiny_config` (the shipped tokenizer's
49,152-token vocabulary).
"""

from __future__ import annotations

import json
from pathlib import Path

from models.config import ModelConfig, ModelLoadError, from_hf_config
from models.presets import tiny_config

SHAPES_DIR = Path(__file__).parent
SHAPE_PRESETS = ("tiny", *sorted(p.stem for p in SHAPES_DIR.glob("*.json")))


def model_shapes(name_or_path: str) -> ModelConfig:
    """The ModelConfig of a shape preset (a name in SHAPE_PRESETS), a ``config.json`` file, a
    model folder holding one, or a hub id (its ``config.json`` only)."""
    from core.hub import HubError, is_hub_id, snapshot
    from models.remote import is_remote, remote_model

    if name_or_path == "tiny":
        return tiny_config()
    path = SHAPES_DIR / f"{name_or_path}.json"
    if not path.exists() and is_hub_id(name_or_path):
        try:
            path = snapshot(name_or_path, patterns=["config.json"]) / "config.json"
        except HubError as e:
            raise ModelLoadError(str(e)) from None
    elif not path.exists():
        path = Path(name_or_path)
        if is_remote(name_or_path):  # an HF folder on object storage: its copied config
            path, _ = remote_model(name_or_path)
        if path.is_dir():
            path = path / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{name_or_path}: neither a shape preset ({', '.join(SHAPE_PRESETS)})"
                             ", a config.json file or a folder holding one, nor a hub id")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{path}: invalid JSON ({e})") from None
    return from_hf_config(data, source=str(path))
