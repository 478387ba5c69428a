"""``task=rubric_data``: train on a rubric dataset, each prompt judged against its own rubric.

The rows come from a file or a folder (``task.path``), or from a Hugging Face dataset
(``task.dataset``, ``task.subset``, ``task.split``: read by the ``datasets`` library from the
hub cache, ``rl.tasks.sources``), in any format ``rewards.rubric_io`` reads: HealthBench, RaR,
RubricHub, the ProRubric authors' train and public files, and the native one
(``task.format``, detected from the first row when null). ``task.where`` keeps the
rows whose own fields match (``rl.tasks.sources``: RubricHub's ``data_source``, HealthBench's
``example_tags``, ...). The dev and test prompts are ``task.dev_path`` / ``task.test_path``
(a dataset's ``task.dev_split`` / ``task.test_split``) when given, read and filtered the same
way, else a seeded ``task.eval_fraction`` of the training rows each. A prompt that is a
conversation (HealthBench) reaches the policy as its messages, rendered with the model's chat
template.

Every rubric reward reads the prompt's rubric (``prompt.meta["rubric"]``). A reward that reads
dimensions (ProRubric, raw-AND, the authors' dimension arms: ``rewards.rubric_scoring.
needs_dimensions``) takes them from the file when it has them; the others are bundled once by
the run's judge (``rewards.bundle``) into a cache file that the log names
(``task.dimensions_cache``, default ``$XDG_CACHE_HOME/rubricrl/dimensions/<data>-<judge>.jsonl``)
and read back from it by every later run on the same data and judge: never per step. A prompt
the judge gives no usable bundle (no readable proposal after its regenerations, e.g. a small
local judge that writes no JSON) gets the rule judge's deterministic bundle (positives and
pitfalls, by rule family; ``task.bundle_fallback: rule``, the default), flagged in its meta
(``repaired``, ``bundle_problem``), counted in the log and in ``provenance.jsonl``, and not
written to the cache, so the next run asks the judge again; ``task.bundle_fallback: null``
leaves such prompts out instead (the ProRubric authors' released data simply lacks them).

``outcome`` and ``evaluate`` score with the run's judge (the task is bound to it by
``rl.run.wiring.bind_judge``) under ``task.aggregator``, which the config links to the algo's;
evaluation also reports coverage (the additive score), fitness, length and, for rows with
HealthBench tags, HealthBench's clipped score by theme and axis (``rewards.healthbench``).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from core.types import Prompt, Trajectory
from models.sampler import SamplingParams
from rewards.rubric import Rubric, RubricError
from rewards.rubric_io import RUBRIC_FORMATS, detect_format
from rl.tasks.envs import SingleTurnEnv
from rl.tasks.sources import SPLITS, Row, SourceError, read_splits

if TYPE_CHECKING:
    from rewards.rubric_scoring import RubricReport

log = logging.getLogger(__name__)


def parse_source(rows: Sequence[Row], fmt: str | None, key: str) -> list[Rubric]:
    """The rubrics of `rows` in format `fmt` (detected from the first row when None); a bad
    row is a ``RubricError`` naming its file, row number and field."""
    if fmt is not None and fmt not in RUBRIC_FORMATS:
        raise SourceError(f"{key}: unknown rubric format {fmt!r}; known: "
                          f"{', '.join(RUBRIC_FORMATS.names())}")
    if fmt is None:
        try:
            fmt = detect_format(rows[0].data)
        except RubricError as e:
            raise RubricError(e.prompt_id, e.field, e.message, rows[0].where) from None
    parse = RUBRIC_FORMATS.get(fmt)
    out: list[Rubric] = []
    seen: dict[str, str] = {}
    for row in rows:
        try:
            rubric = parse(row.data)
        except RubricError as e:
            raise RubricError(e.prompt_id, e.field, e.message, row.where) from None
        if rubric.prompt_id in seen:
            raise RubricError(rubric.prompt_id, "prompt_id",
                              f"duplicate of {seen[rubric.prompt_id]}", row.where)
        seen[rubric.prompt_id] = row.where
        out.append(rubric)
    return out


def rubric_prompt(rubric: Rubric) -> Prompt:
    """The policy's prompt for a rubric: its messages (a plain prompt as one user message),
    the rubric in ``meta["rubric"]``, the reference answer (if any) as ``answer``."""
    if isinstance(rubric.prompt, str):
        messages: tuple[dict[str, str], ...] = ({"role": "user", "content": rubric.prompt},)
    else:
        messages = tuple({"role": m.role, "content": m.content} for m in rubric.prompt)
    return Prompt(id=rubric.prompt_id, messages=messages, answer=rubric.reference_answer,
                  meta={"question": rubric.prompt_text(), "rubric": rubric})


def data_digest(rubrics: Sequence[Rubric]) -> str:
    """12 hex digits of SHA-256 over the prompts' ids and criteria (texts and weights)."""
    h = hashlib.sha256()
    for r in sorted(rubrics, key=lambda r: r.prompt_id):
        h.update(json.dumps([r.prompt_id, [(c.text, c.weight) for c in r.criteria]],
                            ensure_ascii=False).encode())
    return h.hexdigest()[:12]


def default_cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "rubricrl" / "dimensions"


def rule_fallback(rubrics: Sequence[Rubric], failures: Sequence[Mapping[str, str]],
                  options: Any) -> dict[str, Rubric]:
    """The rule judge's deterministic bundle of `rubrics` (those an LLM judge could not bundle),
    each flagged ``repaired`` with the judge's ``bundle_problem``; a rubric with too few
    criteria for ``options.k_min`` dimensions stays out."""
    from judges.rule import RuleJudge
    from rewards.bundle import bundle_rubrics

    why = {f["prompt_id"]: f["reason"] for f in failures}
    res = bundle_rubrics(rubrics, RuleJudge(), options.k_min, options.k_max, regenerate=0,
                         bundler="rule (fallback)")
    return {r.prompt_id: dataclasses.replace(r, meta={
        **r.meta, "repaired": True, "bundle_problem": (
            f"the judge gave no usable bundle ({why.get(r.prompt_id, 'unknown')}); "
            "the rule judge's deterministic bundle is used")}) for r in res.rubrics}


@dataclasses.dataclass(frozen=True)
class RubricDataTask:
    """Prompts with their own rubrics from a rubric file or folder (module docstring).

    ``size`` / ``eval_size``: at most this many training / dev-and-test prompts (None: all);
    ``aggregator`` and ``clip``: the reward ``outcome`` and ``evaluate`` report (linked to the
    algo's); ``bundle_judge``: who bundles missing dimensions (None: the run's judge;
    ``"rule"``: the rule judge's deterministic bundle); ``bundle_fallback``: ``"rule"`` bundles
    the prompts the judge could not bundle deterministically (flagged), None leaves them out;
    ``k_min`` / ``k_max``: the dimensions a bundle may have.
    """

    path: str | None = None
    dataset: str | None = None
    subset: str | None = None
    split: str = "train"
    dev_split: str | None = None
    test_split: str | None = None
    revision: str | None = None
    format: str | None = None
    where: Mapping[str, Any] | None = None
    dev_path: str | None = None
    test_path: str | None = None
    eval_fraction: float = 0.05
    size: int | None = None
    eval_size: int | None = None
    seed: int = 0
    aggregator: str = "additive"
    clip: bool = False
    dimensions_cache: str | None = None
    bundle_judge: str | None = None
    bundle_fallback: str | None = "rule"
    k_min: int = 2
    k_max: int = 5
    name: str = "rubric_data"
    judge: Any = dataclasses.field(default=None, repr=False, compare=False)

    #: every prompt carries its own rubric (``prompt.meta["rubric"]``)
    prompt_rubrics: ClassVar[bool] = True

    def __post_init__(self) -> None:
        from rewards.rubric_scoring import check_reward_name

        check_reward_name(self.aggregator, "task.aggregator")
        if self.bundle_judge not in (None, "rule"):
            raise SourceError(f"task.bundle_judge: null (the run's judge) or rule, got "
                              f"{self.bundle_judge!r}")
        if self.bundle_fallback not in (None, "rule"):
            raise SourceError(f"task.bundle_fallback: rule or null (leave such prompts out), "
                              f"got {self.bundle_fallback!r}")
        source, splits = read_splits(self, lambda rows: parse_source(rows, self.format,
                                                                     "task.format"))
        object.__setattr__(self, "_source", source)
        object.__setattr__(self, "_splits", splits)

    # --- the judge ---------------------------------------------------------------------------

    def with_judge(self, judge: Any, judge_config: Mapping[str, Any] | None = None
                   ) -> RubricDataTask:
        """This task scoring with `judge`, its rubrics given the dimensions the aggregator
        reads (bundled by `judge` into the cache file where the data has none)."""
        from rewards.rubric_scoring import needs_dimensions

        bound = copy.copy(self)
        object.__setattr__(bound, "judge", judge)
        if judge is not None and needs_dimensions(self.aggregator):
            bundler, config = judge, dict(judge_config or {})
            if self.bundle_judge == "rule":  # deterministic: positives, pitfalls, by family
                from judges.rule import RuleJudge

                bundler, config = RuleJudge(), {"name": "rule"}
            splits, record = self._bundled(bundler, config)
            object.__setattr__(bound, "_splits", splits)
            object.__setattr__(bound, "_bundle_record", record)
        return bound

    def cache_path(self, rubrics: Sequence[Rubric], judge_config: Mapping[str, Any]) -> Path:
        if self.dimensions_cache:
            return Path(self.dimensions_cache).expanduser()
        who = "-".join(str(judge_config[k]) for k in ("name", "model") if judge_config.get(k))
        who = "".join(c if c.isalnum() or c in "._-" else "_" for c in who) or "judge"
        return default_cache_dir() / f"{data_digest(rubrics)}-{who}.jsonl"

    def _bundled(self, judge: Any, judge_config: Mapping[str, Any]
                 ) -> tuple[dict[str, list[Rubric]], dict[str, Any]]:
        """The splits with every rubric bundled (the file's dimensions where it has them, the
        cache's otherwise, the judge's for those the cache lacks, written to it; the rule
        fallback's for those the judge could not bundle) and a record of who bundled what."""
        from rewards.bundle import BundleOptions, bundle_cached, bundled_in

        splits: dict[str, list[Rubric]] = self._splits  # type: ignore[attr-defined]
        missing = list({r.prompt_id: r for rs in splits.values() for r in rs
                        if not r.dimensions}.values())
        if not missing:
            return splits, {"from_data": True}
        cache = self.cache_path(missing, judge_config)
        options = BundleOptions(k_min=int(self.k_min), k_max=int(self.k_max))
        summary = bundle_cached(missing, cache, judge, options=options,
                                judge_name=str(judge_config.get("name") or type(judge).__name__),
                                source=str(self.path or self.dataset))
        log.info("task rubric_data: dimensions of %d prompts from %s (%d bundled now, %d "
                 "from the cache, %d failed)", len(missing), cache, summary["bundled"],
                 summary["skipped"], summary["failed"])
        bundled = bundled_in(cache)
        record = {"cache": str(cache), "bundled_now": summary["bundled"],
                  "from_cache": summary["skipped"], "repaired": summary["repaired"],
                  "failed": summary["failed"], "rule_fallback": 0}
        if summary["failed"]:
            reasons = "; ".join(f"{f['prompt_id']}: {f['reason']}"
                                for f in summary["failures"][:3])
            where = cache.with_name(f"{cache.stem}.summary.json")
            if self.bundle_fallback == "rule":
                fallback = rule_fallback([r for r in missing if r.prompt_id not in bundled],
                                         summary["failures"], options)
                bundled |= fallback
                record["rule_fallback"] = len(fallback)
                log.warning("task rubric_data: the judge gave no usable bundle for %d of %d "
                            "prompts; they use the rule judge's deterministic bundle (flagged "
                            "repaired, not cached; task.bundle_fallback=null leaves them out) "
                            "(%s; all in %s)", len(fallback), len(missing), reasons, where)
            else:
                log.warning("task rubric_data: %d prompts could not be bundled and are left "
                            "out (%s; all in %s)", summary["failed"], reasons, where)
        out = {s: [r if r.dimensions else bundled[r.prompt_id] for r in rs
                   if r.dimensions or r.prompt_id in bundled] for s, rs in splits.items()}
        for split, rubrics in out.items():
            if not rubrics:
                raise SourceError(f"task rubric_data: no {split} prompt could be bundled into "
                                  f"dimensions by judge {judge_config.get('name')!r} (reasons "
                                  f"in {cache.with_name(f'{cache.stem}.summary.json')})")
        return out, record

    def data_provenance(self) -> dict[str, Any]:
        """The data this task trains and evaluates on, for ``provenance.jsonl``: its source
        (each file with its SHA-256, or the dataset and commit), the format, the filter and
        the split settings."""
        return {"task": self.name, **self._source.provenance(),  # type: ignore[attr-defined]
                "format": self.format, "where": dict(self.where or {}),
                "eval_fraction": self.eval_fraction, "seed": self.seed,
                "prompts": {s: len(r) for s, r in self._splits.items()},  # type: ignore[attr-defined]
                **({"dimensions": self._bundle_record}  # type: ignore[attr-defined]
                   if hasattr(self, "_bundle_record") else {})}

    # --- the task protocol -------------------------------------------------------------------

    def rubrics(self, split: str) -> list[Rubric]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; splits: {', '.join(SPLITS)}")
        return list(self._splits[split])  # type: ignore[attr-defined]

    def prompts(self, split: str) -> list[Prompt]:
        return [rubric_prompt(r) for r in self.rubrics(split)]

    def make_env(self, tokenizer: Any, sampling: SamplingParams) -> SingleTurnEnv:
        return SingleTurnEnv(tokenizer, sampling)

    def evaluate(self, prompts: Sequence[Prompt], responses: Sequence[str],
                 judge: Any = None) -> RubricReport:
        """The reward (``task.aggregator``), coverage, fitness and length of ``responses[b]``
        to ``prompts[b]``, judged in one batched call by `judge` (default: the bound one);
        the summary adds HealthBench's scores where the rows carry its tags."""
        from rewards.rubric_scoring import (
            ScoreItem,
            fitness_criteria,
            prompt_rubric,
            rubric_report,
            score_items,
        )

        judge = judge or self.judge
        if judge is None:
            raise ValueError("task rubric_data scores answers with a judge: add judge=local "
                             "or judge=openai")
        rubrics = [prompt_rubric(p) for p in prompts]
        items = [ScoreItem(r.context_text(), text, r, fitness_criteria(r))
                 for r, text in zip(rubrics, responses, strict=True)]
        s = score_items(judge, items, self.aggregator, clip=bool(self.clip))
        # HealthBench rows (they carry its example tags): its clipped score, by theme and axis
        return rubric_report(s, rubrics, [tuple(r.meta["example_tags"])
                                          if "example_tags" in r.meta else None
                                          for r in rubrics])

    def outcome(self, prompt: Prompt, traj: Trajectory) -> float:
        """The configured reward of one trajectory, judged by the bound judge."""
        return float(self.evaluate([prompt], [traj.text]).reward[0])
