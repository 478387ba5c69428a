"""Models named by Hugging Face hub id (``Qwen/Qwen3-4B``), found through ``huggingface_hub``'s
cache as every peer finds them.

``hub_snapshot(repo_id, revision)`` is the local folder of that commit of the model: read from
the cache (``HF_HOME``, ``HF_HUB_CACHE``) when it holds it, downloaded into it otherwise; with
``HF_HUB_OFFLINE=1`` only the cache is read, and a model it lacks is a ``ModelLoadError`` that
says so. Only what loading reads is fetched: the config, the safetensors weights and their
index, the tokenizer files.

A name is a hub id when it is not a preset, not an existing path, and reads ``org/name``
(letters, digits, ``-``, ``_``, ``.``): ``/models/Qwen3-4B`` and ``./Qwen3-4B`` stay paths.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from models.config import ModelLoadError

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
#: the files loading reads from a model repository (``models.loaders.hf_weights`` and the
#: tokenizer)
MODEL_FILES = ("config.json", "generation_config.json", "*.safetensors",
               "*.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "chat_template.jinja")


def is_hub_id(name: str) -> bool:
    """Whether `name` names a hub repository rather than a local file or folder."""
    return bool(HUB_ID.match(name)) and not Path(name).expanduser().exists()


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hub_snapshot(repo_id: str, revision: str | None = None) -> Path:
    """The local folder of `repo_id` at `revision` (a branch, tag or commit; None: the
    default branch), from the cache or downloaded into it (module docstring). Its name is
    the commit it holds."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"{repo_id}" + (f" at revision {revision}" if revision else "")
    try:
        return Path(snapshot_download(repo_id, revision=revision,
                                      allow_patterns=list(MODEL_FILES)))
    except LocalEntryNotFoundError as e:
        mode = ("HF_HUB_OFFLINE is set, so only the cache is read" if _offline()
                else "the hub could not be reached")
        raise ModelLoadError(f"model {where}: not in the Hugging Face cache "
                             f"({hub_cache()}) and {mode}: {e}") from None
    except (RepositoryNotFoundError, RevisionNotFoundError) as e:
        raise ModelLoadError(f"model {where}: {type(e).__name__}: {e}") from None
    except HfHubHTTPError as e:
        raise ModelLoadError(f"model {where}: the hub answered {e}") from None


def hub_cache() -> str:
    """The folder ``huggingface_hub`` caches models in (``HF_HUB_CACHE``, else under
    ``HF_HOME``)."""
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


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
