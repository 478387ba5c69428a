"""The per-batch ARBOR step (arXiv:2606.03239): rubric rewards from memory, the memory update.

``arbor_reward_step(memory, groups, judge, cfg, step=, seed=)`` is ONE pure host function (the
judge is the only effectful collaborator, and only through its batched calls). The memory is an
immutable value: every operation on it returns a new memory and its events. Two phases:
*score the batch with the memory* (steps 1-3) and *update the memory* (steps 4-7):

1. **Activate** two common rubrics (``selection.select_active``).
2. **Score** every group of size >= 2 under each active rubric on its sparse comparison graph
   (``pairwise``): ``O(G)`` pairs per rubric per group, all in one batched ``judge.compare``.
3. **Reward** (ARBOR: ``R_i^total = R_i^base + lambda * s~_i^rubric``): per group,
   ``s~ = sum over active rubrics of (s - mean_G s)`` (``active_combine="sum"``, default; "mean"
   divides by the number of usable rubrics) and ``R_total = R_base + lambda * s~``. A rubric
   whose scores on a group contain NaN (malformed judge output) is left out of that group's
   ``s~``; with no usable rubric ``s~ = 0``.
4. **Retirement** statistics: one activation per active rubric with every group's
   ``(s, y)`` (``retirement.apply_activation``).
5. **Induce** drafts from each group's contrastive triplet, ranked by ``y`` (one batched
   ``judge.induce``). Groups homogeneous in ``y`` are skipped when ``rho_min > 0``: Pearson with
   a constant outcome is 0 by definition, so no draft of theirs could pass admission.
6. **Admit**: each draft is scored on its own group. Our choice (``admission_scoring="check"``)
   is one ``judge.check`` per trajectory with ``s_i = P(met)``: an absolute per-trajectory
   score, ``G`` calls per draft, batched; ``"pairwise"`` uses win rates on the group's graph
   instead. Then the variance and correlation gates (``admission``).
7. **Consolidate** when ``|D| >= K`` (``consolidation``).

``y``, the outcome the gates read (steps 4-6), is ``MemoryConfig.rubric_outcome``: the token
F1 of each trajectory's answer (``GroupInput.f1``, default, as the paper) or ``R_base``. The
reward itself is always ``R_base + lambda * s~``.

Ablation "w/o memory" (``use_common_pool=False``), its own short path: steps 1, 4 and 7 are
skipped, steps 5-6 run first, and each group is scored (step 2) by its own admitted drafts, at
most two, highest admission ``rho`` first; nothing is kept in the memory across steps (ids
still advance).

Bad inputs have defined outcomes, counted in ``metrics``: groups of size < 2 get ``s~ = 0`` and
no induction (``groups_too_small``); an induction that returns no drafts (``induce_empty``, of
which ``induce_fallbacks`` were judge failures); drafts with blank text (rejected
``empty_text``, never scored); non-finite scores (rejected ``nan_scores`` at admission,
``nan_score_groups`` at scoring). Non-finite ``R_base`` or mismatched lengths are caller errors
(``ValueError``). Ragged groups are padded with NaN in the ``[N, G_max]`` outputs (the trainer
passes equal sizes).

Judge fallbacks (the judge failed and returned its defined fallback: a tie, P(met) = 0.5, no
drafts) are not evidence. A fallback tie keeps its defined score in the reward
(docs/guides/judges.md), but every statistic reads evidence scores from real verdicts only
(``pairwise.evidence_scores``; a
fallback check has none): a rubric's activation statistics skip a group with a member that has
no real verdict (``fallback_groups_excluded``), a draft with such a member is rejected
``judge_fallback``, and drafts whose consolidation failed stay in ``D`` (``consolidation``).
Counted: ``compare_fallbacks`` / ``check_fallbacks`` (verdicts), ``consolidation_fallbacks``
(chunks), ``consolidation_dropped`` (drafts given up on), and ``judge_fallbacks``: every item
that came back as a fallback (``compare_fallbacks + check_fallbacks + induce_fallbacks +
consolidation_fallbacks``). A short induce or consolidate reply's missing items are
fallbacks (no answer); missing compare or check results are malformed (NaN), not fallbacks.

The judge-call metrics (``judge_calls_<op>``, ``judge_calls``) count the requests this step
built and sent, per kind; nothing reads the judge's own (mutable, possibly shared) counters.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from core.groups import homogeneous
from judges.base import Judge
from judges.types import CheckRequest, CheckResult, Draft, FallbackDrafts, InduceRequest
from memory.admission import Candidate, admit, is_empty
from memory.consolidation import consolidate
from memory.embed import Embedder, check_embedder, get_embedder
from memory.events import REJECT_REASONS, RETIRE_REASONS, Event, Retired
from memory.gating import gated_total, paid_mask
from memory.lineage import recently_mastered
from memory.pairwise import (
    GRAPHS,
    build_pair_requests,
    centre,
    edge_wins,
    evidence_scores,
    fallback_mask,
    group_scores,
    mix_seed,
)
from memory.retirement import (
    PASS_RATE_GROUPS,
    GroupScores,
    apply_activation,
    settle_low_variance,
)
from memory.selection import select_active
from memory.state import (
    MIN_GROUP_SIZE,
    N_ACTIVE,
    DraftRubric,
    MemoryConfig,
    RubricMemory,
    check_basis,
)
from memory.triplet import select_triplet
from rewards.qa import answer_f1


@dataclass(frozen=True)
class GroupInput:
    """One query group of the batch.

    Attributes:
        qid: query id (recorded as the source of its drafts).
        question, golds: the question and gold aliases (shown to the judge).
        texts: the G trajectory response texts (Search-R1 format, no prompt).
        r_base: outcome reward per member: F1 if the format is valid, else -1.
        valid: format validity per member (default ``r_base >= 0``).
        lengths: response lengths, e.g. generated tokens (default: characters of the text).
        f1: token F1 of each member's answer against ``golds``, whatever its format (what the
            gates read with ``rubric_outcome="f1"``); default ``rewards.qa.answer_f1`` of each
            text (the F1 of its extracted answer, 0 without one).
    """

    qid: str
    question: str
    golds: tuple[str, ...]
    texts: tuple[str, ...]
    r_base: tuple[float, ...]
    valid: tuple[bool, ...] | None = None
    lengths: tuple[int, ...] | None = None
    f1: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        # Normalise to tuples of Python scalars so the value is immutable and hashable.
        set_ = object.__setattr__
        set_(self, "golds", (self.golds,) if isinstance(self.golds, str)
             else tuple(str(g) for g in self.golds))
        set_(self, "texts", tuple(str(t) for t in self.texts))
        set_(self, "r_base", tuple(float(x) for x in self.r_base))
        n = len(self.texts)
        if len(self.r_base) != n:
            raise ValueError(f"group {self.qid!r}: {n} texts but {len(self.r_base)} rewards")
        if not all(math.isfinite(x) for x in self.r_base):
            raise ValueError(f"group {self.qid!r}: non-finite R_base")
        valid = self.valid if self.valid is not None else [x >= 0 for x in self.r_base]
        lengths = self.lengths if self.lengths is not None else [len(t) for t in self.texts]
        f1 = self.f1 if self.f1 is not None else [answer_f1(t, self.golds) for t in self.texts]
        set_(self, "valid", tuple(bool(v) for v in valid))
        set_(self, "lengths", tuple(int(x) for x in lengths))
        set_(self, "f1", tuple(float(x) for x in f1))
        if any(len(x) != n for x in (self.valid, self.lengths, self.f1)):  # type: ignore[arg-type]
            raise ValueError(f"group {self.qid!r}: valid/lengths/f1 do not match {n} texts")
        if not all(math.isfinite(x) for x in self.f1):  # type: ignore[union-attr]
            raise ValueError(f"group {self.qid!r}: non-finite F1")

    @property
    def size(self) -> int:
        return len(self.texts)

    def outcome(self, kind: str) -> tuple[float, ...]:
        """The outcome the gates read: ``f1`` or ``r_base`` (``MemoryConfig.rubric_outcome``)."""
        if kind not in ("f1", "r_base"):
            raise ValueError(f"rubric_outcome must be f1 or r_base, got {kind!r}")
        return self.f1 if kind == "f1" else self.r_base  # type: ignore[return-value]


@dataclass(frozen=True)
class RubricScores:
    """Rubric scores of the batch.

    ``combined`` [N, G]: the ``s~`` that enters the reward. ``raw`` / ``centred`` [S, N, G]:
    per active slot (S = 2), NaN where the slot did not score the group. ``rubric_ids[s][n]``:
    the rubric (common id, or draft id in "w/o memory") of slot s on group n ("" = none).
    """

    combined: np.ndarray
    raw: np.ndarray
    centred: np.ndarray
    rubric_ids: tuple[tuple[str, ...], ...]


class StepOutput(NamedTuple):
    memory: RubricMemory
    total_rewards: np.ndarray
    rubric_scores: RubricScores
    events: tuple[Event, ...]
    metrics: dict[str, float]


@dataclass
class _Tally:
    """Local counters of one step (never escapes the function)."""

    c: Counter[str] = field(default_factory=Counter)

    def add(self, key: str, n: int = 1) -> None:
        self.c[key] += n


class _LazyEmbedder:
    """Resolves the configured embedder only if consolidation actually needs an embedding."""

    def __init__(self, name: str):
        self.name = name
        self._e: Embedder | None = None

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if self._e is None:
            self._e = get_embedder(self.name)
        return self._e.embed(texts)
class _Scored(NamedTuple):
    """One group's scores under one rubric: ``scores`` enter the reward (a fallback verdict at
    its defined score); ``evidence`` enters statistics (real verdicts only, NaN for a member
    without one); ``fallback_members``: members with a score but no evidence."""

    scores: np.ndarray
    evidence: np.ndarray
    fallback_members: int


def _scored(scores: np.ndarray, evidence: np.ndarray) -> _Scored:
    return _Scored(scores, evidence,
                   int(np.sum(np.isfinite(scores) & ~np.isfinite(evidence))))


@dataclass(frozen=True)
class _Step:
    """What every phase of one step reads: the batch, the judge, the configuration, ``step``
    and ``seed`` (together they seed the comparison graphs and presentation coins), and the
    step's local tally (the only thing a phase writes besides the memory it returns)."""

    groups: tuple[GroupInput, ...]
    judge: Judge
    cfg: MemoryConfig
    step: int
    seed: int
    tally: _Tally


def _ask(ctx: _Step, op: str, reqs: Sequence[Any], missing: Any) -> list[Any]:
    """``judge.<op>(reqs)`` as one batched call (none for no requests), padded with
    ``missing`` when the judge answers short. ``judge_calls_<op>`` counts the requests sent,
    so the metric never depends on the judge's own counters."""
    results = list(getattr(ctx.judge, op)(reqs)) if reqs else []
    ctx.tally.add(f"judge_calls_{op}", len(reqs))
    return results + [missing] * (len(reqs) - len(results))


# --- scoring -----------------------------------------------------------------------------------


def _score_items(items: Sequence[tuple[int, str, Draft]], ctx: _Step) -> list[_Scored]:
    """Pairwise scores in [0, 1] of each ``(group index, rubric id, rubric)`` item; one batched
    ``judge.compare`` for all of them."""
    cfg = ctx.cfg
    graph = GRAPHS.get(cfg.graph)
    plans = []
    reqs: list[Any] = []
    for n, rid, rubric in items:
        g = ctx.groups[n]
        edges = graph(g.size, mix_seed(ctx.seed, ctx.step, "graph", g.qid, n, rid))
        rs, flips = build_pair_requests(g.question, g.texts, rubric, edges,
                                        mix_seed(ctx.seed, ctx.step, "pairs", g.qid, n, rid))
        plans.append((g.size, edges, flips, len(reqs), len(rs)))
        reqs.extend(rs)
    results = _ask(ctx, "compare", reqs, None)  # a short answer: malformed -> NaN
    out = []
    for size, edges, flips, start, count in plans:
        res = results[start:start + count]
        wins = edge_wins(res, flips)
        fb = fallback_mask(res)
        ctx.tally.add("compare_fallbacks", int(fb.sum()))
        sc = group_scores(size, edges, wins, cfg.score_mode, cfg.bt_iters, cfg.bt_prior)
        ev = evidence_scores(size, edges, wins, fb, cfg.score_mode, cfg.bt_iters, cfg.bt_prior)
        out.append(_scored(sc, ev))
    return out


def _check_scores(cands: Sequence[tuple[int, Draft]], ctx: _Step) -> list[_Scored]:
    """``s_i = P(met)`` of each ``(group index, draft)`` on every member; one batched call. A
    fallback result (``CheckResult.fallback``) has no evidence score (NaN)."""
    groups = ctx.groups
    reqs = [
        CheckRequest(context=groups[n].question, response=t, criterion=d.text())
        for n, d in cands for t in groups[n].texts
    ]
    results = iter(_ask(ctx, "check", reqs, None))
    out = []
    for n, _d in cands:
        s = np.full(groups[n].size, np.nan)
        fb = np.zeros(groups[n].size, dtype=bool)
        for i in range(groups[n].size):
            r = next(results)
            if isinstance(r, CheckResult):
                try:
                    s[i] = float(r.prob)
                except (TypeError, ValueError):
                    pass  # stays NaN -> rejected "nan_scores"
                fb[i] = bool(r.fallback)
        ctx.tally.add("check_fallbacks", int(fb.sum()))
        out.append(_scored(s, np.where(fb, np.nan, s)))
    return out


#: Per active slot ``s``: the ``(group index, rubric id, rubric)`` items that slot scores.
_Slots = list[list[tuple[int, str, Draft]]]


class _BatchScores(NamedTuple):
    """Step 2 over the batch: ``raw`` / ``centred`` / ``evidence`` [S, N, G_max] (NaN where a
    slot did not score a group, and past a group's size); ``rubric_ids[s][n]`` ("" = none);
    ``fallback_groups``: fully scored groups with a member that has no real verdict."""

    raw: np.ndarray
    centred: np.ndarray
    evidence: np.ndarray
    rubric_ids: tuple[tuple[str, ...], ...]
    fallback_groups: int


def _score_slots(slots: _Slots, ctx: _Step) -> _BatchScores:
    """Step 2: every slot's items in one batched ``judge.compare``; centred where finite."""
    n_groups = len(ctx.groups)
    gmax = max((g.size for g in ctx.groups), default=0)
    flat_scores = iter(_score_items([it for items in slots for it in items], ctx))
    raw = np.full((N_ACTIVE, n_groups, gmax), np.nan)
    cen = np.full((N_ACTIVE, n_groups, gmax), np.nan)
    evidence = np.full((N_ACTIVE, n_groups, gmax), np.nan)
    ids = [[""] * n_groups for _ in range(N_ACTIVE)]
    fallback_groups = 0
    for s, items in enumerate(slots):
        for n, rid, _d in items:
            sc = next(flat_scores)
            size = ctx.groups[n].size
            raw[s, n, :size] = sc.scores
            evidence[s, n, :size] = sc.evidence
            ids[s][n] = rid
            if np.all(np.isfinite(sc.scores)):
                cen[s, n, :size] = centre(sc.scores)
                fallback_groups += int(sc.fallback_members > 0)
            else:
                ctx.tally.add("nan_score_groups")
    return _BatchScores(raw, cen, evidence, tuple(tuple(x) for x in ids), fallback_groups)


def combine_active(groups: Sequence[GroupInput], centred: np.ndarray, rubric_lambda: float,
                   how: str = "sum", paid: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Step 3: ``s~`` [N, G_max] and ``R_total = R_base + lambda * s~``; NaN past a group's size.
    `paid` [N, G_max] (``memory.gating.paid_mask``, None: everyone): the trajectories whose
    rubric term the reward pays; the others get ``R_base`` alone (``s~`` is returned whole).

    ``centred`` [S, N, G_max] holds each active slot's centred scores ``s_r - mean_G s_r``
    (NaN where the slot did not score the group). Over the usable slots of a group (finite
    scores), ``how="sum"``: ``s~ = sum_r (s_r - mean_G s_r)`` (ARBOR's ``R_base + lambda * s~``
    with each active rubric's centred score added); ``how="mean"``: their mean. No usable slot:
    ``s~ = 0``.
    """
    if how not in ("sum", "mean"):
        raise ValueError(f"active_combine must be sum or mean, got {how!r}")
    pool = np.sum if how == "sum" else np.mean
    shape = centred.shape[1:]
    r_base, combined = np.full(shape, np.nan), np.full(shape, np.nan)
    for n, g in enumerate(groups):
        r_base[n, :g.size] = g.r_base
        usable = [centred[s, n, :g.size] for s in range(centred.shape[0])
                  if np.all(np.isfinite(centred[s, n, :g.size]))]
        combined[n, :g.size] = pool(usable, axis=0) if usable else 0.0
    if paid is None:
        return combined, r_base + rubric_lambda * combined
    return combined, gated_total(r_base, combined, paid, rubric_lambda)


# --- drafts: induction and admission ----------------------------------------------------------


def _induction_requests(ctx: _Step, mastered: tuple[Draft, ...] = ()
                        ) -> tuple[list[int], list[InduceRequest]]:
    """Step 5's requests: one per group with a contrastive triplet, and the groups they are for.
    With ``rho_min > 0`` an outcome-homogeneous (tied) group is skipped: no draft of its could
    pass the correlation gate. `mastered`: the recently mastered rubrics each request shows
    the judge (``lineage_in_induction``)."""
    todo: list[int] = []
    reqs: list[InduceRequest] = []
    for n, g in enumerate(ctx.groups):
        trip = select_triplet(g.outcome(ctx.cfg.rubric_outcome), g.valid, g.lengths,
                              ctx.cfg.tie_break)
        if trip is None:
            continue
        ctx.tally.add("tied_triplets", int(trip.tied))
        if trip.tied and ctx.cfg.rho_min > 0:
            ctx.tally.add("induce_skipped_tied")
            continue
        todo.append(n)
        reqs.append(InduceRequest(
            question=g.question,
            best=g.texts[trip.best],
            hard_negative=None if trip.hard is None else g.texts[trip.hard],
            worst=g.texts[trip.worst],
            golds=g.golds,
            mastered=mastered,
        ))
    return todo, reqs


def _induce(ctx: _Step, mastered: tuple[Draft, ...] = ()) -> list[tuple[int, Draft]]:
    """Step 5: the ``(group index, draft)`` pairs of one batched ``judge.induce``."""
    todo, reqs = _induction_requests(ctx, mastered)
    replies = _ask(ctx, "induce", reqs, FallbackDrafts())  # a short reply: no answer
    pending: list[tuple[int, Draft]] = []
    for n, out in zip(todo, replies):
        ds = [d for d in (out or ()) if isinstance(d, Draft)]
        if not ds:
            ctx.tally.add("induce_empty")
            ctx.tally.add("induce_fallbacks", int(isinstance(out, FallbackDrafts)))
        ctx.tally.add("drafts_induced", len(ds))
        pending.extend((n, d) for d in ds)
    return pending


def _admission_scores(pending: Sequence[tuple[int, Draft]], ctx: _Step) -> dict[int, _Scored]:
    """Step 6's scores of each non-blank draft on its own group, by index into ``pending``
    (blank drafts are rejected ``empty_text`` by ``admit`` without a judge call)."""
    score_idx = [k for k, (_n, d) in enumerate(pending) if not is_empty(d)]
    to_score = [pending[k] for k in score_idx]
    if ctx.cfg.admission_scoring == "check":
        scored = _check_scores(to_score, ctx)
    else:
        scored = _score_items([(n, f"admit:{k}", d) for k, (n, d) in enumerate(to_score)], ctx)
    return dict(zip(score_idx, scored))


def _induce_and_admit(
    memory: RubricMemory, ctx: _Step
) -> tuple[RubricMemory, list[list[DraftRubric]], tuple[Event, ...]]:
    """Steps 5-6. Returns the memory, the admitted ``DraftRubric`` values per group, events."""
    cfg = ctx.cfg
    pending = _induce(ctx, recently_mastered(memory, cfg.lineage_k)
                      if cfg.lineage_in_induction else ())
    scores_of = _admission_scores(pending, ctx)
    cands = []
    for k, (n, d) in enumerate(pending):
        sc = scores_of.get(k)
        cands.append(Candidate(
            qid=ctx.groups[n].qid, draft=d,
            scores=None if sc is None else tuple(float(x) for x in sc.evidence),
            outcome=ctx.groups[n].outcome(ctx.cfg.rubric_outcome),
            fallback_members=0 if sc is None else sc.fallback_members,
        ))
    cfg = ctx.cfg
    memory, admitted, events = admit(memory, cands, cfg, ctx.step, keep=cfg.use_common_pool)
    # ``admit`` emits one event per candidate, in order; admitted drafts come back in order.
    per_group: list[list[DraftRubric]] = [[] for _ in ctx.groups]
    admitted_iter = iter(admitted)
    for (n, _d), ev in zip(pending, events):
        if ev.kind == "admitted":
            per_group[n].append(next(admitted_iter))
    return memory, per_group, events


# --- the two paths -----------------------------------------------------------------------------


class _Phases(NamedTuple):
    """What a path leaves for the output: the new memory, the batch's scores, the events in
    order, and how many common rubrics were active."""

    memory: RubricMemory
    scores: _BatchScores
    events: tuple[Event, ...]
    n_active: int


def _record_activations(memory: RubricMemory, ctx: _Step, active_ids: Sequence[str],
                        slots: _Slots, evidence: np.ndarray
                        ) -> tuple[RubricMemory, tuple[Event, ...]]:
    """Step 4: one activation per active rubric with every scored group's ``(s, y)`` (``y``:
    ``rubric_outcome``), on evidence scores only (a member without a real verdict is NaN). A
    low-variance retirement is settled by the judge's pass rate (``_pass_rate``)."""
    events: list[Event] = []
    for s, rid in enumerate(active_ids):
        acts = [GroupScores(scores=tuple(float(x) for x in evidence[s, n, :ctx.groups[n].size]),
                            outcome=ctx.groups[n].outcome(ctx.cfg.rubric_outcome))
                for n, _rid, _d in slots[s]]
        memory, ev = apply_activation(memory, rid, acts, ctx.cfg, ctx.step)
        for e in ev:
            if isinstance(e, Retired) and e.reason == "mastered":
                draft = next(c.draft for c in memory.retired if c.id == rid)
                memory, e = settle_low_variance(memory, e, _pass_rate(draft, slots[s], ctx))
            events.append(e)
    return memory, tuple(events)


def _pass_rate(draft: Draft, slot: Sequence[tuple[int, str, Draft]], ctx: _Step) -> float | None:
    """The share of the members of the slot's first ``PASS_RATE_GROUPS`` groups that meet
    `draft` (mean ``P(met)`` of the judge's real verdicts; one batched check, counted with the
    step's other checks), or None without any."""
    checked = _check_scores([(n, draft) for n, _rid, _d in slot[:PASS_RATE_GROUPS]], ctx)
    verdicts = np.concatenate([sc.evidence for sc in checked]) if checked else np.zeros(0)
    verdicts = verdicts[np.isfinite(verdicts)]
    return float(verdicts.mean()) if verdicts.size else None


def _consolidate(memory: RubricMemory, ctx: _Step, embedder: Embedder
                 ) -> tuple[RubricMemory, tuple[Event, ...]]:
    """Step 7 (a no-op below ``K`` drafts), with its counts in the tally."""
    memory, events, cstats = consolidate(memory, ctx.judge, embedder, ctx.cfg, ctx.step)
    ctx.tally.add("judge_calls_consolidate", cstats.requests)
    ctx.tally.add("consolidation_empty", cstats.empty_results + cstats.empty_text)
    ctx.tally.add("consolidation_fallbacks", cstats.fallbacks)
    ctx.tally.add("consolidation_dropped", cstats.dropped)
    return memory, events


def _step_with_memory(memory: RubricMemory, ctx: _Step, embedder: Embedder) -> _Phases:
    """ARBOR: score the batch with two active common rubrics (steps 1-2), then update the
    memory: retirement statistics, drafts and their admission, consolidation (steps 4-7)."""
    memory, active_ids, selected = select_active(memory, ctx.step)
    slots: _Slots = [[] for _ in range(N_ACTIVE)]
    for s, rid in enumerate(active_ids):
        rubric = memory.common(rid).draft
        slots[s] = [(n, rid, rubric) for n, g in enumerate(ctx.groups)
                    if g.size >= MIN_GROUP_SIZE]
    scores = _score_slots(slots, ctx)
    # a member without a real verdict: the group is left out of the statistics
    ctx.tally.add("fallback_groups_excluded", scores.fallback_groups)
    memory, activated = _record_activations(memory, ctx, active_ids, slots, scores.evidence)
    memory, _admitted, admission = _induce_and_admit(memory, ctx)
    memory, consolidated = _consolidate(memory, ctx, embedder)
    return _Phases(memory, scores, selected + activated + admission + consolidated,
                   len(active_ids))


def _step_without_memory(memory: RubricMemory, ctx: _Step) -> _Phases:
    """Ablation "w/o memory": drafts are induced and admitted first (steps 5-6, nothing kept in
    ``D``), then each group is scored by its own admitted drafts, at most two, highest
    admission ``rho`` first. No selection, statistics or consolidation."""
    memory, admitted, events = _induce_and_admit(memory, ctx)
    slots: _Slots = [[] for _ in range(N_ACTIVE)]
    for n, ds in enumerate(admitted):
        best = sorted(range(len(ds)), key=lambda k: (-ds[k].rho, k))[:N_ACTIVE]
        for s, k in enumerate(best):
            slots[s].append((n, ds[k].id, ds[k].draft))
    return _Phases(memory, _score_slots(slots, ctx), events, 0)


def arbor_reward_step(
    memory: RubricMemory,
    groups: Sequence[GroupInput],
    judge: Judge,
    cfg: MemoryConfig,
    *,
    step: int,
    seed: int,
    embedder: Embedder | None = None,
) -> StepOutput:
    """One ARBOR step over a batch of ``N`` groups (see the module docstring).

    Args:
        memory: the rubric memory before this step (not modified); its statistics basis must
            be ``cfg.basis`` (``state.check_basis``: an empty memory adopts it).
        groups: the batch's query groups (``GroupInput``).
        judge: any object with the batched judge protocol (``judges.base.Judge``).
        cfg: ``MemoryConfig``.
        step: training step (recorded in events and rubric statistics).
        seed: run seed; with ``step`` it seeds the comparison graphs and presentation coins.
        embedder: sentence embedder for merging; default ``get_embedder(cfg.embedder)``,
            loaded only if needed.

    Returns:
        ``StepOutput(memory, total_rewards [N, G], rubric_scores, events, metrics)`` with
        ``total_rewards = R_base + cfg.rubric_lambda * rubric_scores.combined``.
    """
    memory = check_basis(memory, cfg)
    ctx = _Step(tuple(groups), judge, cfg, step, seed, _Tally())
    ctx.tally.add("groups_too_small", sum(g.size < MIN_GROUP_SIZE for g in ctx.groups))
    if cfg.use_common_pool:
        if embedder is None:
            # loaded lazily (at the first merge), but a missing package fails now, before any
            # judge call, not at the first consolidation
            check_embedder(cfg.embedder)
        out = _step_with_memory(memory, ctx, embedder or _LazyEmbedder(cfg.embedder))
    else:
        out = _step_without_memory(memory, ctx)
    sc = out.scores
    paid = paid_mask(ctx.groups, cfg.rubric_gate, cfg.correct_at, sc.centred.shape[1:])
    combined, total = combine_active(ctx.groups, sc.centred, cfg.rubric_lambda,
                                     cfg.active_combine, paid)
    metrics = _metrics(out.memory, ctx.groups, total, out.events, ctx.tally, out.n_active)
    if cfg.rubric_gate != "none":  # the share of trajectories whose rubric term was withheld
        metrics[GATED_FRAC] = 1.0 - float(paid.sum()) / max(
            sum(g.size for g in ctx.groups), 1)
    rubric_scores = RubricScores(combined=combined, raw=sc.raw, centred=sc.centred,
                                 rubric_ids=sc.rubric_ids)
    return StepOutput(out.memory, total, rubric_scores, out.events, metrics)


def conversion_metrics(
    groups: Sequence[GroupInput], total: np.ndarray, prefix: str = ""
) -> dict[str, float]:
    """Outcome-homogeneous fraction before (``R_base``) and after (``R_total``) the rubric term,
    and the fraction of outcome-homogeneous groups it converted to nonzero variance. The one
    definition of homogeneous (``core.groups.homogeneous``: population std <= 1e-6), per group
    over its real members, so ragged batches work too."""
    before = [bool(homogeneous(np.asarray(g.r_base))) for g in groups]
    after = [bool(homogeneous(total[n, :g.size])) for n, g in enumerate(groups)]
    n = max(len(groups), 1)
    converted = sum(b and not a for b, a in zip(before, after))
    return {
        f"{prefix}homogeneous_frac_before": sum(before) / n,
        f"{prefix}homogeneous_frac_after": sum(after) / n,
        f"{prefix}converted_frac": converted / max(sum(before), 1),
    }


#: Items that came back as the judge's defined fallback, per kind of request.
_FALLBACK_KEYS = ("compare_fallbacks", "check_fallbacks", "induce_fallbacks",
                  "consolidation_fallbacks")


#: ``memory/*`` metrics that describe the memory after a step; the others count what the step
#: did (or are fractions of its groups)
MEMORY_GAUGES = ("memory/drafts", "memory/commons", "memory/retired_total", "memory/active")
# the share of trajectories whose rubric term algo.rubric_gate withheld: a fraction, so a step
# of several draws (DAPO) reports the last draw's, not a sum
GATED_FRAC = "memory/gated_frac"


def step_counts(metrics: Mapping[str, float]) -> dict[str, float]:
    """The tallies among a step's ``memory/*`` metrics (admissions, rejections, judge calls,
    fallbacks, ...): what adds up when a training step draws several batches (DAPO)."""
    fractions = set(conversion_metrics([], np.zeros((0, 0)), "memory/")) | {GATED_FRAC}
    return {k: v for k, v in metrics.items()
            if k.startswith("memory/") and k not in MEMORY_GAUGES and k not in fractions}


def _metrics(
    memory: RubricMemory,
    groups: Sequence[GroupInput],
    total: np.ndarray,
    events: Sequence[Event],
    tally: _Tally,
    n_active: int,
) -> dict[str, float]:
    """Flat ``memory/*`` metrics of one step: the memory's sizes after it, the step's tallies
    (:data:`MEMORY_GAUGES` are the former, :func:`step_counts` picks the latter) and the
    conversion fractions."""
    kinds = Counter(e.kind for e in events)
    rejected = Counter(getattr(e, "reason", "") for e in events if e.kind == "rejected")
    retired = Counter(getattr(e, "reason", "") for e in events if e.kind == "retired")
    c = tally.c
    m: dict[str, float] = {
        "memory/drafts": len(memory.drafts),
        "memory/commons": len(memory.commons),
        "memory/retired_total": len(memory.retired),
        "memory/active": n_active,
        "memory/admitted": kinds["admitted"],
        "memory/rejected": kinds["rejected"],
        **{f"memory/rejected_{r}": rejected[r] for r in REJECT_REASONS},
        "memory/consolidations": kinds["consolidated"],
        "memory/merges": kinds["merged"],
        "memory/retirements": kinds["retired"],
        **{f"memory/retired_{r}": retired[r] for r in RETIRE_REASONS},
    }
    for key in ("groups_too_small", "induce_empty", "induce_fallbacks", "induce_skipped_tied",
                "tied_triplets", "drafts_induced", "nan_score_groups", "check_fallbacks",
                "compare_fallbacks", "fallback_groups_excluded", "consolidation_empty",
                "consolidation_fallbacks", "consolidation_dropped"):
        m[f"memory/{key}"] = c[key]
    calls = {op: c[f"judge_calls_{op}"] for op in ("compare", "check", "induce", "consolidate")}
    m.update({f"memory/judge_calls_{op}": v for op, v in calls.items()})
    m["memory/judge_calls"] = sum(calls.values())
    m["memory/judge_fallbacks"] = sum(c[key] for key in _FALLBACK_KEYS)

    m.update(conversion_metrics(groups, total, "memory/"))
    return {k: float(v) for k, v in m.items()}
