"""Offline ProRubric bundling: checklist -> 2..5 protocol dimensions with failure clauses.

Command line::

    python -m rewards.bundle IN OUT judge=rule|openai|... [k_min=2] [k_max=5] [batch=16]
        [retries=0] [fmt=healthbench|rar|rubrichub|native] [judge.<option>=value ...]

``IN`` is any rubric file ``rewards.rubric.load_rubrics`` reads (format detected unless ``fmt``
is given).  For each prompt the judge is asked (``judge.bundle``, ``batch`` prompts per call) to
partition its checklist into ``k_min <= K <= k_max`` dimensions, each with an optional failure
clause.  The judge answers with criterion *indices*; this module never reads criterion text back
from it, so texts are unchanged by construction (and checked again before writing).

Validation (``validate_bundle``): ``K`` in range, every criterion index in exactly one
dimension, indices are integers in ``[0, C)``, dimension names non-empty and unique, failure
clauses text or null.  The LLM judge already re-asks on unparseable or invalid output; a prompt
still invalid after that (or after ``retries`` extra rounds here, useful for uncached sampling
judges) is reported with its reason and is *not* written.

``OUT`` is written in the ``native`` format (``rewards.rubric.save_rubrics``), in input order,
after every batch (atomically: a temporary file, then a rename), so an interrupted run keeps
its progress.  Caching / resuming: a prompt already in ``OUT`` with dimensions and the same
criteria (texts and weights) is skipped; one whose criteria changed is re-bundled (``stale``);
rows of ``OUT`` whose prompt is not in ``IN`` are kept at the end.  A summary (bundled /
skipped / failed with reasons, judge counters) is printed and written next to ``OUT`` as
``<OUT stem>.summary.json``.  Exit status: 0 when nothing failed, 1 when some prompt failed,
2 on a bad command line or input file (named with its row and field, before the judge starts).

Judge configuration: ``judge=NAME`` starts from ``conf/judge/NAME.yaml`` when that file exists
(else ``{name: NAME}``); ``judge.KEY=VALUE`` overrides a key.  ``k_min``/``k_max`` are passed to
the judge too.  Values are parsed as YAML scalars (``judge.max_reasks=2`` is an int).

The rule judge bundles deterministically (``judges.rule.rule_bundle``: pitfalls together,
positives by rule family, the count forced into range; no failure clauses).  A checklist with
fewer than ``k_min`` criteria cannot be bundled and is reported.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from core.files import write_atomic
from judges.types import Bundle, BundleRequest
from rewards.rubric import (
    MAX_DIMS,
    MIN_DIMS,
    Dimension,
    Rubric,
    RubricError,
    load_rubrics,
    save_rubrics,
)

#: Fewest dimensions the bundler asks for by default (the authors' 2..5; ``k_min=1`` is their
#: K = 1 ablation).
BUNDLE_MIN_DIMS = 2

CONF_JUDGE = Path(__file__).resolve().parents[1] / "conf" / "judge"


class CliError(ValueError):
    """Bad command line (message includes the usage line)."""


class BundleError(ValueError):
    """A judge's bundle for one prompt is invalid; the message says why."""


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------


def validate_bundle(bundle: Any, n: int, k_min: int = BUNDLE_MIN_DIMS, k_max: int = MAX_DIMS
                    ) -> tuple[Dimension, ...]:
    """A judge ``Bundle`` for a checklist of ``n`` criteria -> validated rubric dimensions.

    Raises ``BundleError`` when the judge reported an error, ``K`` is outside
    ``[k_min, min(k_max, n)]``, an index is not an integer in ``[0, n)``, an index appears twice
    or not at all, or a dimension name is empty or repeated.  Failure clauses: text (stripped;
    empty -> None) or None.
    """
    if not isinstance(bundle, Bundle):
        raise BundleError(f"judge returned a {type(bundle).__name__}, not a Bundle")
    if bundle.error is not None:
        raise BundleError(f"judge: {bundle.error}")
    dims = tuple(bundle.dimensions)
    hi = min(k_max, n)
    if not k_min <= len(dims) <= hi:
        why = f" (only {n} criteria)" if n < k_min else ""
        raise BundleError(f"K={len(dims)} dimensions, need {k_min} <= K <= {hi}{why}")
    owner: dict[int, int] = {}
    names: set[str] = set()
    out = []
    for k, d in enumerate(dims):
        try:
            name, indices, clause = d
        except (TypeError, ValueError):
            raise BundleError(f"dimension {k} is not (name, indices, failure_clause)") from None
        if not isinstance(name, str) or not name.strip():
            raise BundleError(f"dimension {k} has an empty name")
        name = name.strip()
        if name in names:
            raise BundleError(f"duplicate dimension name {name!r}")
        names.add(name)
        if not isinstance(indices, Sequence) or isinstance(indices, str) or not indices:
            raise BundleError(f"dimension {name!r} has no criteria")
        for i in indices:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
                raise BundleError(f"dimension {name!r}: criterion index {i!r} not in [0, {n})")
            if i in owner:
                raise BundleError(f"criterion {i} is in dimensions {owner[i]} and {k}")
            owner[i] = k
        if clause is not None and not isinstance(clause, str):
            raise BundleError(f"dimension {name!r}: failure clause is not text: {clause!r}")
        clause = clause.strip() if isinstance(clause, str) and clause.strip() else None
        out.append(Dimension(name=name, criteria=tuple(int(i) for i in indices), failure=clause))
    missing = sorted(set(range(n)) - set(owner))
    if missing:
        raise BundleError(f"criteria {missing} are in no dimension")
    return tuple(out)


def attach(rubric: Rubric, dims: Sequence[Dimension], bundler: str) -> Rubric:
    """The rubric with ``dims`` attached (criteria untouched) and ``meta["bundler"]`` set."""
    out = Rubric(prompt_id=rubric.prompt_id, prompt=rubric.prompt, criteria=rubric.criteria,
                 dimensions=tuple(dims), reference_answer=rubric.reference_answer,
                 meta={**dict(rubric.meta), "bundler": bundler})
    # the judge returned indices only, so this cannot fail; it guards future edits
    if [(c.text, c.weight) for c in out.criteria] != [(c.text, c.weight) for c in rubric.criteria]:
        raise AssertionError(f"{rubric.prompt_id}: criterion texts changed while bundling")
    return out


@dataclasses.dataclass(frozen=True)
class BundleResult:
    """Bundled rubrics (input order) and ``(prompt_id, reason)`` for each failure."""

    rubrics: tuple[Rubric, ...]
    failed: tuple[tuple[str, str], ...]


def request_of(r: Rubric) -> BundleRequest:
    return BundleRequest(prompt=r.prompt_text(), criteria=tuple(c.text for c in r.criteria),
                         weights=tuple(float(c.weight) for c in r.criteria))


def bundle_rubrics(rubrics: Sequence[Rubric], judge: Any, k_min: int = BUNDLE_MIN_DIMS,
                   k_max: int = MAX_DIMS, retries: int = 0, bundler: str | None = None
                   ) -> BundleResult:
    """Bundle ``rubrics`` with one ``judge.bundle`` call per round (1 + ``retries`` rounds over
    the still-invalid ones).  Never raises on a bad judge answer: it is reported in ``failed``."""
    bundler = bundler or type(judge).__name__
    done: dict[int, Rubric] = {}
    errors: dict[int, str] = {}
    todo = list(range(len(rubrics)))
    for _ in range(1 + max(int(retries), 0)):
        if not todo:
            break
        answers = judge.bundle([request_of(rubrics[i]) for i in todo])
        if not isinstance(answers, list | tuple) or len(answers) != len(todo):
            got = len(answers) if isinstance(answers, list | tuple) else type(answers).__name__
            for i in todo:
                errors[i] = f"judge returned {got} bundles for {len(todo)} requests"
            continue
        left = []
        for i, b in zip(todo, answers):
            try:
                dims = validate_bundle(b, rubrics[i].num_criteria, k_min, k_max)
                done[i] = attach(rubrics[i], dims, bundler)
                errors.pop(i, None)
            except (BundleError, RubricError) as e:
                errors[i] = str(e)
                left.append(i)
        todo = left
    return BundleResult(
        rubrics=tuple(done[i] for i in sorted(done)),
        failed=tuple((rubrics[i].prompt_id, errors[i]) for i in sorted(errors)),
    )


def bundle_missing(rubrics: Sequence[Rubric], judge: Any, k_min: int = BUNDLE_MIN_DIMS,
                   k_max: int = MAX_DIMS, retries: int = 0, bundler: str | None = None
                   ) -> BundleResult:
    """Bundle only the rubrics that have no dimensions (``bundle_rubrics``); a rubric that
    already has dimensions is returned as it is and never sent to the judge (SPEC 4: dimensions
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
    res = (bundle_rubrics(todo, judge, k_min, k_max, retries, bundler) if todo
           else BundleResult((), ()))
    new = {r.prompt_id: r for r in res.rubrics}
    kept = tuple(r if r.dimensions else new[r.prompt_id] for r in rubrics
                 if r.dimensions or r.prompt_id in new)
    return BundleResult(rubrics=kept, failed=res.failed)


# --------------------------------------------------------------------------------------------
# command line helpers (shared with rewards.perturb)
# --------------------------------------------------------------------------------------------


def _scalar(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def parse_cli(argv: Sequence[str], n_pos: int, usage: str, keys: Sequence[str]
              ) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    """``n_pos`` positionals, then ``key=value`` (``keys`` only) and ``judge.key=value``.

    Returns (positionals, options, judge options).  ``--key=value`` is accepted too.
    """
    pos, opts, jopts = [], {}, {}
    for a in argv:
        if a in ("-h", "--help"):
            raise CliError(usage)
        if "=" not in a:
            pos.append(a)
            continue
        k, v = a.lstrip("-").split("=", 1)
        if k.startswith("judge."):
            jopts[k[len("judge."):]] = _scalar(v)
        elif k in keys:
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
    ``batch`` prompts per ``judge.bundle`` call, ``retries`` extra rounds for invalid answers."""

    k_min: int = BUNDLE_MIN_DIMS
    k_max: int = MAX_DIMS
    batch: int = 16
    retries: int = 0

    def __post_init__(self) -> None:
        if not MIN_DIMS <= self.k_min <= self.k_max <= MAX_DIMS:
            raise ValueError(f"need {MIN_DIMS} <= k_min <= k_max <= {MAX_DIMS}, "
                             f"got {self.k_min}, {self.k_max}")


def read_inputs(src: str | Path, out: str | Path, fmt: str | None = None
                ) -> tuple[list[Rubric], dict[str, Rubric]]:
    """The rubrics of ``src`` and those already bundled in ``out`` (by prompt id); a bad file
    is a ``RubricError`` naming it, its row and field (``OSError`` when it cannot be read)."""
    out = Path(out)
    rubrics = load_rubrics(src, fmt)
    previous: dict[str, Rubric] = {}
    if out.exists() and out.stat().st_size > 0:
        previous = {r.prompt_id: r for r in load_rubrics(out, "native")}
    return rubrics, previous


def run_bundle(src: str | Path, out: str | Path, judge: Any, *, judge_name: str = "",
               options: BundleOptions = BundleOptions(), fmt: str | None = None
               ) -> dict[str, Any]:
    """Bundle the rubrics of ``src`` into ``out`` (resumable; see the module docstring).

    Returns the summary dict (also written to ``summary_path(out)``): ``bundled``, ``skipped``,
    ``stale`` (re-bundled because their criteria changed), ``failed`` (count) and
    ``failures`` (``[{prompt_id, reason}]``), ``total``, ``kept_extra``, ``k_min``, ``k_max``,
    ``judge`` and ``judge_stats``.
    """
    k_min, k_max, retries = options.k_min, options.k_max, options.retries
    out = Path(out)
    rubrics, previous = read_inputs(src, out, fmt)
    ids = {r.prompt_id for r in rubrics}
    extra = [r for pid, r in previous.items() if pid not in ids]
    result: dict[str, Rubric] = {}
    todo: list[Rubric] = []
    stale = 0
    for r in rubrics:
        old = previous.get(r.prompt_id)
        if old is not None and old.dimensions and _criteria_key(old) == _criteria_key(r):
            result[r.prompt_id] = old
        else:
            stale += old is not None
            todo.append(r)
    skipped = len(result)
    failures: list[dict[str, str]] = []
    bundled = 0

    def flush() -> None:
        rows = [result[r.prompt_id] for r in rubrics if r.prompt_id in result]
        save_rubrics(rows + extra, out)  # atomic: a kill keeps the last batch's file

    out.parent.mkdir(parents=True, exist_ok=True)
    step = max(int(options.batch), 1)
    for s in range(0, len(todo), step):
        chunk = todo[s:s + step]
        res = bundle_rubrics(chunk, judge, k_min, k_max, retries, bundler=judge_name or None)
        for r in res.rubrics:
            result[r.prompt_id] = r
        bundled += len(res.rubrics)
        failures += [{"prompt_id": pid, "reason": why} for pid, why in res.failed]
        flush()
    if not todo:
        flush()
    stats = judge.stats() if hasattr(judge, "stats") else {}
    summary = {
        "source": str(src), "out": str(out), "judge": judge_name or type(judge).__name__,
        "k_min": k_min, "k_max": k_max, "total": len(rubrics), "bundled": bundled,
        "skipped": skipped, "stale": stale, "failed": len(failures), "failures": failures,
        "kept_extra": len(extra),
        "judge_stats": {k: v for k, v in stats.items() if isinstance(v, int | float) and v},
    }
    write_atomic(summary_path(out), json.dumps(summary, indent=1, ensure_ascii=False))
    return summary


def format_summary(s: Mapping[str, Any]) -> str:
    lines = [f"{s['out']}: {s['bundled']} bundled, {s['skipped']} skipped (already bundled), "
             f"{s['failed']} failed of {s['total']} prompts (judge={s['judge']}, "
             f"K in [{s['k_min']}, {s['k_max']}])"]
    if s.get("stale"):
        lines.append(f"  {s['stale']} re-bundled because their criteria changed")
    for f in s["failures"]:
        lines.append(f"  FAILED {f['prompt_id']}: {f['reason']}")
    lines.append(f"summary: {summary_path(s['out'])}")
    return "\n".join(lines)


USAGE = (
    "usage: python -m rewards.bundle IN OUT judge=rule|openai|... [k_min=2] [k_max=5] "
    "[batch=16] [retries=0] [fmt=FORMAT] [judge.OPTION=VALUE ...]"
)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        pos, opts, jopts = parse_cli(argv, n_pos=2, usage=USAGE,
                                     keys=("judge", "k_min", "k_max", "batch", "retries", "fmt"))
        if "judge" not in opts:
            raise CliError(f"judge=NAME is required\n{USAGE}")
        k_min, k_max = int(opts.get("k_min", BUNDLE_MIN_DIMS)), int(opts.get("k_max", MAX_DIMS))
        options = BundleOptions(k_min=k_min, k_max=k_max, batch=int(opts.get("batch", 16)),
                                retries=int(opts.get("retries", 0)))
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
