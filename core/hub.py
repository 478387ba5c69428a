"""Repositories of the Hugging Face hub (models and datasets) as local folders, through
``huggingface_hub``'s cache as every Hugging Face tool finds them: read from the cache
(``HF_HOME``, ``HF_HUB_CACHE``) when it holds them, downloaded into it otherwise; with
``HF_HUB_OFFLINE=1`` only the cache is read, and a repository it lacks is a ``HubError`` that
says so. A name is a hub id when it reads ``org/name`` (letters, digits, ``-``, ``_``, ``.``)
and is no existing path.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


class HubError(ValueError):
    """A repository that cannot be had from the cache or the hub (names it and why)."""


def is_hub_id(name: str) -> bool:
    """Whether `name` names a hub repository rather than a local file or folder."""
    return bool(HUB_ID.match(name)) and not Path(name).expanduser().exists()


def offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` keeps ``huggingface_hub`` to its cache."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def hub_cache() -> str:
    """The folder ``huggingface_hub`` caches repositories in (``HF_HUB_CACHE``, else under
    ``HF_HOME``)."""
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def snapshot(repo_id: str, revision: str | None = None, *, repo_type: str = "model",
             patterns: Sequence[str] | None = None) -> Path:
    """The local folder of `repo_id` at `revision` (a branch, tag or commit; None: the
    default branch), holding the files that match `patterns` (None: all); the folder's name
    is the commit it holds."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"{repo_type} {repo_id}" + (f" at revision {revision}" if revision else "")
    try:
        return Path(snapshot_download(repo_id, revision=revision, repo_type=repo_type,
                                      allow_patterns=None if patterns is None
                                      else list(patterns)))
    except LocalEntryNotFoundError as e:
        mode = ("HF_HUB_OFFLINE is set, so only the cache is read" if offline()
                else "the hub could not be reached")
        raise HubError(f"{where}: not in the Hugging Face cache ({hub_cache()}) and {mode}: "
                       f"{e}") from None
    except (RepositoryNotFoundError, RevisionNotFoundError) as e:
        raise HubError(f"{where}: {type(e).__name__}: {e}") from None
    except HfHubHTTPError as e:
        raise HubError(f"{where}: the hub answered {e}") from None
