"""Offline ProRubric bundling: checklist -> 1..5 dimensions, each a paragraph criterion.

Command line::

    python -m rewards.bundle IN OUT judge=rule|openai|... [k_min=2] [k_max=5] [batch=16]
        [regenerate=2] [fmt=healthbench|rar|rubrichub|native] [judge.<option>=value ...]

``IN`` is any rubric file ``rewards.rubric_io.load_rubrics`` reads (format detected unless ``fmt``
is given).  For each prompt the judge is asked (``judge.bundle``, ``batch`` prompts per call) to
group its checklist into ``k_min <= K <= k_max`` dimensions (the ProRubric authors' 2..5;
``k_min=k_max=1`` is their K = 1 arm) and to write each dimension as one criterion: a paragraph
saying what a good answer achieves and what makes it fail (``Dimension.description``; the
authors' judge reads only these paragraphs).  The LLM judge sees the items numbered from 1 and
the rubric's reference answer, when it has one, as an anchor; it answers in the authors' schema
``{"criteria": [{"name", "description", "weight", "atomic_indices": [1-based]}]}`` (plus an
optional ``failure_clause``), converted to 0-based indices at the parser.  Criterion texts are
never read back from the judge (only numbers), so they are unchanged by construction.

Valid (``judges.bundling.bundle_problems``): ``K`` in ``[k_min, min(k_max, C)]``, every criterion
in exactly one dimension, every description 2..10 sentences (``DESCRIPTION_SENTENCES``).  The
dimension weight is ours, never the judge's: ``W_d = sum_{i in I_d} |w_i|`` (the judge's number
is kept in ``meta["model_weights"]``).

An invalid answer is regenerated up to ``regenerate`` times (a fresh request that says why the
last answer could not be used; the LLM judge's own re-asks happen inside each request), then the
judge's last readable proposal is repaired deterministically (``rewards.bundle_repair``) and the
rubric is flagged: ``meta["repaired"] = True`` with ``meta["bundle_problem"]`` (why) and
``meta["bundle_repairs"]`` (what changed).  A prompt with no readable proposal at all (backend
down, output unparseable every time) or fewer than ``k_min`` criteria is reported as failed and
*not* written, so a rerun tries it again.

``OUT`` is written in the ``native`` format (``rewards.rubric_io.save_rubrics``), in input order,
after every batch (atomically: a temporary file, then a rename), so an interrupted run keeps
its progress.  Caching / resuming: a prompt already in ``OUT`` with described dimensions and the
same criteria (texts and weights) is skipped; one whose criteria changed, or with a dimension
without description, is re-bundled (``stale``); rows of ``OUT`` whose prompt is not in ``IN``
are kept at the end.  A summary (bundled / skipped / repaired / regenerated / failed with
reasons, judge counters) is printed and written next to ``OUT`` as ``<OUT stem>.summary.json``.
Exit status: 0 when nothing failed, 1 when some prompt failed, 2 on a bad command line or input
file (named with its row and field, before the judge starts).

Judge configuration: ``judge=NAME`` starts from ``conf/judge/NAME.yaml`` when that file exists
(else ``{name: NAME}``); ``judge.KEY=VALUE`` overrides a key.  ``k_min``/``k_max`` are passed to
the judge too.  Values are parsed as YAML scalars (``judge.max_reasks=2`` is an int).

The rule judge bundles deterministically (``judges.rule_language.rule_bundle``: pitfalls
together, positives by rule family, the count forced into range; descriptions composed from the
items' texts, no failure clauses).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from core.files import write_atomic
from judges.bundling import bundle_problems
from judges.types import Bundle, BundleRequest
from judges.types import Dimension as JudgeDimension
from rewards.bundle_repair import RepairError, repair_bundle
from rewards.rubric import MAX_DIMS, MIN_DIMS, Dimension, Rubric, RubricError
from rewards.rubric_io import load_rubrics, save_rubrics

#: Fewest dimensions the bundler asks for by default (the authors' 2..5; ``k_min=1`` is their
#: K = 1 ablation).
BUNDLE_MIN_DIMS = 2
#: Regenerations of an invalid answer before the repair (the authors' generator: 2).
BUNDLE_REGENERATE = 2

CONF_JUDGE = Path(__file__).resolve().parents[1] / "conf" / "judge"


class CliError(ValueError):
    """Bad command line (message includes the usage line)."""


class BundleError(ValueError):
    """A judge's bundle for one prompt is invalid; the message says why."""


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------


def validate_bundle(bundle: Any, n: int, k_min: int = BUNDLE_MIN_DIMS, k_max: int = MAX_DIMS
                    ) -> tuple[JudgeDimension, ...]:
    """A judge ``Bundle`` for a checklist of ``n`` criteria -> its dimensions, normalised
    (names and failure clauses stripped; an empty clause is None).

    Raises ``BundleError`` (the first three problems, 0-based criterion numbers) when the judge
    reported an error or ``judges.bundling.bundle_problems`` finds any."""
    if not isinstance(bundle, Bundle):
        raise BundleError(f"judge returned a {type(bundle).__name__}, not a Bundle")
    if bundle.error is not None:
        raise BundleError(f"judge: {bundle.error}")
    problems = bundle_problems(tuple(bundle.dimensions), n, k_min, k_max, base=0)
    if problems:
        raise BundleError("; ".join(problems[:3]))
    return tuple(
        d._replace(name=d.name.strip() if isinstance(d.name, str) else "",
                   failure_clause=(d.failure_clause.strip() or None) if d.failure_clause
                   else None,
                   description=d.description.strip())
        for d in bundle.dimensions
    )


def draft_of(answer: Any) -> tuple[JudgeDimension, ...]:
    """The proposal a repair can start from: an error bundle's ``draft``, an invalid bundle's
    own dimensions, nothing for anything else."""
    if not isinstance(answer, Bundle):
        return ()
    dims = answer.draft if answer.error is not None else answer.dimensions
    return tuple(d for d in dims if isinstance(d, JudgeDimension))


def rubric_dimensions(dims: Sequence[JudgeDimension], rubric: Rubric) -> tuple[Dimension, ...]:
    """Judge dimensions -> rubric dimensions with ``W_d = sum_{i in I_d} |w_i|`` (ours)."""
    w = rubric.weights
    return tuple(
        Dimension(name=d.name or f"dimension {k + 1}", criteria=tuple(int(i) for i in d.indices),
                  failure=d.failure_clause, description=d.description,
                  weight=float(sum(abs(w[i]) for i in d.indices)))
        for k, d in enumerate(dims)
    )


def attach(rubric: Rubric, dims: Sequence[JudgeDimension], bundler: str,
           record: Mapping[str, Any] | None = None) -> Rubric:
    """The rubric with ``dims`` attached (criteria untouched, weights ours) and
    ``meta["bundler"]``, ``meta["model_weights"]`` and ``record`` (``repaired`` ...) set."""
    meta = {**dict(rubric.meta), "bundler": bundler,
            "model_weights": [d.weight for d in dims], **dict(record or {})}
    out = Rubric(prompt_id=rubric.prompt_id, prompt=rubric.prompt, criteria=rubric.criteria,
                 dimensions=rubric_dimensions(dims, rubric),
                 reference_answer=rubric.reference_answer, meta=meta)
    # the judge returned indices only, so this cannot fail; it guards future edits
    if [(c.text, c.weight) for c in out.criteria] != [(c.text, c.weight) for c in rubric.criteria]:
        raise AssertionError(f"{rubric.prompt_id}: criterion texts changed while bundling")
    return out


@dataclasses.dataclass(frozen=True)
class BundleResult:
    """Bundled rubrics (input order), ``(prompt_id, reason)`` for each failure, the ids of the
    repaired rubrics and the number of regeneration requests made."""

    rubrics: tuple[Rubric, ...]
    failed: tuple[tuple[str, str], ...]
    repaired: tuple[str, ...] = ()
    regenerations: int = 0


def request_of(r: Rubric, previous_error: str | None = None) -> BundleRequest:
    return BundleRequest(prompt=r.prompt_text(), criteria=tuple(c.text for c in r.criteria),
                         weights=tuple(float(c.weight) for c in r.criteria),
                         reference=r.reference_answer, previous_error=previous_error)


@dataclasses.dataclass
class _Rounds:
    """Per-rubric state of ``bundle_rubrics`` (local to one call)."""

    done: dict[int, Rubric] = dataclasses.field(default_factory=dict)
    errors: dict[int, str] = dataclasses.field(default_factory=dict)
    drafts: dict[int, tuple[JudgeDimension, ...]] = dataclasses.field(default_factory=dict)
    regenerations: int = 0


def _ask_round(rubrics: Sequence[Rubric], todo: list[int], judge: Any, st: _Rounds,
               k_min: int, k_max: int, bundler: str, attempt: int) -> list[int]:
    """One ``judge.bundle`` call over ``todo``; returns the still-invalid ones."""
    answers = judge.bundle([request_of(rubrics[i], st.errors.get(i)) for i in todo])
    if not isinstance(answers, list | tuple) or len(answers) != len(todo):
        got = len(answers) if isinstance(answers, list | tuple) else type(answers).__name__
        for i in todo:
            st.errors[i] = f"judge returned {got} bundles for {len(todo)} requests"
        return todo
    left = []
    for i, b in zip(todo, answers):
        try:
            dims = validate_bundle(b, rubrics[i].num_criteria, k_min, k_max)
            st.done[i] = attach(rubrics[i], dims, bundler,
                                {"repaired": False, "bundle_attempts": attempt})
            st.errors.pop(i, None)
        except (BundleError, RubricError) as e:
            st.errors[i] = str(e)
            st.drafts[i] = draft_of(b) or st.drafts.get(i, ())
            left.append(i)
    return left


def _repair(r: Rubric, st: _Rounds, i: int, k_min: int, k_max: int, bundler: str,
            attempts: int) -> bool:
    """Repair rubric ``i`` from its last draft into ``st.done``; False when impossible."""
    if not st.drafts.get(i):
        return False
    try:
        dims, notes = repair_bundle(st.drafts[i], [c.text for c in r.criteria], r.weights,
                                    k_min, k_max)
    except RepairError as e:
        st.errors[i] = f"{st.errors[i]}; repair impossible: {e}"
        return False
    st.done[i] = attach(r, dims, bundler, {"repaired": True, "bundle_attempts": attempts,
                                           "bundle_problem": st.errors.pop(i),
                                           "bundle_repairs": list(notes)})
    return True


def bundle_rubrics(rubrics: Sequence[Rubric], judge: Any, k_min: int = BUNDLE_MIN_DIMS,
                   k_max: int = MAX_DIMS, regenerate: int = BUNDLE_REGENERATE,
                   bundler: str | None = None) -> BundleResult:
    """Bundle ``rubrics``: one ``judge.bundle`` call per round, 1 + ``regenerate`` rounds over
    the still-invalid ones, then the deterministic repair of each one's last readable proposal
    (flagged ``meta["repaired"]``).  Never raises on a bad judge answer: a prompt that cannot be
    bundled (no readable proposal, fewer than ``k_min`` criteria) is reported in ``failed``."""
    bundler = bundler or type(judge).__name__
    st = _Rounds()
    todo = []
    for i, r in enumerate(rubrics):
        if r.num_criteria < k_min:
            st.errors[i] = f"only {r.num_criteria} criteria, cannot make {k_min} dimensions"
        else:
            todo.append(i)
    rounds = 1 + max(int(regenerate), 0)
    for attempt in range(1, rounds + 1):
        if not todo:
            break
        st.regenerations += len(todo) if attempt > 1 else 0
        todo = _ask_round(rubrics, todo, judge, st, k_min, k_max, bundler, attempt)
    repaired = tuple(rubrics[i].prompt_id for i in todo
                     if _repair(rubrics[i], st, i, k_min, k_max, bundler, rounds))
    return BundleResult(
        rubrics=tuple(st.done[i] for i in sorted(st.done)),
        failed=tuple((rubrics[i].prompt_id, st.errors[i]) for i in sorted(st.errors)),
        repaired=repaired, regenerations=st.regenerations,
    )


def bundle_missing(rubrics: Sequence[Rubric], judge: Any, k_min: int = BUNDLE_MIN_DIMS,
                   k_max: int = MAX_DIMS, regenerate: int = BUNDLE_REGENERATE,
                   bundler: str | None = None) -> BundleResult:
    """Bundle only the rubrics that have no dimensions (``bundle_rubrics``); a rubric that
    already has dimensions is returned as it is and never sent to the judge (ProRubric: dimensions
    and failure clauses are generated once per prompt, offline, and cached).

    ``rubrics`` of the result: every already-bundled rubric plus every newly bundled one, in
    input order; ``failed``: ``(prompt_id, reason)`` of each one the judge could not bundle (not
    in ``rubrics``).  Duplicate prompt ids are a ``ValueError`` (results are matched by id)."""
    seen: set[str] = set()
    for r in rubrics:
        if r.prompt_id in seen:
            raise ValueError(f"bundle_missing: duplicate prompt id {r.prompt_id!r}")
        seen.add(r.prompt_id)
    todo = [r for r in rubrics if not r.dimensions]
    res = (bundle_rubrics(todo, judge, k_min, k_max, regenerate, bundler) if todo
           else BundleResult((), ()))
    new = {r.prompt_id: r for r in res.rubrics}
    kept = tuple(r if r.dimensions else new[r.prompt_id] for r in rubrics
                 if r.dimensions or r.prompt_id in new)
    return BundleResult(rubrics=kept, failed=res.failed, repaired=res.repaired,
                        regenerations=res.regenerations)


# --------------------------------------------------------------------------------------------
# command line helpers (shared with rewards.perturb)
# --------------------------------------------------------------------------------------------


def _scalar(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def split_prefixed(argv: Sequence[str], prefix: str) -> tuple[list[str], dict[str, Any]]:
    """(the other arguments, ``{key: value}`` of the ``PREFIX.key=value`` ones, YAML scalars;
    ``--PREFIX.key=value`` too)."""
    rest, found = [], {}
    for a in argv:
        k, eq, v = a.lstrip("-").partition("=")
        if eq and k.startswith(prefix + "."):
            found[k[len(prefix) + 1:]] = _scalar(v)
        else:
            rest.append(a)
    return rest, found


def parse_cli(argv: Sequence[str], n_pos: int, usage: str, keys: Sequence[str]
              ) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    """``n_pos`` positionals, then ``key=value`` (``keys`` only) and ``judge.key=value``.

    Returns (positionals, options, judge options).  ``--key=value`` is accepted too.
    """
    if any(a in ("-h", "--help") for a in argv):
        raise CliError(usage)
    rest, jopts = split_prefixed(argv, "judge")
    pos, opts = [], {}
    for a in rest:
        if "=" not in a:
            pos.append(a)
            continue
        k, v = a.lstrip("-").split("=", 1)
        if k in keys:
            opts[k] = v
        else:
            raise CliError(f"unknown option {k!r} (known: {', '.join(keys)}, judge.*)\n{usage}")
    if len(pos) != n_pos:
        raise CliError(f"expected {n_pos} positional arguments, got {len(pos)}\n{usage}")
    return pos, opts, jopts


def judge_config(name: str, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``conf/judge/NAME.yaml`` (when present) updated with ``overrides``; ``name`` set."""
    cfg: dict[str, Any] = {}
    path = CONF_JUDGE / f"{name}.yaml"
    if path.exists():
        from omegaconf import OmegaConf

        cfg = dict(OmegaConf.to_container(OmegaConf.load(path), resolve=True))  # type: ignore
    cfg.update(overrides or {})
    cfg["name"] = name
    return cfg


def judge_from_args(name: str, overrides: Mapping[str, Any] | None = None) -> Any:
    from judges.registry import make_judge

    if name == "none":
        raise CliError("judge=none cannot bundle or check; use judge=rule or judge=openai")
    return make_judge(judge_config(name, overrides))


def summary_path(out: str | Path) -> Path:
    out = Path(out)
    return out.with_name(f"{out.stem}.summary.json")


def _criteria_key(r: Rubric) -> list[tuple[str, float]]:
    return [(c.text, float(c.weight)) for c in r.criteria]


@dataclasses.dataclass(frozen=True)
class BundleOptions:
    """How ``run_bundle`` asks the judge: ``k_min <= K <= k_max`` dimensions per prompt,
    ``batch`` prompts per ``judge.bundle`` call, ``regenerate`` fresh requests for an invalid
    answer before the deterministic repair."""

    k_min: int = BUNDLE_MIN_DIMS
    k_max: int = MAX_DIMS
    batch: int = 16
    regenerate: int = BUNDLE_REGENERATE

    def __post_init__(self) -> None:
        if not MIN_DIMS <= self.k_min <= self.k_max <= MAX_DIMS:
            raise ValueError(f"need {MIN_DIMS} <= k_min <= k_max <= {MAX_DIMS}, "
                             f"got {self.k_min}, {self.k_max}")
        if self.regenerate < 0 or self.batch < 1:
            raise ValueError(f"need regenerate >= 0 and batch >= 1, got {self.regenerate}, "
                             f"{self.batch}")


def read_inputs(src: str | Path, out: str | Path, fmt: str | None = None
                ) -> tuple[list[Rubric], dict[str, Rubric]]:
    """The rubrics of ``src`` and those already bundled in ``out`` (by prompt id); a bad file
    is a ``RubricError`` naming it, its row and field (``OSError`` when it cannot be read)."""
    rubrics = load_rubrics(src, fmt)
    return rubrics, bundled_in(out)


def bundled_in(out: str | Path) -> dict[str, Rubric]:
    """The rubrics already bundled in ``out`` by prompt id (none when it does not exist)."""
    out = Path(out)
    if out.exists() and out.stat().st_size > 0:
        return {r.prompt_id: r for r in load_rubrics(out, "native")}
    return {}


def _reusable(old: Rubric | None, new: Rubric) -> bool:
    """``old`` (from OUT) can stand for ``new``: described dimensions, the same criteria."""
    return (old is not None and bool(old.dimensions)
            and all(d.description.strip() for d in old.dimensions)
            and _criteria_key(old) == _criteria_key(new))


@dataclasses.dataclass
class _Tally:
    """Counts of one ``run_bundle`` (local)."""

    bundled: int = 0
    regenerations: int = 0
    failures: list[dict[str, str]] = dataclasses.field(default_factory=list)
    repairs: list[dict[str, str]] = dataclasses.field(default_factory=list)
    regenerated: int = 0

    def add(self, res: BundleResult) -> None:
        self.bundled += len(res.rubrics)
        self.regenerations += res.regenerations
        self.failures += [{"prompt_id": pid, "reason": why} for pid, why in res.failed]
        by_id = {r.prompt_id: r for r in res.rubrics}
        self.repairs += [{"prompt_id": pid, "problem": str(by_id[pid].meta["bundle_problem"])}
                         for pid in res.repaired]
        self.regenerated += sum(int(r.meta.get("bundle_attempts", 1)) > 1 for r in res.rubrics)


def run_bundle(src: str | Path, out: str | Path, judge: Any, *, judge_name: str = "",
               options: BundleOptions = BundleOptions(), fmt: str | None = None
               ) -> dict[str, Any]:
    """Bundle the rubrics of ``src`` into ``out`` (resumable; see the module docstring).

    Returns the summary dict (also written to ``summary_path(out)``): ``bundled`` (written by
    this run, repaired ones included), ``repaired`` (count) and ``repairs``
    (``[{prompt_id, problem}]``), ``regenerated`` (prompts that needed more than one request),
    ``regenerations`` (extra requests), ``skipped``, ``stale`` (re-bundled: criteria changed or a
    dimension without description), ``failed`` (count) and ``failures``
    (``[{prompt_id, reason}]``), ``total``, ``kept_extra``, ``k_min``, ``k_max``,
    ``regenerate``, ``judge`` and ``judge_stats``.
    """
    rubrics, previous = read_inputs(src, out, fmt)
    return bundle_cached(rubrics, out, judge, judge_name=judge_name, options=options,
                         source=str(src), previous=previous)


def bundle_cached(rubrics: Sequence[Rubric], out: str | Path, judge: Any, *,
                  judge_name: str = "", options: BundleOptions = BundleOptions(),
                  source: str = "<rubrics>", previous: Mapping[str, Rubric] | None = None
                  ) -> dict[str, Any]:
    """:func:`run_bundle` on rubrics already read: those in ``out`` with the same criteria
    (``previous``, read from ``out`` when None) are kept, the rest bundled into it."""
    out = Path(out)
    if previous is None:
        previous = bundled_in(out)
    ids = {r.prompt_id for r in rubrics}
    extra = [r for pid, r in previous.items() if pid not in ids]
    result: dict[str, Rubric] = {}
    todo: list[Rubric] = []
    stale = 0
    for r in rubrics:
        old = previous.get(r.prompt_id)
        if _reusable(old, r):
            result[r.prompt_id] = old  # type: ignore[assignment]
        else:
            stale += old is not None
            todo.append(r)
    skipped = len(result)
    tally = _Tally()

    def flush() -> None:
        rows = [result[r.prompt_id] for r in rubrics if r.prompt_id in result]
        save_rubrics(rows + extra, out)  # atomic: a kill keeps the last batch's file

    out.parent.mkdir(parents=True, exist_ok=True)
    for s in range(0, len(todo), options.batch):
        res = bundle_rubrics(todo[s:s + options.batch], judge, options.k_min, options.k_max,
                             options.regenerate, bundler=judge_name or None)
        result.update((r.prompt_id, r) for r in res.rubrics)
        tally.add(res)
        flush()
    if not todo:
        flush()
    stats = judge.stats() if hasattr(judge, "stats") else {}
    summary = {
        "source": source, "out": str(out), "judge": judge_name or type(judge).__name__,
        "k_min": options.k_min, "k_max": options.k_max, "regenerate": options.regenerate,
        "total": len(rubrics), "bundled": tally.bundled, "repaired": len(tally.repairs),
        "repairs": tally.repairs, "regenerated": tally.regenerated,
        "regenerations": tally.regenerations, "skipped": skipped, "stale": stale,
        "failed": len(tally.failures), "failures": tally.failures, "kept_extra": len(extra),
        "judge_stats": {k: v for k, v in stats.items() if isinstance(v, int | float) and v},
    }
    write_atomic(summary_path(out), json.dumps(summary, indent=1, ensure_ascii=False))
    return summary


def format_summary(s: Mapping[str, Any]) -> str:
    lines = [f"{s['out']}: {s['bundled']} bundled ({s['repaired']} repaired), {s['skipped']} "
             f"skipped (already bundled), {s['failed']} failed of {s['total']} prompts "
             f"(judge={s['judge']}, K in [{s['k_min']}, {s['k_max']}])"]
    if s.get("regenerated"):
        lines.append(f"  {s['regenerated']} needed a regeneration ({s['regenerations']} extra "
                     f"requests, at most {s['regenerate']} per prompt)")
    if s.get("stale"):
        lines.append(f"  {s['stale']} re-bundled because their criteria changed or a dimension "
                     "had no description")
    for f in s["repairs"]:
        lines.append(f"  REPAIRED {f['prompt_id']}: {f['problem']}")
    for f in s["failures"]:
        lines.append(f"  FAILED {f['prompt_id']}: {f['reason']}")
    lines.append(f"summary: {summary_path(s['out'])}")
    return "\n".join(lines)


USAGE = (
    "usage: python -m rewards.bundle IN OUT judge=rule|openai|... [k_min=2] [k_max=5] "
    "[batch=16] [regenerate=2] [fmt=FORMAT] [judge.OPTION=VALUE ...]"
)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        pos, opts, jopts = parse_cli(
            argv, n_pos=2, usage=USAGE,
            keys=("judge", "k_min", "k_max", "batch", "regenerate", "fmt"))
        if "judge" not in opts:
            raise CliError(f"judge=NAME is required\n{USAGE}")
        k_min, k_max = int(opts.get("k_min", BUNDLE_MIN_DIMS)), int(opts.get("k_max", MAX_DIMS))
        options = BundleOptions(k_min=k_min, k_max=k_max, batch=int(opts.get("batch", 16)),
                                regenerate=int(opts.get("regenerate", BUNDLE_REGENERATE)))
        name = str(opts["judge"])
        read_inputs(pos[0], pos[1], opts.get("fmt"))  # bad files stop here, before the judge
        judge = judge_from_args(name, {"k_min": k_min, "k_max": k_max, **jopts})
    except (CliError, ValueError, OSError) as e:  # RubricError is a ValueError
        print(f"rewards.bundle: {e}", file=sys.stderr)
        return 2
    try:
        summary = run_bundle(pos[0], pos[1], judge, judge_name=name, options=options,
                             fmt=opts.get("fmt"))
    finally:
        judge.close()
    print(format_summary(summary))
    return 0 if summary["failed"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
