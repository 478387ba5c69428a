"""DAPO (Yu et al. 2025): dynamic sampling of informative groups and overlong reward shaping.

The trainer draws every step's batch through :func:`dynamic_sample` (one draw when dynamic
sampling is off) and shapes rewards with :func:`overlong_penalty`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from core.groups import homogeneous
from core.types import Group, RewardOutput
from rl.grpo.group_stats import all_wrong_frac, homogeneous_frac


def overlong_penalty(
    lengths: jax.Array, max_len: int, buffer_len: int, penalty: float = 1.0
) -> jax.Array:
    """DAPO soft overlong punishment per response, [B] float.

    With ``L_exp = max_len - buffer_len``::

        0                                      if L <= L_exp
        (L_exp - L) / buffer_len * penalty     if L_exp < L <= max_len
        -penalty                               if L > max_len
    """
    lengths = jnp.asarray(lengths, dtype=jnp.result_type(float))
    expected = max_len - buffer_len
    # max(., 1): with buffer_len = 0 the middle branch is empty; avoid a 0/0 in the unused branch.
    ramp = (expected - lengths) / max(buffer_len, 1) * penalty
    out = jnp.where(lengths <= expected, 0.0, ramp)
    return jnp.where(lengths > max_len, -penalty, out)


@dataclasses.dataclass(frozen=True)
class Drawn:
    """A step's batch after dynamic sampling: the kept groups and their rewards (``out``:
    rows of the draws they came from; ``state`` the rewarder's state after the last draw,
    ``events`` every draw's, ``metrics`` the last draw's with its ``counts`` added up over all
    draws), how many draws it took and what the sampling saw."""

    groups: list[Group]
    out: RewardOutput
    draws: int
    info: Mapping[str, float]


Draw = Callable[[int, Any], tuple[Sequence[Group], RewardOutput]]


def dynamic_sample(draw: Draw, state: Any, target_groups: int, max_gen_batches: int,
                   filter_groups: bool = True, filter_metric: str = "reward") -> Drawn:
    """DAPO's dynamic sampling on the host.

    Calls ``draw(i, state) -> (groups, out)`` for i = 0, 1, ... (``out.state`` is the
    rewarder's next state, passed to the next draw) and keeps the groups that are not
    homogeneous (``core.groups``: ``std_G > 1e-6``) in `filter_metric`: "reward" (default,
    the reward the advantages read: such a group carries a gradient; verl's
    ``filter_groups.metric=seq_final_reward``) or "outcome" (the task's outcome, e.g.
    correctness: verl's ``acc``; a group whose outcome ties but whose reward varies, e.g. by a
    rubric term or overlong shaping, is then dropped), until
    ``target_groups`` are kept (truncated to exactly that many) or ``max_gen_batches`` draws
    are spent. If it ends short it trains on what it kept; if it kept nothing, on the last
    draw (all advantages 0). ``filter_groups=False`` is plain GRPO: one draw, kept whole.

    ``info``: ``gen_batches``, ``dropped_groups`` (homogeneous groups filtered out) and, when
    filtering, ``filled`` and the group statistics of everything drawn (``drawn_*``: the kept
    batch's own read ~0 by construction).
    """
    if max_gen_batches < 1:
        raise ValueError(f"algo.max_gen_batches must be >= 1, got {max_gen_batches}")
    kept: list[tuple[Group, RewardOutput]] = []
    outs: list[RewardOutput] = []
    for i in range(max_gen_batches if filter_groups else 1):
        groups, out = draw(i, state)
        if len(groups) != out.rewards.shape[0]:
            raise ValueError(f"draw {i} gave {len(groups)} groups for {out.rewards.shape[0]} "
                             f"rows of rewards")
        state = out.state
        outs.append(out)
        if not filter_groups:
            return Drawn(list(groups), out, 1, {"gen_batches": 1, "dropped_groups": 0})
        informative = np.flatnonzero(~homogeneous(
            out.rewards if filter_metric == "reward" else out.outcome))
        kept += [(groups[g], _row(out, g)) for g in informative[:target_groups - len(kept)]]
        if len(kept) >= target_groups:
            break
    info = _drawn_stats(outs, filter_metric) | {"gen_batches": len(outs), "filled": float(
        len(kept) >= target_groups)}
    if not kept:
        return Drawn(list(groups), _merged(outs, [out]), len(outs), info)
    return Drawn([g for g, _ in kept], _merged(outs, [o for _, o in kept]), len(outs), info)


def _row(out: RewardOutput, i: int) -> RewardOutput:
    return RewardOutput(rewards=out.rewards[i:i + 1], outcome=out.outcome[i:i + 1],
                        metrics=out.metrics, state=out.state,
                        per_traj=out.per_traj[i:i + 1] if out.per_traj else ())


def _merged(outs: Sequence[RewardOutput], rows: Sequence[RewardOutput]) -> RewardOutput:
    """The kept rows as one output; events and counts of every draw, the last state."""
    last = outs[-1]
    counts = {k: sum(o.counts.get(k, 0.0) for o in outs) for k in last.counts}
    return RewardOutput(rewards=np.concatenate([o.rewards for o in rows]),
                        outcome=np.concatenate([o.outcome for o in rows]),
                        metrics=dict(last.metrics) | counts, state=last.state,
                        events=tuple(e for o in outs for e in o.events),
                        per_traj=tuple(p for o in rows for p in o.per_traj), counts=counts)


def _drawn_stats(outs: Sequence[RewardOutput], filter_metric: str) -> dict[str, float]:
    outcome = jnp.asarray(np.concatenate([o.outcome for o in outs]))
    total = jnp.asarray(np.concatenate([o.rewards for o in outs]))
    filtered_on = [o.rewards if filter_metric == "reward" else o.outcome for o in outs]
    return {"dropped_groups": int(sum(homogeneous(x).sum() for x in filtered_on)),
            "drawn_homogeneous_frac": float(homogeneous_frac(outcome)),
            "drawn_total_homogeneous_frac": float(homogeneous_frac(total)),
            "drawn_all_wrong_frac": float(all_wrong_frac(outcome))}
