"""rl.tasks.search.server is bounded (issue 22: 10^4 queries x topk 10^9 built a 429 MB response,
2.15 GB peak, on a 200-document corpus; one 1.8 MB request of 10^5 queries passed 6 GB)."""

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from rl.tasks.search.client import HTTPRetriever
from rl.tasks.search.corpus import write_corpus
from rl.tasks.search.retriever import BM25Retriever
from rl.tasks.search.server import ServerLimits, TooLarge, parse_request, serve_in_thread
from rl.tasks.search.world import build_world


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    # the issue's 200-document corpus
    return write_corpus(build_world(0, 200).docs, tmp_path_factory.mktemp("c") / "corpus.jsonl")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_mb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(field)


def _claim_huge_body(port: int, length: int) -> tuple[int, str]:
    """Headers announcing `length` bytes, then only 64 KiB of them: (status, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {length}\r\n\r\n".encode() + b"[" * 65536)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


def issue_body() -> str:
    """The issue's 1.8 MB request of 10^5 queries."""
    return json.dumps({"queries": [f"query {i:08d}" for i in range(10**5)]})


def test_the_issues_large_requests_are_refused_quickly_and_the_server_stays_small(corpus):
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rl.tasks.search.server", "--corpus", str(corpus),
         "--port", str(port),
         "--no-cache", "--max-queries", "1000", "--max-topk", "50",
         "--max-body-bytes", str(1 << 20)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/retrieve"
    try:
        client = HTTPRetriever(url, timeout_s=2, max_retries=80, backoff_s=0.25,
                               max_backoff_s=0.25)
        assert len(client.retrieve(["film"], topk=3)[0]) == 3  # up (waits for start-up)
        start_mb = _rss_mb(proc.pid, "VmRSS")
        # 10^4 queries x topk 10^9 (a 120 KB body): too many queries -> 422
        t0 = time.monotonic()
        r = httpx.post(url, json={"queries": [f"q{i}" for i in range(10**4)], "topk": 10**9},
                       timeout=10)
        assert r.status_code == 422 and "10000 queries exceed" in r.json()["error"]
        # within the query limit, topk 10^9 -> 422
        r = httpx.post(url, json={"queries": ["q"], "topk": 10**9}, timeout=10)
        assert r.status_code == 422 and "topk 1000000000 exceeds" in r.json()["error"]
        # the 1.8 MB body of 10^5 queries: over --max-body-bytes -> 413, before it is read
        body = issue_body()
        assert len(body) > 1_800_000
        status, text = _claim_huge_body(port, len(body))
        assert status == 413 and "exceeds the server's limit of 1048576" in text
        status, _ = _claim_huge_body(port, 10**12)  # a body claiming a terabyte
        assert status == 413
        assert time.monotonic() - t0 < 5  # all of it answered at once
        # still up, still right, still small
        assert proc.poll() is None
        assert len(client.retrieve(["film"] * 1000, topk=50)) == 1000  # at the limits: served
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()["num_docs"] == 200
        peak_mb = _rss_mb(proc.pid, "VmHWM")
        assert peak_mb < 500 and peak_mb - start_mb < 100, (start_mb, peak_mb)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_limits_in_process_and_in_parse_request(corpus):
    limits = ServerLimits(max_body_bytes=200, max_queries=3, max_topk=5)
    with pytest.raises(TooLarge, match="4 queries exceed the server's limit of 3"):
        parse_request(b'{"queries": ["a", "b", "c", "d"]}', 3, limits)
    with pytest.raises(TooLarge, match="topk 6 exceeds the server's limit of 5"):
        parse_request(b'{"queries": ["a"], "topk": 6}', 3, limits)
    assert parse_request(b'{"queries": ["a", "b", "c"], "topk": 5}', 3, limits)[1] == 5
    with serve_in_thread(BM25Retriever.build(corpus), limits=limits) as srv:
        r = httpx.post(srv.url, json={"queries": ["x" * 300]}, timeout=5)
        assert r.status_code == 413 and "(--max-body-bytes)" in r.json()["error"]
        assert httpx.post(srv.url, json={"queries": ["a"] * 4}, timeout=5).status_code == 422
        assert httpx.post(srv.url, json={"queries": ["a"], "topk": 5}, timeout=5).is_success
    with serve_in_thread(BM25Retriever.build(corpus)) as srv:  # the default limits
        t0 = time.monotonic()
        r = httpx.post(srv.url, content=issue_body(), timeout=10,
                       headers={"Content-Type": "application/json"})
        assert r.status_code == 422 and "100000 queries exceed" in r.json()["error"]
        assert time.monotonic() - t0 < 3
    with pytest.raises(ValueError, match="max_queries must be >= 1"):
        ServerLimits(max_queries=0)
    with pytest.raises(ValueError, match="default topk 7"):
        serve_in_thread(BM25Retriever.build(corpus), default_topk=7, limits=limits)
