"""Offline bundling: validation of judge answers, per-prompt failure reports, resumable output."""

import json
import re

import pytest

from judges.rule import RuleJudge
from judges.types import Bundle, Dimension
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
from rewards.rubric import Criterion, Rubric, load_rubrics, save_rubrics
from rewards.rubric import Dimension as RubricDimension
from tests.paths import FIXTURES

FIX = FIXTURES / "rubrics"


def rubric(pid: str, n: int = 4, prefix: str = "criterion") -> Rubric:
    crits = tuple(Criterion(f"{prefix} {pid} #{i} (keep: exact text!)", 3.0 - i) for i in range(n))
    return Rubric(prompt_id=pid, prompt=f"question {pid}", criteria=crits)


def D(name, idx, fail=None):
    return Dimension(name, tuple(idx), fail)


GOOD = Bundle((D("a", [0, 1], "fails a"), D("b", [2, 3])))
BAD = {  # prompt id -> (judge answer, a fragment of the reported reason)
    "k1": (Bundle((D("all", [0, 1, 2, 3]),)), "K=1"),
    "k6": (Bundle(tuple(D(f"d{i}", [i]) for i in range(4)) + (D("x", [0]),)), "K=5"),
    "dup": (Bundle((D("a", [0, 1]), D("b", [1, 2, 3]))), "criterion 1 is in dimensions"),
    "missing": (Bundle((D("a", [0]), D("b", [1, 2]))), "[3] are in no dimension"),
    "range": (Bundle((D("a", [0, 1]), D("b", [2, 3, 7]))), "index 7 not in [0, 4)"),
    "name": (Bundle((D("a", [0, 1]), D("a", [2, 3]))), "duplicate dimension name"),
    "empty": (Bundle((D("a", [0, 1, 2, 3]), D("b", []))), "has no criteria"),
    "float": (Bundle((D("a", [0, 1.0]), D("b", [2, 3]))), "index 1.0"),
    "error": (Bundle((), error="unparseable after 1 re-ask"), "unparseable"),
    "notbundle": ({"dimensions": []}, "not a Bundle"),
}


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
    dims = validate_bundle(Bundle((D(" a ", [1, 0], "  "), D("b", [3, 2], " fails b "))), 4)
    assert [(d.name, d.criteria, d.failure) for d in dims] == [
        ("a", (1, 0), None), ("b", (3, 2), "fails b")]
    with pytest.raises(BundleError, match="only 1 criteria"):
        validate_bundle(Bundle((D("a", [0]),)), 1)
    with pytest.raises(BundleError, match="K=3"):
        validate_bundle(Bundle((D("a", [0]), D("b", [1]), D("c", [2, 3]))), 4, k_max=2)


def test_bad_bundles_reported_per_prompt_never_written(tmp_path):
    rubrics = [rubric("ok1"), *(rubric(p) for p in BAD), rubric("ok2")]
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    save_rubrics(rubrics, src)
    judge = FakeJudge({p: a for p, (a, _) in BAD.items()})
    s = run_bundle(src, out, judge, judge_name="fake", options=BundleOptions(batch=5))
    assert s["bundled"] == 2 and s["failed"] == len(BAD) and s["skipped"] == 0
    reasons = {f["prompt_id"]: f["reason"] for f in s["failures"]}
    assert set(reasons) == set(BAD)
    for pid, (_, frag) in BAD.items():
        assert frag in reasons[pid], (pid, reasons[pid])
    written = load_rubrics(out, "native")
    assert [r.prompt_id for r in written] == ["ok1", "ok2"]
    assert json.loads(summary_path(out).read_text())["failed"] == len(BAD)
    # texts and weights unchanged, dimensions attached, failure clause kept
    by_id = {r.prompt_id: r for r in rubrics}
    for r in written:
        assert r.criteria == by_id[r.prompt_id].criteria
        assert [d.criteria for d in r.dimensions] == [(0, 1), (2, 3)]
        assert r.dimensions[0].failure == "fails a" and r.meta["bundler"] == "fake"


def test_wrong_number_of_bundles_fails_every_prompt():
    class Short(FakeJudge):
        def bundle(self, reqs):
            return [GOOD]

    res = bundle_rubrics([rubric("a"), rubric("b")], Short({}))
    assert res.rubrics == () and [p for p, _ in res.failed] == ["a", "b"]
    assert "1 bundles for 2 requests" in res.failed[0][1]


def test_retries_reask_only_the_invalid():
    class Flaky(FakeJudge):
        def bundle(self, reqs):
            first = not self.requests
            out = super().bundle(reqs)
            return [BAD["dup"][0] if first and r.prompt.endswith("b") else o
                    for r, o in zip(reqs, out)]

    judge = Flaky({})
    res = bundle_rubrics([rubric("a"), rubric("b")], judge, retries=1)
    assert [r.prompt_id for r in res.rubrics] == ["a", "b"] and res.failed == ()
    assert judge.requests == ["question a", "question b", "question b"]


def test_bundle_missing_never_rebundles_cached_dimensions():
    cached = rubric("cached").with_dimensions((
        RubricDimension("env", (0, 1), "recommends alcohol to sleep"),
        RubricDimension("rest", (2, 3)),
    ))
    judge = FakeJudge({"bad": BAD["dup"][0]})
    res = bundle_missing([rubric("a"), cached, rubric("bad"), rubric("b")], judge)
    assert judge.requests == ["question a", "question bad", "question b"]  # cached: not asked
    assert [r.prompt_id for r in res.rubrics] == ["a", "cached", "b"]  # input order
    assert res.rubrics[1] is cached and res.rubrics[1].dimensions[0].failure == (
        "recommends alcohol to sleep")
    assert [p for p, _ in res.failed] == ["bad"] and "criterion 1 is in" in res.failed[0][1]
    judge = FakeJudge({})
    assert bundle_missing([cached], judge) == BundleResult((cached,), ())
    assert judge.requests == []
    with pytest.raises(ValueError, match="duplicate prompt id 'a'"):
        bundle_missing([rubric("a"), rubric("a")], FakeJudge({}))


def test_resumable_and_stale(tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    save_rubrics([rubric("a"), rubric("b"), rubric("c")], src)
    j1 = FakeJudge({"b": BAD["dup"][0]})
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


def test_rule_judge_bundling_is_deterministic_and_valid(tmp_path):
    rubrics = load_rubrics(FIX / "healthbench.jsonl") + load_rubrics(FIX / "rar.jsonl")
    a = bundle_rubrics(rubrics, RuleJudge(), bundler="rule")
    b = bundle_rubrics(rubrics, RuleJudge(), bundler="rule")
    assert a == b and a.failed == () and len(a.rubrics) == len(rubrics)
    for r, orig in zip(a.rubrics, rubrics):
        assert r.criteria == orig.criteria and 2 <= r.num_dims <= 5
        assert sorted(i for d in r.dimensions for i in d.criteria) == list(range(r.num_criteria))
    one = Rubric("one", "q", (Criterion("only one", 1.0),))
    res = bundle_rubrics([one], RuleJudge())
    assert res.rubrics == () and "only 1 criteria" in res.failed[0][1]


def test_cli(tmp_path, capsys):
    out = tmp_path / "hb.jsonl"
    assert main([str(FIX / "healthbench.jsonl"), str(out), "judge=rule", "k_max=3"]) == 0
    text = capsys.readouterr().out
    assert "2 bundled, 0 skipped" in text and "summary:" in text
    assert main([str(FIX / "healthbench.jsonl"), str(out), "judge=rule"]) == 0
    assert "0 bundled, 2 skipped" in capsys.readouterr().out
    assert all(2 <= r.num_dims <= 3 for r in load_rubrics(out))
    assert summary_path(out) == tmp_path / "hb.summary.json" and summary_path(out).exists()
    assert main([str(FIX / "healthbench.jsonl"), str(out)]) == 2
    assert main([str(FIX / "healthbench.jsonl"), str(out), "judge=rule", "bogus=1"]) == 2
    assert "unknown option 'bogus'" in capsys.readouterr().err
