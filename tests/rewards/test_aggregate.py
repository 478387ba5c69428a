"""Aggregators (rewards/aggregate.py) and incentive gradients (rewards/incentives.py).

Expected values are written out as arithmetic from the papers' formulas; gradients are checked
against the closed forms, central finite differences, and exact enumeration over 2^C outcomes.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rewards.aggregate import (
    AGGREGATORS,
    additive,
    additive_abs,
    healthbench_dataset_score,
    prorubric,
    rating_reward,
    raw_and,
    validate_weights,
)
from rewards.incentives import (
    closed_form_additive_grad,
    closed_form_prorubric_grad,
    expected_reward,
    expected_reward_grad,
    incentive_report,
)
from rewards.rubric import RubricError, to_arrays
from rewards.rubric_io import load_rubrics
from tests.paths import FIXTURES

FIX = FIXTURES / "rubrics"

# The running example: HealthBench-style chest-pain rubric bundled into 3 dimensions.
#   0: "calls emergency services"  w=10   dim 0 (triage)
#   1: "aspirin"                   w=5    dim 1 (first aid)
#   2: "waits to see" (pitfall)    w=-8   dim 0 (triage)
#   3: "concise"                   w=2    dim 2 (communication)
W = np.array([10.0, 5.0, -8.0, 2.0], np.float32)
D = np.array([0, 1, 0, 2], np.int32)
# w~ = (10 + 8, 5, 2) = (18, 5, 2), sum w~ = 25


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def f32(x):
    return np.asarray(x, np.float32)


# --------------------------------------------------------------------------------------------
# additive
# --------------------------------------------------------------------------------------------


def test_additive_by_hand():
    q = f32([[1, 0, 1, 1], [1, 1, 0, 1], [0, 0, 1, 0], [0, 0, 0, 0]])
    r = np.asarray(additive(q, W))
    expected = [
        (10 + 0 - 8 + 2) / (10 + 5 + 2),  # pitfall present: subtracts 8
        (10 + 5 + 2) / (10 + 5 + 2),  # all good, pitfall avoided: 1
        (-8) / (10 + 5 + 2),  # only the pitfall: negative, not clipped
        0.0,
    ]
    np.testing.assert_allclose(r, expected, rtol=1e-6)
    r_abs = np.asarray(additive_abs(q, W))
    np.testing.assert_allclose(r_abs, [4 / 25, 17 / 25, -8 / 25, 0.0], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(additive(q, W, normalize="abs")), r_abs)


def test_additive_probabilities_and_1d():
    p = f32([0.9, 0.5, 0.2, 0.6])
    expected = (10 * 0.9 + 5 * 0.5 - 8 * 0.2 + 2 * 0.6) / 17
    r = additive(p, W)
    assert r.shape == ()
    np.testing.assert_allclose(float(r), expected, rtol=1e-6)


def test_additive_rejects_unknown_normalize():
    with pytest.raises(ValueError, match="normalize"):
        additive(f32([[1, 0, 1, 1]]), W, normalize="max")


def test_healthbench_dataset_score_clips_only_the_mean():
    np.testing.assert_allclose(float(healthbench_dataset_score(f32([-0.5, 0.2]))), 0.0)
    np.testing.assert_allclose(float(healthbench_dataset_score(f32([1.2, 1.0]))), 1.0)
    np.testing.assert_allclose(float(healthbench_dataset_score(f32([-0.2, 0.8]))), 0.3, rtol=1e-6)


def test_rating_reward():
    np.testing.assert_allclose(
        np.asarray(rating_reward(np.array([1, 10, 5.5, 4, 0, 12]))),
        [0.0, 1.0, 4.5 / 9, 3 / 9, 0.0, 1.0],
        rtol=1e-6,
    )


# --------------------------------------------------------------------------------------------
# ProRubric / raw-AND
# --------------------------------------------------------------------------------------------


def test_prorubric_by_hand():
    q = f32([[1, 1, 0, 1], [1, 0, 1, 1], [1, 1, 0, 1], [0, 1, 0, 1], [1, 1, 0, 0]])
    fail = f32([[0, 0, 0], [0, 0, 0], [1, 0, 0], [0, 0, 0], [0, 0, 1]])
    r = np.asarray(prorubric(q, W, D, fail))
    expected = [
        # s~ = (1*(1-0), 1, 1): every dimension complete
        (18 * 1 + 5 * 1 + 2 * 1) / 25,
        # triage: q0=1 but pitfall present (1-1=0) -> 0; first aid 0; communication 1
        (18 * 0 + 5 * 0 + 2 * 1) / 25,
        # triage complete but its failure clause fired
        (18 * 0 + 5 * 1 + 2 * 1) / 25,
        # emergency call missing kills triage despite the pitfall being avoided
        (18 * 0 + 5 * 1 + 2 * 1) / 25,
        # failure clause on the single-criterion "communication" dimension (q3 = 0 anyway)
        (18 * 1 + 5 * 1 + 2 * 0) / 25,
    ]
    np.testing.assert_allclose(r, expected, rtol=1e-6)


def test_raw_and_ignores_failure_clauses():
    q = f32([[1, 1, 0, 1], [1, 0, 1, 1]])
    fail = f32([[1, 1, 1], [0, 0, 1]])
    np.testing.assert_allclose(np.asarray(raw_and(q, W, D, fail)), [25 / 25, 2 / 25], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(raw_and(q, W, D)), [1.0, 2 / 25], rtol=1e-6)
    # prorubric without fail equals raw-AND
    np.testing.assert_allclose(np.asarray(prorubric(q, W, D)), [1.0, 2 / 25], rtol=1e-6)


def test_prorubric_probabilities():
    p = f32([[0.9, 0.5, 0.2, 0.6]])
    fail = f32([[0, 0, 0.5]])
    # s~ = (0.9 * (1 - 0.2), 0.5, 0.6 * (1 - 0.5))
    expected = (18 * 0.9 * 0.8 + 5 * 0.5 + 2 * 0.6 * 0.5) / 25
    np.testing.assert_allclose(np.asarray(prorubric(p, W, D, fail)), [expected], rtol=1e-6)


def test_single_dimension_criterion_and_num_dims():
    # two dims; the second holds a single pitfall only (w~ = |-3| = 3)
    w = f32([4, 2, -3])
    d = np.array([0, 0, 1])
    q = f32([[1, 1, 1], [1, 1, 0], [1, 0, 0]])
    expected = [(6 * 1 + 3 * 0) / 9, (6 * 1 + 3 * 1) / 9, (6 * 0 + 3 * 1) / 9]
    for k in (None, 2, 5):
        np.testing.assert_allclose(np.asarray(raw_and(q, w, d, num_dims=k)), expected, rtol=1e-6)


def test_padding_and_masks():
    # the running example padded to C=7; padded entries have garbage q, weights and dims
    wp = f32([10, 5, -8, 2, 0, 7, -1])
    dp = np.array([0, 1, 0, 2, -1, 0, 1])
    mask = np.array([1, 1, 1, 1, 0, 0, 0], bool)
    q = f32([[1, 1, 0, 1, 0.3, 0, 1], [1, 0, 1, 1, 1, 1, 0]])
    fail = f32([[0, 0, 0, 1, 1], [0, 0, 0, 1, 1]])  # K=5: dims 3, 4 are padding
    np.testing.assert_allclose(
        np.asarray(prorubric(q, wp, dp, fail, mask=mask)), [1.0, 2 / 25], rtol=1e-6
    )
    np.testing.assert_allclose(np.asarray(additive(q, wp, mask=mask)), [17 / 17, 4 / 17], rtol=1e-6)
    np.testing.assert_allclose(
        np.asarray(additive_abs(q, wp, mask=mask)), [17 / 25, 4 / 25], rtol=1e-6
    )


@pytest.mark.parametrize("name", ["additive", "additive_abs", "prorubric", "raw_and"])
def test_fully_padded_rows_are_zero_and_nan_free(name):
    agg = AGGREGATORS.get(name)
    q = f32([[0.5, 0.2, 1.0], [0.5, 0.2, 1.0]])
    w = f32([[3, -1, 2], [0, 0, 0]])
    d = np.array([[0, 0, 1], [-1, -1, -1]])
    m = np.array([[1, 1, 1], [0, 0, 0]], bool)
    fail = f32([[0, 0], [0, 0]])
    r = np.asarray(agg(q, w, d, fail, mask=m))
    assert np.isfinite(r).all() and r[1] == 0.0
    g = jax.grad(lambda x: agg(x, w, d, fail, mask=m).sum())(jnp.asarray(q))
    assert np.isfinite(np.asarray(g)).all()
    np.testing.assert_array_equal(np.asarray(g)[1], 0.0)


def test_registry_names_and_common_signature():
    assert AGGREGATORS.names() == ["additive", "additive_abs", "pass_rate", "prorubric", "raw_and",
                                   "rubric_rl"]
    assert AGGREGATORS.get("rubric_rl") is additive
    q = f32([[1, 1, 0, 1]])
    for name in AGGREGATORS:
        r = AGGREGATORS.get(name)(q, W, D, f32([[0, 0, 0]]), mask=np.ones(4, bool))
        # abs normaliser counts |-8|; pass_rate: all four satisfied (the pitfall is absent)
        expected = 17 / 25 if name == "additive_abs" else 1.0
        np.testing.assert_allclose(np.asarray(r), [expected], rtol=1e-6)
    with pytest.raises(KeyError, match="unknown aggregator"):
        AGGREGATORS.get("sum")


def test_and_product_needs_dim_index():
    with pytest.raises(ValueError, match="dim_index"):
        prorubric(f32([[1, 1, 0, 1]]), W)


# --------------------------------------------------------------------------------------------
# weight validation
# --------------------------------------------------------------------------------------------


def test_validate_weights():
    validate_weights(W)
    validate_weights(
        np.array([[1, -1, 0], [0, 0, 0]]), mask=np.array([[1, 1, 0], [0, 0, 0]], bool)
    )  # a fully padded row is fine
    with pytest.raises(RubricError, match="no positive weight") as e:
        validate_weights(np.zeros((2, 3)), prompt_ids=["a", "b"])
    assert e.value.prompt_id == "a" and e.value.field == "weights"
    with pytest.raises(RubricError, match="row 1 has no positive weight"):
        validate_weights(np.array([[1.0, 0.0], [-1.0, -2.0]]))
    # the only positive weight is padding
    with pytest.raises(RubricError, match="row 0"):
        validate_weights(np.array([[0.0, 5.0]]), mask=np.array([[True, False]]))
    with pytest.raises(RubricError, match="non-finite"):
        validate_weights(np.array([1.0, np.nan]))
    with pytest.raises(RubricError, match="no valid criterion"):
        validate_weights(np.zeros((1, 2)), mask=np.zeros((1, 2), bool), allow_padding_rows=False)


# --------------------------------------------------------------------------------------------
# jit / vmap vs a Python loop
# --------------------------------------------------------------------------------------------


def _random_batch(seed: int, p: int = 3, g: int = 4, c: int = 6, k: int = 3):
    """P prompts with different checklist sizes, padded to C; G responses per prompt."""
    rng = np.random.default_rng(seed)
    n_c = [6, 4, 3][:p]
    n_k = [3, 2, 2][:p]
    w = np.zeros((p, c), np.float32)
    d = np.full((p, c), -1, np.int32)
    m = np.zeros((p, c), bool)
    for i in range(p):
        w[i, : n_c[i]] = rng.choice([-4, -1, 1, 2, 5, 10], size=n_c[i])
        w[i, 0] = 3.0  # at least one positive weight
        d[i, : n_c[i]] = np.concatenate(
            [np.arange(n_k[i]), rng.integers(0, n_k[i], n_c[i] - n_k[i])]
        )
        m[i, : n_c[i]] = True
    q = rng.uniform(size=(p, g, c)).astype(np.float32)
    q[0, :2] = (q[0, :2] > 0.5).astype(np.float32)  # some hard 0/1 judgments
    fail = (rng.uniform(size=(p, g, k)) < 0.3).astype(np.float32)
    return q, w, d, m, fail


@pytest.mark.parametrize("name", ["additive", "additive_abs", "prorubric", "raw_and"])
def test_jit_and_vmap_match_python_loop(name):
    agg = AGGREGATORS.get(name)
    q, w, d, m, fail = _random_batch(0)
    p, g, _ = q.shape

    def per_prompt(q_, w_, d_, f_, m_):
        return agg(q_, w_, d_, f_, mask=m_)

    vm = jax.jit(jax.vmap(per_prompt))(q, w, d, fail, m)
    loop = np.array(
        [
            [float(agg(q[i, j], w[i], d[i], fail[i, j], mask=m[i])) for j in range(g)]
            for i in range(p)
        ]
    )
    assert vm.shape == (p, g)
    np.testing.assert_allclose(np.asarray(vm), loop, rtol=1e-6, atol=1e-7)
    # flattened batch with per-example weights [B, C]
    flat = jax.jit(per_prompt)(
        q.reshape(p * g, -1),
        np.repeat(w, g, 0),
        np.repeat(d, g, 0),
        fail.reshape(p * g, -1),
        np.repeat(m, g, 0),
    )
    np.testing.assert_allclose(np.asarray(flat), loop.reshape(-1), rtol=1e-6, atol=1e-7)


def test_to_arrays_feeds_the_aggregators():
    rubrics = load_rubrics(FIX / "native_bundled.jsonl") + load_rubrics(FIX / "healthbench.jsonl")
    arr = to_arrays(rubrics, max_criteria=6, max_dims=5)
    q = np.ones((3, 6), np.float32)
    q[:, 2] = 0.0  # avoid the pitfall of the chest-pain rubric
    r_add = np.asarray(
        jax.vmap(lambda q_, w_, m_: additive(q_, w_, mask=m_))(q, arr.weights, arr.mask)
    )
    # hb-0002: weights (7, 4, -6): q = (1, 1, 0) -> 11/11
    np.testing.assert_allclose(r_add, [1.0, 1.0, (7 + 4) / 11], rtol=1e-6)
    r_and = prorubric(q[:1], arr.weights[0], arr.dim_index[0], np.zeros((1, 5)), mask=arr.mask[0])
    np.testing.assert_allclose(np.asarray(r_and), [1.0], rtol=1e-6)


# --------------------------------------------------------------------------------------------
# incentive gradients
# --------------------------------------------------------------------------------------------


def _enumerated_expectation(agg, p, w, d, fail, mask=None):
    """E[R] by exact enumeration of all 2^C outcomes of independent Bernoulli(p) criteria."""
    c = p.shape[-1]
    outcomes = jnp.asarray(list(itertools.product([0.0, 1.0], repeat=c)), p.dtype)  # [2^C, C]
    prob = jnp.prod(jnp.where(outcomes == 1, p, 1 - p), axis=-1)  # [2^C]
    f = None if fail is None else jnp.broadcast_to(fail, (outcomes.shape[0], fail.shape[-1]))
    r = agg(outcomes, w, d, f, mask=mask)
    return jnp.sum(prob * r)


@pytest.mark.parametrize("name", ["additive", "additive_abs", "prorubric", "raw_and"])
def test_expected_reward_equals_exact_enumeration(name, x64):
    agg = AGGREGATORS.get(name)
    rng = np.random.default_rng(1)
    w = np.array([3.0, -2.0, 1.0, 5.0, -1.0, 2.0])
    d = np.array([0, 0, 1, 1, 1, 2])
    fail = np.array([0.0, 1.0, 0.0])
    for _ in range(3):
        p = jnp.asarray(rng.uniform(size=6))
        exact = _enumerated_expectation(agg, p, w, d, fail)
        np.testing.assert_allclose(
            float(expected_reward(name, p, w, d, fail)), float(exact), rtol=1e-12
        )
        # and the gradient of the enumerated expectation is the incentive gradient
        g_exact = jax.grad(lambda x: _enumerated_expectation(agg, x, w, d, fail))(p)
        g = expected_reward_grad(name, p, w, d, fail)
        np.testing.assert_allclose(np.asarray(g), np.asarray(g_exact), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["additive", "additive_abs", "prorubric", "raw_and"])
def test_grad_matches_central_finite_differences(name, x64):
    agg = AGGREGATORS.get(name)
    q, w, d, m, fail = _random_batch(2)
    p = np.clip(q[1].astype(np.float64), 0.05, 0.95)  # prompt 1: 4 criteria of 6, 2 dims
    w, d, m, fail = w[1].astype(np.float64), d[1], m[1], fail[1].astype(np.float64)
    g = np.asarray(expected_reward_grad(name, p, w, d, fail, mask=m))
    eps = 1e-6
    fd = np.zeros_like(p)
    for b in range(p.shape[0]):
        for i in range(p.shape[1]):
            hi, lo = p.copy(), p.copy()
            hi[b, i] += eps
            lo[b, i] -= eps
            fd[b, i] = (
                float(agg(hi[b], w, d, fail[b], mask=m)) - float(agg(lo[b], w, d, fail[b], mask=m))
            ) / (2 * eps)
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)
    np.testing.assert_array_equal(g[:, ~m], 0.0)  # padding gets no incentive


def test_grad_matches_closed_forms(x64):
    q, w, d, m, fail = _random_batch(3)
    for i in range(q.shape[0]):
        p = q[i].astype(np.float64)
        wi = w[i].astype(np.float64)
        fi = fail[i].astype(np.float64)
        g = expected_reward_grad("prorubric", p, wi, d[i], fi, mask=m[i])
        cf = closed_form_prorubric_grad(p, wi, d[i], mask=m[i], fail=fi)
        np.testing.assert_allclose(np.asarray(g), np.asarray(cf), rtol=1e-10, atol=1e-12)
        g0 = expected_reward_grad("raw_and", p, wi, d[i], mask=m[i], num_dims=3)
        cf0 = closed_form_prorubric_grad(p, wi, d[i], mask=m[i])
        np.testing.assert_allclose(np.asarray(g0), np.asarray(cf0), rtol=1e-10, atol=1e-12)
        for norm, name in (("positive", "additive"), ("abs", "additive_abs")):
            ga = expected_reward_grad(name, p, wi, mask=m[i])
            cfa = closed_form_additive_grad(p, wi, mask=m[i], normalize=norm)
            np.testing.assert_allclose(np.asarray(ga), np.asarray(cfa), rtol=1e-10, atol=1e-12)


def test_prorubric_grad_by_hand():
    # criterion 0's dimension-mate is the pitfall 2 with p2 = 0, i.e. p'_2 = 1 - 0 = 1
    p = f32([0.3, 0.5, 0.0, 0.6])
    g = np.asarray(expected_reward_grad("prorubric", p, W, D, f32([0, 0, 0])))
    np.testing.assert_allclose(g[0], 18 / 25, rtol=1e-6)  # w~_0 / sum w~
    np.testing.assert_allclose(g[1], 5 / 25, rtol=1e-6)  # single-criterion dimension
    np.testing.assert_allclose(g[2], -18 / 25 * 0.3, rtol=1e-6)  # pitfall: sign flipped
    np.testing.assert_allclose(g[3], 2 / 25, rtol=1e-6)
    # with the triage failure clause fired, triage criteria carry no incentive
    gf = np.asarray(expected_reward_grad("prorubric", p, W, D, f32([1, 0, 0])))
    np.testing.assert_allclose(gf, [0, 5 / 25, 0, 2 / 25], atol=1e-7)
    # additive: constant w_i / sum_{w>0} w
    ga = np.asarray(expected_reward_grad("additive", p, W))
    np.testing.assert_allclose(ga, [10 / 17, 5 / 17, -8 / 17, 2 / 17], rtol=1e-6)


def test_grad_is_full_dimension_weight_when_mates_are_met(x64):
    rng = np.random.default_rng(4)
    w = np.array([2.0, 3.0, -1.0, 4.0, 6.0])
    d = np.array([0, 0, 0, 1, 1])
    # dimension-mates of criterion 1 (0 and pitfall 2) are satisfied: p0 = 1, p2 = 0
    p = np.array([1.0, rng.uniform(), 0.0, rng.uniform(), rng.uniform()])
    g = np.asarray(expected_reward_grad("prorubric", p, w, d))
    np.testing.assert_allclose(g[1], (2 + 3 + 1) / (2 + 3 + 1 + 4 + 6), rtol=1e-12)


def test_grad_shapes_and_batched_weights():
    q, w, d, m, fail = _random_batch(5)
    p = q.reshape(-1, q.shape[-1])
    wb, db, mb = (np.repeat(x, q.shape[1], 0) for x in (w, d, m))
    fb = fail.reshape(-1, fail.shape[-1])
    g = expected_reward_grad("prorubric", p, wb, db, fb, mask=mb)
    assert g.shape == p.shape
    cf = closed_form_prorubric_grad(p, wb, db, mask=mb, fail=fb)
    np.testing.assert_allclose(np.asarray(g), np.asarray(cf), rtol=1e-5, atol=1e-6)


def test_incentive_report():
    (rubric,) = load_rubrics(FIX / "native_bundled.jsonl")
    rows = incentive_report(rubric, [0.3, 0.5, 0.0, 0.6], aggregators=("additive", "prorubric"))
    assert [r["dimension"] for r in rows] == ["triage", "first_aid", "triage", "communication"]
    assert rows[0]["criterion"] == rubric.criteria[0].text and rows[2]["weight"] == -8.0
    np.testing.assert_allclose(
        [r["grad_prorubric"] for r in rows], [18 / 25, 5 / 25, -18 / 25 * 0.3, 2 / 25], rtol=1e-6
    )
    np.testing.assert_allclose([r["grad_additive"] for r in rows], W / 17, rtol=1e-6)
    rows_f = incentive_report(rubric, 0.5, aggregators=("prorubric", "raw_and"), fail=[1, 0, 0])
    assert rows_f[0]["grad_prorubric"] == 0.0 and rows_f[0]["grad_raw_and"] > 0
    (unbundled, *_) = load_rubrics(FIX / "healthbench.jsonl")
    assert len(incentive_report(unbundled, 0.5, aggregators=("additive",))) == 4
    with pytest.raises(RubricError, match="bundled"):
        incentive_report(unbundled, 0.5, aggregators=("prorubric",))
