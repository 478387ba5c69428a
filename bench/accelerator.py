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
* a decode step's time = (the generation - a generation of one token) / (new tokens - 1),
  against the bytes it must read: every bfloat16 weight matrix, the output layer included,
  and the rows' KV cache by the slots each row holds at that step (averaged over the
  steps), and the cache the sampler reads (the first of its cache extents that holds them,
  ``models.transformer.decode_extents``; with ``--decode-kernel pallas_gpu`` each row's own
  slots); implied HBM bandwidth = those bytes / the step's time, against the chip's
  (``PEAK_HBM``, data sheets).

    python -m bench.accelerator [--shapes qwen3_0_6b] [--batch 64] [--prompt-len 128]
                                [--new-tokens 128] [--group 8] [--repeats 3]
                                [--logits-chunk 128] [--tokenizer PATH] [--json PATH]
                                [--parts decode update] [--decode-kernel xla|pallas_gpu]

Compilation is excluded (one warm-up call each); each figure is the best of ``--repeats``.
Made for a lent GPU in under 5 minutes (``pip install -e '.[cuda12]'``); on a CPU it runs
too (``--shapes tiny``), slowly, and prints no MFU.
"""

from __future__ import annotations

import argparse
import json
import os
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


def decode_step_bytes(cfg: Any, rows: int, slots: float, kv_itemsize: int = 2) -> float:
    """Bytes one decode step reads from memory at least: the bfloat16 weight matrices (an
    untied model's input embedding is only gathered, B rows) and `slots` KV cache slots of
    every row."""
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


def decode_figures(cfg: Any, params: Any, args: argparse.Namespace) -> tuple[float, float, float]:
    """(seconds, FLOPs) of one greedy generation of the whole batch, and the seconds of one
    decode step: (the generation - one of a single token) / (new tokens - 1)."""
    from models.presets import cached_tokenizer, shipped_gguf_path
    from models.sampler import SamplingParams, decode_params, generate
    from rl.plan import Layout, decode_flops, prefill_flops

    # only the tokenizer's pad id is used: the shipped GGUF's, or --tokenizer's
    tok = cached_tokenizer(str(args.tokenizer or shipped_gguf_path()))
    weights = decode_params(params, "bfloat16")
    rng = np.random.default_rng(0)
    group = args.group if args.shared_prompts else 1  # rows a prompt
    prompts = [rng.integers(100, min(cfg.vocab_size, 40000), args.prompt_len).tolist()
               for _ in range(args.batch // group) for _ in range(group)]

    def run(new: int) -> Any:
        sampling = SamplingParams(new, temperature=0.0, ignore_eos=True,
                                  kv_cache_dtype="bfloat16", decode_text=False,
                                  decode_kernel=args.decode_kernel,
                                  shared_prompts=args.shared_prompts)
        return lambda: generate(cfg, weights, tok, prompts, sampling)  # tokens on the host

    lay = Layout(prompts=args.batch, rows=args.batch, groups=args.batch, size=1,
                 prompt=args.prompt_len, response=args.new_tokens, mini_batches=1)
    whole = best_time(run(args.new_tokens), args.repeats)
    first = best_time(run(1), args.repeats)
    step = (whole - first) / max(args.new_tokens - 1, 1)
    return whole, prefill_flops(cfg, lay) + decode_flops(cfg, lay), step


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


def decode_step_lines(cfg: Any, args: argparse.Namespace, step_s: float,
                      hbm: float | None) -> dict[str, float]:
    """Print one decode step's time against the bytes it must read (the weights and the
    rows' KV cache: by the slots they hold, and by those the sampler reads; with shared
    prompts a group's prompt counts once, a G-th of it a row, in what the step must read,
    and in what the sampler reads; on a paged cache the prompt's full pages) and give the
    figures for the JSON line."""
    import jax

    from models.padding import round_up
    from models.paged_cache import PAGE_SLOTS, is_paged
    from models.sampler import SamplingParams, cache_length
    from models.transformer import cache_slots_read

    sampling = SamplingParams(args.new_tokens)
    width = round_up(args.prompt_len, sampling.prompt_bucket)
    capacity, prompt, first = cache_length(width, sampling), args.prompt_len, width
    apart = args.shared_prompts and not is_paged(args.decode_kernel)
    if apart:  # the rows' cache holds what they generate; their prompts apart
        capacity, prompt, first = capacity - width, 0, 0
    held, read = cache_slots_read(prompt, first, args.new_tokens, capacity, args.decode_kernel,
                                  jax.default_backend())
    if apart:  # a group's prompt read once: a G-th of it a row
        held, read = held + args.prompt_len / args.group, read + width / args.group
    elif args.shared_prompts:  # a prompt's full pages held and read once a group
        once = args.prompt_len // PAGE_SLOTS * PAGE_SLOTS * (1 - 1 / args.group)
        held, read = held - once, read - once
    weights = decode_step_bytes(cfg, args.batch, 0)
    floor, as_read = decode_step_bytes(cfg, args.batch, held), decode_step_bytes(cfg, args.batch,
                                                                                read)
    print(f"  {'':7s} a step {step_s * 1e3:.3f} ms (the generation less its first token, per "
          f"token); it must read {floor / 1e9:.3f} GB: weights {weights / 1e9:.3f}, KV cache "
          f"{(floor - weights) / 1e9:.3f} (mean {held:.0f} slots a row; the sampler reads "
          f"{read:.0f} of {capacity}: {as_read / 1e9:.3f} GB)")
    bandwidth = floor / step_s
    of_peak = f" = {bandwidth / hbm:.1%} of HBM" if hbm else ""
    print(f"  {'':7s} >= {bandwidth / 1e12:.3f} TB/s{of_peak}; reading it at the HBM's "
          f"bandwidth: {floor / hbm * 1e3:.3f} ms" if hbm else
          f"  {'':7s} >= {bandwidth / 1e12:.3f} TB/s")
    return {"decode_step_ms": step_s * 1e3, "decode_step_gb": floor / 1e9,
            "decode_step_read_gb": as_read / 1e9, "decode_tb_s": bandwidth / 1e12}


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
    ap.add_argument("--parts", nargs="+", choices=("decode", "update"),
                    default=["decode", "update"], help="what to time")
    from models.decode_attention import DECODE_KERNELS

    ap.add_argument("--decode-kernel", choices=DECODE_KERNELS, default="xla",
                    help="the decode step's cache attention (SamplingParams.decode_kernel)")
    ap.add_argument("--shared-prompts", action="store_true",
                    help="the decode's prompts in groups of --group rows, each group reading "
                         "one copy of its prompt's cache (SamplingParams.shared_prompts)")
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
          f"update groups of {args.group}, best of {args.repeats}, decode kernel "
          f"{args.decode_kernel}"
          + (f", decode prompts shared by groups of {args.group}" if args.shared_prompts
             else ""))
    row: dict[str, Any] = {"shapes": args.shapes, "device": device.device_kind,
                           "batch": args.batch, "prompt": args.prompt_len,
                           "new_tokens": args.new_tokens, "group": args.group,
                           "decode_kernel": args.decode_kernel,
                           "shared_prompts": args.shared_prompts,
                           "xla_flags": os.environ.get("XLA_FLAGS", "")}
    tokens = args.batch * args.new_tokens
    parts = {"decode": decode_figures, "update": update_figures}
    for name, figures in ((name, parts[name]) for name in args.parts):
        try:
            seconds, flops, *step_s = figures(cfg, params, args)
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
            row |= {"decode_tok_s": tokens / seconds} | decode_step_lines(
                cfg, args, step_s[0], hbm)
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(row) + "\n")
    return row


if __name__ == "__main__":
    main()
