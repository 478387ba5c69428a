"""Which implementation a config name selects: tasks, rewarders and judges, in one place.

Each table is filled here, explicitly; nothing registers itself by being imported. The heavier
parts (the search task's BM25 index, the rubric rewarders) are imported when their name is
asked for, inside the factory that needs them, so ``rl.train task=arith`` starts light. To add
one, write its factory below (or, from your own code, ``TASKS.register("name")(factory)``, in
a module the config's ``imports`` names: :func:`import_user_modules`).

Aggregators, advantage estimators, KL estimators and loss modes are algorithm pieces with
registries of their own beside their code (``rewards.aggregate.AGGREGATORS``,
``rl.grpo.advantages.ADVANTAGES``, ``rl.grpo.kl.KL_ESTIMATORS``, ``rl.grpo.losses.LOSS_AGG``);
judge backends are ``judges.registry.JUDGES``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from core.registry import Registry
from core.types import Rewarder, Task
from judges.base import Judge
from rl.rewarders.outcome import OutcomeRewarder

TASKS: Registry[Callable[..., Task]] = Registry("task")
REWARDERS: Registry[Callable[..., Rewarder]] = Registry("rewarder")


def import_user_modules(names: Any) -> None:
    """Import the modules the config's ``imports`` lists, in order, before anything is built
    by name: your own code that registers tasks, rewarders or judges under new names
    (``python -m rl.train imports=[my_rewards] algo.rewarder=short_answers``). A module is
    found as ``import`` finds it (the working directory for ``python -m``, PYTHONPATH,
    installed packages); importing one twice does nothing. An entry that is not a module name,
    or a module whose import fails, is a ``ConfigError`` naming the entry."""
    from rl.run.config import ConfigError

    if names is None:
        return
    if not isinstance(names, (list, tuple)):
        raise ConfigError(f"imports: expected a list of module names, got {names!r}")
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name:
            raise ConfigError(f"imports[{i}]: expected a module name, got {name!r}")
        try:
            importlib.import_module(name)
        except Exception as e:  # the user's module: its own error, under the entry's name
            raise ConfigError(f"imports[{i}]: cannot import {name!r}: "
                              f"{type(e).__name__}: {e}") from e


def _arith(**kw: Any) -> Task:
    from rl.tasks.arith import ArithTask

    return ArithTask(**kw)


def _search_qa(**kw: Any) -> Task:
    from rl.tasks.search.task import SearchQATask

    return SearchQATask(**kw)


def _rubric_chat(**kw: Any) -> Task:
    from rl.tasks.rubric_chat import RubricChatTask

    return RubricChatTask(**kw)


def _rubric_data(**kw: Any) -> Task:
    from rl.tasks.rubric_data import RubricDataTask

    return RubricDataTask(**kw)


def _prompts(**kw: Any) -> Task:
    from rl.tasks.prompts import PromptsTask

    return PromptsTask(**kw)


def _outcome(task: Task, judge: Judge | None = None) -> Rewarder:
    del judge  # the verifiable outcome needs none
    return OutcomeRewarder(task)


def _arbor(**kw: Any) -> Rewarder:
    from rl.rewarders.arbor import arbor_rewarder

    return arbor_rewarder(**kw)


def _static_rubrics(**kw: Any) -> Rewarder:
    from rl.rewarders.static_rubrics import static_rubrics_rewarder

    return static_rubrics_rewarder(**kw)


def _rubric(**kw: Any) -> Rewarder:
    from rl.rewarders.rubric import RubricRewarder

    return RubricRewarder(**kw)


TASKS.register("arith")(_arith)
TASKS.register("search_qa")(_search_qa)
TASKS.register("rubric_chat")(_rubric_chat)
TASKS.register("rubric_data")(_rubric_data)
TASKS.register("prompts")(_prompts)
REWARDERS.register("outcome")(_outcome)
REWARDERS.register("arbor")(_arbor)
REWARDERS.register("static_rubrics")(_static_rubrics)
REWARDERS.register("rubric")(_rubric)


def make_task(cfg: Mapping[str, Any]) -> Task:
    """The task named by ``cfg["name"]``, built from the rest of the ``task`` config group."""
    kw = {k: v for k, v in dict(cfg).items() if k != "name"}
    return TASKS.get(str(cfg["name"]))(**kw)


def bind_judge(task: Task, judge: Judge | None, judge_config: Mapping[str, Any]) -> Task:
    """`task` scoring with the run's `judge` where it scores with one (``task.with_judge``:
    a rubric dataset's outcome, evaluation and dimension bundling); other tasks as they are."""
    bind = getattr(task, "with_judge", None)
    return task if bind is None else bind(judge, judge_config)


def make_rewarder(name: str, task: Task, options: Mapping[str, Any],
                  judge: Judge | None) -> Rewarder:
    """The rewarder named `name` (``algo.rewarder``) with ``algo.rewarder_options``."""
    return REWARDERS.get(name)(task=task, judge=judge, **dict(options))


def make_judge(cfg: Mapping[str, Any]) -> Judge | None:
    """The judge of the ``judge`` config group; ``None`` for ``judge=none``."""
    if str(cfg.get("name", "none")) == "none":
        return None
    from judges import make_judge as build

    return build(dict(cfg))
