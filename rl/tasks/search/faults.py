"""What a search rollout does when retrieval fails: degrade, count, and stop only past a budget.

A retrieval call that fails for good (``RetrieverError``: the HTTP client's bounded retries are
spent, or its circuit breaker is open) does not end the run, as a judge that gives up does not:
every search of that call gets the failure observation

    <information>Search failed: the retrieval service did not answer, so no documents were
    retrieved for this query.</information>

(``SEARCH_FAILED``; it keeps the Search-R1 format valid, so the policy may search again or
answer) and is counted. The run stops with :class:`RetrievalBudgetExceeded`, naming the key
that was exceeded and the last error, when either

* no retrieval call has succeeded for more than ``max_outage_s`` seconds (from the first
  failed call of the streak to the latest one): the service is down, not flaky; or
* more than ``max_failed_fraction`` of all searches so far got the failure observation, once
  at least ``min_searches`` searches were made: too much of the training signal is fake.

Settings: ``task.retrieval`` (``RetrievalSettings``: these three plus the HTTP client's
``timeout_s``, ``max_retries``, ``backoff_s``, ``max_backoff_s``, ``breaker_timeouts``,
``breaker_cooldown_s``). Counters (``retrieval/*`` in the step metrics, cumulative over the
run like ``judge/*``): ``calls`` and ``searches`` (queries) made, ``failed_calls``,
``degraded`` (searches answered with the failure observation), and the HTTP client's
``requests``, ``retries``, ``errors``, ``timeouts``, ``bad_bodies``, ``failures``,
``breaker_opens``, ``breaker_rejected`` (0 for a local BM25 index).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import typing
from collections.abc import Callable, Mapping
from typing import Any

from rl.tasks.search.client import HTTP_STAT_KEYS, RetrieverError
from rl.tasks.search.corpus import Doc

log = logging.getLogger(__name__)

SEARCH_FAILED = ("Search failed: the retrieval service did not answer, so no documents were "
                 "retrieved for this query.")

GUARD_STAT_KEYS = ("calls", "searches", "failed_calls", "degraded")
CLIENT_KEYS = ("timeout_s", "max_retries", "backoff_s", "max_backoff_s", "breaker_timeouts",
               "breaker_cooldown_s")


class RetrievalBudgetExceeded(RuntimeError):
    """Retrieval failed more than ``task.retrieval`` allows; the run stops."""


@dataclasses.dataclass(frozen=True)
class RetrievalSettings:
    """``task.retrieval``: the HTTP client's fault handling and the run's fault budget."""

    timeout_s: float
    max_retries: int
    backoff_s: float
    max_backoff_s: float
    breaker_timeouts: int
    breaker_cooldown_s: float
    max_outage_s: float
    max_failed_fraction: float
    min_searches: int

    @classmethod
    def parse(cls, cfg: Mapping[str, Any]) -> RetrievalSettings:
        """From the ``task.retrieval`` mapping; a missing, unknown or bad key is a ValueError
        naming it."""
        hints = typing.get_type_hints(cls)
        names = [f.name for f in dataclasses.fields(cls)]
        for key in cfg:
            if key not in names:
                raise ValueError(f"task.retrieval.{key}: unknown key (known: {', '.join(names)})")
        values = {}
        for name in names:
            if name not in cfg:
                raise ValueError(f"task.retrieval.{name}: missing")
            value = cfg[name]
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"task.retrieval.{name}: expected a number, got {value!r}")
            if hints[name] is int and value != int(value):
                raise ValueError(f"task.retrieval.{name}: expected an integer, got {value!r}")
            values[name] = hints[name](value)
        settings = cls(**values)
        settings.check()
        return settings

    def check(self) -> None:
        for name in ("timeout_s", "max_outage_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"task.retrieval.{name}: must be > 0, got {getattr(self, name)}")
        for name in ("max_retries", "backoff_s", "max_backoff_s", "breaker_timeouts",
                     "breaker_cooldown_s", "min_searches"):
            if getattr(self, name) < 0:
                raise ValueError(f"task.retrieval.{name}: must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.max_failed_fraction <= 1:
            raise ValueError(f"task.retrieval.max_failed_fraction: must be in [0, 1], got "
                             f"{self.max_failed_fraction}")

    def client_options(self) -> dict[str, Any]:
        """The HTTP client's keyword options (``rl.tasks.search.client``'s ``http`` retriever)."""
        return {k: getattr(self, k) for k in CLIENT_KEYS}


class RetrievalGuard:
    """Calls a retriever, turns a ``RetrieverError`` into ``None`` (the caller renders
    ``SEARCH_FAILED``) within the budget, counts. Thread-safe; one per retriever per run."""

    def __init__(self, settings: RetrievalSettings,
                 clock: Callable[[], float] = time.monotonic):
        self.settings = settings
        self._clock = clock
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(GUARD_STAT_KEYS, 0)
        self._outage_since: float | None = None  # first failed call since the last success
        self._outage_calls = 0  # failed calls since then

    def retrieve(self, retriever: Any, queries: list[str], topk: int) -> list[list[Doc]] | None:
        """The results, or None when the call failed (within the budget)."""
        with self._lock:
            self._counts["calls"] += 1
            self._counts["searches"] += len(queries)
        try:
            results = retriever.retrieve(queries, topk=topk)
        except RetrieverError as e:
            self._failed(len(queries), e)
            return None
        with self._lock:
            recovered, self._outage_since = self._outage_since is not None, None
        if recovered:
            log.info("retrieval recovered after %d failed call(s)", self._outage_calls)
        return results

    def _failed(self, n: int, error: RetrieverError) -> None:
        s = self.settings
        with self._lock:
            c = self._counts
            c["failed_calls"] += 1
            c["degraded"] += n
            now = self._clock()
            starts = self._outage_since is None
            if starts:
                self._outage_since, self._outage_calls = now, 0
            self._outage_calls += 1
            outage = now - (now if self._outage_since is None else self._outage_since)
            fraction = c["degraded"] / c["searches"]
            searches, degraded = c["searches"], c["degraded"]
        if starts:  # once per outage, not once per failed call
            log.warning("retrieval failed (%s); searches get the failure observation until a "
                        "call succeeds", error)
        if outage > s.max_outage_s:
            raise RetrievalBudgetExceeded(
                f"retrieval fault budget exceeded: no retrieval call succeeded for {outage:.0f} s "
                f"(task.retrieval.max_outage_s={s.max_outage_s}); last error: {error}")
        if searches >= s.min_searches and fraction > s.max_failed_fraction:
            raise RetrievalBudgetExceeded(
                f"retrieval fault budget exceeded: {degraded} of {searches} searches failed "
                f"({fraction:.1%} > task.retrieval.max_failed_fraction="
                f"{s.max_failed_fraction}, checked from task.retrieval.min_searches="
                f"{s.min_searches}); last error: {error}")

    def stats(self, retriever: Any) -> dict[str, int]:
        """The guard's counters and the client's (zeros for a retriever without any)."""
        client = getattr(retriever, "stats", None)
        with self._lock:
            own = dict(self._counts)
        return own | dict.fromkeys(HTTP_STAT_KEYS, 0) | (client() if callable(client) else {})
