"""check_dimensions: one call per response with every dimension paragraph (the ProRubric
authors' judge): the LLM judge's prompt, parsing, attempt/temperature schedule and counters
against a scripted backend; the rule judge's conjunction of sub-rules."""

from __future__ import annotations

import json

import pytest

from judges.llm import LLMJudge
from judges.parsing import ParseError, parse_dimension_grades, parse_dimension_verdicts
from judges.rule import RuleJudge
from judges.types import Completion, DimensionCriterion, DimensionRequest


class ScriptedBackend:
    """Answers each call with the next scripted text; records (n, temperature) per batch."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.calls: list[tuple[int, float]] = []
        self.messages: list = []

    def complete(self, batch, max_tokens, temperature):
        self.calls.append((len(batch), temperature))
        self.messages += list(batch)
        out = []
        for _ in batch:
            r = self.replies.pop(0)
            out.append(Completion(text="", error=r[1]) if isinstance(r, tuple) else
                       Completion(text=r))
        return out

    def stats(self):
        return {}


def _req(n=2, **kw):
    crits = tuple(DimensionCriterion(f"paragraph {k}", w)
                  for k, w in zip(range(n), (3.0, -2.0, 1.0)))
    return DimensionRequest("the question", "the answer", crits, **kw)


def _ok(*vals):
    return json.dumps({"satisfied": {str(i + 1): v for i, v in enumerate(vals)}})


def test_one_call_per_response_with_every_criterion_numbered_and_pitfalls_marked():
    backend = ScriptedBackend([_ok(True, False)])
    res = LLMJudge(backend).check_dimensions([_req()])
    assert res[0].scores == (1.0, 0.0) and not res[0].failed and res[0].attempts == 1
    assert backend.calls == [(1, 0.0)]
    text = " ".join(m["content"] for m in backend.messages[0])
    assert "1. (weight 3) paragraph 0" in text
    assert "2. (PITFALL, weight -2) paragraph 1" in text
    assert "every one of them" in text  # the conjunction is the judge's


def test_attempts_first_greedy_then_at_the_retry_temperature_and_counted():
    backend = ScriptedBackend(["no json here", ("x", "HTTP 500"), _ok(False, True)])
    judge = LLMJudge(backend)
    res = judge.check_dimensions([_req()])
    assert [t for _, t in backend.calls] == [0.0, 0.7, 0.7]
    assert res[0].scores == (0.0, 1.0) and res[0].attempts == 3
    s = judge.stats()
    counts = (s["requests_dimensions"], s["retries_dimensions"], s["failures_dimensions"])
    assert counts == (1, 2, 0)
    assert s["parse_errors"] == 1 and s["backend_errors"] == 1


def test_three_failed_attempts_fail_the_call_and_the_batch_keeps_the_good_ones():
    backend = ScriptedBackend([_ok(True, True), "bad", '{"satisfied": {"1": true}}', "bad"])
    judge = LLMJudge(backend)
    res = judge.check_dimensions([_req(), _req()])
    assert res[0].scores == (1.0, 1.0) and not res[0].failed
    assert res[1].failed and res[1].scores == () and res[1].attempts == 3
    assert "no JSON object" in res[1].error  # the last attempt's complaint
    assert backend.calls == [(2, 0.0), (1, 0.7), (1, 0.7)]
    assert judge.stats()["failures_dimensions"] == 1


def test_a_request_temperature_holds_for_every_attempt_and_graded_scores_are_thirds():
    grades = json.dumps({"grades": {"1": 2, "2": 3}})
    backend = ScriptedBackend(["oops", grades])
    res = LLMJudge(backend).check_dimensions([_req(verdict="graded", temperature=0.7)])
    assert [t for _, t in backend.calls] == [0.7, 0.7]
    assert res[0].scores == pytest.approx((2 / 3, 1.0))
    assert "0 to 3" in " ".join(m["content"] for m in backend.messages[0])


def test_dimension_attempts_is_an_option():
    backend = ScriptedBackend(["bad"])
    res = LLMJudge(backend, dimension_attempts=1).check_dimensions([_req()])
    assert res[0].failed and len(backend.calls) == 1
    with pytest.raises(ValueError, match="dimension_attempts"):
        LLMJudge(backend, dimension_attempts=0)


@pytest.mark.parametrize("text, want", [
    ('{"satisfied": {"2": false, "1": true}}', (True, False)),
    ('```json\n{"satisfied": [true, "no"]}\n```', (True, False)),
    ('<think>hmm</think> {"criteria_met": {"1": 1, "2": 0}}', (True, False)),
])
def test_parse_dimension_verdicts(text, want):
    assert parse_dimension_verdicts(text, 2) == want


@pytest.mark.parametrize("text, msg", [
    ('{"satisfied": {"1": true}}', "exactly once"),
    ('{"satisfied": {"1": true, "2": true, "3": false}}', "exactly once"),
    ('{"satisfied": [true]}', "2 verdicts"),
    ('{"satisfied": {"1": true, "2": "maybe"}}', "true or false"),
    ('{"satisfied": {"a": true, "2": true}}', "criterion numbers"),
])
def test_parse_dimension_verdicts_refuses(text, msg):
    with pytest.raises(ParseError, match=msg):
        parse_dimension_verdicts(text, 2)


def test_parse_dimension_grades():
    assert parse_dimension_grades('{"grades": {"1": 0, "2": "3"}}', 2) == (0, 3)
    with pytest.raises(ParseError, match="0 to 3"):
        parse_dimension_grades('{"grades": {"1": 4, "2": 1}}', 2)
    with pytest.raises(ParseError, match="0 to 3"):
        parse_dimension_grades('{"grades": {"1": true, "2": 1}}', 2)


# --- rule judge: the conjunction of a dimension's sub-rules -----------------------------------


def _rule_req(rules, verdict="binary", response="alpha beta"):
    return DimensionRequest("q", response, (DimensionCriterion("paragraph", 1.0, rules),),
                            verdict)


@pytest.mark.parametrize("response, want", [
    ("alpha beta", 1.0),     # every sub-rule holds
    ("alpha", 0.0),          # one positive item missing
    ("alpha beta gamma", 0.0),  # the pitfall / failure clause fires
])
def test_rule_judge_verdict_is_the_conjunction(response, want):
    rules = ("contains:alpha", "contains:beta", "not:contains:gamma")
    res = RuleJudge().check_dimensions([_rule_req(rules, response=response)])
    assert res[0].scores == (want,)


def test_rule_judge_negation_covers_a_whole_conjunction():
    rules = ("not:contains:alpha && contains:beta",)  # NOT (alpha and beta)
    got = [RuleJudge().check_dimensions([_rule_req(rules, response=t)])[0].scores[0]
           for t in ("alpha beta", "alpha", "beta", "")]
    assert got == [0.0, 1.0, 1.0, 1.0]


def test_rule_judge_graded_and_unreadable_rules():
    rules = ("contains:alpha", "contains:beta", "contains:gamma")
    res = RuleJudge().check_dimensions([_rule_req(rules, "graded")])
    assert res[0].scores == pytest.approx((2 / 3,))  # floor(3 * 2/3) / 3
    judge = RuleJudge()
    bad = judge.check_dimensions([_rule_req(("contains:alpha", "what is this"))])
    assert bad[0].failed and judge.stats()["failures_dimensions"] == 1
    # no sub-rules: the criterion text itself is the rule
    plain = DimensionRequest("q", "alpha", (DimensionCriterion("contains:alpha", 1.0),))
    assert RuleJudge().check_dimensions([plain])[0].scores == (1.0,)
