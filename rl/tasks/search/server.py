"""A small HTTP server exposing a retriever under Search-R1's retrieval API.

``POST /retrieve {"queries": [...], "topk": 3, "return_scores": true}`` ->
``{"result": [[{"document": {"id": ..., "contents": "\\"Title\\"\\ntext"}, "score": f}, ...]]}``;
with ``return_scores`` false (Search-R1's default) each result is the bare document dict.
``GET /health`` answers ``{"status": "ok", "num_docs": N}``. Bad requests get a 400 with a JSON
``{"error": ...}`` body.

Every request is bounded (``ServerLimits``, CLI ``--max-body-bytes``, ``--max-queries``,
``--max-topk``): a body longer than ``max_body_bytes`` is refused with 413 before a byte of it
is read; more than ``max_queries`` queries, or a ``topk`` above ``max_topk``, get 422. A
response thus holds at most ``max_queries x min(max_topk, corpus size)`` documents, and the
memory of a request is bounded by those limits, whatever a client sends (issue 22: 10^4
queries x topk 10^9 built a 429 MB response; 10^5 queries passed 6 GB).

Run: ``python -m rl.tasks.search.server --corpus X.jsonl --port 8000 --host 127.0.0.1``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rl.tasks.search.corpus import Doc
from rl.tasks.search.retriever import BM25Config, BM25Retriever, Retriever

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    """The most one request may ask: body bytes, queries, documents per query."""

    max_body_bytes: int = 4 << 20
    max_queries: int = 4096
    max_topk: int = 100

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if getattr(self, f.name) < 1:
                raise ValueError(f"server limit {f.name} must be >= 1, got "
                                 f"{getattr(self, f.name)}")


class BadRequest(ValueError):
    """A client error, answered with HTTP 400."""


class TooLarge(BadRequest):
    """A well-formed request beyond the server's limits, answered with HTTP 422."""


def _doc_json(d: Doc) -> dict[str, str]:
    return {"id": d.id, "contents": d.contents}


def parse_request(body: bytes, default_topk: int,
                  limits: ServerLimits = ServerLimits()) -> tuple[list[str], int, bool]:
    """Validate a /retrieve body -> (queries, topk, return_scores). Unknown keys are ignored,
    as Search-R1's pydantic model does. ``TooLarge`` beyond ``limits``."""
    try:
        req = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadRequest(f"body is not valid JSON: {e}") from None
    if not isinstance(req, dict):
        raise BadRequest("body must be a JSON object")
    queries = req.get("queries")
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise BadRequest("'queries' must be a list of strings")
    topk = req.get("topk")
    if topk is None:
        topk = default_topk
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise BadRequest(f"'topk' must be a positive integer, got {topk!r}")
    if len(queries) > limits.max_queries:
        raise TooLarge(f"{len(queries)} queries exceed the server's limit of "
                       f"{limits.max_queries} per request (--max-queries)")
    if topk > limits.max_topk:
        raise TooLarge(f"topk {topk} exceeds the server's limit of {limits.max_topk} "
                       f"(--max-topk)")
    return_scores = req.get("return_scores")
    if return_scores is None:
        return_scores = False
    if not isinstance(return_scores, bool):
        raise BadRequest(f"'return_scores' must be a boolean, got {return_scores!r}")
    return queries, topk, return_scores


def handle_retrieve(retriever: Retriever, queries: list[str], topk: int,
                    return_scores: bool) -> dict[str, Any]:
    results = retriever.retrieve(queries, topk=topk) if queries else []
    if return_scores:
        return {"result": [[{"document": _doc_json(d), "score": d.score} for d in docs]
                           for docs in results]}
    return {"result": [[_doc_json(d) for d in docs] for docs in results]}


class RetrievalHTTPServer(ThreadingHTTPServer):
    daemon_threads = True  # idle keep-alive connections must not block shutdown

    def __init__(self, addr: tuple[str, int], retriever: Retriever, default_topk: int = 3,
                 limits: ServerLimits = ServerLimits()):
        if not 1 <= default_topk <= limits.max_topk:
            raise ValueError(f"default topk {default_topk} must be in [1, max_topk = "
                             f"{limits.max_topk}]")
        self.retriever = retriever
        self.default_topk = default_topk
        self.limits = limits
        super().__init__(addr, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client that timed out and hung up is the client's business, not a server error
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            log.debug("client %s went away", client_address)
            return
        super().handle_error(request, client_address)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else host
        return f"http://{host}:{port}/retrieve"


class _Handler(BaseHTTPRequestHandler):
    server: RetrievalHTTPServer
    protocol_version = "HTTP/1.1"  # keep-alive: clients reuse one connection per worker
    # headers and body go out in separate writes; with Nagle on, the client's delayed ACK
    # would add ~40 ms to every keep-alive request
    disable_nagle_algorithm = True
    timeout = 60  # idle keep-alive connections are closed after this

    def _send_json(self, code: int, obj: Any) -> None:
        body = json.dumps(obj, ensure_ascii=False).encode("utf-8")
        self.send_response(code)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, code: int, msg: str) -> None:
        self._send_json(code, {"error": msg})

    def do_GET(self) -> None:  # noqa: N802 (http.server API)
        if self.path.rstrip("/") == "/health":
            r = self.server.retriever
            n = len(r) if hasattr(r, "__len__") else None  # type: ignore[arg-type]
            self._send_json(200, {"status": "ok", "num_docs": n})
        elif self.path.rstrip("/") == "/retrieve":
            self._error(405, "use POST /retrieve")
        else:
            self._error(404, f"no such endpoint {self.path!r}")

    def do_POST(self) -> None:  # noqa: N802
        if self.path.rstrip("/") != "/retrieve":
            self._error(404, f"no such endpoint {self.path!r}")
            return
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            self._error(400, "chunked request bodies are not supported; send Content-Length")
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self.close_connection = True
            self._error(411, "Content-Length required")
            return
        limit = self.server.limits.max_body_bytes
        if length < 0 or length > limit:  # refused unread: the body never enters memory
            self.close_connection = True
            self._error(413, f"body of {length} bytes exceeds the server's limit of {limit} "
                             f"(--max-body-bytes)")
            return
        body = self.rfile.read(length)
        try:
            queries, topk, return_scores = parse_request(body, self.server.default_topk,
                                                         self.server.limits)
        except BadRequest as e:
            self._error(422 if isinstance(e, TooLarge) else 400, str(e))
            return
        try:
            out = handle_retrieve(self.server.retriever, queries, topk, return_scores)
        except Exception as e:  # the server keeps serving; the client sees a 500 and retries
            log.exception("retrieval failed")
            self._error(500, f"retrieval failed: {type(e).__name__}: {e}")
            return
        self._send_json(200, out)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        log.debug("%s - " + format, self.address_string(), *args)


class RunningServer:
    """A server running in a background thread; a context manager that stops it on exit."""

    def __init__(self, server: RetrievalHTTPServer):
        self.server = server
        # a short poll interval makes stop() quick (shutdown waits for the next poll)
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True,
                                        name="retrieval-server")
        self._thread.start()

    @property
    def url(self) -> str:
        return self.server.url

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_in_thread(retriever: Retriever, host: str = "127.0.0.1", port: int = 0,
                    default_topk: int = 3, limits: ServerLimits = ServerLimits()
                    ) -> RunningServer:
    """Start a server (port 0: any free port, see ``.url``) in a daemon thread."""
    return RunningServer(RetrievalHTTPServer((host, port), retriever, default_topk, limits))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Serve a BM25 retriever with Search-R1's API.")
    p.add_argument("--corpus", required=True, type=Path, help="wiki-18 style jsonl corpus")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--topk", type=int, default=3, help="default topk when a request has none")
    p.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache/rubricrl/bm25",
                   help="BM25 index cache (keyed by the corpus content hash)")
    p.add_argument("--no-cache", action="store_true", help="index in memory only")
    p.add_argument("--stemmer", default=None, help="e.g. 'english' (needs PyStemmer)")
    defaults = ServerLimits()
    p.add_argument("--max-body-bytes", type=int, default=defaults.max_body_bytes,
                   help="longer request bodies get 413, unread")
    p.add_argument("--max-queries", type=int, default=defaults.max_queries,
                   help="more queries in one request get 422")
    p.add_argument("--max-topk", type=int, default=defaults.max_topk,
                   help="a larger topk gets 422")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    limits = ServerLimits(args.max_body_bytes, args.max_queries, args.max_topk)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(message)s")
    retriever = BM25Retriever.build(args.corpus, None if args.no_cache else args.cache_dir,
                                    BM25Config(stemmer=args.stemmer))
    server = RetrievalHTTPServer((args.host, args.port), retriever, args.topk, limits)
    log.info("serving %d docs at %s (%s)", len(retriever), server.url, limits)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
