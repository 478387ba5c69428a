"""A command's hydra config as plain containers, every interpolation resolved.

``${needs:KEY}`` stands for a value a preset cannot know (a server's URL, a data file): it is
an error naming KEY until the command line sets it. (``???`` would not do in a preset: merging a
``???`` over a group's default keeps the default.)
"""

from __future__ import annotations

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
