"""The memory as a value: exact JSON round trips, event logs, operations that never change their
inputs."""

from __future__ import annotations

import copy
import dataclasses
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from judges import (
    Draft,
    RuleJudge,
)
from memory import (
    Admitted,
    Candidate,
    CommonRubric,
    CorrStats,
    DraftRubric,
    GroupInput,
    GroupScores,
    MemoryConfig,
    Merged,
    Rejected,
    Retired,
    RubricMemory,
    admit,
    append_jsonl,
    apply_activation,
    arbor_reward_step,
    consolidate,
    read_jsonl,
    select_active,
)
from tests.memory.helpers import (
    HASH,
    Q1,
    Q2,
    Q3,
    SLOW,
    T1,
    T2,
    T3,
    D,
    _common,
    g1,
    g2,
)

# --- JSON round trip and events ---------------------------------------------------------------

FIDS = ["entity_search", "max_searches:2", "answer_grounded", None]
texts = st.text(max_size=24)
drafts_st = st.builds(Draft, title=texts, description=texts, feature=st.sampled_from(FIDS))
floats01 = st.floats(-1, 1, allow_nan=False)


@st.composite
def memories(draw) -> RubricMemory:
    n_d = draw(st.integers(0, 5))
    n_c = draw(st.integers(0, 5))
    n_r = draw(st.integers(0, 2))
    drafts = tuple(
        DraftRubric(f"d{k}", draw(drafts_st), draw(texts), draw(st.integers(0, 99)),
                    draw(floats01), draw(floats01)) for k in range(n_d)
    )

    def common(k: int, retired: bool) -> CommonRubric:
        pairs = draw(st.lists(st.tuples(floats01, floats01), max_size=8))
        return CommonRubric(
            id=f"c{k}", draft=draw(drafts_st),
            source_ids=tuple(f"d{i}" for i in range(draw(st.integers(0, 3)))),
            created_step=draw(st.integers(0, 99)), n_low_var=draw(st.integers(0, 9)),
            corr=CorrStats().add([x for x, _ in pairs], [y for _, y in pairs]),
            rho_activations=draw(st.integers(0, 9)), uses=draw(st.integers(0, 9)),
            last_used_step=draw(st.integers(-1, 99)), last_used_clock=draw(st.integers(-1, 99)),
            rho_history=tuple(draw(st.lists(floats01, max_size=4))),
            retired_step=draw(st.integers(0, 99)) if retired else None,
            retired_reason=draw(st.sampled_from(["mastered", "drifted"])) if retired else None,
        )

    commons = tuple(common(n_d + k, False) for k in range(n_c))
    retired = tuple(common(n_d + n_c + k, True) for k in range(n_r))
    return RubricMemory(drafts=drafts, commons=commons, retired=retired,
                        next_id=n_d + n_c + n_r, clock=draw(st.integers(0, 99)),
                        basis=draw(st.sampled_from(["", "f1/cumulative", "r_base/centred"])))


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])  # slow on a loaded CPU
@given(memories())
def test_json_round_trip_is_exact(mem):
    text = mem.to_json()
    back = RubricMemory.from_json(text)
    assert back == mem and back.to_json() == text
    json.loads(text)  # plain JSON (no NaN)


def test_json_round_trip_after_a_real_step():
    out = arbor_reward_step(RubricMemory(), [g1(), g2()], RuleJudge(seed=0),
                            MemoryConfig(k_consol=4, embedder="hash"), step=0, seed=1)
    assert out.memory.commons and out.memory.drafts
    assert RubricMemory.from_json(out.memory.to_json(indent=2)) == out.memory


#: A memory as format version 1 (before rubric_outcome / rho_r) wrote it in checkpoints.
V1_JSON = {
    "version": 1,
    "drafts": [{"id": "d1", "draft": {"title": "Entity-targeted search", "description": "x",
                                      "feature": "entity_search"},
                "qid": "q1", "step": 0, "var": 0.25, "rho": 0.7071067811865476,
                "failed_consolidations": 0}],
    "commons": [{"id": "c0", "draft": {"title": "t", "description": "d", "feature": None},
                 "source_ids": ["d0"], "created_step": 0, "n_low_var": 1,
                 "corr": {"n": 4, "sum_x": 0.0, "sum_y": 0.0, "sum_xx": 0.5, "sum_yy": 1.0,
                          "sum_xy": 0.5},
                 "rho_activations": 1, "uses": 2, "last_used_step": 1, "last_used_clock": 1,
                 "merges": 0, "rho_history": [0.7071067811865476], "retired_step": None,
                 "retired_reason": None}],
    "retired": [], "next_id": 2, "clock": 2,
}


def test_version_1_memory_loads_and_is_continued_only_on_its_basis():
    from memory import check_basis
    from rl.rewarders.arbor import ArborRewarder

    mem = RubricMemory.from_dict(copy.deepcopy(V1_JSON))
    assert mem.basis == "r_base/centred"  # all that version 1 computed
    assert mem.common("c0").corr == CorrStats(4, 0.0, 0.0, 0.5, 1.0, 0.5)
    assert mem.drafts[0].rho == pytest.approx(1 / math.sqrt(2)) and mem.clock == 2
    # Its statistics are against R_base, centred: the new defaults refuse to continue them,
    # at once when the checkpoint is read, naming the keys that do continue it.
    default = ArborRewarder(task=None, judge=RuleJudge(), cfg=MemoryConfig(embedder="hash"))
    with pytest.raises(ValueError, match="algo.rubric_outcome=r_base algo.rho_r=centred"):
        default.state_from_json(V1_JSON)
    old = MemoryConfig(embedder="hash", rubric_outcome="r_base", rho_r="centred",
                       min_drift_activations=5, active_combine="mean")
    resumed = ArborRewarder(task=None, judge=RuleJudge(), cfg=old).state_from_json(V1_JSON)
    assert resumed == mem
    out = arbor_reward_step(resumed, [g1()], RuleJudge(seed=0), old, step=2, seed=0)
    assert out.memory.basis == "r_base/centred"
    back = RubricMemory.from_json(out.memory.to_json())
    assert back == out.memory and json.loads(out.memory.to_json())["version"] == 2
    # An empty memory has no statistics: any basis adopts it; a new one records its own.
    empty_v1 = {"version": 1, "drafts": [], "commons": [], "retired": []}
    assert default.state_from_json(empty_v1).basis == "f1/cumulative"
    assert check_basis(RubricMemory(), MemoryConfig(embedder="hash")).basis == "f1/cumulative"
    with pytest.raises(ValueError, match="format version 3"):
        RubricMemory.from_dict({"version": 3})


def test_memory_values_are_frozen():
    mem = RubricMemory(commons=(_common(0),))
    with pytest.raises(dataclasses.FrozenInstanceError):
        mem.clock = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        mem.commons[0].uses = 3  # type: ignore[misc]


def test_events_jsonl_round_trip(tmp_path):
    events = [
        Admitted(step=1, draft_id="d0", qid="q", title="t", var=0.25, rho=0.5),
        Rejected(step=1, qid="q", title="", reason="empty_text", var=float("nan"),
                 rho=float("nan")),
        Merged(step=2, draft_ids=("d0", "d1"), into_id="c3", title="t", cosine=0.95),
        Retired(step=3, common_id="c3", reason="drifted", n_low_var=0, rho=-0.1, uses=4),
    ]
    path = tmp_path / "events.jsonl"
    assert append_jsonl(path, events[:2]) == 2 and append_jsonl(path, events[2:]) == 2
    back = list(read_jsonl(path))
    assert back[0] == events[0] and back[2:] == events[2:]
    assert back[1].reason == "empty_text" and math.isnan(back[1].var)
    assert json.loads(path.read_text().splitlines()[2])["kind"] == "merged"


def test_events_jsonl_bad_lines_name_file_and_line(tmp_path):
    path = tmp_path / "events.jsonl"
    good = Admitted(step=1, draft_id="d0", qid="q", title="t", var=0.25, rho=0.5)
    line = json.dumps(good.to_dict())
    cases = {
        "truncated": line[:40],  # a run killed mid-write
        "missing field": json.dumps({k: v for k, v in good.to_dict().items()
                                     if k != "draft_id"}),
        "unknown kind": json.dumps({"kind": "promoted", "step": 1}),
        "not an object": "[1, 2]",
    }
    want = {"truncated": "invalid JSON", "missing field": "lacks field 'draft_id'",
            "unknown kind": "unknown event kind 'promoted'", "not an object": "JSON object"}
    for name, bad in cases.items():
        path.write_text(f"{line}\n\n{bad}\n")
        with pytest.raises(ValueError, match=f"events.jsonl:3: .*{want[name]}"):
            list(read_jsonl(path))


# --- operations never change their inputs ----------------------------------------------------


def _group_st():
    return st.builds(
        lambda rs, seed: GroupInput(f"q{seed}", [Q1, Q2, Q3][seed % 3], ("x",),
                                    [(T1 + T2 + T3)[(seed + i) % 12] for i in range(len(rs))],
                                    rs),
        st.lists(st.sampled_from([-1.0, 0.0, 0.5, 1.0]), min_size=1, max_size=6),
        st.integers(0, 50),
    )


@SLOW
@given(memories(), st.lists(_group_st(), max_size=4), st.integers(0, 5), st.booleans())
def test_operations_do_not_change_their_inputs(mem, groups, seed, pool):
    cfg = MemoryConfig(k_consol=2, rho_min=0.1, delta_v=0.01, use_common_pool=pool,
                       embedder="hash", retire_k=1, min_drift_activations=1)
    mem = dataclasses.replace(mem, basis="" if mem.basis == "r_base/centred" else mem.basis)
    frozen = copy.deepcopy((mem, groups))
    judge = RuleJudge(seed=seed)
    select_active(mem, seed)
    for c in mem.commons:
        apply_activation(mem, c.id, [GroupScores((1.0, 0.0, 0.5), (0.0, 1.0, 0.5))], cfg, seed)
    consolidate(mem, judge, HASH, cfg, seed)
    scores = (1.0, 0.0, 1.0)
    admit(mem, [Candidate("q", D, scores, (1.0, 0.0, 0.0))], cfg, seed)
    arbor_reward_step(mem, groups, judge, cfg, step=seed, seed=seed, embedder=HASH)
    assert (mem, groups) == frozen
    assert mem.to_json() == frozen[0].to_json() and scores == (1.0, 0.0, 1.0)


