"""Blind pairwise comparison of two runs' answers, in both presentation orders.

Beside coverage and fitness (absolute scores against a rubric), a preference judge can say
which of two answers to the same prompt is better.  Judges prefer the answer in one position
(Zheng et al. 2023, "Judging LLM-as-a-Judge", sec. 3.3: position bias), so each pair is judged
twice, once with run A's answer shown first and once with run B's, and both verdicts count.

Input: each run's ``eval_samples.jsonl`` (written by ``python -m rl.eval``: one row per prompt
with ``split``, ``id``, ``question``, ``response``), or any JSONL file with those fields.
Answers are paired by ``(split, id)``; the judge is never told which run wrote which answer
(blind: it sees the question, the criterion and two unlabeled answers).

Both orders.  ``Judge.compare`` picks the shown order itself, by a coin seeded with the
judge's seed and the request's ``seed`` (``judges.base.order_coin``).  Pair ``p`` is sent as
two requests with the same seed ``s_p`` and the answers swapped, ``(a=A, b=B)`` and
``(a=B, b=A)``: the same coin then shows A first in one and B first in the other, whatever
the coin's value.  Each result's ``a_shown_first`` is checked; a pair the judge showed in one
order only is counted (``pairs_one_order``) and warned about.

Statistics (A over B; a verdict scores ``v = 1`` A better, ``1/2`` tie, ``0`` B better):

* pair score ``s_p = (v_p1 + v_p2) / 2``; **win rate** ``= mean_p s_p`` (ties count half);
* pair outcome: win when ``s_p > 1/2``, tie when ``s_p = 1/2``, loss when ``s_p < 1/2`` (so a
  verdict that flips with the order is a tie, as in MT-Bench's swapped-position rule, and a
  win in one order with a tie in the other is a win); win, tie and loss rates;
* **position bias**: ``first_shown_rate = (first-shown wins + ties / 2) / 2n`` over the ``2n``
  verdicts.  Every pair is shown once each way, so answer quality cancels: an order-blind judge
  has exactly ``1/2``; ``1`` means the first-shown answer always wins.  **flip rate**: the
  fraction of pairs whose verdict (A / B / tie) differs between the two orders;
  ``strict_flip_rate``: A in one order and B in the other;
* a percentile bootstrap interval over pairs (``rewards.bootstrap``: ``n_boot`` resamples,
  ``level``, ``seed``) for the win rate, the three outcome rates and the first-shown rate (one
  set of resample indices for all, so they stay paired).

Command line::

    python -m rewards.compare RUN_A RUN_B OUT_DIR [judge=rule] [criterion=TEXT] [split=NAME]
        [seed=0] [n_boot=2000] [level=0.95] [judge.<option>=value ...]

RUN_A / RUN_B: a run folder (its ``eval_samples.jsonl``, from ``rl.eval eval.run=...``) or the
file itself.  Prints a short table, writes ``OUT_DIR/compare_summary.json`` and
``OUT_DIR/compare_pairs.jsonl`` (one row per pair: both answers, both verdicts, the pair
score).  Missing files, unreadable rows, repeated ``(split, id)``, the same id with different
questions, no common prompt, and (``judge=rule``) a criterion the rule language cannot read are
named before any judge call.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from core.files import write_atomic
from judges.base import stable_digest
from judges.types import TIE, PairRequest, PairResult
from rewards.bootstrap import LEVEL, N_BOOT, bootstrap_indices, bootstrap_means

SAMPLES_FILE = "eval_samples.jsonl"
DEFAULT_CRITERION = (
    "The better answer is the one that serves the person asking: it answers the question "
    "directly and correctly, covers what matters, explains where that helps, and adds no "
    "filler, repetition or unsafe advice."
)
VERDICTS = ("a", "b", "tie")


class CompareInputError(ValueError):
    """Bad comparison input; the message names the file, row and field."""


@dataclasses.dataclass(frozen=True)
class Answer:
    """One run's answer to one prompt."""

    split: str
    id: str
    question: str
    response: str


@dataclasses.dataclass(frozen=True)
class AnswerPair:
    """Both runs' answers to the same prompt."""

    split: str
    id: str
    question: str
    a: str
    b: str


# --------------------------------------------------------------------------------------------
# input
# --------------------------------------------------------------------------------------------


def samples_path(source: str | Path) -> Path:
    """A run folder's ``eval_samples.jsonl``, or ``source`` itself when it is a file."""
    p = Path(source)
    if p.is_dir():
        f = p / SAMPLES_FILE
        if not f.is_file():
            raise CompareInputError(f"{p}: run folder without {SAMPLES_FILE} (write it with "
                                    f"`python -m rl.eval eval.run={p}`)")
        return f
    if not p.is_file():
        raise CompareInputError(f"{p}: no such run folder or answers file")
    return p


def _answer_row(row: Any, where: str) -> Answer:
    if not isinstance(row, dict):
        raise CompareInputError(f"{where}: not a JSON object")
    for field in ("id", "response"):
        if field not in row or row[field] is None:
            raise CompareInputError(f"{where}: field {field!r} missing")
    if not isinstance(row["response"], str):
        raise CompareInputError(f"{where}: field 'response' is a "
                                f"{type(row['response']).__name__}, not text")
    question = row.get("question", "")
    if not isinstance(question, str):
        raise CompareInputError(f"{where}: field 'question' is not text")
    return Answer(str(row.get("split", "")), str(row["id"]), question, row["response"])


def load_answers(source: str | Path, split: str | None = None) -> dict[tuple[str, str], Answer]:
    """``{(split, id): Answer}`` in file order (only ``split`` when given); every bad row is
    named by file, row (1-based line) and field."""
    path = samples_path(source)
    out: dict[tuple[str, str], Answer] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}: row {n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise CompareInputError(f"{where}: not JSON ({e.msg})") from None
        ans = _answer_row(row, where)
        if split is not None and ans.split != split:
            continue
        key = (ans.split, ans.id)
        if key in out:
            raise CompareInputError(f"{where}: (split {ans.split!r}, id {ans.id!r}) repeated")
        out[key] = ans
    return out


def pair_answers(a: Mapping[tuple[str, str], Answer], b: Mapping[tuple[str, str], Answer],
                 names: tuple[str, str] = ("A", "B")) -> list[AnswerPair]:
    """The prompts both runs answered, in A's order.  Raises when there is none, or when a
    common id carries two different questions (then it is not the same prompt)."""
    common = [k for k in a if k in b]
    if not common:
        raise CompareInputError(
            f"no common prompts: {names[0]} has {len(a)} answers (splits "
            f"{sorted({k[0] for k in a})}), {names[1]} has {len(b)} (splits "
            f"{sorted({k[0] for k in b})}); pairs are matched by (split, id)")
    pairs = []
    for k in common:
        qa, qb = a[k].question, b[k].question
        if qa and qb and qa != qb:
            raise CompareInputError(f"(split {k[0]!r}, id {k[1]!r}): different questions in "
                                    f"{names[0]} ({qa[:60]!r}) and {names[1]} ({qb[:60]!r})")
        pairs.append(AnswerPair(k[0], k[1], qa or qb, a[k].response, b[k].response))
    return pairs


# --------------------------------------------------------------------------------------------
# judging
# --------------------------------------------------------------------------------------------


def pair_seed(seed: int, pair: AnswerPair) -> int:
    """The presentation coin's seed of a pair: the same for its two requests."""
    return int(stable_digest(["compare", seed, pair.split, pair.id])[:8], 16)


def both_orders(pair: AnswerPair, criterion: str, seed: int) -> tuple[PairRequest, PairRequest]:
    """``(a=A, b=B)`` and ``(a=B, b=A)`` with one seed: the judge's coin shows them in
    opposite orders."""
    s = pair_seed(seed, pair)
    return (PairRequest(pair.question, pair.a, pair.b, criterion, seed=s),
            PairRequest(pair.question, pair.b, pair.a, criterion, seed=s))


def read_verdict(res: PairResult, swapped: bool) -> dict[str, Any]:
    """One verdict in runs' terms: ``winner`` a / b / tie, ``first`` the run shown first."""
    if res.winner == TIE:
        winner = "tie"
    else:
        req_a_won = res.winner == 0
        winner = "a" if req_a_won != swapped else "b"
    first = "a" if res.a_shown_first != swapped else "b"
    return {"first": first, "winner": winner, "fallback": bool(res.fallback)}


def judge_pairs(pairs: Sequence[AnswerPair], judge: Any, criterion: str, seed: int
                ) -> list[dict[str, Any]]:
    """Both verdicts of every pair (one batched ``judge.compare`` call)."""
    reqs = [r for p in pairs for r in both_orders(p, criterion, seed)]
    results = judge.compare(reqs)
    if len(results) != len(reqs):
        raise RuntimeError(f"judge answered {len(results)} of {len(reqs)} comparisons")
    rows = []
    for i, p in enumerate(pairs):
        v = [read_verdict(results[2 * i], False), read_verdict(results[2 * i + 1], True)]
        rows.append(pair_row(p, v))
    return rows


def verdict_score(winner: str) -> float:
    """``v``: 1 when A is better, 1/2 on a tie, 0 when B is better."""
    return {"a": 1.0, "tie": 0.5, "b": 0.0}[winner]


def first_shown_score(v: Mapping[str, Any]) -> float:
    """1 when the first-shown answer won, 1/2 on a tie, 0 when the second won."""
    if v["winner"] == "tie":
        return 0.5
    return 1.0 if v["winner"] == v["first"] else 0.0


def pair_row(p: AnswerPair, verdicts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The per-pair record: both answers, both verdicts, the pair score and outcome."""
    score = sum(verdict_score(v["winner"]) for v in verdicts) / len(verdicts)
    winners = {v["winner"] for v in verdicts}
    return {
        "split": p.split, "id": p.id, "question": p.question, "answer_a": p.a, "answer_b": p.b,
        "verdicts": [dict(v) for v in verdicts], "score_a": score,
        "outcome": "win" if score > 0.5 else ("loss" if score < 0.5 else "tie"),
        "flip": len(winners) > 1, "strict_flip": winners >= {"a", "b"},
        "first_shown_score": sum(first_shown_score(v) for v in verdicts) / len(verdicts),
        "both_orders": len({v["first"] for v in verdicts}) == 2,
        "fallbacks": sum(v["fallback"] for v in verdicts),
    }


# --------------------------------------------------------------------------------------------
# summary
# --------------------------------------------------------------------------------------------


def summarize(rows: Sequence[Mapping[str, Any]], n_boot: int = N_BOOT, level: float = LEVEL,
              seed: int = 0) -> dict[str, Any]:
    """Win / tie / loss rates, win rate and position bias of A over B, with bootstrap CIs."""
    n = len(rows)
    score = np.asarray([r["score_a"] for r in rows], np.float64)
    first = np.asarray([r["first_shown_score"] for r in rows], np.float64)
    idx = bootstrap_indices(n, n_boot, seed)
    rates = {}
    for o in ("win", "tie", "loss"):
        ind = np.asarray([r["outcome"] == o for r in rows], np.float64)
        rates[o] = {"rate": float(ind.mean()), "ci": bootstrap_means(ind, idx, level)}
    verdicts = [v for r in rows for v in r["verdicts"]]
    return {
        "n_pairs": n, "n_verdicts": len(verdicts),
        "win_rate": float(score.mean()), "win_rate_ci": bootstrap_means(score, idx, level),
        "outcomes": rates,
        "verdicts": {w: sum(v["winner"] == w for v in verdicts) for w in VERDICTS},
        "position": {
            "first_shown_rate": float(first.mean()),
            "first_shown_rate_ci": bootstrap_means(first, idx, level),
            "first_shown_wins": _frac(verdicts, lambda v: v["winner"] == v["first"]),
            "second_shown_wins": _frac(
                verdicts, lambda v: v["winner"] not in ("tie", v["first"])),
            "ties": _frac(verdicts, lambda v: v["winner"] == "tie"),
            "flip_rate": float(np.mean([r["flip"] for r in rows])),
            "strict_flip_rate": float(np.mean([r["strict_flip"] for r in rows])),
            "pairs_one_order": sum(not r["both_orders"] for r in rows),
        },
        "fallbacks": sum(r["fallbacks"] for r in rows),
        "bootstrap": {"n_boot": n_boot, "level": level, "seed": seed},
    }


def _frac(items: Sequence[Any], pred: Any) -> float:
    return float(np.mean([bool(pred(x)) for x in items])) if items else math.nan


def compare_runs(pairs: Sequence[AnswerPair], judge: Any, criterion: str = DEFAULT_CRITERION,
                 seed: int = 0, n_boot: int = N_BOOT, level: float = LEVEL
                 ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(summary, per-pair rows) of the blind both-orders comparison of A against B."""
    if not pairs:
        raise CompareInputError("no pairs to compare")
    rows = judge_pairs(pairs, judge, criterion, seed)
    return summarize(rows, n_boot, level, seed), rows


def format_summary(s: Mapping[str, Any], names: tuple[str, str]) -> str:
    """The printed table."""
    pct = f"{100 * s['bootstrap']['level']:g}%"
    pos = s["position"]

    def line(label: str, rate: float, ci: Sequence[float]) -> str:
        return f"{label:<24}{rate:>7.3f}   [{ci[0]:.3f}, {ci[1]:.3f}]"

    lines = [f"A = {names[0]}", f"B = {names[1]}",
             f"{s['n_pairs']} common prompts, each judged in both orders ({s['n_verdicts']} "
             f"verdicts)", f"{'A over B (pairs)':<24}{'rate':>7}   {pct} CI",
             line("win", s["outcomes"]["win"]["rate"], s["outcomes"]["win"]["ci"]),
             line("tie", s["outcomes"]["tie"]["rate"], s["outcomes"]["tie"]["ci"]),
             line("loss", s["outcomes"]["loss"]["rate"], s["outcomes"]["loss"]["ci"]),
             line("win rate (ties 1/2)", s["win_rate"], s["win_rate_ci"]),
             line("first-shown wins", pos["first_shown_rate"], pos["first_shown_rate_ci"])
             + "   (position bias; 0.5 = none)",
             f"{'verdict flips':<24}{pos['flip_rate']:>7.3f}   of pairs change verdict with the "
             f"order (A<->B: {pos['strict_flip_rate']:.3f})",
             f"judge fallbacks: {s['fallbacks']} of {s['n_verdicts']} verdicts"]
    if pos["pairs_one_order"]:
        lines.append(f"warning: {pos['pairs_one_order']} pair(s) were shown in one order only "
                     f"(the judge's order coin does not follow the request seed)")
    return "\n".join(lines)


def write_outputs(summary: Mapping[str, Any], rows: Sequence[Mapping[str, Any]],
                  out_dir: str | Path) -> dict[str, Path]:
    """``compare_summary.json`` and ``compare_pairs.jsonl`` (atomic writes)."""
    out = Path(out_dir)
    paths = {"summary": out / "compare_summary.json", "pairs": out / "compare_pairs.jsonl"}
    write_atomic(paths["summary"], json.dumps(summary, indent=1, default=str))
    write_atomic(paths["pairs"], "".join(json.dumps(r, ensure_ascii=False) + "\n"
                                         for r in rows))
    return paths


# --------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------

USAGE = ("usage: python -m rewards.compare RUN_A RUN_B OUT_DIR [judge=rule] [criterion=TEXT] "
         "[split=NAME] [seed=0] [n_boot=2000] [level=0.95] [judge.OPTION=VALUE ...]")
KEYS = ("judge", "criterion", "split", "seed", "n_boot", "level")


@dataclasses.dataclass(frozen=True)
class CompareOptions:
    """The command line's options, checked once."""

    judge: str
    criterion: str
    split: str | None
    seed: int
    n_boot: int
    level: float

    @classmethod
    def from_cli(cls, opts: Mapping[str, Any]) -> CompareOptions:
        from rewards.bundle import CliError

        try:
            o = cls(str(opts.get("judge", "rule")), str(opts.get("criterion", DEFAULT_CRITERION)),
                    opts.get("split"), int(opts.get("seed", 0)),
                    int(opts.get("n_boot", N_BOOT)), float(opts.get("level", LEVEL)))
        except ValueError as e:
            raise CliError(f"bad option value ({e})\n{USAGE}") from None
        if o.n_boot < 1 or not 0.0 < o.level < 1.0:
            raise CliError(f"need n_boot >= 1 and 0 < level < 1, got {o.n_boot}, {o.level}")
        if not o.criterion.strip():
            raise CliError("criterion= is empty")
        return o


def check_rule_criterion(o: CompareOptions) -> None:
    """The rule judge compares by one executable rule; refuse text it cannot read (every pair
    would be a fallback tie)."""
    from rewards.bundle import CliError

    if o.judge == "rule":
        from judges.rule_language import compile_rule

        if compile_rule(o.criterion) is None:
            raise CliError(f"judge=rule: criterion {o.criterion[:80]!r} is not a rule it can "
                           f"read (e.g. criterion='iregex:\\bbecause\\b'); every pair would tie")


def main(argv: Sequence[str] | None = None) -> int:
    from rewards.bundle import CliError, judge_from_args, parse_cli

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        (run_a, run_b, out_dir), opts, jopts = parse_cli(argv, n_pos=3, usage=USAGE, keys=KEYS)
        o = CompareOptions.from_cli(opts)
        check_rule_criterion(o)
        names = (str(run_a), str(run_b))
        a, b = load_answers(run_a, o.split), load_answers(run_b, o.split)
        pairs = pair_answers(a, b, names)
    except (CliError, CompareInputError) as e:
        print(e, file=sys.stderr)
        return 2
    judge = judge_from_args(o.judge, jopts)
    try:
        summary, rows = compare_runs(pairs, judge, o.criterion, o.seed, o.n_boot, o.level)
        stats = judge.stats()
    finally:
        judge.close()
    summary = {"run_a": names[0], "run_b": names[1], "judge": o.judge,
               "judge_options": dict(jopts), "criterion": o.criterion, "split": o.split,
               "only_in_a": sum(k not in b for k in a), "only_in_b": sum(k not in a for k in b),
               **summary, "judge_stats": stats}
    paths = write_outputs(summary, rows, out_dir)
    print(format_summary(summary, names))
    if summary["only_in_a"] or summary["only_in_b"]:
        print(f"left out: {summary['only_in_a']} prompt(s) only in A, {summary['only_in_b']} "
              f"only in B")
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
