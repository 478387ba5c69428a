"""Environments: how prompts become groups of trajectories. Single-turn lives here; the
multi-turn search environment lives with its task (rl/tasks/search/env.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax

from core.types import Group, Policy, Prompt, Trajectory
from models.config import ModelConfig
from models.continuation import Continuation, continue_generation
from models.sampler import DecodeState, Generation, SamplingParams, decode_params, generate
from models.sharding import decode_param_shardings
from models.tokenizer import Tokenizer
from models.transformer import Params


@dataclasses.dataclass(frozen=True)
class SamplerPolicy:
    """The policy as the environments see it: current parameters behind the jitted sampler
    (kept in the sampler's per-layer form, made once per policy; ``dtype`` "bfloat16" samples
    with bfloat16 matmuls, see models.sampler.decode_params; ``kv_cache_dtype`` "bfloat16"
    stores its generations' KV cache in bfloat16, whatever the environment's sampling says,
    None: as it says; ``prefill_pin_rows``, ``sub_batches``, ``decode_kernel`` and
    ``shared_prompts`` likewise,
    see models.sampler.SamplingParams). With a
    ``mesh`` the rollouts are data-parallel: rows, KV cache and outputs sharded over its data
    axes, the weights by ``models.sharding.decode_param_shardings``."""

    cfg: ModelConfig
    params: Params
    tokenizer: Tokenizer
    dtype: str | None = None
    mesh: Any = None
    kv_cache_dtype: str | None = None
    prefill_pin_rows: bool | None = None
    sub_batches: bool | None = None
    decode_kernel: str | None = None
    shared_prompts: bool | None = None

    def __post_init__(self) -> None:
        params = decode_params(self.params, self.dtype)
        if self.mesh is not None:
            params = jax.device_put(params, decode_param_shardings(params, self.mesh))
        object.__setattr__(self, "params", params)

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams, seed: int,
                 max_new_per_row: Sequence[int] | None = None) -> Generation:
        """Sample continuations of `prompts` (models.sampler.generate)."""
        return generate(self.cfg, self.params, self.tokenizer, prompts, self._own(sampling),
                        seed=seed, max_new_per_row=max_new_per_row, mesh=self.mesh)

    def continue_from(self, state: DecodeState, continuation: Continuation,
                      sampling: SamplingParams, seed: int) -> Generation:
        """Continue rows of an earlier generation after reading their appended tokens
        (multi-turn environments: the observation), in its KV cache instead of re-reading the
        context (models.continuation.continue_generation)."""
        return continue_generation(self.cfg, self.params, self.tokenizer, state, continuation,
                                   self._own(sampling), seed=seed)

    def _own(self, sampling: SamplingParams) -> SamplingParams:
        """`sampling` with this policy's settings where it has them (not None)."""
        mine: dict[str, Any] = {"kv_cache_dtype": self.kv_cache_dtype,
                                "prefill_pin_rows": self.prefill_pin_rows,
                                "sub_batches": self.sub_batches,
                                "decode_kernel": self.decode_kernel,
                                "shared_prompts": self.shared_prompts}
        return dataclasses.replace(sampling, **{k: v for k, v in mine.items() if v is not None})


@dataclasses.dataclass(frozen=True)
class SingleTurnEnv:
    """One completion per trajectory from the chat-templated prompt; every token is an action."""

    tokenizer: Tokenizer
    sampling: SamplingParams

    def rollout(self, policy: Policy, prompts: Sequence[Prompt], group_size: int,
                seed: int) -> list[Group]:
        encoded = [self.tokenizer.encode_chat(list(p.messages)) for p in prompts]
        rows = [ids for ids in encoded for _ in range(group_size)]
        gen = policy.generate(rows, self.sampling, seed)
        groups = []
        for i, prompt in enumerate(prompts):
            trajs = []
            for j in range(group_size):
                r = i * group_size + j
                n = int(gen.lengths[r])
                trajs.append(Trajectory(
                    prompt_tokens=tuple(rows[r]), tokens=tuple(gen.tokens[r, :n].tolist()),
                    loss_mask=(1,) * n, logprobs=tuple(gen.logprobs[r, :n].tolist()),
                    text=gen.texts[r], finish=gen.finish[r]))
            groups.append(Group(prompt, tuple(trajs)))
        return groups
