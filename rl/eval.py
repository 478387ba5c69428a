"""Evaluate a base model or a training run's checkpoint: ``python -m rl.eval`` (hydra).

    python -m rl.eval task=search_qa                              # the base model
    python -m rl.eval task=search_qa eval.run=runs/my_run         # latest checkpoint of a run
    python -m rl.eval task=search_qa judge=rule eval.splits=[dev,test]
    python -m rl.eval task=prompts task.path=medqa.jsonl task.test_path=medqa.jsonl \
        task.prompt_field=question task.options_field=options task.answer_field=answer_idx \
        task.reward=choice eval.samples=8

Greedy rollouts on each split (for search_qa with `eval_paths`, each named dataset), or with
``eval.samples=k`` k sampled trajectories per prompt at ``eval.temperature``, reported as
mean@k (the ``outcome`` column), the unbiased pass@1..k and maj@k (``rl.run.eval_stats``).
Search tasks report EM, F1, format-valid rate, average turns and searches, and LLM-judge
accuracy when a judge is configured; prompt datasets their outcome reward (``task.reward``:
multiple-choice letter accuracy, math answer equivalence, QA EM/F1); rubric tasks the rubric
reward with coverage, fitness, length and, for HealthBench rows, HealthBench's scores; any task
reports its outcome mean. Per split and averaged, each with a percentile bootstrap interval
over prompts (``eval.confidence``, ``eval.bootstrap``; HealthBench's clipped scores over the
prompts where each is defined, the ends clipped too); printed as two tables and written to
`<out_dir>/eval.json` (default: the run folder, else the hydra folder); every answer goes to
`<out_dir>/eval_samples.jsonl` (`split`, `id`, `question`, `response`, the task's scores, and
`sample` with several per prompt), which `python -m rewards.compare` reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from core.files import write_atomic
from models import load_params
from rewards.qa_metrics import MetricChoice
from rl.run.compile_cache import use_compile_cache
from rl.run.evaluation import EvalOptions, evaluate, format_table, load_run_params
from rl.run.quiet import quiet_library_logs
from rl.run.resolve import resolved_config
from rl.tasks.envs import SamplerPolicy


def run(cfg: DictConfig) -> dict[str, Any]:
    from rl.run.config import eval_config
    from rl.run.wiring import bind_judge, import_user_modules, make_judge, make_task

    c = resolved_config(cfg)
    import_user_modules(c.get("imports"))
    e = eval_config(c["eval"])
    task = make_task(c["task"])
    if e.run:
        model_cfg, params, tok, step = load_run_params(e.run, e.step)
        source = f"{e.run} (step {step})"
    else:
        model_cfg, params, tok = load_params(str(c["model"]["path"]),
                                             revision=c["model"].get("revision"))
        source = f"base model {c['model']['path']}"
    tok = tok.with_template_kwargs(c["model"].get("chat_template_kwargs") or {})
    judge = make_judge(c["judge"])
    task = bind_judge(task, judge, c["judge"])
    trainer = c["trainer"]
    policy = SamplerPolicy(model_cfg, params, tok, dtype=e.dtype or trainer["rollout_dtype"],
                           kv_cache_dtype=e.dtype or trainer["kv_cache_dtype"],
                           decode_kernel=trainer.get("decode_kernel", "xla"),
                           shared_prompts=trainer.get("shared_prompts", False))
    results = evaluate(task, policy, e.splits,
                       e.max_new_tokens or int(c["trainer"]["max_new_tokens"]),
                       judge=judge,
                       metrics=MetricChoice(e.metrics, e.metrics_by_split, e.normalize),
                       options=EvalOptions(e.max_examples, e.batch_size, e.samples,
                                           e.temperature, e.confidence, e.bootstrap))
    records, metric_sets = results.pop("_records"), results.pop("_metric_sets")
    ranges = results.pop("_intervals")
    out_dir = Path(e.out_dir or e.run or c["trainer"]["run_dir"])
    write_atomic(out_dir / "eval.json", json.dumps(
        {"source": source, "metric_sets": metric_sets, "normalize": e.normalize,
         "samples": e.samples, "temperature": e.temperature if e.samples > 1 else 0.0,
         "results": results, "confidence": e.confidence, "intervals": ranges}, indent=1))
    if records:
        write_atomic(out_dir / "eval_samples.jsonl", "".join(
            json.dumps({"split": split, **r}) + "\n"
            for split, rows in records.items() for r in rows))
    how = "greedy" if e.samples == 1 else f"{e.samples} samples at temperature {e.temperature}"
    print(f"evaluation of {source} on task {task.name} ({how})")
    print(format_table(results))
    if e.samples > 1:
        k = e.samples
        print(f"outcome: mean@{k} (the outcome averaged over the {k} samples); outcome_pass@j: "
              f"the unbiased pass@j from {k} samples (Chen et al. 2021); outcome_maj@{k}: the "
              f"majority answer's outcome")
    print(f"\n{e.confidence:.0%} bootstrap intervals over prompts ({e.bootstrap} resamples)")
    print(format_table(ranges, interval=True))
    if metric_sets:
        print("EM/F1: " + ", ".join(f"{s} {m}" for s, m in metric_sets.items())
              + f" (rewards/qa_metrics.py; normalize={e.normalize or 'each set its own'})")
    print(f"written: {out_dir / 'eval.json'}")
    return results


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    quiet_library_logs()
    use_compile_cache(cfg.get("compile_cache"))
    run(cfg)


if __name__ == "__main__":
    from rl.run.resolve import print_help_first

    print_help_first(__doc__)
    main()
