"""The training batch: each group's prompt once, its trajectories after it.

A GRPO group's trajectories continue one prompt. The batch keeps that prompt once per group and
the policy reads it once (``models.scoring.group_logprobs``) instead of once per trajectory: on
the search task (224-token prompts, groups of 4, 256-token responses) that is ~35 % fewer
tokens through the model in every update.

Arrays (N groups of G; the leading axis is the one the update cuts into mini- and
micro-batches):
    prefix, prefix_mask  [N,P]    the group's shared prompt tokens, left padded
    tokens, attn_mask    [N,G,R]  each trajectory's tokens after the prefix, right padded
    loss_mask            [N,G,R]  1 where the policy generated the token (the loss applies)
    advantages           [N,G]    (build_batch only)
    logp_sampler         [N,G,R]  the sampler's log-prob of each token where loss_mask = 1, else 0
                                  (with_logprobs only: the behaviour policy of an off-policy step)
P is rounded up to a multiple of 32 and R to 16 and at least the run's response budget, so
shapes, and compilations, rarely change from step to step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from core.types import Group, Trajectory
from models.padding import round_up


def split_groups(groups: Sequence[Sequence[Trajectory]],
                 slices: int) -> list[Sequence[Trajectory]]:
    """Cut each group into equal sub-groups (each reads the prompt again) until the number of
    (sub-)groups divides into `slices` equal parts: the update cuts the batch into mini-batches
    x micro-batches x data-parallel shards along its group axis. Advantages are computed on
    whole groups before this; a sub-group only shares the prompt's forward pass."""
    size = len(groups[0])
    if any(len(g) != size for g in groups):
        raise ValueError(f"groups differ in size: {sorted({len(g) for g in groups})}")
    if (len(groups) * size) % slices:
        raise ValueError(f"{len(groups) * size} trajectories do not split into {slices} equal "
                         f"slices")
    parts = next(k for k in range(1, size + 1)
                 if size % k == 0 and (len(groups) * k) % slices == 0)
    step = size // parts
    return [g[i:i + step] for g in groups for i in range(0, size, step)]


def trajectory_arrays(groups: Sequence[Sequence[Trajectory]], pad_id: int,
                      resp_len: int = 16, with_logprobs: bool = False) -> dict[str, np.ndarray]:
    """The batch arrays without advantages (the SFT warm-up trains on these; one trajectory
    per group there). The prefix is the longest prompt prefix all of a group's trajectories
    share (their whole prompt in every environment here); any rest of a prompt goes before
    the trajectory's tokens with loss mask 0."""
    shared = [_shared_prefix([t.prompt_tokens for t in g]) for g in groups]
    rests = [[(t.prompt_tokens[c:], t) for t in g] for g, c in zip(groups, shared)]
    n, g = len(groups), len(groups[0])
    p = round_up(max(shared), 32)
    r = round_up(max(resp_len, *(len(rest) + len(t.tokens) for row in rests
                                  for rest, t in row)), 16)
    prefix = np.full((n, p), pad_id, np.int32)
    prefix_mask = np.zeros((n, p), bool)
    tokens = np.full((n, g, r), pad_id, np.int32)
    attn = np.zeros((n, g, r), bool)
    loss = np.zeros((n, g, r), np.float32)
    logp = np.zeros((n, g, r), np.float32)
    for i, (group, c, row) in enumerate(zip(groups, shared, rests)):
        prefix[i, p - c:] = group[0].prompt_tokens[:c]
        prefix_mask[i, p - c:] = True
        for j, (rest, t) in enumerate(row):
            k = len(rest) + len(t.tokens)
            tokens[i, j, :k] = (*rest, *t.tokens)
            attn[i, j, :k] = True
            loss[i, j, len(rest):k] = t.loss_mask
            logp[i, j, len(rest):k] = np.where(np.asarray(t.loss_mask) > 0, t.logprobs, 0.0)
    arrays = {"prefix": prefix, "prefix_mask": prefix_mask, "tokens": tokens,
              "attn_mask": attn, "loss_mask": loss}
    return arrays | ({"logp_sampler": logp} if with_logprobs else {})


def build_batch(groups: Sequence[Group], advantages: np.ndarray, pad_id: int,
                resp_len: int = 16, slices: int = 1,
                with_logprobs: bool = False) -> dict[str, np.ndarray]:
    """The training batch of a step: groups [N] with advantages [N,G] (see the module doc);
    `slices` as in :func:`split_groups`. When the trajectories cannot be cut into `slices`
    equal parts at all (a DAPO batch that ended short of its target), copies of the last group
    with loss mask 0 and advantage 0 fill it up: every loss aggregation skips trajectories
    without loss tokens, so they change nothing but the shapes."""
    trajs = [tuple(g.trajectories) for g in groups]
    adv = np.asarray(advantages, np.float32).reshape(len(trajs), -1)
    if (len(trajs) * len(trajs[0])) % slices:
        pad = -len(trajs) % slices
        blank = tuple(dataclasses.replace(t, loss_mask=(0,) * len(t.loss_mask))
                      for t in trajs[-1])
        trajs += [blank] * pad
        adv = np.concatenate([adv, np.zeros((pad, adv.shape[1]), np.float32)])
    batch = trajectory_arrays(split_groups(trajs, slices), pad_id, resp_len, with_logprobs)
    n, g = batch["tokens"].shape[:2]
    return {**batch, "advantages": adv.reshape(n, g)}


def _shared_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """Length of the longest common prefix of `prompts` (at least one token: the first
    trajectory token is predicted from the prefix's last one)."""
    first = prompts[0]
    n = min(len(p) for p in prompts)
    same = next((i for i in range(n) if any(p[i] != first[i] for p in prompts)), n)
    if same == 0:
        raise ValueError("a group's trajectories share no prompt token; every trajectory of "
                         "a group must continue the same prompt")
    return same

