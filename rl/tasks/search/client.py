"""HTTP client for a Search-R1 compatible retrieval server, and the retriever registry.

``HTTPRetriever`` has the same ``retrieve`` as ``BM25Retriever``. Each HTTP attempt is bounded
by ``timeout_s`` per network operation (connect / read / write) and by a deadline of
``timeout_s`` for the whole response, checked as its bytes arrive (a server that trickles
bytes cannot hold an attempt open): an attempt ends within about ``2 * timeout_s``. Connection
errors, timeouts, HTTP 429 and 5xx, and malformed bodies (not JSON, or not one result list per
query) are retried at most ``max_retries`` times with exponential backoff
(``backoff_s * 2**i``, capped at ``max_backoff_s``), after which a :class:`RetrieverError`
naming the URL is raised. Other 4xx answers fail at once (retrying would not help). One call
thus takes at most ``max_retries + 1`` bounded attempts plus the backoff sleeps: never a hang.

A circuit breaker (``core.breaker``) guards the attempts: after ``breaker_timeouts``
consecutive timeouts, calls raise :class:`RetrieverError` at once, without a request, for
``breaker_cooldown_s``; then one probe call tests the server. A hung server thus costs about
one timeout per cool-down, not ``max_retries + 1`` of them per call. What the search
environment does with a failed call is ``rl.tasks.search.faults``'.
"""

from __future__ import annotations

import inspect
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from core.breaker import BREAKER_STAT_KEYS, CircuitBreaker
from core.registry import Registry
from rl.tasks.search.corpus import Doc, parse_contents
from rl.tasks.search.retriever import BM25Config, BM25Retriever, Retriever

log = logging.getLogger(__name__)


class RetrieverError(RuntimeError):
    """Retrieval failed for good (after the bounded retries, or on a non-retryable answer)."""


def _endpoint(url: str) -> str:
    # Search-R1 configs give the full ".../retrieve" URL; a bare "http://host:port" gets it added.
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"retriever url must be http(s)://host:port[/retrieve], got {url!r}")
    return url.rstrip("/") + "/retrieve" if parts.path in ("", "/") else url


def _parse_doc(item: Any) -> Doc:
    """One result item, scored ``{"document": {...}, "score": f}`` or a bare document dict.
    Documents carry wiki-18 ``contents``, or FlashRAG-style ``title`` / ``text``."""
    score = 0.0
    if isinstance(item, dict) and "document" in item:
        score = float(item.get("score", 0.0))
        item = item["document"]
    if not isinstance(item, dict):
        raise ValueError(f"document must be an object, got {type(item).__name__}")
    fields = ("contents",) if "contents" in item else ("title", "text")
    for field in fields:
        if not isinstance(item.get(field), str):
            raise ValueError(f"document field {field!r} must be a string, got "
                             f"{type(item.get(field)).__name__}")
    title, text = (parse_contents(item["contents"]) if "contents" in item
                   else (item["title"], item["text"]))
    return Doc(id=str(item.get("id", "")), title=title, text=text, score=score)


HTTP_STAT_KEYS = ("requests", "retries", "errors", "timeouts", "bad_bodies", "failures",
                  *BREAKER_STAT_KEYS)


class HTTPRetriever:
    """Client for ``POST /retrieve``. Thread-safe; counters are shared across threads."""

    def __init__(self, url: str, timeout_s: float = 10.0, max_retries: int = 3,
                 backoff_s: float = 0.5, max_backoff_s: float = 8.0,
                 transport: httpx.BaseTransport | None = None, breaker_timeouts: int = 2,
                 breaker_cooldown_s: float = 30.0):
        if max_retries < 0 or timeout_s <= 0 or backoff_s < 0:
            raise ValueError("need timeout_s > 0, max_retries >= 0, backoff_s >= 0")
        self.url = _endpoint(url)
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._client = httpx.Client(timeout=httpx.Timeout(timeout_s), transport=transport)
        self._breaker = CircuitBreaker(breaker_timeouts, breaker_cooldown_s)
        self._lock = threading.Lock()
        self._stats = dict.fromkeys(HTTP_STAT_KEYS[:-len(BREAKER_STAT_KEYS)], 0)

    def _count(self, key: str) -> None:
        with self._lock:
            self._stats[key] += 1

    def stats(self) -> dict[str, int]:
        """requests: HTTP attempts sent; retries: attempts after a call's first; errors: failed
        attempts (timeouts and bad bodies included); timeouts; bad_bodies: 200 answers that are
        not one result list per query; failures: ``retrieve`` calls that raised
        RetrieverError; breaker_opens / breaker_rejected: see ``core.breaker``."""
        with self._lock:
            return dict(self._stats) | self._breaker.stats()

    def _fail(self, msg: str) -> RetrieverError:
        self._count("failures")
        return RetrieverError(f"retrieval server {self.url}: {msg}")

    def retrieve(self, queries: list[str], topk: int = 3) -> list[list[Doc]]:
        if isinstance(queries, str):
            raise TypeError("retrieve() takes a list of queries, not a single string")
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        queries = list(queries)
        if not queries:
            return []
        payload = {"queries": queries, "topk": topk, "return_scores": True}
        last = "no attempt made"
        for attempt in range(self.max_retries + 1):
            if attempt and not self._breaker.is_open():
                self._count("retries")
                time.sleep(min(self.backoff_s * 2 ** (attempt - 1), self.max_backoff_s))
            if not self._breaker.allow():
                raise self._fail(f"circuit breaker open (the server timed out "
                                 f"{self._breaker.threshold} times in a row; next probe within "
                                 f"{self._breaker.cooldown_s} s); last error: {last}")
            outcome = self._attempt(payload, len(queries))
            if isinstance(outcome, list):
                return outcome
            last = outcome
        raise self._fail(f"failed after {self.max_retries + 1} attempt(s); last error: {last}")

    def _attempt(self, payload: dict[str, Any], n_queries: int) -> list[list[Doc]] | str:
        """One attempt: the parsed results, or why it failed (retryable); raises on a
        non-retryable answer."""
        self._count("requests")
        try:
            status, body = self._post(payload)
        except httpx.TimeoutException as e:
            if self._breaker.record(timed_out=True):
                log.warning("retrieval server %s timed out %d times in a row: calls fail fast "
                            "for %s s (circuit breaker)", self.url, self._breaker.streak,
                            self._breaker.cooldown_s)
            self._count("timeouts")
            self._count("errors")
            return f"{type(e).__name__}: {e}"
        except httpx.HTTPError as e:  # connect refused, protocol errors
            self._breaker.record(timed_out=False)
            self._count("errors")
            return f"{type(e).__name__}: {e}"
        self._breaker.record(timed_out=False)
        text = body[:500].decode("utf-8", "replace")
        if status == 429 or status >= 500:
            self._count("errors")
            return f"HTTP {status}: {text[:200]}"
        if status != 200:
            self._count("errors")
            raise self._fail(f"HTTP {status}: {text}")
        try:
            return self._parse(json.loads(body), n_queries)
        except (ValueError, KeyError, TypeError) as e:
            self._count("bad_bodies")
            self._count("errors")
            return f"malformed response ({str(e)[:200]})"

    def _post(self, payload: dict[str, Any]) -> tuple[int, bytes]:
        """(status, body) of one attempt, its whole response within the deadline."""
        deadline = time.monotonic() + self.timeout_s
        with self._client.stream("POST", self.url, json=payload) as resp:
            chunks = []
            for chunk in resp.iter_bytes():
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    raise httpx.ReadTimeout(f"response not complete within {self.timeout_s} s")
            return resp.status_code, b"".join(chunks)

    @staticmethod
    def _parse(body: Any, n_queries: int) -> list[list[Doc]]:
        result = body["result"]
        if not isinstance(result, list) or len(result) != n_queries:
            raise ValueError(f"expected {n_queries} result lists")
        return [[_parse_doc(item) for item in docs] for docs in result]

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> HTTPRetriever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


RETRIEVERS: Registry[Callable[..., Retriever]] = Registry("retriever")


@RETRIEVERS.register("bm25")
def _make_bm25(corpus_path: str | Path, cache_dir: str | Path | None = None, k1: float = 1.5,
               b: float = 0.75, method: str = "lucene", stopwords: bool = True,
               stemmer: str | None = None) -> BM25Retriever:
    cfg = BM25Config(k1=k1, b=b, method=method, stopwords=stopwords, stemmer=stemmer)
    return BM25Retriever.build(corpus_path, cache_dir, cfg)


@RETRIEVERS.register("http")
def _make_http(url: str, timeout_s: float = 10.0, max_retries: int = 3, backoff_s: float = 0.5,
               max_backoff_s: float = 8.0, breaker_timeouts: int = 2,
               breaker_cooldown_s: float = 30.0) -> HTTPRetriever:
    return HTTPRetriever(url, timeout_s, max_retries, backoff_s, max_backoff_s,
                         breaker_timeouts=breaker_timeouts,
                         breaker_cooldown_s=breaker_cooldown_s)


def make_retriever(cfg: Mapping[str, Any]) -> Retriever:
    """Build a retriever from a config mapping: ``{"name": "bm25", "corpus_path": ...,
    "cache_dir": ...}`` or ``{"name": "http", "url": ..., "timeout_s": ...}``."""
    opts = dict(cfg)
    name = opts.pop("name", None)
    if name is None:
        raise ValueError(f"retriever config needs a 'name' (one of {RETRIEVERS.names()})")
    builder = RETRIEVERS.get(name)
    try:  # check the options before building, so a typo is reported as such
        inspect.signature(builder).bind(**opts)
    except TypeError as e:
        accepted = list(inspect.signature(builder).parameters)
        raise ValueError(f"bad options for retriever {name!r}: {e}; accepted: {accepted}") from None
    return builder(**opts)
