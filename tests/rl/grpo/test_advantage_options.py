"""algo.whiten=token (verl's REINFORCE++ whitening by length) and algo.reward_components=gdpo
(GDPO's per-component normalisation), against references written out here."""

from __future__ import annotations

import numpy as np
import pytest

from rl.grpo.advantages import gdpo_advantages, group_advantages


def test_token_whitening_is_verls_masked_whiten_over_per_token_copies():
    # verl: the group-centred score is broadcast to every response token, then
    # masked_whiten(values, mask): mean over the mask, unbiased masked_var (x n/(n-1)).
    r = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 2.0]])
    lengths = np.array([[3, 1, 2], [4, 2, 1]])
    centred = r - r.mean(axis=1, keepdims=True)
    copies = np.concatenate([np.full(n, c) for c, n in zip(centred.ravel(), lengths.ravel())])
    mean = copies.mean()
    var = ((copies - mean) ** 2).mean() * len(copies) / (len(copies) - 1)
    want = (centred - mean) / (np.sqrt(var) + 1e-6)
    got = np.asarray(group_advantages(r, "reinforce_pp", token_counts=lengths))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # unit lengths give back the per-trajectory whitening
    np.testing.assert_allclose(
        np.asarray(group_advantages(r, "reinforce_pp", token_counts=np.ones((2, 3)))),
        np.asarray(group_advantages(r, "reinforce_pp")), rtol=1e-5, atol=1e-6)


def test_gdpo_normalises_components_apart_then_whitens_the_batch():
    outcome = np.array([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    process = np.array([[0.1, 0.2, 0.3, 0.4], [0.0, 0.0, 0.3, 0.3]])

    def z(x):  # GRPO per group, sample std; a homogeneous group gives 0
        c = x - x.mean(axis=1, keepdims=True)
        s = x.std(axis=1, ddof=1, keepdims=True)
        return np.where(s > 1e-6, c / (s + 1e-6), 0.0)

    summed = 2.0 * z(outcome) + 1.0 * z(process)
    want = (summed - summed.mean()) / (summed.std(ddof=1) + 1e-6)
    got = np.asarray(gdpo_advantages(np.stack([outcome, process]), np.array([2.0, 1.0])))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # GRPO on the sum lets the outcome's larger spread decide: group 0's ranking under the
    # sum is (1.1, 1.4 | 0.2, 0.3); GDPO with equal weights ranks trajectory 3 above 0 too,
    # but trajectory 2 (process 0.3) above 1 (0.2) by a full process z-score.
    eq = np.asarray(gdpo_advantages(np.stack([outcome, process]), np.array([1.0, 1.0])))
    assert eq[0, 3] > eq[0, 0] > eq[0, 2] > eq[0, 1]


def test_gdpo_keeps_flat_groups_at_zero():
    flat = np.ones((1, 3))
    parts = np.stack([np.vstack([flat, [[1.0, 0.0, 0.0]]]), np.vstack([flat, [[0.0, 0.0, 0.0]]])])
    got = np.asarray(gdpo_advantages(parts, np.array([1.0, 1.0])))
    assert np.all(got[0] == 0.0) and np.any(got[1] != 0.0)


@pytest.fixture
def _char(char_model, monkeypatch):
    monkeypatch.setenv("CHAR_MODEL", str(char_model))


@pytest.mark.parametrize("override, match", [
    (["algo.whiten=sequence"], "algo.whiten: must be trajectory or token"),
    (["algo.reward_components=mean"], "algo.reward_components: must be sum or gdpo"),
    (["algo.component_weights=[1.0]"], "algo.component_weights: needs two weights"),
    (["algo.reward_components=gdpo", "algo.advantage=rloo"], "algo.reward_components: gdpo"),
])
def test_bad_options_name_the_key(tmp_path, _char, override, match):
    from rl.run.config import ConfigError, parse
    from tests.rl.run.test_trainer import make_cfg

    with pytest.raises(ConfigError, match=match):
        parse(make_cfg(tmp_path / "x", *override))


@pytest.mark.parametrize("override", [["algo.reward_components=gdpo"],
                                      ["algo.advantage=reinforce_pp", "algo.whiten=token"]])
def test_options_train_through_the_trainer(tmp_path, _char, override):
    import math

    from rl.run.trainer import build_trainer
    from tests.rl.run.test_trainer import LEARN, make_cfg

    t = build_trainer(make_cfg(tmp_path / "run", *LEARN, *override, "trainer.max_steps=2",
                               "trainer.batch_prompts=2", "algo.group_size=2",
                               "trainer.max_new_tokens=6", "trainer.eval_at_ends=false"))
    recs = t.run()
    t.close()
    assert len(recs) >= 2 and all(math.isfinite(r["loss"]) for r in recs if "loss" in r)
