"""The one definition of a homogeneous group, shared by advantages, DAPO's dynamic sampling,
the group metrics and the rubric memory.

A group of G rewards is *homogeneous* when its population standard deviation is at most
``HOMOGENEOUS_TOL``. The tolerance, not exact equality, because rewards pass through float32
on device and through sums of judge scores on the host: two members that differ by rounding
alone carry no signal, and dividing their difference by a std of ~1e-8 would turn rounding
into full-size advantages. 1e-6 is far below any reward difference a task means (the smallest
is a rubric term of lambda / (G - 1) ~ 1e-2) and far above float32 rounding of rewards in
[-1, 1] (~1e-7).
"""

from __future__ import annotations

from typing import Any

import numpy as np

HOMOGENEOUS_TOL = 1e-6


def homogeneous(rewards: Any, tol: float = HOMOGENEOUS_TOL, xp: Any = np) -> Any:
    """[..., G] -> [...] bool: ``std_G(R) <= tol`` (population std, ddof 0).

    ``xp`` is the array module (``numpy`` on the host, ``jax.numpy`` under jit). An empty group
    is homogeneous: it has nothing to compare."""
    rewards = xp.asarray(rewards)
    if rewards.shape[-1] == 0:
        return xp.ones(rewards.shape[:-1], bool)
    return xp.std(rewards, axis=-1) <= tol
