"""A command's hydra config as plain containers, every interpolation resolved; its help.

``${needs:KEY}`` stands for a value a preset cannot know (a server's URL, a data file): it is
an error naming KEY until the command line sets it. (``???`` would not do in a preset: merging a
``???`` over a group's default keeps the default.)
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from omegaconf import OmegaConf


def _needed(key: str) -> Any:
    raise ValueError(f"{key}: the preset leaves it to you: set it on the command line "
                     f"({key}=...)")


def resolved_config(cfg: Any) -> dict[str, Any]:
    """`cfg` (a hydra ``DictConfig``) resolved into plain dicts and lists."""
    if not OmegaConf.has_resolver("needs"):
        OmegaConf.register_new_resolver("needs", _needed)
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def print_help_first(doc: str | None, argv: Sequence[str] | None = None) -> None:
    """With ``--help`` (or ``-h``) on the command line, print the command's own docstring (what
    it does, what it prints) before hydra's list of config groups and keys."""
    argv = sys.argv[1:] if argv is None else argv
    if doc and any(a in ("--help", "-h") for a in argv):
        print(doc.strip() + "\n")
