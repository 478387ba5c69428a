"""One-step off-policy rollouts (``trainer.off_policy_steps=1``): the rollout of step t+1
samples from the weights before step t's update, so it can run while step t updates.

The trajectory is defined by the sequential fold of ``rl.run.loop.step`` alone:

    step t:  rollout_t  = collect(behaviour = theta_{t-1}; reward state, data position, t)
             theta_{t+1} = update(theta_t, rollout_t)          logp_old = the sampler's logp
             behaviour  <- theta_t (a copy taken before the update; theta_0 at t = 0)

so step t's rollout depends only on theta_{t-1}, the rewarder state the previous rollout
left, the data position and step t's seed (``rl.run.loop.step_seed``), never on thread timing.
Running it early is an execution detail: all its inputs are known once step t's own rollout
is in, so :class:`RolloutPrefetch` starts it on a background thread while step t updates, and
step t+1 takes its result instead of collecting (the same values, bit for bit: a test runs
both schedules). The checkpoint at step t holds theta_{t-1} (``Behaviour``) and no rollout in
flight (the host loop does not prefetch across a save or an evaluation), so a resume
recomputes step t's rollout exactly.

The importance ratio of the update is pi_theta / pi_sampler with the sampler's own per-token
log-probs (behaviour policy = sampler, as verl's rollout correction, TRL's AsyncGRPOTrainer
and tunix's off-policy steps keep them); :func:`mismatch_stats` logs how far the trainer's
current weights are from them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Behaviour:
    """The weights the next rollout samples with: a copy of the parameters after `version`
    steps (the next step is `version + 1`, or 0 at the start)."""

    params: Any
    version: int


def snapshot(params: Any, version: int) -> Behaviour:
    """A copy of `params` (the update donates its input buffers, so the rollout needs its own)."""
    return Behaviour(jax.tree.map(jnp.copy, params), version)


def staleness(step: int, behaviour: Behaviour) -> int:
    """Steps between the weights that sampled step `step`'s rollout and the ones it updates."""
    return step - behaviour.version


def mismatch_stats(logp_sampler: np.ndarray | jax.Array, logp_trainer: np.ndarray | jax.Array,
                   loss_mask: np.ndarray | jax.Array) -> dict[str, float]:
    """Per-token sampler/trainer disagreement over the tokens the loss sees (loss_mask = 1):

        d_t = log pi_trainer(y_t) - log pi_sampler(y_t)     (the trainer's current weights)
        logp_abs_diff_{mean,max} = mean / max_t |d_t|
        ratio_{mean,min,max}     = mean / min / max_t exp(d_t)  (the update's IS ratio, at
                                                                its first mini-batch)

    Empty dict when no token is trained on."""
    on = np.asarray(loss_mask) > 0
    if not on.any():
        return {}
    d = (np.asarray(logp_trainer, np.float64) - np.asarray(logp_sampler, np.float64))[on]
    ratio = np.exp(d)
    return {"offpolicy/logp_abs_diff_mean": float(np.abs(d).mean()),
            "offpolicy/logp_abs_diff_max": float(np.abs(d).max()),
            "offpolicy/ratio_mean": float(ratio.mean()),
            "offpolicy/ratio_min": float(ratio.min()),
            "offpolicy/ratio_max": float(ratio.max())}


class RolloutPrefetch:
    """At most one rollout in flight on one background thread. ``start(state)`` runs
    ``collect(state)``; ``take(step, data_position)`` hands its result to the step it was
    started for (a zero-argument callable that waits for it), or None when nothing is in
    flight. Only this thread calls the judge and the retriever while a rollout is in flight
    (the main thread runs the update): every service and RNG is used by one thread at a time."""

    def __init__(self, collect: Callable[[Any], Any]):
        self._collect = collect
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout")
        self._pending: tuple[tuple[int, int], Future] | None = None

    def start(self, state: Any) -> None:
        if self._pending is not None:
            raise RuntimeError("a rollout is already in flight")
        key = (state.step, state.data_position)
        self._pending = (key, self._pool.submit(self._collect, state))

    def take(self, step: int, data_position: int) -> Callable[[], Any] | None:
        if self._pending is None:
            return None
        key, future = self._pending
        self._pending = None
        if key != (step, data_position):
            future.result()  # let it finish before saying so
            raise RuntimeError(f"the rollout in flight was started for step {key[0]} (data "
                               f"position {key[1]}), not step {step} ({data_position})")
        return future.result

    @property
    def in_flight(self) -> bool:
        return self._pending is not None

    def close(self) -> None:
        """Wait for a rollout still in flight (its result is dropped) and stop the thread."""
        if self._pending is not None:
            _, future = self._pending
            self._pending = None
            future.exception()
        self._pool.shutdown(wait=True)
