"""Consolidation of drafts into common rubrics, merging near-duplicates (ARBOR, arXiv:2606.03239).

When ``|D| >= K`` (``MemoryConfig.k_consol``), the oldest drafts are cut into chunks of exactly
``K`` (a remainder smaller than ``K`` stays in ``D``); each chunk is one ``ConsolidateRequest``
(all chunks in one batched ``judge.consolidate`` call). A chunk the judge *answered* is
consumed (removed from ``D``) whatever the answer, even an empty one ("nothing in common"), so
the same drafts are never consolidated twice. A chunk the judge *failed* on (its defined
fallback ``FallbackDrafts``, no answer at all in a short reply, or something that is not a
list of drafts) is no answer: its drafts go
back to the front of ``D`` with ``failed_consolidations + 1`` and are sent again at a later
step; after ``MemoryConfig.consolidation_attempts`` failed attempts they are dropped. Either way
a ``ConsolidationFailed`` event records it, so a judge outage never silently empties ``D``.

Each returned rubric ``c`` is compared with the active common rubrics ``P``::

    cos(c, r) = <e(c), e(r)>          e = L2-normalised sentence embedding of Draft.text()

and with 1.0 when ``c`` and ``r`` have the same rule feature id or the same text (case and
whitespace folded). If ``max_r cos(c, r) > merge_threshold`` it is merged into that ``r`` (its
source draft ids are appended, ``merges + 1``; the existing text and statistics are kept);
otherwise it is added to ``P`` as a new common rubric. Rubrics are processed in order, so a
duplicate within one consolidation merges into the one added just before it. Returned rubrics
with empty text are skipped and counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from judges.base import Judge
from judges.types import ConsolidateRequest, Draft, FallbackDrafts
from memory.admission import is_empty
from memory.embed import Embedder, cosine_matrix
from memory.events import Consolidated, ConsolidationFailed, Event, Merged
from memory.state import CommonRubric, DraftRubric, MemoryConfig, RubricMemory


@dataclass(frozen=True)
class ConsolidationStats:
    """``requests``: chunks sent; ``added`` / ``merged``: resulting rubrics; ``empty_results``:
    chunks the judge answered with no rubric; ``empty_text``: returned rubrics with blank text;
    ``fallbacks``: chunks the judge failed on (kept or dropped); ``dropped``: drafts dropped
    after ``consolidation_attempts`` failed attempts."""

    requests: int = 0
    added: int = 0
    merged: int = 0
    empty_results: int = 0
    empty_text: int = 0
    fallbacks: int = 0
    dropped: int = 0


def _fold(text: str) -> str:
    return " ".join(text.lower().split())


def nearest_common(
    draft: Draft, commons: Sequence[CommonRubric], embedder: Embedder
) -> tuple[int | None, float]:
    """Index of the most similar common rubric and the cosine (exact matches count 1.0)."""
    if not commons:
        return None, -1.0
    for k, c in enumerate(commons):
        if (draft.feature and draft.feature == c.draft.feature) or (
            _fold(draft.text()) == _fold(c.draft.text())
        ):
            return k, 1.0
    emb = embedder.embed([draft.text()] + [c.draft.text() for c in commons])
    cos = cosine_matrix(emb[:1], emb[1:])[0]
    k = int(np.argmax(cos))
    return k, float(cos[k])


def merge_or_add(
    memory: RubricMemory,
    draft: Draft,
    source_ids: tuple[str, ...],
    embedder: Embedder,
    cfg: MemoryConfig,
    step: int,
) -> tuple[RubricMemory, Event]:
    """Add ``draft`` to ``P`` as a new common rubric, or merge it into its near-duplicate."""
    k, cos = nearest_common(draft, memory.commons, embedder)
    if k is not None and cos > cfg.merge_threshold:
        old = memory.commons[k]
        merged = replace(old, source_ids=old.source_ids + source_ids, merges=old.merges + 1)
        return memory.with_common(merged), Merged(
            step=step, draft_ids=source_ids, into_id=old.id, title=draft.title, cosine=cos
        )
    cid, memory = memory.new_id("c")
    rubric = CommonRubric(id=cid, draft=draft, source_ids=source_ids, created_step=step)
    return replace(memory, commons=memory.commons + (rubric,)), Consolidated(
        step=step, draft_ids=source_ids, common_id=cid, title=draft.title
    )


def consolidate(
    memory: RubricMemory,
    judge: Judge,
    embedder: Embedder,
    cfg: MemoryConfig,
    step: int,
) -> tuple[RubricMemory, tuple[Event, ...], ConsolidationStats]:
    """Consolidate while ``|D| >= K``; a no-op (no judge call) below ``K``."""
    k = cfg.k_consol
    n_chunks = len(memory.drafts) // k
    if n_chunks == 0:
        return memory, (), ConsolidationStats()
    chunks: list[tuple[DraftRubric, ...]] = [
        memory.drafts[i * k:(i + 1) * k] for i in range(n_chunks)
    ]
    memory = replace(memory, drafts=memory.drafts[n_chunks * k:])
    results = list(judge.consolidate(
        [ConsolidateRequest(drafts=tuple(d.draft for d in ch)) for ch in chunks]
    ))
    results += [FallbackDrafts()] * (len(chunks) - len(results))  # a short reply: no answer
    events: list[Event] = []
    kept: list[DraftRubric] = []
    added = merged = empty_results = empty_text = fallbacks = dropped = 0
    for chunk, out in zip(chunks, results):
        source = tuple(d.id for d in chunk)
        if isinstance(out, FallbackDrafts) or not isinstance(out, tuple | list):
            fallbacks += 1
            attempts = max(d.failed_consolidations for d in chunk) + 1
            gone = attempts >= cfg.consolidation_attempts
            if gone:
                dropped += len(chunk)
            else:
                kept.extend(replace(d, failed_consolidations=attempts) for d in chunk)
            events.append(ConsolidationFailed(step=step, draft_ids=source, attempts=attempts,
                                              dropped=gone))
            continue
        produced = [d for d in out if isinstance(d, Draft)]
        if not produced:
            empty_results += 1
        for d in produced:
            if is_empty(d):
                empty_text += 1
                continue
            memory, ev = merge_or_add(memory, d, source, embedder, cfg, step)
            events.append(ev)
            if isinstance(ev, Merged):
                merged += 1
            else:
                added += 1
    if kept:  # the oldest drafts: back to the front of D, in their order
        memory = replace(memory, drafts=tuple(kept) + memory.drafts)
    stats = ConsolidationStats(requests=len(chunks), added=added, merged=merged,
                               empty_results=empty_results, empty_text=empty_text,
                               fallbacks=fallbacks, dropped=dropped)
    return memory, tuple(events), stats
