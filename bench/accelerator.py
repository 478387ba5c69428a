"""Decode throughput and GRPO update time on one accelerator (GPU or TPU chip), with MFU.

A random-initialised model of a shape preset (default Qwen3-0.6B, ``models/shapes/``; no
download), bfloat16 weights and KV cache for decoding and bfloat16 compute for the update
(float32 master weights), on ``jax.devices()[0]``:

* decode: ``models.sampler.generate`` of ``--batch`` rows x ``--new-tokens`` greedy tokens
  after ``--prompt-len``-token prompts (EOS ignored); tokens/s = batch x new tokens / time;
* update: ``rl.grpo.train_step.make_train_step`` (PPO-clip GRPO loss, AdamW) on ``--batch``
  trajectories (``--group`` per prompt) of ``--new-tokens`` response tokens, the response
  logits ``--logits-chunk`` positions at a time; time per update;
* MFU = derived FLOPs (``rl.plan``'s formulas: 2 M per token + attention + the output layer;
  the update 3 forwards plus recomputation) / time / the chip's peak bf16 dense FLOP/s
  (``PEAK_BF16``, vendor data sheets; unknown chips print no MFU);
* decode HBM bandwidth implied = the bytes a decode step must read (every bfloat16 weight
  matrix, the output layer included, plus the whole KV cache of prompt + new tokens slots) x
  new tokens / the whole generation's time (prefill included: a lower bound), against the
  chip's HBM bandwidth (``PEAK_HBM``, data sheets).

    python -m bench.accelerator [--shapes qwen3_0_6b] [--batch 64] [--prompt-len 128]
                                [--new-tokens 128] [--group 8] [--repeats 3]
                                [--logits-chunk 128] [--tokenizer PATH] [--json PATH]

Compilation is excluded (one warm-up call each); each figure is the best of ``--repeats``.
Made for a lent GPU in under 5 minutes (``pip install -e '.[cuda12]'``); on a CPU it runs
too (``--shapes tiny``), slowly, and prints no MFU.
"""

from __future__ import annotations

import argparse
import json
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


#: HBM bandwidth per device, bytes/s (the same sources: H200 4.8 TB/s, H100 SXM 3.35, A100
#: 80GB SXM 2.04, L4 0.3; TPU v5e 0.82, v5p 2.77, v6e 1.64, v4 1.2).
PEAK_HBM: dict[str, float] = {
    "H200": 4.8e12, "H100": 3.35e12, "A100": 2.04e12, "L4": 0.3e12,
    "TPU v5 lite": 0.819e12, "TPU v5e": 0.819e12, "TPU v5p": 2.765e12, "TPU v6": 1.64e12,
    "TPU v4": 1.2e12,
}


def _by_kind(table: dict[str, float], device_kind: str) -> float | None:
    return next((v for k, v in table.items() if k.lower() in device_kind.lower()), None)


def peak_flops(device_kind: str) -> float | None:
    return _by_kind(PEAK_BF16, device_kind)


def peak_hbm(device_kind: str) -> float | None:
    return _by_kind(PEAK_HBM, device_kind)


def decode_step_bytes(cfg: Any, rows: int, slots: int, kv_itemsize: int = 2) -> int:
    """Bytes one decode step reads from memory at least: the bfloat16 weight matrices (an
    untied model's input embedding is only gathered, B rows) and every row's KV cache."""
    gathered = 0 if cfg.tie_embeddings else cfg.vocab_size * cfg.hidden_size
    cache = rows * slots * cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * kv_itemsize
    return (cfg.num_params - gathered) * 2 + cache


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
    from models.presets import cached_tokenizer, shipped_gguf_path
    from models.sampler import SamplingParams, decode_params, generate
    from rl.plan import Layout, decode_flops, prefill_flops

    # only the tokenizer's pad id is used: the shipped GGUF's, or --tokenizer's
    tok = cached_tokenizer(str(args.tokenizer or shipped_gguf_path()))
    weights = decode_params(params, "bfloat16")
    rng = np.random.default_rng(0)
    prompts = [rng.integers(100, min(cfg.vocab_size, 40000), args.prompt_len).tolist()
               for _ in range(args.batch)]
    sampling = SamplingParams(args.new_tokens, temperature=0.0, ignore_eos=True,
                              kv_cache_dtype="bfloat16", decode_text=False)

    def run() -> None:
        generate(cfg, weights, tok, prompts, sampling)  # tokens on the host

    lay = Layout(prompts=args.batch, rows=args.batch, groups=args.batch, size=1,
                 prompt=args.prompt_len, response=args.new_tokens, mini_batches=1)
    return best_time(run, args.repeats), prefill_flops(cfg, lay) + decode_flops(cfg, lay)


def update_figures(cfg: Any, params: Any, args: argparse.Namespace) -> tuple[float, float]:
    """(seconds, FLOPs) of one optimizer update on the batch."""
    import jax
    import jax.numpy as jnp

    from rl.grpo.optim import OptimConfig, make_optimizer
    from rl.grpo.train_step import LossConfig, init_train_state, make_train_step
    from rl.plan import update_flops

    n, g, p, r = args.batch // args.group, args.group, args.prompt_len, args.new_tokens
    rng = np.random.default_rng(1)
    ids = lambda *shape: jnp.asarray(rng.integers(100, 40000, shape), jnp.int32)  # noqa: E731
    batch = {"prefix": ids(n, p), "prefix_mask": jnp.ones((n, p), bool),
             "tokens": ids(n, g, r), "attn_mask": jnp.ones((n, g, r), bool),
             "loss_mask": jnp.ones((n, g, r), bool),
             "advantages": jnp.asarray(rng.normal(size=(n, g)), jnp.float32)}
    lc = LossConfig(compute_dtype="bfloat16", remat=True, loss_agg="token-mean",
                    logits_chunk=args.logits_chunk)
    optimizer = make_optimizer(OptimConfig())
    step = make_train_step(cfg, lc, optimizer, donate=True)
    state = [init_train_state(params, optimizer)]

    def run() -> None:
        state[0], metrics = step(state[0], batch)
        jax.block_until_ready(metrics)

    return best_time(run, args.repeats), update_flops(cfg, n, g, p, r, remat=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="qwen3_0_6b")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--logits-chunk", type=int, default=128,
                    help="the update scores this many response positions at a time (0: all)")
    ap.add_argument("--tokenizer", default=None,
                    help="HF folder or GGUF whose pad id the prompts use (default: shipped)")
    ap.add_argument("--json", default=None, help="append the figures as one JSON line here")
    args = ap.parse_args(argv)
    if args.batch % args.group:
        ap.error(f"--batch {args.batch} is not a multiple of --group {args.group}")

    import jax

    from models.shapes import model_shapes
    from models.transformer import init_params

    cfg = model_shapes(args.shapes)
    device = jax.devices()[0]
    peak, hbm = peak_flops(device.device_kind), peak_hbm(device.device_kind)
    params = init_params(cfg, jax.random.key(0))
    print(f"bench.accelerator: {args.shapes} on {device.platform} ({device.device_kind}), "
          + (f"peak bf16 {peak / 1e12:.0f} TFLOP/s" if peak else "peak unknown (no MFU)")
          + (f", HBM {hbm / 1e12:.2f} TB/s" if hbm else ""))
    print(f"  batch {args.batch}, prompt {args.prompt_len}, new tokens {args.new_tokens}, "
          f"update groups of {args.group}, best of {args.repeats}")
    row: dict[str, Any] = {"shapes": args.shapes, "device": device.device_kind,
                           "batch": args.batch, "prompt": args.prompt_len,
                           "new_tokens": args.new_tokens, "group": args.group}
    tokens = args.batch * args.new_tokens
    for name, figures in (("decode", decode_figures), ("update", update_figures)):
        try:
            seconds, flops = figures(cfg, params, args)
        except Exception as e:  # e.g. out of memory at a large batch: the other still runs
            print(f"  {name:7s} failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
            row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            continue
        mfu = f"{flops / seconds / peak:6.1%}" if peak else "   n/a"
        unit = "tok/s" if name == "decode" else "trained tok/s"
        print(f"  {name:7s} {seconds * 1e3:9.1f} ms  {tokens / seconds:10.0f} {unit}  "
              f"{flops / seconds / 1e12:7.2f} TFLOP/s  MFU {mfu}")
        row |= {f"{name}_s": seconds, f"{name}_tflops": flops / seconds / 1e12,
                f"{name}_mfu": flops / seconds / peak if peak else None}
        if name == "decode":
            step = decode_step_bytes(cfg, args.batch, args.prompt_len + args.new_tokens)
            bandwidth = step * args.new_tokens / seconds
            of_peak = f" = {bandwidth / hbm:.1%} of HBM" if hbm else ""
            print(f"  {'':7s} {step / 1e9:.2f} GB read per step: >= {bandwidth / 1e12:.2f} "
                  f"TB/s{of_peak}")
            row |= {"decode_tok_s": tokens / seconds, "decode_step_gb": step / 1e9,
                    "decode_tb_s": bandwidth / 1e12}
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(row) + "\n")
    return row


if __name__ == "__main__":
    main()
