"""What a decode step pays to attend over a prefix of its KV cache, by the step's attention
alone: a loop of steps, each running L layers of one-token attention over a [B,KV,hd,S]
key and [B,KV,S,hd] value cache and writing one slot, as ``models.transformer`` lays them
out on CPU (the shipped model's shapes by default).

    python -m bench.cache_prefix [--prefixes 128 256 384] [--slots 416] [--layers 30]

For each prefix three ways: ``whole`` (every step reads all S slots), ``free`` (a static
slice of the prefix, left for XLA to schedule) and ``tied`` (the slice waits for the layer's
queries: ``models.transformer._once_computed``, what the sampler does). On XLA:CPU a slice is
a copy; left free, a loop's copies all run at the top of its body. The functions alternate
(``bench.timing``); each keeps its best time per step. On CPU the sampler takes no prefix
past half the cache (``models.transformer.decode_extents``): these figures say why.
"""

from __future__ import annotations

import argparse
import os


def attention_loop(batch: int, kv: int, group: int, hd: int, slots: int, layers: int,
                   prefix: int | None, tied: bool, steps: int):
    """A jitted function running `steps` decode steps of attention over `layers` caches."""
    import jax
    import jax.numpy as jnp

    from models.transformer import _once_computed

    def layer(k, v, q):
        if prefix is not None:
            k, v = k[..., :prefix], v[:, :, :prefix]
            if tied:
                k, v = _once_computed((k, v), q.reshape(batch, 1, kv * group, hd))
        p = jax.nn.softmax(jnp.einsum("bkgd,bkds->bkgs", q, k), axis=-1)
        return jnp.einsum("bkgs,bksd->bkgd", p, v)

    def step(i, carry):
        ks, vs, x = carry
        new_k, new_v = [], []
        for k, v in zip(ks, vs):
            out = layer(k, v, jnp.broadcast_to(x[:, None, None, None], (batch, kv, group, hd)))
            zero = 0 * out[:, :, :1, :1]  # the write waits for the read (as the sampler's)
            new_k.append(jax.lax.dynamic_update_slice_in_dim(
                k, jnp.ones((batch, kv, hd, 1)) + zero.swapaxes(2, 3), i, 3))
            new_v.append(jax.lax.dynamic_update_slice_in_dim(
                v, jnp.ones((batch, kv, 1, hd)) + zero, i, 2))
            x = x + 1e-3 * out.mean((1, 2, 3))
        return tuple(new_k), tuple(new_v), x

    first = (prefix or slots) - steps
    run = jax.jit(lambda c: jax.lax.fori_loop(first, first + steps, step, c), donate_argnums=0)
    state = [(tuple(jnp.zeros((batch, kv, hd, slots)) for _ in range(layers)),
              tuple(jnp.zeros((batch, kv, slots, hd)) for _ in range(layers)),
              jnp.zeros((batch,)))]

    def call() -> None:
        state[0] = run(state[0])
        jax.block_until_ready(state[0])

    return call


def main() -> None:
    from bench.timing import alternating_times, cpu_name

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prefixes", type=int, nargs="+", default=[128, 256, 384])
    ap.add_argument("--slots", type=int, default=416)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    shape = dict(batch=args.batch, kv=3, group=3, hd=64, slots=args.slots, layers=args.layers,
                 steps=args.steps)  # SmolLM2-135M: 9 heads over 3 KV heads of 64
    print(f"{cpu_name()}, {os.cpu_count()} cores; batch {args.batch}, {args.layers} "
          f"layers, 3 KV heads x 64, {args.slots} slots; ms per step, best of {args.repeats}")
    fns = {"whole": attention_loop(**shape, prefix=None, tied=False)}
    for p in args.prefixes:
        fns[f"free {p}"] = attention_loop(**shape, prefix=p, tied=False)
        fns[f"tied {p}"] = attention_loop(**shape, prefix=p, tied=True)
    times = alternating_times(fns, args.repeats)
    for name, ts in times.items():
        print(f"  {name:10s} {1e3 * min(ts) / args.steps:7.1f}")


if __name__ == "__main__":
    main()
