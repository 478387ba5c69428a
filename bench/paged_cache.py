"""A decode step's time on the dense KV cache against the paged one
(``SamplingParams.decode_kernel``, ``models.paged_cache``), the shipped model by default
(``--model``), prompts of uneven lengths (a quarter, a half, three quarters and all of
``--prompt-len``, in turn).

    python -m bench.paged_cache [--batch 32] [--prompt-len 200] [--new 200]
                                [--kernel paged_xla] [--model smollm2_135m] [--group G]

``--group G``: the rows come in groups of G continuing one prompt, and both caches share
it (``SamplingParams.shared_prompts``: the dense cache's prompt once a group, the paged
cache's full prompt pages; each read once a group by the reference).

Per step = (time(N tokens) - time(1 token)) / (N - 1), greedy, EOS ignored, after one
warm-up call each (compilation); the four calls alternate for --repeats rounds
(``bench.timing``) and each keeps its best. Also prints the slots a row holds on average
(the paged kernels read those) against those the dense cache's decode reads (the prefix its
longest row needs, ``models.transformer.cache_slots_read``; the paged reference likewise, by
pages), and whether the greedy tokens agree. Off their platform the Pallas kernels run in
their interpreter: time them on their own chip (``bench/gpu_check.sh``), not here.
"""

from __future__ import annotations

import argparse

import numpy as np

from bench.timing import alternating_times, cpu_name


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=200)
    ap.add_argument("--new", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kernel", default="paged_xla",
                    choices=["paged_xla", "paged_tpu", "paged_gpu"])
    ap.add_argument("--model", default="smollm2_135m",
                    help="a model load_params knows (tiny: a random one, for a quick check)")
    ap.add_argument("--group", type=int, default=1,
                    help="rows a prompt, sharing it (shared_prompts); 1: each its own")
    a = ap.parse_args(argv)

    import jax

    from models import load_params
    from models.padding import round_up
    from models.sampler import SamplingParams, cache_length, decode_params, generate
    from models.transformer import cache_slots_read

    cfg, params, tok = load_params(a.model)
    weights = decode_params(params)
    rng = np.random.default_rng(0)
    lengths = [max(1, a.prompt_len * (1 + i // a.group % 4) // 4) for i in range(a.batch)]
    distinct = [rng.integers(100, min(cfg.vocab_size, 40000), n).tolist()
                for n in lengths[::a.group]]
    prompts = [p for p in distinct for _ in range(a.group)]

    def run(n: int, kernel: str):
        sampling = SamplingParams(n, temperature=0, ignore_eos=True, decode_text=False,
                                  decode_kernel=kernel, shared_prompts=a.group > 1)
        return lambda: generate(cfg, weights, tok, prompts, sampling)

    runs = {f"{kernel}_{n}": run(n, kernel) for kernel in ("xla", a.kernel) for n in (1, a.new)}
    best = {name: min(ts) for name, ts in alternating_times(runs, a.repeats).items()}
    same = (runs[f"xla_{a.new}"]().tokens == runs[f"{a.kernel}_{a.new}"]().tokens).all()
    sampling = SamplingParams(a.new)
    width = round_up(a.prompt_len, sampling.prompt_bucket)
    capacity = cache_length(width, sampling)
    held = float(np.mean(lengths)) + (a.new + 1) / 2  # a row's slots, averaged over the steps
    platform = jax.default_backend()
    _, read = cache_slots_read(a.prompt_len, width, a.new, capacity, "xla", platform)
    # the reference reads the pages its longest row needs (rows from slot 0, no padding)
    paged_read = (cache_slots_read(a.prompt_len, a.prompt_len, a.new, capacity, "xla",
                                   platform)[1] if a.kernel == "paged_xla" else held)
    groups = f" in groups of {a.group} sharing it" if a.group > 1 else ""
    print(f"{a.model} float32 on {jax.default_backend()} ({cpu_name()}): batch {a.batch}, "
          f"prompts of {min(lengths)}-{max(lengths)} tokens{groups}, {a.new} new, greedy; "
          f"greedy tokens {'equal' if same else 'DIFFER'}")
    print(f"{'cache':>9} | {'ms/step':>8} | slots a row reads a step (avg)")
    for kernel, slots, how in (
            ("xla", read, "the prefix its longest row needs"),
            (a.kernel, paged_read, "the pages its longest row needs" if a.kernel == "paged_xla"
             else "its own")):
        step = (best[f"{kernel}_{a.new}"] - best[f"{kernel}_1"]) / (a.new - 1) * 1e3
        print(f"{kernel:>9} | {step:>8.1f} | {slots:.0f} ({how})", flush=True)
    if a.group > 1:
        print("(slots counted as if unshared: each cache reads a group's prompt once)")


if __name__ == "__main__":
    main()
