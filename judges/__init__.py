"""Batched judges: criterion checks, holistic checklist ratings, pairwise comparison, rubric
induction / consolidation, ProRubric bundling and answer equivalence, with rule,
OpenAI-compatible HTTP and (added by the models package) in-process backends. See
``judges.base`` for the protocol."""

from core.search_r1 import normalize_answer, parse_trajectory
from judges.base import BACKEND_STAT_KEYS, JUDGE_STAT_KEYS, OPS, Backend, Counters, Judge
from judges.llm import LLM_OPTIONS, LLMJudge, split_llm_options
from judges.openai import DiskCache, OpenAIBackend, OpenAIConfig
from judges.parsing import ParseError
from judges.prompts import PROMPT_VERSIONS, TEMPLATES, PromptTemplate
from judges.registry import JUDGES, make_judge
from judges.rule import RuleJudge
from judges.rule_language import compile_rule
from judges.search_features import FEATURE_LIBRARY_VERSION, FEATURES, cover_match
from judges.types import (
    TIE,
    Bundle,
    BundleRequest,
    CheckRequest,
    CheckResult,
    Completion,
    ConsolidateRequest,
    Dimension,
    Draft,
    EquivRequest,
    EquivResult,
    FallbackDrafts,
    InduceRequest,
    Messages,
    PairRequest,
    PairResult,
    RateRequest,
    RateResult,
    as_draft,
)

__all__ = [
    "BACKEND_STAT_KEYS",
    "FEATURES",
    "FEATURE_LIBRARY_VERSION",
    "JUDGES",
    "JUDGE_STAT_KEYS",
    "LLM_OPTIONS",
    "OPS",
    "PROMPT_VERSIONS",
    "TEMPLATES",
    "TIE",
    "Backend",
    "Bundle",
    "BundleRequest",
    "CheckRequest",
    "CheckResult",
    "Completion",
    "ConsolidateRequest",
    "Counters",
    "Dimension",
    "DiskCache",
    "Draft",
    "EquivRequest",
    "EquivResult",
    "FallbackDrafts",
    "InduceRequest",
    "Judge",
    "LLMJudge",
    "Messages",
    "OpenAIBackend",
    "OpenAIConfig",
    "PairRequest",
    "PairResult",
    "ParseError",
    "PromptTemplate",
    "RateRequest",
    "RateResult",
    "RuleJudge",
    "as_draft",
    "compile_rule",
    "cover_match",
    "make_judge",
    "normalize_answer",
    "parse_trajectory",
    "split_llm_options",
]
