"""Deterministic repair of an invalid bundle proposal.

The ProRubric authors' generator regenerates an invalid answer a bounded number of times, then
repairs the last readable one instead of dropping the prompt, and flags the row ``repaired``.
Our repair (our own rules, written from that description), in this order:

1. indices that are not integers in ``[0, n)`` are dropped; an index in several dimensions is
   kept in the first one only; dimensions left without items are dropped (none left: one
   dimension, ``"overall"``, that takes every item);
2. each unassigned item goes to the dimension holding the nearest assigned index (ties: the
   lower index), in increasing item order; that dimension's description gets one sentence
   carrying the item (``It also requires: ...`` / ``It also fails if it does any of the
   following: ...`` for a pitfall), so the judge, who reads only descriptions, still sees it;
3. too many dimensions: the two with the fewest items (ties: the earlier) are merged, the
   descriptions joined, until ``K <= min(k_max, n)``;
4. too few: the dimension with the most items (ties: the earlier) is split in two halves (in
   its own item order; the failure clause stays with the first half), until ``K >= k_min``;
5. every description still invalid (``judges.bundling.description_problem``: empty, or not
   2..10 sentences), including the split halves', is composed from its items' texts and
   failure clause (``compose_description``); an empty name becomes ``"dimension j"``.

The result passes ``judges.bundling.bundle_problems``; a checklist with fewer than ``k_min``
items cannot be repaired (``RepairError``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from judges.bundling import bundle_problems, compose_description, description_problem
from judges.types import Dimension


class RepairError(ValueError):
    """The proposal cannot be made valid (too few items for ``k_min`` dimensions)."""


def _clean_indices(draft: Sequence[Dimension], n: int) -> tuple[list[Dimension], int]:
    """Step 1: (dimensions with valid, first-claimed indices, number of indices dropped)."""
    claimed: set[int] = set()
    out: list[Dimension] = []
    dropped = 0
    for d in draft:
        keep = []
        for i in d.indices:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n or i in claimed:
                dropped += 1
                continue
            claimed.add(i)
            keep.append(i)
        if keep:
            clause = d.failure_clause if isinstance(d.failure_clause, str) else None
            desc = d.description if isinstance(d.description, str) else ""
            out.append(d._replace(indices=tuple(keep), failure_clause=clause, description=desc))
    return out, dropped


def _nearest_dimension(dims: Sequence[Dimension], i: int) -> int:
    best = min((abs(i - j), j, k) for k, d in enumerate(dims) for j in d.indices)
    return best[2]


def _requirement_sentences(idx: Sequence[int], texts: Sequence[str], weights: Sequence[float]
                           ) -> str:
    pos = [" ".join(texts[i].split()).rstrip(" .;") for i in idx if weights[i] >= 0]
    neg = [" ".join(texts[i].split()).rstrip(" .;") for i in idx if weights[i] < 0]
    parts = ([f"It also requires: {'; '.join(pos)}."] if pos else []) + (
        [f"It also fails if it does any of the following: {'; '.join(neg)}."] if neg else [])
    return " ".join(parts)


def _assign_orphans(dims: list[Dimension], n: int, texts: Sequence[str],
                    weights: Sequence[float]) -> tuple[list[Dimension], list[int]]:
    """Step 2: every unassigned item into the dimension nearest to it."""
    assigned = {i for d in dims for i in d.indices}
    orphans = [i for i in range(n) if i not in assigned]
    if not dims:
        return [Dimension("overall", tuple(orphans), None, "")], orphans
    added: dict[int, list[int]] = {}
    for i in orphans:
        k = _nearest_dimension(dims, i)
        dims[k] = dims[k]._replace(indices=dims[k].indices + (i,))
        added.setdefault(k, []).append(i)
    for k, idx in added.items():
        extra = _requirement_sentences(idx, texts, weights)
        dims[k] = dims[k]._replace(description=f"{dims[k].description} {extra}".strip())
    return dims, orphans


def _merge_down(dims: list[Dimension], hi: int) -> tuple[list[Dimension], int]:
    """Step 3: merge the two smallest dimensions until at most ``hi`` remain."""
    merges = 0
    while len(dims) > hi:
        a, b = sorted(sorted(range(len(dims)), key=lambda k: (len(dims[k].indices), k))[:2])
        da, db = dims[a], dims[b]
        clauses = [c for c in (da.failure_clause, db.failure_clause) if c and c.strip()]
        dims[a] = Dimension(f"{da.name} + {db.name}", da.indices + db.indices,
                            "; ".join(clauses) or None,
                            f"{da.description} {db.description}".strip())
        del dims[b]
        merges += 1
    return dims, merges


def _split_up(dims: list[Dimension], lo: int) -> tuple[list[Dimension], int]:
    """Step 4: halve the largest dimension until at least ``lo`` remain."""
    splits = 0
    while len(dims) < lo:
        k = min(range(len(dims)), key=lambda j: (-len(dims[j].indices), j))
        d = dims[k]
        half = math.ceil(len(d.indices) / 2)
        dims[k:k + 1] = [Dimension(f"{d.name} (1)", d.indices[:half], d.failure_clause, ""),
                         Dimension(f"{d.name} (2)", d.indices[half:], None, "")]
        splits += 1
    return dims, splits


def repair_bundle(draft: Sequence[Dimension], texts: Sequence[str], weights: Sequence[float],
                  k_min: int, k_max: int) -> tuple[tuple[Dimension, ...], tuple[str, ...]]:
    """A valid bundle (0-based, judge ``Dimension``s) made from ``draft`` by the steps of the
    module docstring, and a note for each kind of change made."""
    n = len(texts)
    hi = min(k_max, n)
    if not k_min <= hi:
        raise RepairError(f"only {n} criteria, cannot make {k_min} dimensions")
    notes: list[str] = []
    dims, dropped = _clean_indices(draft, n)
    if dropped:
        notes.append(f"{dropped} out-of-range or repeated indices dropped")
    dims, orphans = _assign_orphans(dims, n, texts, weights)
    if orphans:
        notes.append(f"criteria {orphans} assigned to the nearest dimension")
    dims, merges = _merge_down(dims, hi)
    dims, splits = _split_up(dims, k_min)
    if merges or splits:
        notes.append(f"{merges} merges, {splits} splits to bring K into [{k_min}, {hi}]")
    composed = 0
    for j, d in enumerate(dims):
        if not d.name.strip():
            dims[j] = d = d._replace(name=f"dimension {j + 1}")
        if description_problem(d.description) is not None:
            composed += 1
            dims[j] = d._replace(description=compose_description(
                [texts[i] for i in d.indices], [weights[i] for i in d.indices],
                d.failure_clause))
    if composed:
        notes.append(f"{composed} descriptions composed from the criteria texts")
    problems = bundle_problems(dims, n, k_min, k_max)
    if problems:  # the steps above make this unreachable; it guards future edits
        raise RepairError("; ".join(problems))
    return tuple(dims), tuple(notes)
