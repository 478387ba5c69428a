"""memory.lineage: the order of mastery and the lineage records, by hand."""

from judges.types import Draft
from memory.lineage import mastery_order, retired_at
from memory.state import CommonRubric, RubricMemory


def _retired(cid, step, reason, created=0, uses=3):
    return CommonRubric(id=cid, draft=Draft(f"title {cid}", "d"), source_ids=(), uses=uses,
                        created_step=created, retired_step=step, retired_reason=reason)


MEMORY = RubricMemory(retired=(_retired("c2", 7, "mastered"), _retired("c0", 4, "mastered"),
                               _retired("c1", 5, "drifted"), _retired("c3", 7, "mastered", 2)))


def test_the_order_of_mastery():
    # c0 at step 4; c2 and c3 both at step 7 (ties by id); c1 drifted, not mastered
    assert mastery_order(MEMORY) == ["c0", "c2", "c3"]


def test_the_records_of_a_step():
    got = retired_at(MEMORY, 7)
    assert [(r["common_id"], r["reason"], r["mastery_rank"]) for r in got] == [
        ("c2", "mastered", 2), ("c3", "mastered", 3)]
    assert got[1]["title"] == "title c3" and got[1]["created_step"] == 2 and got[1]["uses"] == 3
    assert [(r["common_id"], r["mastery_rank"]) for r in retired_at(MEMORY, 5)] == [("c1", None)]
    assert retired_at(MEMORY, 6) == []


def test_the_recently_mastered_rubrics_latest_first():
    from memory.lineage import recently_mastered

    assert [d.title for d in recently_mastered(MEMORY, 2)] == ["title c3", "title c2"]
    assert [d.title for d in recently_mastered(MEMORY, 9)] == ["title c3", "title c2",
                                                                "title c0"]


def test_the_judge_is_shown_the_mastered_rubrics_only_when_asked():
    """ARBOR w/o memory on q1 (it induces at step 0): with lineage_in_induction every
    induction request carries the memory's 2 most recently mastered rubrics, and an LLM judge
    renders them into its prompt (induce_lineage); without, the paper's prompt."""
    from judges.llm import LLMJudge
    from judges.types import Completion, InduceRequest
    from memory.reward import arbor_reward_step
    from memory.state import MemoryConfig
    from tests.memory.helpers import Recorder, g1

    seen = []

    def induce(reqs):
        seen.extend(reqs)
        return [() for _ in reqs]

    for on in (True, False):
        seen.clear()
        cfg = MemoryConfig(use_common_pool=False, lineage_in_induction=on, lineage_k=2)
        arbor_reward_step(MEMORY, [g1()], Recorder(induce=induce), cfg, step=9, seed=0)
        assert seen and all(r.mastered == ((Draft("title c3", "d"), Draft("title c2", "d"))
                                           if on else ()) for r in seen)

    class Backend:
        def __init__(self):
            self.batches = []

        def complete(self, batch, max_tokens, temperature):
            self.batches.append(batch)
            return [Completion('{"rubrics": []}')] * len(batch)

        def stats(self):
            return {}

        def close(self):
            pass

    backend = Backend()
    judge = LLMJudge(backend)
    req = InduceRequest("q?", "best", None, "worst", ("a",))
    judge.induce([req, InduceRequest("q?", "best", None, "worst", ("a",),
                                     mastered=(Draft("Plan first", "make a plan"),))])
    plain, shown = (m[1]["content"] for m in backend.batches[0])
    assert "already mastered" not in plain
    assert "already mastered" in shown and "1. Plan first: make a plan" in shown


def _retire_once(check):
    """One ARBOR step on q3 whose only common rubric is at its last low-variance activation
    (retire_k 0, every comparison a tie: within-group variance 0 -> n_r 1 > 0, retired). The
    judge's checks of the retiring rubric on q3's four members are `check`'s answer."""
    from judges.types import PairResult
    from memory.events import Retired
    from memory.reward import arbor_reward_step
    from memory.state import MemoryConfig
    from tests.memory.helpers import ENTITY, Recorder, g3

    mem = RubricMemory(commons=(CommonRubric("c0", ENTITY, ("d9",), 0),), next_id=1)
    judge = Recorder(compare=lambda reqs: [PairResult(-1, 0.5, True) for _ in reqs],
                     check=lambda reqs: [check] * len(reqs))
    out = arbor_reward_step(mem, [g3()], judge, MemoryConfig(retire_k=0, embedder="hash"),
                            step=5, seed=0)
    (event,) = [e for e in out.events if isinstance(e, Retired)]
    return out.memory.retired[0], event, judge.calls


def test_a_low_variance_retirement_is_settled_by_the_judges_pass_rate():
    """All met (pass rate 1): mastered, ranked in the lineage. None met (0): abandoned, not in
    the order of mastery. No real verdict (all fallbacks): mastered as the paper says, no pass
    rate. Each costs one batched check of the four members."""
    from judges.types import CheckResult

    rubric, event, calls = _retire_once(CheckResult(True, 1.0))
    assert (rubric.retired_reason, rubric.retired_pass_rate) == ("mastered", 1.0)
    assert (event.reason, event.pass_rate) == ("mastered", 1.0) and ("check", 4) in calls
    rubric, event, _ = _retire_once(CheckResult(False, 0.0))
    assert (rubric.retired_reason, rubric.retired_pass_rate, event.reason) == (
        "abandoned", 0.0, "abandoned")
    assert mastery_order(RubricMemory(retired=(rubric,))) == []
    assert retired_at(RubricMemory(retired=(rubric,)), 5)[0]["reason"] == "abandoned"
    rubric, event, _ = _retire_once(CheckResult(False, 0.5, fallback=True))
    assert (rubric.retired_reason, rubric.retired_pass_rate, event.pass_rate) == (
        "mastered", None, None)
