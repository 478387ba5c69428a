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
