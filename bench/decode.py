"""Prefill and decode throughput of the shipped model: our jitted KV-cache sampler vs HF
transformers ``generate`` (PyTorch CPU), same model, batch and lengths, in one run.

    python -m bench.decode [--batches 8 32] [--prompt-len 64] [--new-tokens 64]

Prefill tok/s = batch*prompt_len / time(generate 1 token); decode tok/s = batch*(N-1) /
(time(N tokens) - time(1 token)). Greedy, EOS ignored. After one warm-up call each
(compilation excluded for JAX; PyTorch has no compile step), the four calls (ours and HF, 1 and
N tokens) run in turn for --repeats rounds and each keeps its best time. Ours uses the
sampler's per-layer weights (`decode_params`, made once, as the RL policy does).
"""

from __future__ import annotations

import argparse

import numpy as np

from bench.timing import alternating_times


def ours(batch: int, prompt_len: int, new: int, dtype: str) -> dict:
    from models import load_params
    from models.sampler import SamplingParams, decode_params, generate

    cfg, params, tok = load_params("smollm2_135m")
    weights = decode_params(params, dtype)  # made once (as the RL policy does)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(100, 40000, prompt_len).tolist() for _ in range(batch)]

    def run(n):
        sampling = SamplingParams(n, temperature=0, ignore_eos=True, decode_text=False)
        return lambda: generate(cfg, weights, tok, prompts, sampling)

    return {"ours_1": run(1), "ours_n": run(new)}


def hf(batch: int, prompt_len: int, new: int, dtype: str) -> dict:
    import torch
    import transformers

    from models.presets import shipped_gguf_path

    path = shipped_gguf_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=getattr(torch, dtype)).eval()
    rng = np.random.default_rng(0)
    ids = torch.tensor(rng.integers(100, 40000, (batch, prompt_len)))

    def run(n):
        def go():
            with torch.no_grad():
                model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                               min_new_tokens=n, do_sample=False, pad_token_id=0)
        return go

    return {"hf_1": run(1), "hf_n": run(new)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="weights for both: ours bfloat16 matmuls with float32 accumulation, "
                         "residual stream and KV cache (decode_params); HF's model in "
                         "torch.bfloat16")
    a = ap.parse_args()
    print(f"SmolLM2-135M {a.dtype} CPU, prompt {a.prompt_len} tokens, {a.new_tokens} new "
          "tokens, greedy")
    print(f"{'batch':>5} | {'prefill ours':>12} {'prefill HF':>10} {'ratio':>6} | "
          f"{'decode ours':>11} {'decode HF':>9} {'ratio':>6}   (tokens/s)")
    for b in a.batches:
        runs = (ours(b, a.prompt_len, a.new_tokens, a.dtype)
                | hf(b, a.prompt_len, a.new_tokens, a.dtype))
        t = {name: min(ts) for name, ts in alternating_times(runs, a.repeats).items()}
        po, ph = b * a.prompt_len / t["ours_1"], b * a.prompt_len / t["hf_1"]
        do = b * (a.new_tokens - 1) / (t["ours_n"] - t["ours_1"])
        dh = b * (a.new_tokens - 1) / (t["hf_n"] - t["hf_1"])
        print(f"{b:>5} | {po:>12.0f} {ph:>10.0f} {po / ph:>6.2f} | {do:>11.0f} {dh:>9.0f} "
              f"{do / dh:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
