"""The training batch layout: each group's prompt once, its trajectories after it."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest

from core.types import Group, Prompt, Trajectory
from models.presets import tiny_config
from models.transformer import init_params
from rl.grpo.batch import build_batch, split_groups, trajectory_arrays
from rl.grpo.train_step import LossConfig, init_train_state, make_train_step

PAD = 0


def _traj(prompt, tokens, mask=None) -> Trajectory:
    mask = mask or [1] * len(tokens)
    return Trajectory(prompt_tokens=tuple(prompt), tokens=tuple(tokens), loss_mask=tuple(mask),
                      logprobs=(0.0,) * len(tokens), text="", finish="eos")


def _groups(rng, n=2, g=4, vocab=200):
    groups = []
    for i in range(n):
        prompt = rng.integers(1, vocab, 5 + 7 * i).tolist()
        trajs = []
        for _ in range(g):
            toks = rng.integers(1, vocab, int(rng.integers(2, 12))).tolist()
            trajs.append(_traj(prompt, toks, rng.integers(0, 2, len(toks)).tolist()))
        groups.append(Group(Prompt(f"p{i}", ({"role": "user", "content": "q"},)), tuple(trajs)))
    return groups


def test_build_batch_keeps_each_prompt_once():
    groups = _groups(np.random.default_rng(0))
    adv = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = build_batch(groups, adv, PAD, resp_len=20)
    assert b["prefix"].shape == (2, 32) and b["tokens"].shape == (2, 4, 32)  # R >= 20, in 16s
    np.testing.assert_array_equal(b["advantages"], adv)
    for i, g in enumerate(groups):
        p = g.trajectories[0].prompt_tokens
        assert b["prefix"][i, -len(p):].tolist() == list(p)  # left padded
        assert b["prefix_mask"][i].sum() == len(p) and b["prefix_mask"][i, -len(p):].all()
        for j, t in enumerate(g.trajectories):
            n = len(t.tokens)
            assert b["tokens"][i, j, :n].tolist() == list(t.tokens)  # right padded
            assert b["attn_mask"][i, j].sum() == n and b["attn_mask"][i, j, :n].all()
            assert b["loss_mask"][i, j, :n].tolist() == list(t.loss_mask)
            assert not b["loss_mask"][i, j, n:].any()


def test_groups_split_until_the_update_slices_divide_them():
    groups = [g.trajectories for g in _groups(np.random.default_rng(1))]  # 2 groups of 4
    assert split_groups(groups, 2) == groups
    halves = split_groups(groups, 4)
    assert [len(g) for g in halves] == [2] * 4
    assert [t for g in halves for t in g] == [t for g in groups for t in g]  # order kept
    assert [len(g) for g in split_groups(groups, 8)] == [1] * 8
    with pytest.raises(ValueError, match="do not split into 3"):
        split_groups(groups, 3)


def test_prompts_differing_in_a_group_share_their_common_prefix():
    a = _traj([5, 6, 7, 8], [20, 21])
    b = _traj([5, 6, 9], [30], [1])
    arr = trajectory_arrays([[a, b]], PAD)
    assert arr["prefix"][0][arr["prefix_mask"][0]].tolist() == [5, 6]
    assert arr["tokens"][0, 0, :4].tolist() == [7, 8, 20, 21]
    assert arr["loss_mask"][0, 0, :4].tolist() == [0, 0, 1, 1]  # the prompt's rest: no loss
    assert arr["tokens"][0, 1, :2].tolist() == [9, 30]
    assert arr["loss_mask"][0, 1, :2].tolist() == [0, 1]
    with pytest.raises(ValueError, match="share no prompt token"):
        trajectory_arrays([[a, _traj([1, 2], [3])]], PAD)


def test_the_update_does_not_depend_on_how_groups_are_split():
    """Sub-groups only repeat the prompt's forward pass: same loss, same new weights."""
    cfg = tiny_config(vocab_size=256)
    params = init_params(cfg, jax.random.key(0))
    groups = _groups(np.random.default_rng(2), vocab=256)
    adv = np.random.default_rng(3).normal(size=(2, 4)).astype(np.float32)
    opt = optax.sgd(1.0)
    step = make_train_step(cfg, LossConfig(beta=0.0), opt, donate=False)
    results = []
    for slices, groups_of in ((1, (2, 4)), (4, (4, 2)), (8, (8, 1))):
        batch = build_batch(groups, adv, PAD, resp_len=16, slices=slices)
        assert batch["tokens"].shape[:2] == groups_of
        results.append(step(init_train_state(params, opt), batch))
    (ref_state, ref_m), *others = results
    for state, m in others:
        np.testing.assert_allclose(float(m["loss"]), float(ref_m["loss"]), rtol=1e-5)
        for a, r in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref_state.params)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(r), atol=1e-6)


def test_a_batch_that_cannot_be_cut_evenly_is_filled_with_blank_groups():
    """3 groups of 2 into 4 slices: a fourth group without loss tokens; same update."""
    cfg = tiny_config(vocab_size=256)
    params = init_params(cfg, jax.random.key(0))
    groups = _groups(np.random.default_rng(4), n=3, g=2, vocab=256)
    adv = np.random.default_rng(5).normal(size=(3, 2)).astype(np.float32)
    batch = build_batch(groups, adv, PAD, resp_len=16, slices=4)
    assert batch["tokens"].shape[:2] == (4, 2)
    assert not batch["loss_mask"][3].any() and not batch["advantages"][3].any()
    opt = optax.sgd(1.0)
    step = make_train_step(cfg, LossConfig(loss_agg="seq-mean-token-mean"), opt, donate=False)
    ref_state, ref_m = step(init_train_state(params, opt), build_batch(groups, adv, PAD, 16))
    state, m = step(init_train_state(params, opt), batch)
    np.testing.assert_allclose(float(m["loss"]), float(ref_m["loss"]), rtol=1e-5)
    for a, r in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref_state.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(r), atol=1e-6)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                  "seq-mean-token-sum-norm"])
def test_micro_batches_add_up_to_the_whole_batch(mode):
    """Micro-batches with different token counts (one of them all blank) give the loss, the
    metrics and the update of one pass over the mini-batch."""
    cfg = tiny_config(vocab_size=256)
    params = init_params(cfg, jax.random.key(0))
    groups = _groups(np.random.default_rng(6), n=3, g=2, vocab=256)
    adv = np.random.default_rng(7).normal(size=(3, 2)).astype(np.float32)
    batch = build_batch(groups, adv, PAD, resp_len=16, slices=4)  # + a blank group
    opt = optax.sgd(1.0)
    results = []
    for m in (1, 2, 4):
        lc = LossConfig(loss_agg=mode, beta=0.0, micro_batches=m, entropy_coef=0.01)
        results.append(make_train_step(cfg, lc, opt, donate=False)(
            init_train_state(params, opt), batch))
    (ref_state, ref_m), *others = results
    for state, m in others:
        for key in ("loss", "pg_loss", "entropy", "clip_frac"):
            np.testing.assert_allclose(float(m[key]), float(ref_m[key]), rtol=1e-5, atol=1e-7)
        for a, r in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref_state.params)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(r), atol=1e-6)
