"""A start reads and checks every input before the model loads, and a failed start leaves no
files: the #22 reproductions (a bad eval file found only after training steps, the README's
eval_paths example, a failed start's litter, a credential written into .hydra/)."""

import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import rl.run.trainer
from rl.run.trainer import ConfigError, build_trainer
from rl.train import secret_overrides
from tests.paths import CONF, FIXTURES

QA = FIXTURES / "qa" / "flashrag.jsonl"


def _cfg(run_dir, *overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["model=tiny", f"trainer.run_dir={run_dir}",
                                           "trainer.progress=false", *overrides])
    return OmegaConf.to_container(cfg, resolve=True)


@pytest.fixture
def no_model(monkeypatch):
    """Loading the model is an error: the checks must have failed before it."""
    def load(*a, **k):
        raise AssertionError("the model was loaded before the inputs were checked")

    monkeypatch.setattr(rl.run.trainer, "load_params", load)


def test_missing_eval_split_is_named_before_the_model_loads(tmp_path, no_model):
    # the README's example without trainer.eval_split: a train_path leaves no 'dev' split
    cfg = _cfg(tmp_path / "r", "task=search_qa", f"task.train_path={QA}",
               f"+task.eval_paths={{hotpotqa: {QA}}}")
    with pytest.raises(ConfigError, match=r"trainer\.eval_split: split 'dev'.*hotpotqa"):
        build_trainer(cfg)
    assert not (tmp_path / "r").exists()


def test_bad_eval_file_is_named_before_the_model_loads(tmp_path, no_model):
    missing = tmp_path / "nope.jsonl"
    cfg = _cfg(tmp_path / "r", "task=search_qa", f"task.train_path={QA}",
               f"+task.eval_paths={{bench: {missing}}}", "trainer.eval_split=bench")
    with pytest.raises(ConfigError, match=r"trainer\.eval_split: split 'bench'.*nope\.jsonl"):
        build_trainer(cfg)


def test_eval_split_not_read_when_the_run_never_evaluates(tmp_path, no_model):
    cfg = _cfg(tmp_path / "r", "trainer.eval_split=nope", "trainer.eval_at_ends=false")
    with pytest.raises(AssertionError, match="model was loaded"):  # got past the checks
        build_trainer(cfg)


def test_bad_train_file_is_named_before_the_model_loads(tmp_path, no_model):
    bad = tmp_path / "train.jsonl"
    bad.write_text('{"question": "q"}\n')
    cfg = _cfg(tmp_path / "r", "task=search_qa", f"task.train_path={bad}",
               "trainer.eval_at_ends=false")
    with pytest.raises(ConfigError, match=r"task: split 'train'.*train\.jsonl"):
        build_trainer(cfg)


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "rl.train", "model=tiny",
                           "trainer.progress=false", *args],
                          capture_output=True, text=True, timeout=300, cwd=cwd)


def test_failed_start_leaves_no_files(tmp_path):
    from tests.paths import ROOT

    # fails after the checkpoint folder was made: the model file does not exist
    res = _cli("model=hf", f"model.path={tmp_path / 'no_model'}",
               f"hydra.run.dir={tmp_path / 'run'}", cwd=ROOT)
    assert res.returncode != 0
    assert "no_model" in res.stderr
    assert not (tmp_path / "run").exists(), sorted((tmp_path / "run").rglob("*"))


def test_failed_start_keeps_what_was_there(tmp_path):
    from tests.paths import ROOT

    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("mine")
    res = _cli("trainer.eval_split=nope", f"trainer.run_dir={run}",
               f"hydra.run.dir={tmp_path / 'hydra'}", cwd=ROOT)
    assert res.returncode != 0 and "trainer.eval_split" in res.stderr
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]
    assert not (tmp_path / "hydra").exists()


def test_credentials_are_refused_before_hydra_writes_them(tmp_path):
    from tests.paths import ROOT

    res = _cli("judge=openai", "+judge.api_key=sk-test-123", f"hydra.run.dir={tmp_path / 'h'}",
               cwd=ROOT)
    assert res.returncode != 0 and "judge.api_key" in res.stderr
    assert "sk-test-123" not in res.stderr
    assert not (tmp_path / "h").exists()


@pytest.mark.parametrize("argv, keys", [
    (["+judge.api_key=x", "judge.api_key_env=K", "trainer.seed=1"], ["judge.api_key"]),
    (["judge.token=t", "~judge.password", "++x.secret=1"], ["judge.token", "x.secret"]),
    (["-m", "judge.tokenizer=a", "model.auth=b"], ["model.auth"]),
])
def test_secret_overrides(argv, keys):
    assert secret_overrides(argv) == keys


def test_micro_batch_split_names_micro_batches(tmp_path):
    # 4 prompts x 4 trajectories = 16 rows: 2 mini-batches fit, 2 x 3 micro-batches do not
    with pytest.raises(ConfigError, match=r"trainer\.micro_batches.*2 x 3"):
        build_trainer(_cfg(tmp_path / "r", "trainer.mini_batches=2", "trainer.micro_batches=3"))
    with pytest.raises(ConfigError, match=r"trainer\.mini_batches.*16 trajectories"):
        build_trainer(_cfg(tmp_path / "r", "trainer.mini_batches=3"))


def test_a_hub_model_or_dataset_the_cache_lacks_is_named_before_the_model_loads(
        tmp_path, no_model, monkeypatch):
    """Offline, with an empty Hugging Face cache: the model's and the dataset's ids are named
    with the cache and HF_HUB_OFFLINE, before anything loads, and no run folder is made."""
    from huggingface_hub import constants

    from rl.tasks.sources import SourceError

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    cfg = _cfg(tmp_path / "r", "model=hf", "model.path=acme/absent-model")
    with pytest.raises(ConfigError, match=r"model.path: model acme/absent-model: not in the "
                                          r"Hugging Face cache .*HF_HUB_OFFLINE is set"):
        build_trainer(cfg)
    cfg = _cfg(tmp_path / "r", "task=rubric_data", "task.dataset=acme/absent-data",
               "judge=rule", "algo=rubric_rl")
    with pytest.raises(SourceError, match=r"task.dataset: dataset acme/absent-data: not in "
                                          r"the Hugging Face cache .*HF_HUB_OFFLINE is set"):
        build_trainer(cfg)
    assert not (tmp_path / "r").exists()


def test_a_dcn_shape_the_job_cannot_hold_is_named_before_the_model_loads(tmp_path, no_model):
    """One device, one node: a data axis of 2 across nodes is refused naming the key."""
    cfg = _cfg(tmp_path / "r", "mesh.dcn_shape={data: 2}")
    with pytest.raises(ConfigError, match=r"^mesh\.dcn_shape: .* does not divide the mesh "
                                          r"\{'data': 1, 'fsdp': 1, 'tensor': 1\} along"):
        build_trainer(cfg)
