"""Events of the rubric memory: what each pure operation did, for logs and metrics.

Every operation returns its events next to the new memory. An event is a frozen dataclass with
a class-level ``kind``; ``to_dict()`` gives a flat JSON-able dict (``{"kind": ..., ...}``) and
``event_from_dict`` reads one back. ``append_jsonl`` writes events as JSON Lines (one event per
line), the format of the run folder's ``rubric_events.jsonl``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

REJECT_REASONS = ("empty_text", "group_too_small", "judge_fallback", "nan_scores",
                  "low_variance", "low_correlation")
RETIRE_REASONS = ("mastered", "abandoned", "drifted")


@dataclass(frozen=True)
class Event:
    """Base: every event happens at a training ``step``."""

    kind: ClassVar[str] = "event"
    step: int

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        return {"kind": self.kind, **d}


@dataclass(frozen=True)
class Admitted(Event):
    """A draft passed both gates and entered ``D`` (``var`` = Var_i(s_i), ``rho`` =
    Pearson(s, F1) on its source group)."""

    kind: ClassVar[str] = "admitted"
    draft_id: str
    qid: str
    title: str
    var: float
    rho: float


@dataclass(frozen=True)
class Rejected(Event):
    """A draft was dropped; ``reason`` is one of ``REJECT_REASONS``. ``var`` / ``rho`` are NaN
    when the draft was never scored (empty text, group too small, judge fallback, NaN
    scores)."""

    kind: ClassVar[str] = "rejected"
    qid: str
    title: str
    reason: str
    var: float
    rho: float


@dataclass(frozen=True)
class Consolidated(Event):
    """Drafts ``draft_ids`` were abstracted into the new common rubric ``common_id``."""

    kind: ClassVar[str] = "consolidated"
    draft_ids: tuple[str, ...]
    common_id: str
    title: str


@dataclass(frozen=True)
class Merged(Event):
    """A consolidated rubric was a near-duplicate of ``into_id`` (``cosine`` of their sentence
    embeddings, 1.0 for an identical text or rule feature family) and was merged into it."""

    kind: ClassVar[str] = "merged"
    draft_ids: tuple[str, ...]
    into_id: str
    title: str
    cosine: float


@dataclass(frozen=True)
class ConsolidationFailed(Event):
    """The judge fell back on consolidating drafts ``draft_ids`` (it failed; it did not answer
    that they share nothing). ``attempts`` counts the failed attempts so far; the drafts went
    back to ``D`` for a later attempt, or were ``dropped`` once ``attempts`` reached
    ``MemoryConfig.consolidation_attempts``."""

    kind: ClassVar[str] = "consolidation_failed"
    draft_ids: tuple[str, ...]
    attempts: int
    dropped: bool


@dataclass(frozen=True)
class Activated(Event):
    """Common rubric ``common_id`` was selected for this batch; ``slot`` is "top_rho" or
    "lru"; ``rho`` its cumulative correlation at selection time."""

    kind: ClassVar[str] = "activated"
    common_id: str
    slot: str
    rho: float
    uses: int


@dataclass(frozen=True)
class Retired(Event):
    """Common rubric ``common_id`` left ``P``; ``reason`` is "mastered", "abandoned" or
    "drifted" (``memory.retirement``); ``pass_rate``: the judge's pass rate of a low-variance
    retirement (None: not measured)."""

    kind: ClassVar[str] = "retired"
    common_id: str
    reason: str
    n_low_var: int
    rho: float
    uses: int
    pass_rate: float | None = None


EVENT_TYPES: dict[str, type[Event]] = {
    cls.kind: cls for cls in (Admitted, Rejected, Consolidated, ConsolidationFailed, Merged,
                              Activated, Retired)
}


def event_from_dict(d: dict[str, Any]) -> Event:
    """Inverse of ``Event.to_dict``; a record that is not an event raises a ``ValueError``
    naming the missing field or the unknown kind."""
    if not isinstance(d, dict):
        raise ValueError(f"an event is a JSON object, got {type(d).__name__}")
    kind = d.get("kind")
    if kind not in EVENT_TYPES:
        raise ValueError(f"unknown event kind {kind!r}; known: {', '.join(EVENT_TYPES)}")
    cls = EVENT_TYPES[kind]
    kw: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in d:
            raise ValueError(f"{kind!r} event lacks field {f.name!r}")
        v = d[f.name]
        kw[f.name] = tuple(v) if isinstance(v, list) else v
    return cls(**kw)


def _json_default(o: Any) -> Any:
    # numpy scalars, should one slip in from a caller
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def append_jsonl(path: str | os.PathLike[str], events: Iterable[Event]) -> int:
    """Append ``events`` to a JSON Lines file (created if missing); returns lines written.

    NaN statistics (never-scored rejections) are written as JSON ``NaN``, which Python's
    ``json`` reads back.
    """
    lines = [json.dumps(e.to_dict(), ensure_ascii=False, default=_json_default) for e in events]
    if lines:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")
    return len(lines)


def read_jsonl(path: str | os.PathLike[str]) -> Iterator[Event]:
    """Events of a file written by ``append_jsonl`` (blank lines skipped). A line that is not
    an event (bad JSON, e.g. a truncated last line, a missing field, an unknown kind) raises a
    ``ValueError`` naming the file and the line number."""
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                event = event_from_dict(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({e.msg}, column {e.colno})"
                                 ) from None
            except ValueError as e:
                raise ValueError(f"{path}:{lineno}: {e}") from None
            yield event


def count_by_kind(events: Sequence[Event]) -> dict[str, int]:
    """``{kind: count}`` with every known kind present (zeros included)."""
    out = dict.fromkeys(EVENT_TYPES, 0)
    for e in events:
        out[e.kind] = out.get(e.kind, 0) + 1
    return out
