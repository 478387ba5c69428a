"""ARBOR's rubric memory ``M = (D, P)`` (arXiv:2606.03239) as an immutable host-side value.

* ``D`` (``RubricMemory.drafts``): admitted query-local draft rubrics, waiting for consolidation.
* ``P`` (``RubricMemory.commons``): cross-query common rubrics, activated two per batch.
* ``RubricMemory.retired``: common rubrics taken out of ``P`` (kept for analysis, never active).

Every value here is a frozen dataclass of plain Python scalars, strings and tuples (no numpy
arrays), so values compare with ``==``, hash, and serialise to JSON exactly: the trainer stores
``RubricMemory.to_json()`` in every checkpoint. Operations on the memory live in the sibling
modules and are pure functions ``(memory, ...) -> (new_memory, events)``.

Cumulative correlation of a common rubric. A common rubric keeps running sums over every
(score x, outcome y) pair of its activations::

    n, Sx, Sy, Sxx, Syy, Sxy
    rho_r = (n Sxy - Sx Sy) / sqrt((n Sxx - Sx^2) (n Syy - Sy^2))

which is exactly the Pearson correlation of all pairs seen so far (no decay, no window). When
either side has (numerically) zero variance the correlation is undefined and we define
``rho_r = 0`` (see ``admission.pearson``); ``CorrStats.defined`` tells the two apart.

Statistics basis. Which outcome the gates correlate with (``MemoryConfig.rubric_outcome``) and
which pairs ``rho_r`` pools (``MemoryConfig.rho_r``) decide what the stored statistics mean, so
the memory records them (``RubricMemory.basis``, e.g. ``"f1/cumulative"``) and a memory is only
continued under the same basis (:func:`check_basis`). Format version 1 (before these options)
was always ``"r_base/centred"``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from judges.types import Draft
from memory.embed import EMBEDDERS
from memory.gating import check_gate
from memory.pairwise import GRAPHS
from memory.triplet import TIE_BREAKS

MEMORY_FORMAT_VERSION = 2
#: What format version 1 computed: admission, triplets and rho_r on R_base, rho_r centred.
V1_BASIS = "r_base/centred"

#: Rubrics activated per batch (ARBOR's active selection: "exactly two", top-rho plus LRU).
N_ACTIVE = 2
#: Groups smaller than this cannot be compared pairwise, nor correlated: no rubric term.
MIN_GROUP_SIZE = 2
#: Variances at or below this are "zero" (Pearson undefined).
VAR_EPS = 1e-12

SCORE_MODES = ("winrate", "bradley_terry")
ADMISSION_SCORING = ("check", "pairwise")
RUBRIC_OUTCOMES = ("f1", "r_base")
RHO_R_MODES = ("cumulative", "centred")
ACTIVE_COMBINE = ("sum", "mean")


@dataclass(frozen=True)
class MemoryConfig:
    """Hyper-parameters of ARBOR's rubric memory (all sweepable; defaults are our choices).

    Attributes:
        delta_v: variance gate. A draft is admitted only if ``Var_i(s_i) >= delta_v``; an
            activation of a common rubric is "low variance" if its mean within-group
            ``Var_G(s) < delta_v``. Variances are population variances (ddof = 0) of scores in
            [0, 1].
        rho_min: correlation gate. Admission needs ``Pearson(s, y) >= rho_min``; a common
            rubric drifts when its cumulative ``rho_r < rho_min`` (``y``: ``rubric_outcome``).
        rubric_outcome: the outcome ``y`` that admission (``Pearson(s, y)``), the contrastive
            triplet (ranked by ``y``) and ``rho_r`` read. "f1" (default, the paper): the token
            F1 of each trajectory's answer against the gold (``GroupInput.f1``, no format
            gate). "r_base": the outcome reward ``R_base`` (F1 if the format is valid, else
            -1), this library's value before; it also rewards a rubric for separating invalid
            formats (for ``s = [1, 1, 1, 0]`` with the invalid member last and F1
            ``[1, 0, 0, 0]``: Pearson 0.816 against ``R_base = [1, 0, 0, -1]``, 0.333 against
            F1), which someone training a model that still breaks the format may want.
        k_consol: consolidate when ``|D| >= k_consol``; each consolidation request takes the
            ``k_consol`` oldest drafts.
        consolidation_attempts: drafts whose consolidation the judge could only answer with
            its fallback (it failed) go back to ``D`` for a later step, until this many
            attempts have failed; then they are dropped (``ConsolidationFailed`` events).
        retire_k: "mastered" when ``n_r > retire_k`` consecutive low-variance activations.
        min_drift_activations: a rubric can be retired as "drifted" only after this many
            *informative* activations (ones that contributed pairs to ``rho_r``). 1 (default):
            the paper's rule, judged from the first activation on; 5 was this library's value
            before (with ``rho_r="centred"``). An undefined ``rho_r`` (a constant side) never
            counts as drift.
        merge_threshold: a new common rubric whose sentence-embedding cosine with an existing
            one exceeds this is merged into it instead of being added.
        rubric_lambda: ``R_total = R_base + rubric_lambda * s~``.
        active_combine: how the active rubrics' centred scores make ``s~``: "sum" (default)
            ``s~ = sum_r (s_r - mean_G s_r)``, the paper's ``R_base + lambda * s~`` applied to
            each active rubric, so a rubric that does not discriminate adds nothing and takes
            nothing away; "mean" (this library's value before) divides by the number of usable
            rubrics, keeping ``|lambda * s~| <= lambda`` but halving the other rubric's term
            when one does not discriminate.
        rubric_gate: "none" (the paper) pays ``lambda * s~`` to every trajectory;
            "positive_only" only to those whose ``R_base`` reaches ``correct_at``
            (LongTraceRL's positive-only strategy, ``memory.gating``).
        correct_at: the outcome ``R_base`` at or above which an answer counts as correct
            (``algo.correct_at``; ARBOR's ``R_base``: F1 with a valid format, else -1).
        lineage_in_induction: show the judge the ``lineage_k`` most recently mastered rubrics
            when it induces new drafts (``memory.lineage``; an LLM judge's prompt
            ``induce_lineage``, the rule judge ignores them). Off: the paper.
        lineage_k: how many mastered rubrics it is shown.
        use_common_pool: False is the "ARBOR w/o memory" ablation: each group is scored by its
            own admitted drafts, nothing is kept across queries.
        tie_break: secondary signal ordering members with equal F1 in the triplet
            (``triplet.TIE_BREAKS``).
        graph: pairwise comparison graph (``pairwise.GRAPHS``).
        score_mode: "winrate" (ties 0.5) or "bradley_terry" (expected win rate under a
            Bradley-Terry fit with a small prior).
        bt_iters, bt_prior: MM iterations and pseudo-wins per edge side of the BT fit.
        admission_scoring: how a draft is scored on its group for admission: "check" (one
            ``judge.check`` per trajectory, ``s_i`` = P(met)) or "pairwise" (win rates on the
            group's comparison graph).
        rho_r: which pairs the cumulative ``rho_r`` pools. "cumulative" (default, the paper):
            the raw ``(s_i, y_i)`` of every usable group of every activation. "centred" (this
            library's value before): within-group-centred pairs ``(s - mean_G s, y - mean_G y)``
            of groups whose outcome varies only; centring keeps question difficulty (easy
            questions score high on every rubric) out of the correlation, and skipping
            outcome-homogeneous groups keeps a rubric from looking "drifted" on exactly the
            groups it is meant to help (they carry no information about direction).
        rho_history_len: how many past ``rho_r`` values a common rubric keeps (0 = none).
        embedder: sentence embedder for near-duplicate merging (``embed.EMBEDDERS``).
    """

    delta_v: float = 0.01
    rho_min: float = 0.2
    k_consol: int = 8
    consolidation_attempts: int = 3
    retire_k: int = 5
    min_drift_activations: int = 1
    merge_threshold: float = 0.9
    rubric_lambda: float = 0.1
    active_combine: str = "sum"
    rubric_gate: str = "none"
    correct_at: float = 1.0
    lineage_in_induction: bool = False
    lineage_k: int = 3
    use_common_pool: bool = True
    tie_break: str = "format_then_length"
    graph: str = "ring_diameter"
    score_mode: str = "winrate"
    bt_iters: int = 20
    bt_prior: float = 0.1
    admission_scoring: str = "check"
    rubric_outcome: str = "f1"
    rho_r: str = "cumulative"
    rho_history_len: int = 16
    embedder: str = "minilm"

    def __post_init__(self) -> None:
        # Names are checked against their registries here, so a typo fails when the config is
        # built (start-up), not inside the first reward step.
        for key, allowed in (("score_mode", SCORE_MODES),
                             ("admission_scoring", ADMISSION_SCORING),
                             ("rubric_outcome", RUBRIC_OUTCOMES),
                             ("rho_r", RHO_R_MODES),
                             ("active_combine", ACTIVE_COMBINE),
                             ("tie_break", tuple(TIE_BREAKS.names())),
                             ("graph", tuple(GRAPHS.names())),
                             ("embedder", tuple(EMBEDDERS.names()))):
            if getattr(self, key) not in allowed:
                raise ValueError(f"MemoryConfig.{key} must be one of {list(allowed)}, "
                                 f"got {getattr(self, key)!r}")
        if self.k_consol < 1:
            raise ValueError(f"k_consol must be >= 1, got {self.k_consol}")
        if self.consolidation_attempts < 1:
            raise ValueError(
                f"consolidation_attempts must be >= 1, got {self.consolidation_attempts}")
        if self.retire_k < 0 or self.min_drift_activations < 1:
            raise ValueError("retire_k must be >= 0 and min_drift_activations >= 1")
        if self.delta_v < 0 or self.bt_iters < 1 or self.bt_prior <= 0:
            raise ValueError("delta_v must be >= 0, bt_iters >= 1, bt_prior > 0")
        if self.rho_history_len < 0:
            raise ValueError("rho_history_len must be >= 0")
        check_gate(self.rubric_gate, self.correct_at)
        if self.lineage_k < 1:
            raise ValueError(f"lineage_k must be >= 1, got {self.lineage_k}")

    @classmethod
    def from_mapping(cls, d: dict[str, Any]) -> MemoryConfig:
        """From a plain mapping (e.g. a hydra node); unknown keys are an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown MemoryConfig keys: {unknown}")
        return cls(**dict(d))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def basis(self) -> str:
        """What the memory's statistics are computed on (``RubricMemory.basis``)."""
        return f"{self.rubric_outcome}/{self.rho_r}"


@dataclass(frozen=True)
class DraftRubric:
    """An admitted query-local rubric in ``D``.

    ``var`` and ``rho`` are the admission statistics on its source group:
    ``Var_i(s_i)`` and ``Pearson(s, y)`` (``y``: ``MemoryConfig.rubric_outcome``).
    ``failed_consolidations`` counts the consolidation attempts of this draft on which the
    judge fell back (it stays in ``D`` meanwhile).
    """

    id: str
    draft: Draft
    qid: str
    step: int
    var: float
    rho: float
    failed_consolidations: int = 0


@dataclass(frozen=True)
class CorrStats:
    """Running sums for an exact cumulative Pearson correlation of (x, y) pairs."""

    n: int = 0
    sum_x: float = 0.0
    sum_y: float = 0.0
    sum_xx: float = 0.0
    sum_yy: float = 0.0
    sum_xy: float = 0.0

    def add(self, xs: Any, ys: Any) -> CorrStats:
        """A new value with the pairs ``zip(xs, ys)`` added (self is unchanged)."""
        xs = [float(x) for x in xs]
        ys = [float(y) for y in ys]
        if len(xs) != len(ys):
            raise ValueError("CorrStats.add: xs and ys differ in length")
        return CorrStats(
            n=self.n + len(xs),
            sum_x=self.sum_x + math.fsum(xs),
            sum_y=self.sum_y + math.fsum(ys),
            sum_xx=self.sum_xx + math.fsum(x * x for x in xs),
            sum_yy=self.sum_yy + math.fsum(y * y for y in ys),
            sum_xy=self.sum_xy + math.fsum(x * y for x, y in zip(xs, ys)),
        )

    def _variances(self) -> tuple[float, float]:
        n = float(self.n)
        return (self.sum_xx / n - (self.sum_x / n) ** 2,
                self.sum_yy / n - (self.sum_y / n) ** 2)

    @property
    def defined(self) -> bool:
        """Whether the Pearson of the pairs is defined: n >= 2 and both sides vary."""
        return self.n >= 2 and min(self._variances()) > VAR_EPS

    @property
    def rho(self) -> float:
        """Pearson of all pairs so far; 0.0 when undefined (n < 2 or a zero-variance side)."""
        if not self.defined:
            return 0.0
        n = float(self.n)
        var_x, var_y = self._variances()
        cov = self.sum_xy / n - (self.sum_x / n) * (self.sum_y / n)
        return float(max(-1.0, min(1.0, cov / math.sqrt(var_x * var_y))))


@dataclass(frozen=True)
class CommonRubric:
    """A cross-query rubric in ``P`` (or, once retired, in ``RubricMemory.retired``).

    Attributes:
        source_ids: ids of the drafts it was abstracted from (grows on merges).
        n_low_var: ``n_r``, consecutive activations with mean within-group variance < delta_v.
        corr: running sums of the (score, outcome) pairs of its activations; ``rho`` reads it.
        rho_activations: activations that contributed pairs to ``corr``.
        uses: batches in which it was active; last_used_step / last_used_clock: when, last
            (the clock is the memory's selection counter, used for LRU; -1 = never used).
        rho_history: the last ``rho_history_len`` values of ``rho`` after each activation.
        retired_step / retired_reason: set when it leaves ``P`` ("mastered" | "abandoned" |
            "drifted"); retired_pass_rate: the judge's pass rate when it retired for low
            variance (``memory.retirement.settle_low_variance``; None: not measured).
    """

    id: str
    draft: Draft
    source_ids: tuple[str, ...]
    created_step: int
    n_low_var: int = 0
    corr: CorrStats = field(default_factory=CorrStats)
    rho_activations: int = 0
    uses: int = 0
    last_used_step: int = -1
    last_used_clock: int = -1
    merges: int = 0
    rho_history: tuple[float, ...] = ()
    retired_step: int | None = None
    retired_reason: str | None = None
    retired_pass_rate: float | None = None

    @property
    def rho(self) -> float:
        """Cumulative Pearson ``rho_r`` over all its activations (0.0 while undefined)."""
        return self.corr.rho


@dataclass(frozen=True)
class RubricMemory:
    """``M = (D, P)`` plus retired rubrics, an id counter and the LRU clock.

    ``next_id`` numbers drafts (``d<k>``) and common rubrics (``c<k>``) from one counter, so an
    id is never reused. ``clock`` counts selections (one per batch) and orders LRU rotation.
    ``basis``: ``MemoryConfig.basis`` of the statistics it holds ("" = not yet set).
    """

    drafts: tuple[DraftRubric, ...] = ()
    commons: tuple[CommonRubric, ...] = ()
    retired: tuple[CommonRubric, ...] = ()
    next_id: int = 0
    clock: int = 0
    basis: str = ""

    @property
    def empty(self) -> bool:
        return not (self.drafts or self.commons or self.retired)

    def common(self, rid: str) -> CommonRubric:
        for c in self.commons:
            if c.id == rid:
                return c
        raise KeyError(f"no active common rubric {rid!r}")

    def with_common(self, rubric: CommonRubric) -> RubricMemory:
        """A new memory with the active common rubric of the same id replaced."""
        if all(c.id != rubric.id for c in self.commons):
            raise KeyError(f"no active common rubric {rubric.id!r}")
        return replace(
            self, commons=tuple(rubric if c.id == rubric.id else c for c in self.commons)
        )

    def new_id(self, prefix: str) -> tuple[str, RubricMemory]:
        """A fresh id and the memory with the counter advanced."""
        return f"{prefix}{self.next_id}", replace(self, next_id=self.next_id + 1)

    # --- JSON -------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": MEMORY_FORMAT_VERSION,
            "drafts": [_draft_rubric_to_dict(d) for d in self.drafts],
            "commons": [_common_to_dict(c) for c in self.commons],
            "retired": [_common_to_dict(c) for c in self.retired],
            "next_id": self.next_id,
            "clock": self.clock,
            "basis": self.basis,
        }

    def to_json(self, indent: int | None = None) -> str:
        """JSON text; ``from_json(to_json(m)) == m`` exactly (floats are written by repr)."""
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False, allow_nan=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RubricMemory:
        version = d.get("version", MEMORY_FORMAT_VERSION)
        if version not in (1, MEMORY_FORMAT_VERSION):
            raise ValueError(f"unsupported rubric memory format version {version}")
        return cls(
            basis=V1_BASIS if version == 1 else str(d.get("basis", "")),
            drafts=tuple(_draft_rubric_from_dict(x) for x in d.get("drafts", ())),
            commons=tuple(_common_from_dict(x) for x in d.get("commons", ())),
            retired=tuple(_common_from_dict(x) for x in d.get("retired", ())),
            next_id=int(d.get("next_id", 0)),
            clock=int(d.get("clock", 0)),
        )

    @classmethod
    def from_json(cls, text: str) -> RubricMemory:
        return cls.from_dict(json.loads(text))


# --- (de)serialisation helpers ------------------------------------------------------------


def draft_to_dict(d: Draft) -> dict[str, Any]:
    return {"title": d.title, "description": d.description, "feature": d.feature}


def draft_from_dict(d: dict[str, Any]) -> Draft:
    return Draft(title=str(d["title"]), description=str(d.get("description", "")),
                 feature=d.get("feature"))


def _draft_rubric_to_dict(r: DraftRubric) -> dict[str, Any]:
    return {"id": r.id, "draft": draft_to_dict(r.draft), "qid": r.qid, "step": r.step,
            "var": r.var, "rho": r.rho, "failed_consolidations": r.failed_consolidations}


def _draft_rubric_from_dict(d: dict[str, Any]) -> DraftRubric:
    return DraftRubric(id=str(d["id"]), draft=draft_from_dict(d["draft"]), qid=str(d["qid"]),
                       step=int(d["step"]), var=float(d["var"]), rho=float(d["rho"]),
                       failed_consolidations=int(d.get("failed_consolidations", 0)))


def _common_to_dict(c: CommonRubric) -> dict[str, Any]:
    out = {f.name: getattr(c, f.name) for f in fields(c)}
    out["draft"] = draft_to_dict(c.draft)
    out["corr"] = asdict(c.corr)
    out["source_ids"] = list(c.source_ids)
    out["rho_history"] = list(c.rho_history)
    return out


def _common_from_dict(d: dict[str, Any]) -> CommonRubric:
    corr = d.get("corr", {})
    return CommonRubric(
        id=str(d["id"]),
        draft=draft_from_dict(d["draft"]),
        source_ids=tuple(str(s) for s in d.get("source_ids", ())),
        created_step=int(d["created_step"]),
        n_low_var=int(d.get("n_low_var", 0)),
        corr=CorrStats(
            n=int(corr.get("n", 0)),
            sum_x=float(corr.get("sum_x", 0.0)),
            sum_y=float(corr.get("sum_y", 0.0)),
            sum_xx=float(corr.get("sum_xx", 0.0)),
            sum_yy=float(corr.get("sum_yy", 0.0)),
            sum_xy=float(corr.get("sum_xy", 0.0)),
        ),
        rho_activations=int(d.get("rho_activations", 0)),
        uses=int(d.get("uses", 0)),
        last_used_step=int(d.get("last_used_step", -1)),
        last_used_clock=int(d.get("last_used_clock", -1)),
        merges=int(d.get("merges", 0)),
        rho_history=tuple(float(x) for x in d.get("rho_history", ())),
        retired_step=None if d.get("retired_step") is None else int(d["retired_step"]),
        retired_reason=d.get("retired_reason"),
        retired_pass_rate=(None if d.get("retired_pass_rate") is None
                           else float(d["retired_pass_rate"])),
    )


def check_basis(memory: RubricMemory, cfg: MemoryConfig) -> RubricMemory:
    """``memory`` with ``basis`` set to ``cfg.basis``; a non-empty memory whose statistics were
    computed on another basis is refused (``ValueError`` naming the keys that continue it)."""
    if memory.basis == cfg.basis:
        return memory
    if memory.empty or not memory.basis:
        return replace(memory, basis=cfg.basis)
    outcome, rho_r = memory.basis.split("/")
    raise ValueError(
        f"the rubric memory's statistics were computed with rubric_outcome={outcome}, "
        f"rho_r={rho_r} (a checkpoint of format version 1 always was r_base/centred), but this "
        f"run has rubric_outcome={cfg.rubric_outcome}, rho_r={cfg.rho_r}: continue it with "
        f"algo.rubric_outcome={outcome} algo.rho_r={rho_r}"
        + (" algo.min_drift_activations=5 algo.active_combine=mean (the version-1 behaviour)"
           if memory.basis == V1_BASIS else "")
        + ", or start a fresh run")
