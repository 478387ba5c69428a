"""rl.eval: search metrics on hand-built groups, and the CLI on a run folder's checkpoint."""

import json
import subprocess
import sys

import numpy as np

from core.types import Group, Prompt, Trajectory
from judges import make_judge
from rl.eval import format_table, greedy_rollouts, search_metrics


def _group(answer_text, golds, turns=2, searches=1):
    text = f"<think>x</think><search> q </search>\n\n<information>Doc 1(Title: T) t</information>" \
           f"\n\n<answer> {answer_text} </answer>"
    t = Trajectory((1,), (1, 2), (1, 1), (0.0, 0.0), text, "answer",
                   {"turns": turns, "searches": searches})
    return Group(Prompt("p", ({"role": "user", "content": "q"},), answer=tuple(golds),
                        meta={"question": "q?"}), (t,))


def test_search_metrics_by_hand():
    groups = [_group("Paris", ["Paris"]), _group("the city of Lyon", ["Lyon"]),
              _group("Rome", ["Milan", "Turin"], turns=3, searches=2)]
    m, rows = search_metrics(groups, judge=make_judge({"name": "rule"}))
    assert m["em"] == np.mean([1, 0, 0])
    # F1 of "the city of Lyon" vs "Lyon": tokens {city, of, lyon} (article dropped) -> 2*1/3/(1+1/3)
    assert np.isclose(m["f1"], (1 + 0.5 + 0) / 3)
    assert m["valid"] == 1.0 and np.isclose(m["turns"], 7 / 3) and np.isclose(m["searches"], 4 / 3)
    assert 0 <= m["judge_acc"] <= 1 and rows[0]["judge_acc"] == 1.0
    assert "judge_acc" in format_table({"dev": {"n": 3, **m}, "average": m})


def test_no_answer_is_wrong_without_asking_the_judge():
    class Judge:
        asked: list = []

        def equivalent(self, reqs):
            self.asked += [r.prediction for r in reqs]
            return make_judge({"name": "rule"}).equivalent(reqs)

    g = _group("Paris", ["Paris"])
    t = g.trajectories[0]
    silent = Group(g.prompt, (Trajectory(t.prompt_tokens, t.tokens, t.loss_mask, t.logprobs,
                                         "<think>no idea</think>", "eos"),))
    m, rows = search_metrics([g, silent], judge=(judge := Judge()))
    assert judge.asked == ["Paris"] and [r["judge_acc"] for r in rows] == [1.0, 0.0]


def test_greedy_rollouts_go_batch_by_batch():
    class Env:
        sizes: list[int] = []

        def rollout(self, policy, prompts, group_size, seed):
            self.sizes.append(len(prompts))
            return [Group(p, ()) for p in prompts]

    prompts = [Prompt(f"p{i}", ({"role": "user", "content": "q"},)) for i in range(5)]
    env = Env()
    groups = greedy_rollouts(env, None, prompts, batch_size=2)
    assert env.sizes == [2, 2, 1] and [g.prompt.id for g in groups] == [p.id for p in prompts]


def test_eval_cli_on_run_checkpoint(tmp_path):
    run = tmp_path / "run"
    cache = tmp_path / "jax"
    common = ["model=tiny", "trainer.batch_prompts=2", "algo.group_size=2",
              "trainer.max_new_tokens=4", "task.eval_size=4", "trainer.progress=false",
              f"compile_cache={cache}"]
    res = subprocess.run([sys.executable, "-m", "rl.train", *common, "trainer.max_steps=1",
                          "trainer.eval_at_ends=false", f"trainer.run_dir={run}",
                          f"hydra.run.dir={tmp_path / 'h1'}"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    # compiled programs (the training step, the sampler) land in the compilation cache
    assert any(cache.iterdir()), f"nothing stored in {cache}"
    res = subprocess.run([sys.executable, "-m", "rl.eval", *common, f"eval.run={run}",
                          "eval.splits=[dev]", "eval.batch_size=3",
                          f"trainer.run_dir={tmp_path / 'h'}",
                          f"hydra.run.dir={tmp_path / 'h2'}"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "(step 1)" in res.stdout and "dev" in res.stdout
    out = json.loads((run / "eval.json").read_text())
    assert out["results"]["dev"]["n"] == 4 and "outcome" in out["results"]["average"]
