"""Values that flow through the host loop: prompts, trajectories, reward outputs.

The loop knows only these shapes; tasks, environments, judges and the rubric memory produce or
consume them, so they plug in without the loop knowing what they are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:  # type hints only: the value types depend on no layer
    from models.sampler import Generation, SamplingParams


@dataclasses.dataclass(frozen=True)
class Prompt:
    """One task item: chat messages for the policy plus whatever the reward needs (`answer`)."""

    id: str
    messages: tuple[Mapping[str, str], ...]
    answer: Any = None
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def question(self) -> str:
        return str(self.meta.get("question", self.messages[-1]["content"]))


@dataclasses.dataclass(frozen=True)
class Trajectory:
    """One rollout. `tokens` follow the prompt; `loss_mask[t]` is 1 where the policy generated
    tokens[t] (observations such as retrieved documents are 0: no loss, no KL)."""

    prompt_tokens: tuple[int, ...]
    tokens: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    text: str
    finish: str
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not len(self.tokens) == len(self.loss_mask) == len(self.logprobs):
            raise ValueError("trajectory tokens, loss_mask and logprobs differ in length")

    @property
    def num_action_tokens(self) -> int:
        return int(sum(self.loss_mask))


@dataclasses.dataclass(frozen=True)
class Group:
    """A prompt and its group of sampled trajectories (GRPO's unit of comparison)."""

    prompt: Prompt
    trajectories: tuple[Trajectory, ...]


@dataclasses.dataclass(frozen=True)
class RewardOutput:
    """Rewards for a batch of groups, [N, G]; `outcome` is the verifiable part alone (the two
    differ when a rubric term is added). `state` is the rewarder's next host-side state
    (e.g. the rubric memory); `events` go to the run folder's event log. `counts` are the
    tallies of this call (judge requests, admissions, ...), also in `metrics`: when a step
    draws several batches (DAPO) they add up over the draws, the rest of `metrics` is the
    last draw's."""

    rewards: np.ndarray
    outcome: np.ndarray
    metrics: Mapping[str, float]
    state: Any = None
    events: tuple[Mapping[str, Any], ...] = ()
    per_traj: tuple[tuple[Mapping[str, Any], ...], ...] = ()
    counts: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def rubric_term(self) -> np.ndarray | None:
        """The [N, G] rubric term of each trajectory, from the ``per_traj`` records'
        ``rubric_score`` (ARBOR's ``s~``, RaR's ``s - mean_G s``; NaN where a record has none),
        or None when the rewarder reports none. The reward-gaming monitors and PROF's
        consistency filter read it."""
        if not self.per_traj or not any("rubric_score" in r for g in self.per_traj for r in g):
            return None
        term = np.full(np.shape(self.rewards), np.nan)
        for n, g in enumerate(self.per_traj):
            for i, r in enumerate(g):
                term[n, i] = float(r.get("rubric_score", np.nan))
        return term


class Policy(Protocol):
    """What an environment may ask of the policy: tokenize and sample.

    A policy may also offer ``continue_from(state, continuation, sampling, seed)`` to extend
    rows of an earlier ``Generation`` (its ``state``) as a ``models.continuation.
    Continuation`` says (which rows, the tokens each reads first, their budgets, whether the
    caller is done with ``state``); multi-turn environments use it when present
    (``rl.tasks.envs.SamplerPolicy`` has it), with a first ``generate`` whose sampling sets the
    cache's ``capacity`` and ``prompt_bucket`` (``models.sampler.SamplingParams``), and
    re-send the whole context otherwise.
    """

    @property
    def tokenizer(self) -> Any: ...

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams, seed: int,
                 max_new_per_row: Sequence[int] | None = None) -> Generation: ...


class Environment(Protocol):
    """Produces groups of trajectories for prompts (single- or multi-turn)."""

    def rollout(self, policy: Policy, prompts: Sequence[Prompt], group_size: int,
                seed: int) -> list[Group]: ...


class Rewarder(Protocol):
    """Turns groups into rewards; carries an immutable host-side state through the steps."""

    def init_state(self) -> Any: ...

    def __call__(self, groups: Sequence[Group], state: Any, step: int) -> RewardOutput: ...

    def state_to_json(self, state: Any) -> Any: ...

    def state_from_json(self, data: Any) -> Any: ...


class Task(Protocol):
    """A dataset of prompts, an environment to roll them out, and an outcome score."""

    @property
    def name(self) -> str: ...

    def prompts(self, split: str) -> Sequence[Prompt]: ...

    def make_env(self, tokenizer: Any, sampling: SamplingParams) -> Environment: ...

    def outcome(self, prompt: Prompt, traj: Trajectory) -> float: ...
