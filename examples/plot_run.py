"""Plot a run folder's training curves: reward, homogeneous groups, and the rubric memory.

Reads ``metrics.jsonl`` (one JSON object per step, written by every ``rl.train`` run) and draws,
over the steps: ``reward/mean`` (with ``outcome/mean``, the verifiable part alone), the
fraction of groups whose outcomes are all alike (``groups/homogeneous_frac``: GRPO learns
nothing from them), and, for an ARBOR run, the memory's size (``memory/drafts``,
``memory/commons``, ``memory/active``). Writes a PNG (default: RUN_FOLDER/curves.png):

    python examples/plot_run.py runs/2025-01-01_12-00-00_arbor_search_qa
    python examples/plot_run.py RUN_FOLDER --out curves.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no window
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

PANELS = {  # panel title -> the metrics drawn in it (those the run logged)
    "reward": ("reward/mean", "outcome/mean"),
    "homogeneous groups (fraction)": ("groups/homogeneous_frac",),
    "rubric memory (rubrics)": ("memory/drafts", "memory/commons", "memory/active"),
}


def read_series(run_dir: Path) -> dict[str, tuple[list[int], list[float]]]:
    """metric -> (steps, values) over the training steps' records (evaluations are separate
    records without ``reward/mean``)."""
    series: dict[str, tuple[list[int], list[float]]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:  # empty, or cut off by a run still writing it
            continue
        if "reward/mean" not in rec:
            continue
        for key in (k for keys in PANELS.values() for k in keys):
            if rec.get(key) is not None:
                steps, values = series.setdefault(key, ([], []))
                steps.append(int(rec["step"]))
                values.append(float(rec[key]))
    return series


def plot(series: dict[str, tuple[list[int], list[float]]], out: Path, title: str) -> None:
    panels = {name: [k for k in keys if k in series] for name, keys in PANELS.items()}
    panels = {name: keys for name, keys in panels.items() if keys}
    fig, axes = plt.subplots(len(panels), 1, sharex=True, squeeze=False,
                             figsize=(7, 2.5 * len(panels)))
    for ax, (name, keys) in zip(axes[:, 0], panels.items(), strict=True):
        for key in keys:
            ax.plot(*series[key], marker="o", label=key)
        ax.set_title(name)
        ax.legend(fontsize="small")
    axes[-1, 0].set_xlabel("step")
    axes[-1, 0].xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a run folder (holds metrics.jsonl)")
    parser.add_argument("--out", type=Path, help="the PNG to write (RUN_FOLDER/curves.png)")
    args = parser.parse_args()
    series = read_series(args.run_dir)
    if "reward/mean" not in series:
        parser.error(f"{args.run_dir / 'metrics.jsonl'}: no training steps logged")
    out = args.out or args.run_dir / "curves.png"
    plot(series, out, args.run_dir.resolve().name)
    for key, (steps, _) in series.items():
        print(f"{key}: {len(steps)} points")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
