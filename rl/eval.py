"""Evaluate a base model or a training run's checkpoint: ``python -m rl.eval`` (hydra).

    python -m rl.eval task=search_qa                              # the base model
    python -m rl.eval task=search_qa eval.run=runs/my_run         # latest checkpoint of a run
    python -m rl.eval task=search_qa judge=rule eval.splits=[dev,test]

Greedy rollouts on each split (for search_qa with `eval_paths`, each named dataset). Search
tasks report EM, F1, format-valid rate, average turns and searches, and LLM-judge accuracy when
a judge is configured; any task reports its outcome mean. Per split and averaged; printed as a
table and written to `<out_dir>/eval.json` (default: the run folder, else the hydra folder);
every prompt's answer goes to `<out_dir>/eval_samples.jsonl` (`split`, `id`, `question`,
`response`, and the task's scores), which `python -m rewards.compare` reads.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import hydra
import numpy as np
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from core.files import write_atomic
from core.types import Group, Prompt
from models import load_params
from models.sampler import SamplingParams
from rewards.qa_metrics import METRIC_SETS, MetricChoice, MetricSet
from rl.compile_cache import use_compile_cache
from rl.envs import SamplerPolicy
from rl.run_folder import run_path

log = logging.getLogger("rl.eval")


def restore_run_params(run_dir: str | Path, params: Any,
                       step: int | None = None) -> tuple[Any, int]:
    """(params, step) from a run folder's checkpoint (``rl.train`` or ``rl.sft``), restored
    into the structure of ``params`` (the base model of that run); a LoRA run's adapters
    come merged into its base (``rl.lora.restore_merged``)."""
    from rl.checkpoint import Checkpointer
    from rl.config import optim_config
    from rl.lora import restore_merged, run_lora_config
    from rl.optim import make_optimizer
    from rl.train_step import init_train_state

    run_dir = run_path(str(run_dir))  # a local folder or a gs:// URL
    run_cfg = run_config(run_dir)
    lora = run_lora_config(run_cfg)
    if lora is not None:  # the checkpoint holds adapters: merged into the run's base
        init_from = dict(run_cfg.get("trainer") or {}).get("init_from")
        if init_from:  # the base that run trained on
            params, _ = restore_run_params(init_from, params)
        return restore_merged(run_dir, run_cfg, params, lora, step)
    ckpt = Checkpointer(run_dir / "checkpoints")
    step = ckpt.latest_step() if step is None else step
    if step is None:
        raise FileNotFoundError(f"{run_dir}/checkpoints: no checkpoint to load")
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
        return OmegaConf.to_container(OmegaConf.create(cfg_path.read_text()), resolve=True)
    if history.exists():
        lines = [x for x in history.read_text().splitlines() if x.strip()]
        try:
            return dict(json.loads(lines[-1])["config"])
        except (IndexError, KeyError, TypeError, json.JSONDecodeError) as e:
            raise FileNotFoundError(f"{history}: no readable config record ({e!r})") from None
    raise FileNotFoundError(f"{cfg_path}: not a run folder (no config.yaml or "
                            f"config_history.jsonl)")


def load_run_params(run_dir: str | Path, step: int | None = None) -> tuple[Any, Any, Any, int]:
    """(model config, params, tokenizer, step) from a run folder's checkpoint."""
    model_cfg, params, tok = load_params(str(run_config(run_dir)["model"]["path"]))
    params, step = restore_run_params(run_dir, params, step)
    return model_cfg, params, tok, step


def search_metrics(groups: Sequence[Group], judge: Any = None,
                   metrics: MetricSet | None = None,
                   normalize: str | None = None) -> tuple[dict, list[dict]]:
    """Means over the groups' first trajectories of the metric set's EM/F1 (default: the
    ``reward`` set; `normalize` overrides its normalisation), format validity, turns, searches
    and the judge's accuracy; and one record per question."""
    metrics = metrics or METRIC_SETS.get("reward")
    from judges.types import EquivRequest
    from rewards.qa import extract_answer, is_valid_format

    rows = []
    for g in groups:
        t = g.trajectories[0]
        pred = extract_answer(t.text)
        golds = list(g.prompt.answer)
        rows.append({"id": g.prompt.id, "question": g.prompt.question, "golds": golds,
                     "prediction": pred, **metrics.score(pred, golds, normalize),
                     "valid": float(is_valid_format(t.text)), "turns": t.info.get("turns", 1),
                     "searches": t.info.get("searches", 0), "response": t.text})
    if judge is not None:  # no answer is wrong without asking the judge
        answered = [r for r in rows if r["prediction"] is not None]
        for r in rows:
            r["judge_acc"] = 0.0
        reqs = [EquivRequest(question=r["question"], prediction=r["prediction"],
                             golds=tuple(r["golds"])) for r in answered]
        for r, res in zip(answered, judge.equivalent(reqs) if reqs else ()):
            r["judge_acc"] = float(res.equivalent)
    keys = [*metrics.metrics, "valid", "turns", "searches"] + (["judge_acc"] if judge else [])
    return {k: float(np.mean([r[k] for r in rows])) for k in keys}, rows


def answer_records(groups: Sequence[Group], outcome: Sequence[float]) -> list[dict]:
    """One record per prompt (``id``, ``question``, ``response``: the first trajectory's text,
    ``outcome``): what ``eval_samples.jsonl`` holds for a task other than search_qa, and what
    ``python -m rewards.compare`` pairs across two runs."""
    return [{"id": g.prompt.id, "question": g.prompt.question, "response": g.trajectories[0].text,
             "outcome": float(o)} for g, o in zip(groups, outcome)]


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


def evaluate(task: Any, policy: SamplerPolicy, splits: Sequence[str], max_new_tokens: int,
             judge: Any = None, max_examples: int | None = None, batch_size: int = 64,
             metrics: MetricChoice | None = None) -> dict[str, Any]:
    """Greedy evaluation of `policy` on each split; returns {split: metrics, "average": ...}.
    Search tasks score each split with its metric set (`metrics`, default ``MetricChoice()``:
    "auto", each split's dataset name decides); the sets used are under "_metric_sets". A
    metric some splits lack is averaged over those that have it."""
    metrics = metrics or MetricChoice()
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    env = task.make_env(policy.tokenizer, sampling)
    results: dict[str, Any] = {}
    records: dict[str, list] = {}
    metric_sets: dict[str, str] = {}
    for split in splits:
        prompts = task.prompts(split)[:max_examples]
        t0 = time.perf_counter()
        groups = greedy_rollouts(env, policy, prompts, batch_size, desc=f"eval {split}")
        outcome = [task.outcome(g.prompt, g.trajectories[0]) for g in groups]
        row = {"n": len(groups), "outcome": float(np.mean(outcome))}
        if getattr(task, "name", "") == "search_qa":
            chosen = metrics.for_split(split)
            m, records[split] = search_metrics(groups, judge, chosen, metrics.normalize)
            row |= m
            metric_sets[split] = chosen.name
        else:
            records[split] = answer_records(groups, outcome)
        row["time_s"] = time.perf_counter() - t0
        results[split] = row
    keys = list(dict.fromkeys(k for s in splits for k in results[s] if k not in ("n", "time_s")))
    results["average"] = {k: float(np.mean([results[s][k] for s in splits if k in results[s]]))
                          for k in keys}
    results["_records"] = records
    results["_metric_sets"] = metric_sets
    return results


def format_table(results: Mapping[str, Any]) -> str:
    names = [k for k in results if not k.startswith("_")]
    cols = [k for k in results["average"]]
    head = f"{'split':<14}" + "".join(f"{c:>11}" for c in cols)
    lines = [head, "-" * len(head)]
    for name in names:
        row = results[name]
        lines.append(f"{name:<14}" + "".join(
            f"{row.get(c, float('nan')):>11.3f}" for c in cols))
    return "\n".join(lines)


def run(cfg: DictConfig) -> dict[str, Any]:
    from rl.config import eval_config
    from rl.wiring import make_judge, make_task

    c = OmegaConf.to_container(cfg, resolve=True)
    e = eval_config(c["eval"])
    task = make_task(c["task"])
    if e.run:
        model_cfg, params, tok, step = load_run_params(e.run, e.step)
        source = f"{e.run} (step {step})"
    else:
        model_cfg, params, tok = load_params(str(c["model"]["path"]))
        source = f"base model {c['model']['path']}"
    judge = make_judge(c["judge"])
    results = evaluate(task, SamplerPolicy(model_cfg, params, tok), e.splits,
                       e.max_new_tokens or int(c["trainer"]["max_new_tokens"]),
                       judge=judge, max_examples=e.max_examples, batch_size=e.batch_size,
                       metrics=MetricChoice(e.metrics, e.metrics_by_split, e.normalize))
    records, metric_sets = results.pop("_records"), results.pop("_metric_sets")
    out_dir = Path(e.out_dir or e.run or c["trainer"]["run_dir"])
    write_atomic(out_dir / "eval.json", json.dumps(
        {"source": source, "metric_sets": metric_sets, "normalize": e.normalize,
         "results": results}, indent=1))
    if records:
        write_atomic(out_dir / "eval_samples.jsonl", "".join(
            json.dumps({"split": split, **r}) + "\n"
            for split, rows in records.items() for r in rows))
    print(f"evaluation of {source} on task {task.name}")
    print(format_table(results))
    if metric_sets:
        print("EM/F1: " + ", ".join(f"{s} {m}" for s, m in metric_sets.items())
              + f" (rewards/qa_metrics.py; normalize={e.normalize or 'each set its own'})")
    print(f"written: {out_dir / 'eval.json'}")
    return results


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    use_compile_cache(cfg.get("compile_cache"))
    run(cfg)


if __name__ == "__main__":
    main()
