"""task=prompts: verl-format parquet rows (written here by hand), named columns with
multiple-choice options, the reward each row's data source names, bad rows named before
anything loads, your own registered reward, and a short run."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from core.types import Trajectory
from rewards.outcomes import OUTCOME_REWARDS
from rl.run.wiring import make_task
from rl.tasks.prompts import PromptsTask
from rl.tasks.sources import SourceError
from tests.paths import CONF


def verl_row(source: str, question: str, truth, index: int) -> dict:
    """A row of verl's prompt parquet (examples/data_preprocess: data_source, prompt as a
    chat list, ability, reward_model {style, ground_truth}, extra_info {split, index})."""
    return {"data_source": source, "prompt": [{"role": "user", "content": question}],
            "ability": "math" if "gsm8k" in source else "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": truth},
            "extra_info": {"split": "train", "index": index}}


ROWS = [
    verl_row("openai/gsm8k", "Natalia sold 48 clips in April and half as many in May. "
             "How many in all?", "Natalia sold 48/2 = 24 clips in May. #### 72", 0),
    verl_row("openai/gsm8k", "What is 6 times 7?", "#### 42", 1),
    verl_row("nq", "who wrote the novel 1984?", {"target": ["George Orwell", "Orwell"]}, 2),
    verl_row("nq", "what is the capital of france?", {"target": ["Paris"]}, 3),
    verl_row("medqa", "Which drug blocks platelets?\n\nA. aspirin\nB. insulin", "A", 4),
    verl_row("medqa", "Which organ makes insulin?\n\nA. liver\nB. pancreas", "B", 5),
]


def write_parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_sources(folder, rows):
    """One parquet per data source, as verl's preprocessing writes them (a parquet column
    holds one type: Search-R1's ground truth is a struct, GSM8K's a string)."""
    folder.mkdir()
    for source in dict.fromkeys(r["data_source"] for r in rows):
        write_parquet(folder / f"{source.replace('/', '_')}.parquet",
                      [r for r in rows if r["data_source"] == source])
    return folder


@OUTCOME_REWARDS.register("says_yes_test")
def says_yes(response_text, ground_truth):
    """A reward of the tests' own: 1 for an answer that starts with yes."""
    return float(response_text.strip().lower().startswith("yes"))


def traj(text: str) -> Trajectory:
    return Trajectory(prompt_tokens=(1,), tokens=(2,), loss_mask=(1,), logprobs=(0.0,),
                      text=text, finish="eos")


def test_verl_rows_are_scored_by_the_reward_their_data_source_names(tmp_path):
    path = write_sources(tmp_path / "train", ROWS)
    task = PromptsTask(path=str(path), eval_fraction=0.2)
    prompts = {p.id: p for s in ("train", "dev", "test") for p in task.prompts(s)}
    assert len(prompts) == 6 and len(task.prompts("dev")) == len(task.prompts("test")) == 1
    math, qa, choice = (prompts["openai_gsm8k.parquet:0"], prompts["nq.parquet:2"],
                        prompts["medqa.parquet:4"])
    assert [p.meta["reward"] for p in (math, qa, choice)] == ["math", "qa_em", "choice"]
    assert math.messages == ({"role": "user", "content": ROWS[0]["prompt"][0]["content"]},)
    assert task.outcome(math, traj("48 + 24 = \\boxed{72}")) == 1.0
    assert task.outcome(math, traj("\\boxed{71}")) == 0.0
    assert task.outcome(qa, traj("<answer>george orwell</answer>")) == 1.0
    assert task.outcome(choice, traj("The answer is (A).")) == 1.0
    assert task.outcome(choice, traj("The answer is (B).")) == 0.0
    report = task.evaluate([math, qa, choice], ["\\boxed{72}", "<answer>Huxley</answer>",
                                                "A"])
    assert report.reward.tolist() == [1.0, 0.0, 1.0]
    assert report.summary == {"reward/choice": 1.0, "reward/math": 1.0, "reward/qa_em": 0.0}
    # one reward for every row, by name
    forced = PromptsTask(path=str(path), reward="qa_f1", eval_fraction=0.2)
    assert {p.meta["reward"] for p in forced.prompts("train")} == {"qa_f1"}


def test_named_columns_with_options(tmp_path):
    """MedQA-style rows (question, options as a mapping, answer_idx), as JSON Lines."""
    rows = [{"question": f"Question {i}: which one?", "options": {"A": "x", "B": "y"},
             "answer_idx": "AB"[i % 2], "meta_info": "step1"} for i in range(4)]
    path = tmp_path / "medqa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = PromptsTask(path=str(path), prompt_field="question", answer_field="answer_idx",
                       options_field="options", reward="choice", eval_fraction=0.25)
    prompt = next(p for s in ("train", "dev", "test") for p in task.prompts(s)
                  if p.id == "medqa.jsonl:1")
    assert prompt.messages[-1]["content"] == "Question 1: which one?\n\nA. x\nB. y"
    assert task.outcome(prompt, traj("Answer: B")) == 1.0


def test_bad_rows_are_named_before_anything_loads(tmp_path):
    rows = [dict(r) for r in ROWS[:2]] + [verl_row("openai/gsm8k", "q", "#### 1", 7)]
    del rows[2]["reward_model"]
    path = write_parquet(tmp_path / "bad.parquet", rows)
    with pytest.raises(SourceError, match=r"bad.parquet: row 2: reward_model.ground_truth: "
                                          r"missing \(the field task.answer_field names\)"):
        PromptsTask(path=str(path))
    other = write_parquet(tmp_path / "other.parquet", [*ROWS[:2], verl_row("law", "q", "a", 9)])
    with pytest.raises(SourceError, match=r"other.parquet: row 2: data_source: data source "
                                          r"'law' names no reward; set task.reward="):
        PromptsTask(path=str(other))
    with pytest.raises(SourceError, match="task.reward: unknown reward 'exact'"):
        PromptsTask(path=str(other), reward="exact")
    with pytest.raises(SourceError, match=r"row 0: question: missing"):
        PromptsTask(path=str(other), prompt_field="question", reward="qa_em")


def test_a_reward_of_your_own_by_name(tmp_path):
    path = write_parquet(tmp_path / "train.parquet", [*ROWS[:2], verl_row("law", "q", "a", 9)])
    task = make_task({"name": "prompts", "path": str(path), "reward": "says_yes_test"})
    prompt = task.prompts("train")[0]
    assert task.outcome(prompt, traj("Yes, it is.")) == 1.0
    assert task.outcome(prompt, traj("No.")) == 0.0


def test_two_steps_on_a_verl_parquet_with_every_reward(tmp_path):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from rl.run.trainer import build_trainer

    path = write_sources(tmp_path / "train", ROWS * 2)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[
            "task=prompts", f"task.path={path}", "task.eval_fraction=0.25", "model=tiny",
            f"trainer.run_dir={tmp_path / 'run'}", "trainer.max_steps=2",
            "trainer.batch_prompts=3", "algo.group_size=2", "trainer.max_new_tokens=8",
            "trainer.progress=false", "trainer.loggers=[]", "trainer.save_every=0",
            "trainer.eval_split=test"])
    trainer = build_trainer(OmegaConf.to_container(cfg, resolve=True))
    history = trainer.run_with_eval()
    assert len(history) == 2
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text()
               .splitlines()]
    evals = [m for m in metrics if "eval/outcome_mean" in m]
    assert len(evals) == 2 and all(0.0 <= m["eval/outcome_mean"] <= 1.0 for m in evals)
    assert all(any(k.startswith("eval/reward/") for k in m) for m in evals)


def test_sampled_evaluation_of_multiple_choice_reports_mean_pass_and_majority(tmp_path):
    """rl.eval's evaluation with k = 4 samples on MedQA-style rows: mean@4 (the outcome),
    pass@1..4, maj@4, each with its interval, and the choice reward's mean."""
    from models import load_params
    from rl.run.evaluation import EvalOptions, evaluate
    from rl.tasks.envs import SamplerPolicy

    rows = [{"question": f"Question {i}: which one?", "options": {"A": "x", "B": "y"},
             "answer_idx": "AB"[i % 2]} for i in range(6)]
    path = tmp_path / "medqa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = PromptsTask(path=str(path), prompt_field="question", answer_field="answer_idx",
                       options_field="options", reward="choice", eval_fraction=0.2)
    cfg, params, tok = load_params("tiny")
    res = evaluate(task, SamplerPolicy(cfg, params, tok), ["test"], max_new_tokens=4,
                   options=EvalOptions(samples=4, temperature=1.0, bootstrap=50))
    got = res["test"]
    keys = ["outcome", *(f"outcome_pass@{j}" for j in range(1, 5)), "outcome_maj@4",
            "reward/choice"]
    assert all(k in got for k in keys), sorted(got)
    assert got["outcome_pass@1"] == pytest.approx(got["outcome"])
    assert got["outcome_pass@1"] <= got["outcome_pass@2"] <= got["outcome_pass@4"] <= 1.0
    assert all(k in res["_intervals"]["test"] for k in keys[:-1])
