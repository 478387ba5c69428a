"""DAPO's dynamic sampling through the trainer (#18 item 8): which groups a step keeps, a
batch that ends short, the fallback to the last draw when every group is homogeneous, the data
position (one stream batch per draw) across a resume, and ARBOR under DAPO (memory tallies
over all draws, equal to the event log).

The task scores prompts p{i} with i in `informative` by a hash of the response (two samples
almost never tie) and every other prompt 1.0 (a homogeneous group): the expected kept groups
follow from DAPO's rule applied in the test to the prompt stream's batches."""

import dataclasses
import json

import pytest

from core.types import Prompt
from rl.run.trainer import build_trainer
from rl.run.wiring import TASKS
from tests.rl.rewarders.test_arbor_e2e import (
    compose_cfg,
    tiny_overrides,
    world_dir,  # noqa: F401  (a fixture)
)
from tests.rl.run.test_trainer import make_cfg


@TASKS.register("dapo_mixed")
@dataclasses.dataclass(frozen=True)
class MixedTask:
    name: str = "dapo_mixed"
    informative: tuple = (1, 3, 5, 7)

    def prompts(self, split):
        return [Prompt(id=f"p{i}", messages=({"role": "user", "content": f"say {i}"},))
                for i in range(8)]

    def make_env(self, tokenizer, sampling):
        from rl.tasks.envs import SingleTurnEnv

        return SingleTurnEnv(tokenizer, sampling)

    def outcome(self, prompt, traj):
        if int(prompt.id[1:]) not in self.informative:
            return 1.0
        return (sum((i + 1) * t for i, t in enumerate(traj.tokens)) % 997) / 997


@pytest.fixture(autouse=True)
def _char_model(char_model, monkeypatch):
    monkeypatch.setenv("CHAR_MODEL", str(char_model))


def _cfg(run_dir, informative, max_gen, *more):
    return make_cfg(run_dir, "task=arith", "task.name=dapo_mixed", "~task.size",
                    "~task.eval_size", "~task.max_operand", "~task.ops", "~task.seed",
                    "~task.format_reward", f"+task.informative={list(informative)}",
                    "algo=dapo", "algo.group_size=2", f"algo.max_gen_batches={max_gen}",
                    "trainer.batch_prompts=2", "trainer.max_new_tokens=6",
                    "trainer.eval_at_ends=false", "trainer.sample_every=1", "trainer.max_steps=2",
                    "trainer.save_every=1", *more)


def _expected(stream, start, informative, target, max_gen):
    """DAPO's rule: draw stream batches from `start`; keep informative groups in order until
    `target` are kept or `max_gen` draws are spent; none kept: the last draw, whole."""
    kept, draws = [], 0
    for i in range(max_gen):
        batch = [p.id for p in stream.batch(start + i)]
        draws += 1
        kept += [pid for pid in batch if int(pid[1:]) in informative][:target - len(kept)]
        if len(kept) >= target:
            break
    return (kept or batch), draws


def _step_samples(run_dir, step):
    recs = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    return list(dict.fromkeys(r["prompt_id"] for r in recs if r["step"] == step))


@pytest.mark.parametrize("informative, max_gen", [
    ((1, 3, 5, 7), 8),   # fills: two informative groups per step
    ((1,), 4),           # one informative prompt in 8: the batch ends short with one group
    ((), 3),             # nothing informative: the last draw, all advantages 0
], ids=["fills", "ends_short", "falls_back"])
def test_dynamic_sampling_through_the_trainer(tmp_path, informative, max_gen):
    trainer = build_trainer(_cfg(tmp_path / "r", informative, max_gen))
    stream = trainer.parts.stream
    position = 0
    for step in range(2):
        kept, draws = _expected(stream, position, set(informative), 2, max_gen)
        rec = trainer.step()
        position += draws
        assert trainer.loop.data_position == position
        assert rec["dapo/gen_batches"] == draws
        assert rec["dapo/filled"] == float(len(kept) == 2 and bool(informative))
        assert _step_samples(tmp_path / "r", step) == kept
        assert rec["update/skipped"] == int(not informative)
    trainer.close()


def test_data_position_survives_a_resume(tmp_path):
    cfg = lambda *more: _cfg(tmp_path / "r", (1, 3), 4, *more)  # noqa: E731
    first = build_trainer(cfg())
    first.run(until=1)
    position = first.loop.data_position
    first.close()
    resumed = build_trainer(cfg("trainer.resume=true"))
    assert resumed.loop.step == 1 and resumed.loop.data_position == position
    kept, draws = _expected(resumed.parts.stream, position, {1, 3}, 2, 4)
    rec = resumed.step()
    assert rec["dapo/gen_batches"] == draws and resumed.loop.data_position == position + draws
    assert _step_samples(tmp_path / "r", 1) == kept
    resumed.close()


def test_arbor_dapo_tallies_every_draw(tmp_path, world_dir):  # noqa: F811
    over = tiny_overrides(tmp_path / "run", world_dir, "task.name=search_qa_scripted",
                          "algo=arbor_dapo", "algo.k_consol=4", "algo.max_gen_batches=3",
                          "trainer.max_steps=2", "trainer.save_every=0")
    trainer = build_trainer(compose_cfg(*over))
    recs = trainer.run()
    trainer.close()
    events = [json.loads(x) for x in (tmp_path / "run" / "memory_events.jsonl").read_text()
              .splitlines()]
    for rec in recs:
        mine = [e for e in events if e["step"] == rec["step"]]
        assert rec["memory/admitted"] == sum(e["kind"] == "admitted" for e in mine)
        assert rec["dapo/gen_batches"] >= 1
    assert any(r["dapo/gen_batches"] > 1 for r in recs), "some step should draw again"
    assert sum(r["memory/admitted"] for r in recs) > 0
