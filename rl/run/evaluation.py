"""Evaluation as library functions: restore a run's weights, roll out greedy or sampled
trajectories split by split, score them with the task (and, for search tasks, EM/F1 and a
judge), and format the tables. ``python -m rl.eval`` is the command over these; the trainer
calls them for its evaluation at the run's ends."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf
from tqdm.auto import tqdm

from core.types import Group, Prompt
from models import load_params
from models.sampler import SamplingParams
from rewards.bootstrap import LEVEL, N_BOOT
from rewards.healthbench import is_healthbench_score
from rewards.qa_metrics import METRIC_SETS, MetricChoice, MetricSet
from rl.run.eval_stats import intervals, prompt_values
from rl.run.folder import run_path
from rl.tasks.envs import SamplerPolicy

log = logging.getLogger("rl.eval")


def restore_run_params(run_dir: str | Path, params: Any,
                       step: int | None = None) -> tuple[Any, int]:
    """(params, step) from a run folder's checkpoint (``rl.train`` or ``rl.sft``), restored
    into the structure of ``params`` (the base model of that run); a LoRA run's adapters
    come merged into its base (``rl.run.lora.restore_merged``)."""
    from rl.grpo.optim import make_optimizer
    from rl.grpo.train_step import init_train_state
    from rl.run.checkpoint import Checkpointer
    from rl.run.config import optim_config
    from rl.run.lora import restore_merged, run_lora_config

    folder = run_path(str(run_dir))  # a local folder or a gs:// URL
    run_cfg = run_config(folder)
    lora = run_lora_config(run_cfg)
    if lora is not None:  # the checkpoint holds adapters: merged into the run's base
        init_from = dict(run_cfg.get("trainer") or {}).get("init_from")
        if init_from:  # the base that run trained on
            params, _ = restore_run_params(init_from, params)
        return restore_merged(folder, run_cfg, params, lora, step)
    ckpt = Checkpointer(folder / "checkpoints")
    step = ckpt.latest_step() if step is None else step
    if step is None:
        raise FileNotFoundError(f"{folder}/checkpoints: no checkpoint to load")
    # the optimizer state's structure, which the checkpoint holds beside the weights
    state = init_train_state(params, make_optimizer(optim_config(run_cfg["optim"], 1)))
    restored, _ = ckpt.restore_verified(step, {"state": state._asdict()})  # checksums checked
    ckpt.close()
    return restored["state"]["params"], step


def run_config(run_dir: str | Path) -> dict[str, Any]:
    """The resolved config a run folder was written with: config.yaml (written by the
    command line), else the latest record of config_history.jsonl (a run built in Python with
    ``build_trainer`` has only that)."""
    cfg_path = run_path(str(run_dir)) / "config.yaml"
    history = run_path(str(run_dir)) / "config_history.jsonl"
    if cfg_path.exists():
        data = OmegaConf.to_container(OmegaConf.create(cfg_path.read_text()), resolve=True)
        return {str(k): v for k, v in data.items()} if isinstance(data, dict) else {}
    if history.exists():
        lines = [x for x in history.read_text().splitlines() if x.strip()]
        try:
            return dict(json.loads(lines[-1])["config"])
        except (IndexError, KeyError, TypeError, json.JSONDecodeError) as e:
            raise FileNotFoundError(f"{history}: no readable config record ({e!r})") from None
    raise FileNotFoundError(f"{cfg_path}: not a run folder (no config.yaml or "
                            f"config_history.jsonl)")


def run_model(run_dir: str | Path) -> tuple[str, str | None]:
    """(path, revision) of the model a run trained: for a hub id the commit its newest start
    loaded (``provenance.jsonl``), so a branch that moved since loads the same weights."""
    model = run_config(run_dir)["model"]
    revision = model.get("revision")
    try:
        lines = (Path(run_dir) / "provenance.jsonl").read_text().splitlines()
        revision = json.loads(lines[-1]).get("model", {}).get("commit") or revision
    except (OSError, IndexError, ValueError, AttributeError):
        pass  # a run folder from before model provenance: the configured revision
    return str(model["path"]), revision


def load_run_params(run_dir: str | Path, step: int | None = None) -> tuple[Any, Any, Any, int]:
    """(model config, params, tokenizer, step) from a run folder's checkpoint."""
    path, revision = run_model(run_dir)
    model_cfg, params, tok = load_params(path, revision=revision)
    params, step = restore_run_params(run_dir, params, step)
    return model_cfg, params, tok, step


def search_metrics(groups: Sequence[Group], judge: Any = None,
                   metrics: MetricSet | None = None,
                   normalize: str | None = None) -> tuple[dict, list[dict]]:
    """Means over the groups' first trajectories of the metric set's EM/F1 (default: the
    ``reward`` set; `normalize` overrides its normalisation), format validity, turns, searches
    and the judge's accuracy; and one record per question."""
    rows = search_rows([g.prompt for g in groups], [(g.trajectories[0],) for g in groups],
                       judge, metrics, normalize)
    records = [r[0] for r in rows]
    keys = [k for k in records[0] if k not in _RECORD_FIELDS] if records else []
    return {k: float(np.mean([r[k] for r in records])) for k in keys}, records


# the fields of a search record that are not metrics
_RECORD_FIELDS = ("id", "question", "golds", "prediction", "response", "sample")


def search_rows(prompts: Sequence[Prompt], samples: Sequence[Sequence[Any]], judge: Any = None,
                metrics: MetricSet | None = None, normalize: str | None = None
                ) -> list[list[dict]]:
    """``rows[prompt][sample]``: each sampled trajectory's record, its metric set's EM/F1,
    format validity, turns, searches and (with a judge) the judge's accuracy, asked in one
    batch."""
    metrics = metrics or METRIC_SETS.get("reward")
    from judges.types import EquivRequest
    from rewards.qa import extract_answer, is_valid_format

    rows = []
    for p, trajectories in zip(prompts, samples):
        golds = list(p.answer)
        per = []
        for i, t in enumerate(trajectories):
            pred = extract_answer(t.text)
            per.append({"id": p.id, "question": p.question, "golds": golds, "prediction": pred,
                        **metrics.score(pred, golds, normalize),
                        "valid": float(is_valid_format(t.text)),
                        "turns": t.info.get("turns", 1), "searches": t.info.get("searches", 0),
                        "response": t.text, **({"sample": i} if len(trajectories) > 1 else {})})
        rows.append(per)
    if judge is not None:  # no answer is wrong without asking the judge
        flat = [r for per in rows for r in per]
        answered = [r for r in flat if r["prediction"] is not None]
        for r in flat:
            r["judge_acc"] = 0.0
        reqs = [EquivRequest(question=r["question"], prediction=r["prediction"],
                             golds=tuple(r["golds"])) for r in answered]
        for r, res in zip(answered, judge.equivalent(reqs) if reqs else ()):
            r["judge_acc"] = float(res.equivalent)
    return rows


def answer_records(groups: Sequence[Group], outcome: Sequence[Sequence[float]]) -> list[dict]:
    """One record per trajectory (``id``, ``question``, ``response``, ``outcome``, and
    ``sample`` when a prompt has several): what ``eval_samples.jsonl`` holds for a task other
    than search_qa, and what ``python -m rewards.compare`` pairs across two runs."""
    return [{"id": g.prompt.id, "question": g.prompt.question, "response": t.text,
             "outcome": float(o), **({"sample": i} if len(g.trajectories) > 1 else {})}
            for g, os_ in zip(groups, outcome) for i, (t, o) in enumerate(zip(g.trajectories,
                                                                              os_))]


def greedy_rollouts(env: Any, policy: Any, prompts: Sequence[Prompt], batch_size: int,
                    desc: str = "eval") -> list[Group]:
    """One trajectory per prompt, rolled out `batch_size` prompts at a time (a benchmark split
    of thousands of questions in one batch would not fit in memory), with a progress bar."""
    if batch_size < 1:
        raise ValueError(f"eval batch_size must be >= 1, got {batch_size}")
    groups: list[Group] = []
    for i in tqdm(range(0, len(prompts), batch_size), desc=desc, leave=False,
                  disable=len(prompts) <= batch_size):
        groups += env.rollout(policy, prompts[i:i + batch_size], 1, seed=0)
    return groups


# a task report's per-answer values (rewards.rubric_scoring.RubricReport) beside the outcome
REPORT_FIELDS = ("coverage", "fitness", "length")


def task_report(task: Any, groups: Sequence[Group]) -> Any:
    """``task.evaluate`` over every answer of `groups`, in order (one batched judging), or
    None for a task without its own report."""
    if not hasattr(task, "evaluate"):
        return None
    return task.evaluate([g.prompt for g in groups for _ in g.trajectories],
                         [t.text for g in groups for t in g.trajectories])


def outcomes(task: Any, groups: Sequence[Group], report: Any) -> list[list[float]]:
    """Each answer's outcome: the task report's ``reward`` (the same value
    ``task.outcome`` gives, judged in one batch) when it has one, else ``task.outcome``."""
    if report is None or not hasattr(report, "reward"):
        return [[task.outcome(g.prompt, t) for t in g.trajectories] for g in groups]
    rewards = iter(np.asarray(report.reward, np.float64).tolist())
    return [[next(rewards) for _ in g.trajectories] for g in groups]


def report_scores(report: Any, scores: list[list[dict]]
                  ) -> tuple[list[list[dict]], dict[str, float]]:
    """A task report's per-answer values (:data:`REPORT_FIELDS`, and the values HealthBench's
    scores average, NaN where undefined) joined to each answer's scores (so they get mean@k
    and intervals), and its summary's other aggregates (rubric tasks: HealthBench's clipped
    ``healthbench``, ``axis/*``, ``theme/*``) as the split's values."""
    summary = {k: float(v) for k, v in report.summary.items()
               if k not in REPORT_FIELDS and k != "reward"}
    per_answer = {k: v for k, v in getattr(report, "healthbench", {}).items() if k in summary}
    i = 0
    for row in scores:
        for answer in row:
            answer |= {f: float(getattr(report, f)[i]) for f in REPORT_FIELDS
                       if hasattr(report, f)}
            answer |= {k: float(v[i]) for k, v in per_answer.items()}
            i += 1
    return scores, summary


def sampled_rollouts(env: Any, policy: Any, prompts: Sequence[Prompt], batch_size: int,
                     samples: int, desc: str = "eval") -> list[Group]:
    """`samples` trajectories per prompt (the env's sampling), `batch_size` prompts at a time;
    each batch's seed is its first prompt's index."""
    groups: list[Group] = []
    for i in tqdm(range(0, len(prompts), batch_size), desc=desc, leave=False,
                  disable=len(prompts) <= batch_size):
        groups += env.rollout(policy, prompts[i:i + batch_size], samples, seed=i)
    return groups


@dataclasses.dataclass(frozen=True)
class EvalOptions:
    """How an evaluation samples and reports (the ``eval`` section's keys of the same names):
    at most `max_examples` prompts per split, `batch_size` rolled out together; greedy with
    `samples` = 1, else `samples` answers per prompt at `temperature`; intervals at level
    `confidence` from `bootstrap` resamples."""

    max_examples: int | None = None
    batch_size: int = 64
    samples: int = 1
    temperature: float = 1.0
    confidence: float = LEVEL
    bootstrap: int = N_BOOT


def evaluate(task: Any, policy: SamplerPolicy, splits: Sequence[str], max_new_tokens: int,
             judge: Any = None, metrics: MetricChoice | None = None,
             options: EvalOptions = EvalOptions()) -> dict[str, Any]:
    """Evaluation of `policy` on each split; returns {split: metrics, "average": ...}. Greedy,
    or with ``options.samples`` = k answers per prompt, reported as mean@k, pass@1..k and,
    for a task that reads final answers (``task.answer``), maj@k (``rl.run.eval_stats``).
    Search tasks score each split with its metric set (`metrics`, default
    ``MetricChoice()``: "auto", each split's dataset name decides); the sets used are under
    "_metric_sets", the bootstrap intervals of every value under "_intervals". A metric some
    splits lack is averaged over those that have it."""
    o = options
    samples, temperature, batch_size = o.samples, o.temperature, o.batch_size
    if samples < 1:
        raise ValueError(f"eval samples must be >= 1, got {samples}")
    metrics = metrics or MetricChoice()
    sampling = SamplingParams(max_new_tokens=max_new_tokens,
                              temperature=0.0 if samples == 1 else temperature)
    env = task.make_env(policy.tokenizer, sampling)
    results: dict[str, Any] = {}
    records: dict[str, list] = {}
    metric_sets: dict[str, str] = {}
    values: dict[str, dict[str, np.ndarray]] = {}
    for split in splits:
        prompts = task.prompts(split)[:o.max_examples]
        t0 = time.perf_counter()
        if samples == 1:
            groups = greedy_rollouts(env, policy, prompts, batch_size, desc=f"eval {split}")
        else:
            groups = sampled_rollouts(env, policy, prompts, batch_size, samples,
                                      desc=f"eval {split}")
        report = task_report(task, groups)
        outcome = outcomes(task, groups, report)
        if getattr(task, "name", "") == "search_qa":
            chosen = metrics.for_split(split)
            rows = search_rows([g.prompt for g in groups], [g.trajectories for g in groups],
                               judge, chosen, metrics.normalize)
            records[split] = [r for per in rows for r in per]
            metric_sets[split] = chosen.name
            scores = [[{"outcome": o, **{k: v for k, v in r.items() if k not in _RECORD_FIELDS}}
                       for o, r in zip(os_, per)] for os_, per in zip(outcome, rows)]
        else:
            records[split] = answer_records(groups, outcome)
            scores = [[{"outcome": o} for o in os_] for os_ in outcome]
        summary: dict[str, float] = {}
        if report is not None:  # the task's own report (rubric tasks: coverage, ...)
            scores, summary = report_scores(report, scores)
        answer = getattr(task, "answer", None)  # each sample's final answer: maj@k
        answers = None if answer is None else [[answer(g.prompt, t) for t in g.trajectories]
                                                for g in groups]
        values[split] = prompt_values(scores, samples, answers)
        results[split] = {"n": len(groups), **{k: float(np.mean(v))
                                               for k, v in values[split].items()},
                          **summary, "time_s": time.perf_counter() - t0}
    keys = list(dict.fromkeys(k for s in splits for k in results[s] if k not in ("n", "time_s")))
    results["average"] = {k: float(np.mean([results[s][k] for s in splits if k in results[s]]))
                          for k in keys}
    results["_records"] = records
    results["_metric_sets"] = metric_sets
    results["_intervals"] = clip_healthbench(intervals(values, o.bootstrap, o.confidence))
    return results


def clip_healthbench(ranges: dict[str, dict[str, list[float]]]
                     ) -> dict[str, dict[str, list[float]]]:
    """The intervals with HealthBench's clipped scores' ends clipped to [0, 1], as the scores
    are (``rewards.healthbench``)."""
    return {split: {k: [float(np.clip(x, 0.0, 1.0)) for x in v] if is_healthbench_score(k)
                    else v for k, v in metrics.items()} for split, metrics in ranges.items()}


def format_table(results: Mapping[str, Any], interval: bool = False) -> str:
    """The splits as rows and the average's metrics as columns; `interval`: each cell a
    ``[lo, hi]`` range.  Each column is as wide as its widest cell, two spaces apart."""
    names = [k for k in results if not k.startswith("_")]
    cols = [k for k in results["average"]]

    def cell(v: Any) -> str:
        if interval:
            return f"[{v[0]:.3f}, {v[1]:.3f}]" if v is not None else "-"
        return f"{v if v is not None else float('nan'):.3f}"

    cells = {(n, c): cell(results[n].get(c)) for n in names for c in cols}
    widths = [max([len(c)] + [len(cells[(n, c)]) for n in names]) + 2 for c in cols]
    head = f"{'split':<14}" + "".join(f"{c:>{w}}" for c, w in zip(cols, widths))
    lines = [head, "-" * len(head)]
    for name in names:
        lines.append(f"{name:<14}" + "".join(f"{cells[(name, c)]:>{w}}"
                                              for c, w in zip(cols, widths)))
    return "\n".join(lines)
