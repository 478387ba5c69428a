"""#22 item 12: with beta > 0 and every advantage 0, Adam turned the float noise of the KL
gradient into full-learning-rate steps. trainer.skip_zero_advantage (on by default) takes no
optimizer step on such a batch.

The noise comes from the reference and the policy log-probs being computed by different XLA
programs; whether their rounding differs depends on the machine and the process (in one CI run
on an Intel Xeon they came out bit-equal, the KL gradient exactly 0, and Adam's step
0/(0 + eps) = 0). So the tests put the noise in themselves: the reference weights scaled by
1 + 1e-6 (about 8 float32 ulps), a KL gradient of rounding size on every machine."""

import dataclasses
import os

import jax
import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from core.types import Prompt
from rl.run.trainer import build_trainer
from rl.run.wiring import TASKS
from tests.paths import CONF


@TASKS.register("constant_reward")
@dataclasses.dataclass(frozen=True)
class ConstantTask:
    """Every trajectory scores 1: every group is outcome-homogeneous, every advantage 0."""

    name: str = "constant_reward"

    def prompts(self, split):
        return [Prompt(id=f"p{i}", messages=({"role": "user", "content": f"hi {i}"},))
                for i in range(8)]

    def make_env(self, tokenizer, sampling):
        from rl.tasks.envs import SingleTurnEnv

        return SingleTurnEnv(tokenizer, sampling)

    def outcome(self, prompt, traj):
        return 1.0


@pytest.fixture(autouse=True)
def _char_model(char_model, monkeypatch):
    monkeypatch.setenv("CHAR_MODEL", str(char_model))


def _trainer(run_dir, *overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[
            "model=hf", f"model.path={os.environ['CHAR_MODEL']}", f"trainer.run_dir={run_dir}",
            "trainer.progress=false", "trainer.loggers=[]", "task=arith",
            "task.name=constant_reward", "~task.size", "~task.eval_size", "~task.max_operand",
            "~task.ops", "~task.seed", "~task.format_reward", "trainer.batch_prompts=2",
            "algo.group_size=2", "trainer.max_new_tokens=4", "trainer.eval_at_ends=false",
            "algo.beta=0.04", "optim.lr=1e-3", *overrides])
    return _with_rounding_noise(build_trainer(OmegaConf.to_container(cfg, resolve=True)))


def _with_rounding_noise(trainer):
    """The trainer with its KL reference off the policy by float32 rounding: ref * (1 + 1e-6)."""
    parts = trainer.parts
    assert parts.ref_params is not None  # beta > 0
    trainer.parts = dataclasses.replace(
        parts, ref_params=jax.tree.map(lambda w: w * (1 + 1e-6), parts.ref_params))
    return trainer


def _moved(trainer, steps=2):
    before = jax.tree.map(np.asarray, trainer.state.params)
    recs = [trainer.step() for _ in range(steps)]
    after = jax.tree.map(np.asarray, trainer.state.params)
    diff = max(float(np.abs(a - b).max()) for a, b in
               zip(jax.tree.leaves(before), jax.tree.leaves(after)))
    trainer.close()
    return diff, recs


def test_zero_advantage_batch_takes_no_step(tmp_path):
    diff, recs = _moved(_trainer(tmp_path / "a"))
    assert diff == 0.0
    assert [r["update/skipped"] for r in recs] == [1, 1]
    assert all(r["reward/std"] == 0 for r in recs)


def test_without_the_option_the_kl_noise_moves_the_weights(tmp_path):
    # the reproduction: nothing to learn, yet Adam's normalised steps move weights
    diff, recs = _moved(_trainer(tmp_path / "b", "trainer.skip_zero_advantage=false"))
    assert diff > 1e-6
    assert [r["update/skipped"] for r in recs] == [0, 0]
