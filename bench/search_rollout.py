"""Multi-turn search rollouts vs plain single-turn decoding, same model and batch.

    python -m bench.search_rollout [--batch 16] [--turn-tokens 48] [--max-turns 2]

Throughput = policy-generated tokens / wall time. The search rollout pays for reading each
turn's observation into the KV cache (the context itself is never re-read: turns continue from
the cache), retrieval and turn bookkeeping; the issue's target is to stay within 1.5x of plain
decoding (ratio plain / search <= 1.5). Sampling at temperature 1. Both are timed after a
warm-up call with the same inputs, so compilation is excluded from both (in training the same
shape buckets recur every step). ``--reprefill`` times the old way (every turn re-sends the
whole context) for comparison.
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--turn-tokens", type=int, default=48)
    ap.add_argument("--max-turns", type=int, default=2)
    ap.add_argument("--reprefill", action="store_true",
                    help="re-send the whole context every turn instead of continuing the cache")
    a = ap.parse_args()

    from models import load_params
    from models.sampler import SamplingParams, generate
    from rl.envs import SamplerPolicy
    from rl.tasks import make_task

    cfg, params, tok = load_params("smollm2_135m")
    task = make_task({"name": "search_qa", "max_turns": a.max_turns,
                      "max_response_tokens": a.turn_tokens * (a.max_turns + 1) * 2})
    sampling = SamplingParams(max_new_tokens=a.turn_tokens, temperature=1.0)
    env = task.make_env(tok, sampling)
    policy = SamplerPolicy(cfg, params, tok)
    if a.reprefill:
        class Reprefill:  # the sampler without continue_from
            tokenizer = tok
            generate = staticmethod(policy.generate)
        policy = Reprefill()
    prompts = task.prompts("dev")[: a.batch]

    env.rollout(policy, prompts, 1, seed=1)  # compile the shapes this run will use
    t0 = time.perf_counter()
    groups = env.rollout(policy, prompts, 1, seed=1)
    search_s = time.perf_counter() - t0
    trajs = [g.trajectories[0] for g in groups]
    search_tokens = sum(t.num_action_tokens for t in trajs)
    turns = sum(t.info["turns"] for t in trajs) / len(trajs)

    n = max(1, round(search_tokens / len(trajs)))  # same generated tokens per row, one turn
    ids = [tok.encode_chat(list(p.messages)) for p in prompts]
    plain = SamplingParams(max_new_tokens=n, temperature=1.0, ignore_eos=True)
    generate(cfg, params, tok, ids, plain, seed=0)
    t0 = time.perf_counter()
    generate(cfg, params, tok, ids, plain, seed=1)
    plain_s = time.perf_counter() - t0
    plain_tokens = n * len(ids)

    s_tps, p_tps = search_tokens / search_s, plain_tokens / plain_s
    print(f"SmolLM2-135M f32 CPU, batch {a.batch}, {a.turn_tokens} tokens/turn, "
          f"max_turns {a.max_turns} (mean {turns:.2f} turns/trajectory), "
          f"{'re-prefill' if a.reprefill else 'KV-cache continuation'} between turns")
    print(f"search rollout: {search_tokens} action tokens in {search_s:.1f} s = {s_tps:.0f} tok/s")
    print(f"plain decode:   {plain_tokens} tokens in {plain_s:.1f} s = {p_tps:.0f} tok/s")
    print(f"ratio plain/search = {p_tps / s_tps:.2f} (target <= 1.5)")


if __name__ == "__main__":
    main()
