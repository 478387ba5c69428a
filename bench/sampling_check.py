"""Does the sampler draw from softmax(logits)? Its drawn distribution on this backend, exactly.

    python -m bench.sampling_check [--vocab 32768] [--grid-bits 23] [--chunk 8192] [--seed 0]

``models.sampler.inverse_cdf`` maps a uniform u to a token; the sampler feeds it one uniform
per row. Here u runs over the stratified grid u_k = (2k + 1) / 2^(bits + 1), k < 2^bits (each
u exact in float32), for one row of LLM-like logits (normal(0, 2.5), a few tokens 8 higher,
a few impossible), so token i's share of the grid is the probability the sampler gives it, to
within one grid step 2^-bits: a sample with no sampling noise. It is compared with the
float64 softmax of the same float32 logits, at the precision the sampler uses (HIGHEST) and
at the backend's DEFAULT (one bfloat16 pass on TPU, TF32 on recent NVIDIA GPUs, float32 on
CPU). Printed per precision:

* ``max error``: the largest |drawn - softmax| over tokens, in grid steps (exact arithmetic: < 1);
* ``tokens off``: how many tokens are off by more than 2 grid steps;
* ``max rel. error (p >= 1e-4)``: the largest relative error among likely tokens;
* ``impossible drawn``: grid points that drew a token of probability 0 (must be 0).
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from models.sampler import inverse_cdf

PRECISIONS = ("HIGHEST", "DEFAULT")


def test_logits(vocab: int, seed: int = 0) -> np.ndarray:
    """One float32 row of LLM-like logits: normal(0, 2.5), 8 likely tokens (+8), 4 impossible."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 2.5, vocab)
    logits[rng.choice(vocab, 8, replace=False)] += 8.0
    logits[rng.choice(vocab, 4, replace=False)] = -np.inf
    return logits.astype(np.float32)


@functools.partial(jax.jit, static_argnames=("bits", "chunk", "precision"))
def grid_counts(logits: jax.Array, bits: int, chunk: int, precision: str) -> jax.Array:
    """How many grid points u_k each token gets from ``inverse_cdf`` (a [V] int32 array)."""
    v, n = logits.shape[0], 1 << bits
    rows = jnp.broadcast_to(logits, (chunk, v))

    def add(counts: jax.Array, start: jax.Array) -> tuple[jax.Array, None]:
        k = start + jnp.arange(chunk, dtype=jnp.int32)
        u = ((2 * k + 1).astype(jnp.float32) / (2.0 * n))[:, None]
        tokens = inverse_cdf(rows, u, precision=jax.lax.Precision[precision])
        return counts + jnp.bincount(tokens, length=v), None

    counts, _ = jax.lax.scan(add, jnp.zeros(v, jnp.int32), jnp.arange(0, n, chunk))
    return counts


def compare(counts: np.ndarray, logits: np.ndarray, bits: int) -> dict[str, float]:
    """The figures of the module docstring, from grid counts and the logits."""
    x = logits.astype(np.float64)
    p = np.exp(x - x[np.isfinite(x)].max())
    p /= p.sum()
    drawn = counts / float(1 << bits)
    steps = np.abs(drawn - p) * (1 << bits)
    likely = p >= 1e-4
    return {"max_error_steps": float(steps.max()), "tokens_off": int((steps > 2).sum()),
            "max_rel_error_likely": float(np.max(np.abs(drawn - p)[likely] / p[likely])),
            "impossible_drawn": int(counts[p == 0].sum())}


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--grid-bits", type=int, default=23, help="2^bits grid points (<= 23)")
    ap.add_argument("--chunk", type=int, default=8192, help="grid points per program step")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if not 1 <= args.grid_bits <= 23:
        ap.error("--grid-bits must be 1..23 (each u_k must be exact in float32)")
    if (1 << args.grid_bits) % args.chunk:
        ap.error(f"--chunk {args.chunk} must divide 2^{args.grid_bits}")

    device = jax.devices()[0]
    logits = test_logits(args.vocab, args.seed)
    print(f"bench.sampling_check: {device.platform} ({device.device_kind}), vocabulary "
          f"{args.vocab}, 2^{args.grid_bits} grid points (one step = "
          f"{2.0 ** -args.grid_bits:.2e})")
    out = {}
    for precision in PRECISIONS:
        t0 = time.perf_counter()
        counts = np.asarray(grid_counts(jnp.asarray(logits), args.grid_bits, args.chunk,
                                        precision))
        out[precision] = figures = compare(counts, logits, args.grid_bits)
        print(f"  {precision:7s} max error {figures['max_error_steps']:10.1f} steps  tokens off "
              f"{figures['tokens_off']:6d}  max rel. error (p >= 1e-4) "
              f"{figures['max_rel_error_likely']:.2e}  impossible drawn "
              f"{figures['impossible_drawn']}  ({time.perf_counter() - t0:.1f} s)")
    return out


if __name__ == "__main__":
    main()
