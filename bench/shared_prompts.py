"""A decode step's time with each row's own copy of its prompt's KV cache against one copy
per group (``SamplingParams.shared_prompts``, ``models.prompt_sharing``), the shipped model
by default (``--model``), GRPO-shaped rows: each of batch / group prompts repeated
``group`` times in a row.

    python -m bench.shared_prompts [--batch 32] [--group 8] [--prompt-len 200] [--new 200]
                                   [--model smollm2_135m]

Per step = (time(N tokens) - time(1 token)) / (N - 1), greedy, EOS ignored, after one
warm-up call each (compilation); the four calls alternate for --repeats rounds
(``bench.timing``) and each keeps its best. Also prints the bytes of cache a step reads
per layer on average (keys and values, float32), copies against shared, and whether the
greedy tokens agree.
"""

from __future__ import annotations

import argparse

import numpy as np

from bench.timing import alternating_times, cpu_name


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=200)
    ap.add_argument("--new", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default="smollm2_135m",
                    help="a model load_params knows (tiny: a random one, for a quick check)")
    a = ap.parse_args(argv)

    import jax

    from models import load_params
    from models.sampler import SamplingParams, decode_params, generate

    cfg, params, tok = load_params(a.model)
    weights = decode_params(params)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(100, 40000, a.prompt_len).tolist()
               for _ in range(a.batch // a.group)]
    rows = [p for p in prompts for _ in range(a.group)]

    def run(n: int, shared: bool):
        sampling = SamplingParams(n, temperature=0, ignore_eos=True, decode_text=False,
                                  shared_prompts=shared)
        return lambda: generate(cfg, weights, tok, rows, sampling)

    runs = {f"{kind}_{n}": run(n, kind == "shared") for kind in ("copies", "shared")
            for n in (1, a.new)}
    best = {name: min(ts) for name, ts in alternating_times(runs, a.repeats).items()}
    same = (runs[f"copies_{a.new}"]().tokens == runs[f"shared_{a.new}"]().tokens).all()
    kv_bytes = 2 * cfg.num_kv_heads * cfg.head_dim * 4  # a slot's keys and values, float32
    held = a.prompt_len + (a.new + 1) / 2  # a row's slots, averaged over the steps
    print(f"{a.model} float32 on {jax.default_backend()} ({cpu_name()}): batch "
          f"{a.batch} = {a.batch // a.group} prompts x {a.group}, prompt {a.prompt_len} "
          f"tokens, {a.new} new, greedy; greedy tokens {'equal' if same else 'DIFFER'}")
    print(f"{'cache':>7} | {'ms/step':>8} | {'KiB read a layer a step (held slots)':>37}")
    for kind, slots in (("copies", a.batch * held),
                        ("shared", a.batch / a.group * a.prompt_len
                         + a.batch * (a.new + 1) / 2)):
        step = (best[f"{kind}_{a.new}"] - best[f"{kind}_1"]) / (a.new - 1) * 1e3
        print(f"{kind:>7} | {step:>8.1f} | {slots * kv_bytes / 1024:>37.0f}", flush=True)


if __name__ == "__main__":
    main()
