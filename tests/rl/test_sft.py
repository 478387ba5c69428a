"""Format warm-up: oracle search demonstrations, the SFT loss and step, rl.sft and init_from."""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core.types import Prompt
from models import load_params
from models.transformer import forward
from rewards.qa import f1_score, is_valid_format
from rl.grpo.optim import OptimConfig, make_optimizer
from rl.grpo.train_step import init_train_state
from rl.run.wiring import make_task
from rl.sft import demo_batch, make_sft_step, sft_loss
from rl.tasks.search.demos import oracle_turns
from tests.paths import ROOT

SMALL_WORLD = {"name": "search_qa", "n_entities": 200, "n_train": 40, "n_dev": 4, "n_test": 8,
               "max_obs_tokens": 48, "max_turns": 3, "max_response_tokens": 400, "topk": 2}
SMALL_WORLD_ARGS = [f"task.{k}={v}" for k, v in SMALL_WORLD.items() if k != "name"]


@pytest.fixture(scope="module")
def tiny():
    return load_params("tiny", seed=1)


@pytest.fixture(scope="module")
def demos(tiny, tmp_path_factory):
    task = make_task({**SMALL_WORLD, "cache_dir": str(tmp_path_factory.mktemp("world"))})
    return task, task.demonstrations("train", tiny[2], n=12, max_new_tokens=64)


def test_oracle_demonstrations_follow_the_protocol_and_answer_right(demos, tiny):
    task, groups = demos
    tok = tiny[2]
    assert len(groups) == 12
    for g in groups:
        t = g.trajectories[0]
        assert is_valid_format(t.text), t.text
        assert task.outcome(g.prompt, t) == 1.0  # F1 of the gold answer, valid format
        assert f1_score(t.text.split("<answer>")[-1].split("</answer>")[0], g.prompt.answer) == 1
        docs = g.prompt.meta["supporting_docs"]
        assert t.info["searches"] == min(len(dict.fromkeys(docs)), task.max_turns)
        assert t.info["turns"] == t.info["searches"] + 1 and t.finish == "answer"
        toks, mask = np.asarray(t.tokens), np.asarray(t.loss_mask)
        observed = tok.decode(toks[mask == 0].tolist())
        acted = tok.decode(toks[mask == 1].tolist())
        assert observed.count("<information>") == t.info["searches"]
        assert "<information>" not in acted and acted.count("<search>") == t.info["searches"]


def test_oracle_turns_need_supporting_docs():
    p = Prompt(id="q1", messages=({"role": "user", "content": "?"},), answer=("x",), meta={})
    with pytest.raises(ValueError, match="q1: no supporting_docs"):
        oracle_turns(p, {}, 2)
    p = Prompt(id="q2", messages=p.messages, answer=("x",), meta={"supporting_docs": ["7"]})
    with pytest.raises(ValueError, match=r"q2: supporting docs \['7'\]"):
        oracle_turns(p, {"1": "A"}, 2)
    turns = oracle_turns(Prompt(id="q3", messages=p.messages, answer=("Ann",),
                                meta={"supporting_docs": ["1", "2", "1", "3"]}),
                         {"1": "A", "2": "B", "3": "C"}, 2)
    assert turns[:2] == ["<think> I need information about A. </think>\n<search> A </search>",
                         "<think> I need information about B. </think>\n<search> B </search>"]
    assert turns[2].endswith("<answer> Ann </answer>") and len(turns) == 3


def test_sft_loss_is_masked_token_nll(demos, tiny):
    cfg, params, tok = tiny
    trajs = [g.trajectories[0] for g in demos[1][:3]]
    batch = demo_batch(trajs, tok.pad_id, resp_len=max(len(t.tokens) for t in trajs))
    loss, n = sft_loss(cfg, params, {k: jnp.asarray(v) for k, v in batch.items()})
    # independent reference: full-sequence logits, log-softmax in NumPy, action tokens only
    total, count = 0.0, 0
    for t in trajs:
        seq = np.asarray([*t.prompt_tokens, *t.tokens])
        logits = forward(cfg, params, jnp.asarray(seq[None]))
        lg = np.asarray(logits[0], np.float64)
        lp = lg - lg.max(-1, keepdims=True)
        lp = lp - np.log(np.exp(lp).sum(-1, keepdims=True))
        p = len(t.prompt_tokens)
        for j, m in enumerate(t.loss_mask):
            if m:
                total -= lp[p + j - 1, seq[p + j]]
                count += 1
    assert int(n) == count
    np.testing.assert_allclose(float(loss), total / count, rtol=1e-4)


def test_sft_steps_lower_the_loss(demos, tiny):
    cfg, params, tok = tiny
    trajs = [g.trajectories[0] for g in demos[1][:4]]
    batch = {k: jnp.asarray(v) for k, v in demo_batch(
        trajs, tok.pad_id, max(len(t.tokens) for t in trajs)).items()}
    opt = make_optimizer(OptimConfig(lr=3e-3))
    step = make_sft_step(cfg, opt)
    state = init_train_state(jax.tree.map(jnp.copy, params), opt)
    losses = []
    for _ in range(6):
        state, m = step(state, batch)
        losses.append(float(m["sft/loss"]))
    assert losses[-1] < losses[0] - 0.5, losses


def test_sft_cli_then_rl_starts_from_it(tmp_path):
    cache = tmp_path / "world"
    common = ["model=tiny", "task=search_qa", *SMALL_WORLD_ARGS, f"task.cache_dir={cache}",
              "trainer.max_new_tokens=48", "trainer.progress=false", "trainer.loggers=[]"]
    sft_dir = tmp_path / "sft"
    res = subprocess.run([sys.executable, "-m", "rl.sft", *common, "sft.examples=4",
                          "sft.eval_examples=2", "sft.batch_size=2", f"trainer.run_dir={sft_dir}",
                          f"hydra.run.dir={sft_dir}"], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(x) for x in (sft_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "sft/loss" in r] == [0, 1]
    dev = [r["sft/dev_loss"] for r in rows if "sft/dev_loss" in r]
    assert len(dev) == 2 and rows[0]["sft/demo_outcome"] == 1.0
    assert (sft_dir / "config.yaml").exists() and (sft_dir / "samples.jsonl").exists()

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from rl.run.evaluation import load_run_params
    from rl.run.trainer import ConfigError, build_trainer

    _, sft_params, _, step = load_run_params(sft_dir)
    assert step == 2
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[*common, f"trainer.run_dir={tmp_path / 'rl'}",
                                           f"trainer.init_from={sft_dir}"])
    trainer = build_trainer(OmegaConf.to_container(cfg, resolve=True))
    jax.tree.map(np.testing.assert_array_equal, trainer.state.params, sft_params)
    trainer.close()
    base = load_params("tiny")[1]
    assert not np.array_equal(base["embed"], sft_params["embed"])  # SFT moved the weights

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        bad = compose("config", overrides=[*common, f"trainer.run_dir={tmp_path / 'rl2'}",
                                           f"trainer.init_from={tmp_path / 'nowhere'}"])
    with pytest.raises(ConfigError, match="trainer.init_from: .*nowhere"):
        build_trainer(OmegaConf.to_container(bad, resolve=True))
