"""Parsing of judge outputs, and LLMJudge's re-ask / fallback logic on a scripted backend."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from judges import (
    JUDGE_STAT_KEYS,
    PROMPT_VERSIONS,
    TEMPLATES,
    TIE,
    BundleRequest,
    CheckRequest,
    CheckResult,
    Completion,
    ConsolidateRequest,
    Draft,
    EquivRequest,
    InduceRequest,
    LLMJudge,
    PairRequest,
    ParseError,
)
from judges.parsing import (
    extract_json,
    parse_bundle,
    parse_check,
    parse_compare,
    parse_drafts,
    parse_equiv,
    parse_yesno,
    read_bundle,
)

CRITERIA = ("Mentions the dose", "Recommends a follow-up", "Avoids jargon", "Cites a source")

# --- extract_json ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '{"criteria_met": true}',
        '```json\n{"criteria_met": true}\n```',
        '```\n{"criteria_met": true}\n```\nLet me know if you need more.',
        'Sure. {"criteria_met": true} That is my verdict {with trailing braces}.',
        '<think>the set {a, b} matters</think>\n{"criteria_met": true}',
        'The sets {a} and {b}: {"criteria_met": true}',
        "{'criteria_met': True}",  # Python literal
        '{"explanation": "line one\nline two", "criteria_met": true}',  # raw newline in string
        '  \n{"explanation": "has \\"quotes\\" and } braces", "criteria_met": true}',
    ],
)
def test_extract_json_variants(text):
    assert extract_json(text)["criteria_met"] is True


@pytest.mark.parametrize("text", ["", "   ", "no json here", "{broken: ", "[1, 2]", None])
def test_extract_json_failures(text):
    with pytest.raises(ParseError):
        extract_json(text)


def test_extract_json_prefers_objects_over_prose_lists():
    assert extract_json('[1] see below {"rubrics": []}', kinds=(dict, list)) == {"rubrics": []}
    assert extract_json('noise [{"title": "t"}] end', kinds=(dict, list)) == [{"title": "t"}]


def test_unterminated_think_is_dropped():
    with pytest.raises(ParseError):
        extract_json('<think>{"criteria_met": true}')


# --- check / compare / equivalence -----------------------------------------------------------


@pytest.mark.parametrize(
    "text,met",
    [
        ('{"explanation": "x", "criteria_met": false}', False),
        ('{"Criteria_Met": "yes"}', True),
        ('{"met": 1}', True),
        ('{"criterion_met": "No."}', False),
    ],
)
def test_parse_check(text, met):
    assert parse_check(text) is met


@pytest.mark.parametrize(
    "text,msg",
    [
        ('{"explanation": "x", "verdict": true}', "missing key 'criteria_met'"),
        ('{"criteria_met": "maybe"}', "must be true or false"),
        ('{"criteria_met": 2}', "must be true or false"),
    ],
)
def test_parse_check_errors_explain(text, msg):
    with pytest.raises(ParseError, match=msg):
        parse_check(text)


@pytest.mark.parametrize(
    "value,shown",
    [("1", 1), (2, 2), ("tie", 0), ("Response 2", 2), ("TIE.", 0), (1.0, 1), ("neither", 0)],
)
def test_parse_compare(value, shown):
    assert parse_compare(json.dumps({"explanation": "e", "winner": value})) == shown


@pytest.mark.parametrize("value", ["3", True, None, "both are good but 1 is better"])
def test_parse_compare_out_of_range(value):
    with pytest.raises(ParseError, match="winner"):
        parse_compare(json.dumps({"winner": value}))


def test_parse_equiv_and_yesno():
    assert parse_equiv('```json\n{"equivalent": true}\n```') is True
    assert parse_equiv('{"is_equivalent": "false"}') is False
    with pytest.raises(ParseError):
        parse_equiv('{"same": true}')
    assert parse_yesno(" Yes, it does.") is True
    assert parse_yesno("<think>hmm</think>no") is False
    with pytest.raises(ParseError):
        parse_yesno("Maybe")


# --- drafts ----------------------------------------------------------------------------------


def test_parse_drafts_shapes():
    text = (
        'Here:\n```json\n{"rubrics": [{"title": "Plan first", "description": "Plans."},'
        ' {"title": "plan first!", "description": "dup"}, {"description": "no title"}, 7,'
        ' {"Title": "Verify", "Description": "Checks evidence."}]}\n```'
    )
    want = (Draft("Plan first", "Plans."), Draft("Verify", "Checks evidence."))
    assert parse_drafts(text, 5) == want
    assert parse_drafts(text, 1) == (Draft("Plan first", "Plans."),)
    assert parse_drafts('[{"title": "A", "description": "a"}]', 3) == (Draft("A", "a"),)
    assert parse_drafts('{"rubrics": []}', 3) == ()


@pytest.mark.parametrize(
    "text",
    ['{"rules": []}', '{"rubrics": "none"}', '{"rubrics": [{"description": "d"}, 3]}'],
)
def test_parse_drafts_errors(text):
    with pytest.raises(ParseError):
        parse_drafts(text, 3)


# --- bundle ----------------------------------------------------------------------------------


PARA = "A good answer gives the adult dose. It fails if it gives a dose for children."


def _bundle_json(*dims, key="atomic_indices", desc=PARA):
    rows = [{"name": f"d{j}", "description": desc, key: d, "failure_clause": None}
            for j, d in enumerate(dims)]
    return json.dumps({"criteria": rows})


def test_parse_bundle_valid_1_based_and_lenient_references():
    # the judge numbers items from 1; the parser returns 0-based indices
    dims = parse_bundle(_bundle_json([1, "2"], [3, 4]), CRITERIA)
    assert [d.indices for d in dims] == [(0, 1), (2, 3)]
    assert dims[0].description == PARA
    # exact criterion text and an echoed listing line are accepted as references
    dims = parse_bundle(
        _bundle_json(["Mentions the dose", "2. (weight 3) Recommends a follow-up"], [3, 4.0]),
        CRITERIA,
    )
    assert [d.indices for d in dims] == [(0, 1), (2, 3)]
    text = json.dumps(
        {
            "criteria": [
                {"name": "Safety", "description": PARA, "weight": 7,
                 "atomic_indices": [{"index": 1, "text": "Mentions the dose"}, 2],
                 "failure_clause": "gives a lethal dose"},
                {"description": PARA, "atomic_indices": [3, 4], "failure_clause": "null"},
            ]
        }
    )
    a, b = parse_bundle(text, CRITERIA)
    assert a == ("Safety", (0, 1), "gives a lethal dose", PARA, 7.0)
    assert b.name == "dimension 2" and b.failure_clause is None and b.weight is None
    # the legacy key names are read too
    legacy = json.dumps({"dimensions": [{"description": PARA, "criteria": [1, 2]},
                                        {"description": PARA, "indices": [3, 4]}]})
    assert [d.indices for d in parse_bundle(legacy, CRITERIA)] == [(0, 1), (2, 3)]
    # K = 1 when asked for
    (one,) = parse_bundle(_bundle_json([1, 2, 3, 4]), CRITERIA, k_min=1, k_max=1)
    assert one.indices == (0, 1, 2, 3)


@pytest.mark.parametrize(
    "text,msg",
    [
        (_bundle_json([1, 2], [3, 5]), "item 5 is out of range 1..4"),
        (_bundle_json([1, 0], [3, 4]), "item 0 is out of range 1..4"),
        (_bundle_json([1, 2], [2, 3, 4]), "item 2 is in more than one dimension"),
        (_bundle_json([1], [3, 4]), "items 2 are in no dimension"),
        (_bundle_json([1, 2, 3, 4]), "need 2 to 4 dimensions, got 1"),
        (_bundle_json([1], [2], [3], [4], [], []), "need 2 to 4"),
        (_bundle_json([1, 2], []), "has no items"),
        (_bundle_json(["Mentions the correct dose", 2], [3, 4]), "rewritten"),
        (_bundle_json(["1. (weight 1) Mentions a dose", 2], [3, 4]), "rewritten"),
        (
            json.dumps({"criteria": [{"description": PARA,
                                      "atomic_indices": [{"index": 1, "text": "Says dose"}, 2]},
                                     {"description": PARA, "atomic_indices": [3, 4]}]}),
            "rewritten",
        ),
        (_bundle_json([1, 2], [3, 4], key="items"), "needs an 'atomic_indices' list"),
        (json.dumps({"criteria": [{"description": PARA, "atomic_indices": [1, 2],
                                   "failure_clause": 3},
                                  {"description": PARA, "atomic_indices": [3, 4]}]}),
         "failure_clause"),
        (_bundle_json([1, 2], [3, 4], desc=""), "description is empty"),
        (_bundle_json([1, 2], [3, 4], desc="One sentence only."), "has 1 sentence, need 2"),
        (_bundle_json([1, 2], [3, 4], desc="Say A. " * 11), "has 11 sentences"),
        ('{"groups": "all"}', "must be a list"),
    ],
)
def test_parse_bundle_rejects(text, msg):
    with pytest.raises(ParseError, match=re.escape(msg)):
        parse_bundle(text, CRITERIA)


def test_read_bundle_keeps_the_invalid_proposal_for_repair():
    dims, problems = read_bundle(_bundle_json([1, 2, 9], [2, 3]), CRITERIA)
    assert [d.indices for d in dims] == [(0, 1, 8), (1, 2)]  # 0-based, nothing dropped
    assert problems == ["dimension 'd0': item 9 is out of range 1..4",
                        "item 2 is in more than one dimension",
                        "items 4 are in no dimension; each must appear once"]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_parsers_only_raise_parse_error(text):
    """Arbitrary model output never escapes as anything but ParseError."""
    for parse in (
        parse_check,
        parse_compare,
        parse_equiv,
        parse_yesno,
        lambda t: parse_drafts(t, 3),
        lambda t: parse_bundle(t, CRITERIA),
    ):
        try:
            parse(text)
        except ParseError:
            pass


@settings(max_examples=100, deadline=None)
@given(
    st.text(alphabet=st.characters(blacklist_characters="{}[]`<>'\""), max_size=80),
    st.booleans(),
    st.text(alphabet=st.characters(blacklist_characters="{}[]`<>'\""), max_size=80),
)
def test_check_answer_survives_surrounding_prose(before, met, after):
    text = before + json.dumps({"explanation": "ok", "criteria_met": met}) + after
    assert parse_check(text) is met


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 12).flatmap(lambda n: st.tuples(st.just(n), st.permutations(range(n)))),
       st.integers(2, 5))
def test_parse_bundle_accepts_any_valid_partition(n_perm, k):
    n, perm = n_perm
    k = min(k, n)
    crit = tuple(f"criterion {i}" for i in range(n))
    dims = [[i + 1 for i in perm[j::k]] for j in range(k)]
    parsed = parse_bundle(_bundle_json(*dims), crit)
    assert sorted(i for d in parsed for i in d.indices) == list(range(n))


# --- prompts ---------------------------------------------------------------------------------


def test_prompt_versions_cover_every_template():
    assert set(PROMPT_VERSIONS) == set(TEMPLATES)
    assert all(v.startswith(k) for k, v in PROMPT_VERSIONS.items())
    msgs = TEMPLATES["check"].render(context="{ctx}", response="{r}", criterion="c {x}")
    assert "{ctx}" in msgs[1]["content"] and '"criteria_met"' in msgs[0]["content"]


# --- LLMJudge re-ask and fallbacks on a scripted in-process backend --------------------------


class ScriptedBackend:
    """Answers from a function of (conversation, round); records every batch it gets."""

    def __init__(self, answer):
        self.answer = answer
        self.batches: list[list[list[dict]]] = []

    def complete(self, batch, max_tokens, temperature):
        self.batches.append([list(m) for m in batch])
        return [self.answer(m) for m in batch]


GOOD = {
    "check": '{"criteria_met": true}',
    "compare": '{"winner": "1"}',
    "induce": '{"rubrics": [{"title": "T", "description": "D"}]}',
    "consolidate": '{"rubrics": [{"title": "C", "description": "D"}]}',
    "bundle": json.dumps({"criteria": [
        {"description": "Gives the dose. Fails if it omits it.", "atomic_indices": [1, 2]},
        {"description": "Avoids jargon. Fails if it cites nothing.", "atomic_indices": [3, 4]}]}),
    "equivalent": '{"equivalent": true}',
}


def _op_of(messages):
    user = messages[1]["content"]
    for marker, op in (("# Criterion", "check"), ("# Response 1", "compare"),
                       ("# Best trajectory", "induce"), ("# Draft rubrics", "consolidate"),
                       ("# Criteria (number", "bundle"), ("# Predicted answer", "equivalent")):
        if marker in user:
            return op
    raise AssertionError(user)


def _requests():
    return {
        "check": [CheckRequest("ctx", "resp", "crit")],
        "compare": [PairRequest("ctx", "a", "b", "rubric")],
        "induce": [InduceRequest("q", "best", "hard", "worst", ("g",))],
        "consolidate": [ConsolidateRequest((Draft("A", "a"), Draft("B", "b")))],
        "bundle": [BundleRequest("p", CRITERIA, (1, 1, 1, -1))],
        "equivalent": [EquivRequest("q", "Lyon", ("Paris",))],
    }


def _call(judge, op, reqs):
    return getattr(judge, op)(reqs)


@pytest.mark.parametrize("op", list(GOOD))
def test_garbage_then_valid_is_reasked_once(op):
    def answer(messages):
        return Completion("garbage, no json" if len(messages) == 2 else GOOD[op], 10, 3)

    backend = ScriptedBackend(answer)
    judge = LLMJudge(backend, max_reasks=2)
    (res,) = _call(judge, op, _requests()[op])
    assert not getattr(res, "fallback", False) and getattr(res, "error", None) is None
    s = judge.stats()
    assert (s["parse_errors"], s["reasks"], s["fallbacks"]) == (1, 1, 0)
    reask = backend.batches[1][0]
    assert [m["role"] for m in reask] == ["system", "user", "assistant", "user"]
    assert reask[2]["content"] == "garbage, no json"
    assert "no JSON object found" in reask[3]["content"]


@pytest.mark.parametrize("max_reasks", [0, 1, 3])
def test_persistent_garbage_ends_on_defined_fallbacks(max_reasks):
    backend = ScriptedBackend(lambda m: Completion('{"unexpected": "shape"}'))
    judge = LLMJudge(backend, max_reasks=max_reasks, seed=3)
    reqs = _requests()
    check = judge.check(reqs["check"])[0]
    assert check == CheckResult(met=False, prob=0.5, fallback=True)
    pair = judge.compare(reqs["compare"])[0]
    assert (pair.winner, pair.prob_a, pair.fallback) == (TIE, 0.5, True)
    assert pair.tie_break in (0, 1)
    assert judge.induce(reqs["induce"]) == [()]
    assert judge.consolidate(reqs["consolidate"]) == [()]
    (b,) = judge.bundle(reqs["bundle"])
    assert not b.ok and b.dimensions == () and "missing key 'criteria'" in b.error
    (eq,) = judge.equivalent(reqs["equivalent"])
    assert (eq.equivalent, eq.fallback) == (False, True)  # cover-EM fallback: Lyon != Paris
    s = judge.stats()
    assert s["fallbacks"] == 6 and all(s[f"fallbacks_{op}"] == 1 for op in GOOD)
    assert s["reasks"] == 6 * max_reasks and s["parse_errors"] == 6 * (max_reasks + 1)
    assert len(backend.batches) == 6 * (max_reasks + 1)
    assert set(JUDGE_STAT_KEYS) <= set(s) and all(isinstance(v, int) for v in s.values())


def test_backend_error_skips_reask_and_equivalence_falls_back_to_cover_em():
    backend = ScriptedBackend(lambda m: Completion("", error="HTTP 503"))
    judge = LLMJudge(backend, max_reasks=2)
    res = judge.equivalent([EquivRequest("q", "it was Paris, France", ("Paris",))] * 2)
    assert all(r.equivalent and r.fallback for r in res)
    s = judge.stats()
    assert (s["backend_errors"], s["reasks"], s["parse_errors"], s["fallbacks"]) == (2, 0, 0, 2)
    assert len(backend.batches) == 1


def test_mixed_batch_keeps_order_and_reasks_only_the_bad_items():
    def answer(messages):
        user = messages[1]["content"]
        if "BAD" in user and len(messages) == 2:
            return Completion("```json\n{\"criteria_met\": tru\n```")
        return Completion(json.dumps({"criteria_met": "YES" in user}))

    backend = ScriptedBackend(answer)
    judge = LLMJudge(backend)
    reqs = [CheckRequest("c", r, "k") for r in ("YES", "no", "BAD YES", "no", "BAD no", "YES")]
    assert [r.met for r in judge.check(reqs)] == [True, False, True, False, False, True]
    assert [len(b) for b in backend.batches] == [6, 2]
    assert judge.stats()["reasks"] == 2


def test_compare_maps_shown_position_back_to_a_b():
    """The model answers "1" (first shown) always: winner must follow the order coin."""
    backend = ScriptedBackend(lambda m: Completion('{"winner": "1"}'))
    judge = LLMJudge(backend, seed=11)
    reqs = [PairRequest("ctx", f"a{i}", f"b{i}", "r") for i in range(32)]
    res = judge.compare(reqs)
    assert {r.a_shown_first for r in res} == {True, False}  # randomised
    for r in res:
        assert r.winner == (0 if r.a_shown_first else 1)
        assert r.prob_a == (1.0 if r.winner == 0 else 0.0)
    # the order is part of what was sent: the first shown response is in "# Response 1"
    for req, r, conv in zip(reqs, res, backend.batches[0]):
        first = conv[1]["content"].split("# Response 1\n")[1].split("\n\n")[0]
        assert first == (req.a if r.a_shown_first else req.b)
    # seeded: same seed, same coins; explicit per-pair seeds are honoured
    again = LLMJudge(ScriptedBackend(lambda m: Completion('{"winner": "1"}')), seed=11)
    assert [r.a_shown_first for r in again.compare(reqs)] == [r.a_shown_first for r in res]
    seeded = [PairRequest("ctx", "a", "b", "r", seed=s) for s in range(16)]
    assert len({r.a_shown_first for r in judge.compare(seeded)}) == 2


def test_bundle_short_checklists_and_validation():
    backend = ScriptedBackend(lambda m: Completion(GOOD["bundle"]))
    judge = LLMJudge(backend)
    one, empty = judge.bundle(
        [BundleRequest("p", ("only",), (1.0,)), BundleRequest("p", (), ())]
    )
    assert one.ok and one.dimensions[0].indices == (0,)
    assert not empty.ok and backend.batches == []
    with pytest.raises(ValueError, match="weights"):
        judge.bundle([BundleRequest("p", ("a", "b"), (1.0,))])


def test_llm_judge_rejects_bad_options():
    with pytest.raises(ValueError):
        LLMJudge(ScriptedBackend(lambda m: Completion("")), check_mode="vibes")
    with pytest.raises(ValueError):
        LLMJudge(ScriptedBackend(lambda m: Completion("")), k_min=3, k_max=2)


# --- holistic rating ----------------------------------------------------------------------------


@pytest.mark.parametrize("text, rating", [
    ("7", 7), (" 7.\n", 7), ("10/10", 10), ("<think>hmm, 3?</think>4", 4),
    ('{"explanation": "ok", "rating": 7}', 7), ('{"Rating": "9"}', 9), ('{"score": 1.0}', 1),
    ('Sure. ```json\n{"rating": 2}\n``` done', 2),
])
def test_parse_rating(text, rating):
    from judges.parsing import parse_rating

    assert parse_rating(text) == rating


@pytest.mark.parametrize("text", ["0", "11", "7.5", "seven", "", '{"rating": true}',
                                  '{"rating": 12}', '{"explanation": "no number"}'])
def test_parse_rating_refuses(text):
    from judges.parsing import parse_rating

    with pytest.raises(ParseError):
        parse_rating(text)
