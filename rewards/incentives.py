"""Incentive gradients: which criterion is worth improving, under each aggregator.

Model: the judge's verdicts ``q_i`` are independent Bernoulli(``p_i``) given a policy.  The
incentive of criterion ``i`` is ``dE[R]/dp_i``.

Multilinearity.  Every registered aggregator is, for fixed weights, dimensions and failure
flags, a *multilinear* polynomial in the ``q_i`` (affine in each ``q_i`` separately): the
additive sum is linear, and the AND-product multiplies *distinct* criteria, each ``q'_i`` (``q_i``
or ``1 - q_i``) being affine in ``q_i``.  For independent criteria, expectation factorises over a
product of functions of distinct variables, so ``E[R(q)] = R(p)``: the expected reward is the
aggregator evaluated at the probabilities, and ``dE[R]/dp = grad R(p)``, which we compute with
``jax.grad`` / ``jax.vmap``.  Failure flags are treated as given (fixed), not as random.

Closed forms (``Z`` the additive normaliser, ``W = sum_k w~_k``)::

    additive:   dE[R]/dp_i  = w_i / Z                       (constant in p)
    prorubric:  dE[R~]/dp_i = sign_i (w~_k / W) (1 - fail_k) prod_{j in I_k, j != i} p'_j

with ``k`` the dimension of ``i``, ``sign_i = -1`` for pitfalls (``d(1 - p_i)/dp_i = -1``) and
``p'_j = p_j`` or ``1 - p_j`` for pitfalls.  So under ProRubric an isolated fragment earns almost
nothing while the last missing piece of a nearly complete dimension earns its whole weight.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rewards.aggregate import Array, _float, get_aggregator
from rewards.rubric import Rubric, RubricError


def expected_reward(
    aggregator: str | Callable[..., Array],
    p: Array,
    weights: Array,
    dim_index: Array | None = None,
    fail: Array | None = None,
    mask: Array | None = None,
    **agg_kwargs: Any,
) -> Array:
    """``E[R]`` [batch] under independent Bernoulli(p) criteria, i.e. ``R(p)`` by
    multilinearity (module docstring)."""
    agg = get_aggregator(aggregator)
    return agg(p, weights, dim_index, fail, mask=mask, **agg_kwargs)


def expected_reward_grad(
    aggregator: str | Callable[..., Array],
    p: Array,
    weights: Array,
    dim_index: Array | None = None,
    fail: Array | None = None,
    mask: Array | None = None,
    **agg_kwargs: Any,
) -> Array:
    """``dE[R]/dp`` [batch, C] (or [C] for a 1-D ``p``) under independent Bernoulli criteria.

    Since ``E[R] = R(p)`` for multilinear aggregators (module docstring), this is
    ``vmap(grad(R))`` evaluated at ``p``, one example at a time.  ``weights``, ``dim_index`` and
    ``mask`` are [C] (shared) or [batch, C]; ``fail`` [batch, K] is held fixed.  Extra keyword
    arguments (``normalize``, ``num_dims``) go to the aggregator.  Padded criteria get 0.
    """
    agg = get_aggregator(aggregator)
    p = jnp.asarray(p)
    p = p.astype(_float(p))
    squeeze = p.ndim == 1
    p2 = jnp.atleast_2d(p)
    b = p2.shape[0]
    w = jnp.asarray(weights)
    if fail is not None and "num_dims" not in agg_kwargs:
        agg_kwargs = {**agg_kwargs, "num_dims": jnp.shape(fail)[-1]}

    def batched(x: Array | None) -> tuple[Array | None, int | None]:
        if x is None:
            return None, None
        x = jnp.asarray(x)
        return (x, 0) if x.ndim == 2 else (x, None)

    w_, w_ax = batched(w)
    d_, d_ax = batched(dim_index)
    m_, m_ax = batched(mask)
    f_ = None if fail is None else jnp.broadcast_to(jnp.atleast_2d(fail), (b, jnp.shape(fail)[-1]))

    def one(p_row, w_row, d_row, m_row, f_row):
        return agg(p_row, w_row, d_row, f_row, mask=m_row, **agg_kwargs)

    g = jax.vmap(jax.grad(one), in_axes=(0, w_ax, d_ax, m_ax, None if f_ is None else 0))
    out = g(p2, w_, d_, m_, f_)
    return out[0] if squeeze else out


def closed_form_additive_grad(
    p: Array,
    weights: Array,
    mask: Array | None = None,
    normalize: str = "positive",
) -> Array:
    """``dE[R]/dp_i = w_i / Z`` broadcast to ``p``'s shape (0 for padding; 0 when ``Z = 0``).

    ``Z = sum_{w_i > 0} w_i`` (``normalize="positive"``) or ``sum_i |w_i|`` (``"abs"``).
    """
    p = jnp.asarray(p)
    w = jnp.asarray(weights)
    dt = _float(p, w)
    w = w.astype(dt)
    valid = jnp.ones(w.shape, bool) if mask is None else jnp.asarray(mask, bool)
    wv = jnp.where(valid, w, 0)
    if normalize == "positive":
        z = jnp.sum(jnp.maximum(wv, 0), axis=-1, keepdims=True)
    elif normalize == "abs":
        z = jnp.sum(jnp.abs(wv), axis=-1, keepdims=True)
    else:
        raise ValueError(f"normalize must be 'positive' or 'abs', got {normalize!r}")
    g = jnp.where(z > 0, wv / jnp.where(z > 0, z, 1), 0)
    return jnp.broadcast_to(g, jnp.broadcast_shapes(g.shape, p.shape))


def closed_form_prorubric_grad(
    p: Array,
    weights: Array,
    dim_index: Array,
    mask: Array | None = None,
    fail: Array | None = None,
) -> Array:
    """``dE[R~]/dp_i = sign_i (w~_k / sum w~) (1 - fail_k) prod_{j in I_k, j != i} p'_j``.

    ``p`` [batch, C] or [C]; ``weights``/``dim_index``/``mask`` [C] or [batch, C]; ``fail``
    [batch, K] or None.  Computed without division (a pairwise same-dimension mask), so zeros in
    ``p`` are fine.  Criteria in no dimension (``dim_index`` -1) and padding get 0.
    """
    p = jnp.asarray(p)
    w = jnp.asarray(weights)
    dt = _float(p, w)
    squeeze = p.ndim == 1
    p = jnp.atleast_2d(p).astype(dt)
    w = w.astype(dt)
    d = jnp.asarray(dim_index)
    valid = jnp.ones(w.shape, bool) if mask is None else jnp.asarray(mask, bool)
    valid = valid & (d >= 0)
    if fail is not None:
        fail = jnp.atleast_2d(jnp.asarray(fail)).astype(dt)
        k = fail.shape[-1]
        fail = jnp.broadcast_to(fail, (p.shape[0], k))
        valid = valid & (d < k)
    c = p.shape[-1]
    x = jnp.where(w < 0, 1 - p, p)  # [B, C]
    sign = jnp.where(w < 0, -1.0, 1.0).astype(dt)
    absw = jnp.where(valid, jnp.abs(w), 0)
    total = jnp.sum(absw, axis=-1, keepdims=True)  # sum_k w~_k
    same = (d[..., :, None] == d[..., None, :]) & valid[..., :, None] & valid[..., None, :]
    dim_w = jnp.sum(jnp.where(same, absw[..., None, :], 0), axis=-1)  # w~_{k(i)} [B?, C]
    others = same & ~jnp.eye(c, dtype=bool)  # j in I_k(i), j != i
    prod_others = jnp.prod(jnp.where(others, x[..., None, :], 1), axis=-1)  # [B, C]
    g = sign * jnp.where(total > 0, dim_w / jnp.where(total > 0, total, 1), 0) * prod_others
    if fail is not None:
        safe_d = jnp.clip(d, 0, k - 1)
        fail_i = jnp.take_along_axis(fail, jnp.broadcast_to(safe_d, p.shape), axis=-1)
        g = g * (1 - fail_i)
    g = jnp.where(valid, g, 0)
    return g[0] if squeeze else g


def incentive_report(
    rubric: Rubric,
    p: float | Sequence[float] | np.ndarray,
    aggregators: Sequence[str] = ("additive", "prorubric"),
    fail: Sequence[float] | None = None,
) -> list[dict[str, Any]]:
    """Per-criterion incentive table for one rubric at pass probabilities ``p`` ([C] or scalar).

    Returns one dict per criterion: ``index``, ``criterion`` (text), ``weight``, ``dimension``
    (name or None), ``p``, and ``grad_<name>`` = ``dE[R]/dp_i`` for each aggregator name.
    AND-product aggregators need a bundled rubric (``RubricError`` otherwise).  ``fail`` [K]
    optionally marks fired failure clauses (held fixed).
    """
    n = rubric.num_criteria
    pv = np.broadcast_to(np.asarray(p, dtype=np.float32), (n,)).copy()
    w = np.asarray(rubric.weights, np.float32)
    d = np.asarray(rubric.dim_index(), np.int32)
    f = None if fail is None else np.asarray(fail, np.float32)
    grads: dict[str, np.ndarray] = {}
    for name in aggregators:
        needs_dims = name in ("prorubric", "raw_and")
        if needs_dims and not rubric.dimensions:
            raise RubricError(rubric.prompt_id, "dimensions", f"{name!r} needs a bundled rubric")
        kw: dict[str, Any] = {"num_dims": max(rubric.num_dims, 1)}
        g = expected_reward_grad(name, jnp.asarray(pv), jnp.asarray(w), jnp.asarray(d),
                                 fail=None if f is None or name != "prorubric" else jnp.asarray(f),
                                 **kw)
        grads[name] = np.asarray(g)
    rows = []
    for i, c in enumerate(rubric.criteria):
        k = int(d[i])
        rows.append(
            {
                "index": i,
                "criterion": c.text,
                "weight": float(c.weight),
                "dimension": rubric.dimensions[k].name if k >= 0 else None,
                "p": float(pv[i]),
                **{f"grad_{name}": float(grads[name][i]) for name in aggregators},
            }
        )
    return rows
