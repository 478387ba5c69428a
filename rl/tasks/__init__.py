"""Tasks by name. Each module registers itself; `make_task(cfg)` builds one from the `task`
config group."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from core.registry import Registry
from core.types import Task

TASKS: Registry[Callable[..., Task]] = Registry("task")


def make_task(cfg: Mapping[str, Any]) -> Task:
    # import for registration side effects only when asked for, to keep start-up light
    from rl.tasks import arith  # noqa: F401

    try:
        from rl.search import task as _search  # noqa: F401
    except ImportError:
        pass
    try:
        from rl.tasks import rubric_chat  # noqa: F401
    except ImportError:
        pass
    kw = {k: v for k, v in dict(cfg).items() if k != "name"}
    return TASKS.get(str(cfg["name"]))(**kw)
