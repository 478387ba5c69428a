"""ARBOR's rubric memory ``M = (D, P)`` (ARBOR, arXiv:2606.03239; docs/guides/arbor.md): an
immutable host-side value and pure operations on it, one concept per module.

* ``state``: ``RubricMemory``, ``DraftRubric``, ``CommonRubric``, ``MemoryConfig`` (+ JSON).
* ``events``: what each operation did (admitted / rejected / consolidated / merged /
  activated / retired) and a JSON Lines writer.
* ``triplet``: the contrastive triplet of a group. ``admission``: the variance and
  correlation gates into ``D``. ``consolidation``: ``D`` -> ``P`` with near-duplicate
  merging (``embed``: MiniLM sentence embeddings in NumPy). ``retirement``: mastered /
  drifted. ``selection``: two active rubrics per batch. ``pairwise``: sparse comparison graph
  and win-rate / Bradley-Terry scores.
* ``reward``: ``arbor_reward_step``, the whole per-batch step. ``static``: the RaR-style
  static-rubric ablation.
"""

from memory.admission import AdmissionResult, Candidate, admit, judge_admission, pearson
from memory.consolidation import ConsolidationStats, consolidate, merge_or_add
from memory.embed import (
    EMBEDDERS,
    Embedder,
    HashingEmbedder,
    MiniLMEmbedder,
    check_embedder,
    cosine_matrix,
    get_embedder,
    minilm_model_dir,
)
from memory.events import (
    EVENT_TYPES,
    REJECT_REASONS,
    RETIRE_REASONS,
    Activated,
    Admitted,
    Consolidated,
    ConsolidationFailed,
    Event,
    Merged,
    Rejected,
    Retired,
    append_jsonl,
    count_by_kind,
    event_from_dict,
    read_jsonl,
)
from memory.pairwise import (
    GRAPHS,
    bradley_terry_scores,
    build_pair_requests,
    centre,
    complete_graph,
    edge_wins,
    evidence_scores,
    fallback_mask,
    group_scores,
    ring_diameter_graph,
    ring_graph,
    winrate_scores,
)
from memory.retirement import (
    GroupScores,
    activation_variance,
    apply_activation,
    retirement_reason,
    update_stats,
)
from memory.reward import (
    GroupInput,
    RubricScores,
    StepOutput,
    arbor_reward_step,
    combine_active,
    conversion_metrics,
)
from memory.selection import choose, select_active
from memory.state import (
    MIN_GROUP_SIZE,
    N_ACTIVE,
    CommonRubric,
    CorrStats,
    DraftRubric,
    MemoryConfig,
    RubricMemory,
    check_basis,
)
from memory.static import (
    StaticOutput,
    StaticRubric,
    load_static_rubrics,
    parse_static_rubrics,
    static_rubric_step,
)
from memory.triplet import TIE_BREAKS, Triplet, select_triplet

__all__ = [
    "EMBEDDERS",
    "EVENT_TYPES",
    "GRAPHS",
    "MIN_GROUP_SIZE",
    "N_ACTIVE",
    "REJECT_REASONS",
    "RETIRE_REASONS",
    "TIE_BREAKS",
    "Activated",
    "AdmissionResult",
    "Admitted",
    "Candidate",
    "CommonRubric",
    "Consolidated",
    "ConsolidationFailed",
    "ConsolidationStats",
    "CorrStats",
    "DraftRubric",
    "Embedder",
    "Event",
    "GroupInput",
    "GroupScores",
    "HashingEmbedder",
    "MemoryConfig",
    "Merged",
    "MiniLMEmbedder",
    "Rejected",
    "Retired",
    "RubricMemory",
    "RubricScores",
    "StaticOutput",
    "StaticRubric",
    "StepOutput",
    "Triplet",
    "activation_variance",
    "admit",
    "append_jsonl",
    "apply_activation",
    "arbor_reward_step",
    "bradley_terry_scores",
    "build_pair_requests",
    "centre",
    "check_basis",
    "check_embedder",
    "choose",
    "complete_graph",
    "combine_active",
    "consolidate",
    "conversion_metrics",
    "cosine_matrix",
    "count_by_kind",
    "edge_wins",
    "event_from_dict",
    "evidence_scores",
    "fallback_mask",
    "get_embedder",
    "group_scores",
    "judge_admission",
    "load_static_rubrics",
    "merge_or_add",
    "minilm_model_dir",
    "parse_static_rubrics",
    "pearson",
    "read_jsonl",
    "retirement_reason",
    "ring_diameter_graph",
    "ring_graph",
    "select_active",
    "select_triplet",
    "static_rubric_step",
    "update_stats",
    "winrate_scores",
]
