"""Local BM25 throughput on a generated 10,000-document world corpus (target >= 1,000 q/s).

Run: ``python -m bench.retrieval [--n-docs 10000] [--n-queries 4000] [--batch 256]``.
Queries are the world's multi-hop questions (what a policy's first search often looks like)
and entity titles, sent in batches as the search environment does.
"""

from __future__ import annotations

import argparse
import time

from rl.tasks.search.retriever import BM25Retriever
from rl.tasks.search.world import build_world, make_questions


def _rate(retriever: BM25Retriever, queries: list[str], batch: int, topk: int) -> float:
    t0 = time.perf_counter()
    for i in range(0, len(queries), batch):
        retriever.retrieve(queries[i:i + batch], topk=topk)
    return len(queries) / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--n-docs", type=int, default=10_000)
    p.add_argument("--n-queries", type=int, default=4_000)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--topk", type=int, default=3)
    a = p.parse_args(argv)

    t0 = time.perf_counter()
    world = build_world(0, a.n_docs)
    t1 = time.perf_counter()
    retriever = BM25Retriever.from_docs(world.docs)
    t2 = time.perf_counter()
    questions = [q.question for q in make_questions(world, a.n_queries, seed=1)]
    titles = [d.title for d in world.docs][: a.n_queries]
    retriever.retrieve(questions[:16], a.topk)  # warm-up

    q_rate = _rate(retriever, questions, a.batch, a.topk)
    t_rate = _rate(retriever, titles, a.batch, a.topk)
    print(f"corpus: {len(world.docs)} docs (generated in {t1 - t0:.2f}s, indexed in "
          f"{t2 - t1:.2f}s)")
    print(f"BM25 top-{a.topk}, batches of {a.batch}:")
    print(f"  question queries: {q_rate:,.0f} q/s ({len(questions)} queries)")
    print(f"  title queries:    {t_rate:,.0f} q/s ({len(titles)} queries)")
    print(f"  target >= 1,000 q/s: {'met' if min(q_rate, t_rate) >= 1000 else 'NOT met'}")


if __name__ == "__main__":
    main()
