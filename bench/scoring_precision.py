"""How far a float32 policy's log-probs are from float32-true on this backend, by matmul precision.

    python -m bench.scoring_precision [--shapes qwen3_0_6b] [--batch 8] [--prompt-len 64]
                                      [--new-tokens 64] [--logit-std 2.5] [--json PATH]

A random float32 model of a shape preset (``models/shapes/``, no download; its final norm
scaled so the logits spread like an LLM's, std ``--logit-std``) samples ``--batch`` rows at
temperature 1; then ``models.scoring.token_logprobs`` scores prompt + response. Three settings:

* ``default``: every dot at the backend's default precision (one bfloat16 pass on TPU, TF32
  on recent NVIDIA GPUs, float32 on CPU): what the library did before
  ``models.transformer.probability_precision``;
* ``ours``: the dots that form probabilities (attention, logits) HIGHEST on float32 operands,
  the weight matmuls at the default: what the library does;
* ``highest``: every dot HIGHEST (``jax.default_matmul_precision("highest")``), float32-true:
  the reference.

Printed per setting, over the response tokens:

* ``|score - reference|``: max and mean |log p| difference of the scoring pass from the
  reference's scoring pass, on the reference's rows (the error a loss sees);
* ``|sampler - score|``: max and mean difference between the log-probs the sampler returned
  and the scoring pass's, both in that setting: on-policy this is the PPO ratio's log, which
  should be 0 (the clip is at log 1.2 = 0.18);
* ``ratio off > 1%``: the share of tokens whose on-policy ratio exp(sampler - score) is more
  than 1 % from 1.

On a CPU the three agree (float32 everywhere); the figures that matter come from an
accelerator (``bench/gpu_check.sh`` runs this).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

SETTINGS = ("highest", "ours", "default")  # the reference first


def _run(setting: str, cfg: Any, params: Any, tok: Any, prompts: list[list[int]],
         new_tokens: int, reference: np.ndarray | None) -> dict[str, np.ndarray]:
    """In one setting: the rows it samples (``tokens`` [B, P + N]), the sampler's log-probs
    of them (``sampled`` [B, N]) and the scoring pass's (``scored``), and the scoring pass's
    log-probs of the ``reference`` setting's rows (``of_reference``; those rows when None:
    each setting samples its own rows, so errors are compared on the same tokens)."""
    import models.transformer as transformer
    from models.sampler import SamplingParams, generate
    from models.scoring import token_logprobs

    jax.clear_caches()  # each setting traces its own programs
    original = transformer.probability_precision
    if setting == "default":
        transformer.probability_precision = lambda dtype: None
    p = len(prompts[0])
    try:
        with jax.default_matmul_precision("highest" if setting == "highest" else None):
            gen = generate(cfg, params, tok, prompts, SamplingParams(
                new_tokens, temperature=1.0, ignore_eos=True, decode_text=False), seed=0)
            toks = np.concatenate([np.asarray(prompts, np.int32), gen.tokens], axis=1)
            both = np.concatenate([toks, toks if reference is None else reference])  # one shape
            mask = jnp.ones(both.shape, bool)
            scored = np.asarray(token_logprobs(cfg, params, jnp.asarray(both), mask),
                                np.float64)[:, p:]
    finally:
        transformer.probability_precision = original
    b = len(prompts)
    return {"tokens": toks, "sampled": np.asarray(gen.logprobs, np.float64),
            "scored": scored[:b], "of_reference": scored[-b:]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="qwen3_0_6b")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--logit-std", type=float, default=2.5)
    ap.add_argument("--tokenizer", default=None,
                    help="HF folder or GGUF whose pad id the prompts use (default: shipped)")
    ap.add_argument("--json", default=None, help="append the figures as one JSON line here")
    args = ap.parse_args(argv)

    from models.presets import cached_tokenizer, shipped_gguf_path
    from models.shapes import model_shapes
    from models.transformer import init_params

    cfg = model_shapes(args.shapes)
    params = init_params(cfg, jax.random.key(0))
    # logits = rms_norm(h) * final_norm @ U, U ~ normal(0, 0.02): std 0.02 sqrt(D) before
    params["final_norm"] = params["final_norm"] * (args.logit_std / (0.02 * cfg.hidden_size ** 0.5))
    tok = cached_tokenizer(str(args.tokenizer or shipped_gguf_path()))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(100, min(cfg.vocab_size, 40000), args.prompt_len).tolist()
               for _ in range(args.batch)]
    device = jax.devices()[0]
    print(f"bench.scoring_precision: {args.shapes} float32 on {device.platform} "
          f"({device.device_kind}), {args.batch} rows x {args.new_tokens} sampled tokens")
    reference = None
    row: dict[str, Any] = {"shapes": args.shapes, "device": device.device_kind}
    print(f"  {'setting':8s} {'|score - reference| max':>24s} {'mean':>9s} "
          f"{'|sampler - score| max':>22s} {'mean':>9s} {'ratio off > 1%':>15s}")
    for s in SETTINGS:
        run = _run(s, cfg, params, tok, prompts, args.new_tokens,
                   None if reference is None else reference["tokens"])
        reference = reference or run
        to_ref = np.abs(run["of_reference"] - reference["scored"]).ravel()
        gap = run["sampled"] - run["scored"]
        on_policy = np.abs(gap).ravel()
        off = float(np.mean(np.abs(np.expm1(gap)) > 0.01))
        print(f"  {s:8s} {to_ref.max():24.2e} {to_ref.mean():9.2e} {on_policy.max():22.2e} "
              f"{on_policy.mean():9.2e} {off:15.2%}", flush=True)
        row[s] = {"score_ref_max": float(to_ref.max()), "score_ref_mean": float(to_ref.mean()),
                  "sampler_score_max": float(on_policy.max()),
                  "sampler_score_mean": float(on_policy.mean()), "ratio_off_1pct": off}
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(row) + "\n")
    return row


if __name__ == "__main__":
    main()
