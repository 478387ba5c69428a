"""HF export (models.export, python -m rl.export): transformers loads what we write with our
logits, for tiny Llama / Qwen2 / Qwen3 folders, a trained run's checkpoint and the shipped GGUF;
bad input is refused with exit code 2 and nothing written."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from models import load_params
from models.config import llama3_freq_factors
from models.export import ExportError, ExportOptions, export_hf, fit_llama3_scaling, hf_config
from models.loaders import load_hf_folder
from models.tokenizer import load_hf_tokenizer
from models.transformer import forward
from rl.export import main
from tests.models.test_models import _saved


def _hf_logits(folder, ids):
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(torch.tensor(ids)).logits.numpy()


def _ids(vocab, n=2, length=24, seed=0):
    return np.random.default_rng(seed).integers(0, vocab, size=(n, length))


@pytest.mark.parametrize("arch", ["llama", "llama_tied", "qwen2", "qwen3"])
def test_tiny_hf_round_trip_has_our_logits(arch, tmp_path_factory, tmp_path):
    _, _, folder = _saved(arch, tmp_path_factory)
    cfg, params = load_hf_folder(folder)
    # perturb every weight so that the export cannot pass by copying the source's files
    params = jax.tree.map(lambda x: x + 0.01 * np.sign(x), params)
    out = tmp_path / "out"
    shard = 100_000 if arch == "qwen2" else 10**9
    summary = export_hf(cfg, params, None, folder, out, ExportOptions(max_shard_bytes=shard))
    ids = _ids(cfg.vocab_size)
    ours = np.asarray(forward(cfg, params, jnp.asarray(ids)))
    assert np.abs(_hf_logits(out, ids) - ours).max() <= 1e-4
    assert summary.dtype == "float32"
    names = {p.name for p in out.iterdir()}
    if arch == "qwen2":  # sharded, with an index our loader and transformers read
        assert len(summary.weight_files) > 1 and "model.safetensors.index.json" in names
    else:
        assert summary.weight_files == ("model.safetensors",)
    from safetensors import safe_open

    written = set()
    for f in summary.weight_files:
        with safe_open(str(out / f), "np") as h:
            written |= set(h.keys())
    assert ("lm_head.weight" in written) == (not cfg.tie_embeddings)
    if (folder / "generation_config.json").exists():  # copied from the source
        gen = (folder / "generation_config.json").read_text()
        assert (out / "generation_config.json").read_text() == gen
    cfg2, params2 = load_hf_folder(out)  # and our own loader reads it back exactly
    assert cfg2 == cfg
    jax.tree.map(np.testing.assert_array_equal, params2, params)
    assert not [p for p in tmp_path.iterdir() if p.name != "out"]  # no temp folder left


def test_bfloat16_export_is_bfloat16(tmp_path_factory, tmp_path):
    _, _, folder = _saved("qwen3", tmp_path_factory)
    cfg, params = load_hf_folder(folder)
    export_hf(cfg, params, None, folder, tmp_path / "o", ExportOptions(dtype="bfloat16"))
    config = json.loads((tmp_path / "o" / "config.json").read_text())
    assert config["dtype"] == "bfloat16"
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "o"))
    assert next(hf.parameters()).dtype == torch.bfloat16
    w = hf.model.layers[1].mlp.down_proj.weight.detach().float().numpy()
    ref = np.asarray(params["layers"]["w_down"][1]).T
    assert np.abs(w - ref).max() <= np.abs(ref).max() * 2**-8  # bf16 rounding only


def test_llama3_rope_scaling_rebuilt_from_divisors(tmp_path_factory, tmp_path, char_model):
    """A GGUF keeps only RoPE divisors: the export fits the Llama 3 scaling that gives them."""
    _, _, folder = _saved("llama", tmp_path_factory)  # factor 8, original context 32
    cfg, params = load_hf_folder(folder)
    assert fit_llama3_scaling(cfg) == {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32}
    tok = load_hf_tokenizer(char_model)
    export_hf(cfg, params, tok, None, tmp_path / "o")  # as for a GGUF: config built
    ids = _ids(cfg.vocab_size, length=64)  # past the original context, where scaling matters
    ours = np.asarray(forward(cfg, params, jnp.asarray(ids)))
    assert np.abs(_hf_logits(tmp_path / "o", ids) - ours).max() <= 1e-4
    # Llama 3.2's settings, divisors stored as float32 as in a GGUF's rope_freqs.weight
    llama32 = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    f32 = np.float32(llama3_freq_factors(64, 500000.0, llama32)).tolist()
    big = cfg.replace(head_dim=64, rope_theta=500000.0, rope_freq_factors=tuple(f32))
    assert fit_llama3_scaling(big) == llama32
    assert hf_config(big, "float32", None)["rope_scaling"] == llama32  # round trip accepted
    bad = cfg.replace(rope_freq_factors=tuple([1.0, 3.0] * (cfg.head_dim // 4)))
    with pytest.raises(ExportError, match="rope_freq_factors"):
        export_hf(bad, params, tok, None, tmp_path / "o2")
    assert not (tmp_path / "o2").exists()


# ----------------------------------------------------------------------------- a trained run


def _train_one_step(run_dir, char_model):
    """One GRPO step on the char model (tests/rl/run/test_trainer.py's tiny arithmetic task)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from rl.run.trainer import build_trainer
    from tests.paths import CONF
    from tests.rl.run.test_trainer import LEARN

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[
            "model=hf", f"model.path={char_model}", f"trainer.run_dir={run_dir}",
            "trainer.progress=false", "trainer.loggers=[]", *LEARN,
            "trainer.max_steps=1", "trainer.save_every=1", "trainer.batch_prompts=2",
            "algo.group_size=4", "trainer.max_new_tokens=6", "optim.lr=1e-2",
            "trainer.eval_at_ends=false"])
    trainer = build_trainer(OmegaConf.to_container(cfg, resolve=True))
    trainer.run()
    params = jax.device_get(trainer.state.params)
    trainer.close()
    return params


@pytest.fixture(scope="module")
def trained_run(char_model, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run") / "run"
    return run_dir, _train_one_step(run_dir, char_model)


def test_run_export_has_the_trained_logits(trained_run, char_model, tmp_path, capsys):
    run_dir, trained = trained_run
    out = tmp_path / "hf"
    assert main([str(run_dir), str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"exported step 1 of {run_dir}" in printed and "from_pretrained" in printed
    cfg, base = load_hf_folder(char_model)
    ids = _ids(cfg.vocab_size)
    ref = _hf_logits(out, ids)
    ours = np.asarray(forward(cfg, trained, jnp.asarray(ids)))
    base_logits = np.asarray(forward(cfg, base, jnp.asarray(ids)))
    assert np.abs(ref - ours).max() <= 1e-4
    assert np.abs(ref - base_logits).max() > 1e-3  # the training step is in the export
    # the source's tokenizer files are copied: same ids as the run's tokenizer
    text = "1+2=3? ok"
    assert load_hf_tokenizer(out).encode(text) == load_hf_tokenizer(char_model).encode(text)
    assert {p.name for p in out.iterdir()} == {
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}


def test_run_export_refuses_bad_input(trained_run, tmp_path, capsys):
    run_dir, _ = trained_run
    out = tmp_path / "hf"
    assert main([str(run_dir), str(out), "--step", "7"]) == 2
    err = capsys.readouterr().err
    assert "no checkpoint of step 7; steps: 1" in err and not out.exists()

    empty_run = tmp_path / "empty_run"
    empty_run.mkdir()
    history = (run_dir / "config_history.jsonl").read_text()
    (empty_run / "config_history.jsonl").write_text(history)
    assert main([str(empty_run), str(out)]) == 2
    assert "checkpoints: no checkpoints in this run folder" in capsys.readouterr().err
    assert not out.exists() and not (empty_run / "checkpoints").exists()

    assert main([str(tmp_path / "nowhere"), str(out)]) == 2
    assert ("nowhere/config.yaml: not a run folder (no config.yaml or config_history.jsonl)"
            in capsys.readouterr().err)
    assert main(["--model", str(tmp_path / "nope"), str(out)]) == 2
    assert "nope: no such file or folder, and not a preset" in capsys.readouterr().err

    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main([str(run_dir), str(out)]) == 2
    assert f"{out}: exists and is not empty (pass --force" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert main([str(run_dir), str(out), "--force"]) == 0
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


# ----------------------------------------------------------------------------- shipped model


@pytest.mark.slow
def test_shipped_gguf_exports_as_llama_with_our_logits(tmp_path, capsys):
    out = tmp_path / "smollm2"
    assert main(["--model", "smollm2_135m", str(out)]) == 0
    assert "exported model smollm2_135m" in capsys.readouterr().out
    cfg, params, tok = load_params("smollm2_135m")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert config["num_hidden_layers"] == 30 and config["tie_word_embeddings"] is True
    ids = tok.encode_chat([{"role": "user", "content": "Name three primary colors."}])
    ours = np.asarray(forward(cfg, params, jnp.asarray([ids])))
    assert np.abs(_hf_logits(out, [ids]) - ours).max() <= 1e-3
    # the tokenizer written from the GGUF's metadata: transformers and we encode alike
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(out))
    msgs = [{"role": "user", "content": "Hi there"}]
    text = tok.apply_chat_template(msgs)
    assert hf_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == text
    assert hf_tok.encode(text, add_special_tokens=False) == tok.encode(text)
    assert load_hf_tokenizer(out).eos_ids == tok.eos_ids
