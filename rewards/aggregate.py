"""Rubric reward aggregators: additive Rubric-RL, pass rate, ProRubric AND-product, raw-AND;
the RaR implicit reward of a judge's 1..10 rating (``rating_reward``); and the ProRubric
authors' clipped weighted mean of per-dimension verdicts (``clipped_weighted_mean``).

Every registered aggregator has the signature::

    agg(q, weights, dim_index=None, fail=None, *, mask=None, num_dims=None) -> rewards [batch]

* ``q`` [batch, C] (or [C] -> a scalar reward): per-criterion judgments in {0, 1}, or pass
  probabilities in [0, 1].  For a pitfall (``w_i < 0``) ``q_i = 1`` means the undesirable
  behaviour is present.
* ``weights`` [C] or [batch, C]: criterion weights ``w_i`` (negative = pitfall).
* ``dim_index`` [C] or [batch, C]: int dimension of each criterion in ``[0, K)``; ``-1`` (or
  anything outside ``[0, K)``) = in no dimension.  Ignored by the additive aggregators.
* ``fail`` [batch, K] (or [K] with a 1-D ``q``): 1 = the dimension's failure clause fired (may
  also be a probability).  Used only by ``prorubric``.
* ``mask`` [C] or [batch, C]: True = real criterion, False = padding (default: all real).
* ``num_dims``: K when ``fail`` is not given (static; default ``C``, always enough since every
  dimension holds at least one criterion).

They are pure ``jnp`` functions: jit, vmap (e.g. over prompts with different checklists padded
with ``rewards.rubric.to_arrays``) and grad all work.  Rows with no valid weight (fully padded)
get reward 0, never NaN, and their gradients are 0.  Rows whose valid weights are all
non-positive are invalid rubrics; that cannot be raised inside jit, so check arrays host-side
with ``validate_weights`` (the loaders already enforce it per ``Rubric``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, Protocol

import jax.numpy as jnp
import numpy as np

from core.registry import Registry
from rewards.rubric import RubricError

Array = jnp.ndarray


class Aggregator(Protocol):
    def __call__(
        self,
        q: Array,
        weights: Array,
        dim_index: Array | None = None,
        fail: Array | None = None,
        *,
        mask: Array | None = None,
        num_dims: int | None = None,
    ) -> Array: ...


#: Aggregator name -> function, all with the common signature (see the module docstring).
AGGREGATORS: Registry[Aggregator] = Registry("aggregator")


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _float(*xs: Array) -> jnp.dtype:
    return jnp.result_type(*[jnp.asarray(x).dtype for x in xs], jnp.float32)


def _prep(q: Array, weights: Array, mask: Array | None) -> tuple[Array, Array, Array, bool]:
    """Return (q [B, C], weights [B?, C], valid [B?, C], squeeze) in a common float dtype."""
    q = jnp.asarray(q)
    weights = jnp.asarray(weights)
    dt = _float(q, weights)
    squeeze = q.ndim == 1
    q = jnp.atleast_2d(q).astype(dt)
    weights = weights.astype(dt)
    valid = jnp.ones(weights.shape, bool) if mask is None else jnp.asarray(mask).astype(bool)
    return q, weights, valid, squeeze


def _safe_div(num: Array, den: Array) -> Array:
    """``num / den`` where ``den > 0``, else 0 (NaN-free value and gradient)."""
    ok = den > 0
    return jnp.where(ok, num / jnp.where(ok, den, 1), 0)


def _out(r: Array, squeeze: bool) -> Array:
    return r[0] if squeeze else r


# --------------------------------------------------------------------------------------------
# additive
# --------------------------------------------------------------------------------------------


def additive(
    q: Array,
    weights: Array,
    dim_index: Array | None = None,
    fail: Array | None = None,
    *,
    mask: Array | None = None,
    num_dims: int | None = None,
    normalize: Literal["positive", "abs"] = "positive",
) -> Array:
    """Additive Rubric-RL reward (RaR explicit / HealthBench).

    ``R = sum_i w_i q_i / Z`` with ``Z = sum_{i: w_i > 0} w_i`` (``normalize="positive"``,
    HealthBench) or ``Z = sum_i |w_i|`` (``normalize="abs"``, RaR).  Sums run over valid
    criteria.  Per example there is no clipping (pitfalls can make ``R < 0``); HealthBench clips
    only the dataset mean, see ``healthbench_dataset_score``.  ``dim_index``, ``fail`` and
    ``num_dims`` are accepted for the common signature and ignored.
    """
    del dim_index, fail, num_dims
    q, w, valid, squeeze = _prep(q, weights, mask)
    wv = jnp.where(valid, w, 0)
    if normalize == "positive":
        z = jnp.sum(jnp.maximum(wv, 0), axis=-1)
    elif normalize == "abs":
        z = jnp.sum(jnp.abs(wv), axis=-1)
    else:
        raise ValueError(f"normalize must be 'positive' or 'abs', got {normalize!r}")
    num = jnp.sum(jnp.where(valid, wv * q, 0), axis=-1)
    return _out(_safe_div(num, z), squeeze)


def additive_abs(
    q: Array,
    weights: Array,
    dim_index: Array | None = None,
    fail: Array | None = None,
    *,
    mask: Array | None = None,
    num_dims: int | None = None,
) -> Array:
    """``additive(..., normalize="abs")``: ``R = sum_i w_i q_i / sum_i |w_i|`` (RaR)."""
    return additive(q, weights, dim_index, fail, mask=mask, num_dims=num_dims, normalize="abs")


def clipped_weighted_mean(v: Array, weights: Array, mask: Array | None = None) -> Array:
    """The ProRubric authors' reward (``reward/judge_client.py``, every arm of theirs)::

        R = clip01( sum_d W_d v_d / sum_d max(0, W_d) )

    ``v`` [B, K] or [K]: one verdict (or grade / 3) per criterion — a dimension for ProRubric,
    an atomic item for their Rubric-RL arm — with ``v_d = 1`` meaning *present* for ``W_d < 0``.
    It is ``additive`` (positive normalisation) clipped per example; no positive weight -> 0.
    """
    return jnp.clip(additive(v, weights, mask=mask), 0.0, 1.0)


def healthbench_dataset_score(rewards: Array) -> Array:
    """HealthBench dataset score: ``clip(mean_b R_b, 0, 1)`` (only the mean is clipped)."""
    return jnp.clip(jnp.mean(jnp.asarray(rewards)), 0.0, 1.0)


def rating_reward(rating: Array) -> Array:
    """RaR implicit reward (Gunjal et al. 2025, "Rubrics as Rewards"): a judge rates the whole
    response against the whole checklist on 1..10 (``judges.base.Judge.rate``);
    ``R = (rating - 1) / 9``.  Ratings are clipped to [1, 10] first (out-of-range judge
    output maps to 0 or 1).  Not an aggregator over checks: ``algo=implicit`` calls the judge
    (``rewards.rubric_scoring``)."""
    r = jnp.asarray(rating)
    r = r.astype(_float(r))
    return (jnp.clip(r, 1.0, 10.0) - 1.0) / 9.0


def pass_rate(
    q: Array,
    weights: Array,
    dim_index: Array | None = None,
    fail: Array | None = None,
    *,
    mask: Array | None = None,
    num_dims: int | None = None,
) -> Array:
    """Unweighted pass rate of the per-criterion checks (``algo=pass_rate``)::

        R = sum_{i valid} q'_i / #valid,   q'_i = q_i (w_i >= 0), 1 - q_i (pitfall)

    Weights only give the sign.  This was the library's ``implicit`` before the judge could
    rate a whole checklist; RaR's implicit reward is ``rating_reward`` of a judge rating.
    Common aggregator signature; ``dim_index``/``fail`` ignored.
    """
    del dim_index, fail, num_dims
    q, w, valid, squeeze = _prep(q, weights, mask)
    x = jnp.where(w < 0, 1 - q, q)
    n = jnp.sum(valid, axis=-1).astype(q.dtype)
    return _out(_safe_div(jnp.sum(jnp.where(valid, x, 0), axis=-1), n), squeeze)


# --------------------------------------------------------------------------------------------
# AND-product (ProRubric, raw-AND)
# --------------------------------------------------------------------------------------------


def _and_product(
    q: Array,
    weights: Array,
    dim_index: Array | None,
    fail: Array | None,
    mask: Array | None,
    num_dims: int | None,
) -> Array:
    q, w, valid, squeeze = _prep(q, weights, mask)
    if dim_index is None:
        raise ValueError("the AND-product aggregators need dim_index (bundle the rubric first)")
    d = jnp.asarray(dim_index)
    if fail is not None:
        fail = jnp.asarray(fail)
        fail = jnp.atleast_2d(fail).astype(q.dtype)
        k = fail.shape[-1]
    else:
        k = q.shape[-1] if num_dims is None else int(num_dims)
    # pitfalls enter the product as 1 - q
    x = jnp.where(w < 0, 1 - q, q)  # [B, C]
    onehot = (d[..., None] == jnp.arange(k)) & valid[..., None]  # [B?, C, K]
    s = jnp.prod(jnp.where(onehot, x[..., None], 1), axis=-2)  # [B, K]
    if fail is not None:
        s = s * (1 - fail)
    wt = jnp.sum(jnp.where(onehot, jnp.abs(w)[..., None], 0), axis=-2)  # [B?, K]
    r = _safe_div(jnp.sum(wt * s, axis=-1), jnp.sum(wt, axis=-1))
    return _out(jnp.broadcast_to(r, q.shape[:-1]), squeeze)


def prorubric(
    q: Array,
    weights: Array,
    dim_index: Array | None = None,
    fail: Array | None = None,
    *,
    mask: Array | None = None,
    num_dims: int | None = None,
) -> Array:
    """ProRubric protocol-bundled AND-product reward.

    With ``q'_i = q_i`` for ``w_i >= 0`` and ``q'_i = 1 - q_i`` for pitfalls (``w_i < 0``)::

        s~_k = prod_{i in I_k} q'_i * (1 - fail_k)
        w~_k = sum_{i in I_k} |w_i|
        R~   = sum_k w~_k s~_k / sum_k w~_k

    ``I_k = {i valid : dim_index_i == k}``; empty dimensions (padding) have ``w~_k = 0`` and drop
    out; criteria with ``dim_index = -1`` belong to no dimension and are ignored.  ``fail=None``
    means no failure clause fired (then this equals ``raw_and``).
    """
    return _and_product(q, weights, dim_index, fail, mask, num_dims)


def raw_and(
    q: Array,
    weights: Array,
    dim_index: Array | None = None,
    fail: Array | None = None,
    *,
    mask: Array | None = None,
    num_dims: int | None = None,
) -> Array:
    """raw-AND: ProRubric bundling without failure clauses (``fail`` is ignored)::

    s~_k = prod_{i in I_k} q'_i,  R~ = sum_k w~_k s~_k / sum_k w~_k
    """
    if fail is not None and num_dims is None:
        num_dims = jnp.shape(fail)[-1]
    return _and_product(q, weights, dim_index, None, mask, num_dims)


AGGREGATORS.register("additive", "rubric_rl")(additive)
AGGREGATORS.register("additive_abs")(additive_abs)
AGGREGATORS.register("prorubric")(prorubric)
AGGREGATORS.register("raw_and")(raw_and)
AGGREGATORS.register("pass_rate")(pass_rate)


def get_aggregator(agg: str | Callable[..., Array]) -> Callable[..., Array]:
    """An aggregator by registry name, or ``agg`` itself when it is callable."""
    return AGGREGATORS.get(agg) if isinstance(agg, str) else agg


# --------------------------------------------------------------------------------------------
# host-side validation
# --------------------------------------------------------------------------------------------


def validate_weights(
    weights: np.ndarray | Sequence[float] | Sequence[Sequence[float]],
    mask: np.ndarray | None = None,
    prompt_ids: Sequence[str] | None = None,
    allow_padding_rows: bool = True,
) -> None:
    """Host-side check that every row of ``weights`` [C] or [P, C] has a positive valid weight.

    Raises ``RubricError`` naming the row (and its prompt id when ``prompt_ids`` is given) when a
    row has no positive weight among its valid entries, or a non-finite valid weight.  Rows that
    are entirely padding (``mask`` all False) are allowed when ``allow_padding_rows``.
    """
    w = np.atleast_2d(np.asarray(weights, dtype=np.float64))
    m = np.ones(w.shape, bool) if mask is None else np.broadcast_to(np.asarray(mask, bool), w.shape)
    for row in range(w.shape[0]):
        pid = prompt_ids[row] if prompt_ids is not None else f"row {row}"
        valid = m[row]
        if not valid.any():
            if allow_padding_rows:
                continue
            raise RubricError(pid, "mask", f"row {row} has no valid criterion")
        wr = w[row][valid]
        if not np.all(np.isfinite(wr)):
            raise RubricError(pid, "weights", f"row {row} has a non-finite weight")
        if not np.any(wr > 0):
            raise RubricError(pid, "weights", f"row {row} has no positive weight")
