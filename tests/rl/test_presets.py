"""The papers' runs as presets (conf/experiment): each composes with the settings the papers
and the authors' configs state (written here from them, by hand), names every key it leaves
to the user, and runs a step with its model and data swapped for the tiny model and small
fixture files."""

import json

import pytest
from hydra import compose, initialize_config_dir
from omegaconf.errors import InterpolationResolutionError

from rl.run.resolve import resolved_config
from tests.judge_server import FakeJudgeServer
from tests.paths import CONF, FIXTURES

QA = FIXTURES / "qa"


def _compose(*overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def test_prorubric_paper_is_the_authors_run():
    cfg = resolved_config(_compose("experiment=prorubric_paper", "task.path=x.parquet",
                                   "judge.base_url=http://judge/v1", "judge.model=j",
                                   "trainer.run_dir=r"))
    m, t, a, o = cfg["model"], cfg["trainer"], cfg["algo"], cfg["optim"]
    # Qwen3-4B, non-thinking (their apply_chat_template_kwargs.enable_thinking=False)
    assert m["path"] == "Qwen/Qwen3-4B" and m["chat_template_kwargs"] == {"enable_thinking": False}
    # configs/prorubric.yaml: train_batch_size 64, rollout.n 8, lr 1e-6 constant, 10 warm-up
    # steps (2 optimizer updates each: mini-batch 32), 300 steps, clip 0.2 / 0.28, grad clip
    # 0.1, weight decay 0.1, no KL, max_response_length 8192, test_freq 100, data seed 42
    assert (t["batch_prompts"], a["group_size"], o["lr"], o["schedule"]) == (
        64, 8, 1e-6, "constant")
    assert (o["warmup_steps"], t["mini_batches"], t["max_steps"]) == (20, 2, 300)
    assert (a["eps_low"], a["eps_high"], o["grad_clip"], o["weight_decay"], a["beta"]) == (
        0.2, 0.28, 0.1, 0.1, 0.0)
    assert (t["max_new_tokens"], t["eval_every"], cfg["task"]["seed"]) == (8192, 100, 42)
    # chosen from rl.plan's h100:8 estimate (docs: Reproducing the papers)
    assert (t["rollout_chunks"], t["micro_batches"]) == (2, 16)
    # the official arm, its overlong shaping (buffer 4,096 of the 8,192 budget, factor 0.5)
    assert a["name"] == "prorubric_official" and cfg["task"]["aggregator"] == "prorubric_official"
    assert (a["overlong"]["enabled"], a["overlong"]["buffer_frac"], a["overlong"]["penalty"]) \
        == (True, 0.5, 0.5)
    assert cfg["judge"]["name"] == "openai"
    assert cfg["mesh"]["shape"] == {"data": 1, "fsdp": 8, "tensor": 1}  # one node of 8 GPUs
    # the atomic arm against it is one override
    atomic = resolved_config(_compose("experiment=prorubric_paper", "algo=rubric_rl_official",
                                      "task.path=x", "judge.base_url=u", "judge.model=j",
                                      "trainer.run_dir=r"))
    assert atomic["task"]["aggregator"] == "rubric_rl_official"
    assert atomic["trainer"]["batch_prompts"] == 64


def test_arbor_paper_is_the_papers_run_on_search_r1s_recipe():
    cfg = resolved_config(_compose(
        "experiment=arbor_paper", "task.train_path=t.parquet", "task.retriever.url=http://r",
        "judge.base_url=http://judge/v1", "judge.model=j", "trainer.run_dir=r",
        "task.eval_paths={bamboogle: b, hotpotqa: h, musique: m, 2wikimultihopqa: w}"))
    t, a, task = cfg["trainer"], cfg["algo"], cfg["task"]
    benchmarks = ["bamboogle", "hotpotqa", "musique", "2wikimultihopqa"]
    assert t["eval_split"] == benchmarks and cfg["eval"]["splits"] == benchmarks
    # ARBOR's best: lambda 0.1, K_consol 8; Search-R1: 512 prompts x 5, mini-batch 256, lr
    # 1e-6, KL 0.001 (low_var_kl = k3), top-3 documents, 4 turns, 500-token observations
    assert (a["name"], a["rubric_lambda"], a["k_consol"]) == ("arbor", 0.1, 8)
    assert (t["batch_prompts"], a["group_size"], t["mini_batches"]) == (512, 5, 2)
    assert t["rollout_chunks"] == 8  # chosen from rl.plan's h100:8 estimate
    assert (cfg["optim"]["lr"], a["beta"], a["kl_estimator"]) == (1e-6, 0.001, "k3")
    assert (task["topk"], task["max_turns"], task["max_obs_tokens"]) == (3, 4, 500)
    assert task["retriever"] == {"name": "http", "url": "http://r"}
    assert cfg["model"]["path"] == "Qwen/Qwen3-4B"


@pytest.mark.parametrize(("preset", "given", "missing"), [
    ("prorubric_paper", ["task.path=x"], "judge.base_url"),
    ("prorubric_paper", ["judge.base_url=u", "judge.model=j"], "task.path"),
    ("arbor_paper", ["task.train_path=t", "judge.base_url=u", "judge.model=j"],
     "task.eval_paths"),
])
def test_what_a_preset_leaves_to_you_is_named(preset, given, missing):
    with pytest.raises(InterpolationResolutionError,
                       match=rf"{missing}: the preset leaves it to you"):
        resolved_config(_compose(f"experiment={preset}", *given, "trainer.run_dir=r"))


def _one_step(tmp_path, *overrides):
    from rl.run.trainer import build_trainer

    cfg = resolved_config(_compose(*overrides, "model=tiny", "model.chat_template_kwargs={}",
                                   f"trainer.run_dir={tmp_path / 'run'}",
                                   "trainer.max_steps=1", "trainer.batch_prompts=2",
                                   "trainer.max_new_tokens=8", "trainer.mini_batches=1",
                                   "trainer.micro_batches=1", "trainer.remat=false",
                                   "model.dtype=float32", "trainer.rollout_dtype=float32",
                                   "trainer.kv_cache_dtype=float32", "trainer.logits_chunk=0",
                                   "trainer.eval_at_ends=false", "trainer.progress=false",
                                   "trainer.rollout_chunks=1",
                                   "trainer.loggers=[]", "mesh=auto"))
    trainer = build_trainer(cfg)
    history = trainer.run()
    trainer.close()
    return history


def test_each_preset_runs_a_step_on_the_tiny_model_and_fixture_files(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.rl.tasks.test_rubric_data import prorubric_train_row

    data = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([prorubric_train_row(i) for i in range(6)]), data)
    with FakeJudgeServer() as srv:
        judge = [f"judge.base_url={srv.base_url}", "judge.model=fake", "judge.api_key_env=null",
                 f"judge.cache_dir={tmp_path / 'cache'}"]
        history = _one_step(tmp_path / "prorubric", "experiment=prorubric_paper",
                            f"task.path={data}", "task.eval_fraction=0.2", "algo.group_size=2",
                            *judge)
        assert len(history) == 1
        paths = (f"{{bamboogle: {QA / 'bamboogle.csv'}, hotpotqa: {QA / 'hotpotqa.json'}, "
                 f"musique: {QA / 'musique.jsonl'}, "
                 f"2wikimultihopqa: {QA / '2wikimultihopqa.json'}}}")
        history = _one_step(
            tmp_path / "arbor", "experiment=arbor_paper",
            f"task.train_path={QA / 'flashrag.jsonl'}", f"task.eval_paths={paths}",
            "task.retriever=null", f"task.cache_dir={tmp_path / 'world'}",
            "task.n_entities=200", "task.max_turns=1", "task.max_response_tokens=64",
            "task.max_obs_tokens=40", "algo.group_size=2", "algo.embedder=hashing", *judge)
        assert len(history) == 1
    record = json.loads((tmp_path / "arbor" / "run" / "metrics.jsonl").read_text()
                        .splitlines()[0])
    assert "memory/drafts" in record or any(k.startswith("memory/") for k in record)


@pytest.mark.parametrize(("mesh", "needs"), [(None, 8), ("v5e_16", 16)])
def test_a_preset_on_too_few_devices_names_its_mesh_and_the_devices_there_are(
        tmp_path, mesh, needs):
    from rl.run.config import ConfigError
    from rl.run.trainer import build_trainer

    cfg = resolved_config(_compose(
        "experiment=prorubric_paper", "model=tiny", "model.chat_template_kwargs={}",
        "task.path=x.parquet", "judge.base_url=http://judge/v1", "judge.model=j",
        f"trainer.run_dir={tmp_path / 'run'}", *([f"mesh={mesh}"] if mesh else [])))
    with pytest.raises(ConfigError, match=rf"mesh.shape: mesh: shape {{'data': 1, 'fsdp': "
                                          rf"{needs}, 'tensor': 1}} needs {needs} devices, "
                                          rf"have 1 \(1 cpu device\(s\) in this job"):
        build_trainer(cfg)
    assert not (tmp_path / "run").exists()
