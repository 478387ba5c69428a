"""In-process JAX judge backend: every judge operation through ``LLMJudge(JaxBackend)``.

On the ``tiny`` preset (random weights) the tests check batching, order, counters and
fallbacks, not judgment quality. On the shipped SmolLM2-135M they check that the logprob path
reads the right position and tokens: instruction-following answers, agreement with llama.cpp on
the same GGUF, and batched == one-by-one.
"""

from __future__ import annotations

import math

import numpy as np
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
    PairRequest,
    make_judge,
)
from judges import prompts as P
from judges.base import order_coin
from judges.local import JaxBackend
from models import load_params

Q = "Which country is the birthplace of the director of Inception?"
TRAJ = ("<think>Find the director.</think><search>Inception director</search>"
        "<information>Directed by Christopher Nolan, born in London.</information>"
        "<answer>England</answer>")


def _load(name: str):
    return load_params(name)


@pytest.fixture(scope="module")
def tiny():
    return _load("tiny")


@pytest.fixture(scope="module")
def shipped():
    return _load("smollm2_135m")


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _assert_close(a: list[dict[str, float]], b: list[dict[str, float]], tol: float) -> None:
    assert [sorted(x) for x in a] == [sorted(y) for y in b]
    for x, y in zip(a, b):
        for k in x:
            assert abs(x[k] - y[k]) <= tol, (k, x[k], y[k])


# --- tiny preset: mechanics ------------------------------------------------------------------


def test_choice_probs_batching_order_dedupe_and_counters(tiny):
    backend = JaxBackend(tiny, max_batch=4)
    convs = [_user(f"question number {i} " + "word " * (3 * i)) for i in range(6)]
    convs.append(convs[2])  # duplicate: scored once
    batched = backend.choice_probs(convs, ("Yes", "No"))
    s = backend.stats()
    assert len(batched) == 7 and batched[6] == batched[2]
    assert all(set(p) == {"Yes", "No"} and math.isclose(sum(p.values()), 1.0) for p in batched)
    assert s["backend_calls"] == 7 and s["cache_hits"] == 1
    assert s["forward_passes"] == 2  # 6 unique prompts in chunks of <= 4
    assert s["generate_calls"] == 0 and s["completion_tokens"] == 0
    assert s["prompt_tokens"] > 0 and s["logprob_unsupported"] == 0

    single = [backend.choice_probs([c], ("Yes", "No"))[0] for c in convs[:6]]
    _assert_close(batched[:6], single, 1e-5)
    # the random model still gives different prompts different probabilities: order matters
    assert len({round(p["Yes"], 7) for p in batched[:6]}) > 1


def test_choice_tables(tiny):
    backend = JaxBackend(tiny)
    ab = backend.choice_probs([_user("A or B?")], ("A", "B"))[0]
    assert set(ab) == {"A", "B"} and math.isclose(sum(ab.values()), 1.0)
    (d12,) = backend.choice_probs([_user("1 or 2?")], ("1", "2"))  # a logprob compare's choices
    assert set(d12) == {"1", "2"} and math.isclose(sum(d12.values()), 1.0)
    # two choices with the same tokens cannot be told apart: no probabilities, counted
    assert backend.choice_probs([_user("x"), _user("y")], ("Yes", "yes")) == [{}, {}]
    assert backend.stats()["logprob_unsupported"] == 2
    # a threshold on the choices' total mass rejects a model that does not answer with them
    picky = JaxBackend(tiny, min_choice_mass=0.5)
    assert picky.choice_probs([_user("x")], ("Yes", "No")) == [{}]


def test_logprob_checks_need_one_forward_pass_and_no_generation(tiny):
    judge = LLMJudge(JaxBackend(tiny, max_batch=8), check_mode="logprob")
    reqs = [CheckRequest(Q, TRAJ, f"Criterion {i}: searches before answering.") for i in range(5)]
    res = judge.check(reqs)
    s = judge.stats()
    assert len(res) == 5 and not any(r.fallback for r in res)
    assert all(0.0 < r.prob < 1.0 and r.met == (r.prob >= 0.5) for r in res)
    assert s["forward_passes"] == 1 and s["generate_calls"] == 0 and s["fallbacks"] == 0
    assert s["requests_check"] == 5 and s["backend_calls"] == 5


def test_logprob_compare_is_one_forward_pass_and_respects_order(tiny):
    backend = JaxBackend(tiny, max_batch=8)
    judge = LLMJudge(backend, compare_mode="logprob", seed=3)
    reqs = [PairRequest(Q, TRAJ, f"{TRAJ} (variant {i})", "Searches before answering.")
            for i in range(6)]
    res = judge.compare(reqs)
    s = judge.stats()
    assert s["forward_passes"] == 1 and s["generate_calls"] == 0 and s["fallbacks"] == 0
    assert [r.a_shown_first for r in res] == [order_coin(3, r) for r in reqs]
    for r, req in zip(res, reqs):
        assert 0.0 < r.prob_a < 1.0 and r.winner == (0 if r.prob_a > 0.5 else 1)
        # P(a better) is read from the position a was shown in
        first, second = (req.a, req.b) if r.a_shown_first else (req.b, req.a)
        (p,) = backend.choice_probs([P.COMPARE_12.render(
            context=req.context, rubric=req.rubric, first=first, second=second)], ("1", "2"))
        expect = p["1"] if r.a_shown_first else p["2"]
        assert abs(r.prob_a - expect) < 1e-5


def test_every_text_operation_completes_with_fallbacks(tiny):
    # Random weights write random tokens: every JSON answer fails to parse and falls back
    # (after one re-ask for checks). Checks batching, order and that the counters add up. Two
    # judges share one backend: re-asking everything would only add prompt shapes to compile.
    backend = JaxBackend(tiny, max_batch=4, max_new_tokens=6)
    judge = LLMJudge(backend, max_reasks=1, max_tokens=512, seed=0)
    once = LLMJudge(backend, max_reasks=0, max_tokens=512, seed=0)
    checks = judge.check([CheckRequest(Q, TRAJ, "Searches first."),
                          CheckRequest(Q, "<answer>France</answer>", "Searches first.")])
    pairs_in = [PairRequest(Q, TRAJ, "<answer>France</answer>", Draft("Evidence", "Uses it.")),
                PairRequest(Q, "<answer>France</answer>", TRAJ, "Reasons first.")]
    pairs = once.compare(pairs_in)
    induced = once.induce([InduceRequest(Q, TRAJ, None, "<answer>France</answer>", ("England",))])
    common = once.consolidate([ConsolidateRequest((Draft("a", "b"), Draft("c", "d"))),
                               ConsolidateRequest(())])  # empty: no call
    bundles = once.bundle([BundleRequest("p", ("x", "y", "z"), (1.0, 2.0, -1.0)),
                           BundleRequest("p", ("only",), (1.0,))])  # singleton: no call
    equiv = once.equivalent([EquivRequest(Q, "the UK", ("England",)),
                             EquivRequest(Q, "England", ("England",))])  # exact: no call

    assert [r.fallback for r in checks] == [True, True] and all(r.prob == 0.5 for r in checks)
    assert [r.a_shown_first for r in pairs] == [order_coin(0, p) for p in pairs_in]
    assert all(r.fallback and r.winner == -1 and r.tie_break in (0, 1) for r in pairs)
    assert induced == [()] and common == [(), ()]
    assert not bundles[0].ok and bundles[1].ok and len(bundles[1].dimensions) == 1
    assert equiv[0].fallback and not equiv[0].equivalent
    assert equiv[1].equivalent and not equiv[1].fallback

    s, t = judge.stats(), once.stats()  # judge counters apart, backend counters shared
    assert [s[f"requests_{op}"] for op in OPS] == [2, 0, 0, 0, 0, 0, 0]
    assert [t[f"requests_{op}"] for op in OPS] == [0, 2, 1, 2, 2, 2, 0]
    assert s["fallbacks"] == 2 and s["reasks"] == 2 and s["parse_errors"] == 4
    assert t["fallbacks"] == 6 and t["reasks"] == 0 and t["parse_errors"] == 6
    assert s["backend_errors"] == t["backend_errors"] == 0
    assert s["backend_calls"] == 2 + 2 + 6 and s["generate_calls"] == 2 + 5
    assert 0 < s["completion_tokens"] <= 6 * s["backend_calls"]
    assert s["decode_steps"] <= 6 * s["generate_calls"]
    assert s["http_requests"] == 0 and s["forward_passes"] == 0


def test_complete_batched_equals_one_by_one_and_sampling_is_seeded(tiny):
    backend = JaxBackend(tiny, max_batch=2, max_new_tokens=8)
    convs = [_user("hello"), _user("hello there"), _user("hello")]
    batched = backend.complete(convs, max_tokens=8, temperature=0.0)
    assert backend.stats()["generate_calls"] == 1 and backend.stats()["cache_hits"] == 1
    assert batched[2].cached and batched[2].text == batched[0].text
    single = [backend.complete([c], 8, 0.0)[0] for c in convs]
    assert [c.text for c in batched] == [c.text for c in single]
    assert all(c.prompt_tokens > 0 and 0 < c.completion_tokens <= 8 for c in batched)

    a = JaxBackend(tiny, seed=3, max_new_tokens=8).complete(convs[:2], 8, 1.0)
    b = JaxBackend(tiny, seed=3, max_new_tokens=8).complete(convs[:2], 8, 1.0)
    assert [c.text for c in a] == [c.text for c in b]


def test_prompt_too_long_falls_back(tiny):
    # the short check's prompts are ~100 (Yes/No) and ~150 (JSON) tokens, the long one's > 250
    backend = JaxBackend(tiny, max_prompt_tokens=200, max_new_tokens=4)
    judge = LLMJudge(backend, check_mode="logprob")
    long = CheckRequest(Q, "word " * 200, "Is concise.")
    short = CheckRequest("q", "a", "c")
    res = judge.check([long, short])
    s = judge.stats()
    assert res[0].fallback and res[0].prob == 0.5 and not res[1].fallback
    assert 0.0 < res[1].prob < 1.0
    # the long item was refused by choice_probs, then by complete: a backend error, no re-ask
    assert s["prompt_too_long"] == 2 and s["backend_errors"] == 1 and s["reasks"] == 0
    assert s["logprob_unsupported"] == 1 and s["fallbacks_check"] == 1
    (comp,) = backend.complete([_user("word " * 300)], 4, 0.0)
    assert comp.error and "too long" in comp.error and comp.text == ""


def test_registry_and_close(tiny):
    judge = make_judge({"name": "local", "model": "tiny", "check_mode": "logprob",
                        "max_batch": 4, "max_new_tokens": 8, "seed": 5})
    assert isinstance(judge, LLMJudge) and isinstance(judge.backend, JaxBackend)
    assert judge.backend.seed == 5 and judge.seed == 5 and judge.check_mode == "logprob"
    with pytest.raises(ValueError, match="unknown local judge option"):
        make_judge({"name": "local", "model": "tiny", "max_bacth": 4})
    judge.close()
    judge.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        judge.backend.choice_probs([_user("x")])


# --- shipped SmolLM2-135M: the logprob path reads the right tokens ----------------------------


@pytest.mark.slow
def test_shipped_choice_probs_follow_instructions_and_batch(shipped):
    backend = JaxBackend(shipped, max_batch=8)
    convs = [_user("Reply with the single word Yes."), _user("Reply with the single word No."),
             _user("Repeat after me: Yes"), _user("Repeat after me: No")]
    yn = backend.choice_probs(convs, ("Yes", "No"))
    assert all(math.isclose(sum(p.values()), 1.0, abs_tol=1e-9) for p in yn)
    assert yn[0]["Yes"] > 0.7 and yn[1]["No"] > 0.7
    assert yn[2]["Yes"] > 0.7 and yn[3]["No"] > 0.7
    single = [backend.choice_probs([c], ("Yes", "No"))[0] for c in convs]
    _assert_close(yn, single, 1e-5)

    ab = backend.choice_probs([_user("Reply with the single letter A."),
                               _user("Reply with the single letter B.")], ("A", "B"))
    assert ab[0]["A"] > 0.6 and ab[1]["B"] > 0.6
    assert backend.stats()["generate_calls"] == 0


@pytest.mark.slow
def test_shipped_choice_probs_agree_with_llamacpp(shipped):
    # SmolLM2-135M is biased towards "No" on factual yes/no questions (P(Yes) ~ 0.15 for "Is
    # Paris the capital of France?"): llama.cpp on the same GGUF says the same, which is what
    # this checks (quantised vs dequantised f32 compute: a few points of difference).
    import json
    import subprocess
    import sys

    from models.presets import shipped_gguf_path

    cfg, params, tok = shipped
    question = _user("Is Paris the capital of France? Answer Yes or No.")
    ours = JaxBackend(shipped).choice_probs([question], ("Yes", "No"))[0]

    # llama.cpp in its own process: a crash in its native code (it has segfaulted on AMX
    # CPUs) fails this test instead of killing the test run
    ids = tok.encode_chat(question)
    script = ("import json, sys, llama_cpp\n"
              "llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=256, logits_all=True, "
              "verbose=False)\n"
              "ids = json.loads(sys.argv[2])\n"
              "llm.eval(ids)\n"
              "print(json.dumps([float(x) for x in llm.scores[len(ids) - 1]]))\n")
    run = subprocess.run([sys.executable, "-c", script, str(shipped_gguf_path()),
                          json.dumps(ids)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    logits = np.asarray(json.loads(run.stdout.strip().splitlines()[-1]), np.float64)
    yes = [tok.encode(w)[0] for w in ("Yes", " Yes", "yes", " yes", "YES", " YES")
           if len(tok.encode(w)) == 1]
    no = [tok.encode(w)[0] for w in ("No", " No", "no", " no", "NO", " NO")
          if len(tok.encode(w)) == 1]
    p = np.exp(logits - logits.max())
    ref_yes = p[yes].sum() / (p[yes].sum() + p[no].sum())
    assert abs(ours["Yes"] - ref_yes) < 0.05, (ours, ref_yes)


def test_sampling_state_lets_a_restored_backend_sample_on(tiny):
    """#18: a resumed run's local judge samples what an uninterrupted one would."""
    convs = [_user("rate this answer"), _user("and this one")]
    straight = JaxBackend(tiny, seed=5, max_new_tokens=8)
    texts = [[c.text for c in straight.complete(convs, 8, 1.0)] for _ in range(3)]
    assert texts[1] != texts[2]  # each call samples anew
    first = JaxBackend(tiny, seed=5, max_new_tokens=8)
    for _ in range(2):
        first.complete(convs, 8, 1.0)
    saved = LLMJudge(first).sampling_state()
    assert saved == {"n_generate": 2}
    judge = LLMJudge(JaxBackend(tiny, seed=5, max_new_tokens=8))
    judge.restore_sampling_state(saved)
    assert [c.text for c in judge.backend.complete(convs, 8, 1.0)] == texts[2]
    with pytest.raises(ValueError, match="n_generate"):
        judge.restore_sampling_state({"n_generate": -1})
