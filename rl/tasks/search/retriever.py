"""Local BM25 retriever (the embedded default) over a wiki-18 style jsonl corpus.

Indexing uses ``bm25s``; the index is cached on disk under a key made of the corpus file's
content hash and the BM25 / tokenizer settings, so a second build of the same corpus loads it.
Query scoring reads the index's sparse term->doc score matrix directly and accumulates only
the candidate documents of each query, which keeps batched retrieval fast at any corpus size.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import bm25s
import numpy as np
from bm25s.stopwords import STOPWORDS_EN

from rl.tasks.search.corpus import Doc, load_corpus

log = logging.getLogger(__name__)

_TOKEN_RE = re.compile(r"(?u)\b\w\w+\b")  # bm25s / scikit-learn default token pattern
_STOPWORDS = frozenset(STOPWORDS_EN)
_CACHE_FORMAT = 1  # bump when the cache layout changes


class Retriever(Protocol):
    """What the search environment needs from a retriever."""

    def retrieve(self, queries: list[str], topk: int = 3) -> list[list[Doc]]: ...


@dataclass(frozen=True)
class BM25Config:
    """BM25 scoring and tokenizer settings; all of them are part of the cache key."""

    k1: float = 1.5
    b: float = 0.75
    method: str = "lucene"  # bm25s: "lucene" | "robertson" | "atire"
    stopwords: bool = True  # English stopwords
    stemmer: str | None = None  # e.g. "english"; needs the optional PyStemmer package


def _make_stemmer(name: str | None) -> Callable[[list[str]], list[str]] | None:
    if name is None:
        return None
    try:
        import Stemmer  # PyStemmer, optional
    except ImportError as e:
        raise ImportError(
            f"BM25 stemmer {name!r} needs the PyStemmer package (pip install PyStemmer)"
        ) from e
    return Stemmer.Stemmer(name).stemWords


class Tokenizer:
    """Lowercase, bm25s' token regex, optional English stopwords and stemming."""

    def __init__(self, stopwords: bool = True, stemmer: str | None = None):
        self._stop = _STOPWORDS if stopwords else frozenset()
        self._stem = _make_stemmer(stemmer)
        self._lock = threading.Lock()  # PyStemmer objects are not thread-safe

    def __call__(self, text: str) -> list[str]:
        toks = [t for t in _TOKEN_RE.findall(text.lower()) if t not in self._stop]
        if self._stem is None:
            return toks
        with self._lock:
            return self._stem(toks)


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _cache_key(corpus_hash: str, cfg: BM25Config) -> str:
    settings = json.dumps({**asdict(cfg), "format": _CACHE_FORMAT}, sort_keys=True)
    return f"bm25-{corpus_hash[:24]}-{hashlib.sha256(settings.encode()).hexdigest()[:12]}"


class BM25Retriever:
    """Batched BM25 top-k over an in-memory corpus. Read-only after construction, so one
    instance can serve concurrent threads."""

    def __init__(self, docs: Sequence[Doc], model: bm25s.BM25, cfg: BM25Config,
                 loaded_from_cache: bool = False):
        if model.scores["num_docs"] != len(docs):
            raise ValueError(
                f"BM25 index has {model.scores['num_docs']} docs, corpus has {len(docs)}"
            )
        self.docs = tuple(docs)
        self.cfg = cfg
        self.loaded_from_cache = loaded_from_cache
        self._tokenize = Tokenizer(cfg.stopwords, cfg.stemmer)
        self._vocab: dict[str, int] = model.vocab_dict
        # the index's term -> (doc, score) postings, CSR by term; kept in their saved dtypes
        # so a large index is not copied
        self._data = np.asarray(model.scores["data"])
        self._indices = np.asarray(model.scores["indices"])
        self._indptr = np.asarray(model.scores["indptr"])

    def __len__(self) -> int:
        return len(self.docs)

    @classmethod
    def from_docs(cls, docs: Sequence[Doc], cfg: BM25Config = BM25Config()) -> BM25Retriever:
        """Index docs in memory (no cache)."""
        _check_cfg(cfg)
        if not docs:
            raise ValueError("cannot index an empty corpus")
        return cls(docs, _index(docs, cfg), cfg)

    @classmethod
    def build(cls, corpus_path: str | Path, cache_dir: str | Path | None = None,
              cfg: BM25Config = BM25Config()) -> BM25Retriever:
        """Load ``corpus_path`` and index it, reusing ``cache_dir/<key>`` when present
        (``cache_dir=None``: no disk cache)."""
        _check_cfg(cfg)
        docs = load_corpus(corpus_path)
        if cache_dir is None:
            return cls(docs, _index(docs, cfg), cfg)
        target = Path(cache_dir) / _cache_key(file_sha256(corpus_path), cfg)
        if (target / "meta.json").is_file():
            try:
                meta = json.loads((target / "meta.json").read_text(encoding="utf-8"))
                if meta.get("num_docs") != len(docs):
                    raise ValueError(f"meta.json says {meta.get('num_docs')} docs, corpus has "
                                     f"{len(docs)}")
                model = bm25s.BM25.load(str(target), show_progress=False)
                log.info("BM25 index loaded from %s", target)
                return cls(docs, model, cfg, loaded_from_cache=True)
            except Exception as e:  # a corrupt cache is rebuilt, never fatal
                log.warning("BM25 cache %s unusable (%s); rebuilding", target, e)
                shutil.rmtree(target, ignore_errors=True)
        model = _index(docs, cfg)
        _save_atomic(model, target, {"corpus": str(corpus_path), "num_docs": len(docs),
                                     "config": asdict(cfg)})
        return cls(docs, model, cfg)

    def _scores_one(self, query: str) -> tuple[np.ndarray, np.ndarray]:
        """(candidate doc indices, their scores) for one query; docs sharing no term with the
        query score 0 and are not listed."""
        ids = [self._vocab[t] for t in self._tokenize(query) if t in self._vocab]
        if not ids:
            return np.empty(0, np.int64), np.empty(0, np.float32)
        starts, ends = self._indptr[ids], self._indptr[np.asarray(ids) + 1]
        idx = np.concatenate([self._indices[s:e] for s, e in zip(starts, ends)])
        w = np.concatenate([self._data[s:e] for s, e in zip(starts, ends)])
        cand, inv = np.unique(idx, return_inverse=True)
        return cand, np.bincount(inv, weights=w, minlength=len(cand)).astype(np.float32)

    def _topk_one(self, query: str, k: int) -> list[Doc]:
        cand, scores = self._scores_one(query)
        if len(cand) > k:
            # keep everything above the k-th score, then the tied docs earliest in the corpus
            # (cand is sorted), so ties are broken by corpus order, deterministically
            kth = -np.partition(-scores, k - 1)[k - 1]
            above = np.flatnonzero(scores > kth)
            tied = np.flatnonzero(scores == kth)[: k - len(above)]
            keep = np.concatenate([above, tied])
            cand, scores = cand[keep], scores[keep]
        order = np.lexsort((cand, -scores))
        picked = [(int(cand[i]), float(scores[i])) for i in order]
        if len(picked) < k:  # pad with zero-score docs, as a dense top-k would
            have = {i for i, _ in picked}
            j = 0
            while len(picked) < k:
                if j not in have:
                    picked.append((j, 0.0))
                j += 1
        out = []
        for i, s in picked:
            d = self.docs[i]
            out.append(Doc(id=d.id, title=d.title, text=d.text, score=s))
        return out

    def retrieve(self, queries: list[str], topk: int = 3) -> list[list[Doc]]:
        """Top-``topk`` docs (best first) for each query; topk is capped at the corpus size."""
        if isinstance(queries, str):
            raise TypeError("retrieve() takes a list of queries, not a single string")
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        k = min(topk, len(self.docs))
        return [self._topk_one(q, k) for q in queries]


def _check_cfg(cfg: BM25Config) -> None:
    if cfg.method not in ("lucene", "robertson", "atire"):
        # bm25l / bm25+ add a per-term score to every doc, which the candidate-only scoring
        # does not model
        raise ValueError(f"unsupported BM25 method {cfg.method!r}; use lucene, robertson, atire")


def _index(docs: Sequence[Doc], cfg: BM25Config) -> bm25s.BM25:
    tok = Tokenizer(cfg.stopwords, cfg.stemmer)
    # index title + text, as wiki-18 retrievers index the whole `contents`
    corpus_tokens = [tok(f"{d.title}\n{d.text}") for d in docs]
    model = bm25s.BM25(k1=cfg.k1, b=cfg.b, method=cfg.method)
    model.index(corpus_tokens, show_progress=False)
    return model


def _save_atomic(model: bm25s.BM25, target: Path, meta: dict) -> None:
    """Save into a temp dir then rename, so a crash or a concurrent builder never leaves a
    half-written cache under the final name."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        model.save(str(tmp), show_progress=False)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
        try:
            os.replace(tmp, target)
        except OSError:  # another process won the race; its index is equivalent
            shutil.rmtree(tmp, ignore_errors=True)
    except Exception:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
