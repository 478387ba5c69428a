"""algo.loss_agg=auto: each policy loss with its paper's aggregation unless one is set."""

import logging

import pytest

from rl.run.config import ConfigError, parse
from tests.rl.run.test_trainer import make_cfg


@pytest.fixture(autouse=True)
def _model(char_model, monkeypatch):
    monkeypatch.setenv("CHAR_MODEL", str(char_model))  # what make_cfg names as model.path


@pytest.mark.parametrize("overrides, agg", [
    ([], "seq-mean-token-mean"),  # GRPO's PPO-clip: as before
    (["algo.policy_loss=gspo"], "seq-mean-token-mean"),  # GSPO: sequence-level
    (["algo.policy_loss=cispo"], "token-mean"),  # CISPO: token-mean
    (["algo.policy_loss=cispo", "algo.loss_agg=seq-mean-token-sum"], "seq-mean-token-sum"),
    (["algo=dapo"], "token-mean"),  # DAPO's own, set by its config
])
def test_the_aggregation_each_config_resolves_to(tmp_path, overrides, agg):
    run = parse(make_cfg(tmp_path, *overrides))
    assert run.algo.loss_agg == agg
    assert run.raw["algo"]["loss_agg"] == agg  # what a checkpoint's settings record


def test_a_config_that_overrides_the_papers_aggregation_says_so(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="rl.run.config"):
        parse(make_cfg(tmp_path, "algo=dapo", "algo.policy_loss=gspo"))
    assert "algo.loss_agg=seq-mean-token-mean for the paper's" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rl.run.config"):
        parse(make_cfg(tmp_path, "algo=dapo"))  # DAPO's PPO-clip with token-mean: its paper
    assert "policy_loss" not in caplog.text


def test_auto_needs_a_known_policy_loss(tmp_path):
    cfg = make_cfg(tmp_path)
    cfg["algo"]["policy_loss"] = "mine"
    with pytest.raises(ConfigError, match="algo.loss_agg=auto: no paper aggregation"):
        parse(cfg)


def test_gdpo_over_the_rubric_rewarder_is_warned_about(tmp_path, caplog):
    """The rubric rewarder's outcome is the checklist coverage: GDPO would add it back as a
    component of its own."""
    with caplog.at_level(logging.WARNING, logger="rl.run.config"):
        parse(make_cfg(tmp_path, "algo=prorubric", "algo.reward_components=gdpo"))
    assert "algo.reward_components=gdpo with algo.rewarder=rubric" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rl.run.config"):
        parse(make_cfg(tmp_path, "algo=prorubric"))
        parse(make_cfg(tmp_path, "algo.reward_components=gdpo"))  # outcome rewarder: fine
    assert "reward_components=gdpo" not in caplog.text
