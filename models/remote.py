"""Model files on object storage: ``model.path=gs://bucket/Qwen3-4B`` (an HF folder) or
``gs://bucket/model.gguf``, read through ``etils.epath`` (gcsfs for gs://, s3fs for s3://), as
run folders on object storage are.

An HF folder's small files (``config.json``, the tokenizer's, the safetensors index: every
file but the weights) are copied once into a local cache folder per host
(:func:`model_cache`; ``RL_MODEL_CACHE``, default ``~/.cache/rl_models``), so the config and
tokenizer readers read local files; the safetensors are not copied: each process reads the
byte ranges of the slices its devices hold straight from the bucket
(``models.loaders.SafetensorsFiles``), as it reads them from a local folder. A GGUF file is
copied whole into the cache (its reader maps a local file, and quantized tensors are read
whole anyway).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

from core.files import write_atomic
from models.config import ModelLoadError

WEIGHT_SUFFIXES = (".safetensors",)


def is_remote(path: str) -> bool:
    """Whether `path` is an object-store URL (``gs://``, ``s3://``, ...), not a local path."""
    return bool(re.match(r"^[a-z][a-z0-9+.-]*://", str(path))) and not str(path).startswith(
        "file://")


def remote_path(url: str) -> Any:
    """`url` as an ``etils.epath.Path``, or a ModelLoadError naming what is missing."""
    from etils import epath

    try:
        return epath.Path(url.rstrip("/"))
    except ImportError as e:  # epath reaches gs:// through gcsfs, s3:// through s3fs
        raise ModelLoadError(f"{url}: reading it needs {e.name} (pip install gcsfs / s3fs)"
                             ) from None


def model_cache(url: str) -> Path:
    """This host's local folder for `url`'s copied files: ``RL_MODEL_CACHE`` (default
    ``~/.cache/rl_models``), then the URL's last part and a digest of the whole URL."""
    root = Path(os.environ.get("RL_MODEL_CACHE", "~/.cache/rl_models")).expanduser()
    digest = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:12]
    return root / f"{url.rstrip('/').rsplit('/', 1)[-1]}-{digest}"


def _copy(src: Any, dest: Path) -> None:
    """`src` (an epath object) into `dest` unless a file of its size is there already."""
    size = src.stat().length
    if not (dest.is_file() and dest.stat().st_size == size):
        write_atomic(dest, src.read_bytes())


def remote_model(url: str) -> tuple[Path, Any | None]:
    """(a local path the config and tokenizer readers can read, the remote folder whose
    safetensors are read by ranges, or None for a GGUF copied whole) for a model at `url`."""
    remote = remote_path(url)
    try:
        if remote.is_dir():
            local = model_cache(url)
            for item in remote.iterdir():
                if not item.name.endswith(WEIGHT_SUFFIXES) and not item.is_dir():
                    _copy(item, local / item.name)
            return local, remote
        if remote.exists():
            local = model_cache(url) / remote.name
            _copy(remote, local)
            return local, None
    except OSError as e:
        raise ModelLoadError(f"{url}: cannot read it ({e})") from None
    raise ModelLoadError(f"{url}: no such object or folder")
