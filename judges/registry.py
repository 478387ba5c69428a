"""``JUDGES`` registry and the ``make_judge(cfg)`` factory used by the hydra ``judge`` group.

A judge config is one flat mapping with a ``name`` ("rule", "openai", ...) and that judge's
options, e.g. ``{"name": "openai", "base_url": "...", "model": "...", "max_reasks": 1}``:
``LLMJudge`` options (``LLM_OPTIONS``) go to the judge, the rest to the backend. Unknown keys are
errors, so a typo in an override fails at start-up instead of being ignored.

Other backends register themselves the same way, e.g. the in-process JAX judge::

    @JUDGES.register("jax")
    def _make_jax(cfg: dict) -> Judge:
        llm, rest = split_llm_options(cfg)
        return LLMJudge(JaxBackend(**rest), **llm)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from core.registry import Registry
from judges.base import Judge
from judges.llm import LLMJudge
from judges.openai import OpenAIBackend, OpenAIConfig
from judges.rule import RuleJudge

JUDGES: Registry[Callable[[dict[str, Any]], Judge]] = Registry("judge")

LLM_OPTIONS = frozenset(
    name
    for name, p in inspect.signature(LLMJudge.__init__).parameters.items()
    if p.kind is inspect.Parameter.KEYWORD_ONLY
)


def split_llm_options(cfg: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(``LLMJudge`` keyword options, everything else) of a flat judge config."""
    llm = {k: v for k, v in cfg.items() if k in LLM_OPTIONS}
    rest = {k: v for k, v in cfg.items() if k not in LLM_OPTIONS}
    return llm, rest


def _plain(cfg: Any) -> dict[str, Any]:
    """A plain dict from a mapping or an OmegaConf ``DictConfig`` (resolved)."""
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(cfg, DictConfig):
            return dict(OmegaConf.to_container(cfg, resolve=True))  # type: ignore[arg-type]
    except ImportError:  # omegaconf is optional for library users
        pass
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


def make_judge(cfg: Mapping[str, Any] | Any) -> Judge:
    """Build a judge from a flat config with a ``name`` key (see module docstring)."""
    cfg = _plain(cfg)
    name = cfg.pop("name", None)
    if not name:
        raise ValueError(f"judge config needs a 'name' (one of: {', '.join(JUDGES.names())})")
    if name == "local" and "local" not in JUDGES:
        import judges.local  # noqa: F401  (lazy: pulls in JAX and the models package)
    return JUDGES.get(str(name))(cfg)
