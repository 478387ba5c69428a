"""BM25 retriever, its disk cache, the Search-R1 style HTTP server and the HTTP client."""

import json
import re
import socket
import subprocess
import sys
import threading
import time

import bm25s
import httpx
import numpy as np
import pytest

from rl.tasks.search.client import (
    HTTP_STAT_KEYS,
    RETRIEVERS,
    HTTPRetriever,
    RetrieverError,
    make_retriever,
)
from rl.tasks.search.corpus import Doc, write_corpus
from rl.tasks.search.retriever import BM25Config, BM25Retriever
from rl.tasks.search.server import BadRequest, parse_request, serve_in_thread
from rl.tasks.search.world import build_world


@pytest.fixture(scope="module")
def world():
    return build_world(11, 500)


@pytest.fixture(scope="module")
def corpus_path(world, tmp_path_factory):
    return write_corpus(world.docs, tmp_path_factory.mktemp("corpus") / "corpus.jsonl")


@pytest.fixture(scope="module")
def bm25(corpus_path):
    return BM25Retriever.build(corpus_path, None)


@pytest.fixture()
def server(bm25):
    with serve_in_thread(bm25, "127.0.0.1", 0) as s:
        yield s


STATS = dict.fromkeys(HTTP_STAT_KEYS, 0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- BM25


def test_bm25_title_queries_find_their_doc(world, bm25):
    titles = [d.title for d in world.docs]
    results = bm25.retrieve(titles, topk=3)
    assert len(results) == len(titles)
    assert all(len(r) == 3 for r in results)
    assert all(r[0].id == d.id and r[0].title == d.title for r, d in zip(results, world.docs))
    assert all(r[0].score >= r[1].score >= r[2].score for r in results)


def test_bm25_scores_match_bm25s(world, bm25):
    # our batched candidate scoring must equal bm25s' own dense scores
    model = bm25s.BM25()
    tok = bm25._tokenize
    model.index([tok(f"{d.title}\n{d.text}") for d in world.docs], show_progress=False)
    queries = ["who founded the company", world.docs[7].title + " born", "xyzzy nothing"]
    for q, res in zip(queries, bm25.retrieve(queries, topk=5)):
        ids = [model.vocab_dict[t] for t in tok(q) if t in model.vocab_dict]
        dense = model.get_scores_from_ids(ids) if ids else np.zeros(len(world.docs))
        # compare scores, not ids: equally long docs tie up to float rounding
        np.testing.assert_allclose([d.score for d in res], np.sort(dense)[::-1][:5], rtol=1e-5)
        for d in res:
            assert dense[int(d.id)] == pytest.approx(d.score, rel=1e-5)


def test_bm25_edge_cases(bm25):
    assert bm25.retrieve([], topk=3) == []
    # a query with no known token still returns topk docs, all with score 0
    (res,) = bm25.retrieve(["the of and"], topk=2)
    assert len(res) == 2 and all(d.score == 0.0 for d in res)
    (res,) = bm25.retrieve(["anything"], topk=10_000)  # capped at the corpus size
    assert len(res) == len(bm25)
    with pytest.raises(ValueError):
        bm25.retrieve(["q"], topk=0)
    with pytest.raises(TypeError):
        bm25.retrieve("a single string", topk=1)


def test_bm25_ties_break_by_corpus_order():
    docs = [Doc(str(i), f"T{i}", "same words here") for i in range(9, -1, -1)]
    r = BM25Retriever.from_docs(docs)
    (res,) = r.retrieve(["same words"], topk=3)
    assert [d.id for d in res] == ["9", "8", "7"]
    assert res[0].score == res[2].score > 0


def test_bm25_cache_reused_and_keyed_by_content(tmp_path, world):
    corpus = write_corpus(world.docs[:200], tmp_path / "c.jsonl")
    cache = tmp_path / "cache"
    first = BM25Retriever.build(corpus, cache)
    assert not first.loaded_from_cache
    assert len(list(cache.iterdir())) == 1
    second = BM25Retriever.build(corpus, cache)
    assert second.loaded_from_cache
    q = [world.docs[3].title, "founded in"]
    assert second.retrieve(q, 4) == first.retrieve(q, 4)
    # a different BM25 setting is a different cache entry
    assert not BM25Retriever.build(corpus, cache, BM25Config(k1=1.2)).loaded_from_cache
    # same path, different content: rebuilt, not the stale index
    write_corpus(world.docs[:150], corpus)
    third = BM25Retriever.build(corpus, cache)
    assert not third.loaded_from_cache and len(third) == 150
    assert len(list(cache.iterdir())) == 3


def test_bm25_corrupt_cache_is_rebuilt(tmp_path, world):
    corpus = write_corpus(world.docs[:50], tmp_path / "c.jsonl")
    cache = tmp_path / "cache"
    BM25Retriever.build(corpus, cache)
    (entry,) = cache.iterdir()
    (entry / "params.index.json").write_text("garbage")
    again = BM25Retriever.build(corpus, cache)
    assert not again.loaded_from_cache
    assert BM25Retriever.build(corpus, cache).loaded_from_cache


def test_bm25_stemmer_is_optional():
    try:
        import Stemmer  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="PyStemmer"):
            BM25Retriever.from_docs([Doc("0", "A", "runs")], BM25Config(stemmer="english"))
    else:
        r = BM25Retriever.from_docs([Doc("0", "A", "running"), Doc("1", "B", "x")],
                                    BM25Config(stemmer="english"))
        assert r.retrieve(["runs"], 1)[0][0].id == "0"


# ---------------------------------------------------------------- server + client


def test_client_against_real_server(server, bm25, world):
    queries = [world.docs[5].title, "film directed by", world.docs[42].title]
    with HTTPRetriever(server.url, timeout_s=5, max_retries=0) as client:
        remote = client.retrieve(queries, topk=3)
        assert client.stats() == STATS | {"requests": 1}
    local = bm25.retrieve(queries, topk=3)
    assert [[d.id for d in r] for r in remote] == [[d.id for d in r] for r in local]
    assert [[(d.title, d.text) for d in r] for r in remote] == \
        [[(d.title, d.text) for d in r] for r in local]
    for r, loc in zip(remote, local):
        np.testing.assert_allclose([d.score for d in r], [d.score for d in loc], rtol=1e-6)


def test_server_wire_format(server, world):
    title = world.docs[9].title
    body = httpx.post(server.url, json={"queries": [title], "topk": 2, "return_scores": True},
                      timeout=5).json()
    (hits,) = body["result"]
    assert len(hits) == 2 and set(hits[0]) == {"document", "score"}
    assert hits[0]["document"] == {"id": "9", "contents": f'"{title}"\n{world.docs[9].text}'}
    # without scores: bare document dicts, as Search-R1 answers
    body = httpx.post(server.url, json={"queries": [title, "x"], "topk": 1}, timeout=5).json()
    assert body["result"][0] == [{"id": "9", "contents": world.docs[9].contents}]
    assert len(body["result"]) == 2
    # topk defaults to the server's (3)
    body = httpx.post(server.url, json={"queries": ["band"]}, timeout=5).json()
    assert len(body["result"][0]) == 3
    assert httpx.post(server.url, json={"queries": []}, timeout=5).json() == {"result": []}
    health = httpx.get(server.url.replace("/retrieve", "/health"), timeout=5).json()
    assert health == {"status": "ok", "num_docs": len(world.docs)}


@pytest.mark.parametrize(
    "payload, msg",
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"topk": 3}', "'queries' must be a list of strings"),
        (b'{"queries": "one string"}', "'queries' must be a list of strings"),
        (b'{"queries": [1]}', "'queries' must be a list of strings"),
        (b'{"queries": ["q"], "topk": 0}', "'topk' must be a positive integer"),
        (b'{"queries": ["q"], "topk": true}', "'topk' must be a positive integer"),
        (b'{"queries": ["q"], "topk": "3"}', "'topk' must be a positive integer"),
        (b'{"queries": ["q"], "return_scores": "yes"}', "'return_scores' must be a boolean"),
    ],
)
def test_server_bad_requests(server, payload, msg):
    r = httpx.post(server.url, content=payload, timeout=5,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    assert msg in r.json()["error"]


def test_server_unknown_paths(server):
    base = server.url.rsplit("/", 1)[0]
    assert httpx.post(base + "/nope", json={}, timeout=5).status_code == 404
    assert httpx.get(server.url, timeout=5).status_code == 405
    assert "error" in httpx.get(base + "/nope", timeout=5).json()


def test_parse_request_defaults():
    assert parse_request(b'{"queries": ["a"], "extra": 1}', 3) == (["a"], 3, False)
    assert parse_request(b'{"queries": ["a"], "topk": null, "return_scores": true}', 5) == (
        ["a"], 5, True)
    with pytest.raises(BadRequest):
        parse_request(b"\xff\xfe", 3)


def test_unreachable_server_fails_fast_and_clearly():
    url = f"http://127.0.0.1:{free_port()}/retrieve"  # nothing listens there
    client = HTTPRetriever(url, timeout_s=1.0, max_retries=2, backoff_s=0.05)
    t0 = time.monotonic()
    with pytest.raises(RetrieverError, match=re.escape(url)) as err:
        client.retrieve(["q"])
    assert time.monotonic() - t0 < 5
    assert "3 attempt(s)" in str(err.value)
    assert client.stats() == STATS | {"requests": 3, "retries": 2, "failures": 1, "errors": 3}


class Flaky:
    """A retriever that fails its first ``n_fail`` calls (the server answers 500)."""

    def __init__(self, inner, n_fail: int, delay_s: float = 0.0):
        self.inner, self.n_fail, self.delay_s = inner, n_fail, delay_s
        self.calls = 0
        self.lock = threading.Lock()

    def __len__(self):
        return len(self.inner)

    def retrieve(self, queries, topk=3):
        with self.lock:
            self.calls += 1
            fail = self.calls <= self.n_fail
        if self.delay_s:
            time.sleep(self.delay_s)
        if fail:
            raise RuntimeError("index shard offline")
        return self.inner.retrieve(queries, topk)


def test_client_retries_http_500_then_succeeds(bm25, world):
    flaky = Flaky(bm25, n_fail=2)
    with serve_in_thread(flaky) as srv:
        client = HTTPRetriever(srv.url, timeout_s=5, max_retries=3, backoff_s=0.01)
        (res,) = client.retrieve([world.docs[1].title], topk=1)
    assert res[0].id == "1"
    assert flaky.calls == 3
    assert client.stats() == STATS | {"requests": 3, "retries": 2, "failures": 0, "errors": 2}


def test_client_gives_up_after_bounded_500s(bm25):
    with serve_in_thread(Flaky(bm25, n_fail=100)) as srv:
        client = HTTPRetriever(srv.url, timeout_s=5, max_retries=1, backoff_s=0.01)
        with pytest.raises(RetrieverError, match="HTTP 500.*index shard offline"):
            client.retrieve(["q"])
    assert client.stats()["requests"] == 2 and client.stats()["failures"] == 1


def test_client_read_timeout_is_bounded(bm25):
    with serve_in_thread(Flaky(bm25, n_fail=0, delay_s=1.5)) as srv:
        client = HTTPRetriever(srv.url, timeout_s=0.2, max_retries=1, backoff_s=0.01)
        t0 = time.monotonic()
        with pytest.raises(RetrieverError, match="Timeout"):
            client.retrieve(["q"])
        assert time.monotonic() - t0 < 1.5
    assert client.stats()["retries"] == 1


def test_a_trickling_server_cannot_hold_an_attempt_open():
    """Bytes every 0.1 s never trip the per-read timeout; the response deadline ends it."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def trickle():
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
            while not stop.is_set():
                try:
                    conn.sendall(b" ")
                except OSError:  # the client hung up
                    return
                time.sleep(0.1)

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    client = HTTPRetriever(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout_s=0.5,
                           max_retries=0)
    t0 = time.monotonic()
    try:
        with pytest.raises(RetrieverError, match="not complete within 0.5 s"):
            client.retrieve(["q"])
        assert time.monotonic() - t0 < 3  # without the deadline: 10,000 s
    finally:
        stop.set()
        client.close()
        listener.close()


def test_client_does_not_retry_4xx_but_retries_malformed():
    """A malformed body is retried like a 5xx (issue 22: one malformed answer ended the run);
    a 4xx is the request's fault and fails at once."""
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if body["queries"] == ["bad"]:
            return httpx.Response(400, json={"error": "nope"})
        return httpx.Response(200, json={"result": []})  # wrong length

    client = HTTPRetriever("http://retriever.test:8000", max_retries=3, backoff_s=0.01,
                           transport=httpx.MockTransport(handler))
    assert client.url == "http://retriever.test:8000/retrieve"
    with pytest.raises(RetrieverError, match="HTTP 400"):
        client.retrieve(["bad"])
    with pytest.raises(RetrieverError, match="4 attempt.*malformed response"):
        client.retrieve(["good"])
    assert client.stats() == STATS | {"requests": 1 + 4, "retries": 3, "failures": 2,
                                      "errors": 1 + 4, "bad_bodies": 4}


def test_client_parses_unscored_and_flashrag_style_docs():
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"result": [[
            {"id": "7", "contents": '"T"\nbody'},
            {"document": {"id": 8, "title": "U", "text": "other"}, "score": 2.5},
        ]]})

    client = HTTPRetriever("http://x.test/retrieve", transport=httpx.MockTransport(handler))
    assert client.retrieve(["q"]) == [[Doc("7", "T", "body", 0.0), Doc("8", "U", "other", 2.5)]]


@pytest.mark.parametrize("doc, field", [({"document": {"contents": None}}, "contents"),
                                        ({"title": None, "text": "t"}, "title"),
                                        ({"title": "T", "text": 3}, "text")])
def test_client_rejects_documents_with_missing_text(doc, field):
    client = HTTPRetriever("http://x.test/retrieve", max_retries=2, backoff_s=0.01,
                           transport=httpx.MockTransport(
        lambda request: httpx.Response(200, json={"result": [[doc]]})))
    with pytest.raises(RetrieverError, match=f"malformed response.*'{field}' must be a string"):
        client.retrieve(["q"])
    assert client.stats()["requests"] == client.stats()["bad_bodies"] == 3  # retried


# ---------------------------------------------------------------- registry / CLI


def test_make_retriever(corpus_path, tmp_path, server, world):
    assert set(RETRIEVERS.names()) == {"bm25", "http"}
    local = make_retriever({"name": "bm25", "corpus_path": str(corpus_path),
                            "cache_dir": str(tmp_path / "c")})
    assert isinstance(local, BM25Retriever)
    remote = make_retriever({"name": "http", "url": server.url, "timeout_s": 5})
    assert isinstance(remote, HTTPRetriever)
    q = [world.docs[4].title]
    assert remote.retrieve(q, 2)[0][0].id == local.retrieve(q, 2)[0][0].id == "4"
    with pytest.raises(ValueError, match="bad options for retriever 'http'"):
        make_retriever({"name": "http", "url": server.url, "timeout": 5})
    with pytest.raises(ValueError, match="needs a 'name'"):
        make_retriever({"url": server.url})
    with pytest.raises(KeyError, match="unknown retriever 'e5'"):
        make_retriever({"name": "e5"})
    with pytest.raises(ValueError, match="http"):
        HTTPRetriever("localhost:8000")


def test_server_cli_serves(corpus_path, world):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rl.tasks.search.server", "--corpus", str(corpus_path), "--port",
         str(port), "--host", "127.0.0.1", "--no-cache"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = HTTPRetriever(f"http://127.0.0.1:{port}", timeout_s=2, max_retries=60,
                               backoff_s=0.25, max_backoff_s=0.25)  # waits for startup
        (res,) = client.retrieve([world.docs[3].title], topk=1)
        assert res[0].id == "3"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
