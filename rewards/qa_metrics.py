"""QA evaluation metrics by dataset: named metric sets (``METRIC_SETS``) that ``rl.eval``
chooses per evaluated dataset (``eval.metrics``, ``eval.metrics_by_split``).

Each set scores one extracted answer against a question's gold aliases and returns
``{metric: value}``. The official sets follow their script line by line:

* ``squad`` - SQuAD v1.1 ``evaluate-v1.1.py``: ``exact_match_score`` and ``f1_score`` after
  ``normalize_answer`` (ASCII ``string.punctuation``), each maxed over the gold answers
  (``metric_max_over_ground_truths``). F1 = 0 whenever prediction and gold share no token,
  so an empty prediction scores F1 0 even against an empty gold (EM gives 1 there).
* ``hotpotqa`` - HotpotQA ``hotpot_evaluate_v1.py``: SQuAD's EM, and an F1 that is 0 when
  either normalised side is ``yes``, ``no`` or ``noanswer`` and the two differ (``"yes sir"``
  vs gold ``"yes"``: 0, where the token F1 would give 2/3). The script has one gold per
  question; with several we take the max over them, as SQuAD does.
* ``search_r1`` - Search-R1 ``verl/utils/reward_score/qa_em.py``: ``em_check`` (1 if the
  normalised prediction equals any normalised gold; the EM of the Search-R1 paper's table)
  and ``subem_check`` (1 if any normalised gold is a substring of the normalised prediction),
  plus SQuAD v1.1's F1 for reference (Search-R1 reports none).
* ``reward`` - EM and F1 exactly as the training rewards compute them (``rewards.qa``: the
  Unicode-aware :func:`core.search_r1.normalize_answer`, F1 1 for an empty prediction against
  an empty gold, gold aliases that normalise to nothing dropped when another has content).
  Not comparable with any published table; what ``rl.eval`` reported before the official sets.

A prediction of ``None`` (no answer) scores 0 on every metric, as a missing answer does in
the official scripts. ``NORMALIZERS`` names the two normalisations: ``official`` (ASCII
punctuation, the scripts') and ``unicode`` (ours); a set's own is the default and
``normalize=`` overrides it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial

from core.registry import Registry
from core.search_r1 import normalize_answer, official_normalize_answer
from rewards.qa import Golds, Normalizer, exact_match, f1_score

NORMALIZERS: Registry[Normalizer] = Registry("answer normalizer")
NORMALIZERS.register("official")(official_normalize_answer)
NORMALIZERS.register("unicode")(normalize_answer)

PairMetric = Callable[[str, str, Normalizer], float]  # (prediction, one gold, normalize)
GoldsMetric = Callable[[str, Golds, Normalizer], float]  # (prediction, all golds, normalize)

YES_NO_NOANSWER = ("yes", "no", "noanswer")


def _as_golds(golds: Golds) -> list[str]:
    return [golds] if isinstance(golds, str) else [str(g) for g in golds]


def official_exact_match(pred: str, gold: str, normalize: Normalizer) -> float:
    """``exact_match_score`` (SQuAD v1.1, HotpotQA) = ``em_check`` for one gold (Search-R1):
    normalize(pred) == normalize(gold)."""
    return float(normalize(pred) == normalize(gold))


def official_substring_match(pred: str, gold: str, normalize: Normalizer) -> float:
    """``subem_check`` (Search-R1 qa_em.py) for one gold: normalize(gold) in normalize(pred)
    (a gold that normalises to "" is in every prediction, as in the script)."""
    return float(normalize(gold) in normalize(pred))


def _token_f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    """SQuAD v1.1 ``f1_score``: same = |Counter(pred) & Counter(gold)|; 0 if same == 0;
    else P = same/|pred|, R = same/|gold|, F1 = 2PR / (P + R)."""
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_f1(pred: str, gold: str, normalize: Normalizer) -> float:
    """SQuAD v1.1 ``f1_score`` for one gold (0 without a common token, empty vs empty too)."""
    return _token_f1(normalize(pred).split(), normalize(gold).split())


def hotpot_f1(pred: str, gold: str, normalize: Normalizer) -> float:
    """HotpotQA ``hotpot_evaluate_v1.py`` ``f1_score`` for one gold: 0 if either normalised
    side is in {yes, no, noanswer} and they differ, else SQuAD's token F1."""
    p, g = normalize(pred), normalize(gold)
    if p != g and (p in YES_NO_NOANSWER or g in YES_NO_NOANSWER):
        return 0.0
    return _token_f1(p.split(), g.split())


def max_over_golds(metric: PairMetric, pred: str, golds: Golds, normalize: Normalizer) -> float:
    """SQuAD v1.1 ``metric_max_over_ground_truths``: the best score over the gold answers
    (0 when there is none)."""
    return max((metric(pred, g, normalize) for g in _as_golds(golds)), default=0.0)


@dataclass(frozen=True)
class MetricSet:
    """Named metrics over (prediction, golds) with the normalisation they are defined with."""

    name: str
    normalizer: str  # a NORMALIZERS name: the set's own normalisation
    metrics: Mapping[str, GoldsMetric]
    source: str

    def score(self, pred: str | None, golds: Golds,
              normalize: str | None = None) -> dict[str, float]:
        """{metric: value} for one answer; `normalize` (a NORMALIZERS name) overrides the
        set's own normalisation. No answer (None) scores 0 everywhere."""
        if pred is None:
            return {k: 0.0 for k in self.metrics}
        norm = NORMALIZERS.get(normalize or self.normalizer)
        return {k: float(fn(pred, golds, norm)) for k, fn in self.metrics.items()}


def _official(metric: PairMetric) -> GoldsMetric:
    return partial(max_over_golds, metric)


METRIC_SETS: Registry[MetricSet] = Registry("eval metric set")
for _set in (
    MetricSet("squad", "official", {"em": _official(official_exact_match),
                                    "f1": _official(squad_f1)},
              "SQuAD v1.1 evaluate-v1.1.py"),
    MetricSet("hotpotqa", "official", {"em": _official(official_exact_match),
                                       "f1": _official(hotpot_f1)},
              "HotpotQA hotpot_evaluate_v1.py"),
    MetricSet("search_r1", "official", {"em": _official(official_exact_match),
                                        "subem": _official(official_substring_match),
                                        "f1": _official(squad_f1)},
              "Search-R1 verl/utils/reward_score/qa_em.py (em_check, subem_check); "
              "F1 of SQuAD v1.1"),
    MetricSet("reward", "unicode", {"em": exact_match, "f1": f1_score},
              "rewards.qa (the training rewards' EM / F1)"),
):
    METRIC_SETS.register(_set.name)(_set)

# `eval.metrics=auto`: a dataset's own official metrics, found from the split's name (its
# first word: "hotpotqa", "hotpotqa_dev" and "HotpotQA-dev" are all hotpotqa). Search-R1's
# seven benchmarks other than HotpotQA get Search-R1's EM; HotpotQA keeps its official F1
# (its EM equals Search-R1's em_check).
DATASET_METRICS: Mapping[str, str] = {
    "squad": "squad", "hotpotqa": "hotpotqa", "hotpot": "hotpotqa",
    **{name: "search_r1" for name in ("nq", "triviaqa", "popqa", "2wikimultihopqa", "2wiki",
                                      "musique", "bamboogle")},
}
AUTO_FALLBACK = "reward"  # any other name (the shipped world's dev/test): the reward's metrics


def auto_metric_set(split: str) -> str:
    """The metric set `eval.metrics=auto` gives the split named `split`."""
    first = re.split(r"[_\-./\s]", split.strip().lower())[0]
    return DATASET_METRICS.get(first, AUTO_FALLBACK)


def metric_set_for(split: str, default: str, by_split: Mapping[str, str]) -> MetricSet:
    """The split's metric set: `by_split[split]` if given, else `default` ("auto": by the
    split's dataset name)."""
    name = by_split.get(split, default)
    return METRIC_SETS.get(auto_metric_set(split) if name == "auto" else name)


@dataclass(frozen=True)
class MetricChoice:
    """Which metric set scores each evaluated split (``eval.metrics``,
    ``eval.metrics_by_split``) and the normaliser override (``eval.normalize``)."""

    default: str = "auto"
    by_split: Mapping[str, str] = field(default_factory=dict)
    normalize: str | None = None

    def for_split(self, split: str) -> MetricSet:
        return metric_set_for(split, self.default, self.by_split)
