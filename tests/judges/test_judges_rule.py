"""RuleJudge: executable criteria, the process-feature library, and every batched operation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from judges import (
    FEATURES,
    JUDGE_STAT_KEYS,
    TIE,
    BundleRequest,
    CheckRequest,
    ConsolidateRequest,
    Draft,
    EquivRequest,
    InduceRequest,
    Judge,
    PairRequest,
    RateRequest,
    RateResult,
    RuleJudge,
    cover_match,
    make_judge,
    normalize_answer,
    parse_trajectory,
)
from judges.search_features import feature_predicate, question_entities

Q = "Which country is the birthplace of the director of Inception?"

BEST = """<think>I need the director of Inception first.</think>
<search>Inception director</search>
<information>Doc 1(Title: Inception) Inception is a 2010 film directed by Christopher Nolan.
</information>
<think>Now where was Nolan born?</think>
<search>Christopher Nolan birthplace</search>
<information>Doc 1(Title: Christopher Nolan) Nolan was born in London, England.</information>
<think>London is in England.</think>
<answer>England</answer>"""

HARD = """<think>Find the director.</think>
<search>Inception director</search>
<information>Doc 1(Title: Inception) Inception is a 2010 film directed by Christopher Nolan.
</information>
<think>Nolan is British, I believe.</think>
<answer>United Kingdom</answer>"""

WORST = """<search>Which country is the birthplace of the director of Inception?</search>
<information>Doc 1(Title: Inception) Inception is a 2010 film.</information>
<search>Which country is the birthplace of the director of Inception?</search>
<information>Doc 1(Title: Inception) Inception is a 2010 film.</information>
<search>film director birthplace</search>
<information>Doc 1(Title: Film) A director directs films.</information>
<answer>United States of America</answer>"""

SEARCH_R1_PROMPT = (
    "Answer the given question. ... For example, <answer> Beijing </answer>.\n"
    f"Question: {Q}\n"
)


def fsat(fid: str, traj: str, q: str = Q) -> bool:
    pred = feature_predicate(fid)
    assert pred is not None, fid
    return pred(q, traj)


# --- text helpers -----------------------------------------------------------------------------


def test_normalize_and_cover_match():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("An apple, a day") == "apple day"
    assert cover_match("It is Paris, France.", ["paris"])
    assert cover_match("the Beatles", ["Beatles"])
    assert not cover_match("Parisian", ["Paris"])  # whole words only
    assert not cover_match("", ["x"]) and not cover_match("x", [])


def test_trajectory_parsing_and_prompt_stripping():
    t = parse_trajectory(BEST)
    assert t.searches == ["Inception director", "Christopher Nolan birthplace"]
    assert t.answer == "England" and t.valid_format
    full = parse_trajectory(SEARCH_R1_PROMPT + BEST)
    assert full.answer == "England" and full.valid_format  # the "Beijing" example is not an answer
    assert not parse_trajectory("<think>x</think><answer>a</answer><answer>b</answer>").valid_format
    assert not parse_trajectory("<think><search>x</search></think><answer>a</answer>").valid_format
    assert not parse_trajectory("<search>x<answer>a</answer>").valid_format


def test_a_real_beijing_answer_is_kept_and_only_the_prompt_is_stripped():
    # The prompt's example answer is "<answer> Beijing </answer>"; a policy whose real answer is
    # Beijing wrote the same text, and used to lose its whole trajectory (no segments, invalid).
    resp = ("<think>..</think><search>capital of China</search><information>...</information>"
            "<think>ok</think>\n<answer> Beijing </answer>")
    t = parse_trajectory(resp)
    assert t.answer == "Beijing" and t.valid_format and t.searches == ["capital of China"]
    # With the prompt in front (the test prompt's layout and the environment's own), only the
    # prompt is dropped, whatever the answer.
    from core.search_r1 import search_prompt

    for prompt in (SEARCH_R1_PROMPT, search_prompt("What is the capital of China?")):
        full = parse_trajectory(prompt + resp)
        assert full.segments == t.segments and full.valid_format
        assert parse_trajectory(prompt).segments == ()  # a prompt alone has no answer
    # the process features read the real trajectory: one search, then an answer
    assert fsat("max_searches:1", resp, "What is the capital of China?")


def test_question_entities():
    ents = question_entities('Who wrote "The Old Man and the Sea"? When did Bank of America open?')
    assert ["old", "man", "and", "sea"] in ents and ["bank", "of", "america"] in ents
    assert ["who"] not in ents
    assert question_entities(Q) == [["inception"]]


# --- the feature library ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "fid,best,hard,worst",
    [
        ("entity_search", True, True, True),
        ("bridge_search", True, False, False),
        ("answer_grounded", True, False, False),
        ("stops_after_evidence", True, False, False),
        ("distinct_queries", True, True, False),
        ("query_not_copy", True, True, False),
        ("think_before_action", True, True, False),
        ("min_searches:1", True, True, True),
        ("min_searches:2", True, False, True),
        ("max_searches:1", False, True, False),
        ("max_searches:2", True, True, False),
        ("max_searches:3", True, True, True),
        ("concise_answer:5", True, True, True),
        ("concise_answer:2", True, True, False),
        ("valid_format", True, True, True),
    ],
)
def test_features_on_reference_trajectories(fid, best, hard, worst):
    assert (fsat(fid, BEST), fsat(fid, HARD), fsat(fid, WORST)) == (best, hard, worst)


def test_feature_edge_cases():
    no_search = "<think>I know this.</think><answer>England</answer>"
    assert not fsat("distinct_queries", no_search) and not fsat("entity_search", no_search)
    assert fsat("max_searches:1", no_search) and not fsat("min_searches:1", no_search)
    assert not fsat("answer_grounded", "<think>x</think><search>y</search>")  # no answer
    # evidence that arrives only after the answer does not ground it
    late = "<answer>England</answer><information>England</information>"
    assert not fsat("answer_grounded", late)
    # searching again after the answer was already in evidence is not sufficiency-guided
    overshoot = (
        "<search>a</search><information>born in England</information>"
        "<search>b</search><information>x</information><answer>England</answer>"
    )
    assert fsat("answer_grounded", overshoot) and not fsat("stops_after_evidence", overshoot)
    # <think> must come after the latest information, before the next action
    stale = "<think>t</think><search>a</search><information>i</information><answer>x</answer>"
    assert not fsat("think_before_action", stale)
    assert feature_predicate("no_such_feature") is None
    assert feature_predicate("max_searches:lots") is None


def test_library_drafts_are_process_rubrics():
    for feat in FEATURES.values():
        for p in feat.params or (None,):
            d = feat.draft(p)
            assert d.title and d.description and d.feature == feat.fid(p)
            # the rule judge reads its own rubric texts back as criteria
            assert fsat(d.feature, BEST) == RuleJudge().check([CheckRequest(Q, BEST, d.text())])[
                0
            ].met


# --- check ------------------------------------------------------------------------------------

RESP = "- First point about Paris\n- Second point\n\nSee <ref>1</ref>. Total: 3 items."


@pytest.mark.parametrize(
    "criterion,met",
    [
        ("regex:Total: \\d+ items", True),
        ("regex:total", False),
        ("iregex:total", True),
        ("contains:paris", True),
        ("contains_all:paris|second", True),
        ("contains_all:paris|london", False),
        ("contains_any:london|second", True),
        ("starts_with:- first", True),
        ("ends_with:items.", True),
        ("min_words:10", True),
        ("max_words:10", False),
        ("min_chars:10", True),
        ("max_lines:2", False),
        ("min_lines:3", True),
        ("count:point:==2", True),
        ("count:point:<2", False),
        ("bullets:>=2", True),
        ("tag:ref", True),
        ("tag:search", False),
        ("json", False),
        ("not:contains:london", True),
        ("contains:paris && bullets:==2", True),
        ("contains:paris && bullets:==3", False),
    ],
)
def test_check_rules(criterion, met):
    (r,) = RuleJudge().check([CheckRequest("ctx", RESP, criterion)])
    assert (r.met, r.prob, r.fallback) == (met, float(met), False)


def test_copies_retrieved_counts_titles_repeated_outside_the_retrieved_text():
    """Two retrieved titles; the response names one in its reasoning and searched for the
    other (a query is not its own text): 1 copied, and 2 once the answer names the second."""
    text = ("<think>find it</think><search>Mona Lisa</search><information>Doc 1(Title: Louvre) "
            "a museum. Doc 2(Title: Mona Lisa) a painting.</information><think>The Louvre has "
            "it.</think><answer>{}</answer>")
    reqs = [CheckRequest(Q, text.format(a), c) for a, c in (
        ("Paris", "copies_retrieved:==1"), ("Paris", "copies_retrieved:>=2"),
        ("the Mona Lisa", "copies_retrieved:>=2"))]
    assert [r.met for r in RuleJudge().check(reqs)] == [True, False, True]
    # cites_retrieved reads the final turn alone: the Louvre named before the answer counts,
    # a title searched or named before the last retrieval does not
    cite = [CheckRequest(Q, text.format(a), "cites_retrieved:>=1") for a in ("Paris", "x")]
    early = ("<think>Louvre first</think><search>Louvre</search><information>Doc 1(Title: "
             "Louvre) a museum.</information><answer>Paris</answer>")
    cite.append(CheckRequest(Q, early, "cites_retrieved:>=1"))
    assert [r.met for r in RuleJudge().check(cite)] == [True, True, False]


def test_check_json_features_and_custom_predicates():
    judge = RuleJudge(predicates={"short": lambda c, r: len(r) < 20})
    reqs = [
        CheckRequest("c", '```json\n{"a": 1}\n```', "json"),
        CheckRequest(Q, BEST, "feature:bridge_search"),
        CheckRequest(Q, WORST, "bridge_search"),
        CheckRequest("c", "tiny", "fn:short"),
        CheckRequest(Q, BEST, FEATURES["answer_grounded"].draft(None).text()),
    ]
    assert [r.met for r in judge.check(reqs)] == [True, True, False, True, True]
    assert judge.stats()["fallbacks"] == 0


@pytest.mark.parametrize(
    "criterion",
    ["Mentions the diagnosis", "", "fn:unknown", "regex:(unclosed", "count:x:about 3",
     "Safety: avoids harm", "feature:nope", "not:gibberish"],
)
def test_unreadable_criteria_fall_back(criterion):
    judge = RuleJudge()
    (r,) = judge.check([CheckRequest("c", "resp", criterion)])
    assert (r.met, r.prob, r.fallback) == (False, 0.5, True)
    s = judge.stats()
    assert (s["fallbacks"], s["fallbacks_check"], s["requests_check"]) == (1, 1, 1)


# --- rate (RaR implicit) -----------------------------------------------------------------------

RATE_CRITERIA = ("contains:paris", "min_words:3", "contains:sorry")
RATE_WEIGHTS = (3.0, 1.0, -2.0)  # the last a pitfall: passes when absent


@pytest.mark.parametrize("response, rating", [
    ("Paris is nice", 10),      # 3 + 1 + 2 of 6 pass: f = 1, 1 + 9
    ("Paris", 9),               # 3 + 2 of 6: 9 * 5/6 = 7.5 -> 8 (halves up), 1 + 8
    ("sorry, Paris here", 7),   # 3 + 1 of 6: 9 * 4/6 = 6, 1 + 6
    ("sorry", 1),               # nothing passes: f = 0
])
def test_rule_rating_by_hand(response, rating):
    judge = RuleJudge()
    (r,) = judge.rate([RateRequest("q", response, RATE_CRITERIA, RATE_WEIGHTS)])
    assert r == RateResult(rating)


def test_rule_rating_rounds_halves_up_and_unreadable_checklists_fall_back():
    judge = RuleJudge()
    half, bad, none = judge.rate([
        RateRequest("q", "x", ("contains:x", "contains:y"), (1.0, 1.0)),  # 9 * 1/2 = 4.5 -> 5
        RateRequest("q", "x", ("contains:x", "Mentions the diagnosis"), (1.0, 1.0)),
        RateRequest("q", "x", (), ()),
    ])
    assert half == RateResult(6) and bad == none == RateResult(1, fallback=True)
    s = judge.stats()
    assert (s["requests_rate"], s["fallbacks_rate"], s["fallbacks"]) == (3, 2, 2)


# --- compare ----------------------------------------------------------------------------------


def test_compare_by_feature_satisfaction():
    judge = RuleJudge(seed=5)
    grounded = FEATURES["answer_grounded"].draft(None)
    reqs = [
        PairRequest(Q, BEST, WORST, grounded),
        PairRequest(Q, WORST, BEST, grounded),
        PairRequest(Q, BEST, HARD, FEATURES["think_before_action"].draft(None)),  # both satisfy
        PairRequest(Q, WORST, HARD, Draft("free text rubric", "nothing executable")),
        PairRequest(Q, "short", "a much longer answer", Draft("Brevity", "max_words:3")),
    ]
    res = judge.compare(reqs)
    assert [r.winner for r in res] == [0, 1, TIE, TIE, 0]
    assert [r.prob_a for r in res] == [1.0, 0.0, 0.5, 0.5, 1.0]
    assert [r.fallback for r in res] == [False, False, False, True, False]
    assert res[0].tie_break is None and res[2].tie_break in (0, 1) and res[3].tie_break in (0, 1)
    s = judge.stats()
    assert (s["requests_compare"], s["fallbacks_compare"]) == (5, 1)


def test_compare_order_and_tie_coins_are_seeded():
    tie_rubric = Draft("x", "contains:zzz")  # nobody satisfies it: every pair ties
    reqs = [PairRequest(Q, f"a{i}", f"b{i}", tie_rubric) for i in range(40)]
    r1 = RuleJudge(seed=1).compare(reqs)
    assert r1 == RuleJudge(seed=1).compare(reqs)
    assert {r.a_shown_first for r in r1} == {True, False}
    assert {r.tie_break for r in r1} == {0, 1}
    assert all(r.winner == TIE and not r.fallback for r in r1)
    r2 = RuleJudge(seed=2).compare(reqs)
    assert [r.a_shown_first for r in r1] != [r.a_shown_first for r in r2]


# --- induce / consolidate ---------------------------------------------------------------------


def test_induce_picks_contrastive_features_hard_negative_first():
    judge = RuleJudge(max_drafts=3)
    (drafts,) = judge.induce([InduceRequest(Q, BEST, HARD, WORST, ("England",))])
    assert [d.feature for d in drafts] == ["bridge_search", "answer_grounded",
                                           "stops_after_evidence"]
    (all_drafts,) = RuleJudge(max_drafts=20).induce([InduceRequest(Q, BEST, HARD, WORST)])
    feats = [d.feature for d in all_drafts]
    assert feats[:3] == [d.feature for d in drafts]
    assert set(feats[3:]) == {"distinct_queries", "query_not_copy", "think_before_action",
                              "max_searches:2"}
    for d in all_drafts:  # every draft: best satisfies, worst does not
        assert fsat(d.feature, BEST) and not fsat(d.feature, WORST)


def test_induce_degenerate_triplets():
    judge = RuleJudge()
    tied, no_hard = judge.induce(
        [InduceRequest(Q, BEST, BEST, BEST), InduceRequest(Q, BEST, None, WORST)]
    )
    assert tied == ()
    assert len(no_hard) == 3 and all(fsat(d.feature, BEST) for d in no_hard)


def test_consolidate_merges_by_feature_identity():
    f = FEATURES
    drafts = (
        f["max_searches"].draft(2),
        f["answer_grounded"].draft(None),
        f["think_before_action"].draft(None),
        f["max_searches"].draft(3),
        Draft("Free", "free text"),
        f["answer_grounded"].draft(None),
        Draft("Free", "free text, again"),
        f["answer_grounded"].draft(None),
    )
    judge = RuleJudge(max_common=5, min_support=2)
    (common,) = judge.consolidate([ConsolidateRequest(drafts)])
    assert [d.feature for d in common] == ["answer_grounded", "max_searches:3", None]
    assert common[2] == Draft("Free", "free text")
    assert RuleJudge(max_common=1).consolidate([ConsolidateRequest(drafts)]) == [common[:1]]
    assert RuleJudge(min_support=4).consolidate([ConsolidateRequest(drafts)]) == [()]
    assert judge.consolidate([ConsolidateRequest(())]) == [()]


# --- bundle -----------------------------------------------------------------------------------


def test_bundle_groups_by_family_and_pitfalls():
    crit = ("contains:dose", "feature:answer_grounded", "max_words:200", "contains:refer",
            "Avoids jargon", "regex:lethal")
    (b,) = RuleJudge().bundle([BundleRequest("p", crit, (3, 2, 1, 2, 1, -5))])
    assert b.ok
    assert [(d.name, d.indices) for d in b.dimensions] == [
        ("content", (0, 3)), ("process", (1,)), ("form", (2,)), ("general", (4,)),
        ("pitfalls", (5,)),
    ]
    (b,) = RuleJudge(k_max=3).bundle([BundleRequest("p", crit, (3, 2, 1, 2, 1, -5))])
    assert len(b.dimensions) == 3
    (b,) = RuleJudge().bundle([BundleRequest("p", ("a", "b", "c"), (1, 1, 1))])
    assert [d.indices for d in b.dimensions] == [(0, 1), (2,)]  # one family split in two


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["contains:x", "feature:valid_format", "max_words:9", "free", "json"]),
            st.sampled_from([-2.0, -1.0, 0.5, 1.0, 3.0]),
        ),
        min_size=1,
        max_size=15,
    ),
    st.integers(2, 5),
)
def test_bundle_is_a_partition_with_k_in_range(rows, k_max):
    crit = tuple(f"{c} #{i}" if c == "free" else c for i, (c, _) in enumerate(rows))
    weights = tuple(w for _, w in rows)
    (b,) = RuleJudge(k_max=k_max).bundle([BundleRequest("p", crit, weights)])
    assert b.ok
    flat = sorted(i for d in b.dimensions for i in d.indices)
    assert flat == list(range(len(crit)))
    assert all(d.indices for d in b.dimensions)
    n = len(crit)
    assert min(2, n) <= len(b.dimensions) <= min(k_max, n)


def test_bundle_errors():
    judge = RuleJudge()
    (b,) = judge.bundle([BundleRequest("p", (), ())])
    assert not b.ok and b.error == "empty checklist"
    with pytest.raises(ValueError):
        judge.bundle([BundleRequest("p", ("a",), ())])


# --- equivalence, protocol, registry ------------------------------------------------------------


def test_equivalent_batch_order():
    judge = RuleJudge()
    res = judge.equivalent(
        [
            EquivRequest("q", "England", ("England", "UK")),
            EquivRequest("q", "the United Kingdom", ("United Kingdom",)),
            EquivRequest("q", "France", ("England",)),
        ]
    )
    assert [(r.equivalent, r.prob, r.fallback) for r in res] == [
        (True, 1.0, False), (True, 1.0, False), (False, 0.0, False)
    ]


def test_protocol_stats_versions_and_registry():
    judge = make_judge({"name": "rule", "seed": 3, "max_drafts": 2})
    assert isinstance(judge, RuleJudge) and isinstance(judge, Judge)
    assert judge.seed == 3 and judge.max_drafts == 2
    assert judge.versions() == {"rule_features": "features-v2"}
    judge.check([CheckRequest("c", "r", "contains:r")] * 3)
    judge.equivalent([])
    s = judge.stats()
    assert set(s) == set(JUDGE_STAT_KEYS) and s["requests_check"] == 3
    with pytest.raises(ValueError, match="unknown rule judge option"):
        make_judge({"name": "rule", "sede": 3})
    with pytest.raises(KeyError, match="unknown judge"):
        make_judge({"name": "oracle"})
    with pytest.raises(ValueError, match="needs a 'name'"):
        make_judge({})
    with judge:
        pass
