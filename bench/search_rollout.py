"""Multi-turn search rollouts vs plain single-turn decoding, same model and batch.

    python -m bench.search_rollout [--batch 16] [--turn-tokens 48] [--max-turns 2]
                                   [--temperature 1] [--group G] [--decode-kernel K]

Throughput = policy-generated tokens / wall time. The search rollout pays for reading each
turn's observation into the KV cache (the context itself is never re-read: turns continue from
the cache), retrieval and turn bookkeeping; the issue's target is to stay within 1.5x of plain
decoding (ratio plain / search <= 1.5). Plain decoding of the same tokens is timed two ways:
every row the mean length (one uniform batch), and every row the length of its own search
trajectory (the same spread of lengths, so the batch waits for its longest row as the rollout
does; what remains is the cost of the turns). The search line also splits its time into policy
calls and the environment's own work. Sampling at temperature 1 (``--temperature``; at
temperature 1 a row's samples depend on where the sampler lays it out, so two versions of the
rollout sample different trajectories and their ratios compare different workloads; greedy,
0, gives both the same ones), after a warm-up call with the same inputs (compilation
excluded; in training the same shape buckets recur every step); the three alternate for
--repeats runs and each keeps its best time. Plain decoding gets the
per-layer weights the policy uses (`decode_params`). ``--reprefill`` times the old way (every
turn re-sends the whole context) for comparison. ``--group G``: batch / G prompts, each
sampled by a group of G rows that share its KV cache (``SamplingParams.shared_prompts``), the
plain decode likewise; ``--decode-kernel``: the sampler's (``SamplingParams.decode_kernel``,
e.g. ``paged_xla``), both sides.
"""

from __future__ import annotations

import argparse
import time

from bench.timing import alternating_times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--turn-tokens", type=int, default=48)
    ap.add_argument("--max-turns", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each, alternating")
    ap.add_argument("--temperature", type=float, default=1.0,
                    help="0: greedy, the same trajectories whatever the sampler's row layout "
                         "(to compare two versions of the rollout on one workload)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="the sampler's weights, both sides (decode_params)")
    ap.add_argument("--reprefill", action="store_true",
                    help="re-send the whole context every turn instead of continuing the cache")
    ap.add_argument("--group", type=int, default=1,
                    help="rows a prompt, sharing its cache (shared_prompts); 1: one row each")
    ap.add_argument("--decode-kernel", default="xla", help="SamplingParams.decode_kernel")
    a = ap.parse_args()
    if a.batch % a.group:
        ap.error(f"--batch {a.batch} is not a whole number of groups of {a.group}")

    from models import load_params
    from models.sampler import SamplingParams, decode_params, generate
    from rl.run.wiring import make_task
    from rl.tasks.envs import SamplerPolicy

    cfg, params, tok = load_params("smollm2_135m")
    task = make_task({"name": "search_qa", "max_turns": a.max_turns,
                      "max_response_tokens": a.turn_tokens * (a.max_turns + 1) * 2})
    cache = {"decode_kernel": a.decode_kernel, "shared_prompts": a.group > 1}
    sampling = SamplingParams(max_new_tokens=a.turn_tokens, temperature=a.temperature)
    env = task.make_env(tok, sampling)
    policy = _Timed(SamplerPolicy(cfg, params, tok, dtype=a.dtype, **cache),
                    reprefill=a.reprefill)
    prompts = task.prompts("dev")[: a.batch // a.group]

    groups = env.rollout(policy, prompts, a.group, seed=1)  # the trajectories (and compiling)
    trajs = [t for g in groups for t in g.trajectories]
    lengths = [t.num_action_tokens for t in trajs]
    turns = sum(t.info["turns"] for t in trajs) / len(trajs)

    # Plain single-turn decoding of the same number of tokens, two ways: every row the mean
    # length (the batch never thins out), and every row the length of its own search
    # trajectory (the same length spread: what is left is the cost of the turns themselves).
    ids = [tok.encode_chat(list(p.messages)) for p in prompts for _ in range(a.group)]
    mean_len = max(1, round(sum(lengths) / len(lengths)))
    weights = decode_params(params, a.dtype)

    def plain(per_row: list[int]):
        sp = SamplingParams(max_new_tokens=max(per_row), temperature=a.temperature,
                            ignore_eos=True, **cache)
        return lambda: generate(cfg, weights, tok, ids, sp, seed=1, max_new_per_row=per_row)

    in_policy: list[float] = []  # seconds inside policy calls, per search run

    def search():
        policy.seconds = 0.0
        env.rollout(policy, prompts, a.group, seed=1)
        in_policy.append(policy.seconds)

    # same seeds: the same work every call
    times = alternating_times({"search": search, "plain_mean": plain([mean_len] * len(ids)),
                               "plain_same": plain(lengths)}, a.repeats)
    in_policy = in_policy[1:]  # the first was the warm-up call
    best = {name: min(ts) for name, ts in times.items()}
    search_tokens = sum(lengths)
    s_tps = search_tokens / best["search"]
    i = times["search"].index(best["search"])

    print(f"SmolLM2-135M {a.dtype} CPU, batch {a.batch}, {a.turn_tokens} tokens/turn, "
          f"max_turns {a.max_turns} (mean {turns:.2f} turns/trajectory, {min(lengths)}-"
          f"{max(lengths)} tokens/row), "
          f"{'re-prefill' if a.reprefill else 'KV-cache continuation'} between turns, "
          f"decode kernel {a.decode_kernel}"
          f"{f', groups of {a.group} sharing their prompt' if a.group > 1 else ''}; "
          f"best of {a.repeats} alternating runs each")
    print(f"search rollout: {search_tokens} action tokens in {best['search']:.1f} s = "
          f"{s_tps:.0f} tok/s ({in_policy[i]:.1f} s in policy calls: prefill, decoding, "
          f"observation reads; {best['search'] - in_policy[i]:.2f} s in the environment)")
    for name, label, n_tok in (
            ("plain_mean", f"plain decode, every row {mean_len} tokens", mean_len * len(ids)),
            ("plain_same", "plain decode, each row its search length", search_tokens)):
        p_tps = n_tok / best[name]
        print(f"{label + ':':44s} {n_tok} tokens in {best[name]:.1f} s = {p_tps:.0f} tok/s, "
              f"ratio plain/search = {p_tps / s_tps:.2f}")
    print("target: ratio <= 1.5. All runs (s): " + "; ".join(
        f"{name} {' '.join(f'{t:.1f}' for t in ts)}" for name, ts in times.items()))


class _Timed:
    """The policy with a stopwatch on its calls (time spent outside them is the
    environment's: turn bookkeeping, parsing, retrieval, tokenization). ``reprefill`` hides
    continue_from, so every turn re-sends the whole context."""

    def __init__(self, policy, reprefill: bool = False):
        self.policy, self.tokenizer, self.seconds = policy, policy.tokenizer, 0.0
        if not reprefill:
            self.continue_from = self._timed(policy.continue_from)
        self.generate = self._timed(policy.generate)

    def _timed(self, fn):
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0
        return call


if __name__ == "__main__":
    main()
