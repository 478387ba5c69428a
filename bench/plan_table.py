"""The smallest TPU slice each model fits at a batch setting, from ``rl.plan`` (#17 item 8).

    python -m bench.plan_table --models qwen3_4b,qwen3_8b,qwen3_14b \
        --settings groups64,search_r1 --chips v5e,v5p --out bench/results/plan_table.jsonl

For every (model, setting, chip) it plans the step (``rl.plan.make_plan``: every program
compiled ahead of time for the slice, with abstract weights) on the chip's slices from the
smallest up, and stops at the first one where every program the config runs fits. Each
compiled slice is one JSON line in ``--out`` (kept: a rerun skips what is there, so a long
table can be built over several sittings), and the table of the smallest fitting slices is
printed as Markdown. A slice whose shapes alone rule it out (:func:`floor_gib`: train state,
reference weights and KV cache per chip over its HBM) is recorded as skipped, not compiled.
A plan of a 4B model compiles in ~4-10 min on a 2-core host, a 14B one
longer: the whole default table is hours of compiling. Each slice is planned in a child
process stopped after ``--minutes`` (60): a slice not planned in time ends its walk with
"not known" and is tried again by a rerun.

Micro-batches are per slice: a setting's count is the most it uses; where that count x
mini-batches x the slice's shards does not cut the batch evenly (``rl.grpo.batch`` would add filler
groups, computed for nothing), the row uses the largest smaller count that does
(:func:`micro_batches`), and records it.

The prefill's layout is per slice too: a slice where only the prefill misses, with its
activations pinned to the rows (``trainer.prefill_pin_rows=true``, the default), is planned
again with them left to the compiler, and the second plan is the row (``prefill_pin_rows``
false, ``pinned_prefill_gib`` the first one's prefill). Neither layout is smaller everywhere (see
``models.sampler.prefill``); the other programs do not depend on it.

Settings (the keys are printed in the table's caption):

* ``groups64``: 64 prompts x 5, 256-token prompts, 1,024-token response budget, 4
  micro-batches, remat, bfloat16 compute and rollout, bfloat16 KV cache, logits chunks of 256,
  ``algo.beta=0.01`` (the reference pass runs).
* ``search_r1``: Search-R1's batch (train_batch_size 512, n_agent 5, up to 4 turns of 500 new
  tokens with up to 500-token observations of the top-3 documents between them: a response
  budget of 4 x 500 + 3 x 500 = 3,500 tokens), 2 mini-batches (its ppo_mini_batch_size 256) of
  16 micro-batches each, otherwise as ``groups64``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

COMMON = ["mesh=fsdp", "algo.group_size=5", "trainer.remat=true", "model.dtype=bfloat16",
          "trainer.rollout_dtype=bfloat16", "trainer.kv_cache_dtype=bfloat16",
          "trainer.logits_chunk=256", "algo.beta=0.01", "plan.prompt_len=256",
          "plan.rollout_fit=false"]
SETTINGS: dict[str, list[str]] = {
    "groups64": ["trainer.batch_prompts=64", "trainer.mini_batches=1", "trainer.micro_batches=4",
                 "plan.response_budget=1024"],
    "search_r1": ["trainer.batch_prompts=512", "trainer.mini_batches=2",
                  "trainer.micro_batches=16", "plan.response_budget=3500"],
}
# each chip's slices, smallest first (libtpu topology names)
SLICES: dict[str, list[str]] = {
    "v5e": ["v5e:4x4", "v5e:4x8", "v5e:8x8", "v5e:8x16", "v5e:16x16"],
    "v5p": ["v5p:2x2x1", "v5p:2x2x2", "v5p:2x2x4", "v5p:2x4x4", "v5p:4x4x4", "v5p:4x4x8"],
}
GiB = 2**30


def chips_of(topology: str) -> int:
    return math.prod(int(d) for d in topology.split(":")[1].split("x"))


def micro_batches(setting: str, topology: str) -> int:
    """The setting's micro-batch count, or on a slice where it leaves filler groups, the
    count that does not (``rl.plan.even_micro_batches``; ``mesh=fsdp``: every chip a
    data-parallel shard): micro-batching changes no update, only how it is cut."""
    from rl.plan import even_micro_batches

    return even_micro_batches(setting_value(setting, "trainer.batch_prompts"),
                              setting_value(setting, "algo.group_size"),
                              setting_value(setting, "trainer.mini_batches"),
                              chips_of(topology),
                              setting_value(setting, "trainer.micro_batches"))


def overrides(model: str, setting: str, topology: str, pin: bool = True) -> list[str]:
    micro = f"trainer.micro_batches={micro_batches(setting, topology)}"
    keys = [micro if k.startswith("trainer.micro_batches=") else k for k in SETTINGS[setting]]
    return [f"plan.model_shapes={model}", f"plan.topology={topology}", *COMMON, *keys,
            f"trainer.prefill_pin_rows={str(pin).lower()}"]


def plan_row(model: str, setting: str, topology: str, pin: bool = True) -> dict[str, Any]:
    """One slice's plan as a JSON-able record: per program its peak per chip (GiB, with the
    resident train state), whether the config runs it, and whether the step fits (every
    program it runs within the HBM libtpu leaves usable, ``rl.plan.USABLE_HBM``)."""
    from hydra import compose, initialize_config_dir

    from rl.plan import USABLE_HBM, make_plan
    from rl.run.config import parse_plan
    from rl.run.resolve import resolved_config

    conf = str(Path(__file__).resolve().parents[1] / "conf")
    with initialize_config_dir(config_dir=conf, version_base="1.3"):
        # a plan writes nothing; composed outside hydra's app, ${hydra:...} has no value
        cfg = compose("plan", overrides=[*overrides(model, setting, topology, pin),
                                         "trainer.run_dir=unused"])
    run, plan_cfg = parse_plan(resolved_config(cfg))
    plan = make_plan(run, plan_cfg)
    hbm = plan.chip.hbm_bytes
    usable = USABLE_HBM.get(plan.chip.name, hbm)  # v5e: libtpu leaves 15.75 of the 16 GiB
    programs = {p.name: {"peak_gib": round(p.peak / GiB, 3), "runs": p.runs,
                         "fits": p.peak <= usable and not p.refused} for p in plan.programs}
    fit = getattr(plan, "fit", None)
    return {"model": model, "setting": setting, "topology": topology, "chips": plan.chips,
            "version": ROW_VERSION, "mesh": plan.mesh,
            "micro_batches": run.trainer.micro_batches, "prefill_pin_rows": pin,
            "filler_groups": plan.lay.filler, "hbm_gib": round(hbm / GiB, 2),
            "programs": programs,
            "fits": all(v["fits"] for v in programs.values() if v["runs"]),
            "largest_rollout": getattr(fit, "best", None)}


# what a compiled row was planned with: 1, the first rows; 2, the prefill's distinct-prompt
# cache at the prompt's slots and its activations' rows pinned (models.sampler.prefill),
# micro-batches per slice; 3, the sampler's next-token logits by vocabulary slices
# (models.sampler.row_logits: no gathered unembedding in the prefill, decode and continue);
# 4, the scoring's unembedding gathered along D (models.constraints.whole_model_axis: the
# reference pass lower, e.g. Qwen3-4B on v5e:4x4 5.79 -> 4.86 GiB, and no windowed einsum
# that libtpu's layout assignment did not finish on v5p:2x2x2 for Qwen3-14B).
# A compiled row of another version is planned again; a skipped one (shapes only) stays valid.
ROW_VERSION = 4


def setting_value(setting: str, key: str) -> int:
    """An integer key of a setting (its own overrides first, then the common ones)."""
    for item in (*SETTINGS[setting], *COMMON):
        name, _, value = item.partition("=")
        if name == key:
            return int(value)
    raise KeyError(f"{setting}: no {key}")


def floor_gib(model: str, setting: str, topology: str) -> float:
    """A lower bound of the step's peak per chip, from shapes alone (no compile).

    While the rollout's prefill runs, the float32 train state (weights and Adam's two moments:
    12 bytes per parameter) and the bfloat16 reference weights (2 bytes, ``algo.beta > 0``)
    stay resident, and the prefill's output is the bfloat16 KV cache of every trajectory:
    ``(prompt + budget) x layers x 2 x kv_heads x head_dim x 2`` bytes per row. Sharded at
    best over every chip (FSDP: the rows over data x fsdp, the state over fsdp), each chip
    holds at least ``(14 P + ceil(rows / chips) x row_bytes)``. A slice where that exceeds HBM
    cannot fit, so it is not compiled."""
    from models.shapes import model_shapes

    cfg = model_shapes(model)
    chips = chips_of(topology)
    rows = setting_value(setting, "trainer.batch_prompts") * setting_value(setting,
                                                                           "algo.group_size")
    slots = setting_value(setting, "plan.prompt_len") + setting_value(setting,
                                                                      "plan.response_budget")
    row_bytes = slots * cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * 2
    return (14 * cfg.num_params / chips + math.ceil(rows / chips) * row_bytes) / GiB


def skipped_row(model: str, setting: str, topology: str, floor: float, hbm: float
                ) -> dict[str, Any]:
    chips = chips_of(topology)
    return {"model": model, "setting": setting, "topology": topology, "chips": chips,
            "fits": False, "floor_gib": round(floor, 3), "programs": {},
            "skipped": f"not compiled: the train state, reference weights and KV cache alone "
                       f"need >= {floor:.1f} GiB per chip > {hbm:.1f} GiB HBM"}


def done_rows(out: Path, older: bool = False) -> dict[tuple[str, str, str, bool], dict[str, Any]]:
    """The rows in `out` still valid, by (model, setting, topology, prefill pinned): skipped
    ones, and compiled ones of this :data:`ROW_VERSION` planned with the slice's micro-batch
    count (older rows are kept in the file, and planned again). With `older`, a key with no
    such row keeps its newest row of an older version (what ``--table-only`` shows, marked,
    until a rerun plans it again)."""
    if not out.exists():
        return {}
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "skipped" in r or r.get("micro_batches") == micro_batches(
        r["setting"], r["topology"])]
    found: dict[tuple[str, str, str, bool], dict[str, Any]] = {}
    for r in sorted(rows, key=lambda r: r.get("version", 1)):  # the newest last, kept
        if "skipped" in r or r.get("version", 1) == ROW_VERSION or older:
            found[(r["model"], r["setting"], r["topology"], r.get("prefill_pin_rows", True))] = r
    return found


def is_older(row: dict[str, Any]) -> bool:
    """A compiled row planned by code of an older :data:`ROW_VERSION`."""
    return "skipped" not in row and row.get("version", 1) != ROW_VERSION


def bounded_plan_row(model: str, setting: str, topology: str, minutes: float | None,
                     pin: bool = True) -> dict[str, Any] | None:
    """:func:`plan_row`, in a child process stopped after `minutes` (None: in this process,
    unbounded). Some slices compile for hours on a small host (Qwen3-14B on v5p:2x2x2: over an
    hour on 2 cores); None when stopped."""
    if minutes is None:
        return plan_row(model, setting, topology, pin)
    cmd = [sys.executable, "-m", "bench.plan_table", "--one",
           f"{model},{setting},{topology},{'pinned' if pin else 'unpinned'}"]
    return run_bounded(cmd, minutes * 60)


def only_the_pinned_prefill_misses(row: dict[str, Any]) -> bool:
    """Whether a compiled row's prefill, pinned to the rows, is the one program that does not
    fit (rows without the ``prefill_pin_rows`` field were all pinned): the slice is worth
    planning unpinned, which changes the prefill alone."""
    programs = row.get("programs", {})
    missing = {n for n, p in programs.items() if p["runs"] and not p["fits"]}
    return missing == {"prefill"} and row.get("prefill_pin_rows", True)


def run_bounded(cmd: Sequence[str], seconds: float) -> dict[str, Any] | None:
    """The JSON object `cmd` prints as its last stdout line, or None when it runs past
    `seconds` (killed). The child's stderr (its progress: one line per compile) goes to
    ours as it comes; a child that fails raises."""
    try:
        done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=seconds,
                              cwd=Path(__file__).resolve().parents[1])
    except subprocess.TimeoutExpired:
        return None
    if done.returncode:
        raise RuntimeError(f"plan_table: {' '.join(cmd)} failed ({done.returncode}); "
                           f"its stderr is above")
    return json.loads(done.stdout.strip().splitlines()[-1])


def smallest_fitting(model: str, setting: str, chip: str, out: Path,
                     minutes: float | None = None, plan: bool = True) -> dict[str, Any] | None:
    """Plan `chip`'s slices from the smallest up (reusing rows in `out`); the first one that
    fits, None when none of them does, or ``{"unfinished": topology, ...}`` when a slice's
    plan ran past `minutes` (nothing recorded: a rerun tries it again). Without `plan`, only
    the rows in `out`: ``{"unplanned": topology}`` at the first slice that has none."""
    older: list[str] = []  # the walk's slices known only from older rows ("v5e:4x4 v2")
    for topology in SLICES[chip]:
        row = slice_row(model, setting, topology, out, minutes, plan)
        if "unplanned" in row or "unfinished" in row:
            return row
        older += [f"{topology} v{row.get('version', 1)}"] if is_older(row) else []
        if row["fits"]:
            return dict(row, older_rows=older) if older else row
    return None


def slice_row(model: str, setting: str, topology: str, out: Path, minutes: float | None,
              plan: bool) -> dict[str, Any]:
    """One slice's row (from `out`, else planned and appended to it): with the prefill's
    activations pinned to the rows, and when that prefill is all that misses, the row planned
    without the pin (which records the pinned prefill's peak); ``{"unplanned"}`` /
    ``{"unfinished"}`` as in :func:`smallest_fitting`."""
    pinned_gib = None
    for pin in (True, False):
        row = done_rows(out, older=not plan).get((model, setting, topology, pin))
        if row is None and not plan:
            return {"unplanned": topology}
        if row is None:
            row = new_row(model, setting, topology, minutes, pin)
            if row is None:
                return {"unfinished": topology, "minutes": minutes}
            if pinned_gib is not None:
                row["pinned_prefill_gib"] = pinned_gib
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
        if not only_the_pinned_prefill_misses(row):
            return row
        pinned_gib = row["programs"]["prefill"]["peak_gib"]
    assert row is not None  # the loop's last pass returned otherwise
    return row


def new_row(model: str, setting: str, topology: str, minutes: float | None,
            pin: bool) -> dict[str, Any] | None:
    """A slice's row: skipped when its shapes alone rule it out (:func:`floor_gib`), else
    planned (None: stopped after `minutes`)."""
    from rl.plan import CHIPS

    chip = topology.split(":")[0]
    floor, hbm = floor_gib(model, setting, topology), CHIPS[chip].hbm_bytes / GiB
    if floor > hbm:
        return skipped_row(model, setting, topology, floor, hbm)
    print(f"plan_table: {model} {setting} on {topology} (trainer.micro_batches="
          f"{micro_batches(setting, topology)}, trainer.prefill_pin_rows={str(pin).lower()}) ...",
          file=sys.stderr, flush=True)
    row = bounded_plan_row(model, setting, topology, minutes, pin)
    if row is None:
        print(f"plan_table: {model} {setting} on {topology}: not planned within "
              f"{minutes:g} min, stopped", file=sys.stderr, flush=True)
    return row


def table(rows: Sequence[tuple[str, str, str, dict[str, Any] | None]]) -> str:
    lines = ["| model | setting | chip | smallest slice that fits | chips | micro-batches | "
             "prefill rows | peak GiB per chip (prefill / decode / reference / update) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for model, setting, chip, row in rows:
        if row is None:
            lines.append(f"| {model} | {setting} | {chip} | none of {', '.join(SLICES[chip])}"
                         f" | | | | |")
            continue
        if "unplanned" in row:
            lines.append(f"| {model} | {setting} | {chip} | not planned yet from "
                         f"`{row['unplanned']}` up | | | | |")
            continue
        if "unfinished" in row:
            lines.append(f"| {model} | {setting} | {chip} | not known: `{row['unfinished']}` "
                         f"not planned within {row['minutes']:g} min (smaller slices do not "
                         f"fit) | | | | |")
            continue
        peaks = " / ".join(f"{v['peak_gib']:.1f}" for v in row["programs"].values())
        pinned = "pinned" if row.get("prefill_pin_rows", True) else "compiler's"
        older = (f" (rows of older code: {', '.join(row['older_rows'])})"
                 if row.get("older_rows") else "")
        lines.append(f"| {model} | {setting} | {chip} | `{row['topology']}`{older} | "
                     f"{row['chips']} "
                     f"| {row['micro_batches']} | {pinned} | {peaks} (HBM {row['hbm_gib']}) |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="qwen3_4b,qwen3_8b,qwen3_14b")
    ap.add_argument("--settings", default="groups64,search_r1")
    ap.add_argument("--chips", default="v5e,v5p")
    # kept in the repository: the table is built over several sessions, and runs/ is not kept
    ap.add_argument("--out", default="bench/results/plan_table.jsonl")
    ap.add_argument("--minutes", type=float, default=60.0,
                    help="stop a slice's plan after this long (0: no limit)")
    ap.add_argument("--table-only", action="store_true",
                    help="print the table from the rows in --out, planning nothing")
    # MODEL,SETTING,TOPOLOGY,pinned|unpinned: one row's JSON
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    # rl.plan's progress, one line per compile, on stderr (a child's reaches ours)
    progress, plan_log = logging.StreamHandler(sys.stderr), logging.getLogger("rl.plan")
    progress.setFormatter(logging.Formatter("%(message)s"))
    plan_log.addHandler(progress)
    plan_log.setLevel(logging.INFO)
    if not os.environ.get("JAX_PLATFORMS"):
        os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    if args.one:
        model, setting, topology, pin = args.one.split(",")
        print(json.dumps(plan_row(model, setting, topology, pin == "pinned")))
        return
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for name, known, given in (("--settings", SETTINGS, args.settings),
                               ("--chips", SLICES, args.chips)):
        unknown = sorted(set(given.split(",")) - set(known))
        if unknown:
            sys.exit(f"plan_table: {name}: unknown {unknown}; known: {sorted(known)}")
    minutes = args.minutes or None
    rows = [(m, s, c, smallest_fitting(m, s, c, out, minutes, plan=not args.table_only))
            for m in args.models.split(",")
            for s in args.settings.split(",") for c in args.chips.split(",")]
    print("settings: " + "; ".join(f"{k}: {' '.join(COMMON + v)}" for k, v in SETTINGS.items()))
    print(table(rows))


if __name__ == "__main__":
    main()
