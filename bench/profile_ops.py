"""Where the time goes, per XLA op: profile one jitted call on the shipped model and print the
ops that took longest, with the JAX operation each came from.

    python -m bench.profile_ops train [--batch 8] [--seq 256] [--top 25]
    python -m bench.profile_ops decode [--batch 16] [--seq 256] [--new 64] [--top 25]

`train`: forward+backward of the token log-prob loss over batch x seq tokens. `decode`: one
`generate` call (prompt of `--seq` tokens, `--new` sampled tokens). The call runs once to
compile, then once under ``jax.profiler.trace`` (a Perfetto trace in a temporary folder); op
durations are summed over calls (``x N``: how many times it ran, e.g. once per layer and step).
Ops that run concurrently on the two threads overlap, so the column can add up to more than the
wall time. `train` also prints each op's output shape and the JAX operation it came from;
`decode` prints op names only (the sampler's jitted functions are internal; run with
``XLA_FLAGS=--xla_dump_to=DIR`` to read their HLO). This is how the decode-loop weight
copies and the slow 3-D weight gradients were found (README, Benchmarks).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import re
import tempfile
import time

import numpy as np


def _op_names(hlo_text: str) -> dict[str, str]:
    """HLO instruction name -> its output shape and the tail of the JAX op_name in its
    metadata (where it came from)."""
    names = {}
    for line in hlo_text.splitlines():
        m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = (\S+) .*?op_name=\"([^\"]+)\"", line)
        if m:
            names[m.group(1)] = f"{m.group(2).split('{')[0]}  ...{m.group(3)[-60:]}"
    return names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["train", "decode"])
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()

    import jax
    import jax.numpy as jnp

    from models import load_params
    from models.sampler import SamplingParams, decode_params, generate
    from models.scoring import token_logprobs

    cfg, params, tok = load_params("smollm2_135m")
    rng = np.random.default_rng(0)
    if a.what == "train":
        b = a.batch or 8
        ids = jnp.asarray(rng.integers(100, 40000, (b, a.seq)), jnp.int32)
        mask = jnp.ones((b, a.seq), bool)
        grad = jax.jit(jax.grad(lambda p: -token_logprobs(cfg, p, ids, mask).mean()))
        compiled = grad.lower(params).compile()  # compiled once: run it and read its HLO
        run = lambda: jax.block_until_ready(compiled(params))  # noqa: E731
        hlo = compiled.as_text() or ""
    else:
        b = a.batch or 16
        dp = decode_params(params)
        prompts = [rng.integers(100, 40000, a.seq).tolist() for _ in range(b)]
        sp = SamplingParams(a.new, temperature=1.0, ignore_eos=True, decode_text=False)
        run = lambda: generate(cfg, dp, tok, prompts, sp)  # noqa: E731
        hlo = ""  # generate's jitted functions are internal; names come from the trace only
    run()
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        with jax.profiler.trace(d, create_perfetto_trace=True):
            run()
        wall = time.perf_counter() - t0
        trace = sorted(glob.glob(f"{d}/**/*perfetto_trace.json.gz", recursive=True))[-1]
        events = json.load(gzip.open(trace))
    events = events["traceEvents"] if isinstance(events, dict) else events
    total: collections.Counter = collections.Counter()
    count: collections.Counter = collections.Counter()
    for e in events:
        name = e.get("name", "")
        if e.get("ph") == "X" and ("fusion" in name or name.startswith(("dot", "copy", "while"))):
            total[name] += e.get("dur", 0)
            count[name] += 1
    origin = _op_names(hlo)
    print(f"{a.what}: batch {b}, seq {a.seq}" + (f", {a.new} new tokens" if a.what == "decode"
                                                  else "") + f"; traced call {wall:.2f} s")
    print(f"{'ms':>9} {'calls':>6}  op (origin)")
    for name, us in total.most_common(a.top):
        print(f"{us / 1000:9.1f} {count[name]:6d}  {name}  {origin.get(name, '')}")


if __name__ == "__main__":
    main()
