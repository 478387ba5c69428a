"""algo.rubric_gate (memory.gating): the rubric term paid only to correct answers, by hand."""

import numpy as np
import pytest

from judges.rule import RuleJudge
from memory.gating import check_gate, paid_mask
from memory.reward import GroupInput, combine_active
from memory.state import MemoryConfig
from memory.static import StaticRubric, static_rubric_step
from tests.memory.helpers import g3

# R_base [1, .5, 0, -1]: member 3's format is invalid (R_base -1) though its answer's F1 is 1
GROUP = GroupInput("x", "Where?", ("paris",), ("a", "b", "c", "d"), (1.0, 0.5, 0.0, -1.0),
                   f1=(1.0, 0.5, 0.0, 1.0))


@pytest.mark.parametrize("gate, threshold, paid", [
    ("none", 1.0, [True, True, True, True]),
    ("positive_only", 1.0, [True, False, False, False]),  # F1 1 and a valid format
    ("positive_only", 0.5, [True, True, False, False]),
])
def test_who_is_paid(gate, threshold, paid):
    np.testing.assert_array_equal(paid_mask([GROUP], gate, threshold, (1, 4))[0], paid)


def test_positive_only_pays_the_rubric_term_to_correct_answers_alone():
    # one active slot, centred scores [.3, -.1, .2, -.4]; lambda .5:
    # none:          R = R_base + .5 s~ = [1.15, .45, .1, -1.2]
    # positive_only: member 0 alone keeps its term: [1.15, .5, 0, -1]
    centred = np.array([0.3, -0.1, 0.2, -0.4])[None, None, :]
    s, total = combine_active([GROUP], centred, 0.5, "sum")
    np.testing.assert_allclose(total[0], [1.15, 0.45, 0.1, -1.2])
    paid = paid_mask([GROUP], "positive_only", 1.0, (1, 4))
    s_gated, gated = combine_active([GROUP], centred, 0.5, "sum", paid)
    np.testing.assert_allclose(gated[0], [1.15, 0.5, 0.0, -1.0])
    np.testing.assert_allclose(s_gated, s)  # s~ itself is reported whole


def test_rar_under_the_gate_by_hand():
    """The static-rubric scores of test_static_rubric_scores_by_hand on q3 (s~ = [.4, -.2, .4,
    -.6], R_base 0, every answer's F1 0): positive_only at F1 1 pays nobody; at F1 0 every
    valid member, which is all of them."""
    rubrics = (StaticRubric("tag:search", "", 3.0), StaticRubric("contains:thames", "", -2.0))
    nobody = static_rubric_step([g3()], rubrics, RuleJudge(), 0.5, "positive_only", 1.0)
    np.testing.assert_allclose(nobody.total_rewards[0], [0.0] * 4)
    everyone = static_rubric_step([g3()], rubrics, RuleJudge(), 0.5, "positive_only", 0.0)
    np.testing.assert_allclose(everyone.total_rewards[0], 0.5 * np.array([0.4, -0.2, 0.4, -0.6]))


def test_bad_gate_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="rubric_gate must be one of"):
        MemoryConfig(rubric_gate="always")
    with pytest.raises(ValueError, match="correct_at must be a finite outcome value"):
        check_gate("positive_only", float("nan"))


def test_arbor_reports_the_share_it_withheld():
    """q1: F1 [1, 0, 0, 0], member 3 invalid: positive_only pays member 0 alone, 3 of 4
    withheld; without the gate no such metric."""
    from memory.reward import arbor_reward_step
    from memory.state import RubricMemory
    from tests.memory.helpers import g1

    cfg = MemoryConfig(rubric_gate="positive_only", use_common_pool=False)
    out = arbor_reward_step(RubricMemory(), [g1()], RuleJudge(seed=0), cfg, step=0, seed=0)
    assert out.metrics["memory/gated_frac"] == 0.75
    plain = arbor_reward_step(RubricMemory(), [g1()], RuleJudge(seed=0),
                              MemoryConfig(use_common_pool=False), step=0, seed=0)
    assert "memory/gated_frac" not in plain.metrics
