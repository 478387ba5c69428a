"""LLMJudge over the OpenAI-compatible HTTP backend, against a real loopback server with faults."""

from __future__ import annotations

import asyncio
import json
import logging
import pickle
import threading
import time
from pathlib import Path

import pytest

from judges import (
    BACKEND_STAT_KEYS,
    JUDGE_STAT_KEYS,
    TIE,
    BundleRequest,
    CheckRequest,
    CheckResult,
    ConsolidateRequest,
    Draft,
    EquivRequest,
    FallbackDrafts,
    InduceRequest,
    Judge,
    LLMJudge,
    OpenAIBackend,
    OpenAIConfig,
    PairRequest,
    RateRequest,
    RateResult,
    make_judge,
)
from judges.openai import _Secret
from judges.prompts import PROMPT_VERSIONS
from tests.judge_server import FakeJudgeServer

SECRET = "sk-test-DO-NOT-LEAK-8c1f2e"


def bounded(fn, seconds: float = 30.0):
    """Run ``fn`` on a thread and fail (instead of hanging the suite) if it takes too long."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # re-raised on the test thread
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"judge call hung for more than {seconds}s"
    if "error" in box:
        raise box["error"]
    return box["value"]


@pytest.fixture
def server():
    with FakeJudgeServer(delay_s=2.5) as srv:
        yield srv


def make(srv: FakeJudgeServer, judge_kw: dict | None = None, **backend_kw) -> LLMJudge:
    cfg = dict(
        base_url=srv.base_url,
        model="fake",
        api_key_env=None,
        timeout_s=1.0,  # generous against a loaded CI box; the delay fault sleeps 2.5 s
        max_retries=3,
        backoff_base_s=0.01,
        backoff_max_s=0.05,
        jitter_seed=0,
    )
    cfg.update(backend_kw)
    return LLMJudge(OpenAIBackend(OpenAIConfig(**cfg)), **(judge_kw or {}))


# --- every operation ----------------------------------------------------------------------------


def test_every_operation_end_to_end(server):
    judge = make(server)
    assert isinstance(judge, Judge)
    checks = bounded(lambda: judge.check(
        [CheckRequest("q", "Paris is the capital", "paris"), CheckRequest("q", "Rome", "paris")]
    ))
    assert checks == [CheckResult(True, 1.0), CheckResult(False, 0.0)]

    pairs = [PairRequest("q", f"GOOD {i}", f"meh {i}", Draft("r", "d")) for i in range(8)]
    pairs += [PairRequest("q", f"meh {i}", f"GOOD {i}", "r") for i in range(8)]
    pairs += [PairRequest("q", "GOOD x", "GOOD y", "r")]
    res = bounded(lambda: judge.compare(pairs))
    assert [r.winner for r in res] == [0] * 8 + [1] * 8 + [TIE]
    assert {r.a_shown_first for r in res} == {True, False}
    assert res[-1].tie_break in (0, 1) and not res[-1].fallback

    (drafts,) = bounded(lambda: judge.induce([InduceRequest("q", "b", None, "w", ("g",))]))
    assert [d.title for d in drafts] == ["Evidence check", "Focused queries"]
    (common,) = bounded(lambda: judge.consolidate(
        [ConsolidateRequest((Draft("Plan", "p"), Draft("Verify", "v")))]
    ))
    assert common == (Draft("Common Plan", "A recurring process pattern."),)
    crit = ("c0", "c1", "c2", "c3", "c4")
    (b,) = bounded(lambda: judge.bundle([BundleRequest("p", crit, (1, 1, 1, 1, -1))]))
    assert b.ok and [(d.indices, d.failure_clause) for d in b.dimensions] == [
        ((0, 1), "skips step one"), ((2, 3, 4), None)
    ]
    eq = bounded(lambda: judge.equivalent([
        EquivRequest("q", "It is Paris.", ("paris",)),
        EquivRequest("q", "Lyon", ("paris",)),
        EquivRequest("q", "Paris", ("paris",)),  # exact after normalisation: no call
    ]))
    assert [(e.equivalent, e.fallback) for e in eq] == [(True, False), (False, False),
                                                         (True, False)]
    s = judge.stats()
    assert s["http_requests"] == server.requests == 2 + 17 + 1 + 1 + 1 + 2
    assert s["fallbacks"] == s["reasks"] == s["retries"] == 0
    assert set(s) == set(JUDGE_STAT_KEYS) | set(BACKEND_STAT_KEYS)
    assert all(isinstance(v, int) for v in s.values())


def test_logprob_checks_and_servers_without_logprobs():
    reqs = [CheckRequest("q", "Paris!", "paris"), CheckRequest("q", "Rome", "paris")]
    with FakeJudgeServer() as srv:
        judge = make(srv, {"check_mode": "logprob"})
        res = bounded(lambda: judge.check(reqs))
        assert [r.met for r in res] == [True, False]
        assert res[0].prob == pytest.approx(0.9) and res[1].prob == pytest.approx(0.1)
        assert srv.requests == 2 and judge.stats()["logprob_unsupported"] == 0
    with FakeJudgeServer(logprobs=False) as srv:
        judge = make(srv, {"check_mode": "logprob"})
        res = bounded(lambda: judge.check(reqs))  # no logprobs: the JSON verdict is asked for
        assert [(r.met, r.prob) for r in res] == [(True, 1.0), (False, 0.0)]
        assert srv.requests == 4 and judge.stats()["logprob_unsupported"] == 2
        res = bounded(lambda: judge.check(reqs))  # remembered: no wasted logprob requests
        assert srv.requests == 6 and judge.stats()["logprob_unsupported"] == 4


# --- holistic rating (RaR implicit) --------------------------------------------------------------


def test_rate_one_request_per_response_with_the_whole_checklist(server):
    judge = make(server)
    crit, w = ("paris", "france", "sorry"), (2.0, 1.0, -1.0)
    res = bounded(lambda: judge.rate([
        RateRequest("q", "RATE[7]", crit, w),               # the server answers the bare "7"
        RateRequest("q", "Paris, France", crit, w),         # JSON: 1 + 2 criteria found
    ]))
    assert res == [RateResult(7), RateResult(3)]
    assert server.requests == 2  # one request per response, whole checklist in it
    s = judge.stats()
    assert (s["requests_rate"], s["parse_errors"], s["fallbacks"]) == (2, 0, 0)
    assert PROMPT_VERSIONS["rate"] == "rate-v1"


def test_rate_garbage_is_reasked_counted_and_falls_back(server):
    judge = make(server, {"max_reasks": 1})
    crit, w = ("paris",), (1.0,)
    res = bounded(lambda: judge.rate([
        RateRequest("q", "FAULT[garbage*1] RATE[7]", crit, w),   # garbage, re-ask -> 7
        RateRequest("q", "FAULT[garbage*all] RATE[7]", crit, w),  # garbage twice -> fallback
        RateRequest("q", "RATE[11]", crit, w),                    # out of range twice
        RateRequest("q", "FAULT[500*all] RATE[7]", crit, w),      # backend gives up: no re-ask
    ]), 20)
    assert res == [RateResult(7), RateResult(1, fallback=True), RateResult(1, fallback=True),
                   RateResult(1, fallback=True)]
    s = judge.stats()
    expect = {"requests_rate": 4, "parse_errors": 5, "reasks": 3, "fallbacks": 3,
              "fallbacks_rate": 3, "backend_errors": 1}
    assert {k: s[k] for k in expect} == expect


# --- faults ---------------------------------------------------------------------------------------


def test_fault_injection_batch_completes_in_order_with_exact_counters(server):
    judge = make(server, {"max_reasks": 1})
    responses = [
        "clean paris",
        "FAULT[500*1] paris",
        "FAULT[500*2] nope",
        "FAULT[delay*1] paris",
        "FAULT[garbage*1] paris",
        "FAULT[garbage*all] paris",
        "FAULT[badbody*1] paris",
        "FAULT[fenced] paris",
        "FAULT[429*1] nope",
    ]
    t0 = time.monotonic()
    res = bounded(lambda: judge.check([CheckRequest("q", r, "paris") for r in responses]), 20)
    assert time.monotonic() - t0 < 10
    assert [(r.met, r.fallback) for r in res] == [
        (True, False), (True, False), (False, False), (True, False), (True, False),
        (False, True), (True, False), (True, False), (False, False),
    ]
    assert res[5].prob == 0.5
    assert dict(server.injected) == {
        "500": 3, "delay": 1, "garbage": 3, "badbody": 1, "fenced": 1, "429": 1
    }
    s = judge.stats()
    expect = {
        "requests_check": 9,
        "http_errors": 4,  # 500, 500, 500, 429
        "timeouts": 1,
        "bad_responses": 1,
        "retries": 6,  # every HTTP-level fault was retried once
        "transport_errors": 0,
        "failed_requests": 0,
        "parse_errors": 3,  # garbage*1 once, garbage*all twice
        "reasks": 2,
        "fallbacks": 1,
        "fallbacks_check": 1,
        "backend_errors": 0,
        "backend_calls": 11,  # 9 + 2 re-asks
        "http_requests": 17,  # 9 + 6 retries + 2 re-asks
        "cache_hits": 0,
    }
    assert {k: s[k] for k in expect} == expect
    assert server.requests == 17


@pytest.mark.parametrize(
    "fault,requests,http_errors,retries",
    [("500*all", 3, 3, 2), ("400*all", 1, 1, 0), ("delay*all", 3, 0, 2)],
)
def test_exhausted_or_fatal_requests_fall_back_without_reask(server, fault, requests,
                                                             http_errors, retries):
    judge = make(server, {"max_reasks": 2}, max_retries=2)
    reqs = [CheckRequest("q", f"FAULT[{fault}] paris", "paris"),
            CheckRequest("q", "paris", "paris")]
    res = bounded(lambda: judge.check(reqs), 20)
    assert res == [CheckResult(False, 0.5, True), CheckResult(True, 1.0)]
    s = judge.stats()
    assert (s["http_requests"], s["http_errors"], s["retries"]) == (requests + 1, http_errors,
                                                                     retries)
    assert s["timeouts"] == (3 if fault.startswith("delay") else 0)
    assert (s["failed_requests"], s["backend_errors"], s["fallbacks"], s["reasks"]) == (1, 1, 1, 0)


def test_induce_and_consolidate_fallbacks_are_marked(server):
    # A failed induction / consolidation is FallbackDrafts (== ()), not an answer "nothing in
    # common", so the rubric memory can keep the drafts it sent.
    judge = make(server, max_retries=0)
    ok, bad = bounded(lambda: judge.consolidate([
        ConsolidateRequest((Draft("Plan", "p"),)),
        ConsolidateRequest((Draft("FAULT[400*all] Plan", "p"),)),
    ]))
    assert ok and not isinstance(ok, FallbackDrafts)
    assert isinstance(bad, FallbackDrafts) and bad == ()
    (bad,) = bounded(lambda: judge.induce([InduceRequest("FAULT[400*all] q", "b", None, "w")]))
    assert isinstance(bad, FallbackDrafts)
    assert judge.stats()["fallbacks_consolidate"] == judge.stats()["fallbacks_induce"] == 1


class CannedServer(FakeJudgeServer):
    """Answers every chat request with HTTP 200 and the next canned ``(headers, raw body)``
    (the last one repeats): for bodies the fake judge never sends."""

    def __init__(self, replies: list[tuple[dict[str, str], bytes]]):
        super().__init__()
        self.replies = replies

    def _handle(self, h) -> None:
        h.rfile.read(int(h.headers.get("Content-Length") or 0))
        with self.lock:
            self.requests += 1
            headers, raw = self.replies[min(self.requests, len(self.replies)) - 1]
        self._send(h, 200, None, raw=raw, headers=headers)


def _reply(content: str, **extra) -> bytes:
    return json.dumps({"choices": [{"message": {"content": content}, **extra}]}).encode()


MET = _reply(json.dumps({"explanation": "x", "criteria_met": True}))
BAD_BODIES = {
    "message is a string": ({}, b'{"choices": [{"message": "hello"}]}'),
    "usage is a number": ({}, b'{"choices": [{"message": {"content": "x"}}], "usage": 5}'),
    "token count is text": ({}, b'{"choices": [{"message": {"content": "x"}}], '
                                b'"usage": {"prompt_tokens": "many"}}'),
    "choices is a string": ({}, b'{"choices": "none"}'),
    "body is a list": ({}, b"[1, 2]"),
    # httpx raises DecodingError (a RequestError, not a TransportError) inside client.post
    "gzip header, plain body": ({"Content-Encoding": "gzip"}, MET),
}


@pytest.mark.parametrize("name", list(BAD_BODIES))
def test_wrongly_shaped_or_undecodable_bodies_are_retried_then_fall_back(name):
    bad = BAD_BODIES[name]
    with CannedServer([bad]) as srv:
        judge = make(srv, max_retries=2)
        res = bounded(lambda: judge.check([CheckRequest("q", "paris", "paris")]))
        assert res == [CheckResult(False, 0.5, True)]
        s = judge.stats()
        assert (s["bad_responses"], s["retries"], s["failed_requests"]) == (3, 2, 1)
        assert (s["backend_errors"], s["fallbacks"], s["transport_errors"]) == (1, 1, 0)
        assert srv.requests == 3
    with CannedServer([bad, ({}, MET)]) as srv:  # a retry recovers
        judge = make(srv, max_retries=2)
        res = bounded(lambda: judge.check([CheckRequest("q", "paris", "paris")]))
        assert res == [CheckResult(True, 1.0)]
        assert (judge.stats()["bad_responses"], judge.stats()["retries"]) == (1, 1)


@pytest.mark.parametrize("logprobs", [
    {"content": ["Yes"]},  # an entry that is not an object
    {"content": [{"token": "Yes", "logprob": None}]},
    {"content": [{"top_logprobs": "Yes"}]},
    {"top_logprobs": ["Yes"]},  # legacy format, entry not an object
])
def test_wrongly_shaped_logprobs_are_bad_responses(logprobs):
    with CannedServer([({}, _reply("Yes", logprobs=logprobs))]) as srv:
        backend = make(srv, max_retries=1).backend
        out = bounded(lambda: backend.choice_probs([[{"role": "user", "content": "q"}]]))
        assert out == [{}]
        s = backend.stats()
        assert (s["bad_responses"], s["failed_requests"], s["logprob_unsupported"]) == (2, 1, 1)


def test_connection_refused_is_counted_and_does_not_hang():
    with FakeJudgeServer() as srv:
        url = srv.base_url  # the port is free again once the server stops
    judge = LLMJudge(OpenAIBackend(OpenAIConfig(
        base_url=url, api_key_env=None, timeout_s=0.5, max_retries=1, backoff_base_s=0.01
    )))
    (b,) = bounded(lambda: judge.bundle([BundleRequest("p", ("a", "b", "c"), (1, 1, 1))]))
    assert not b.ok and "backend error" in b.error
    s = judge.stats()
    assert (s["transport_errors"], s["failed_requests"], s["fallbacks_bundle"]) == (2, 1, 1)


def test_concurrency_is_bounded():
    with FakeJudgeServer(base_delay_s=0.2) as srv:
        judge = make(srv, max_concurrency=3, timeout_s=5)
        reqs = [CheckRequest("q", f"resp {i}", "resp") for i in range(12)]
        t0 = time.monotonic()
        res = bounded(lambda: judge.check(reqs))
        assert all(r.met for r in res)
        assert 2 <= srv.max_inflight <= 3
        assert time.monotonic() - t0 >= 0.8 - 0.05  # at least 4 waves of 0.2 s


# --- cache and tokens ---------------------------------------------------------------------------


def test_cache_hits_on_repeat_without_http(server, tmp_path):
    judge = make(server, cache_dir=str(tmp_path))
    reqs = [CheckRequest("q", f"paris {i}", "paris") for i in range(3)]
    pair = [PairRequest("q", "GOOD", "bad", "r")]
    first = bounded(lambda: judge.check(reqs)), bounded(lambda: judge.compare(pair))
    assert server.requests == 4
    tokens = judge.stats()["prompt_tokens"], judge.stats()["completion_tokens"]
    assert tokens == (server.prompt_tokens, server.completion_tokens) and tokens[0] > 0
    second = bounded(lambda: judge.check(reqs)), bounded(lambda: judge.compare(pair))
    assert second == first and server.requests == 4
    s = judge.stats()
    assert s["cache_hits"] == 4 and s["http_requests"] == 4
    assert (s["prompt_tokens"], s["completion_tokens"]) == tokens  # hits cost nothing
    # on disk: a fresh backend on the same folder makes no call either
    fresh = make(server, cache_dir=str(tmp_path))
    assert bounded(lambda: fresh.check(reqs)) == first[0] and server.requests == 4
    assert len(list(Path(tmp_path).rglob("*.json"))) == 4
    # identical requests inside one batch are sent once
    dup = [CheckRequest("q", "dup paris", "paris")] * 3
    assert [r.met for r in bounded(lambda: fresh.check(dup))] == [True] * 3
    assert server.requests == 5 and fresh.stats()["cache_hits"] == 3 + 2
    # sampled (temperature > 0) requests are not cached by default
    hot = make(server, {"temperature": 0.7}, cache_dir=str(tmp_path))
    bounded(lambda: hot.check(reqs[:1]))
    bounded(lambda: hot.check(reqs[:1]))
    assert server.requests == 7 and hot.stats()["cache_hits"] == 0


def test_cache_key_covers_model_and_sampling(server, tmp_path):
    reqs = [CheckRequest("q", "paris", "paris")]
    bounded(lambda: make(server, cache_dir=str(tmp_path)).check(reqs))
    bounded(lambda: make(server, cache_dir=str(tmp_path), model="other").check(reqs))
    bounded(lambda: make(server, {"max_tokens": 64}, cache_dir=str(tmp_path)).check(reqs))
    bounded(lambda: make(server, cache_dir=str(tmp_path), seed=1).check(reqs))
    assert server.requests == 4
    bounded(lambda: make(server, cache_dir=str(tmp_path), seed=1).check(reqs))
    assert server.requests == 4


def test_cache_key_covers_the_server_address_but_not_the_api_key(monkeypatch, tmp_path):
    # conf/judge/openai.yaml: model "default", seed 0, one cache folder for every server. A
    # verdict of one server must not be replayed for another; the key does not matter.
    reqs = [CheckRequest("q", "paris", "paris")]
    with FakeJudgeServer() as a, FakeJudgeServer() as b:
        bounded(lambda: make(a, cache_dir=str(tmp_path), model="default", seed=0).check(reqs))
        bounded(lambda: make(b, cache_dir=str(tmp_path), model="default", seed=0).check(reqs))
        assert (a.requests, b.requests) == (1, 1)
        monkeypatch.setenv("JUDGE_TEST_KEY", SECRET)
        again = make(b, cache_dir=str(tmp_path), model="default", seed=0,
                     api_key_env="JUDGE_TEST_KEY")
        assert bounded(lambda: again.check(reqs))[0].met and b.requests == 1
        assert again.stats()["cache_hits"] == 1


# --- secrets --------------------------------------------------------------------------------------


def test_api_key_is_sent_but_never_logged_reprd_or_cached(monkeypatch, caplog, tmp_path):
    monkeypatch.setenv("JUDGE_TEST_KEY", SECRET)
    caplog.set_level(logging.DEBUG)  # every logger, httpx/httpcore included
    with FakeJudgeServer(api_key=SECRET) as srv:
        judge = make(srv, api_key_env="JUDGE_TEST_KEY", cache_dir=str(tmp_path), max_retries=1)
        reqs = [CheckRequest("q", "paris", "paris"), CheckRequest("q", "FAULT[500*all]", "x")]
        res = bounded(lambda: judge.check(reqs))
        assert res[0] == CheckResult(True, 1.0) and res[1].fallback
        assert srv.auth_headers and all(h == f"Bearer {SECRET}" for h in srv.auth_headers)
    assert "judge request failed" in caplog.text  # logging was captured...
    assert SECRET not in caplog.text  # ...and never shows the key
    backend = judge.backend
    for text in (repr(judge), repr(backend), str(backend), repr(backend.config),
                 repr(vars(backend)), repr(judge.stats())):
        assert SECRET not in text
    assert SECRET.encode() not in pickle.dumps(backend._key)
    files = [p for p in Path(tmp_path).rglob("*") if p.is_file()]
    assert files and all(SECRET.encode() not in p.read_bytes() for p in files)


def test_secret_roundtrip_and_missing_key(monkeypatch):
    monkeypatch.setenv("JUDGE_TEST_KEY", SECRET)
    s = _Secret("JUDGE_TEST_KEY")
    assert s.reveal() == SECRET and "***" in repr(s) and SECRET not in str(s)
    assert pickle.loads(pickle.dumps(s)).reveal() == SECRET  # re-read from the env
    monkeypatch.delenv("JUDGE_TEST_KEY")
    assert not _Secret("JUDGE_TEST_KEY") and _Secret(None).reveal() is None
    with FakeJudgeServer(api_key=SECRET) as srv:  # key missing: 401, not retried, fallback
        judge = make(srv, api_key_env="JUDGE_TEST_KEY")
        (r,) = bounded(lambda: judge.check([CheckRequest("q", "paris", "paris")]))
        assert r.fallback and srv.auth_headers == [None]
        assert judge.stats()["http_errors"] == 1 and judge.stats()["retries"] == 0


# --- factory and event loops ----------------------------------------------------------------------


def test_make_judge_openai(server):
    judge = make_judge({
        "name": "openai", "base_url": server.base_url, "model": "fake", "api_key_env": None,
        "max_reasks": 0, "check_mode": "logprob", "timeout_s": 5, "max_concurrency": 2,
    })
    assert isinstance(judge, LLMJudge) and judge.max_reasks == 0
    assert judge.backend.config.max_concurrency == 2
    assert judge.versions()["check"] == "check-v1"
    assert bounded(lambda: judge.check([CheckRequest("q", "paris", "paris")]))[0].met
    with pytest.raises(ValueError, match="unknown OpenAI judge option"):
        make_judge({"name": "openai", "base_ulr": "http://x"})
    judge.close()


def test_sync_api_inside_a_running_event_loop(server):
    judge = make(server)

    async def main():
        sync = judge.check([CheckRequest("q", "paris", "paris")])  # e.g. from a notebook
        comps = await judge.backend.acomplete([[{"role": "user", "content": "hi"}]], 8, 0.0)
        return sync, comps

    sync, comps = bounded(lambda: asyncio.run(main()))
    assert sync[0].met and comps[0].error is None and comps[0].completion_tokens > 0


# --- circuit breaker (issue 22: a hung judge cost ~8 x timeout_s per step) ----------------------


def _hung_batch(srv: FakeJudgeServer, breaker_timeouts: int, **kw) -> tuple[float, dict]:
    judge = make(srv, timeout_s=0.3, max_concurrency=8, breaker_timeouts=breaker_timeouts,
                 breaker_cooldown_s=kw.pop("cooldown", 60.0), **kw)
    reqs = [CheckRequest("q", f"resp {i}", "resp") for i in range(16)]
    t0 = time.monotonic()
    res = bounded(lambda: judge.check(reqs), seconds=60)
    assert all(r.fallback for r in res)  # every item on its defined fallback
    return time.monotonic() - t0, judge


def test_a_hung_judge_costs_about_one_timeout_per_step_with_the_breaker():
    with FakeJudgeServer(base_delay_s=30.0) as srv:  # answers nothing within any timeout
        # without the breaker: 2 waves of 8, 4 attempts of 0.3 s each, >= 2.4 s
        slow, _ = _hung_batch(srv, breaker_timeouts=0)
        assert slow >= 8 * 0.3 - 0.05
        fast, judge = _hung_batch(srv, breaker_timeouts=3)
        s = judge.stats()
        assert fast < 2 * 0.3 + 0.4  # the first wave (and at most one more attempt)
        assert s["breaker_opens"] >= 1 and s["failed_requests"] == 16
        assert s["breaker_rejected"] >= 8 and s["timeouts"] <= 9
        # the next step, inside the cool-down: nothing is sent, nothing waits
        t0 = time.monotonic()
        bounded(lambda: judge.check([CheckRequest("q", "r", "r")] * 3))
        assert time.monotonic() - t0 < 0.2
        assert judge.stats()["timeouts"] == s["timeouts"]


def test_after_the_cooldown_one_probe_tests_the_server_and_an_answer_closes_it():
    with FakeJudgeServer(base_delay_s=30.0) as srv:
        _, judge = _hung_batch(srv, breaker_timeouts=2, cooldown=0.5)
        opens = judge.stats()["breaker_opens"]
        time.sleep(0.5)
        t0 = time.monotonic()
        bounded(lambda: judge.check([CheckRequest("q", f"r{i}", "r") for i in range(8)]))
        assert time.monotonic() - t0 < 0.3 + 0.3  # one probe's timeout, the rest refused
        assert judge.stats()["breaker_opens"] == opens + 1
        srv.base_delay_s = 0.0  # the server recovers
        time.sleep(0.5)
        (r,) = bounded(lambda: judge.check([CheckRequest("q", "resp", "resp")]))
        assert r.met and not r.fallback
        assert all(r.met for r in bounded(lambda: judge.check(
            [CheckRequest("q", f"resp {i}", "resp") for i in range(4)])))
