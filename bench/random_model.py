"""A random-weight model of a named shape, written as a Hugging Face folder: no download.

    python -m bench.random_model --shapes qwen3_0_6b --out /tmp/qwen3_0_6b_random
                                 [--tokenizer PATH] [--seed 0] [--dtype float32]

The folder (config.json, safetensors, tokenizer) loads like any HF checkpoint, so
``python -m rl.train model=hf model.path=<out>`` trains a model of that size with the
real loader, sampler and update, for benchmarks and first runs on a new machine. The weights
are ``models.transformer.init_params`` (normal(0, 0.02) matrices, unit norms); the shape is a
``models.shapes`` preset or a ``config.json``. The tokenizer comes from ``--tokenizer`` (an
HF folder or a GGUF file; default: the shipped SmolLM2 GGUF's), so a shape with a larger
vocabulary (Qwen3's 151,936) keeps its embedding size while prompts use the tokenizer's ids;
ids the tokenizer lacks decode to nothing.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from models.export import ExportOptions, ExportSummary, export_hf


def write_random_model(shapes: str, out: str | Path, tokenizer: str | None = None,
                       seed: int = 0, dtype: str = "float32",
                       force: bool = False) -> ExportSummary:
    """Write the folder (see the module docstring) and return what was written."""
    import jax

    from models.presets import cached_tokenizer, shipped_gguf_path
    from models.shapes import model_shapes
    from models.transformer import init_params

    cfg = model_shapes(shapes)
    tok = cached_tokenizer(str(Path(tokenizer).absolute() if tokenizer else shipped_gguf_path()))
    if tok.vocab_size > cfg.vocab_size:
        raise ValueError(f"--tokenizer {tokenizer}: {tok.vocab_size} tokens, more than the "
                         f"shape {shapes}'s vocabulary of {cfg.vocab_size}")
    params = init_params(cfg, jax.random.key(seed))
    return export_hf(cfg, params, tok, None, out, ExportOptions(dtype=dtype, force=force))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="qwen3_0_6b")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--force", action="store_true", help="replace a non-empty --out folder")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    summary = write_random_model(args.shapes, args.out, args.tokenizer, args.seed, args.dtype,
                                 args.force)
    print(f"bench.random_model: {args.shapes}, {summary.num_params / 1e6:.1f} M parameters "
          f"({summary.dtype}) -> {summary.out_dir} in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
