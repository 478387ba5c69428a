"""What the experiment drivers (``bench.arbor_experiment``, ``bench.prorubric_experiment``) share:
running a logged subprocess, finding a run's latest checkpoint, and printing mean±std tables."""

from __future__ import annotations

import math
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.files import write_atomic


def latest_checkpoint(run_dir: Path) -> int | None:
    """The highest checkpoint step saved in ``run_dir`` (None if there is none)."""
    ck = run_dir / "checkpoints"
    steps = [int(p.name) for p in ck.iterdir() if p.name.isdigit()] if ck.is_dir() else []
    return max(steps) if steps else None


def run_logged(cmd: list[str], log: Path, dry: bool) -> bool:
    """Run ``cmd`` with its output appended to ``log``; print the tail of the log on failure."""
    print("  $", shlex.join(cmd[1:] if cmd[0] == sys.executable else cmd), flush=True)
    if dry:
        return True
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with log.open("a") as fh:
        res = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, text=True)
    ok = res.returncode == 0
    print(f"    {'ok' if ok else f'FAILED (exit {res.returncode})'} in "
          f"{time.perf_counter() - t0:.0f}s, log: {log}", flush=True)
    if not ok:
        print("    " + "\n    ".join(log.read_text().splitlines()[-15:]), flush=True)
    return ok


def finite(xs: Sequence[float | None]) -> list[float]:
    return [x for x in xs if x is not None and math.isfinite(x)]


def mean(xs: Sequence[float | None]) -> float:
    xs = finite(xs)
    return sum(xs) / len(xs) if xs else float("nan")


def std(xs: Sequence[float | None]) -> float:
    """Sample standard deviation (nan below two finite values)."""
    xs = finite(xs)
    if len(xs) < 2:
        return float("nan")
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def fmt(v: float | None, sd: float = float("nan")) -> str:
    if v is None or not math.isfinite(v):
        return "-"
    return f"{v:.3f}" + (f"±{sd:.3f}" if sd is not None and math.isfinite(sd) else "")


def print_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Left-aligned columns, a dashed rule under the header."""
    if not rows:
        print("no finished runs to summarise")
        return
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))


def train_unless_done(name: str, run_dir: Path, steps: int, cmd: list[str], logs: Path,
                      dry: bool) -> bool:
    """Train ``run_dir`` with ``cmd`` unless it already holds the checkpoint of its last step;
    False when training failed."""
    print(f"[{name}]", flush=True)
    if latest_checkpoint(run_dir) == steps:
        print("  trained (checkpoint at the last step): skip", flush=True)
        return True
    return run_logged(cmd, logs / f"{name}.train.log", dry)


def write_summary(out: Path, budget: Any, extra: Sequence[str], table: dict,
                  failed: Sequence[str], plots: str, more: dict | None = None) -> int:
    """Write ``<out>/summary.json`` (with ``more``'s keys beside the table), say where the plots
    are, report failures; the exit code."""
    import json
    from dataclasses import asdict

    out.mkdir(parents=True, exist_ok=True)
    record = {"budget": asdict(budget), "extra": list(extra), "table": table, **(more or {})}
    write_atomic(out / "summary.json", json.dumps(record, indent=1, default=str))
    print(f"summary written to {out / 'summary.json'}; plots: {plots}")
    if failed:
        print("FAILED:", ", ".join(failed))
        return 1
    return 0
