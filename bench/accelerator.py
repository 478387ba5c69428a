"""Decode throughput and GRPO update time on one accelerator (GPU or TPU chip), with MFU.

A random-initialised model of a shape preset (default Qwen3-0.6B, ``models/shapes/``; no
download), bfloat16 weights for decoding and bfloat16 compute for the update (float32 master
weights), on ``jax.devices()[0]``:

* decode: ``models.sampler.generate`` of ``--batch`` rows x ``--new-tokens`` greedy tokens
  after ``--prompt-len``-token prompts (EOS ignored); tokens/s = batch x new tokens / time;
* update: ``rl.train_step.make_train_step`` (PPO-clip GRPO loss, AdamW) on ``--batch``
  trajectories (``--group`` per prompt) of ``--new-tokens`` response tokens; time per update;
* MFU = derived FLOPs (``rl.plan``'s formulas: 2 M per token + attention + the output layer;
  the update 3 forwards plus recomputation) / time / the chip's peak bf16 dense FLOP/s
  (``PEAK_BF16``, vendor data sheets; unknown chips print no MFU).

    python -m bench.accelerator [--shapes qwen3_0_6b] [--batch 64] [--prompt-len 128]
                                [--new-tokens 128] [--group 8] [--repeats 3]

Compilation is excluded (one warm-up call each); each figure is the best of ``--repeats``.
Made for a lent GPU in under 5 minutes (``pip install -e '.[cuda12]'``); on a CPU it runs
too (``--shapes tiny``), slowly, and prints no MFU.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

#: Peak dense bfloat16 FLOP/s per device, by a substring of ``device_kind`` (vendor data
#: sheets: NVIDIA H100/H200 SXM 989 TFLOP/s, A100 312, L4 121; Google Cloud TPU docs).
PEAK_BF16: dict[str, float] = {
    "H200": 989e12, "H100": 989e12, "A100": 312e12, "L4": 121e12,
    "TPU v5 lite": 197e12, "TPU v5e": 197e12, "TPU v5p": 459e12, "TPU v6": 918e12,
    "TPU v4": 275e12,
}


def peak_flops(device_kind: str) -> float | None:
    return next((v for k, v in PEAK_BF16.items() if k.lower() in device_kind.lower()), None)


def best_time(fn: Any, repeats: int) -> float:
    fn()  # compile
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def decode_figures(cfg: Any, params: Any, args: argparse.Namespace) -> tuple[float, float]:
    """(seconds, FLOPs) of one greedy generation of the whole batch."""
    from models import load_params
    from models.sampler import SamplingParams, decode_params, generate
    from rl.plan import Layout, decode_flops, prefill_flops

    tok = load_params("tiny")[2]  # the shipped tokenizer: only its pad id is used
    weights = decode_params(params, "bfloat16")
    rng = np.random.default_rng(0)
    prompts = [rng.integers(100, min(cfg.vocab_size, 40000), args.prompt_len).tolist()
               for _ in range(args.batch)]
    sampling = SamplingParams(args.new_tokens, temperature=0.0, ignore_eos=True)

    def run() -> None:
        generate(cfg, weights, tok, prompts, sampling, decode_text=False)  # tokens on the host

    lay = Layout(prompts=args.batch, rows=args.batch, groups=args.batch, size=1,
                 prompt=args.prompt_len, response=args.new_tokens, mini_batches=1)
    return best_time(run, args.repeats), prefill_flops(cfg, lay) + decode_flops(cfg, lay)


def update_figures(cfg: Any, params: Any, args: argparse.Namespace) -> tuple[float, float]:
    """(seconds, FLOPs) of one optimizer update on the batch."""
    import jax
    import jax.numpy as jnp

    from rl.optim import OptimConfig, make_optimizer
    from rl.plan import update_flops
    from rl.train_step import LossConfig, init_train_state, make_train_step

    n, g, p, r = args.batch // args.group, args.group, args.prompt_len, args.new_tokens
    rng = np.random.default_rng(1)
    ids = lambda *shape: jnp.asarray(rng.integers(100, 40000, shape), jnp.int32)  # noqa: E731
    batch = {"prefix": ids(n, p), "prefix_mask": jnp.ones((n, p), bool),
             "tokens": ids(n, g, r), "attn_mask": jnp.ones((n, g, r), bool),
             "loss_mask": jnp.ones((n, g, r), bool),
             "advantages": jnp.asarray(rng.normal(size=(n, g)), jnp.float32)}
    lc = LossConfig(compute_dtype="bfloat16", remat=True, loss_agg="token-mean")
    optimizer = make_optimizer(OptimConfig())
    step = make_train_step(cfg, lc, optimizer, donate=True)
    state = [init_train_state(params, optimizer)]

    def run() -> None:
        state[0], metrics = step(state[0], batch)
        jax.block_until_ready(metrics)

    return best_time(run, args.repeats), update_flops(cfg, n, g, p, r, remat=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="qwen3_0_6b")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    if args.batch % args.group:
        ap.error(f"--batch {args.batch} is not a multiple of --group {args.group}")

    import jax

    from models.shapes import model_shapes
    from models.transformer import init_params

    cfg = model_shapes(args.shapes)
    device = jax.devices()[0]
    peak = peak_flops(device.device_kind)
    params = init_params(cfg, jax.random.key(0))
    print(f"bench.accelerator: {args.shapes} on {device.platform} ({device.device_kind}), "
          f"peak bf16 {peak / 1e12:.0f} TFLOP/s" if peak else
          f"bench.accelerator: {args.shapes} on {device.platform} ({device.device_kind}), "
          "peak unknown (no MFU)")
    print(f"  batch {args.batch}, prompt {args.prompt_len}, new tokens {args.new_tokens}, "
          f"update groups of {args.group}, best of {args.repeats}")
    for name, figures in (("decode", decode_figures), ("update", update_figures)):
        seconds, flops = figures(cfg, params, args)
        mfu = f"{flops / seconds / peak:6.1%}" if peak else "   n/a"
        extra = (f"{args.batch * args.new_tokens / seconds:10.0f} tok/s" if name == "decode"
                 else f"{args.batch * args.new_tokens / seconds:10.0f} trained tok/s")
        print(f"  {name:7s} {seconds * 1e3:9.1f} ms  {extra}  {flops / seconds / 1e12:7.2f} "
              f"TFLOP/s  MFU {mfu}")


if __name__ == "__main__":
    main()
