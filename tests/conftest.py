import os

# Tests run on CPU; keep XLA from grabbing every core's worth of threads per process.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# XLA compiles the tests' programs without LLVM's optimisations, in this process and the ones
# its tests start: the suite's time goes mostly to compiling small programs, which this
# shortens far more than it slows running them, and its checks hold at either level
# (tolerances, or one program run twice). RUBRICRL_TEST_XLA_OPT=1 keeps XLA's default level.
if os.environ.get("RUBRICRL_TEST_XLA_OPT") != "1" and \
        "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_backend_optimization_level=0").strip()

import json  # noqa: E402
import shutil  # noqa: E402
import string  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

# One persistent compilation cache per test run, shared by the run's workers and by the
# subprocesses its tests start: the suite compiles the same tiny-model programs in many tests
# and processes (and again after `jax.clear_caches()` below), and a program compiled once is
# then read from disk. JAX reads these variables as its options' defaults, in every process
# that inherits them; the run that made the folder (the xdist controller, or a plain pytest)
# removes it at the end. RUBRICRL_TEST_COMPILE_CACHE=off runs without it.
_CACHE_OWNER = "RUBRICRL_TEST_COMPILE_CACHE" not in os.environ
if _CACHE_OWNER:
    os.environ["RUBRICRL_TEST_COMPILE_CACHE"] = tempfile.mkdtemp(prefix="rubricrl-test-xla-")
if os.environ["RUBRICRL_TEST_COMPILE_CACHE"] != "off":
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ["RUBRICRL_TEST_COMPILE_CACHE"]
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import pytest  # noqa: E402

CHARS = string.ascii_letters + string.digits + " ?!.,:<>/\n=+-*"


def write_char_model(folder: Path, seed: int = 0, hidden: int = 32, layers: int = 2) -> Path:
    """A tiny random Llama with a character-level tokenizer (vocab ~80), as an HF folder.

    Small enough that RL on it learns in a few steps; exercises the HF loading path too.
    """
    import numpy as np
    import tokenizers
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {"<pad>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(CHARS)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split("", "isolated")
    tok.decoder = tokenizers.decoders.Fuse()
    tok.add_special_tokens(["<pad>", "<eos>"])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<eos>", "pad_token": "<pad>",
        "chat_template": "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"}))
    v = len(vocab)
    cfg = {"model_type": "llama", "vocab_size": v, "hidden_size": hidden,
           "intermediate_size": 2 * hidden, "num_hidden_layers": layers,
           "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
           "tie_word_embeddings": True, "max_position_embeddings": 512, "eos_token_id": 1}
    (folder / "config.json").write_text(json.dumps(cfg))
    rng = np.random.default_rng(seed)
    hd = hidden // 4

    def w(*shape):
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)

    tensors = {"model.embed_tokens.weight": w(v, hidden),
               "model.norm.weight": np.ones(hidden, np.float32)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors |= {p + "input_layernorm.weight": np.ones(hidden, np.float32),
                    p + "post_attention_layernorm.weight": np.ones(hidden, np.float32),
                    p + "self_attn.q_proj.weight": w(hidden, hidden),
                    p + "self_attn.k_proj.weight": w(2 * hd, hidden),
                    p + "self_attn.v_proj.weight": w(2 * hd, hidden),
                    p + "self_attn.o_proj.weight": w(hidden, hidden),
                    p + "mlp.gate_proj.weight": w(2 * hidden, hidden),
                    p + "mlp.up_proj.weight": w(2 * hidden, hidden),
                    p + "mlp.down_proj.weight": w(hidden, 2 * hidden)}
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def _memory_mappings() -> tuple[int, int]:
    """(this process's memory mappings, the kernel's limit on them); (0, 1) off Linux."""
    try:
        with open("/proc/self/maps") as maps, open("/proc/sys/vm/max_map_count") as limit:
            return sum(1 for _ in maps), int(limit.read())
    except OSError:
        return 0, 1


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop JAX's compiled programs after a test module once they hold half the mappings
    the kernel allows.

    Every XLA:CPU executable holds ~7 memory mappings until it is released, and one pytest
    process compiles thousands of programs: past `vm.max_map_count` (65530 by default) the
    next compile's mmap fails and XLA segfaults inside `backend_compile` (it killed
    `make test` at ~80 %, with 64,543 mappings). Clearing after every module instead would
    recompile the programs modules share and slow the suite ~2x.
    """
    yield
    used, limit = _memory_mappings()
    if used > limit // 2:
        import gc

        import jax
        jax.clear_caches()
        gc.collect()


def pytest_unconfigure(config):
    if _CACHE_OWNER and os.environ["RUBRICRL_TEST_COMPILE_CACHE"] != "off":
        shutil.rmtree(os.environ["RUBRICRL_TEST_COMPILE_CACHE"], ignore_errors=True)


@pytest.fixture(scope="session")
def char_model(tmp_path_factory) -> Path:
    return write_char_model(tmp_path_factory.mktemp("char_model"))
