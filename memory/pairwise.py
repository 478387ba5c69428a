"""Sparse pairwise scoring of a group under one rubric (ARBOR, arXiv:2606.03239).

Graph ("ring_diameter", default). Draw a seeded random permutation ``pi`` of the ``G`` members
and connect::

    ring:      (pi[k], pi[(k+1) mod G])       k = 0..G-1
    diameter:  (pi[k], pi[k + floor(G/2)])    k = 0..floor(G/2)-1     (G >= 4)

then drop duplicates (G = 2, 3). The ring alone connects the group; the diameter edges halve
its diameter, so every member meets both near and far members of the random order. Edge count
``<= G + floor(G/2) <= 1.5 G`` (vs ``G(G-1)/2`` for all pairs), no self-loops. Other graphs:
"ring" and "complete" (all pairs, for small groups and tests).

Which trajectory of an edge is ``a`` in the ``PairRequest`` is a seeded coin, and each request
carries its own seed for the judge's presentation-order coin (position bias).

Scores, from edge results ``w_ij`` in {1 (i wins), 0.5 (tie), 0 (j wins)}:

* win rate: ``s_i = sum_{j in N(i)} w_ij / deg(i)``;
* Bradley-Terry: strengths ``p`` fitted by MM (Hunter 2004) on pseudo-counts
  ``W_ij = w_ij + prior`` (the prior keeps the fit finite under perfect separation)::

      p_i <- (sum_j W_ij) / sum_{j in N(i)} (W_ij + W_ji) / (p_i + p_j)

  then ``s_i = mean_{j != i} p_i / (p_i + p_j)``: the expected win rate against the group, on
  the same [0, 1] scale as the win rate so that ``delta_v`` and ``lambda`` mean the same.

Centring: ``s~_i = s_i - mean_G(s)``.

A group of one member has no edges and the neutral score 0.5. A non-finite edge result makes
its two endpoints' scores NaN (the caller decides what to do with NaN scores).

Fallback verdicts. A ``PairResult`` with ``fallback=True`` is the judge's defined fallback (a
tie) after it failed, not a judgment. It keeps its tie in the scores that enter the reward
(docs/guides/judges.md: "scored as a defined fallback"), but it is no evidence about the rubric:
statistics (admission gates, retirement) read ``evidence_scores``, computed on the real verdicts
only::

    E' = {e in E : e is not a fallback};   s'_i = score_i(E')  if deg_E'(i) > 0  else NaN

so a member compared only through fallbacks has no evidence score (NaN). With no fallback,
``s' = s``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import numpy as np

from core.registry import Registry
from judges.types import TIE, Draft, PairRequest, PairResult

Edge = tuple[int, int]


def mix_seed(*parts: object) -> int:
    """A process-independent 63-bit seed from any parts (Python's ``hash`` is salted)."""
    blob = "\x1f".join(repr(p) for p in parts).encode("utf-8")
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "little") >> 1


def _dedupe(n: int, pairs: Sequence[tuple[int, int]]) -> tuple[Edge, ...]:
    seen: set[Edge] = set()
    out: list[Edge] = []
    for i, j in pairs:
        e = (min(i, j), max(i, j))
        if i != j and e not in seen and 0 <= e[0] and e[1] < n:
            seen.add(e)
            out.append(e)
    return tuple(out)


GraphFn = Callable[[int, int], tuple[Edge, ...]]
GRAPHS: Registry[GraphFn] = Registry("pairwise graph")


@GRAPHS.register("ring_diameter")
def ring_diameter_graph(n: int, seed: int) -> tuple[Edge, ...]:
    """Ring over a seeded permutation plus diameter edges; ``<= 1.5 n`` edges, connected."""
    if n < 2:
        return ()
    perm = np.random.default_rng(seed).permutation(n).tolist()
    ring = [(perm[k], perm[(k + 1) % n]) for k in range(n)]
    half = n // 2
    diam = [(perm[k], perm[k + half]) for k in range(half)] if n >= 4 else []
    return _dedupe(n, ring + diam)


@GRAPHS.register("ring")
def ring_graph(n: int, seed: int) -> tuple[Edge, ...]:
    """Ring over a seeded permutation; ``n`` edges (1 for n = 2)."""
    if n < 2:
        return ()
    perm = np.random.default_rng(seed).permutation(n).tolist()
    return _dedupe(n, [(perm[k], perm[(k + 1) % n]) for k in range(n)])


@GRAPHS.register("complete")
def complete_graph(n: int, seed: int) -> tuple[Edge, ...]:
    """All ``n(n-1)/2`` pairs (not sparse; for small groups and tests)."""
    return tuple((i, j) for i in range(n) for j in range(i + 1, n))


def build_pair_requests(
    question: str,
    texts: Sequence[str],
    rubric: Draft | str,
    edges: Sequence[Edge],
    seed: int,
) -> tuple[list[PairRequest], tuple[bool, ...]]:
    """One ``PairRequest`` per edge; returns the requests and, per edge, whether it was flipped
    (``a`` = the edge's second member)."""
    rng = np.random.default_rng(seed)
    flips = tuple(bool(f) for f in rng.integers(0, 2, size=len(edges)))
    reqs = []
    for k, ((i, j), flip) in enumerate(zip(edges, flips)):
        a, b = (j, i) if flip else (i, j)
        reqs.append(PairRequest(context=question, a=texts[a], b=texts[b], rubric=rubric,
                                seed=mix_seed(seed, "edge", k)))
    return reqs, flips


def edge_wins(results: Sequence[PairResult | None], flips: Sequence[bool]) -> np.ndarray:
    """Per edge ``(i, j)``: 1.0 if ``i`` won, 0.0 if ``j`` won, 0.5 on a tie, NaN if the result
    is malformed (winner outside {0, 1, TIE}). A fallback tie is 0.5 here, the defined
    fallback score of the reward; ``fallback_mask`` tells it from a real tie."""
    out = np.full(len(flips), np.nan, dtype=np.float64)
    for k, (r, flip) in enumerate(zip(results, flips)):
        winner = getattr(r, "winner", None)
        if winner == TIE:
            out[k] = 0.5
        elif winner in (0, 1):
            a_won = winner == 0
            out[k] = float(a_won != flip)  # a is i unless flipped
    return out


def fallback_mask(results: Sequence[PairResult | None]) -> np.ndarray:
    """Per edge: True if its result is a judge fallback (``PairResult.fallback``), not a verdict.
    A missing or malformed result is not a fallback: ``edge_wins`` already makes it NaN."""
    return np.array([bool(getattr(r, "fallback", False)) for r in results], dtype=bool)


def evidence_scores(
    n: int, edges: Sequence[Edge], wins: np.ndarray, fallback: np.ndarray,
    mode: str = "winrate", iters: int = 20, prior: float = 0.1
) -> np.ndarray:
    """Scores from the real verdicts only (see the module docstring): ``group_scores`` on the
    edges that are not fallbacks; NaN for a member with no such edge."""
    keep = ~np.asarray(fallback, dtype=bool)
    real = [e for e, k in zip(edges, keep) if k]
    s = group_scores(n, real, np.asarray(wins, dtype=np.float64)[keep], mode, iters, prior)
    deg = np.zeros(n, dtype=np.int64)
    for i, j in real:
        deg[i] += 1
        deg[j] += 1
    return np.where(deg > 0, s, np.nan)


def winrate_scores(n: int, edges: Sequence[Edge], wins: np.ndarray) -> np.ndarray:
    """``s_i = mean over i's edges of its result`` (ties 0.5); 0.5 for an isolated member."""
    total = np.zeros(n)
    deg = np.zeros(n)
    for (i, j), w in zip(edges, wins):
        total[i] += w
        total[j] += 1.0 - w
        deg[i] += 1
        deg[j] += 1
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(deg > 0, total / np.maximum(deg, 1), 0.5)


def bradley_terry_scores(
    n: int, edges: Sequence[Edge], wins: np.ndarray, iters: int = 20, prior: float = 0.1
) -> np.ndarray:
    """Expected win rate against the group under a Bradley-Terry fit (MM updates, see module
    docstring); NaN for members touching a NaN edge."""
    bad = np.zeros(n, dtype=bool)
    for (i, j), w in zip(edges, wins):
        if not np.isfinite(w):
            bad[i] = bad[j] = True
    if n < 2:
        return np.full(n, 0.5)
    wmat = np.zeros((n, n))  # wmat[i, j] = pseudo-wins of i over j
    for (i, j), w in zip(edges, wins):
        w = 0.5 if not np.isfinite(w) else float(w)  # placeholder; those members become NaN
        wmat[i, j] += w + prior
        wmat[j, i] += 1.0 - w + prior
    games = wmat + wmat.T
    won = wmat.sum(1)
    p = np.ones(n)
    for _ in range(iters):
        denom = (games / (p[:, None] + p[None, :])).sum(1)
        p = np.where(denom > 0, won / np.maximum(denom, 1e-300), p)
        p = p / np.exp(np.mean(np.log(p)))  # fix the scale (BT is scale-free)
    pair = p[:, None] / (p[:, None] + p[None, :])
    np.fill_diagonal(pair, 0.0)
    s = pair.sum(1) / (n - 1)
    return np.where(bad, np.nan, s)


def group_scores(
    n: int, edges: Sequence[Edge], wins: np.ndarray, mode: str = "winrate", iters: int = 20,
    prior: float = 0.1
) -> np.ndarray:
    """Per-member scores in [0, 1] by ``mode`` ("winrate" | "bradley_terry")."""
    if mode == "winrate":
        return winrate_scores(n, edges, wins)
    if mode == "bradley_terry":
        return bradley_terry_scores(n, edges, wins, iters=iters, prior=prior)
    raise ValueError(f"unknown score mode {mode!r}")


def centre(s: np.ndarray) -> np.ndarray:
    """``s~_i = s_i - mean_G(s)`` (a new array)."""
    s = np.asarray(s, dtype=np.float64)
    return s - s.mean() if s.size else s.copy()
