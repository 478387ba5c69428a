"""The ProRubric authors' arms bring the authors' GRPO settings (their configs/prorubric.yaml:
rollout.n 8, clip_ratio_high 0.28, verl's token-mean loss and its dual clip clip_ratio_c 3.0
(a verl default their config does not override), ppo_mini_batch_size 32 of
train_batch_size 64, clip_grad 0.1, weight_decay 0.1) where this library has the key; other
algorithms keep the library's defaults, and the command line still wins."""

import pytest

from tests.rl.rewarders.test_arbor_e2e import compose_cfg

AUTHORS = {"algo.group_size": 8, "algo.eps_low": 0.2, "algo.eps_high": 0.28,
           "algo.loss_agg": "token-mean", "algo.beta": 0.0, "trainer.mini_batches": 2,
           "trainer.ppo_epochs": 1, "optim.grad_clip": 0.1, "optim.weight_decay": 0.1,
           "trainer.temperature": 1.0, "algo.dual_clip": 3.0}
OURS = {"algo.group_size": 4, "algo.eps_high": 0.2, "algo.loss_agg": "auto", "algo.dual_clip": None,
        "trainer.mini_batches": 1, "optim.grad_clip": 1.0, "optim.weight_decay": 0.0}


def _get(cfg: dict, key: str):
    section, name = key.split(".")
    return cfg[section][name]


@pytest.mark.parametrize("algo", ["prorubric_official", "rubric_rl_official",
                                  "raw_and_verbatim", "raw_and_marked", "prorubric_no_failure",
                                  "prorubric_k1", "weighted_atomic", "grouped_mean",
                                  "prorubric_appr", "rubric_rl_appr",
                                  "prorubric_graded"])
def test_the_official_arms_train_with_the_authors_settings(algo):
    cfg = compose_cfg(f"algo={algo}", "trainer.run_dir=x")
    assert {k: _get(cfg, k) for k in AUTHORS} == AUTHORS


@pytest.mark.parametrize("algo", ["grpo", "prorubric", "rubric_rl", "arbor"])
def test_other_algorithms_keep_the_librarys_defaults(algo):
    cfg = compose_cfg(f"algo={algo}", "trainer.run_dir=x")
    assert {k: _get(cfg, k) for k in OURS} == OURS


def test_the_command_line_overrides_an_arms_settings():
    from rl.run.config import check, parse

    cfg = compose_cfg("algo=prorubric_official", "optim.grad_clip=0.5",
                      "trainer.mini_batches=1", "trainer.run_dir=x")
    assert (cfg["optim"]["grad_clip"], cfg["trainer"]["mini_batches"]) == (0.5, 1)
    run = parse(cfg)
    check(run)
    assert run.updates_per_batch == 1 and run.algo.loss_agg == "token-mean"
