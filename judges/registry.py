"""``JUDGES`` registry and the ``make_judge(cfg)`` factory used by the hydra ``judge`` group.

A judge config is one flat mapping with a ``name`` ("rule", "openai", ...) and that judge's
options, e.g. ``{"name": "openai", "base_url": "...", "model": "...", "max_reasks": 1}``:
``LLMJudge`` options (``LLM_OPTIONS``) go to the judge, the rest to the backend. Unknown keys are
errors, so a typo in an override fails at start-up instead of being ignored.

Every backend is named here, explicitly; another one is added the same way::

    @JUDGES.register("mine")
    def _make_mine(cfg: dict) -> Judge:
        llm, rest = split_llm_options(cfg)
        return LLMJudge(MyBackend(**rest), **llm)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from core.registry import Registry
from judges.base import Judge
from judges.cost import PRICE_KEYS
from judges.llm import LLMJudge, split_llm_options
from judges.openai import OpenAIBackend, OpenAIConfig
from judges.rule import RuleJudge

JUDGES: Registry[Callable[[dict[str, Any]], Judge]] = Registry("judge")

def _plain(cfg: Any) -> dict[str, Any]:
    """A plain dict from a mapping or an OmegaConf ``DictConfig`` (resolved)."""
    if isinstance(cfg, DictConfig):
        return dict(OmegaConf.to_container(cfg, resolve=True))  # type: ignore[arg-type]
    return dict(cfg)


@JUDGES.register("rule")
def make_rule_judge(cfg: dict[str, Any]) -> Judge:
    """Deterministic rule judge; options are ``RuleJudge``'s keyword arguments."""
    allowed = set(inspect.signature(RuleJudge.__init__).parameters) - {"self"}
    unknown = sorted(set(cfg) - allowed)
    if unknown:
        raise ValueError(f"unknown rule judge option(s): {', '.join(unknown)}")
    return RuleJudge(**cfg)


@JUDGES.register("openai")
def make_openai_judge(cfg: dict[str, Any]) -> Judge:
    """LLM judge over an OpenAI-compatible server; backend options are ``OpenAIConfig``'s."""
    llm, rest = split_llm_options(cfg)
    return LLMJudge(OpenAIBackend(OpenAIConfig.from_dict(rest)), **llm)


@JUDGES.register("local")
def make_local_judge(cfg: dict[str, Any]) -> Judge:
    """LLM judge on an in-process model (``judges.local``; imported here, when asked for,
    because it pulls in JAX and the models package)."""
    from judges.local import make_local_judge as build

    return build(cfg)


def make_judge(cfg: Mapping[str, Any] | Any) -> Judge:
    """Build a judge from a flat config with a ``name`` key (see module docstring)."""
    # the prices are the run's accounting (judges.cost), not options of the judge
    cfg = {k: v for k, v in _plain(cfg).items() if k not in PRICE_KEYS}
    name = cfg.pop("name", None)
    if not name:
        raise ValueError(f"judge config needs a 'name' (one of: {', '.join(JUDGES.names())})")
    return JUDGES.get(str(name))(cfg)
