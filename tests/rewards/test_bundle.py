"""Offline bundling: validation of judge answers, regeneration, deterministic repair (flagged),
the authors' schema through the LLM judge (1-based indices, reference anchor, our weights),
per-prompt failure reports and resumable output."""

import json
import re

import pytest

from judges.bundling import bundle_problems, count_sentences
from judges.llm import LLMJudge
from judges.rule import RuleJudge
from judges.types import Bundle, Completion, Dimension
from rewards.bundle import (
    BundleError,
    BundleOptions,
    BundleResult,
    bundle_missing,
    bundle_rubrics,
    main,
    run_bundle,
    summary_path,
    validate_bundle,
)
from rewards.bundle_repair import repair_bundle
from rewards.rubric import Criterion, Rubric
from rewards.rubric import Dimension as RubricDimension
from rewards.rubric_io import load_rubrics, save_rubrics
from tests.paths import FIXTURES

FIX = FIXTURES / "rubrics"
PARA = "A good answer states the dose for an adult. It fails if it gives a child's dose."


def rubric(pid: str, n: int = 4, prefix: str = "criterion") -> Rubric:
    crits = tuple(Criterion(f"{prefix} {pid} #{i} (keep: exact text!)", 3.0 - i) for i in range(n))
    return Rubric(prompt_id=pid, prompt=f"question {pid}", criteria=crits)


def D(name, idx, fail=None, desc=PARA, weight=None):
    return Dimension(name, tuple(idx), fail, desc, weight)


GOOD = Bundle((D("a", [0, 1], "fails a"), D("b", [2, 3])))
BAD = {  # prompt id -> (judge answer, a fragment of the reported reason)
    "k1": (Bundle((D("all", [0, 1, 2, 3]),)), "need 2 to 4 dimensions, got 1"),
    "k6": (Bundle(tuple(D(f"d{i}", [i]) for i in range(4)) + (D("x", [0]),)), "got 5"),
    "dup": (Bundle((D("a", [0, 1]), D("b", [1, 2, 3]))), "item 1 is in more than one"),
    "missing": (Bundle((D("a", [0]), D("b", [1, 2]))), "items 3 are in no dimension"),
    "range": (Bundle((D("a", [0, 1]), D("b", [2, 3, 7]))), "item 7 is out of range 0..3"),
    "empty": (Bundle((D("a", [0, 1, 2, 3]), D("b", []))), "'b' has no items"),
    "float": (Bundle((D("a", [0, 1.0]), D("b", [2, 3]))), "item 1.0 is out of range"),
    "nodesc": (Bundle((D("a", [0, 1], desc=""), D("b", [2, 3]))), "description is empty"),
    "onesent": (Bundle((D("a", [0, 1], desc="Short."), D("b", [2, 3]))), "has 1 sentence"),
    "error": (Bundle((), error="unparseable after 1 re-ask"), "unparseable"),
    "notbundle": ({"dimensions": []}, "not a Bundle"),
}
NO_DRAFT = ("error", "notbundle")  # nothing readable to repair: reported, not written


class FakeJudge:
    """Answers from a table keyed by the prompt text; counts requests."""

    def __init__(self, answers):
        self.answers = answers
        self.requests = []

    def bundle(self, reqs):
        self.requests += [r.prompt for r in reqs]
        return [self.answers.get(r.prompt.removeprefix("question "), GOOD) for r in reqs]

    def stats(self):
        return {"requests_bundle": len(self.requests)}

    def close(self):
        pass


@pytest.mark.parametrize("pid", sorted(BAD))
def test_validate_bundle_rejects(pid):
    answer, reason = BAD[pid]
    with pytest.raises(BundleError, match=re.escape(reason)):
        validate_bundle(answer, 4)


def test_validate_bundle_accepts_and_normalises():
    dims = validate_bundle(Bundle((D(" a ", [1, 0], "  "), D("a", [3, 2], " fails b "))), 4)
    assert [(d.name, d.indices, d.failure_clause) for d in dims] == [
        ("a", (1, 0), None), ("a", (3, 2), "fails b")]  # names may repeat (authors' data)
    with pytest.raises(BundleError, match="only 1 item, cannot make 2 dimensions"):
        validate_bundle(Bundle((D("a", [0]),)), 1)
    with pytest.raises(BundleError, match="need exactly 2 dimensions, got 3"):
        validate_bundle(Bundle((D("a", [0]), D("b", [1]), D("c", [2, 3]))), 4, k_max=2)
    (one,) = validate_bundle(Bundle((D("all", [0, 1, 2, 3]),)), 4, k_min=1, k_max=1)  # K = 1
    assert one.indices == (0, 1, 2, 3)


def test_description_sentence_rule():
    assert count_sentences("Gives the dose, e.g. 400 mg daily. It fails if it omits it.") == 2
    assert count_sentences("Says A. Says B! Asks C? ") == 3
    assert count_sentences("好的回答给出剂量。若给出儿童剂量则不合格。") == 2


# --- repair (expected dimensions worked out by hand from the rules in rewards.bundle_repair) --

TEXTS = ("gives the adult dose", "names the interval", "mentions food", "doubles the dose")
WEIGHTS = (3.0, 2.0, 1.0, -2.0)


def test_repair_duplicates_first_orphans_nearest_and_keeps_the_model_text():
    draft = (D("a", [0, 1, 9]), D("b", [1, 2]))  # 9 out of range, 1 twice, 3 unassigned
    dims, notes = repair_bundle(draft, TEXTS, WEIGHTS, 2, 5)
    assert [(d.name, d.indices) for d in dims] == [("a", (0, 1)), ("b", (2, 3))]
    assert dims[0].description == PARA
    # the orphan (a pitfall) is written into b's paragraph, so a judge reading it sees it
    assert dims[1].description == (
        PARA + " It also fails if it does any of the following: doubles the dose.")
    assert notes == ("2 out-of-range or repeated indices dropped",
                     "criteria [3] assigned to the nearest dimension")
    assert bundle_problems(dims, 4, 2, 5) == []


def test_repair_splits_merges_and_composes_descriptions():
    (a, b), _ = repair_bundle((D("all", [0, 1, 2, 3], "gives no dose"),), TEXTS, WEIGHTS, 2, 5)
    assert (a.name, a.indices, a.failure_clause) == ("all (1)", (0, 1), "gives no dose")
    assert (b.name, b.indices, b.failure_clause) == ("all (2)", (2, 3), None)
    assert a.description == ("A good response does all of the following: gives the adult "
                             "dose; names the interval. It also fails when it gives no dose. "
                             "Missing any one of these requirements fails the dimension.")
    assert b.description == ("A good response does all of the following: mentions food. It "
                             "fails this dimension if it does any of the following: doubles "
                             "the dose. Missing any one of these requirements fails the "
                             "dimension.")
    dims, _ = repair_bundle(tuple(D(f"d{i}", [i]) for i in range(4)), TEXTS, WEIGHTS, 2, 3)
    # the two smallest (all size 1; ties: the earlier) merge first: d0 + d1
    assert [(d.name, d.indices) for d in dims] == [("d0 + d1", (0, 1)), ("d2", (2,)),
                                                   ("d3", (3,))]
    assert dims[0].description == f"{PARA} {PARA}"  # 4 sentences: valid, the model's text kept
    (one,), _ = repair_bundle((D("x", [2]), D("y", [0, 1, 3])), TEXTS, WEIGHTS, 1, 1)
    assert one.indices == (2, 0, 1, 3) and count_sentences(one.description) == 4


# --- the bundler over a fake judge ---------------------------------------------------------


def test_bad_bundles_are_regenerated_then_repaired_and_flagged(tmp_path):
    """Behaviour change (#19): an invalid answer is no longer dropped; after the regenerations
    it is repaired and flagged. Only prompts with nothing readable fail."""
    rubrics = [rubric("ok1"), *(rubric(p) for p in BAD), rubric("ok2")]
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    save_rubrics(rubrics, src)
    judge = FakeJudge({p: a for p, (a, _) in BAD.items()})
    s = run_bundle(src, out, judge, judge_name="fake", options=BundleOptions(batch=5))
    n_bad = len(BAD)
    assert s["bundled"] == 2 + n_bad - len(NO_DRAFT) and s["repaired"] == n_bad - len(NO_DRAFT)
    assert s["failed"] == len(NO_DRAFT) and s["skipped"] == 0
    assert s["regenerated"] == n_bad - len(NO_DRAFT) and s["regenerations"] == 2 * n_bad
    assert {f["prompt_id"] for f in s["failures"]} == set(NO_DRAFT)
    for entry in s["repairs"] + [{"prompt_id": f["prompt_id"], "problem": f["reason"]}
                                 for f in s["failures"]]:
        assert BAD[entry["prompt_id"]][1] in entry["problem"], entry
    assert len(judge.requests) == 2 + 3 * n_bad  # each bad one asked 1 + 2 times
    written = {r.prompt_id: r for r in load_rubrics(out, "native")}
    assert set(written) == {"ok1", "ok2"} | (set(BAD) - set(NO_DRAFT))
    assert json.loads(summary_path(out).read_text())["repaired"] == n_bad - len(NO_DRAFT)
    by_id = {r.prompt_id: r for r in rubrics}
    for pid, r in written.items():
        assert r.criteria == by_id[pid].criteria
        assert r.meta["repaired"] is (pid in BAD) and r.meta["bundler"] == "fake"
        assert r.meta["bundle_attempts"] == (3 if pid in BAD else 1)
        assert bundle_problems([Dimension(d.name, d.criteria, d.failure, d.description)
                                for d in r.dimensions], 4, 2, 5) == []
        # W_d = sum |w_i| over its items (weights 3, 2, 1, 0)
        w = (3.0, 2.0, 1.0, 0.0)
        assert [d.weight for d in r.dimensions] == [sum(w[i] for i in d.criteria)
                                                    for d in r.dimensions]
    assert [d.criteria for d in written["ok1"].dimensions] == [(0, 1), (2, 3)]
    assert written["ok1"].dimensions[0].failure == "fails a"
    assert [d.criteria for d in written["dup"].dimensions] == [(0, 1), (2, 3)]
    assert [d.criteria for d in written["missing"].dimensions] == [(0,), (1, 2, 3)]
    assert [d.criteria for d in written["k1"].dimensions] == [(0, 1), (2, 3)]
    assert [d.criteria for d in written["float"].dimensions] == [(0, 1), (2, 3)]
    assert written["nodesc"].dimensions[0].description.startswith(
        "A good response does all of the following: criterion nodesc #0 (keep: exact text!); ")


def test_wrong_number_of_bundles_fails_every_prompt():
    class Short(FakeJudge):
        def bundle(self, reqs):
            return [GOOD]

    res = bundle_rubrics([rubric("a"), rubric("b")], Short({}), regenerate=0)
    assert res.rubrics == () and [p for p, _ in res.failed] == ["a", "b"]
    assert "1 bundles for 2 requests" in res.failed[0][1]


def test_regeneration_asks_only_the_invalid_and_says_why():
    class Flaky(FakeJudge):
        def __init__(self):
            super().__init__({})
            self.previous = []

        def bundle(self, reqs):
            first = not self.requests
            self.previous += [r.previous_error for r in reqs]
            out = super().bundle(reqs)
            return [BAD["dup"][0] if first and r.prompt.endswith("b") else o
                    for r, o in zip(reqs, out)]

    judge = Flaky()
    res = bundle_rubrics([rubric("a"), rubric("b")], judge, regenerate=2)
    assert [r.prompt_id for r in res.rubrics] == ["a", "b"] and res.failed == ()
    assert res.repaired == () and res.regenerations == 1
    assert judge.requests == ["question a", "question b", "question b"]
    assert judge.previous[:2] == [None, None] and "more than one" in judge.previous[2]
    assert [r.meta["bundle_attempts"] for r in res.rubrics] == [1, 2]


def test_bundle_missing_never_rebundles_cached_dimensions():
    cached = rubric("cached").with_dimensions((
        RubricDimension("env", (0, 1), "recommends alcohol to sleep"),
        RubricDimension("rest", (2, 3)),
    ))
    judge = FakeJudge({"bad": BAD["error"][0]})
    res = bundle_missing([rubric("a"), cached, rubric("bad"), rubric("b")], judge)
    assert judge.requests == ["question a", "question bad", "question b", "question bad",
                              "question bad"]  # cached: not asked; bad: regenerated twice
    assert [r.prompt_id for r in res.rubrics] == ["a", "cached", "b"]  # input order
    assert res.rubrics[1] is cached and res.rubrics[1].dimensions[0].failure == (
        "recommends alcohol to sleep")
    assert [p for p, _ in res.failed] == ["bad"] and "unparseable" in res.failed[0][1]
    judge = FakeJudge({})
    assert bundle_missing([cached], judge) == BundleResult((cached,), ())
    assert judge.requests == []
    with pytest.raises(ValueError, match="duplicate prompt id 'a'"):
        bundle_missing([rubric("a"), rubric("a")], FakeJudge({}))


def test_resumable_and_stale(tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    save_rubrics([rubric("a"), rubric("b"), rubric("c")], src)
    j1 = FakeJudge({"b": BAD["error"][0]})
    s1 = run_bundle(src, out, j1, judge_name="fake")
    assert (s1["bundled"], s1["failed"]) == (2, 1)
    # rerun: a and c are skipped (not asked again), b is retried and now succeeds
    j2 = FakeJudge({})
    s2 = run_bundle(src, out, j2, judge_name="fake")
    assert (s2["bundled"], s2["skipped"], s2["failed"]) == (1, 2, 0)
    assert j2.requests == ["question b"]
    assert [r.prompt_id for r in load_rubrics(out)] == ["a", "b", "c"]
    # a changed checklist is re-bundled; rows no longer in the input are kept
    save_rubrics([rubric("a", prefix="changed"), rubric("b")], src)
    j3 = FakeJudge({})
    s3 = run_bundle(src, out, j3, judge_name="fake")
    assert (s3["bundled"], s3["skipped"], s3["stale"], s3["kept_extra"]) == (1, 1, 1, 1)
    assert j3.requests == ["question a"]
    got = load_rubrics(out)
    assert [r.prompt_id for r in got] == ["a", "b", "c"]
    assert got[0].criteria[0].text.startswith("changed")
    # a row bundled without descriptions (the earlier bundler) is re-bundled
    bare = rubric("b").with_dimensions((RubricDimension("x", (0, 1)), RubricDimension("y", (2, 3))))
    save_rubrics([got[0], bare, got[2]], out)
    j4 = FakeJudge({})
    s4 = run_bundle(src, out, j4, judge_name="fake")
    assert (s4["bundled"], s4["stale"]) == (1, 1) and j4.requests == ["question b"]
    assert load_rubrics(out)[1].dimensions[0].description == PARA


def test_rule_judge_bundling_is_deterministic_and_valid(tmp_path):
    rubrics = load_rubrics(FIX / "healthbench.jsonl") + load_rubrics(FIX / "rar.jsonl")
    a = bundle_rubrics(rubrics, RuleJudge(), bundler="rule")
    b = bundle_rubrics(rubrics, RuleJudge(), bundler="rule")
    assert a == b and a.failed == () and len(a.rubrics) == len(rubrics)
    assert a.repaired == () and a.regenerations == 0
    for r, orig in zip(a.rubrics, rubrics):
        assert r.criteria == orig.criteria and 2 <= r.num_dims <= 5
        assert sorted(i for d in r.dimensions for i in d.criteria) == list(range(r.num_criteria))
        for d in r.dimensions:  # each paragraph carries its items' own texts
            assert 2 <= count_sentences(d.description) <= 10
            assert all(r.criteria[i].text.rstrip(".") in d.description for i in d.criteria)
    one = Rubric("one", "q", (Criterion("only one", 1.0),))
    res = bundle_rubrics([one], RuleJudge())
    assert res.rubrics == () and "only 1 criteria" in res.failed[0][1]


def test_cli(tmp_path, capsys):
    out = tmp_path / "hb.jsonl"
    assert main([str(FIX / "healthbench.jsonl"), str(out), "judge=rule", "k_max=3"]) == 0
    text = capsys.readouterr().out
    assert "2 bundled (0 repaired), 0 skipped" in text and "summary:" in text
    assert main([str(FIX / "healthbench.jsonl"), str(out), "judge=rule"]) == 0
    assert "0 bundled (0 repaired), 2 skipped" in capsys.readouterr().out
    assert all(2 <= r.num_dims <= 3 for r in load_rubrics(out))
    assert summary_path(out) == tmp_path / "hb.summary.json" and summary_path(out).exists()
    k1 = tmp_path / "k1.jsonl"
    assert main([str(FIX / "healthbench.jsonl"), str(k1), "judge=rule", "k_min=1", "k_max=1",
                 "regenerate=0"]) == 0
    assert all(r.num_dims == 1 for r in load_rubrics(k1))
    capsys.readouterr()
    assert main([str(FIX / "healthbench.jsonl"), str(out)]) == 2
    assert main([str(FIX / "healthbench.jsonl"), str(out), "judge=rule", "bogus=1"]) == 2
    assert "unknown option 'bogus'" in capsys.readouterr().err
    assert main([str(FIX / "healthbench.jsonl"), str(out), "judge=rule", "regenerate=-1"]) == 2


# --- the authors' schema through the LLM judge on a scripted backend ------------------------

CHECKLIST = Rubric(
    prompt_id="dose", prompt="How much ibuprofen can I take?",
    criteria=(Criterion("Gives the adult dose", 3.0), Criterion("Names the interval", 2.0),
              Criterion("Mentions taking it with food", 1.0),
              Criterion("Recommends doubling the dose", -2.0)),
    reference_answer="200-400 mg every 4-6 hours with food, at most 1200 mg a day.",
)


def answer(*groups, weights=(99, 0.5), desc=PARA):
    """A judge reply in the authors' schema, with 1-based atomic_indices."""
    return json.dumps({"criteria": [
        {"name": f"dim {j}", "description": desc, "weight": w, "atomic_indices": list(g)}
        for j, (g, w) in enumerate(zip(groups, list(weights) + [1] * len(groups)))]})


class Scripted:
    """A backend replying from a list (the last reply repeats); records every conversation."""

    def __init__(self, *replies):
        self.replies = list(replies)
        self.seen = []

    def complete(self, batch, max_tokens, temperature):
        out = []
        for conv in batch:
            self.seen.append(conv)
            out.append(Completion(self.replies.pop(0) if len(self.replies) > 1
                                  else self.replies[0]))
        return out


def test_llm_valid_answer_1_based_to_0_based_with_our_weights():
    backend = Scripted(answer([1, 2], [3, 4]))
    res = bundle_rubrics([CHECKLIST], LLMJudge(backend), bundler="llm")
    (r,) = res.rubrics
    assert [d.criteria for d in r.dimensions] == [(0, 1), (2, 3)]
    # W_d = sum |w_i|: 3 + 2 and 1 + |-2|, whatever the model wrote (99, 0.5)
    assert [d.weight for d in r.dimensions] == [5.0, 3.0]
    assert r.meta["model_weights"] == [99.0, 0.5] and r.meta["repaired"] is False
    assert [d.description for d in r.dimensions] == [PARA, PARA]
    assert len(backend.seen) == 1
    system, user = backend.seen[0][0]["content"], backend.seen[0][1]["content"]
    assert "1. (weight 3) Gives the adult dose\n" in user
    assert "4. (weight -2) Recommends doubling the dose" in user
    assert "Use the item numbers 1 to 4" in user and "between 2 and 4 dimensions" in user
    assert "atomic_indices" in system and "description" in system


def test_llm_reference_answer_is_the_anchor():
    backend = Scripted(answer([1, 2], [3, 4]))
    no_ref = Rubric("noref", "q", CHECKLIST.criteria)
    bundle_rubrics([CHECKLIST, no_ref], LLMJudge(backend))
    first, second = (c[1]["content"] for c in backend.seen)
    assert ("# Reference answer (anchor)\n200-400 mg every 4-6 hours with food, at most "
            "1200 mg a day.\n") in first
    assert "# Reference answer (anchor)\n(none given)\n" in second


def test_llm_invalid_then_valid_is_regenerated_once():
    # item 4 missing first; max_reasks=0 so that each judge call is one completion
    backend = Scripted(answer([1, 2], [3]), answer([1, 2], [3, 4]))
    res = bundle_rubrics([CHECKLIST], LLMJudge(backend, max_reasks=0), regenerate=2)
    (r,) = res.rubrics
    assert res.regenerations == 1 and r.meta["bundle_attempts"] == 2
    assert r.meta["repaired"] is False and [d.criteria for d in r.dimensions] == [(0, 1), (2, 3)]
    assert len(backend.seen) == 2
    retry = backend.seen[1][1]["content"]  # a fresh conversation that says what was wrong
    assert len(backend.seen[1]) == 2 and "could not be used" in retry
    assert "items 4 are in no dimension" in retry


def test_llm_always_invalid_is_repaired_deterministically_and_flagged(tmp_path):
    # item 2 in both dimensions, item 4 in none, every time
    bad = answer([1, 2], [2, 3])
    runs = []
    for _ in range(2):
        backend = Scripted(bad)
        res = bundle_rubrics([CHECKLIST], LLMJudge(backend, max_reasks=1), regenerate=2)
        runs.append(res)
        # 1 + 2 requests, each with its re-ask inside the judge
        assert len(backend.seen) == 6 and res.regenerations == 2
    assert runs[0] == runs[1]
    (r,) = runs[0].rubrics
    assert runs[0].repaired == ("dose",) and runs[0].failed == ()
    assert r.meta["repaired"] is True and r.meta["bundle_attempts"] == 3
    assert "item 2 is in more than one dimension" in r.meta["bundle_problem"]
    # duplicate 1 (0-based) stays in the first dimension; orphan 3 joins the nearest (2)
    assert [d.criteria for d in r.dimensions] == [(0, 1), (2, 3)]
    assert [d.weight for d in r.dimensions] == [5.0, 3.0]
    assert r.dimensions[1].description == (
        PARA + " It also fails if it does any of the following: Recommends doubling the dose.")
    out = tmp_path / "b.jsonl"
    save_rubrics(runs[0].rubrics, out)
    (back,) = load_rubrics(out, "native")
    assert back.dimensions == r.dimensions and back.meta["repaired"] is True


def test_llm_unreadable_every_time_fails_and_is_not_written():
    backend = Scripted("no json here")
    res = bundle_rubrics([CHECKLIST], LLMJudge(backend, max_reasks=0), regenerate=2)
    assert res.rubrics == () and res.repaired == () and len(backend.seen) == 3
    assert "no JSON object found" in res.failed[0][1]


def test_llm_k1_and_short_descriptions():
    backend = Scripted(answer([1, 2, 3, 4], desc="Too short."),
                       answer([1, 2, 3, 4], weights=(8,)))
    res = bundle_rubrics([CHECKLIST], LLMJudge(backend, max_reasks=0, k_min=1, k_max=1),
                         k_min=1, k_max=1)
    (r,) = res.rubrics
    assert r.num_dims == 1 and r.dimensions[0].weight == 8.0 and res.regenerations == 1
    user = backend.seen[0][1]["content"]
    assert "Write exactly 1 dimension." in user and "3 to 8 sentences" in user
    assert "has 1 sentence, need 2 to 10" in backend.seen[1][1]["content"]
