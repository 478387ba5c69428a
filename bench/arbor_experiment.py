"""GRPO vs ARBOR vs ARBOR w/o memory on the shipped multi-hop benchmark (ARBOR's ablations).

Every algorithm gets the same budget (steps, prompts per step, group size, token limits, learning
rate) and the same seeds; the only difference is ``algo=``. Each run trains with
``python -m rl.train`` into ``<out>/<algo>_s<seed>`` and is then evaluated greedily on the
held-out test split with ``python -m rl.eval`` (``eval.json`` in the run folder). The summary
reads the run folders only, so it can be re-printed at any time (``--summary-only``):

* outcome-homogeneous group fraction (groups whose members all get the same R_base; GRPO learns
  nothing from them) and all-wrong fraction, over the whole run and its last quarter, and the
  change relative to GRPO (paper: homogeneous -32..42 %, all-wrong -54..61 %);
* the fraction of homogeneous groups the rubric term converted to nonzero variance;
* held-out EM / F1 / judge accuracy (the rule judge's answer equivalence).

Usage (CPU, shipped SmolLM2-135M, rule judge, local BM25 on the generated world)::

    python -m bench.arbor_experiment                       # the full experiment (hours on CPU)
    python -m bench.arbor_experiment --dry-run             # print the commands only
    python -m bench.arbor_experiment --summary-only        # table from existing run folders
    python -m bench.arbor_experiment --smoke --out /tmp/arbor_smoke   # 1 step, tiny model
    python -m bench.arbor_experiment --algos grpo,arbor,arbor_no_memory,rar --seeds 0,1,2 \\
        --steps 100 --extra optim.lr=2e-6 algo.rubric_lambda=0.1

Re-running continues where it stopped: a finished run (checkpoint at the last step) is not
trained again, an interrupted one resumes from its latest checkpoint, an evaluated one is not
evaluated again.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
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

DEFAULT_ALGOS = ("grpo", "arbor", "arbor_no_memory")


@dataclass(frozen=True)
class Budget:
    """What every algorithm gets, identically."""

    model: str = "smollm2_135m"
    judge: str = "rule"
    steps: int = 40
    batch_prompts: int = 4
    group_size: int = 5          # Search-R1's group size
    max_new_tokens: int = 96     # per turn
    max_turns: int = 2
    max_response_tokens: int = 320
    eval_split: str = "test"
    eval_max_examples: int = 100
    save_every: int = 10
    sft_examples: int = 0        # > 0: format warm-up (rl.sft) first; every run starts from it

    def train_overrides(self) -> list[str]:
        return [f"model={self.model}", "task=search_qa", f"judge={self.judge}",
                f"trainer.max_steps={self.steps}", f"trainer.batch_prompts={self.batch_prompts}",
                f"algo.group_size={self.group_size}",
                f"trainer.max_new_tokens={self.max_new_tokens}",
                f"task.max_turns={self.max_turns}",
                f"task.max_response_tokens={self.max_response_tokens}",
                f"trainer.save_every={self.save_every}",
                # the held-out evaluation below replaces the trainer's before/after dev eval
                "trainer.eval_at_ends=false", "trainer.progress=false"]

    def task_overrides(self) -> list[str]:
        return ["task=search_qa", f"task.max_turns={self.max_turns}",
                f"task.max_response_tokens={self.max_response_tokens}"]


SMOKE = Budget(model="tiny", steps=1, batch_prompts=2, group_size=4, max_new_tokens=16,
               max_turns=1, max_response_tokens=64, eval_max_examples=4, save_every=1)
SMOKE_EXTRA = ("task.n_entities=200", "task.n_train=40", "task.n_dev=4", "task.n_test=8",
               "task.max_obs_tokens=40", "algo.embedder=hashing")


def run_name(algo: str, seed: int) -> str:
    return f"{algo}_s{seed}"


def _algo_extra(algo: str, extra: Sequence[str]) -> list[str]:
    # ARBOR-only keys (e.g. algo.rubric_lambda) would fail on algo=grpo: keep them to ARBOR
    arbor_keys = ("algo.rubric_lambda", "algo.k_consol", "algo.delta_v", "algo.rho_min",
                  "algo.retire_k", "algo.embedder", "algo.use_common_pool",
                  "algo.rubric_outcome", "algo.rho_r", "algo.min_drift_activations",
                  "algo.active_combine")
    if algo.startswith("arbor") or algo == "rar":
        keep = ("algo.rubric_lambda",) if algo == "rar" else arbor_keys
        return [x for x in extra if not x.startswith(arbor_keys) or x.startswith(keep)]
    return [x for x in extra if not x.startswith(arbor_keys)]


def train_command(algo: str, seed: int, run_dir: Path, budget: Budget,
                  extra: Sequence[str], init_from: Path | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "rl.train", f"algo={algo}", *budget.train_overrides(),
           f"trainer.seed={seed}", f"trainer.run_dir={run_dir}", f"hydra.run.dir={run_dir}",
           *_algo_extra(algo, extra)]
    if init_from is not None:
        cmd.append(f"trainer.init_from={init_from}")
    if latest_checkpoint(run_dir) is not None:
        cmd.append("trainer.resume=true")
    return cmd


def sft_command(run_dir: Path, budget: Budget, extra: Sequence[str]) -> list[str]:
    """The shared format warm-up: oracle demonstrations under the same task settings."""
    task_extra = [x for x in extra if x.startswith(("task.", "retriever"))]
    return [sys.executable, "-m", "rl.sft", f"model={budget.model}", *budget.task_overrides(),
            *task_extra, f"trainer.max_new_tokens={budget.max_new_tokens}",
            f"sft.examples={budget.sft_examples}", "trainer.progress=false",
            f"trainer.run_dir={run_dir}", f"hydra.run.dir={run_dir}"]


def eval_command(run_dir: Path, budget: Budget, extra: Sequence[str]) -> list[str]:
    task_extra = [x for x in extra if x.startswith(("task.", "retriever", "judge."))]
    return [sys.executable, "-m", "rl.eval", f"model={budget.model}", f"judge={budget.judge}",
            *budget.task_overrides(), *task_extra, f"eval.run={run_dir}",
            f"eval.splits=[{budget.eval_split}]", f"eval.max_examples={budget.eval_max_examples}",
            f"trainer.max_new_tokens={budget.max_new_tokens}",
            # hydra's own files of the eval go next to, not over, the training ones
            f"hydra.run.dir={run_dir}", "hydra.output_subdir=.hydra_eval",
            f"trainer.run_dir={run_dir}"]


# --- summary ----------------------------------------------------------------------------------


def run_stats(run_dir: Path) -> dict[str, float] | None:
    """Per-run numbers from metrics.jsonl (training steps) and eval.json (held-out)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return None
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    train = [r for r in rows if "reward/mean" in r]
    ev = run_dir / "eval.json"
    if not train and not ev.exists():
        return None
    tail = train[-max(1, len(train) // 4):]
    out: dict[str, float] = {"steps": float(len(train))}
    for key, short in (("groups/homogeneous_frac", "homog"), ("groups/all_wrong_frac",
                                                               "all_wrong"),
                       ("groups/converted_frac", "converted"), ("outcome/mean", "outcome")):
        out[short] = mean([r.get(key) for r in train])
        out[f"{short}_last"] = mean([r.get(key) for r in tail])
    out["commons_final"] = float(train[-1].get("memory/commons", float("nan"))) if train else \
        float("nan")
    if ev.exists():
        avg = json.loads(ev.read_text()).get("results", {}).get("average", {})
        for k in ("em", "f1", "judge_acc", "valid"):
            out[f"heldout_{k}"] = float(avg.get(k, float("nan")))
    return out


COLUMNS = (("homog", "homog"), ("homog_last", "homog(last25%)"), ("all_wrong", "all-wrong"),
           ("all_wrong_last", "all-wrong(last25%)"), ("converted", "converted"),
           ("heldout_valid", "valid"), ("heldout_em", "EM"), ("heldout_f1", "F1"),
           ("heldout_judge_acc", "judge-acc"))


def summarize(out_dir: Path, algos: Sequence[str], seeds: Sequence[int]) -> dict[str, Any]:
    """Mean (and std over seeds) per algorithm, relative changes vs GRPO; printed and returned."""
    table: dict[str, dict[str, Any]] = {}
    for algo in ("sft", *algos):  # "sft": the shared warm-up start, when there is one
        folders = {0: out_dir / "sft"} if algo == "sft" else {
            s: out_dir / run_name(algo, s) for s in seeds}
        per_seed = {s: run_stats(f) for s, f in folders.items()}
        got = {s: v for s, v in per_seed.items() if v is not None}
        if not got:
            continue
        row: dict[str, Any] = {"seeds": sorted(got)}
        for key, _ in (*COLUMNS, ("steps", ""), ("commons_final", "")):
            vals = [v.get(key, float("nan")) for v in got.values()]
            row[key], row[f"{key}_std"] = mean(vals), std(vals)
        table[algo] = row
    base = table.get("grpo")
    if base:
        for row in table.values():
            for key in ("homog", "all_wrong"):
                b = base[key]
                row[f"{key}_vs_grpo_pct"] = (100 * (row[key] - b) / b) if b else float("nan")
    _print_table(table)
    return table


def _print_table(table: Mapping[str, Mapping[str, Any]]) -> None:
    head = ["algo", "seeds", "steps", *[t for _, t in COLUMNS], "homog vs GRPO",
            "all-wrong vs GRPO"]
    lines = []
    for algo, row in table.items():
        pct = [row.get(f"{k}_vs_grpo_pct", float("nan")) for k in ("homog", "all_wrong")]
        lines.append([algo, ",".join(map(str, row["seeds"])), f"{row['steps']:.0f}",
                      *[fmt(row[k], row[f"{k}_std"]) for k, _ in COLUMNS],
                      *[f"{p:+.0f}%" if math.isfinite(p) else "-" for p in pct]])
    print_table(head, lines)


# --- main ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algos", default=",".join(DEFAULT_ALGOS),
                   help="comma-separated algo configs (grpo, dapo, arbor, arbor_no_memory, "
                        "arbor_dapo, rar)")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated trainer seeds")
    p.add_argument("--out", default="runs/arbor_exp", type=Path)
    p.add_argument("--steps", type=int, help=f"training steps (default {Budget.steps})")
    p.add_argument("--model", help=f"model preset/path (default {Budget.model})")
    p.add_argument("--judge", help=f"judge config (default {Budget.judge})")
    p.add_argument("--eval-max-examples", type=int,
                   help=f"held-out questions (default {Budget.eval_max_examples})")
    p.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                   help="other budget fields, e.g. batch_prompts=2 group_size=4 max_turns=2")
    p.add_argument("--sft-examples", type=int,
                   help="format warm-up on this many oracle demonstrations first (rl.sft); "
                        "every algorithm then starts from it (default 0 = none)")
    p.add_argument("--extra", nargs="*", default=[],
                   help="more hydra overrides for every run (algo.* ARBOR keys only reach ARBOR)")
    p.add_argument("--smoke", action="store_true",
                   help="pipeline check: tiny model, 1 step, small world")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--summary-only", action="store_true", help="only print the summary table")
    p.add_argument("--no-eval", action="store_true", help="skip the held-out evaluation")
    a = p.parse_args(argv)

    budget = SMOKE if a.smoke else Budget()
    changes = {k: v for k, v in (("steps", a.steps), ("model", a.model), ("judge", a.judge),
                                 ("eval_max_examples", a.eval_max_examples),
                                 ("sft_examples", a.sft_examples)) if v is not None}
    for item in a.set:
        key, sep, value = item.partition("=")
        if not sep or key not in Budget.__dataclass_fields__:
            p.error(f"--set {item!r}: expected FIELD=VALUE with FIELD one of "
                    f"{sorted(Budget.__dataclass_fields__)}")
        changes[key] = type(getattr(Budget, key))(value)
    budget = Budget(**{**budget.__dict__, **changes})
    extra = [*(SMOKE_EXTRA if a.smoke else ()), *a.extra]
    algos = [x.strip() for x in a.algos.split(",") if x.strip()]
    seeds = [int(x) for x in a.seeds.split(",") if x.strip()]
    out: Path = a.out

    failed: list[str] = []
    if not a.summary_only:
        print(f"budget: {budget}\nextra overrides: {extra}\nruns: {len(algos) * len(seeds)} "
              f"({', '.join(algos)} x seeds {seeds}) -> {out}/<algo>_s<seed>", flush=True)
        init_from = None
        if budget.sft_examples > 0:
            init_from = out / "sft"
            print("[sft]", flush=True)
            if latest_checkpoint(init_from) is not None:
                print("  trained (checkpoint): skip", flush=True)
            elif not run_logged(sft_command(init_from, budget, extra),
                                out / "logs" / "sft.train.log", a.dry_run):
                print("FAILED: sft")
                return 1
            if not a.no_eval and not (init_from / "eval.json").exists():
                if not run_logged(eval_command(init_from, budget, extra),
                                  out / "logs" / "sft.eval.log", a.dry_run):
                    failed.append("sft (eval)")
        for seed in seeds:  # seed-major: a partial experiment still compares algorithms
            for algo in algos:
                name = run_name(algo, seed)
                run_dir = out / name
                if not train_unless_done(name, run_dir, budget.steps,
                                         train_command(algo, seed, run_dir, budget, extra,
                                                       init_from), out / "logs", a.dry_run):
                    failed.append(f"{name} (train)")
                    continue
                if a.no_eval:
                    continue
                if (run_dir / "eval.json").exists() and not a.dry_run:
                    print("  evaluated (eval.json): skip", flush=True)
                elif not run_logged(eval_command(run_dir, budget, extra),
                              out / "logs" / f"{name}.eval.log", a.dry_run):
                    failed.append(f"{name} (eval)")
    if a.dry_run:
        return 0
    return write_summary(out, budget, extra, summarize(out, algos, seeds), failed,
                         f"notebooks/arbor.ipynb (ARBOR_RUNS={out})")


if __name__ == "__main__":
    sys.exit(main())
