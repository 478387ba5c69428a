"""Additive Rubric-RL vs ProRubric vs raw-AND on ``task=rubric_chat`` (SPEC 4, the experiment).

Every aggregator gets the same budget (steps, prompts per step, group size, token limit,
temperature, learning rate) and the same seeds; the only difference is ``algo=``. Each run trains
with ``python -m rl.train`` into ``<out>/<algo>_s<seed>``; the trainer's greedy evaluation on the
task's eval split before and after training (``eval/*`` in ``metrics.jsonl``) gives the held-out
numbers. The summary reads the run folders only (``--summary-only`` re-prints it):

* coverage ``g`` (the training rubric, additive normalisation), fitness ``c`` (held-out criteria
  never rewarded: answer first, concise, no filler, no repetition), length in words — greedy, on
  the eval prompts, before -> after training;
* the same three over the training rollouts (first vs last quarter of the steps), and the
  fraction of groups whose reward had zero variance (no learning signal under GRPO).

Usage (CPU, shipped SmolLM2-135M, rule judge)::

    python -m bench.prorubric_experiment                   # rubric_rl, prorubric, raw_and; seed 0
    python -m bench.prorubric_experiment --dry-run         # print the commands only
    python -m bench.prorubric_experiment --summary-only    # table from existing run folders
    python -m bench.prorubric_experiment --smoke --out /tmp/prorubric_smoke   # tiny model, 1 step
    python -m bench.prorubric_experiment --algos rubric_rl,prorubric,raw_and,implicit \\
        --seeds 0,1 --steps 30 --extra optim.lr=1e-5

Re-running continues where it stopped (finished runs are skipped, interrupted ones resume).
Plots: ``PRORUBRIC_RUNS=<out>/* jupyter execute --inplace notebooks/prorubric.ipynb``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.experiment import (
    fmt,
    latest_checkpoint,
    mean,
    print_table,
    std,
    train_unless_done,
    write_summary,
)

DEFAULT_ALGOS = ("rubric_rl", "prorubric", "raw_and")


@dataclass(frozen=True)
class Budget:
    """What every aggregator gets, identically."""

    model: str = "smollm2_135m"
    judge: str = "rule"
    steps: int = 15
    batch_prompts: int = 4
    group_size: int = 4
    max_new_tokens: int = 128    # room for a dimension (3 items, mentioned and explained)
    temperature: float = 0.8     # SmolLM2-135M at 1.0 mostly writes noise
    save_every: int = 5

    def overrides(self) -> list[str]:
        return [f"model={self.model}", "task=rubric_chat", f"judge={self.judge}",
                f"trainer.max_steps={self.steps}", f"trainer.batch_prompts={self.batch_prompts}",
                f"algo.group_size={self.group_size}",
                f"trainer.max_new_tokens={self.max_new_tokens}",
                f"trainer.temperature={self.temperature}",
                f"trainer.save_every={self.save_every}", "trainer.eval_at_ends=true",
                "trainer.progress=false"]


SMOKE = Budget(model="tiny", steps=1, batch_prompts=2, group_size=2, max_new_tokens=16,
               save_every=1)
SMOKE_EXTRA = ("task.size=8", "task.eval_size=2")


def run_name(algo: str, seed: int) -> str:
    return f"{algo}_s{seed}"


def train_command(algo: str, seed: int, run_dir: Path, budget: Budget,
                  extra: Sequence[str]) -> list[str]:
    cmd = [sys.executable, "-m", "rl.train", f"algo={algo}", *budget.overrides(),
           f"trainer.seed={seed}", f"trainer.run_dir={run_dir}", f"hydra.run.dir={run_dir}",
           *extra]
    if latest_checkpoint(run_dir) is not None:
        cmd.append("trainer.resume=true")
    return cmd


# --- summary ----------------------------------------------------------------------------------

EVAL_KEYS = (("coverage", "g"), ("fitness", "c"), ("length", "words"))


def run_stats(run_dir: Path) -> dict[str, float] | None:
    """Per-run numbers from metrics.jsonl: greedy eval before/after, training first/last quarter."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return None
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    train = [r for r in rows if "reward/mean" in r]
    evals = [r for r in rows if "eval/outcome_mean" in r]
    if not train:
        return None
    q = max(1, len(train) // 4)
    out: dict[str, float] = {"steps": float(len(train)),
                             "homog": mean([r.get("groups/total_homogeneous_frac")
                                            for r in train]),
                             "reward_first": mean([r.get("reward/mean") for r in train[:q]]),
                             "reward_last": mean([r.get("reward/mean") for r in train[-q:]])}
    for key, _ in EVAL_KEYS:
        rk = "length_words" if key == "length" else key
        out[f"train_{key}_first"] = mean([r.get(f"rubric/{rk}") for r in train[:q]])
        out[f"train_{key}_last"] = mean([r.get(f"rubric/{rk}") for r in train[-q:]])
        if len(evals) >= 2:
            out[f"eval_{key}_before"] = float(evals[0].get(f"eval/{key}", float("nan")))
            out[f"eval_{key}_after"] = float(evals[-1].get(f"eval/{key}", float("nan")))
    return out


COLUMNS = tuple((f"eval_{k}_{w}", f"{s} {w}") for k, s in EVAL_KEYS for w in ("before", "after")
                ) + tuple((f"train_{k}_{w}", f"train {s} {w}") for k, s in EVAL_KEYS
                          for w in ("first", "last")) + (("homog", "zero-var groups"),)


def summarize(out_dir: Path, algos: Sequence[str], seeds: Sequence[int]) -> dict[str, Any]:
    """Mean (and std over seeds) per aggregator; printed and returned."""
    table: dict[str, dict[str, Any]] = {}
    for algo in algos:
        got = {s: v for s in seeds if (v := run_stats(out_dir / run_name(algo, s)))}
        if not got:
            continue
        row: dict[str, Any] = {"seeds": sorted(got)}
        for key in (*(k for k, _ in COLUMNS), "steps"):
            vals = [v.get(key, float("nan")) for v in got.values()]
            row[key], row[f"{key}_std"] = mean(vals), std(vals)
        table[algo] = row
    print_table(["algo", "seeds", "steps", *(t for _, t in COLUMNS)],
                [[algo, ",".join(map(str, row["seeds"])), f"{row['steps']:.0f}",
                  *(fmt(row[k], row[f"{k}_std"]) for k, _ in COLUMNS)]
                 for algo, row in table.items()])
    return table


# --- main ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algos", default=",".join(DEFAULT_ALGOS),
                   help="comma-separated algo configs (rubric_rl, prorubric, raw_and, implicit, "
                        "pass_rate)")
    p.add_argument("--seeds", default="0", help="comma-separated trainer seeds")
    p.add_argument("--out", default="runs/prorubric_exp", type=Path)
    p.add_argument("--steps", type=int, help=f"training steps (default {Budget.steps})")
    p.add_argument("--model", help=f"model preset/path (default {Budget.model})")
    p.add_argument("--temperature", type=float,
                   help=f"sampling temperature (default {Budget.temperature})")
    p.add_argument("--extra", nargs="*", default=[], help="more hydra overrides for every run")
    p.add_argument("--smoke", action="store_true", help="pipeline check: tiny model, 1 step")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--summary-only", action="store_true", help="only print the summary table")
    a = p.parse_args(argv)

    budget = SMOKE if a.smoke else Budget()
    changes = {k: v for k, v in (("steps", a.steps), ("model", a.model),
                                 ("temperature", a.temperature)) if v is not None}
    budget = Budget(**{**budget.__dict__, **changes})
    extra = [*(SMOKE_EXTRA if a.smoke else ()), *a.extra]
    algos = [x.strip() for x in a.algos.split(",") if x.strip()]
    seeds = [int(x) for x in a.seeds.split(",") if x.strip()]
    out: Path = a.out

    failed: list[str] = []
    if not a.summary_only:
        print(f"budget: {budget}\nextra overrides: {extra}\nruns: {len(algos) * len(seeds)} "
              f"({', '.join(algos)} x seeds {seeds}) -> {out}/<algo>_s<seed>", flush=True)
        for seed in seeds:  # seed-major: a partial experiment still compares aggregators
            for algo in algos:
                name = run_name(algo, seed)
                run_dir = out / name
                if not train_unless_done(name, run_dir, budget.steps,
                                         train_command(algo, seed, run_dir, budget, extra),
                                         out / "logs", a.dry_run):
                    failed.append(name)
    if a.dry_run:
        return 0
    return write_summary(out, budget, extra, summarize(out, algos, seeds), failed,
                         f"notebooks/prorubric.ipynb (PRORUBRIC_RUNS={out}/*)")


if __name__ == "__main__":
    sys.exit(main())
