"""Additive Rubric-RL vs ProRubric vs raw-AND on ``task=rubric_chat`` (ProRubric's experiment).

A coverage warm-up comes first, as the ProRubric authors start RL from an SFT model: ``rl.sft``
for ``--warmup-steps`` steps on the reference answers of the first ``steps * 8`` train prompts
(``RubricChatTask.demonstrations``) into ``<out>/warmup``; every arm starts from that checkpoint
(``trainer.init_from``). Without it the 135M policy never completes a whole dimension and every
AND-type group has reward 0 (zero variance, no gradient).

Every aggregator gets the same budget (steps, prompts per step, group size, token limit,
temperature, learning rate) and the same seeds; the only difference is ``algo=``. The default arms
are the authors' three (``rubric_rl_official``: atomic additive, clipped; ``prorubric_official``;
``raw_and_verbatim``), which share the judging protocol and the overlong shaping, so they differ
in the aggregation only. Each run trains
with ``python -m rl.train`` into ``<out>/<algo>_s<seed>``; the trainer's greedy evaluation on the
task's eval split before and after training (``eval/*`` in ``metrics.jsonl``) gives the held-out
numbers. The summary reads the run folders only (``--summary-only`` re-prints it):

* coverage ``g`` (the training rubric, additive normalisation), fitness ``c`` (held-out criteria
  never rewarded: answer first, concise, no filler, no repetition), length in words — greedy, on
  the eval prompts, before -> after training;
* the same three over the training rollouts (first vs last quarter of the steps), and the
  fraction of groups whose reward had zero variance (no learning signal under GRPO), its mean
  over the steps and over the first and last quarter (``groups/total_homogeneous_frac``);
* the warm-up's SFT loss (first/last step) and held-out reference loss (before/after).

Usage (CPU, shipped SmolLM2-135M, rule judge)::

    python -m bench.prorubric_experiment                   # warm-up, then the 3 arms; seed 0
    python -m bench.prorubric_experiment --warmup-steps 0 --algos rubric_rl,prorubric,raw_and
    python -m bench.prorubric_experiment --out runs/prorubric_long --warmup-steps 16 \\
        --warmup-epochs 3 --group-size 8 --max-new-tokens 160 --steps 10 \\
        --extra algo.overlong.buffer_frac=0.25        # the README's 2026-12-02 run
    python -m bench.prorubric_experiment --dry-run         # print the commands only
    python -m bench.prorubric_experiment --summary-only    # table from existing run folders
    python -m bench.prorubric_experiment --smoke --out /tmp/prorubric_smoke   # tiny model, 1 step
    python -m bench.prorubric_experiment --algos rubric_rl,prorubric,raw_and,implicit \\
        --seeds 0,1 --steps 30 --extra optim.lr=1e-5

Re-running continues where it stopped (finished runs are skipped, interrupted ones resume).
Plots: ``PRORUBRIC_RUNS='<out>/*_s*' jupyter execute --inplace notebooks/prorubric.ipynb``.
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
    run_logged,
    std,
    train_unless_done,
    write_summary,
)

DEFAULT_ALGOS = ("rubric_rl_official", "prorubric_official", "raw_and_verbatim")
WARMUP = "warmup"  # <out>/warmup: the rl.sft run every arm starts from


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
    warmup_steps: int = 6        # rl.sft steps on train reference answers (0: no warm-up)
    warmup_batch: int = 8        # demonstrations per SFT step
    warmup_epochs: int = 1       # passes over those demonstrations
    warmup_lr: float = 1e-4

    def overrides(self) -> list[str]:
        return [f"model={self.model}", "task=rubric_chat", f"judge={self.judge}",
                f"trainer.max_steps={self.steps}", f"trainer.batch_prompts={self.batch_prompts}",
                f"algo.group_size={self.group_size}",
                f"trainer.max_new_tokens={self.max_new_tokens}",
                f"trainer.temperature={self.temperature}",
                f"trainer.save_every={self.save_every}", "trainer.eval_at_ends=true",
                "trainer.progress=false"]


SMOKE = Budget(model="tiny", steps=1, batch_prompts=2, group_size=2, max_new_tokens=16,
               save_every=1, warmup_steps=1, warmup_batch=2)
SMOKE_EXTRA = ("task.size=8", "task.eval_size=2")


def run_name(algo: str, seed: int) -> str:
    return f"{algo}_s{seed}"


def warmup_command(run_dir: Path, budget: Budget, extra: Sequence[str]) -> list[str]:
    """``rl.sft`` on the first ``warmup_steps * warmup_batch`` train prompts' reference answers
    (``RubricChatTask.demonstrations``), ``warmup_epochs`` passes; held-out loss on 8 dev
    references (the dev prompts are only scored, never trained on)."""
    return [sys.executable, "-m", "rl.sft", f"model={budget.model}", "task=rubric_chat",
            f"sft.examples={budget.warmup_steps * budget.warmup_batch}",
            f"sft.epochs={budget.warmup_epochs}",
            f"sft.batch_size={budget.warmup_batch}", "sft.eval_examples=8",
            f"optim.lr={budget.warmup_lr}", f"trainer.max_new_tokens={budget.max_new_tokens}",
            "trainer.seed=0", "trainer.progress=false", f"trainer.run_dir={run_dir}",
            f"hydra.run.dir={run_dir}", *extra]


def warm_up(out: Path, budget: Budget, extra: Sequence[str], dry: bool) -> Path | None:
    """The shared warm-up folder (trained unless it holds its checkpoint); None without a
    warm-up; raises when the SFT fails (no arm may start from the base model by accident)."""
    if budget.warmup_steps < 1:
        return None
    run_dir = out / WARMUP
    print(f"[{WARMUP}]", flush=True)
    if latest_checkpoint(run_dir) is not None:
        print("  trained (checkpoint present): skip", flush=True)
    elif not run_logged(warmup_command(run_dir, budget, extra), out / "logs" / "warmup.log", dry):
        raise RuntimeError(f"warm-up failed; see {out / 'logs' / 'warmup.log'}")
    return run_dir


def train_command(algo: str, seed: int, run_dir: Path, budget: Budget,
                  extra: Sequence[str], init_from: Path | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "rl.train", f"algo={algo}", *budget.overrides(),
           f"trainer.seed={seed}", f"trainer.run_dir={run_dir}", f"hydra.run.dir={run_dir}",
           *([f"trainer.init_from={init_from}"] if init_from is not None else []), *extra]
    if latest_checkpoint(run_dir) is not None:
        cmd.append("trainer.resume=true")
    return cmd


def run_jobs(jobs: Sequence[tuple[str, Path, list[str]]], steps: int, logs: Path, dry: bool,
             parallel: int) -> list[str]:
    """Train every (name, run folder, command), up to ``parallel`` at once; the failed names.
    Parallel runs share the CPU, so they change wall time only, never a run's numbers."""
    from concurrent.futures import ThreadPoolExecutor

    def one(job: tuple[str, Path, list[str]]) -> bool:
        name, run_dir, cmd = job
        return train_unless_done(name, run_dir, steps, cmd, logs, dry)

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        ok = list(pool.map(one, jobs))
    return [job[0] for job, good in zip(jobs, ok) if not good]


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
    homog = [r.get("groups/total_homogeneous_frac") for r in train]
    out: dict[str, float] = {"steps": float(len(train)), "homog": mean(homog),
                             "homog_first": mean(homog[:q]), "homog_last": mean(homog[-q:]),
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
                          for w in ("first", "last")) + (
    ("homog", "zero-var groups"), ("homog_first", "zero-var first"),
    ("homog_last", "zero-var last"))


def warmup_stats(run_dir: Path) -> dict[str, float] | None:
    """The warm-up's SFT loss at its first and last step, held-out loss before and after."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return None
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    loss = [r["sft/loss"] for r in rows if "sft/loss" in r]
    dev = [r["sft/dev_loss"] for r in rows if "sft/dev_loss" in r]
    if not loss:
        return None
    return {"steps": float(len(loss)), "loss_first": loss[0], "loss_last": loss[-1],
            "dev_loss_before": dev[0] if dev else float("nan"),
            "dev_loss_after": dev[-1] if len(dev) > 1 else float("nan")}


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
    p.add_argument("--warmup-steps", type=int,
                   help=f"rl.sft steps of {Budget.warmup_batch} train reference answers before "
                        f"RL, shared by every arm (default {Budget.warmup_steps}; 0: none)")
    p.add_argument("--warmup-epochs", type=int,
                   help=f"passes over the warm-up demonstrations (default {Budget.warmup_epochs})")
    p.add_argument("--group-size", type=int,
                   help=f"samples per prompt (default {Budget.group_size})")
    p.add_argument("--max-new-tokens", type=int,
                   help=f"response budget, warm-up references cut to it too "
                        f"(default {Budget.max_new_tokens})")
    p.add_argument("--extra", nargs="*", default=[], help="more hydra overrides for every run")
    p.add_argument("--parallel", type=int, default=1,
                   help="arms trained at once (wall time only; each needs its own memory)")
    p.add_argument("--smoke", action="store_true", help="pipeline check: tiny model, 1 step")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--summary-only", action="store_true", help="only print the summary table")
    a = p.parse_args(argv)

    budget = SMOKE if a.smoke else Budget()
    # each budget flag's dest is its Budget field's name
    changes = {f: getattr(a, f) for f in ("steps", "model", "temperature", "warmup_steps",
                                          "warmup_epochs", "group_size", "max_new_tokens")
               if getattr(a, f) is not None}
    budget = Budget(**{**budget.__dict__, **changes})
    extra = [*(SMOKE_EXTRA if a.smoke else ()), *a.extra]
    algos = [x.strip() for x in a.algos.split(",") if x.strip()]
    seeds = [int(x) for x in a.seeds.split(",") if x.strip()]
    out: Path = a.out

    failed: list[str] = []
    if not a.summary_only:
        print(f"budget: {budget}\nextra overrides: {extra}\nruns: {len(algos) * len(seeds)} "
              f"({', '.join(algos)} x seeds {seeds}) -> {out}/<algo>_s<seed>", flush=True)
        init_from = warm_up(out, budget, SMOKE_EXTRA if a.smoke else (), a.dry_run)
        # seed-major: a partial experiment still compares aggregators
        jobs = [(run_name(algo, seed), out / run_name(algo, seed),
                 train_command(algo, seed, out / run_name(algo, seed), budget, extra, init_from))
                for seed in seeds for algo in algos]
        failed = run_jobs(jobs, budget.steps, out / "logs", a.dry_run, a.parallel)
    if a.dry_run:
        return 0
    warm = warmup_stats(out / WARMUP) if budget.warmup_steps > 0 else None
    if warm is not None:
        print("warm-up: " + ", ".join(f"{k} {fmt(v)}" for k, v in warm.items()))
    return write_summary(out, budget, extra, summarize(out, algos, seeds), failed,
                         f"notebooks/prorubric.ipynb (PRORUBRIC_RUNS='{out}/*_s*')",
                         {"warmup": warm})


if __name__ == "__main__":
    sys.exit(main())
