"""``python -m rl.groups RUN [BASELINE] [--from-step N]``: a run's group statistics over its
steps (``rl.run.group_summary``), and with a baseline run the relative drop of its all-wrong
groups (the ARBOR paper's comparison with GRPO).

Prints one row per run (steps, the outcome-homogeneous share, the converted share of those,
the all-wrong share) and, with two runs, a line such as::

    all-wrong groups: 57.7 % fewer in runs/arbor than in runs/grpo

Exit status 2 on a folder that is not a run or logged no group statistics.
"""

from __future__ import annotations

import argparse
import sys

from rl.run.group_summary import GroupSummary, relative_drop, summarize_groups


def table(rows: list[GroupSummary]) -> str:
    width = max(len("run"), *(len(r.run) for r in rows))
    head = f"{'run':<{width}}  {'steps':>5}  {'homogeneous':>11}  {'converted':>9}  " \
           f"{'all-wrong':>9}"
    lines = [head] + [f"{r.run:<{width}}  {r.steps:>5}  {r.homogeneous:>11.3f}  "
                      f"{r.converted:>9.3f}  {r.all_wrong:>9.3f}" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl.groups", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="a run folder (its metrics.jsonl)")
    parser.add_argument("baseline", nargs="?", help="a run to compare with (e.g. GRPO's)")
    parser.add_argument("--from-step", type=int, default=0,
                        help="leave out the steps before this one (default 0)")
    args = parser.parse_args(argv)
    try:
        rows = [summarize_groups(p, args.from_step) for p in (args.run, args.baseline) if p]
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table(rows))
    if len(rows) == 2:
        drop = relative_drop(*rows)
        if drop is None:
            print(f"all-wrong groups: {rows[1].run} had none to compare with")
        else:
            word = "fewer" if drop >= 0 else "more"
            print(f"all-wrong groups: {abs(drop):.1%} {word} in {rows[0].run} than in "
                  f"{rows[1].run}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
