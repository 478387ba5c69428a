"""Model parity with HF transformers (PyTorch CPU), loaders, and bad-input errors."""

import json
import shutil
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from models import ModelLoadError, load_params
from models.loaders import load_gguf, load_hf_folder
from models.presets import shipped_gguf_path
from models.sampler import SamplingParams, generate
from models.transformer import forward

TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-6)


def _hf_model(arch: str):
    torch.manual_seed(0)
    if arch == "llama":
        cfg = transformers.LlamaConfig(**TINY, rope_theta=10000.0, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
    elif arch == "llama_tied":
        cfg = transformers.LlamaConfig(**TINY, tie_word_embeddings=True)
    elif arch == "qwen2":
        cfg = transformers.Qwen2Config(**TINY, tie_word_embeddings=False)
    else:
        cfg = transformers.Qwen3Config(**TINY, head_dim=32, tie_word_embeddings=True)
    model = transformers.AutoModelForCausalLM.from_config(cfg).float().eval()
    with torch.no_grad():  # random norms and biases so that every weight matters
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


_SAVED: dict = {}


def _saved(arch, tmp_path_factory):
    """Each tiny HF model is built and saved once per session."""
    if arch not in _SAVED:
        model = _hf_model(arch)
        folder = tmp_path_factory.mktemp(arch)
        # small max_shard_size gives a sharded checkpoint with an index for one of the archs
        shard = "200KB" if arch == "qwen2" else "50GB"
        model.save_pretrained(folder, safe_serialization=True, max_shard_size=shard)
        _SAVED[arch] = (arch, model, folder)
    return _SAVED[arch]


@pytest.fixture(params=["llama", "llama_tied", "qwen2", "qwen3"])
def hf_folder(request, tmp_path_factory):
    return _saved(request.param, tmp_path_factory)


def test_hf_parity_logits_and_greedy(hf_folder):
    arch, hf, folder = hf_folder
    cfg, params = load_hf_folder(folder)
    assert cfg.qkv_bias == (arch == "qwen2") and cfg.qk_norm == (arch == "qwen3")
    if arch == "qwen2":
        assert (folder / "model.safetensors.index.json").exists()
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 512, size=(2, 48))
    with torch.no_grad():
        ref = hf(torch.tensor(ids)).logits.numpy()
    ours = forward(cfg, params, jnp.asarray(ids))
    assert np.abs(np.asarray(ours) - ref).max() <= 1e-4

    # same greedy continuation as HF generate
    prompt = ids[0, :10].tolist()
    with torch.no_grad():
        hf_out = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                             eos_token_id=None, pad_token_id=0)[0, 10:].tolist()

    class _Tok:  # the sampler only needs ids and token bytes from a tokenizer
        pad_id, eos_ids = 0, ()
        token_bytes = [b""] * 512

        @staticmethod
        def decode_batch(lists):
            return [""] * len(lists)

    g = generate(cfg, params, _Tok(), [prompt], SamplingParams(12, temperature=0))
    assert g.token_lists()[0] == hf_out


def test_llama3_rope_scaling_is_read(tmp_path_factory):
    _, _, folder = _saved("llama", tmp_path_factory)
    cfg, _ = load_hf_folder(folder)
    assert cfg.rope_freq_factors is not None and max(cfg.rope_freq_factors) == 8.0


def test_load_hf_folder_with_tokenizer(tmp_path_factory, tmp_path):
    _, _, folder = _saved("llama_tied", tmp_path_factory)
    from models.presets import cached_tokenizer

    work = tmp_path / "m"
    shutil.copytree(folder, work)
    tok = cached_tokenizer(str(shipped_gguf_path()))
    tok.backend.save(str(work / "tokenizer.json"))
    (work / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": tok.chat_template, "eos_token": "<|im_end|>"}))
    # the tiny model's vocabulary (512) is smaller than the tokenizer's: a clear error
    with pytest.raises(ModelLoadError, match="tokenizer has 49152 tokens"):
        load_params(str(work))


def test_untied_model_without_its_head_is_refused(tmp_path_factory, tmp_path):
    from safetensors.numpy import load_file, save_file

    _, _, folder = _saved("llama", tmp_path_factory)  # tie_word_embeddings=false
    work = tmp_path / "m"
    shutil.copytree(folder, work)
    weights = load_file(work / "model.safetensors")
    del weights["lm_head.weight"]
    save_file(weights, work / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="tie_word_embeddings=false.*no lm_head.weight"):
        load_hf_folder(work)


def test_tokenizer_files_that_do_not_parse_are_named(tmp_path):
    from models.presets import cached_tokenizer
    from models.tokenizer import load_hf_tokenizer

    tok = cached_tokenizer(str(shipped_gguf_path()))
    tok.backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "<|im_end|>",')
    with pytest.raises(ModelLoadError, match="tokenizer_config.json: not valid JSON"):
        load_hf_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "pad_token": "<pad-not-in-vocab>"}))
    t = load_hf_tokenizer(tmp_path)  # padding falls back to EOS, with a warning
    assert t.pad_id == t.eos_ids[0] == tok.backend.token_to_id("<|im_end|>")


@pytest.fixture(scope="module")
def shipped():
    return load_params("smollm2_135m")


def test_shipped_gguf_answers_simple_question(shipped):
    cfg, params, tok = shipped
    prompt = tok.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    g = generate(cfg, params, tok, [prompt], SamplingParams(24, temperature=0))
    assert "Paris" in g.texts[0]
    assert g.finish[0] == "eos"


def test_shipped_gguf_matches_transformers_gguf(shipped):
    cfg, params, tok = shipped
    path = shipped_gguf_path()
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, torch_dtype=torch.float32).eval()
    ids = tok.encode_chat([{"role": "user", "content": "Name three primary colors."}])
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits.numpy()
    ours = forward(cfg, params, jnp.asarray([ids]))
    assert np.abs(np.asarray(ours) - ref).max() <= 1e-3


def test_tiny_preset_shares_shipped_tokenizer():
    cfg, params, tok = load_params("tiny")
    assert cfg.vocab_size == tok.vocab_size == 49152
    logits = forward(cfg, params, jnp.asarray([tok.encode("hello world")]))
    assert logits.shape == (1, 2, 49152) and np.isfinite(np.asarray(logits)).all()


def test_gguf_tokenizer_reads_what_transformers_reads_without_pytorch():
    """A run installs no PyTorch, and transformers' own GGUF reader imports it: our reading of
    the tokenizer metadata (the gguf package) must equal transformers' reader's on the shipped
    file, and the tokenizer must build in a process where importing torch fails."""
    from transformers.integrations.gguf import get_gguf_tokenizer

    from models.tokenizer import gguf_tokenizer_fields

    path = shipped_gguf_path()
    assert gguf_tokenizer_fields(path) == get_gguf_tokenizer(str(path))
    script = textwrap.dedent("""
        import sys
        sys.modules["torch"] = None  # import torch raises ImportError
        from models.presets import shipped_gguf_path
        from models.tokenizer import load_gguf_tokenizer
        tok = load_gguf_tokenizer(shipped_gguf_path())
        print(tok.encode("hello world"))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    reference = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert out.stdout.split("\n")[-2] == str(reference.encode("hello world"))


# ----------------------------------------------------------------------------- bad input


def test_missing_weights_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", **TINY}))
    with pytest.raises(ModelLoadError, match="no \\*.safetensors"):
        load_hf_folder(tmp_path)


def test_corrupt_weights_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", **TINY}))
    (tmp_path / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ModelLoadError, match="model.safetensors"):
        load_hf_folder(tmp_path)


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 8}))
    with pytest.raises(ModelLoadError, match="unsupported model_type 'gpt2'"):
        load_hf_folder(tmp_path)


def test_missing_path_and_unknown_preset():
    with pytest.raises(ModelLoadError, match="not a preset"):
        load_params("no_such_model_anywhere")


def test_unsupported_gguf_quantisation(tmp_path):
    import gguf

    path = tmp_path / "bad.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for k, v in {"block_count": 1, "embedding_length": 32, "feed_forward_length": 64,
                 "attention.head_count": 2, "context_length": 64}.items():
        w.add_uint32(f"llama.{k}", v)
    rng = np.random.default_rng(0)
    # Q8_K (an intermediate type of llama.cpp's kernels) has no dequantizer in gguf
    qtype = gguf.GGMLQuantizationType.Q8_K
    raw = rng.integers(0, 255, size=(16, gguf.GGML_QUANT_SIZES[qtype][1]), dtype=np.uint8)
    w.add_tensor("token_embd.weight", raw, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelLoadError, match="bad.gguf.*token_embd.weight.*Q8_K"):
        load_gguf(path)


def test_corrupt_gguf(tmp_path):
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"GGUF" + b"\x00" * 20)
    with pytest.raises(ModelLoadError, match="broken.gguf"):
        load_gguf(path)


# ----------------------------------------------------------------------------- sharding


def test_sharded_forward_matches_single_device():
    code = textwrap.dedent("""
        import os
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + " --xla_force_host_platform_device_count=8")
        os.environ["JAX_PLATFORMS"] = "cpu"
        import jax, jax.numpy as jnp, numpy as np
        from models.presets import tiny_config
        from models.transformer import forward, init_params
        from models.sharding import make_mesh, param_shardings, batch_sharding, shard
        assert len(jax.devices()) == 8
        cfg = tiny_config(vocab_size=256, num_heads=4, num_kv_heads=2)
        params = init_params(cfg, jax.random.key(0))
        ids = jax.random.randint(jax.random.key(1), (8, 16), 0, 256)
        ref = forward(cfg, params, ids)
        mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
        sp = shard(params, param_shardings(params, mesh))
        assert tuple(sp["layers"]["wq"].sharding.spec) == (None, "fsdp", "tensor")
        sids = jax.device_put(ids, batch_sharding(mesh, 2, 8))
        out = jax.jit(lambda p, x: forward(cfg, p, x))(sp, sids)
        assert len(out.sharding.device_set) == 8
        np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=1e-5)
        print("SHARDED_OK")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert "SHARDED_OK" in res.stdout, res.stderr[-3000:]


def test_demo_cli_generates_for_each_prompt():
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "models.demo", "hello", "two", "--model", "tiny",
                          "--max-new-tokens", "5"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.count("[length]") == 2 and "> hello" in res.stdout
    assert "10 tokens in" in res.stdout and "batch 2" in res.stdout


def test_load_params_onto_a_mesh_places_every_array_on_its_shards(tmp_path):
    """With a mesh, each parameter goes straight to its sharding (no device holds the whole
    array): the values equal the mesh-less load, and a sharded axis is split; from an HF
    folder each stored byte is read once."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import os
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + " --xla_force_host_platform_device_count=4")
        os.environ["JAX_PLATFORMS"] = "cpu"
        import jax, numpy as np
        from models import load_params
        from models.sharding import make_mesh, param_shardings
        mesh = make_mesh({"fsdp": 4})
        cfg, host, _ = load_params("smollm2_135m")
        _, placed, _ = load_params("smollm2_135m", mesh=mesh)
        want = param_shardings(host, mesh)
        for a, b, s in zip(jax.tree.leaves(host), jax.tree.leaves(placed), jax.tree.leaves(want)):
            assert b.sharding == s, (b.sharding, s)
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        w = placed["layers"]["w_up"]
        assert {sh.data.shape for sh in w.addressable_shards} == {
            (w.shape[0], w.shape[1] // 4, w.shape[2])}

        # an HF folder (bfloat16 on disk): read slice by slice, each byte once, and cast per
        # slice to the same values as the whole-file load
        import sys
        from bench.random_model import write_random_model
        from models import loaders
        out = write_random_model("tiny", sys.argv[1], dtype="bfloat16").out_dir
        read = []
        plain_read = loaders.SafetensorsFiles.read
        def counting(self, name, index):
            before = self.bytes_read
            part = plain_read(self, name, index)
            read.append(self.bytes_read - before)
            return part
        loaders.SafetensorsFiles.read = counting
        _, placed, _ = load_params(str(out), mesh=mesh)
        loaders.SafetensorsFiles.read = plain_read
        with open(out / "model.safetensors", "rb") as f:
            header = int.from_bytes(f.read(8), "little")
        assert sum(read) == (out / "model.safetensors").stat().st_size - 8 - header
        _, host, _ = load_params(str(out))
        for a, b in zip(jax.tree.leaves(host), jax.tree.leaves(placed)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        print("PLACED_OK")
    """)
    res = subprocess.run([sys.executable, "-c", script, str(tmp_path / "random")],
                         capture_output=True, text=True, timeout=600)
    assert "PLACED_OK" in res.stdout, res.stderr[-3000:]


def test_chat_template_kwargs_reach_every_render():
    """model.chat_template_kwargs (Qwen3's enable_thinking=false): passed to the template on
    every render, a call's own keywords winning."""
    from models.presets import load_preset

    _, _, tok = load_preset("tiny", jnp.float32)
    template = ("{% if enable_thinking is defined and not enable_thinking %}<think></think>"
                "{% endif %}{{ messages[-1]['content'] }}")
    plain = tok.with_chat_template(template)
    quiet = plain.with_template_kwargs({"enable_thinking": False})
    chat = [{"role": "user", "content": "hi"}]
    assert plain.apply_chat_template(chat) == "hi"
    assert quiet.apply_chat_template(chat) == "<think></think>hi"
    assert quiet.apply_chat_template(chat, enable_thinking=True) == "hi"
    assert quiet.encode_chat(chat) == quiet.encode("<think></think>hi")
    assert plain.template_kwargs == {}  # the copy, not the original, holds them
