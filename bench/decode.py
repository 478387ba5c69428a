"""Prefill and decode throughput of the shipped model: our jitted KV-cache sampler vs HF
transformers ``generate`` (PyTorch CPU), same model, batch and lengths, in one run.

    python -m bench.decode [--batches 8 32] [--prompt-len 64] [--new-tokens 64]

Prefill tok/s = batch*prompt_len / time(generate 1 token); decode tok/s = batch*(N-1) /
(time(N tokens) - time(1 token)). Greedy, EOS ignored, best of --repeats timed runs after a
warm-up (compilation excluded for JAX; PyTorch has no compile step).
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def _best(fn, repeats: int) -> float:
    fn()  # warm-up / compile
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def bench_ours(batch: int, prompt_len: int, new: int, repeats: int) -> tuple[float, float]:
    from models import load_params
    from models.sampler import SamplingParams, generate

    cfg, params, tok = load_params("smollm2_135m")
    rng = np.random.default_rng(0)
    prompts = [rng.integers(100, 40000, prompt_len).tolist() for _ in range(batch)]

    def run(n):
        return lambda: generate(cfg, params, tok, prompts, SamplingParams(n, temperature=0),
                                eos_ids=[], decode_text=False)

    t1, tn = _best(run(1), repeats), _best(run(new), repeats)
    return batch * prompt_len / t1, batch * (new - 1) / (tn - t1)


def bench_hf(batch: int, prompt_len: int, new: int, repeats: int) -> tuple[float, float]:
    import torch
    import transformers

    from models.presets import shipped_gguf_path

    path = shipped_gguf_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, torch_dtype=torch.float32).eval()
    rng = np.random.default_rng(0)
    ids = torch.tensor(rng.integers(100, 40000, (batch, prompt_len)))

    def run(n):
        def go():
            with torch.no_grad():
                model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                               min_new_tokens=n, do_sample=False, pad_token_id=0)
        return go

    t1, tn = _best(run(1), repeats), _best(run(new), repeats)
    return batch * prompt_len / t1, batch * (new - 1) / (tn - t1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    print(f"SmolLM2-135M f32 CPU, prompt {a.prompt_len} tokens, {a.new_tokens} new tokens, greedy")
    print(f"{'batch':>5} | {'prefill ours':>12} {'prefill HF':>10} {'ratio':>6} | "
          f"{'decode ours':>11} {'decode HF':>9} {'ratio':>6}   (tokens/s)")
    for b in a.batches:
        po, do = bench_ours(b, a.prompt_len, a.new_tokens, a.repeats)
        ph, dh = bench_hf(b, a.prompt_len, a.new_tokens, a.repeats)
        print(f"{b:>5} | {po:>12.0f} {ph:>10.0f} {po / ph:>6.2f} | {do:>11.0f} {dh:>9.0f} "
              f"{do / dh:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
