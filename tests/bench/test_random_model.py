"""bench.random_model: a random-weight HF folder of a named shape that our loader reads back."""

import jax
import numpy as np

from bench.random_model import write_random_model
from models import load_params
from models.presets import shipped_gguf_path
from models.shapes import model_shapes
from models.transformer import init_params


def test_the_folder_loads_back_as_the_shape_with_init_params_weights(tmp_path):
    out = tmp_path / "random"
    summary = write_random_model("tiny", out, seed=7)
    assert (out / "config.json").exists() and (out / "tokenizer.json").exists()
    cfg, params, tok = load_params(str(out))
    expected_cfg = model_shapes("tiny")
    assert (cfg.hidden_size, cfg.num_layers, cfg.vocab_size) == (
        expected_cfg.hidden_size, expected_cfg.num_layers, expected_cfg.vocab_size)
    assert summary.num_params == expected_cfg.num_params
    expected = init_params(expected_cfg, jax.random.key(7))
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # the tokenizer is the shipped one's, read back from the folder
    from models.presets import cached_tokenizer
    shipped = cached_tokenizer(str(shipped_gguf_path()))
    assert tok.encode("2 + 2 = 4") == shipped.encode("2 + 2 = 4")
