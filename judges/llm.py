"""``LLMJudge``: prompts + parsing + bounded re-ask + defined fallbacks, on top of any backend.

All LLM-specific judging logic lives here, so a backend (OpenAI-compatible HTTP, in-process
JAX, ...) only has to turn chat message lists into completions (``Backend.complete``) and,
optionally, next-token choice probabilities (``choice_probs``) for logprob-based checks.

Failure handling, per item of a batch:

1. backend gave up (``Completion.error``; retries already happened in the backend)
   -> fallback at once, counted in ``backend_errors``;
2. unparseable -> ``parse_errors``; the conversation is extended with the bad answer and a
   re-ask carrying the parser's complaint; all such items of the batch are re-asked together,
   at most ``max_reasks`` rounds (``reasks`` counts each item of each round);
3. still unparseable -> the operation's defined fallback (``fallbacks`` and ``fallbacks_<op>``):
   check: not met, prob 0.5, ``fallback=True``; rate: rating 1, ``fallback=True``;
   compare: a tie with ``fallback=True``;
   induce / consolidate: ``FallbackDrafts()`` (no drafts, marked as a failure, not an answer);
   bundle: an empty ``Bundle`` with ``error`` (and ``draft``: the last readable but invalid
   proposal, for the bundler's repair); equivalent: cover-exact-match, ``fallback=True``.
   Consumers must not treat a fallback as evidence (the rubric memory does not).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import judges.prompts as P
from core.search_r1 import normalize_answer
from judges.base import (
    JUDGE_STAT_KEYS,
    Backend,
    Counters,
    OptionAttributes,
    order_coin,
    tie_coin,
)
from judges.bundling import compose_description
from judges.parsing import (
    ParseError,
    parse_check,
    parse_compare,
    parse_dimension_grades,
    parse_dimension_verdicts,
    parse_drafts,
    parse_equiv,
    parse_rating,
    read_bundle,
)
from judges.search_features import cover_match
from judges.types import (
    GRADE_MAX,
    RATING_MIN,
    TIE,
    Bundle,
    BundleRequest,
    CheckRequest,
    CheckResult,
    ConsolidateRequest,
    Dimension,
    DimensionRequest,
    DimensionResult,
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

T = TypeVar("T")

# A bad answer is echoed back in the re-ask; cap it so a runaway generation cannot blow up the
# context of the second round.
_MAX_ECHO_CHARS = 2000


class _Failed:
    """Marker for an item that ends on its fallback."""

    __slots__ = ("reason",)

    def __init__(self, reason: str):
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class JudgeOptions:
    """The keyword options of :class:`LLMJudge` (documented there), checked once."""

    seed: int = 0
    max_reasks: int = 1
    max_tokens: int = 512
    temperature: float = 0.0
    check_mode: str = "json"
    compare_mode: str = "json"
    max_drafts: int = 3
    max_common: int = 2
    k_min: int = 2
    k_max: int = 5
    equiv_exact_shortcut: bool = True
    dimension_attempts: int = 3
    retry_temperature: float = 0.7

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # config values may arrive as strings or floats
            object.__setattr__(self, f.name, as_type(str(f.type), getattr(self, f.name)))
        if self.check_mode not in ("json", "logprob"):
            raise ValueError(f"check_mode must be 'json' or 'logprob', got {self.check_mode!r}")
        if self.compare_mode not in ("json", "logprob"):
            raise ValueError(f"compare_mode must be 'json' or 'logprob', got "
                             f"{self.compare_mode!r}")
        if self.dimension_attempts < 1:
            raise ValueError(f"dimension_attempts must be >= 1, got {self.dimension_attempts}")
        if not 1 <= self.k_min <= self.k_max:
            raise ValueError(f"need 1 <= k_min <= k_max, got {self.k_min}, {self.k_max}")


def as_type(kind: str, value: Any) -> Any:
    """`value` as the annotated scalar type `kind` ("int", "float", "int | None", ...)."""
    base = kind.split("|")[0].strip()
    return {"int": int, "float": float, "bool": bool, "str": str}[base](value)


class LLMJudge(OptionAttributes):
    """The judge protocol implemented with prompts on an LLM backend.

    Args:
        backend: provides ``complete`` (and optionally ``choice_probs``, ``stats``, ``close``).
        seed: seeds the presentation-order and tie-break coins of pairwise comparisons.
        max_reasks: re-ask rounds after unparseable output (0 = fall back at once).
        max_tokens: the tokens every judge call may generate.
        temperature: sampling temperature of every judge call (0: reproducible, and
            cacheable by the HTTP backend).
        check_mode: ``"json"`` (HealthBench-style ``criteria_met``) or ``"logprob"``
            (P(Yes) from ``choice_probs``; items the backend cannot score go the JSON way).
        compare_mode: ``"json"`` (winner 1 / 2 / tie, generated) or ``"logprob"`` (P("1") vs
            P("2") from ``choice_probs`` in one forward pass; no tie unless exactly 0.5).
        max_drafts: rubrics per induction.
        max_common: rubrics per consolidation.
        k_min: fewest bundle dimensions allowed.
        k_max: most bundle dimensions allowed.
        equiv_exact_shortcut: answer equivalence without a call when the normalised prediction
            equals a normalised gold (saves judge calls on the easy cases).
    """

    def __init__(self, backend: Backend, **options: Any):
        self.backend = backend
        self.options = JudgeOptions(**options)
        self._c = Counters(JUDGE_STAT_KEYS)

    def __repr__(self) -> str:
        return (
            f"LLMJudge(backend={self.backend!r}, seed={self.seed}, max_reasks={self.max_reasks}, "
            f"check_mode={self.check_mode!r})"
        )

    # --- engine ---------------------------------------------------------------------------

    def _run(
        self, convs: Sequence[Messages], parse: Callable[[str, int], T], shape: str
    ) -> list[T | _Failed]:
        """Complete every conversation, parse, re-ask the unparseable ones in batched rounds."""
        convs = [list(c) for c in convs]
        results: list[Any] = [None] * len(convs)
        pending = list(range(len(convs)))
        errors: dict[int, str] = {}
        for round_ in range(self.max_reasks + 1):
            if not pending:
                break
            if round_:
                self._c.inc("reasks", len(pending))
            comps = self.backend.complete(
                [convs[i] for i in pending], self.max_tokens, self.temperature
            )
            if len(comps) != len(pending):
                raise RuntimeError(
                    f"backend returned {len(comps)} completions for {len(pending)} requests"
                )
            retry: list[int] = []
            for i, comp in zip(pending, comps):
                if comp.error is not None:
                    self._c.inc("backend_errors")
                    results[i] = _Failed(f"backend error: {comp.error}")
                    continue
                try:
                    results[i] = parse(comp.text, i)
                except ParseError as e:
                    self._c.inc("parse_errors")
                    errors[i] = str(e)
                    convs[i] += [
                        {"role": "assistant", "content": (comp.text or "")[:_MAX_ECHO_CHARS]},
                        P.reask_message(str(e), shape),
                    ]
                    retry.append(i)
            pending = retry
        for i in pending:
            results[i] = _Failed(f"unparseable judge output: {errors.get(i, '?')}")
        return results

    def _finish(self, op: str, raw: list[Any], fallback: Callable[[int, _Failed], T]) -> list[T]:
        """Replace failures by the operation's fallback, counting them."""
        out: list[T] = []
        for i, r in enumerate(raw):
            if isinstance(r, _Failed):
                self._c.inc("fallbacks")
                self._c.inc(f"fallbacks_{op}")
                out.append(fallback(i, r))
            else:
                out.append(r)
        return out

    # --- operations -----------------------------------------------------------------------

    def check(self, reqs: Sequence[CheckRequest]) -> list[CheckResult]:
        reqs = list(reqs)
        self._c.inc("requests_check", len(reqs))
        results: list[Any] = [None] * len(reqs)
        todo = list(range(len(reqs)))
        if self.check_mode == "logprob" and hasattr(self.backend, "choice_probs"):
            convs = [
                P.CHECK_YESNO.render(context=r.context, response=r.response, criterion=r.criterion)
                for r in reqs
            ]
            probs = self.backend.choice_probs(convs, ("Yes", "No"))
            todo = []
            for i, pr in enumerate(probs):
                if pr and "Yes" in pr:
                    p = float(pr["Yes"])
                    results[i] = CheckResult(met=p >= 0.5, prob=p)
                else:  # this item has no usable probabilities: ask for the JSON verdict
                    todo.append(i)
        if todo:
            convs = [
                P.CHECK.render(
                    context=reqs[i].context, response=reqs[i].response, criterion=reqs[i].criterion
                )
                for i in todo
            ]

            def parse(text: str, _: int) -> CheckResult:
                met = parse_check(text)
                return CheckResult(met=met, prob=1.0 if met else 0.0)

            for i, r in zip(todo, self._run(convs, parse, P.CHECK.shape)):
                results[i] = r
        return self._finish("check", results, lambda i, f: CheckResult(False, 0.5, True))

    def rate(self, reqs: Sequence[RateRequest]) -> list[RateResult]:
        """One call per response (prompt ``RATE``: the whole weighted checklist and the
        response) for an integer rating 1..10 (``parse_rating``: JSON ``rating`` or the bare
        number); unparseable answers are re-asked and counted like every operation, and end on
        the fallback ``RateResult(1, fallback=True)``."""
        reqs = list(reqs)
        self._c.inc("requests_rate", len(reqs))
        for i, r in enumerate(reqs):
            if len(r.criteria) != len(r.weights):
                raise ValueError(f"rate request {i}: {len(r.criteria)} criteria but "
                                 f"{len(r.weights)} weights")
        convs = [P.render_rate(r.context, r.response, tuple(r.criteria), tuple(r.weights))
                 for r in reqs]
        raw = self._run(convs, lambda t, _: RateResult(parse_rating(t)), P.RATE.shape)
        return self._finish("rate", raw, lambda i, f: RateResult(RATING_MIN, fallback=True))

    def compare(self, reqs: Sequence[PairRequest]) -> list[PairResult]:
        reqs = list(reqs)
        self._c.inc("requests_compare", len(reqs))
        a_first = [order_coin(self.seed, r) for r in reqs]

        def render(template: P.PromptTemplate, i: int) -> Messages:
            r = reqs[i]
            first, second = (r.a, r.b) if a_first[i] else (r.b, r.a)
            return template.render(context=r.context, rubric=as_draft(r.rubric).text(),
                                   first=first, second=second)

        results: list[Any] = [None] * len(reqs)
        todo = list(range(len(reqs)))
        if self.compare_mode == "logprob" and hasattr(self.backend, "choice_probs"):
            probs = self.backend.choice_probs([render(P.COMPARE_12, i) for i in todo], ("1", "2"))
            todo = []
            for i, pr in enumerate(probs):
                if not pr or "1" not in pr:  # no usable probabilities: ask for the JSON verdict
                    todo.append(i)
                    continue
                p_a = float(pr["1"]) if a_first[i] else 1.0 - float(pr["1"])
                results[i] = (self._tie(reqs[i], a_first[i], fallback=False) if p_a == 0.5 else
                              PairResult(winner=0 if p_a > 0.5 else 1, prob_a=p_a,
                                         a_shown_first=a_first[i]))

        def parse(text: str, j: int) -> PairResult:
            i = todo[j]
            shown = parse_compare(text)  # 1 / 2 = position shown, 0 = tie
            if shown == 0:
                return self._tie(reqs[i], a_first[i], fallback=False)
            winner = 0 if (shown == 1) == a_first[i] else 1
            return PairResult(winner=winner, prob_a=1.0 - winner, a_shown_first=a_first[i])

        if todo:
            raw = self._run([render(P.COMPARE, i) for i in todo], parse, P.COMPARE.shape)
            for i, r in zip(todo, raw):
                results[i] = r
        return self._finish("compare", results,
                            lambda i, f: self._tie(reqs[i], a_first[i], True))

    def _tie(self, req: PairRequest, a_first: bool, fallback: bool) -> PairResult:
        return PairResult(
            winner=TIE,
            prob_a=0.5,
            a_shown_first=a_first,
            fallback=fallback,
            tie_break=tie_coin(self.seed, req),
        )

    def induce(self, reqs: Sequence[InduceRequest]) -> list[tuple[Draft, ...]]:
        reqs = list(reqs)
        self._c.inc("requests_induce", len(reqs))
        def render(r: InduceRequest) -> Any:
            values = dict(
                question=r.question,
                golds="; ".join(r.golds) or "(not given)",
                best=r.best,
                hard_negative=r.hard_negative
                if r.hard_negative is not None
                else "(none: no trajectory with a different outcome)",
                worst=r.worst,
                max_drafts=str(self.max_drafts),
            )
            if r.mastered:  # algo.lineage_in_induction
                return P.INDUCE_LINEAGE.render(mastered=P.render_drafts(r.mastered), **values)
            return P.INDUCE.render(**values)

        convs = [render(r) for r in reqs]
        raw = self._run(convs, lambda t, _: parse_drafts(t, self.max_drafts), P.INDUCE.shape)
        return self._finish("induce", raw, lambda i, f: FallbackDrafts())

    def consolidate(self, reqs: Sequence[ConsolidateRequest]) -> list[tuple[Draft, ...]]:
        reqs = list(reqs)
        self._c.inc("requests_consolidate", len(reqs))
        results: list[Any] = [()] * len(reqs)
        todo = [i for i, r in enumerate(reqs) if r.drafts]  # nothing to consolidate: no call
        convs = [
            P.CONSOLIDATE.render(
                drafts=P.render_drafts(reqs[i].drafts), max_common=str(self.max_common)
            )
            for i in todo
        ]
        raw = self._run(convs, lambda t, _: parse_drafts(t, self.max_common), P.CONSOLIDATE.shape)
        for i, r in zip(todo, raw):
            results[i] = r
        return self._finish("consolidate", results, lambda i, f: FallbackDrafts())

    def bundle(self, reqs: Sequence[BundleRequest]) -> list[Bundle]:
        """One call per checklist (prompt ``BUNDLE``: the items numbered from 1, the reference
        answer as an anchor when given).  An answer that is readable but invalid
        (``read_bundle``'s problems: K out of range, an item missing or repeated, a description
        empty or not 2..10 sentences) is re-asked with its problems like an unparseable one;
        the fallback is ``Bundle((), error, draft=<the last readable proposal>)``."""
        reqs = list(reqs)
        self._c.inc("requests_bundle", len(reqs))
        results: list[Any] = [None] * len(reqs)
        todo: list[int] = []
        for i, r in enumerate(reqs):
            if len(r.criteria) != len(r.weights):
                raise ValueError(
                    f"bundle request {i}: {len(r.criteria)} criteria but {len(r.weights)} weights"
                )
            if not r.criteria:
                results[i] = Bundle(dimensions=(), error="empty checklist")
            elif len(r.criteria) < self.k_min:
                results[i] = singleton_bundle(r.criteria, r.weights)
            else:
                todo.append(i)
        convs = [
            P.render_bundle(r.prompt, tuple(r.criteria), tuple(r.weights), self.k_min,
                            min(self.k_max, len(r.criteria)), r.reference, r.previous_error)
            for r in (reqs[i] for i in todo)
        ]
        drafts: dict[int, tuple[Dimension, ...]] = {}

        def parse(text: str, j: int) -> Bundle:
            crit = reqs[todo[j]].criteria
            dims, problems = read_bundle(text, crit, self.k_min, min(self.k_max, len(crit)))
            if problems:
                drafts[todo[j]] = dims
                raise ParseError("; ".join(problems[:3]))
            return Bundle(dimensions=dims)

        for i, got in zip(todo, self._run(convs, parse, P.BUNDLE.shape)):
            results[i] = got
        return self._finish("bundle", results,
                            lambda i, f: Bundle((), error=f.reason, draft=drafts.get(i, ())))

    def equivalent(self, reqs: Sequence[EquivRequest]) -> list[EquivResult]:
        reqs = list(reqs)
        self._c.inc("requests_equivalent", len(reqs))
        results: list[Any] = [None] * len(reqs)
        todo: list[int] = []
        for i, r in enumerate(reqs):
            pred = normalize_answer(r.prediction)
            if self.equiv_exact_shortcut and pred and any(
                pred == normalize_answer(g) for g in r.golds
            ):
                results[i] = EquivResult(equivalent=True, prob=1.0)
            else:
                todo.append(i)
        convs = [
            P.EQUIV.render(
                question=reqs[i].question,
                golds="; ".join(reqs[i].golds) or "(none)",
                prediction=reqs[i].prediction,
            )
            for i in todo
        ]

        def parse(text: str, _: int) -> EquivResult:
            eq = parse_equiv(text)
            return EquivResult(equivalent=eq, prob=1.0 if eq else 0.0)

        for i, got in zip(todo, self._run(convs, parse, P.EQUIV.shape)):
            results[i] = got

        def fallback(i: int, _: _Failed) -> EquivResult:
            em = cover_match(reqs[i].prediction, reqs[i].golds)
            return EquivResult(equivalent=em, prob=float(em), fallback=True)

        return self._finish("equivalent", results, fallback)

    def check_dimensions(self, reqs: Sequence[DimensionRequest]) -> list[DimensionResult]:
        """One call per response with every criterion (prompt ``dimensions`` or
        ``dimensions_graded``), one verdict per criterion (``parse_dimension_verdicts`` /
        ``parse_dimension_grades``: every number exactly once).

        A call whose completion the backend gave up on or that does not parse is sent again,
        fresh (no re-ask turn), up to ``dimension_attempts`` in all: attempt 1 at the
        request's temperature or else ``temperature``, later ones at the request's or else
        ``retry_temperature``. Still nothing usable: ``DimensionResult((), failed=True)``,
        counted in ``failures_dimensions``; retries in ``retries_dimensions``.
        """
        reqs = list(reqs)
        self._c.inc("requests_dimensions", len(reqs))
        for i, r in enumerate(reqs):
            if r.verdict not in ("binary", "graded") or not r.criteria:
                raise ValueError(f"dimension request {i}: verdict {r.verdict!r} with "
                                 f"{len(r.criteria)} criteria (need binary|graded, >= 1)")
        convs = [P.render_dimensions(r.context, r.response,
                                     tuple((c.text, float(c.weight)) for c in r.criteria),
                                     r.verdict == "graded") for r in reqs]
        results: list[DimensionResult | None] = [None] * len(reqs)
        errors: dict[int, str] = {}
        pending = list(range(len(reqs)))
        for attempt in range(self.dimension_attempts):
            if attempt:
                self._c.inc("retries_dimensions", len(pending))
            pending = self._dimension_round(reqs, convs, pending, attempt, results, errors)
            if not pending:
                break
        for i in pending:
            self._c.inc("failures_dimensions")
            results[i] = DimensionResult((), failed=True, error=errors.get(i, "?"),
                                         attempts=self.dimension_attempts)
        return [r for r in results if r is not None]

    def _dimension_temperature(self, req: DimensionRequest, attempt: int) -> float:
        if req.temperature is not None:
            return float(req.temperature)
        return self.temperature if attempt == 0 else self.retry_temperature

    def _dimension_round(self, reqs: Sequence[DimensionRequest], convs: Sequence[Messages],
                         pending: Sequence[int], attempt: int,
                         results: list[DimensionResult | None], errors: dict[int, str]
                         ) -> list[int]:
        """One attempt for every pending call (one backend batch per temperature); returns
        the calls still without a verdict."""
        by_temp: dict[float, list[int]] = {}
        for i in pending:
            by_temp.setdefault(self._dimension_temperature(reqs[i], attempt), []).append(i)
        retry: list[int] = []
        for temp, idx in by_temp.items():
            comps = self.backend.complete([convs[i] for i in idx], self.max_tokens, temp)
            if len(comps) != len(idx):
                raise RuntimeError(f"backend returned {len(comps)} completions for "
                                   f"{len(idx)} requests")
            for i, comp in zip(idx, comps):
                try:
                    scores = self._dimension_scores(reqs[i], comp)
                except ParseError as e:
                    errors[i] = str(e)
                    retry.append(i)
                    continue
                results[i] = DimensionResult(scores, attempts=attempt + 1)
        return sorted(retry)

    def _dimension_scores(self, req: DimensionRequest, comp: Any) -> tuple[float, ...]:
        if comp.error is not None:
            self._c.inc("backend_errors")
            raise ParseError(f"backend error: {comp.error}")
        n = len(req.criteria)
        try:
            if req.verdict == "graded":
                return tuple(g / GRADE_MAX for g in parse_dimension_grades(comp.text, n))
            return tuple(float(v) for v in parse_dimension_verdicts(comp.text, n))
        except ParseError:
            self._c.inc("parse_errors")
            raise

    # --- bookkeeping ----------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        out = self._c.snapshot()
        backend_stats = getattr(self.backend, "stats", None)
        if callable(backend_stats):
            out.update(backend_stats())
        return out

    def versions(self) -> dict[str, str]:
        return dict(P.PROMPT_VERSIONS)

    def sampling_state(self) -> dict[str, Any]:
        """The backend's sampling position (``JaxBackend.sampling_state``; {} for backends
        whose sampling has no state here, such as a server). The coins of pairwise order and
        ties are pure functions of ``seed`` and the request and need none."""
        state = getattr(self.backend, "sampling_state", None)
        return dict(state()) if callable(state) else {}

    def restore_sampling_state(self, state: Mapping[str, Any]) -> None:
        restore = getattr(self.backend, "restore_sampling_state", None)
        if state and callable(restore):
            restore(state)

    def close(self) -> None:
        close = getattr(self.backend, "close", None)
        if callable(close):
            close()

    def __enter__(self) -> LLMJudge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def singleton_bundle(criteria: Sequence[str], weights: Sequence[float]) -> Bundle:
    """One dimension per criterion, described by ``compose_description``: the only partition
    of a checklist shorter than ``k_min`` (a 1-criterion checklist cannot be split into 2
    non-empty dimensions)."""
    return Bundle(dimensions=tuple(
        Dimension(f"criterion {i + 1}", (i,), None, compose_description((c,), (w,)))
        for i, (c, w) in enumerate(zip(criteria, weights))
    ))


LLM_OPTIONS = frozenset(f.name for f in dataclasses.fields(JudgeOptions))


def split_llm_options(cfg: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(``LLMJudge`` keyword options, everything else) of a flat judge config."""
    llm = {k: v for k, v in cfg.items() if k in LLM_OPTIONS}
    rest = {k: v for k, v in cfg.items() if k not in LLM_OPTIONS}
    return llm, rest
