"""The judge protocol, the backend seam, and shared counters.

A *judge* answers eight batched operations (``OPS`` and ``check_dimensions``; lists in, lists
out, same order) and exposes ``stats()``: a flat ``dict[str, int]`` of counters for metrics.
Two judge classes implement it:
``RuleJudge`` (deterministic predicates) and ``LLMJudge`` (prompts + parsing + re-ask +
fallback on top of any *backend*). A backend only turns chat message lists into completions;
see ``Backend``.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

from judges.types import (
    Bundle,
    BundleRequest,
    CheckRequest,
    CheckResult,
    Completion,
    ConsolidateRequest,
    DimensionRequest,
    DimensionResult,
    Draft,
    EquivRequest,
    EquivResult,
    InduceRequest,
    Messages,
    PairRequest,
    PairResult,
    RateRequest,
    RateResult,
)

OPS = ("check", "compare", "induce", "consolidate", "bundle", "equivalent", "rate")

# ``check_dimensions`` (not in OPS: a failed call is returned as failed, not as a fallback value)
DIMENSION_STAT_KEYS = (
    "requests_dimensions",  # dimension calls asked for (one per response)
    "retries_dimensions",  # attempts after the first (temperature 0, then the retry temperature)
    "failures_dimensions",  # calls with no usable verdict after every attempt
)

# Counters every judge reports (zeros included), so metrics keep a fixed set of keys.
JUDGE_STAT_KEYS = (
    *(f"requests_{op}" for op in OPS),
    "parse_errors",  # every completion that failed to parse (first answers and re-asks)
    "reasks",  # every re-ask sent (one per item per round)
    "fallbacks",  # items that ended on their defined fallback
    *(f"fallbacks_{op}" for op in OPS),
    "backend_errors",  # items whose completion the backend gave up on (retries exhausted)
    *DIMENSION_STAT_KEYS,
)

# Counters a backend reports; HTTP ones stay 0 for in-process backends.
BACKEND_STAT_KEYS = (
    "backend_calls",  # completions requested from the backend (incl. cache hits)
    "cache_hits",  # served from the disk cache or from a duplicate in the same batch
    "http_requests",  # HTTP attempts sent (first tries + retries)
    "retries",
    "timeouts",
    "http_errors",  # non-2xx responses
    "transport_errors",  # connection refused/reset etc.
    "bad_responses",  # 2xx with an unreadable body
    "failed_requests",  # requests given up after all retries
    "prompt_tokens",  # from ``usage``; cache hits cost nothing and are not counted
    "completion_tokens",
    "logprob_unsupported",  # choice_probs items answered without usable logprobs
    "breaker_opens",  # times the circuit breaker opened (core.breaker)
    "breaker_rejected",  # attempts refused (failed fast) while it was open
)


class OptionAttributes:
    """A judge or backend whose ``options`` (a frozen dataclass) read as its attributes
    (``judge.seed``, ``backend.max_batch``, ...)."""

    def __getattr__(self, name: str) -> Any:
        options = self.__dict__.get("options")
        if options is not None and name in getattr(options, "__dataclass_fields__", {}):
            return getattr(options, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


class Counters:
    """Thread-safe named integer counters with a fixed set of zero-initialised keys."""

    def __init__(self, keys: Iterable[str]):
        self._lock = threading.Lock()
        self._counts: dict[str, int] = dict.fromkeys(keys, 0)

    def inc(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + int(n)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def reset(self) -> None:
        with self._lock:
            for k in self._counts:
                self._counts[k] = 0


@runtime_checkable
class Judge(Protocol):
    """Batched judge: each method maps a sequence of requests to a same-length, same-order list."""

    def check(self, reqs: Sequence[CheckRequest]) -> list[CheckResult]:
        """Criterion met / not met (with a probability where the backend has one)."""
        ...

    def rate(self, reqs: Sequence[RateRequest]) -> list[RateResult]:
        """One holistic 1..10 rating of each response against its whole checklist (RaR
        implicit aggregation)."""
        ...

    def compare(self, reqs: Sequence[PairRequest]) -> list[PairResult]:
        """Pairwise preference under a rubric; presentation order randomised (seeded), reported."""
        ...

    def induce(self, reqs: Sequence[InduceRequest]) -> list[tuple[Draft, ...]]:
        """Draft rubrics (process criteria) from a (best, hard negative, worst) triplet."""
        ...

    def consolidate(self, reqs: Sequence[ConsolidateRequest]) -> list[tuple[Draft, ...]]:
        """Common (cross-query) rubric(s) abstracted from K drafts."""
        ...

    def bundle(self, reqs: Sequence[BundleRequest]) -> list[Bundle]:
        """Partition a checklist into ``k_min..k_max`` dimensions, each with a description
        paragraph and an optional failure clause (item texts untouched; ``judges.bundling``)."""
        ...

    def equivalent(self, reqs: Sequence[EquivRequest]) -> list[EquivResult]:
        """Does the prediction mean a gold answer (LLM-judge accuracy)?"""
        ...

    def check_dimensions(self, reqs: Sequence[DimensionRequest]) -> list[DimensionResult]:
        """All criteria (dimension paragraphs) of one response judged in ONE call, one verdict
        per criterion (ProRubric authors' judge); failures returned as ``failed``."""
        ...

    def stats(self) -> dict[str, int]:
        """All counters (requests, re-asks, fallbacks, retries, timeouts, cache hits, tokens...)."""
        ...

    def versions(self) -> dict[str, str]:
        """Versions of prompts / feature library, recorded in the run folder."""
        ...

    def close(self) -> None:
        """Release resources (connections, threads); idempotent."""
        ...


@runtime_checkable
class Backend(Protocol):
    """What ``LLMJudge`` needs from a model: chat completions, optionally choice probabilities.

    ``choice_probs`` is optional (checked with ``hasattr``): it returns, per message list, the
    normalised probabilities of the next token being each of ``choices`` — or an empty dict
    when the backend cannot tell for that item (the judge then parses generated text instead).
    """

    def complete(
        self, batch: Sequence[Messages], max_tokens: int, temperature: float
    ) -> list[Completion]: ...

    def stats(self) -> dict[str, int]: ...

    def close(self) -> None: ...


def stable_digest(obj: Any) -> str:
    """A process-independent SHA-256 hex digest of a JSON-able value (Python's ``hash`` is
    salted per process, so it cannot seed reproducible coins or key an on-disk cache)."""
    blob = json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def seeded_coin(*parts: Any) -> int:
    """A deterministic fair bit from any JSON-able parts (seed, request identity, purpose)."""
    return int(stable_digest(list(parts))[:8], 16) & 1


def pair_identity(req: PairRequest) -> Any:
    """What the presentation-order coin of a pair depends on."""
    if req.seed is not None:
        return ["seed", req.seed]
    r = req.rubric
    rubric = r if isinstance(r, str) else [r.title, r.description, r.feature]
    return [req.context, req.a, req.b, rubric]


def order_coin(judge_seed: int, req: PairRequest) -> bool:
    """True when ``a`` is shown first."""
    return seeded_coin(judge_seed, "order", pair_identity(req)) == 0


def tie_coin(judge_seed: int, req: PairRequest) -> int:
    """The seeded tie-break bit reported with a tie (0 -> a, 1 -> b)."""
    return seeded_coin(judge_seed, "tie", pair_identity(req))
