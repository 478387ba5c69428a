"""Models named by hub id: read from a Hugging Face cache laid out here as huggingface_hub
lays it out (models--org--name/refs/<branch>, snapshots/<commit>/), offline; the commit a run
loaded in its provenance."""

import json
import shutil

import jax
import numpy as np
import pytest

from models import ModelLoadError, load_params, load_shapes
from models.hub import is_hub_id
from tests.conftest import write_char_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A cache holding acme/char-llama: branch main at COMMIT, a second commit OTHER with
    other weights (seed 1) that no branch names; HF_HUB_OFFLINE on."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    repo = cache / "models--acme--char-llama"
    write_char_model(repo / "snapshots" / COMMIT, seed=0)
    write_char_model(repo / "snapshots" / OTHER, seed=1)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return repo


def test_what_names_a_hub_id(tmp_path, monkeypatch):
    assert is_hub_id("Qwen/Qwen3-4B") and is_hub_id("org_1/model.v2-instruct")
    assert not is_hub_id("/models/Qwen3-4B") and not is_hub_id("./Qwen3-4B")
    assert not is_hub_id("a/b/c") and not is_hub_id("tiny") and not is_hub_id("x.gguf")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "local" / "model").mkdir(parents=True)
    assert not is_hub_id("local/model")  # an existing folder stays a path


def test_a_hub_id_loads_its_cached_snapshot_offline(hub):
    cfg, params, tok = load_params("acme/char-llama")
    want_cfg, want, want_tok = load_params(str(hub / "snapshots" / COMMIT))
    assert cfg == want_cfg and tok.vocab_size == want_tok.vocab_size
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(want)):
        np.testing.assert_array_equal(a, b)
    # a branch and a commit as the revision; the other commit's weights differ
    _, by_branch, _ = load_params("acme/char-llama", revision="main")
    _, other, _ = load_params("acme/char-llama", revision=OTHER)
    assert np.array_equal(by_branch["embed"], params["embed"])
    assert not np.array_equal(other["embed"], params["embed"])
    cfg2, shapes, _ = load_shapes("acme/char-llama")
    assert cfg2 == cfg and shapes["embed"].shape == params["embed"].shape


def test_a_model_the_cache_lacks_is_a_clear_error_offline(hub):
    with pytest.raises(ModelLoadError, match=r"model acme/char-llama at revision v2: not in the "
                                             r"Hugging Face cache \(.*hub\) and HF_HUB_OFFLINE "
                                             r"is set"):
        load_params("acme/char-llama", revision="v2")
    with pytest.raises(ModelLoadError, match="acme/missing: not in the Hugging Face cache"):
        load_params("acme/missing")
    with pytest.raises(ModelLoadError, match="tiny is not a hub id"):
        load_params("tiny", revision="main")


def test_a_run_from_a_hub_id_records_the_commit_it_loaded(hub, tmp_path):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from rl.run.evaluation import run_model
    from rl.run.trainer import build_trainer
    from tests.paths import CONF

    # main moves to OTHER after the run: the run folder still names the commit it trained
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[
            "model=hf", "model.path=acme/char-llama", f"trainer.run_dir={tmp_path / 'run'}",
            "trainer.max_steps=1", "trainer.batch_prompts=2", "algo.group_size=2",
            "trainer.max_new_tokens=4", "trainer.progress=false", "trainer.loggers=[]",
            "trainer.save_every=0", "trainer.eval_at_ends=false"])
    trainer = build_trainer(OmegaConf.to_container(cfg, resolve=True))
    trainer.run()
    trainer.close()
    record = json.loads((tmp_path / "run" / "provenance.jsonl").read_text().splitlines()[-1])
    assert record["model"] == {"path": "acme/char-llama", "revision": None, "commit": COMMIT}
    assert record["data"] is None  # arith is generated, no files
    (hub / "refs" / "main").write_text(OTHER)
    assert run_model(tmp_path / "run") == ("acme/char-llama", COMMIT)
    shutil.rmtree(hub / "snapshots" / OTHER)  # nothing reads it
    path, revision = run_model(tmp_path / "run")
    assert load_params(path, revision=revision)[0].vocab_size > 0


def test_a_plan_reads_a_hub_models_shape_from_its_config_alone(hub):
    from models.shapes import model_shapes

    assert model_shapes("acme/char-llama") == load_params("acme/char-llama")[0]
    with pytest.raises(ModelLoadError, match="model acme/other: not in the Hugging Face cache"):
        model_shapes("acme/other")
