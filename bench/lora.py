"""Optimizer-state bytes and update time, full-weight training vs LoRA, on the shipped
SmolLM2-135M (float32, CPU): the jitted ``rl.grpo.train_step`` update on one synthetic batch in
``rl.grpo.batch``'s layout (each group's prompt once, its trajectories after it), AdamW.

    python -m bench.lora [--groups 2] [--group 4] [--prompt 64] [--response 128]
                         [--rank 16] [--alpha 32] [--targets wq,wk,wv,wo,w_gate,w_up,w_down]
                         [--repeats 3]

Prints, per setting: trainable parameters, optimizer-state bytes (Adam's two moments plus
its counters: every array of the optax state), and the best update time over --repeats
alternating rounds (``bench.timing.alternating_times``, after one compiling call each).
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable

import numpy as np


def synthetic_batch(groups: int, group: int, prompt: int, response: int,
                    vocab: int) -> dict[str, np.ndarray]:
    """A batch with every token real and every response token in the loss, advantages +-1."""
    rng = np.random.default_rng(0)
    return {"prefix": rng.integers(100, vocab, (groups, prompt)).astype(np.int32),
            "prefix_mask": np.ones((groups, prompt), np.int32),
            "tokens": rng.integers(100, vocab, (groups, group, response)).astype(np.int32),
            "attn_mask": np.ones((groups, group, response), np.int32),
            "loss_mask": np.ones((groups, group, response), np.float32),
            "advantages": np.tile(np.where(np.arange(group) % 2, 1.0, -1.0),
                                  (groups, 1)).astype(np.float32)}


def state_bytes(tree) -> int:
    import jax

    return sum(int(x.nbytes) for x in jax.tree.leaves(tree))


def setups(args: argparse.Namespace):
    """{name: (train_step(state, batch), initial state)} for full-weight training and LoRA."""
    import jax

    from models import load_params
    from models.lora import LoraConfig, init_adapters
    from rl.grpo.optim import OptimConfig, make_optimizer
    from rl.grpo.train_step import LossConfig, init_train_state, make_train_step

    cfg, params, _ = load_params("smollm2_135m")
    optimizer = make_optimizer(OptimConfig(lr=1e-5))
    lc = LossConfig(beta=0.0)
    lora = LoraConfig(args.rank, args.alpha, tuple(args.targets.split(",")))
    adapters = init_adapters(params, lora, jax.random.key(0))
    full = make_train_step(cfg, lc, optimizer, donate=False)
    low = functools.partial(make_train_step(cfg, lc, optimizer, donate=False, lora=lora),
                            base=params)
    return cfg, {"full": (full, init_train_state(params, optimizer)),
                 f"LoRA r={args.rank}": (low, init_train_state(adapters, optimizer))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--response", type=int, default=128)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32.0)
    ap.add_argument("--targets", default="wq,wk,wv,wo,w_gate,w_up,w_down")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()

    import jax

    from bench.timing import alternating_times

    cfg, runs = setups(a)
    batch = {k: jax.numpy.asarray(v) for k, v in synthetic_batch(
        a.groups, a.group, a.prompt, a.response, cfg.vocab_size).items()}
    fns: dict[str, Callable[[], object]] = {
        name: functools.partial(lambda f, s: jax.block_until_ready(f(s, batch)), f, s)
        for name, (f, s) in runs.items()}
    times = alternating_times(fns, a.repeats)
    tokens = a.groups * (a.prompt + a.group * a.response)
    print(f"update (AdamW, f32) on SmolLM2-135M, CPU: {a.groups} groups x {a.group} x "
          f"{a.response} response tokens + {a.prompt}-token prompt each ({tokens} tokens); "
          f"LoRA alpha {a.alpha:g}, targets {a.targets}")
    base = None
    for name, (_, state) in runs.items():
        n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params))
        opt = state_bytes(state.opt_state)
        best = min(times[name])
        base = base or (opt, best)
        print(f"  {name:>10}: trainable {n / 1e6:8.3f} M params, optimizer state "
              f"{opt / 2**20:8.2f} MiB ({opt / base[0]:.4f}x), update {best:6.2f} s "
              f"({best / base[1]:.2f}x)  [all: {', '.join(f'{t:.2f}' for t in times[name])}]")


if __name__ == "__main__":
    main()
