"""Active selection: exactly two common rubrics per batch (ARBOR, arXiv:2606.03239).

    r1 = argmax_{r in P} rho_r                                  ("top_rho")
    r2 = argmin_{r in P, r != r1} last_used_clock(r)            ("lru")

Ties go to the older rubric (its position in ``P``); a never-used rubric has clock -1, so new
rubrics are tried first by the LRU slot. With ``|P| = 1`` only ``r1`` is active, with ``P``
empty none. Selection is deterministic and advances the memory's clock by one; the selected
rubrics get ``uses + 1``, ``last_used_step = step`` and ``last_used_clock = clock``. Because the
LRU slot always takes the least recently used rubric other than ``r1``, every rubric of ``P``
is activated at least once in any ``|P| - 1`` consecutive batches (while ``P`` is unchanged).
"""

from __future__ import annotations

from dataclasses import replace

from memory.events import Activated, Event
from memory.state import N_ACTIVE, CommonRubric, RubricMemory


def choose(commons: tuple[CommonRubric, ...]) -> tuple[tuple[str, str], ...]:
    """``((rubric id, slot), ...)`` of the rubrics to activate, without touching the memory."""
    if not commons:
        return ()
    order = range(len(commons))
    top = min(order, key=lambda k: (-commons[k].rho, k))
    picks = [(commons[top].id, "top_rho")]
    rest = [k for k in order if k != top]
    if rest and N_ACTIVE > 1:
        lru = min(rest, key=lambda k: (commons[k].last_used_clock, k))
        picks.append((commons[lru].id, "lru"))
    return tuple(picks)


def select_active(
    memory: RubricMemory, step: int
) -> tuple[RubricMemory, tuple[str, ...], tuple[Event, ...]]:
    """Choose the active rubrics; returns (new memory, their ids in slot order, Activated events).
    """
    picks = choose(memory.commons)
    clock = memory.clock
    events: list[Event] = []
    chosen = {rid for rid, _ in picks}
    commons = []
    for c in memory.commons:
        if c.id in chosen:
            c = replace(c, uses=c.uses + 1, last_used_step=step, last_used_clock=clock)
        commons.append(c)
    for rid, slot in picks:
        c = next(x for x in commons if x.id == rid)
        events.append(Activated(step=step, common_id=rid, slot=slot, rho=c.rho, uses=c.uses))
    new = replace(memory, commons=tuple(commons), clock=clock + 1)
    return new, tuple(rid for rid, _ in picks), tuple(events)
