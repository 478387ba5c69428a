"""rl.eval: search metrics on hand-built groups, and the CLI on a run folder's checkpoint."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from core.types import Group, Prompt, Trajectory
from judges import make_judge
from rewards.qa_metrics import MetricChoice
from rl.run.evaluation import EvalOptions, evaluate, format_table, greedy_rollouts, search_metrics

ROOT = Path(__file__).resolve().parents[2]


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
    # every task keeps its answers; a run compared with itself: each pair ties, no position bias
    answers = [json.loads(x) for x in (run / "eval_samples.jsonl").read_text().splitlines()]
    assert len(answers) == 4 and {a["split"] for a in answers} == {"dev"}
    res = subprocess.run([sys.executable, "-m", "rewards.compare", str(run), str(run),
                          str(tmp_path / "cmp"), "judge=rule", "criterion=min_chars:1"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads((tmp_path / "cmp" / "compare_summary.json").read_text())
    assert summary["n_pairs"] == 4 and summary["outcomes"]["tie"]["rate"] == 1.0
    assert summary["position"]["first_shown_rate"] == 0.5


class _QATask:
    """A search_qa stand-in: each split's one question is answered "yes sir" (gold "yes")."""

    name = "search_qa"

    def prompts(self, split):
        return [_group("yes sir", ["yes"]).prompt]

    def make_env(self, tokenizer, sampling):
        class Env:
            def rollout(self, policy, prompts, group_size, seed):
                return [_group("yes sir", list(p.answer)) for p in prompts]
        return Env()

    def outcome(self, prompt, traj):
        return 0.0


class _Policy:
    tokenizer = None


def test_evaluate_scores_each_split_with_its_datasets_metrics():
    res = evaluate(_QATask(), _Policy(), ["hotpotqa", "nq", "test"], max_new_tokens=4)
    # hotpot_evaluate_v1.py: F1 0 for "yes sir" vs "yes"; SQuAD's token F1 (search_r1's f1 and
    # the reward's): P 1/2, R 1 -> 2/3; only search_r1 reports subem (gold "yes" in "yes sir")
    assert res["_metric_sets"] == {"hotpotqa": "hotpotqa", "nq": "search_r1", "test": "reward"}
    assert res["hotpotqa"]["f1"] == 0.0 and np.isclose(res["nq"]["f1"], 2 / 3)
    assert np.isclose(res["test"]["f1"], 2 / 3) and res["nq"]["subem"] == 1.0
    assert "subem" not in res["test"] and res["average"]["subem"] == 1.0  # over nq alone
    assert np.isclose(res["average"]["f1"], (0 + 2 / 3 + 2 / 3) / 3)
    # the present behaviour, one override away; and a per-split choice
    old = evaluate(_QATask(), _Policy(), ["hotpotqa"], max_new_tokens=4,
                   metrics=MetricChoice("reward"))
    assert np.isclose(old["hotpotqa"]["f1"], 2 / 3)
    by = evaluate(_QATask(), _Policy(), ["hotpotqa", "nq"], max_new_tokens=4,
                  metrics=MetricChoice(by_split={"nq": "hotpotqa"}))
    assert by["_metric_sets"] == {"hotpotqa": "hotpotqa", "nq": "hotpotqa"} and \
        by["nq"]["f1"] == 0.0


def _eval_section(**changes):
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(OmegaConf.load(ROOT / "conf/eval/default.yaml"))
    return {**data, **changes}


def test_eval_config_reads_the_yaml_and_refuses_bad_values():
    from rl.run.config import ConfigError, eval_config

    e = eval_config(_eval_section())
    assert (e.metrics, e.metrics_by_split, e.normalize, e.splits) == ("auto", {}, None, ("test",))
    assert eval_config(_eval_section(splits=["hotpotqa"], metrics_by_split={
        "hotpotqa": "search_r1"}, normalize="official")).metrics_by_split == {
        "hotpotqa": "search_r1"}
    for changes, message in [
        ({"metrics": "hotpot"}, "eval.metrics: must be auto or one of"),
        ({"metrics_by_split": {"nq": "squad"}}, "eval.metrics_by_split.nq: not an evaluated"),
        ({"metrics_by_split": {"test": "auto"}}, "eval.metrics_by_split.test: must be one of"),
        ({"normalize": "ascii"}, "eval.normalize: must be null or one of"),
        ({"splits": "dev"}, "eval.splits: expected a list"),
        ({"metric": "squad"}, "eval.metric: unknown key"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            eval_config(_eval_section(**changes))


class _ChatTask:
    """A non-search task: every prompt answered "yes sir", outcome 0.25."""

    name = "chat"

    def prompts(self, split):
        return [_group("yes sir", ["yes"]).prompt]

    def make_env(self, tokenizer, sampling):
        return _QATask().make_env(tokenizer, sampling)

    def outcome(self, prompt, traj):
        return 0.25


def test_evaluate_keeps_every_tasks_answers_for_pairwise_comparison():
    res = evaluate(_ChatTask(), _Policy(), ["dev"], max_new_tokens=4)
    [rec] = res["_records"]["dev"]
    assert rec["id"] == "p" and rec["question"] == "q?" and rec["outcome"] == 0.25
    assert rec["response"].endswith("<answer> yes sir </answer>")


# --- sampled evaluation and intervals (rl.run.eval_stats) -------------------------------------


def test_mean_and_pass_at_k_by_hand():
    from rl.run.eval_stats import prompt_values

    rows = [[{"em": 1.0, "turns": 2.0}, {"em": 0.0, "turns": 4.0}, {"em": 0.0, "turns": 3.0}],
            [{"em": 0.0, "turns": 1.0}, {"em": 0.0, "turns": 1.0}, {"em": 0.0, "turns": 1.0}]]
    got = prompt_values(rows, 3)
    # pass@j for every j (no best-of-k turns)
    assert list(got) == ["em", "em_pass@1", "em_pass@2", "em_pass@3", "turns"]
    assert got["em"].tolist() == [1 / 3, 0.0] and got["em_pass@3"].tolist() == [1.0, 0.0]
    # Chen et al.'s unbiased pass@j = 1 - C(n-c, j) / C(n, j), n = 3, c = 1:
    # j = 1: 1 - 2/3; j = 2: 1 - 1/3
    assert np.allclose(got["em_pass@1"], [1 / 3, 0.0])
    assert np.allclose(got["em_pass@2"], [2 / 3, 0.0])
    assert got["turns"].tolist() == [3.0, 1.0]
    assert list(prompt_values([[{"em": 1.0}]], 1)) == ["em"]  # greedy: the metric alone
    # F1 values 0.2, 0.8, 0.5: the expected best of 2 of the 3 pairs (0.8, 0.5, 0.8) = 0.7
    f1 = prompt_values([[{"f1": 0.2}, {"f1": 0.8}, {"f1": 0.5}]], 3)
    assert np.allclose(f1["f1_pass@2"], [0.7]) and np.allclose(f1["f1_pass@3"], [0.8])


def test_majority_vote_at_k_by_hand():
    from rl.run.eval_stats import prompt_values

    rows = [[{"outcome": 0.0}, {"outcome": 1.0}, {"outcome": 1.0}, {"outcome": 0.0}],
            [{"outcome": 1.0}, {"outcome": 0.0}, {"outcome": 0.0}, {"outcome": 0.0}],
            [{"outcome": 0.0}, {"outcome": 1.0}, {"outcome": 0.0}, {"outcome": 1.0}],
            [{"outcome": 0.0}] * 4]
    answers = [["A", "B", "B", None],     # B twice: right
               ["C", "D", "D", "D"],      # D three times: wrong, though C was right
               ["x", "y", "x", "y"],      # a tie: the answer seen first, x, is wrong
               [None] * 4]                # no answers: 0
    got = prompt_values(rows, 4, answers)
    assert got["outcome_maj@4"].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert "outcome_maj@4" not in prompt_values(rows, 4)  # no answers read: no vote


def test_intervals_are_the_documented_percentile_bootstrap():
    from rl.run.eval_stats import intervals

    a, b = np.array([0.0, 1.0, 1.0, 0.0, 1.0]), np.array([0.2, 0.4, 0.9])
    got = intervals({"x": {"em": a}, "y": {"em": b}}, n_boot=500, level=0.9, seed=3)
    # restated: split i resamples its prompts with default_rng(seed + i); the average's
    # resample means are the mean of the splits' resample means; 5th and 95th percentiles
    ia = np.random.default_rng(3).integers(0, 5, size=(500, 5))
    ib = np.random.default_rng(4).integers(0, 3, size=(500, 3))
    ma, mb = a[ia].mean(axis=1), b[ib].mean(axis=1)
    assert np.allclose(got["x"]["em"], np.quantile(ma, [0.05, 0.95]))
    assert np.allclose(got["y"]["em"], np.quantile(mb, [0.05, 0.95]))
    assert np.allclose(got["average"]["em"], np.quantile((ma + mb) / 2, [0.05, 0.95]))
    lo, hi = got["x"]["em"]
    assert lo <= a.mean() <= hi


class _SampledQATask(_QATask):
    """k samples per prompt: the first right ("Paris"), the others wrong; two prompts."""

    def prompts(self, split):
        return [_group("Paris", ["Paris"]).prompt, _group("Rome", ["Oslo"]).prompt]

    def make_env(self, tokenizer, sampling):
        assert sampling.temperature == 0.7

        class Env:
            def rollout(self, policy, prompts, group_size, seed):
                out = []
                for p in prompts:
                    answers = ["Paris"] + ["Lyon"] * (group_size - 1)
                    trajs = tuple(_group(a, list(p.answer)).trajectories[0] for a in answers)
                    out.append(Group(p, trajs))
                return out
        return Env()


def test_sampled_evaluation_reports_mean_and_pass_at_k_with_intervals():
    res = evaluate(_SampledQATask(), _Policy(), ["test"], max_new_tokens=4,
                   options=EvalOptions(samples=3, temperature=0.7, bootstrap=200))
    row = res["test"]
    # prompt 1: Paris right once in 3; prompt 2 (gold Oslo): never
    assert np.isclose(row["em"], (1 / 3 + 0) / 2) and row["em_pass@3"] == 0.5
    assert row["valid"] == 1.0 and "valid_pass@3" not in row
    assert [r["sample"] for r in res["_records"]["test"]] == [0, 1, 2, 0, 1, 2]
    lo, hi = res["_intervals"]["test"]["em_pass@3"]
    assert 0.0 <= lo <= 0.5 <= hi <= 1.0
    table = format_table(res["_intervals"], interval=True)
    assert "em_pass@3" in table and f" [{lo:.3f}, {hi:.3f}]" in table


def test_eval_config_refuses_bad_sampling_and_interval_settings():
    from rl.run.config import ConfigError, eval_config

    e = eval_config(_eval_section())
    assert (e.samples, e.temperature, e.confidence, e.bootstrap) == (1, 1.0, 0.95, 2000)
    for changes, message in [({"samples": 0}, "eval.samples: must be >= 1"),
                             ({"confidence": 1.0}, "eval.confidence: must be in (0, 1)"),
                             ({"bootstrap": 0}, "eval.bootstrap: must be >= 1"),
                             ({"temperature": 0.0}, "eval.temperature: must be > 0"),
                             ({"dtype": "float16"}, "eval.dtype: must be null")]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            eval_config(_eval_section(**changes))


def test_rubric_chat_evaluation_reports_the_tasks_scores_and_healthbench():
    """A task with a report (rubric_chat): its per-answer coverage, fitness and length join
    the row with intervals, and its HealthBench scores are the split's values, with
    intervals over the prompts."""
    from rl.tasks.rubric_chat import RubricChatTask

    class Answers(RubricChatTask):
        def make_env(self, tokenizer, sampling):
            class Env:  # the reference answer for the first prompt, a non-answer after
                def rollout(self, policy, prompts, group_size, seed):
                    return [Group(p, (Trajectory((1,), (1,), (1,), (0.0,),
                                                 p.answer if i == 0 else "No idea.", "eos"),))
                            for i, p in enumerate(prompts)]
            return Env()

    task = Answers(eval_size=2)
    res = evaluate(task, _Policy(), ["dev"], max_new_tokens=4)
    row = res["dev"]
    assert row["coverage"] == 0.5 and row["healthbench"] == 0.5  # (1 + 0) / 2
    assert row["outcome"] == 0.5 and "reward" not in row
    assert row["axis/mention"] == row["axis/explain"] == 0.5
    # HealthBench's score gets its interval too: per-prompt values 1 and 0, resamples of two
    # average 0, .5 or 1 (each end a quarter of the time): the 95 % interval is [0, 1]
    assert "coverage" in res["_intervals"]["dev"]
    assert res["_intervals"]["dev"]["healthbench"] == [0.0, 1.0]


def test_the_eval_command_reports_multiple_choice_mean_pass_and_majority_at_8(tmp_path, capsys):
    """`python -m rl.eval task=prompts ... task.reward=choice eval.samples=8` on the MedQA-style
    fixture (10 questions written by hand in MedQA's schema): mean@8 (the outcome), pass@1..8
    and maj@8, each with its interval, and the choice reward, printed and in eval.json."""
    from hydra import compose, initialize_config_dir

    from rl.eval import run
    from tests.paths import CONF, FIXTURES

    medqa = FIXTURES / "choice" / "medqa_test.jsonl"
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[
            "task=prompts", f"task.path={medqa}", f"task.test_path={medqa}",
            "task.prompt_field=question", "task.answer_field=answer_idx",
            "task.options_field=options", "task.reward=choice", "model=tiny", "eval.samples=8",
            "eval.max_new_tokens=4", "eval.bootstrap=100", f"eval.out_dir={tmp_path}",
            f"trainer.run_dir={tmp_path / 'run'}"])
    run(cfg)
    out = capsys.readouterr().out
    columns = ["outcome", *(f"outcome_pass@{j}" for j in range(1, 9)), "outcome_maj@8"]
    header = next(line for line in out.splitlines() if line.startswith("split"))
    assert header.split() == ["split", *columns, "reward/choice"], out
    assert "outcome: mean@8 (the outcome averaged over the 8 samples)" in out
    assert "95% bootstrap intervals over prompts (100 resamples)" in out
    saved = json.loads((tmp_path / "eval.json").read_text())
    assert set(columns) <= set(saved["results"]["test"])
    assert set(columns) <= set(saved["intervals"]["test"])
    # the 10 questions, 8 answers each (eval_samples.jsonl: one record per answer)
    assert len((tmp_path / "eval_samples.jsonl").read_text().splitlines()) == 80


def test_help_prints_what_the_command_does_before_hydras_groups(capsys):
    from rl.run.resolve import print_help_first

    print_help_first("Evaluate a model.\n", ["task=x", "--help"])
    assert capsys.readouterr().out == "Evaluate a model.\n\n"
    print_help_first("Evaluate a model.\n", ["task=x"])
    assert capsys.readouterr().out == ""
